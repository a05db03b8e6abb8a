"""Backend ops on the ahead-of-time CUDA kernels (kernels/*.cuh), through pycuda.

Weights stay in their GGUF block format in one device arena per file (see
reflex_ipc.cuda.weights); matmuls and embedding lookups read the blocks directly.
Activations are float32 DeviceArrays from a caching pool; the KV cache is float16.
Everything runs in order on one stream; only to_numpy() (and the sampled token id)
waits for the device.
"""

import math

import numpy as np

from ..cuda import runtime as _cuda_runtime  # the function (the module is cuda.core)
from ..cuda.arrays import DeviceArray, DeviceWeight
from ..cuda.weights import WeightArena
from ..errors import ReflexError
from .base import check_glu, check_matmul_n, host_topk, moe_route, weight_shape
from ..ggml_types import BF16, F16, F32, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, TYPES, type_name

MM_KERNEL = {F32: "f32", F16: "f16", BF16: "bf16", Q4_0: "q4_0", Q4_1: "q4_1", Q5_0: "q5_0",
             Q5_1: "q5_1", Q8_0: "q8_0", Q4_K: "q4_k", Q5_K: "q5_k", Q6_K: "q6_k"}
EW_BLOCK = 256
MM_ROWS = 4  # rows per block of the matmul kernels (MM_ROWS in matmul.cuh)
NORM_ROPE_ROWS = 4  # RMSNORM_ROPE_ROWS in elementwise.cuh
ATT_MAX_HD = 256
ATT_WARPS = 16  # ATT_WARPS in attention.cuh
ATT_SPLIT_BELOW = 132  # split the keys over blocks when fewer (head, query) blocks than this
ATT_CHUNK = 128  # keys per split block (at least)
ATT_MAX_SPLITS = 64
TOPK_SLICE = 4096
TOPK_MAX = 1024


def _ew_grid(n):
    return (max(1, min((n + EW_BLOCK - 1) // EW_BLOCK, 8192)), 1, 1)


class CudaOps:
    name = "cuda"
    device = "cuda"
    kv_dtype = "float16"
    prefill_chunk = 1024

    def __init__(self):
        self.rt = _cuda_runtime()
        self.pool = self.rt.pool
        self.k = self.rt.kernel
        self._arenas = {}
        self._extra_weights = []
        self._graph = None

    def _k_after_upload(self, name):
        """Kernel lookup while weight uploads are in flight: the first launch waits for
        them (weights loaded earlier may be read by any kernel), then lookups go direct."""
        for a in self._arenas.values():
            a.wait()
        self.k = self.rt.kernel
        return self.k(name)

    # -- memory ------------------------------------------------------------------
    def empty(self, shape, dtype="float32"):
        if isinstance(shape, int):
            shape = (shape,)
        # while capturing, from the graph's private pool: a block freed during the capture is
        # reused later in the same capture (safe: the captured kernels run in stream order),
        # and none is handed to work outside the graph, which replays may overwrite at any time
        return DeviceArray.empty(self.pool if self._graph is None else self._graph.pool, shape, dtype)

    def zeros(self, shape, dtype="float32"):
        out = self.empty(shape, dtype)
        if out.nbytes:
            self.rt.drv.memset_d8_async(out.ptr, 0, out.nbytes, self.rt.stream)
        return out

    def write(self, dst, host):
        a = np.ascontiguousarray(host, dtype=dst.dtype)
        if a.size != dst.size:
            raise ValueError(f"write: {a.shape} into {dst.shape}")
        if a.nbytes:
            self.rt.drv.memcpy_htod_async(dst.ptr, a, self.rt.stream)
        return dst

    def copy(self, src, out):
        if src.nbytes != out.nbytes:
            raise ValueError(f"copy: {src.shape} {src.dtype} into {out.shape} {out.dtype}")
        if src.nbytes:
            self.rt.drv.memcpy_dtod_async(out.ptr, src.ptr, src.nbytes, self.rt.stream)
        return out

    def capture(self, fn):
        """Run fn() under CUDA stream capture and return (graph, fn's result): graph.launch()
        replays every kernel fn launched, with the same arguments and buffers. fn must not
        copy between host and device; what changes between replays (positions, token ids)
        belongs in device arrays created beforehand and updated before each launch()."""
        from ..cuda.graph import Graph

        for a in self._arenas.values():
            a.wait()
        self.k = self.rt.kernel
        self.synchronize()
        from ..cuda.core import Pool

        g = Graph(self.rt.stream.handle)
        g.pool = Pool(self.rt.drv)
        self._graph = g
        try:
            with g:
                result = fn()
        except BaseException:
            g.close()
            raise
        finally:
            self._graph = None
        return g, result

    def asarray(self, a, dtype=None):
        """numpy -> device (float32 by default; int arrays become int32)."""
        if isinstance(a, DeviceArray):
            return a
        a = np.asarray(a)
        if dtype is None:
            dtype = "int32" if a.dtype.kind in "iub" else "float32"
        a = np.ascontiguousarray(a, dtype=dtype)
        out = self.empty(a.shape, dtype)
        if a.nbytes:
            self.rt.drv.memcpy_htod_async(out.ptr, a, self.rt.stream)
        return out

    def to_numpy(self, x):
        if isinstance(x, np.ndarray):
            return x
        out = np.empty(x.shape, dtype=x.dtype)
        if out.nbytes:
            self.rt.drv.memcpy_dtoh_async(out, x.ptr, self.rt.stream)
        self.rt.stream.synchronize()
        return out

    def synchronize(self):
        self.rt.stream.synchronize()

    def upload_stats(self):
        """How each weight arena was uploaded (mode, bytes, ms, GB/s)."""
        return [a.stats for a in self._arenas.values()]

    # -- weights -----------------------------------------------------------------
    def _arena(self, f):
        a = self._arenas.get(id(f))
        if a is None:
            a = WeightArena(self.rt, f)
            self._arenas[id(f)] = a
            self.k = self._k_after_upload
        return a

    def load_weight(self, f, name, ndim=None):
        """A tensor of GGUFFile f on the device: 2-D matrices stay quantized in the arena
        (DeviceWeight); vectors become float32 DeviceArrays."""
        t = f.tensors[name]
        arena = self._arena(f)
        shape = weight_shape(t, ndim)  # numpy order
        if len(shape) >= 2 and t.ggml_type in MM_KERNEL:
            rows = math.prod(shape[:-1])
            cols = shape[-1]
            _, blk, bsize = TYPES[type_name(t.ggml_type)]
            return DeviceWeight(arena.ptr(t), (rows, cols), t.ggml_type, type_name(t.ggml_type),
                                cols // blk * bsize, name, arena)
        from ..quants import dequantize

        if len(shape) >= 2:
            # a block format without a kernel here (Q2_K, Q3_K, IQ*): dequantized to f16 once
            rows, cols = math.prod(shape[:-1]), shape[-1]
            host = dequantize(f.tensor_data(t), t.ggml_type, t.n_elements).astype(np.float16)
            dev = self.asarray(host.reshape(rows, cols), "float16")
            self._extra_weights.append(dev)
            return DeviceWeight(dev.ptr, (rows, cols), F16, "F16", cols * 2, name, None)
        # vectors (norm weights, biases, rope factors): float32
        if t.ggml_type == F32:
            return DeviceArray(arena.ptr(t), shape, "float32", arena)

        return self.asarray(dequantize(f.tensor_data(t), t.ggml_type, t.n_elements).reshape(shape))

    # -- linear algebra ------------------------------------------------------------
    def host_weight(self, a, name):
        """A float32 host matrix [rows, cols] as an F32 weight handle on the device (small
        matrices made at load: LoRA's padded low-rank factors)."""
        a = np.ascontiguousarray(a, np.float32)
        dev = self.asarray(a, "float32")
        self._extra_weights.append(dev)
        return DeviceWeight(dev.ptr, a.shape, F32, "F32", a.shape[1] * 4, name, None)

    def weight_rows(self, w, start, n):
        if not 0 <= start and start + n <= w.shape[0]:
            raise ValueError(f"weight_rows: rows {start}..{start + n} of {w.shape[0]}")
        if isinstance(w, DeviceWeight):
            return DeviceWeight(w.ptr + start * w.row_bytes, (n, w.shape[1]), w.ggml_type, w.type_name,
                                w.row_bytes, f"{w.name}[{start}:{start + n}]", w.owner)
        return w[start:start + n]  # a float array (a weight kept as float32)

    @staticmethod
    def _mm_shape(x, w):
        """(M, K, N) of x [..., K] times weight w [M, K], after checking they fit."""
        if not isinstance(w, DeviceWeight):
            raise TypeError("matmul needs a DeviceWeight from load_weight")
        M, K = w.shape
        if x.shape[-1] != K:
            raise ValueError(f"matmul: x has {x.shape[-1]} columns, weight {w.name} expects {K}")
        if K % 8:
            raise ReflexError("unsupported_architecture", f"{w.name}: rows of {K} (need a multiple of 8)")
        return M, K, x.size // K

    @staticmethod
    def _mm_launch(rows, N):
        """(tokens per block, grid, block) of the matmul kernels for `rows` output rows."""
        nt = 1 if N == 1 else (4 if N <= 4 else 8)
        return nt, ((rows + MM_ROWS - 1) // MM_ROWS, (N + nt - 1) // nt, 1), (32 * MM_ROWS, 1, 1)

    def matmul(self, x, w, out=None, accumulate=False):
        """x [..., K] float32 times a weight [M, K] -> [..., M] (x @ w.T)."""
        M, K, N = self._mm_shape(x, w)
        if out is None:
            if accumulate:
                raise ValueError("matmul: accumulate=True needs out")
            out = self.empty(x.shape[:-1] + (M,))
        nt, grid, block = self._mm_launch(M, N)
        self.k(f"mm{nt}_{MM_KERNEL[w.ggml_type]}")(grid, block, w.ptr, x.ptr, out.ptr, K, M, N, w.row_bytes,
                                                   1 if accumulate else 0)
        return out

    def matmul_n(self, x, ws):
        """[x @ w.T for w in ws] (1-3 weights of one width): one launch over the rows of all
        the weights that share a block format (a mixed q/k/v, e.g. Q4_K q and k with a Q6_K v,
        takes one launch per format)."""
        check_matmul_n(ws)
        for w in ws:
            self._mm_shape(x, w)
        by_type = {}
        for i, w in enumerate(ws):
            by_type.setdefault(w.ggml_type, []).append(i)
        outs = [None] * len(ws)
        for idx in by_type.values():
            if len(idx) == 1:
                outs[idx[0]] = self.matmul(x, ws[idx[0]])
                continue
            group = [ws[i] for i in idx]
            ys = [self.empty(x.shape[:-1] + (w.shape[0],)) for w in group]
            pad = [0] * (3 - len(group))
            Ms = [w.shape[0] for w in group] + pad
            K = group[0].shape[1]
            N = x.size // K
            nt, grid, block = self._mm_launch(sum(Ms), N)
            self.k(f"mmn{nt}_{MM_KERNEL[group[0].ggml_type]}")(
                grid, block, *[w.ptr for w in group], *pad, x.ptr, *[y.ptr for y in ys], *pad, K, *Ms, N,
                group[0].row_bytes)
            for i, y in zip(idx, ys):
                outs[i] = y
        return outs

    def matmul_glu(self, x, w_gate, w_up, act="silu"):
        """act(x @ w_gate.T) * (x @ w_up.T), act silu or tanh gelu: one launch when both
        weights share a block format, else two matmuls and swiglu / geglu."""
        check_glu(w_gate, w_up, act)
        M, K, N = self._mm_shape(x, w_gate)
        self._mm_shape(x, w_up)
        if w_gate.ggml_type != w_up.ggml_type:
            g, u = self.matmul(x, w_gate), self.matmul(x, w_up)
            return self.swiglu(g, u) if act == "silu" else self.geglu(g, u)
        out = self.empty(x.shape[:-1] + (M,))
        nt, grid, block = self._mm_launch(M, N)
        self.k(f"mmglu{nt}_{MM_KERNEL[w_gate.ggml_type]}")(grid, block, w_gate.ptr, w_up.ptr, x.ptr, out.ptr,
                                                          K, M, N, w_gate.row_bytes, 0 if act == "silu" else 1)
        return out

    def moe(self, x, router, w_gate, w_up, w_down, n_used, *, gating="softmax", norm=True, scale=1.0,
            selection_bias=None, act="silu", groups=None, logits=None, expert_scale=None):
        """Routed on the host (the router's logits cross, N x E floats), then each token's
        selected experts through the quantized matmul kernels on views of the expert tensors:
        only those experts' blocks are read. It waits for the device, so a model using it is
        not captured in a graph (models mark that with `capturable = False`)."""
        if logits is None:
            logits = self.matmul(x, router)
        E = logits.shape[-1]
        F, D = w_gate.shape[0] // E // (2 if w_up is None else 1), w_down.shape[0] // E
        top, w = moe_route(self.to_numpy(logits), n_used, gating, norm, scale,
                           None if selection_bias is None else self.to_numpy(selection_bias), groups)
        if expert_scale is not None:
            w = w * self.to_numpy(expert_scale)[top]
        out = self.zeros((x.shape[0], D))

        def rows(wt, start, n):
            return self.weight_rows(wt, start, n)

        for n in range(x.shape[0]):
            xn, on = x[n:n + 1], out[n:n + 1]
            for k in range(top.shape[1]):
                e = int(top[n, k])
                g, u = (rows(w_gate, 2 * e * F, F), rows(w_gate, (2 * e + 1) * F, F)) if w_up is None else \
                    (rows(w_gate, e * F, F), rows(w_up, e * F, F))
                y = self.matmul(self.matmul_glu(xn, g, u, act=act), rows(w_down, e * D, D))
                self.add(on, self.scale(y, float(w[n, k])), out=on)
        return out

    def embed(self, w, ids, scale=1.0):
        """Rows ids of an embedding matrix [n_vocab, dim], dequantized: [len(ids), dim]."""
        ids = self.positions(ids)
        n = ids.size
        M, K = w.shape
        out = self.empty((n, K))
        self.k(f"get_rows_{MM_KERNEL[w.ggml_type]}")(
            ((K // 8 + 127) // 128, n, 1), (128, 1, 1), w.ptr, ids.ptr, out.ptr, K, w.row_bytes,
            float(scale))
        return out

    # -- element-wise ------------------------------------------------------------
    def _binary(self, name, a, b, out):
        if a.shape != b.shape:
            raise ValueError(f"{name}: shapes {a.shape} and {b.shape}")
        out = out if out is not None else self.empty(a.shape)
        self.k(name)(_ew_grid(a.size), (EW_BLOCK, 1, 1), a.ptr, b.ptr, out.ptr, a.size)
        return out

    def add(self, a, b, out=None):
        if b.ndim == 1 and a.shape[-1] == b.shape[0] and a.shape != b.shape:
            out = out if out is not None else self.empty(a.shape)
            self.k("add_row_f32")(_ew_grid(a.size), (EW_BLOCK, 1, 1), a.ptr, b.ptr, out.ptr, a.size, b.size)
            return out
        return self._binary("add_f32", a, b, out)

    def mul(self, a, b, out=None):
        if b.ndim == 1 and a.shape[-1] == b.shape[0] and a.shape != b.shape:
            out = out if out is not None else self.empty(a.shape)
            self.k("mul_row_f32")(_ew_grid(a.size), (EW_BLOCK, 1, 1), a.ptr, b.ptr, out.ptr, a.size, b.size)
            return out
        return self._binary("mul_f32", a, b, out)

    def scale(self, a, s, out=None):
        out = out if out is not None else self.empty(a.shape)
        self.k("scale_f32")(_ew_grid(a.size), (EW_BLOCK, 1, 1), a.ptr, float(s), out.ptr, a.size)
        return out

    def softcap(self, a, cap, out=None):
        out = out if out is not None else self.empty(a.shape)
        self.k("softcap_f32")(_ew_grid(a.size), (EW_BLOCK, 1, 1), a.ptr, float(cap), out.ptr, a.size)
        return out

    def silu(self, a):
        out = self.empty(a.shape)
        self.k("silu_f32")(_ew_grid(a.size), (EW_BLOCK, 1, 1), a.ptr, out.ptr, a.size)
        return out

    def gelu(self, a):
        out = self.empty(a.shape)
        self.k("gelu_f32")(_ew_grid(a.size), (EW_BLOCK, 1, 1), a.ptr, out.ptr, a.size)
        return out

    def _glu(self, name, g, u):
        if g.shape != u.shape:
            raise ValueError(f"{name}: shapes {g.shape} and {u.shape}")
        ncol = g.shape[-1]
        out = self.empty(g.shape)
        self.k(name)(_ew_grid(g.size), (EW_BLOCK, 1, 1), g.ptr, u.ptr, out.ptr, g.size, ncol, ncol, ncol)
        return out

    def swiglu(self, g, u):
        """silu(g) * u"""
        return self._glu("swiglu_f32", g, u)

    def geglu(self, g, u):
        """gelu_tanh(g) * u"""
        return self._glu("geglu_f32", g, u)

    # -- normalization, rotary ---------------------------------------------------------
    def rms_norm(self, x, w, eps):
        dim = x.shape[-1]
        out = self.empty(x.shape)
        rows = x.size // dim
        threads = 1024 if dim >= 4096 else (256 if dim >= 512 else 64)
        self.k("rmsnorm_f32")((rows, 1, 1), (threads, 1, 1), x.ptr, w.ptr if w is not None else 0,
                              out.ptr, dim, float(eps))
        return out

    def positions(self, pos):
        """int32 device array of positions (a list / range / numpy array)."""
        if isinstance(pos, DeviceArray):
            return pos
        return self.asarray(np.asarray(pos, dtype=np.int32))

    def rope(self, x, pos, *, n_rot=None, base=10000.0, freq_scale=1.0, freq_factors=None,
             neox=False, mscale=1.0, inplace=False, yarn=None):
        """Rotate x [N, H, hd] (in place when inplace, else a copy) at positions pos [N]."""
        if yarn is not None and yarn[0] != 0.0:
            raise ReflexError("unsupported_architecture", "YaRN rope scaling has no CUDA kernel yet "
                              "(use --device cpu)")
        N, H, hd = x.shape
        n_rot = hd if n_rot is None else n_rot
        pos = self.positions(pos)
        if not inplace:
            y = self.empty(x.shape)
            self.k("copy_f32")(_ew_grid(x.size), (EW_BLOCK, 1, 1), x.ptr, y.ptr, x.size)
            x = y
        total = N * H * (n_rot // 2)
        self.k("rope_f32")(_ew_grid(total), (EW_BLOCK, 1, 1), x.ptr, pos.ptr, N, H, hd, n_rot,
                           float(base), float(freq_scale), freq_factors.ptr if freq_factors is not None else 0,
                           1 if neox else 0, float(mscale))
        return x

    def rms_norm_rope(self, x, w, eps, pos, *, n_rot=None, base=10000.0, freq_scale=1.0,
                      freq_factors=None, neox=False, mscale=1.0):
        """rms_norm of each head row of x [N, H, hd] then rope, in place: one launch."""
        N, H, hd = x.shape
        n_rot = hd if n_rot is None else n_rot
        if n_rot % 2 or not 0 < n_rot <= hd:
            raise ValueError(f"rms_norm_rope: n_rot {n_rot} for head dim {hd}")
        pos = self.positions(pos)
        rows = N * H
        if rows == 0:
            return x
        self.k("rmsnorm_rope_f32")(((rows + NORM_ROPE_ROWS - 1) // NORM_ROPE_ROWS, 1, 1),
                                   (32 * NORM_ROPE_ROWS, 1, 1), x.ptr, w.ptr if w is not None else 0,
                                   pos.ptr, rows, H, hd, float(eps), n_rot, float(base), float(freq_scale),
                                   freq_factors.ptr if freq_factors is not None else 0, 1 if neox else 0,
                                   float(mscale))
        return x

    # -- attention ---------------------------------------------------------------
    def kv_store(self, k_cache, v_cache, k, v, slots):
        """Write k, v [N, Hkv, hd] into a layer's K/V [Hkv, n_slots, hd] at the given slots."""
        N, Hkv, hd = k.shape
        slots = self.positions(slots)
        self.k("kv_store")(_ew_grid(k.size), (EW_BLOCK, 1, 1), k.ptr, v.ptr, k_cache.ptr, v_cache.ptr,
                           slots.ptr, N, Hkv, hd, k_cache.shape[1])

    def attention(self, q, k_cache, v_cache, pos, n_kv, *, scale, softcap=0.0, causal=True, window=0,
                  mask=None, v_dim=None):
        """q [N, Hq, hd] over keys 0..n_kv-1 of a layer's K/V [Hkv, n_slots, hd] -> [N, Hq, hd]."""
        if v_cache is None:
            raise ReflexError("unsupported_architecture", "latent attention (values inside the keys) has "
                              "no CUDA kernel yet (use --device cpu)")
        N, Hq, hd = q.shape
        if hd > ATT_MAX_HD:
            raise ReflexError("unsupported_architecture", f"head_dim {hd} > {ATT_MAX_HD}")
        pos = self.positions(pos)
        out = self.empty(q.shape)
        Hkv, ctx = k_cache.shape[0], k_cache.shape[1]
        if causal and mask is None:
            # keys 0..pos[n] are the visible ones whatever n_kv is (pos[n] < n_kv): passing
            # n_slots keeps the launch arguments position-free, so a captured graph replays
            n_kv = ctx
        n_kv = int(n_kv)
        mptr = mask.ptr if mask is not None else 0
        if N * Hq < ATT_SPLIT_BELOW and n_kv > ATT_CHUNK:
            # few (head, query) blocks for a long key range (decode): split the keys over
            # blocks, then merge the partial softmaxes
            chunk = max(ATT_CHUNK, -(-n_kv // ATT_MAX_SPLITS))
            S = -(-n_kv // chunk)
            ml = self.empty((N * Hq * S * 2,))
            acc = self.empty((N * Hq * S * hd,))
            self.k("attention_split_f16kv")((Hq, N, S), (32 * ATT_WARPS, 1, 1), q.ptr, k_cache.ptr,
                                            v_cache.ptr, ml.ptr, acc.ptr, pos.ptr, mptr, Hq,
                                            Hkv, hd, ctx, n_kv, float(scale),
                                            float(softcap), 1 if causal else 0, int(window), chunk)
            self.k("attention_combine")((Hq, N, 1), (max(32, (hd + 31) // 32 * 32), 1, 1), ml.ptr, acc.ptr,
                                        out.ptr, Hq, hd, S)
            return out
        self.k("attention_f16kv")((Hq, N, 1), (32 * ATT_WARPS, 1, 1), q.ptr, k_cache.ptr, v_cache.ptr,
                                  out.ptr, pos.ptr, mptr, Hq, Hkv, hd, ctx, n_kv,
                                  float(scale), float(softcap), 1 if causal else 0, int(window))
        return out

    # -- sampling ----------------------------------------------------------------
    def argmax(self, logits, out=None):
        """Index of the largest value of each row: a numpy int array (waits for the device),
        or written to the int32 device array `out` (no wait; a captured graph can hold it)."""
        n = logits.shape[-1]
        rows = logits.size // n
        dev = out if out is not None else self.empty((rows,), "int32")
        self.k("argmax_f32")((rows, 1, 1), (1024, 1, 1), logits.ptr, n, dev.ptr)
        return dev if out is not None else self.to_numpy(dev).reshape(logits.shape[:-1])

    def logprobs(self, logits, rows, targets, n=None):
        V = logits.shape[-1]
        n = V if n is None else int(n)
        idx = np.stack([np.asarray(rows, np.int32).reshape(-1), np.asarray(targets, np.int32).reshape(-1)])
        K = idx.shape[1]
        if not K:
            return np.empty(0)
        dev = self.asarray(idx, "int32")
        out = self.empty((K,), "float64")
        self.k("logprob_rows")((K, 1, 1), (1024, 1, 1), logits.ptr, V, dev.ptr, dev.ptr + 4 * K, n, out.ptr)
        return self.to_numpy(out)

    def topk(self, logits, k, n=None):
        """The k best of the first n columns of one row, best first: numpy int64 [k]."""
        n = logits.shape[-1] if n is None else int(n)
        k = max(0, min(int(k), n, TOPK_MAX))
        if not k:
            return np.empty(0, np.int64)
        nb = (n + TOPK_SLICE - 1) // TOPK_SLICE
        cv = self.empty((nb * k,))
        ci = self.empty((nb * k,), "int32")
        self.k("topk_f32")((nb, 1, 1), (256, 1, 1), logits.ptr, 0, n, k, TOPK_SLICE, cv.ptr, ci.ptr)
        if nb > 1:
            m = nb * k
            if m > TOPK_SLICE:  # more candidates than one block holds: sort on the host
                return host_topk(self.to_numpy(logits), k, n)
            v2 = self.empty((k,))
            i2 = self.empty((k,), "int32")
            self.k("topk_f32")((1, 1, 1), (1024, 1, 1), cv.ptr, ci.ptr, m, k, m, v2.ptr, i2.ptr)
            ci = i2
        return self.to_numpy(ci)[:k].astype(np.int64)
