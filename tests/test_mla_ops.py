"""The multi-head latent attention ops (deepseek2) and what the CUDA backend runs for them,
checked here without a GPU: opchecks.check_mla on the numpy oracle (the checks themselves),
and numpy models of the indexing of mla.cuh's kernels and of CudaOps' host arguments (YaRN's
correction dims, the key split of the latent attention, the per-head matmul's offsets)."""

import math

import numpy as np
import pytest

from reflex_ipc.backends import cuda_ops
from reflex_ipc.backends.numpy_ops import NumpyOps
from reflex_ipc.testing import opchecks
from reflex_ipc.testing.references import attention_ref


@pytest.fixture(scope="module")
def ops():
    return NumpyOps(blas_threads=None)


def test_gpu_checks_of_the_mla_ops_pass_on_numpy(ops):
    rows = opchecks.check_mla(ops, np.random.default_rng(3))
    assert rows and all(r["ok"] for r in rows), [r for r in rows if not r["ok"]][:3]
    assert {r["op"] for r in rows} >= {"split", "concat", "head_matmul", "rope_yarn", "latent_attention",
                                      "kv_store", "mla_step"}


def _rope_yarn_kernel(x, pos, n_rot, base, freq_scale, ff, neox, mscale, ext, lo, hi):
    """rope_yarn_f32 (mla.cuh) pair by pair, in float64, from CudaOps' host arguments."""
    x = x.astype(np.float64).copy()
    N, H, hd = x.shape
    half = n_rot // 2
    for n in range(N):
        for i in range(half):
            te = base ** (-2.0 * i / n_rot)
            if ff is not None:
                te /= float(ff[i])  # in double, as the kernel
            y = min(1.0, max(0.0, (i - lo) / max(0.001, hi - lo)))
            ramp = (1.0 - y) * ext
            ang = math.fmod(pos[n] * (te * freq_scale * (1 - ramp) + te * ramp), 2 * math.pi)
            s, c = math.sin(ang), math.cos(ang)
            a, b = (i, i + half) if neox else (2 * i, 2 * i + 1)
            x0, x1 = x[n, :, a].copy(), x[n, :, b].copy()
            x[n, :, a] = (x0 * c - x1 * s) * mscale
            x[n, :, b] = (x0 * s + x1 * c) * mscale
    return x


@pytest.mark.parametrize("hd,n_rot,fs,yarn,neox,ff", [
    (8, 8, 0.25, (1.0, 32, 32.0, 1.0), False, False),  # the synthetic deepseek2's
    (64, 64, 1 / 40, (1.0, 4096, 32.0, 1.0), False, False),  # DeepSeek-V2-Lite's
    (40, 24, 0.5, (0.5, 2048, 16.0, 2.0), True, True),
])
def test_yarn_kernel_arguments_match_numpy_rope(ops, hd, n_rot, fs, yarn, neox, ff):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 3, hd)).astype(np.float32)
    pos = np.array([0, 3, 17, 1000, 30000], np.int32)
    factors = rng.uniform(1, 3, n_rot // 2).astype(np.float32) if ff else None
    want = ops.rope(x, pos, n_rot=n_rot, base=10000.0, freq_scale=fs, freq_factors=factors, neox=neox,
                    mscale=0.9, yarn=yarn)
    ext, lo, hi, ms = cuda_ops.yarn_args(yarn, n_rot, 10000.0, fs, 0.9)
    got = _rope_yarn_kernel(x, pos, n_rot, 10000.0, fs, factors, neox, ms, ext, lo, hi)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _mla_attention_kernel(q, lat, pos, n_kv, scale, dv, causal, window, mask, n_rows_for_plan):
    """mla_attention_split over its grid (h, n, s) with CudaOps' split plan, then
    attention_combine, in float64: the per-block key ranges and the partial merge."""
    N, H, dk = q.shape
    chunk, S = cuda_ops.mla_split_plan(n_rows_for_plan, n_kv)
    ml = np.zeros((N * H * S, 2))
    acc = np.full((N * H * S, dv), np.nan)
    for h in range(H):
        for n in range(N):
            for s in range(S):
                slot = (n * H + h) * S + s
                p = int(pos[n])
                hi = min(min(p, n_kv - 1) if causal else n_kv - 1, min(n_kv - 1, (s + 1) * chunk - 1))
                lo = max(max(0, p - window + 1) if window > 0 else 0, s * chunk)
                if lo > hi:
                    ml[slot] = (-np.inf, 0.0)
                    acc[slot] = 0.0
                    continue
                j = np.arange(lo, hi + 1)
                sc = lat[j] @ q[n, h] * scale
                if mask is not None:
                    sc = sc + mask[n, j]
                keep = np.isfinite(sc)
                if not keep.any():
                    ml[slot] = (-np.inf, 0.0)
                    acc[slot] = 0.0
                    continue
                m = sc[keep].max()
                e = np.exp(sc[keep] - m)
                ml[slot] = (m, e.sum())
                acc[slot] = e @ lat[j[keep], :dv]
    out = np.zeros((N, H, dv))
    for h in range(H):
        for n in range(N):
            base = (n * H + h) * S
            M = ml[base:base + S, 0].max()
            a, L = np.zeros(dv), 0.0
            for s in range(S):
                m, l_ = ml[base + s]
                if m == -np.inf:
                    continue
                f = math.exp(m - M)
                L += l_ * f
                a += acc[base + s] * f
            out[n, h] = a / L if L > 0 else 0.0
    return out


@pytest.mark.parametrize("n_kv,N,rows_for_plan,window,masked", [
    (300, 2, 8, 0, False),  # split-K: 128-key blocks, the last one partial
    (1500, 1, 16, 0, False),
    (1500, 2, 16, 300, False),  # a window: leading blocks see nothing
    (700, 2, 8, 0, True),  # a mask, not causal
    (64, 5, 500, 0, False),  # one block per (head, query)
])
def test_latent_attention_split_plan(n_kv, N, rows_for_plan, window, masked):
    rng = np.random.default_rng(n_kv)
    H, dk, dv = 2, 24, 16
    q = rng.standard_normal((N, H, dk))
    lat = rng.standard_normal((n_kv, dk))
    pos = np.arange(n_kv - N, n_kv)
    mask = np.where(rng.random((N, n_kv)) < 0.5, -np.inf, 0.0) if masked else None
    causal = not masked
    got = _mla_attention_kernel(q, lat, pos, n_kv, 0.2, dv, causal, window, mask, rows_for_plan)
    want = attention_ref(q, lat[None], lat[None, :, :dv], pos, n_kv, 0.2, 0.0, causal, window, mask)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_head_matmul_indexing():
    """hmm (mla.cuh): warp `row` of H*M reads head h = row // M at x + t*H*K + h*K and writes
    y + t*H*M + row; that is y[n, h] = w[h] @ x[n, h]."""
    rng = np.random.default_rng(2)
    N, H, M, K = 3, 4, 5, 16
    x = rng.standard_normal((N, H, K))
    w = rng.standard_normal((H * M, K))
    xf, y = x.reshape(-1), np.zeros(N * H * M)
    for row in range(H * M):
        h = row // M
        for t in range(N):
            y[t * H * M + row] = w[row] @ xf[t * H * K + h * K:t * H * K + h * K + K]
    np.testing.assert_allclose(y.reshape(N, H, M), NumpyOps(blas_threads=None).head_matmul(x, w), rtol=1e-12)


def test_auto_without_cuda_runs_deepseek2_on_cpu(monkeypatch):
    """deepseek2 is no longer in models.NO_CPU (the cpu backend has the latent attention ops):
    device auto tries CUDA, and without it runs on the cpu backend."""
    from reflex_ipc import cuda, engine
    from reflex_ipc.models import NO_CPU, NUMPY_ONLY

    assert "deepseek2" not in NO_CPU and "deepseek2" not in NUMPY_ONLY
    monkeypatch.setattr(cuda, "start_init", lambda: False)
    assert engine.make_backend("auto", no_cpu=False).name == "cpu"
    assert engine.make_backend("auto", no_cpu=True).name == "numpy"


def test_mla_checks_pass_on_cpu():
    """opchecks.check_mla on the C cpu backend (split, concat, head_matmul of every weight format
    through its matmul kernels, YaRN rope, keys-only kv_store, latent attention, a decode step
    eager and captured); head_matmul is also exactly its own matmul of each head's rows."""
    from reflex_ipc.backends.cpu_ops import CpuOps

    cpu = CpuOps(threads=2)
    rows = opchecks.check_mla(cpu, np.random.default_rng(3))
    assert rows and all(r["ok"] for r in rows), [r for r in rows if not r["ok"]][:3]
    rng = np.random.default_rng(4)
    H, M, K = 3, 37, 256
    w = opchecks._weights(cpu, {"w": ("Q4_K", H * M, K)}, rng)["w"][0]
    for N in (1, 5):
        x = rng.standard_normal((N, H, K)).astype(np.float32)
        got = cpu.head_matmul(x, w)
        for h in range(H):
            np.testing.assert_array_equal(got[:, h], cpu.matmul(np.ascontiguousarray(x[:, h]),
                                                                cpu.weight_rows(w, h * M, M)))


class _FakeDevice:
    """Device memory as one numpy byte buffer (a pointer is an offset in it) and numpy models
    of the kernels CudaOps launches for deepseek2's attention step, each reading its arguments
    exactly as the kernel's C signature does: CudaOps' host code (launch arguments, pointer
    offsets, grids) runs unchanged on it."""

    BASE = 1 << 20

    def __init__(self, nbytes=16 << 20):
        self.mem = np.zeros(nbytes, np.uint8)
        self.top = self.BASE
        self.launches = []
        dev = self

        class Drv:
            def memcpy_htod_async(self, ptr, a, stream):
                b = np.ascontiguousarray(a).view(np.uint8).reshape(-1)
                dev.mem[ptr - dev.BASE:ptr - dev.BASE + b.size] = b

            def memcpy_dtoh_async(self, out, ptr, stream):
                b = out.view(np.uint8).reshape(-1)
                b[...] = dev.mem[ptr - dev.BASE:ptr - dev.BASE + b.size]

            def memset_d8_async(self, ptr, v, n, stream):
                dev.mem[ptr - dev.BASE:ptr - dev.BASE + n] = v

        class Stream:
            def synchronize(self):
                pass

        class Pool:
            def alloc(self, n):
                ptr = dev.top
                dev.top += (max(n, 1) + 255) & ~255
                assert dev.top - dev.BASE <= dev.mem.size
                return ptr, 0

            def give_back(self, ptr, cls):
                pass

        self.drv, self.stream, self.pool = Drv(), Stream(), Pool()

    def view(self, ptr, n, dtype):
        off = ptr - self.BASE
        return self.mem[off:off + n * np.dtype(dtype).itemsize].view(dtype)

    def kernel(self, name):
        """The kernel's real launcher (keyword arguments, reflex_ipc/cuda/launch.py) over a launch
        that runs the numpy model with the arguments in the kernel's order."""
        from reflex_ipc.cuda.core import make_kernel

        def launch(grid, block, args, shared, stream):
            self.launches.append(name)
            getattr(self, "k_" + name.replace("hmm1_", "hmm_").replace("hmm8_", "hmm_"))(grid, block, *args)
        return make_kernel(None, name, None, pack=lambda *args: args, launch=launch)

    # -- the kernels ---------------------------------------------------------------------
    def k_copy_f32(self, grid, block, x, y, n):
        self.view(y, n, np.float32)[...] = self.view(x, n, np.float32)

    def k_copy_cols_f32(self, grid, block, x, y, rows, n, xs, xo, ys, yo):
        X = self.view(x, rows * xs, np.float32).reshape(rows, xs)
        Y = self.view(y, rows * ys, np.float32).reshape(rows, ys)
        Y[:, yo:yo + n] = X[:, xo:xo + n]

    def k_hmm_f32(self, grid, block, W, X, Y, K, M, H, N, rb):
        assert rb == 4 * K and grid[0] * 4 >= H * M and block == (128, 1, 1)
        nt = 1 if grid[1] == N and N == 1 else 8
        assert grid[1] * nt >= N
        w = self.view(W, H * M * K, np.float32).reshape(H, M, K).astype(np.float64)
        x = self.view(X, N * H * K, np.float32).reshape(N, H, K)
        self.view(Y, N * H * M, np.float32)[...] = np.einsum("hmk,nhk->nhm", w, x).reshape(-1)

    def k_rope_yarn_f32(self, grid, block, x, pos, N, H, hd, n_rot, base, fs, ff, neox, ms, ext, lo, hi):
        assert ff == 0
        xs = self.view(x, N * H * hd, np.float32).reshape(N, H, hd)
        p = self.view(pos, N, np.int32)
        xs[...] = _rope_yarn_kernel(xs, p, n_rot, base, fs, None, neox, ms, ext, lo, hi)

    def k_kv_store(self, grid, block, k, v, kc, vc, pos, N, Hkv, hd, ctx):
        assert v == 0 and vc == 0
        K = self.view(k, N * Hkv * hd, np.float32).reshape(N, Hkv, hd)
        C = self.view(kc, Hkv * ctx * hd, np.float16).reshape(Hkv, ctx, hd)
        C[:, self.view(pos, N, np.int32)] = K.transpose(1, 0, 2)

    def k_mla_attention_split(self, grid, block, q, kc, ml, acc, pos, mask, H, dk, dv, n_kv, scale, softcap,
                              causal, window, chunk):
        assert mask == 0 and softcap == 0.0 and window == 0 and grid[0] == H
        N, S = grid[1], grid[2]
        assert S == -(-n_kv // chunk)
        Q = self.view(q, N * H * dk, np.float32).reshape(N, H, dk).astype(np.float64)
        lat = self.view(kc, n_kv * dk, np.float16).reshape(n_kv, dk).astype(np.float64)
        P = self.view(pos, N, np.int32)
        ML = self.view(ml, N * H * S * 2, np.float32).reshape(N * H * S, 2)
        A = self.view(acc, N * H * S * dv, np.float32).reshape(N * H * S, dv)
        for n in range(N):
            for h in range(H):
                for s in range(S):
                    slot = (n * H + h) * S + s
                    hi_ = min(min(int(P[n]), n_kv - 1) if causal else n_kv - 1, min(n_kv - 1, (s + 1) * chunk - 1))
                    lo_ = s * chunk
                    if lo_ > hi_:
                        ML[slot], A[slot] = (-np.inf, 0.0), 0.0
                        continue
                    sc = lat[lo_:hi_ + 1] @ Q[n, h] * scale
                    m = sc.max()
                    e = np.exp(sc - m)
                    ML[slot], A[slot] = (m, e.sum()), e @ lat[lo_:hi_ + 1, :dv]

    def k_attention_combine(self, grid, block, ml, acc, out, sinks, H, hd, S):
        N = grid[1]
        assert grid[0] == H and block[0] >= min(hd, 1024) and sinks == 0  # no attention sinks in MLA
        ML = self.view(ml, N * H * S * 2, np.float32).reshape(N, H, S, 2).astype(np.float64)
        A = self.view(acc, N * H * S * hd, np.float32).reshape(N, H, S, hd).astype(np.float64)
        M = ML[..., 0].max(-1, keepdims=True)
        f = np.where(np.isneginf(ML[..., 0]), 0.0, np.exp(ML[..., 0] - M))
        L = (ML[..., 1] * f).sum(-1)
        self.view(out, N * H * hd, np.float32)[...] = ((A * f[..., None]).sum(2) / L[..., None]).reshape(-1)


def test_cuda_host_code_of_the_mla_step_on_a_fake_device(ops):
    """CudaOps' split, YaRN rope, head_matmul, concat, keys-only kv_store, latent attention
    (split-K over a 300-slot cache, and one block) on _FakeDevice equal numpy's, for a prefill
    and decode steps."""
    from reflex_ipc.cuda.arrays import DeviceWeight
    from reflex_ipc.ggml_types import F32

    dev = _FakeDevice()
    cu = object.__new__(cuda_ops.CudaOps)
    cu.rt, cu.pool, cu.k, cu._graph, cu._arenas = dev, dev.pool, dev.kernel, None, {}
    rng = np.random.default_rng(9)
    H, nope, r, R, v_dim, n_ctx = 4, 8, 8, 16, 12, 300
    kb = rng.standard_normal((H * R, nope)).astype(np.float32)
    vb = rng.standard_normal((H * v_dim, R)).astype(np.float32)
    dkb, dvb = cu.asarray(kb), cu.asarray(vb)
    wk = DeviceWeight(dkb.ptr, kb.shape, F32, "F32", nope * 4, "k_b")
    wv = DeviceWeight(dvb.ptr, vb.shape, F32, "F32", R * 4, "v_b")
    rope = dict(n_rot=r, base=10000.0, freq_scale=0.25, neox=False, mscale=0.9, yarn=(1.0, 32, 32.0, 1.0))

    def step(o, kb_, vb_, q, lat, pe, pos, cache):
        q_nope, q_pe = o.split(q, [nope, r])
        q_pe = o.rope(q_pe, pos, inplace=True, **rope)
        qq = o.concat([o.head_matmul(q_nope, kb_), q_pe])
        pe = o.rope(pe, pos, inplace=True, **rope)
        o.kv_store(cache, None, o.concat([lat, pe]), None, pos)
        att = o.attention(qq, cache, None, pos, n_ctx, scale=0.3, v_dim=R, causal=True, window=0, mask=None)
        return o.head_matmul(att, vb_)

    cache_np = ops.zeros((1, n_ctx, R + r), "float32")
    cache_cu = cu.zeros((1, n_ctx, R + r), cu.kv_dtype)
    spans = [range(0, 7)] + [range(7 + i, 8 + i) for i in range(4)]
    for span in spans:
        N = len(span)
        q = rng.standard_normal((N, H, nope + r)).astype(np.float32)
        lat = rng.standard_normal((N, 1, R)).astype(np.float32)
        pe = rng.standard_normal((N, 1, r)).astype(np.float32)
        pos = np.array(list(span), np.int32)
        want = step(ops, kb, vb, q.copy(), lat, pe.copy(), pos, cache_np)
        got = cu.to_numpy(step(cu, wk, wv, cu.asarray(q), cu.asarray(lat), cu.asarray(pe), cu.positions(pos),
                               cache_cu))
        assert got.shape == (N, H, v_dim)
        rel = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert rel < 2e-3, rel  # the f16 latent cache (an index or offset error is O(1))
    assert {"copy_cols_f32", "rope_yarn_f32", "hmm1_f32", "hmm8_f32", "kv_store", "mla_attention_split",
            "attention_combine"} <= set(dev.launches)


class _FakeDeviceFlash(_FakeDevice):
    """_FakeDevice plus numpy models of what CudaOps.mla_attention launches for a long prompt
    (copy_cols_f16, mla_kb_t_f32, the f16 tensor-core GEMM and its split-K reduce, mla_pack_kv_f32,
    flash_attention_f16kv_192_128 through tests/test_flash_tiling.py's model of the kernel)."""

    def kernel(self, name):
        from reflex_ipc.cuda.core import make_kernel

        if not name.startswith(("flash_attention_f16kv_", "mla_kb_t_")):
            return super().kernel(name)

        def launch(grid, block, args, shared, stream):
            self.launches.append(name)
            fn = self.k_flash if name.startswith("flash") else self.k_mla_kb_t
            fn(name, grid, block, *args)
        return make_kernel(None, name, None, pack=lambda *args: args, launch=launch)

    def k_hmm_f16(self, grid, block, W, X, Y, K, M, H, N, rb):
        w = self.view(W, H * M * K, np.float16).reshape(H, M, K).astype(np.float64)
        x = self.view(X, N * H * K, np.float32).reshape(N, H, K)
        self.view(Y, N * H * M, np.float32)[...] = np.einsum("hmk,nhk->nhm", w, x).reshape(-1)

    def k_copy_cols_f16(self, grid, block, x, y, rows, n, xs, xo, ys, yo):
        X = self.view(x, rows * xs, np.float16).reshape(rows, xs)
        Y = self.view(y, rows * ys, np.float16).reshape(rows, ys)
        Y[:, yo:yo + n] = X[:, xo:xo + n]

    def k_mla_kb_t(self, name, grid, block, W, y, H, R, nope, rb):
        assert name == "mla_kb_t_f32" and rb == 4 * nope
        w = self.view(W, H * R * nope, np.float32).reshape(H, R, nope)
        self.view(y, H * nope * R, np.float16)[...] = w.transpose(0, 2, 1).astype(np.float16).reshape(-1)

    def k_mma_f16(self, grid, block, W, X, Y, K, M, N, rb, acc, P):
        assert rb == 2 * K and grid[:2] == (-(-M // 64), -(-N // 64)) and block == (256, 1, 1)
        w = self.view(W, M * K, np.float16).reshape(M, K).astype(np.float64)
        x = self.view(X, N * K, np.float16).reshape(N, K).astype(np.float64)
        y = (x @ w.T).astype(np.float32)
        if grid[2] > 1:  # split K: the partial sums (here all in split 0) for mma_reduce
            p = self.view(P, grid[2] * N * M, np.float32).reshape(grid[2], N, M)
            p[...] = 0
            p[0] = y
        else:
            out = self.view(Y, N * M, np.float32).reshape(N, M)
            out[...] = out + y if acc else y

    def k_mma_reduce(self, grid, block, P, Y, S, NW, NM, mode):
        assert NW == 1 and mode == 0
        self.view(Y, NM, np.float32)[...] = self.view(P, S * NM, np.float32).reshape(S, NM).sum(0)

    def k_kv_store_latent_f32(self, grid, block, k, kc, pos, N, dk):
        p = self.view(pos, N, np.int32)
        C = self.view(kc, (int(p.max()) + 1) * dk, np.float32).reshape(-1, dk)
        C[p] = self.view(k, N * dk, np.float32).reshape(N, dk)

    def k_mla_attention_split_f32(self, grid, block, q, kc, ml, acc, pos, mask, H, dk, dv, n_kv, scale, softcap,
                                  causal, window, chunk):
        """mla_attention_split over a float32 latent: _FakeDevice's model on its f16 copy (the
        values are f16-representable in this test)."""
        lat = self.view(kc, n_kv * dk, np.float32)
        assert np.array_equal(lat.astype(np.float16).astype(np.float32), lat)
        tmp = self.pool.alloc(n_kv * dk * 2)[0]
        self.view(tmp, n_kv * dk, np.float16)[...] = lat.astype(np.float16)
        self.k_mla_attention_split(grid, block, q, tmp, ml, acc, pos, mask, H, dk, dv, n_kv, scale, softcap,
                                   causal, window, chunk)

    def k_copy_cols_f32_f16(self, grid, block, x, y, rows, n, xs, xo, ys, yo):
        X = self.view(x, rows * xs, np.float32).reshape(rows, xs)
        Y = self.view(y, rows * ys, np.float16).reshape(rows, ys)
        Y[:, yo:yo + n] = X[:, xo:xo + n].astype(np.float16)

    def k_mla_pack_kv_f32(self, grid, block, kn, v, kc, K, V, n, H, nope, r, R, dv, kc32):
        Kn = self.view(kn, n * H * nope, np.float32).reshape(n, H, nope)
        Vv = self.view(v, n * H * dv, np.float32).reshape(n, H, dv)
        lat = self.view(kc, n * (R + r), np.float32 if kc32 else np.float16).reshape(n, R + r).astype(np.float16)
        Kh = self.view(K, H * n * (nope + r), np.float16).reshape(H, n, nope + r)
        Kh[:, :, :nope] = Kn.transpose(1, 0, 2).astype(np.float16)
        Kh[:, :, nope:] = lat[None, :, R:]
        self.view(V, H * n * dv, np.float16)[...] = Vv.transpose(1, 0, 2).astype(np.float16).reshape(-1)

    def k_flash(self, name, grid, block, q, kc, vc, out, ml, acc, pos, mask, sinks, N, Hq, Hkv, ctx, n_kv, scale,
                softcap, causal, window, chunk, span):
        from test_flash_tiling import flash_emulate

        assert name == "flash_attention_f16kv_192_128" and ml == 0 and mask == 0 and Hq == Hkv == grid[0]
        assert sinks == 0 and span == 0  # no attention sinks or chunks in MLA
        assert grid[1] == -(-N // 64) and block == (128, 1, 1)
        Q = self.view(q, N * Hq * 192, np.float32).reshape(N, Hq, 192)
        K = self.view(kc, Hkv * ctx * 192, np.float16).reshape(Hkv, ctx, 192).astype(np.float64)
        V = self.view(vc, Hkv * ctx * 128, np.float16).reshape(Hkv, ctx, 128).astype(np.float64)
        o = flash_emulate(Q, K, V, self.view(pos, N, np.int32), n_kv, scale, causal=bool(causal), window=window)
        self.view(out, N * Hq * 128, np.float32)[...] = o.reshape(-1)


@pytest.mark.parametrize("cache_dtype", ["float16", "float32"])
def test_cuda_host_code_of_the_mla_prefill_on_a_fake_device(ops, cache_dtype):
    """CudaOps.mla_attention's long-prompt form (the latents decompressed per head by two GEMMs,
    packed with the shared rope key, the flash kernel at 192 / 128) on _FakeDeviceFlash equals
    numpy's absorbed form: a first chunk, then a second one over the first's keys; decode steps
    keep the absorbed kernels. The transposed attn_k_b is made once."""
    from reflex_ipc.backends.base import latent_attention
    from reflex_ipc.cuda.arrays import DeviceWeight
    from reflex_ipc.ggml_types import F32

    dev = _FakeDeviceFlash(nbytes=48 << 20)
    cu = object.__new__(cuda_ops.CudaOps)
    cu.rt, cu.pool, cu.k, cu._graph, cu._arenas = dev, dev.pool, dev.kernel, None, {}
    cu.mla_flash, cu.mla_flash_min_n, cu.mla_flash_launches, cu._mla_kbt, cu._sms = True, 8, 0, {}, 132
    rng = np.random.default_rng(11)
    H, nope, r, R, v_dim, n_ctx = 2, 128, 64, 32, 128, 200
    kb = (rng.standard_normal((H * R, nope)) * 0.2).astype(np.float32)
    vb = (rng.standard_normal((H * v_dim, R)) * 0.2).astype(np.float16).astype(np.float32)
    vb16 = cu.asarray(vb, "float16")
    dkb = cu.asarray(kb)
    wk = DeviceWeight(dkb.ptr, kb.shape, F32, "F32", nope * 4, "k_b")
    from reflex_ipc.ggml_types import F16
    wv = DeviceWeight(vb16.ptr, vb.shape, F16, "F16", R * 2, "v_b")

    cache_np = ops.zeros((1, n_ctx, R + r), "float32")
    cache_cu = cu.zeros((1, n_ctx, R + r), cache_dtype)  # f16, or the exact float32 latent
    for span in (range(0, 70), range(70, 100), range(100, 101)):
        N = len(span)
        pos = np.array(list(span), np.int32)
        lat = rng.standard_normal((N, 1, R + r)).astype(np.float16).astype(np.float32)
        q_nope = rng.standard_normal((N, H, nope)).astype(np.float32)
        q_pe = rng.standard_normal((N, H, r)).astype(np.float32)
        ops.kv_store(cache_np, None, lat, None, pos)
        cu.kv_store(cache_cu, None, cu.asarray(lat), None, cu.positions(pos))
        n_kv = int(pos.max()) + 1
        want = latent_attention(ops, q_nope, q_pe, cache_np, kb, vb, pos,
                                n_kv, scale=0.05)
        before = cu.mla_flash_launches
        got = cu.to_numpy(latent_attention(cu, cu.asarray(q_nope), cu.asarray(q_pe), cache_cu, wk, wv,
                                           cu.positions(pos), n_kv, scale=0.05))
        assert got.shape == (N, H, v_dim)
        assert cu.mla_flash_launches == before + (N >= 8)
        rel = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert rel < 3e-3, rel  # f16 keys, values, q and p (a wrong index is O(1))
    assert dev.launches.count("mla_kb_t_f32") == 1
    assert {"copy_cols_f16" if cache_dtype == "float16" else "copy_cols_f32_f16", "mma_f16", "mla_pack_kv_f32",
            "flash_attention_f16kv_192_128"} <= set(dev.launches)
    assert {"mla_attention_split", "mla_attention_split_f32"} & set(dev.launches)  # the decode step


def test_mla_prefill_check_runs_on_numpy(ops):
    """opchecks.check_mla_prefill (run on CUDA by gpu-check / gpu-bigmodel) on the numpy oracle:
    the check runs and numpy's float32 absorbed form is within its bound of the float64 one."""
    rows = opchecks.check_mla_prefill(ops, np.random.default_rng(5))
    assert len(rows) == 6 and all(r["ok"] for r in rows), rows
