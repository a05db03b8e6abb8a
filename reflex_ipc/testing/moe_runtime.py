"""The CUDA backend's mixture-of-experts kernels without a GPU: a numpy model of the routing
kernel (kernels/moe.cuh moe_route_f32, step by step: kernel_route) and MemRuntime, a fake
runtime whose device memory is one numpy byte array and whose MoE kernels are interpreted in
numpy when launched. For tests/test_moe_device.py and tests/test_stream_upload.py."""

import struct

import numpy as np

from reflex_ipc.backends.base import moe_route, swiglu_oai
from reflex_ipc.backends.cuda_ops import (MOE_MVD_R, MOE_MVD_WARPS, MOE_ROUTE_WARP_MAXE, MOE_ROUTE_WARP_TOKENS,
                                         MV_ALIGN, MV_KERNEL, MV_VARIANTS)
from reflex_ipc.backends.numpy_ops import NumpyOps
from reflex_ipc.cuda.arrays import DeviceWeight
from reflex_ipc.cuda.core import KERNELS, Pool, make_kernel

F32 = np.float32
MV_TYPES = {v: k for k, v in MV_KERNEL.items()}  # "q4_k" -> Q4_K
INT_MAX = 2 ** 31 - 1
THREADS = 256  # MOE_ROUTE_THREADS
MM_ROWS = 4


def before(a, ia, b, ib):
    return a > b or (a == b and ia < ib)


def _best(pairs):
    """moe_block_best: an xor butterfly in each warp, then one over the warps' results."""
    def warp(vals):
        vals = list(vals)
        o = 16
        while o:
            vals = [vals[l] if not before(*vals[l ^ o], *vals[l]) else vals[l ^ o] for l in range(32)]
            o //= 2
        assert all(v == vals[0] for v in vals)
        return vals[0]

    firsts = [warp(pairs[w * 32:(w + 1) * 32]) for w in range(len(pairs) // 32)]
    return warp(firsts + [(-np.inf, INT_MAX)] * (32 - len(firsts)))


def kernel_route(lr, k, gating, norm, scale, bias=None, G=0, G_used=0, escale=None):
    """One block of moe_route_f32 for one token's logits lr [E], step by step."""
    lr = np.asarray(lr, F32)
    E = lr.size
    if gating == 0:
        z = np.exp(lr - lr.max()).astype(F32)
        probs = (z / z.sum(dtype=F32)).astype(F32)
    else:
        probs = (F32(1) / (F32(1) + np.exp(-lr))).astype(F32)
    sel = (probs + bias).astype(F32) if bias is not None else probs.copy()
    taken = np.zeros(E, bool)
    if G > 1:
        per = E // G
        score = []
        for g in range(G):
            b1 = b2 = F32(-np.inf)
            for e in range(g * per, (g + 1) * per):
                v = sel[e]
                if v > b1:
                    b2, b1 = b1, v
                elif v > b2:
                    b2 = v
            score.append(F32(b1 + b2) if per >= 2 else b1)
        keep = np.zeros(G, bool)
        for _ in range(min(G_used, G)):
            bv, bi = -np.inf, INT_MAX
            for g in range(G):
                if not keep[g] and before(score[g], g, bv, bi):
                    bv, bi = score[g], g
            keep[bi] = True
        sel[~np.repeat(keep, per)] = -np.inf
    ids, w = [], []
    wsum = F32(0)
    for _ in range(k):
        pairs = []
        for t in range(THREADS):
            v, i = -np.inf, INT_MAX
            for e in range(t, E, THREADS):
                if not taken[e] and before(sel[e], e, v, i):
                    v, i = sel[e], e
            pairs.append((v, i))
        _, i = _best(pairs)
        taken[i] = True
        ids.append(i)
        w.append(probs[i])
        wsum = F32(wsum + probs[i])
    w = np.array(w, F32)
    if norm:
        w = (w / max(wsum, F32(6.103515625e-5))).astype(F32)
    w = (w * F32(scale)).astype(F32)
    if escale is not None:
        w = (w * escale[ids]).astype(F32)
    return np.array(ids, np.int32), w


def kernel_route_warp(lr, k, gating, norm, scale, bias=None, escale=None):
    """One warp of moe_route_warp_f32 for one token's logits lr [E <= 256], step by step: lane l
    holds experts l + 32 i, each round every lane's best untaken (sel, index, prob) and an xor
    butterfly over the lanes; softmax's max and sum by butterflies too."""
    lr = np.asarray(lr, F32)
    E, PL = lr.size, 8
    idx = np.arange(32)[:, None] + 32 * np.arange(PL)[None, :]  # [lane, i]
    valid = idx < E
    pr = np.where(valid, np.pad(lr, (0, 32 * PL - E), constant_values=-np.inf)[idx], F32(-np.inf)).astype(F32)

    def butterfly(vals, op):
        vals = list(vals)
        for o in (16, 8, 4, 2, 1):
            vals = [op(vals[l], vals[l ^ o]) for l in range(32)]
        assert all(v == vals[0] for v in vals) or all(np.isnan(v) for v in vals)
        return vals[0]

    if gating == 0:
        m = butterfly([pr[l].max() for l in range(32)], lambda a, b: F32(max(a, b)))
        z = np.where(valid, np.exp(pr - m), pr).astype(F32)
        lane_s = [F32(0)] * 32
        for l in range(32):
            for i in range(PL):
                if valid[l, i]:
                    lane_s[l] = F32(lane_s[l] + z[l, i])
        s = butterfly(lane_s, lambda a, b: F32(a + b))
        pr = (z / s).astype(F32)
    elif gating == 1:
        with np.errstate(over="ignore"):
            pr = (F32(1) / (F32(1) + np.exp(-pr))).astype(F32)
    sel = pr.copy()
    if bias is not None:
        b = np.pad(np.asarray(bias, F32), (0, 32 * PL - E))[idx]
        sel = np.where(valid, pr + b, pr).astype(F32)
    taken = ~valid
    ids, w = [], []
    wsum = F32(0)
    for j in range(k):
        cands = []
        for l in range(32):
            v, bi, p = -np.inf, INT_MAX, F32(0)
            for i in range(PL):
                if not taken[l, i] and before(sel[l, i], idx[l, i], v, bi):
                    v, bi, p = sel[l, i], int(idx[l, i]), pr[l, i]
            cands.append((v, bi, p))
        v, bi, p = butterfly(cands, lambda a, b: b if before(b[0], b[1], a[0], a[1]) else a)
        if not 0 <= bi < E:
            bi, p = j, pr[j % 32, j // 32]
        taken[bi % 32, bi // 32] = True
        ids.append(bi)
        w.append(p)
        wsum = F32(wsum + p)
    w = np.array(w, F32)
    if gating == 2:
        z = np.exp(w - w[0]).astype(F32)
        t = F32(0)
        for v in z:
            t = F32(t + v)
        w = (z / t).astype(F32)
        wsum = F32(0)
        for v in w:
            wsum = F32(wsum + v)
    if norm:
        w = (w / max(wsum, F32(6.103515625e-5))).astype(F32)
    w = (w * F32(scale)).astype(F32)
    if escale is not None:
        w = (w * np.asarray(escale, F32)[ids]).astype(F32)
    return np.array(ids, np.int32), w


class MemRuntime:
    """Device memory is one numpy byte array (pointer = offset); host->device copies and
    memsets write it; the kernels moe uses run in numpy when launched."""

    def __init__(self, nbytes=48 << 20, interpret=True):
        self.interpret = interpret  # False: kernels are only recorded
        self.mem = np.zeros(nbytes, np.uint8)
        self.top = 4096
        self.launches = []
        self.weights = []  # (start, end) of each weight tensor: reads must stay inside one
        self.stream = "stream"
        rt = self

        class Drv:
            class MemoryError(Exception):
                pass

            @staticmethod
            def mem_alloc(n):
                p = rt.top
                rt.top = (rt.top + n + 255) // 256 * 256
                assert rt.top <= rt.mem.size
                return p

            @staticmethod
            def memcpy_htod_async(ptr, a, stream):
                b = np.ascontiguousarray(a).view(np.uint8).reshape(-1)
                rt.mem[ptr:ptr + b.size] = b

            @staticmethod
            def memset_d8_async(ptr, value, count, stream):
                rt.mem[ptr:ptr + count] = value

            @staticmethod
            def memcpy_dtod_async(dst, src, n, stream):
                rt.mem[dst:dst + n] = rt.mem[src:src + n].copy()

        self.drv = Drv()
        self.pool = Pool(self.drv)

    def f32(self, ptr, n):
        return self.mem[ptr:ptr + 4 * n].view(F32)

    def i32(self, ptr, n):
        return self.mem[ptr:ptr + 4 * n].view(np.int32)

    def weight(self, a, ggml_type=0):
        """A float weight [rows, cols] (F32 type 0 or F16 type 1) in device memory."""
        a = np.ascontiguousarray(a, F32 if ggml_type == 0 else np.float16)
        p = self.drv.mem_alloc(a.nbytes)
        self.drv.memcpy_htod_async(p, a, None)
        self.weights.append((p, p + a.nbytes))
        return DeviceWeight(p, a.shape, ggml_type, "F32" if ggml_type == 0 else "F16", a.shape[1] * a.itemsize,
                            "w", None)

    def qweight(self, raw, ggml_type, shape, align=16):
        """A quantized weight [rows, cols] from its raw GGUF bytes (rows of whole blocks) at a
        pointer `align`-byte aligned and no more (as matvec.cuh's loads need it, and no luckier)."""
        from reflex_ipc.quants import BY_ID

        name, blk, bsize = BY_ID[ggml_type]
        raw = np.ascontiguousarray(raw, np.uint8).reshape(-1)
        assert raw.size == shape[0] * shape[1] // blk * bsize
        p = self.drv.mem_alloc(raw.size + 256)
        p += align if p % (2 * align) == 0 else 0  # aligned to `align`, not to 2 * align
        self.drv.memcpy_htod_async(p, raw, None)
        self.weights.append((p, p + raw.size))
        return DeviceWeight(p, tuple(shape), ggml_type, name, shape[1] // blk * bsize, "w", None)

    def qrows(self, ptr, rb, ggml_type, K, n=1):
        """n rows of K weights of a quantized format from ptr (inside one weight tensor), dequantized."""
        from reflex_ipc.quants import dequantize

        assert any(a <= ptr and ptr + n * rb <= b for a, b in self.weights), "a read outside the weights"
        return dequantize(self.mem[ptr:ptr + n * rb].copy(), ggml_type, n * K).reshape(n, K)

    def rows(self, ptr, rb, kind, K):
        """Row of K weights at ptr (inside one weight tensor)."""
        assert any(a <= ptr and ptr + rb <= b for a, b in self.weights), "a read outside the weights"
        dt = F32 if kind == "f32" else np.float16
        assert rb == K * np.dtype(dt).itemsize
        return self.mem[ptr:ptr + rb].view(dt).astype(F32)

    def kernel(self, name):
        """The kernel's real launcher (keyword arguments, cuda/launch.py) over a launch that
        records (and interprets) the arguments in the kernel's order."""
        rt = self
        fmt = KERNELS[name][0]

        def pack(*args):
            struct.pack(fmt, *args)  # the arguments must fit the kernel's layout
            return args

        def launch(grid, block, args, shared, stream):
            rt.launches.append((name, grid, block, args, shared))
            if rt.interpret:
                rt.run(name, grid, block, args, shared)

        return make_kernel(None, name, None, pack=pack, launch=launch)

    def run(self, name, grid, block, args, shared):
        op, _, kind = name.rpartition("_")
        if name.startswith("mm1_") or name.startswith("mm4_") or name.startswith("mm8_"):
            W, X, Y, K, M, N, rb, acc = args
            x = self.f32(X, N * K).reshape(N, K)
            w = np.stack([self.rows(W + r * rb, rb, kind, K) for r in range(M)])
            self.f32(Y, N * M)[:] = (x @ w.T).reshape(-1)
        elif name.startswith("mmsk1_"):  # one token, a block per row (fused.cuh): grid (M, 1, 1)
            W, X, Y, K, rb, acc = args
            M = grid[0]
            w = np.stack([self.rows(W + r * rb, rb, kind, K) for r in range(M)])
            y = self.f32(Y, M)
            y[:] = (y if acc else 0) + w @ self.f32(X, K)
        elif name == "moe_route_warp_f32":  # a warp per token (tokens n < N of MOE_ROUTE_WARP_TOKENS a block)
            logits, bias, escale, ids, wts, N, E, k, gating, norm, scale = args
            assert block == (32 * MOE_ROUTE_WARP_TOKENS, 1, 1) and grid[0] == -(-N // MOE_ROUTE_WARP_TOKENS)
            assert E <= MOE_ROUTE_WARP_MAXE
            b = self.f32(bias, E).copy() if bias else None
            es = self.f32(escale, E).copy() if escale else None
            for n in range(N):
                i, w = kernel_route_warp(self.f32(logits + 4 * n * E, E), k, gating, norm, scale, b, es)
                self.i32(ids + 4 * n * k, k)[:] = i
                self.f32(wts + 4 * n * k, k)[:] = w
        elif name == "moe_route_f32":
            logits, bias, escale, ids, wts, E, k, gating, norm, scale, G, G_used = args
            assert block == (THREADS, 1, 1) and shared == 4 * (2 * E + G) + E + G
            if gating == 2:  # softmax_weight (gpt-oss): the kernel's scans are checked on the GPU (opchecks)
                top, w = moe_route(self.f32(logits, grid[0] * E).reshape(-1, E), k, "softmax_weight", norm, scale)
                self.i32(ids, grid[0] * k)[:] = top.reshape(-1)
                self.f32(wts, grid[0] * k)[:] = w.reshape(-1)
                return
            for n in range(grid[0]):
                b = self.f32(bias, E).copy() if bias else None
                es = self.f32(escale, E).copy() if escale else None
                i, w = kernel_route(self.f32(logits + 4 * n * E, E), k, gating, norm, scale, b, G, G_used, es)
                self.i32(ids + 4 * n * k, k)[:] = i
                self.f32(wts + 4 * n * k, k)[:] = w
        elif name.startswith("moe_mvglu"):  # kernels/moe_mv.cuh; grid (row blocks, pairs)
            v, fmt = name[len("moe_mvglu")], name[len("moe_mvglu") + 2:]
            R, W, G, _ = MV_VARIANTS[v]
            t = MV_TYPES[fmt]
            Wg, Wu, X, ids, Y, K, F, x_div, es, rb, act = args
            assert block == (32 * W * G, 1, 1) and grid[0] == -(-F // (R * G)) and grid[2] == 1
            assert X % 16 == 0 and Wg % MV_ALIGN[t] == 0 and Wu % MV_ALIGN[t] == 0 and rb % MV_ALIGN[t] == 0
            P = grid[1]
            idv, y = self.i32(ids, P), self.f32(Y, P * F)
            for p in range(P):
                x = self.f32(X + 4 * (p // x_div) * K, K)
                row = int(idv[p]) * es
                g = (self.qrows(Wg + row * rb, rb, t, K, F) @ x).astype(F32)
                u = (self.qrows(Wu + row * rb, rb, t, K, F) @ x).astype(F32)
                a = g / (1 + np.exp(-g)) if act == 0 else NumpyOps().gelu(g)
                y[p * F:(p + 1) * F] = a * u
        elif name.startswith("moe_mvdown_"):  # kernels/moe_mv.cuh; grid (row blocks, tokens)
            t = MV_TYPES[name[len("moe_mvdown_"):]]
            W, H, ids, wts, Y, F, D, k, es, rb = args
            assert grid[0] == -(-D // MOE_MVD_R) and grid[2] == 1 and block == (32 * min(k, MOE_MVD_WARPS), 1, 1)
            assert H % 16 == 0 and W % MV_ALIGN[t] == 0 and rb % MV_ALIGN[t] == 0
            N = grid[1]
            idv, wv, y = self.i32(ids, N * k), self.f32(wts, N * k), self.f32(Y, N * D)
            for n in range(N):
                s = np.zeros(D, F32)
                for j in range(k):  # slot order
                    p = n * k + j
                    w = self.qrows(W + int(idv[p]) * es * rb, rb, t, F, D)
                    s = (s + wv[p] * (w @ self.f32(H + 4 * p * F, F)).astype(F32)).astype(F32)
                y[n * D:(n + 1) * D] = s
        elif op == "moe_glu":
            Wg, Wu, X, ids, Y, K, F, k, es, rb, act = args
            assert grid[1] * MM_ROWS >= F > (grid[1] - 1) * MM_ROWS and block == (32 * MM_ROWS, 1, 1)
            P = grid[0]
            x, idv, y = self.f32(X, (P // k) * K).reshape(-1, K), self.i32(ids, P), self.f32(Y, P * F)
            for p in range(P):
                for r in range(F):
                    row = int(idv[p]) * es + r
                    g = self.rows(Wg + row * rb, rb, kind, K) @ x[p // k]
                    u = self.rows(Wu + row * rb, rb, kind, K) @ x[p // k]
                    a = g / (1 + np.exp(-g)) if act == 0 else NumpyOps().gelu(np.array([g], F32))[0]
                    y[p * F + r] = a * u
        elif op == "moe_mm":
            W, X, ids, Y, K, M, x_div, es, rb = args
            assert grid[1] * MM_ROWS >= M > (grid[1] - 1) * MM_ROWS
            P = grid[0]
            idv, y = self.i32(ids, P), self.f32(Y, P * M)
            for p in range(P):
                x = self.f32(X + 4 * (p // x_div) * K, K)
                for r in range(M):
                    y[p * M + r] = self.rows(W + (int(idv[p]) * es + r) * rb, rb, kind, K) @ x
        elif op == "moe_down":
            W, H, ids, wts, Y, F, D, k, es, rb = args
            assert grid[1] * MM_ROWS >= D > (grid[1] - 1) * MM_ROWS
            N = grid[0]
            idv, wv, y = self.i32(ids, N * k), self.f32(wts, N * k), self.f32(Y, N * D)
            for n in range(N):
                for r in range(D):
                    s = F32(0)
                    for j in range(k):
                        p = n * k + j
                        w = self.rows(W + (int(idv[p]) * es + r) * rb, rb, kind, F)
                        s += wv[p] * (w @ self.f32(H + 4 * p * F, F))
                    y[n * D + r] = s
        elif name == "moe_group_i32":  # (its warp-level algorithm: tests/test_moe_grouped.py)
            ids, order, eoff, tiles, P, E, BN = args
            assert grid == (1, 1, 1) and shared == 4 * ((block[0] // 32) * E + 2 * (E + 1)) <= 46 * 1024
            idv = self.i32(ids, P)
            self.i32(order, P)[:] = np.argsort(idv, kind="stable")
            cnt = np.bincount(idv, minlength=E)
            self.i32(eoff, E + 1)[:] = np.concatenate([[0], np.cumsum(cnt)])
            tl = [(e, r) for e in range(E) for r in range(0, cnt[e], BN)]
            self.i32(tiles, 1 + 2 * len(tl))[:] = [len(tl)] + [v for t in tl for v in t]
        elif name == "mma_x_f16":
            x, y, n = args
            self.mem[y:y + 2 * n] = self.f32(x, n).astype(np.float16).view(np.uint8)
        elif op in ("mmaglu_moe", "mma_moe"):  # (their tiling: tests/test_moe_grouped.py)
            glu = op == "mmaglu_moe"
            if glu:
                Wg, Wu, X, order, eoff, tiles, H, bg, bu, K, M, k, es, rb, act, alpha, limit, flags = args
            else:
                Wg, X, order, eoff, tiles, H, K, M, es, rb, flags = args
                Wu, k, act = Wg, 1, 0
            assert flags in (0, 1, 3)  # MOE_SKIP, MOE_SKIP | MOE_WIDE: the same bits (check_moe_grouped)
            assert block == (256, 1, 1) and grid[0] == -(-M // 64)
            nt = int(self.i32(tiles, 1)[0])
            assert nt <= grid[1]
            tl = self.i32(tiles + 4, 2 * nt).reshape(nt, 2)
            off = self.i32(eoff, int(tl[:, 0].max()) + 2 if nt else 1)
            for e, r0 in tl:
                g0 = off[e] + r0
                for g in range(g0, min(g0 + 64, off[e + 1])):
                    pair = int(self.i32(order + 4 * g, 1)[0])
                    xrow = pair // k if glu else g
                    x = self.mem[X + 2 * xrow * K:X + 2 * (xrow + 1) * K].view(np.float16).astype(F32)
                    wg = np.stack([self.rows(Wg + (int(e) * es + m) * rb, rb, kind, K) for m in range(M)])
                    if glu:
                        wu = np.stack([self.rows(Wu + (int(e) * es + m) * rb, rb, kind, K) for m in range(M)])
                        a, u = wg @ x, wu @ x
                        if act == 2:  # gpt-oss: the expert's biases, then the clamped SwiGLU
                            a = a + (self.f32(bg + 4 * int(e) * M, M) if bg else 0)
                            u = u + (self.f32(bu + 4 * int(e) * M, M) if bu else 0)
                            h = swiglu_oai(a.astype(F32), u.astype(F32), alpha, limit)
                        else:
                            h = (a / (1 + np.exp(-a)) if act == 0 else NumpyOps().gelu(a)) * u
                        self.mem[H + 2 * g * M:H + 2 * (g + 1) * M] = h.astype(np.float16).view(np.uint8)
                    else:
                        self.f32(H + 4 * pair * M, M)[:] = wg @ x
        elif name == "moe_wsum_f32":
            Y, wts, out, N, D, k = args
            y, w = self.f32(Y, N * k * D).reshape(N, k, D), self.f32(wts, N * k).reshape(N, k)
            self.f32(out, N * D)[:] = (w[:, :, None] * y).sum(1).reshape(-1)
        elif name == "add_row_f32":
            a, v, y, n, ncol = args
            self.f32(y, n)[:] = (self.f32(a, n).reshape(-1, ncol) + self.f32(v, ncol)).reshape(-1)
        elif name == "moe_swiglu_oai_f32":
            G, U, bg, bu, ids, H, n, Fw, alpha, limit = args
            e = self.i32(ids, n // Fw).astype(np.int64)
            g, u = self.f32(G, n).reshape(-1, Fw).copy(), self.f32(U, n).reshape(-1, Fw).copy()
            if bg:
                g += self.f32(bg, (e.max() + 1) * Fw).reshape(-1, Fw)[e]
            if bu:
                u += self.f32(bu, (e.max() + 1) * Fw).reshape(-1, Fw)[e]
            self.f32(H, n)[:] = swiglu_oai(g, u, alpha, limit).reshape(-1)
        elif name == "moe_down_bias_f32":
            Y, bd, ids, wts, n, D, k = args
            Nt = n // D
            e, w = self.i32(ids, Nt * k).astype(np.int64).reshape(Nt, k), self.f32(wts, Nt * k).reshape(Nt, k)
            b = self.f32(bd, (e.max() + 1) * D).reshape(-1, D)
            y = self.f32(Y, n).reshape(Nt, D)
            for j in range(k):  # slot order
                y += w[:, j:j + 1] * b[e[:, j]]
        elif name == "moe_weight_input_f32":
            X, wts, X2, ones, n, K, k = args
            P = n // K
            w = self.f32(wts, P)
            self.f32(X2, n)[:] = (self.f32(X, (P // k) * K).reshape(-1, K)[np.arange(P) // k] * w[:, None]).reshape(-1)
            self.f32(ones, P)[:] = 1
        elif name in ("swiglu_f32", "geglu_f32"):
            g, u, y, n, ncol, gs, us = args
            gg, uu = self.f32(g, n), self.f32(u, n)
            a = NumpyOps().swiglu(gg, uu) if name == "swiglu_f32" else NumpyOps().geglu(gg, uu)
            self.f32(y, n)[:] = a
        else:
            raise AssertionError(f"moe launched {name}")
