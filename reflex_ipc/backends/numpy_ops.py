"""The backend ops (base.py) on numpy: the reference implementation, and the CPU engine.

Weights are dequantized to float32 at load so every matmul is one BLAS call;
the KV cache is float32.

There is deliberately no emulation of ggml's activation quantization
(llama.cpp's CPU backend rounds a matmul's input to Q8_0/Q8_1/Q8_K blocks
before a quantized dot product). Reproducing that rounding exactly per dot
product is easy, but on a small quantized model it is chaotic: a one-ulp
change of an activation flips roundings that grow into logit changes of a few
percent, so unless every op is bit-identical to ggml the emulation only adds a
second draw of that noise. Plain float32 products sit in the middle of it:
on SmolLM2 Q4_1 these ops agree with llama.cpp run on an F32 copy of the same
weights to 1e-4..1e-3 of max|logit|, while llama.cpp on the Q4_1 file is
2-3% away from that same F32 result (and ~3% from itself between batched and
token-by-token evaluation of one sequence).
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import ReflexError
from .base import (check_glu, check_matmul_n, host_logprobs, host_topk, matmul_result, moe_route, pos_temperature,
                   seq_groups, swiglu_oai, unique_ids, weight_shape)

_F32 = np.float32
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_LOAD_CHUNK = 1 << 16  # elements dequantized per step when loading a matrix
SCAN_CHUNK = 64  # tokens per chunk of the parallel form of delta_net / ssm_scan


def _chunk_scan(q, k, v, g, beta, S):
    """One chunk of a gated linear recurrence in the parallel form, float64, all heads at once.
    q, k [H, L, Dk]; v [H, L, Dv]; g [H, L] log decays; beta [H, L] (the delta rule) or None
    (plain accumulation); S [H, Dv, Dk] the state before the chunk. With G_t = cumsum(g)_t:
        S_t = exp(G_t) S + sum_{i<=t} exp(G_t - G_i) u_i k_i^T,   out_t = S_t q_t
    where u_i = v_i without the delta rule, and with it the solution of the unit lower
    triangular system u_t = beta_t (v_t - exp(G_t) S k_t - sum_{i<t} exp(G_t - G_i) (k_i.k_t) u_i).
    Returns (out [H, L, Dv], the state after the chunk)."""
    L = q.shape[1]
    G = np.cumsum(g, axis=1)
    diff = G[:, :, None] - G[:, None, :]  # [H, t, i]
    lower = np.tril(np.ones((L, L), bool))
    decay = np.exp(np.where(lower, diff, -np.inf))  # i <= t
    gt = np.exp(G)[:, :, None]
    if beta is None:
        u = v
    else:
        b = beta[:, :, None]
        a = b * (decay * np.tril(np.ones((L, L)), -1)) * (k @ k.transpose(0, 2, 1))  # i < t
        m = np.eye(L) + a
        u = np.linalg.solve(m, b * v) - np.linalg.solve(m, b * gt * k) @ S.transpose(0, 2, 1)
    out = gt * (q @ S.transpose(0, 2, 1)) + (decay * (q @ k.transpose(0, 2, 1))) @ u
    w = np.exp(G[:, -1:] - G)[:, :, None]  # [H, L, 1]
    S = np.exp(G[:, -1])[:, None, None] * S + u.transpose(0, 2, 1) @ (w * k)
    return out, S


def _set_hugepage(enabled):
    """numpy's madvise(MADV_HUGEPAGE) switch for new arrays; returns the previous setting."""
    try:
        from numpy._core.multiarray import _set_madvise_hugepage
    except ImportError:
        try:
            from numpy.core.multiarray import _set_madvise_hugepage
        except ImportError:
            return enabled
    return _set_madvise_hugepage(enabled)


_MAPPED_MIN = 64 << 10  # bytes from which zeros() maps its own pages


def _mapped_zeros(shape, dtype):
    """Zeros of at least _MAPPED_MIN bytes in a private anonymous mapping of their own (small
    pages), or None. np.zeros is lazy only where malloc maps the block itself, and glibc's
    threshold for that rises to the largest block freed so far (up to 32 MiB): after a few
    large temporaries, a 128 KiB cache array comes from the heap, and calloc clears (touches)
    all of it. A mapping's pages stay untouched, outside the resident set, until a token is
    stored in them."""
    import mmap

    dt = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    count = 1
    for d in shape:
        count *= int(d)
    nbytes = count * dt.itemsize
    if nbytes < _MAPPED_MIN or not hasattr(mmap, "MAP_PRIVATE"):
        return None
    try:
        m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)  # fd -1: anonymous, zero-filled
    except (OSError, ValueError):
        return None  # np.zeros then tries (and reports out_of_memory)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        try:
            m.madvise(mmap.MADV_NOHUGEPAGE)
        except OSError:
            pass  # advice only
    return np.frombuffer(m, dtype=dt, count=count).reshape(shape)


def set_blas_threads(n):
    """Set the thread count of the OpenBLAS that numpy uses; False when it cannot be found.

    numpy's wheels bundle OpenBLAS as numpy.libs/libscipy_openblas*.so; loading that path
    again returns the library numpy already uses.
    """
    import ctypes
    import glob
    import os

    libdir = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
    for path in sorted(glob.glob(os.path.join(libdir, "lib*openblas*.so*"))):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for sym in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                    "openblas_set_num_threads64_", "openblas_set_num_threads"):
            fn = getattr(lib, sym, None)
            if fn is not None:
                fn(ctypes.c_int(int(n)))
                return True
    return False


def _default_blas_threads():
    """BLAS threads for the engine: $REFLEX_CPU_THREADS, else 1 unless the user set OpenBLAS's
    or OpenMP's own variable. One thread: decoding multiplies a single row by each matrix,
    which is memory-bound, and OpenBLAS's spinning worker threads turn any other load on the
    cores into a 5-10x slowdown (measured: 2 threads 25 tok/s idle, 2.5 tok/s with a busy
    neighbour; 1 thread 14-20 tok/s either way)."""
    import os

    from .. import settings

    want = settings.get().cpu_threads
    if want:
        set_blas_threads(want)
    elif not (os.environ.get("OPENBLAS_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS")):
        set_blas_threads(1)


class NumpyOps:
    name = "numpy"
    device = "cpu"
    kv_dtype = "float32"
    prefill_chunk = 256

    def __init__(self, blas_threads="default"):
        self._rope_memo = None  # (pos array, params, rotation): q and k share positions
        self._vis_memo = None  # (pos array, params, attention bias): all layers share it
        if blas_threads == "default":
            _default_blas_threads()
        elif blas_threads is not None:
            set_blas_threads(blas_threads)

    # -- memory ------------------------------------------------------------------
    def empty(self, shape, dtype="float32"):
        return np.empty(shape, dtype)

    def zeros(self, shape, dtype="float32"):
        # np.zeros maps pages lazily, so an unused context costs nothing; but numpy asks for
        # transparent huge pages on big arrays, and then the first token stored in each
        # (layer, head) row zeroes 2 MiB: seconds on a first prompt on some machines.
        # Small pages make that first touch proportional to what is stored.
        out = _mapped_zeros(shape, dtype)
        if out is not None:
            return out
        hugepage = _set_hugepage(False)
        try:
            return np.zeros(shape, dtype)
        except MemoryError:
            raise ReflexError("out_of_memory", f"{shape} {dtype} does not fit in memory") from None
        finally:
            _set_hugepage(hugepage)

    def write(self, dst, host):
        np.copyto(dst, np.asarray(host).reshape(dst.shape), casting="same_kind")
        return dst

    def copy(self, src, out):
        np.copyto(out, src)
        return out

    def asarray(self, a, dtype=None):
        a = np.asarray(a)
        if dtype is None:
            dtype = np.int32 if a.dtype.kind in "iub" else _F32
        return np.ascontiguousarray(a, dtype=dtype)

    def to_numpy(self, x):
        return np.asarray(x)

    def synchronize(self):
        pass

    def positions(self, pos):
        if isinstance(pos, np.ndarray) and pos.dtype == np.int32:
            return pos
        return np.asarray(list(pos) if isinstance(pos, range) else pos, dtype=np.int32).reshape(-1)

    # -- weights -----------------------------------------------------------------
    def load_weight(self, f, name, ndim=None):
        from ..ggml_types import BY_ID
        from ..quants import dequantize

        t = f.tensors[name]
        shape = weight_shape(t, ndim)
        raw = f.tensor_data(t)
        if len(shape) < 2:  # copied: F32 data would otherwise be a view of the mapping
            return np.array(dequantize(raw, t.ggml_type, t.n_elements), dtype=_F32).reshape(shape)
        # Column-major [rows, cols]: x @ w.T then streams a C-contiguous [cols, rows] matrix,
        # which OpenBLAS reads about 40% faster than the transposed product (decode is
        # memory-bound: ~17 vs ~12 GB/s measured on one core). Dequantized a few rows at a
        # time straight into place: no full-size temporary (half the load time).
        rows, cols = math.prod(shape[:-1]), shape[-1]
        _, blk, bsize = BY_ID[t.ggml_type]
        row_bytes = cols // blk * bsize
        out = np.empty((rows, cols), _F32, order="F")
        step = max(1, _LOAD_CHUNK // cols)
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            out[r0:r1] = dequantize(raw[r0 * row_bytes:r1 * row_bytes], t.ggml_type,
                                    (r1 - r0) * cols).reshape(r1 - r0, cols)
        return out

    def weight_rows(self, w, start, n):
        if not 0 <= start and start + n <= w.shape[0]:
            raise ValueError(f"weight_rows: rows {start}..{start + n} of {w.shape[0]}")
        return w[start:start + n]

    # -- linear algebra ----------------------------------------------------------
    def matmul(self, x, w, out=None, accumulate=False):
        if x.shape[-1] != w.shape[1]:
            raise ValueError(f"matmul: x has {x.shape[-1]} columns, weight expects {w.shape[1]}")
        return matmul_result(x @ w.T, out, accumulate)

    def matmul_n(self, x, ws):
        check_matmul_n(ws)
        return [self.matmul(x, w) for w in ws]

    def matmul_glu(self, x, w_gate, w_up, act="silu"):
        check_glu(w_gate, w_up, act)
        glu = self.swiglu if act == "silu" else self.geglu
        return glu(self.matmul(x, w_gate), self.matmul(x, w_up))

    def moe(self, x, router, w_gate, w_up, w_down, n_used, *, gating="softmax", norm=True, scale=1.0,
            selection_bias=None, act="silu", groups=None, logits=None, expert_scale=None, router_bias=None,
            gate_bias=None, up_bias=None, down_bias=None, weight_before=False):
        if logits is None:
            logits = x @ router.T
        if router_bias is not None:
            logits = logits + router_bias
        E = logits.shape[-1]
        F, D = w_gate.shape[0] // E // (2 if w_up is None else 1), w_down.shape[0] // E
        top, w = moe_route(logits, n_used, gating, norm, scale, selection_bias, groups)
        out = np.zeros((x.shape[0], D), _F32)
        glu = {"silu": self.swiglu, "gelu": self.geglu, "swiglu_oai": swiglu_oai}[act]
        for e in unique_ids(top):
            rows, slot = np.nonzero(top == e)
            h = x[rows] * w[rows, slot][:, None] if weight_before else x[rows]
            if w_up is None:
                g, u = w_gate[2 * e * F:(2 * e + 1) * F], w_gate[(2 * e + 1) * F:(2 * e + 2) * F]
            else:
                g, u = w_gate[e * F:(e + 1) * F], w_up[e * F:(e + 1) * F]
            g, u = h @ g.T, h @ u.T
            if gate_bias is not None:
                g, u = g + gate_bias[e], u + up_bias[e]
            y = glu(g, u) @ w_down[e * D:(e + 1) * D].T
            if down_bias is not None:
                y = y + down_bias[e]
            if expert_scale is not None:
                y = y * expert_scale[e]
            out[rows] += y if weight_before else y * w[rows, slot][:, None]
        return out

    def embed(self, w, ids, scale=1.0):
        rows = w[np.asarray(ids, dtype=np.int64).reshape(-1)]
        return rows * _F32(scale) if scale != 1.0 else rows

    # -- element-wise ------------------------------------------------------------
    @staticmethod
    def _put(y, out):
        if out is None:
            return y
        out[...] = y
        return out

    def add(self, a, b, out=None):
        return np.add(a, b, out=out) if out is not None else a + b

    def mul(self, a, b, out=None):
        return np.multiply(a, b, out=out) if out is not None else a * b

    def scale(self, a, s, out=None):
        return self._put(a * _F32(s), out)

    def softcap(self, a, cap, out=None):
        cap = _F32(cap)
        return self._put(np.tanh(a / cap) * cap, out)

    def silu(self, a):
        return a / (_F32(1) + np.exp(-a))

    def gelu(self, a):
        inner = _F32(_SQRT_2_OVER_PI) * (a + _F32(0.044715) * a * a * a)
        return _F32(0.5) * a * (_F32(1) + np.tanh(inner))

    def swiglu(self, g, u):
        return self.silu(g) * u

    def geglu(self, g, u):
        return self.gelu(g) * u

    # -- normalization, rotary -------------------------------------------------------
    def rms_norm(self, x, w, eps):
        ms = np.add.reduce(x * x, axis=-1, keepdims=True)
        ms *= _F32(1.0 / x.shape[-1])
        ms += _F32(eps)
        y = x / np.sqrt(ms, out=ms)
        if w is not None:
            y *= w
        return y

    def _rotation(self, pos, hd, n_rot, base, freq_scale, freq_factors, neox, mscale, yarn=None):
        """(perm, cos, sin) with rope(x) = x * cos + x[..., perm] * sin over the last axis:
        perm swaps each rotated pair, sin carries the pair's sign, dims >= n_rot pass through.
        Memoized for the last positions array (q and k of every layer share it)."""
        params = (hd, n_rot, base, freq_scale, id(freq_factors), neox, mscale, yarn)
        memo = self._rope_memo
        if memo is not None and memo[0] is pos and memo[1] == params:
            return memo[2]
        half = n_rot // 2
        inv = np.power(float(base), -2.0 * np.arange(half) / n_rot)
        if freq_factors is not None:
            inv = inv / np.asarray(freq_factors, np.float64)
        if yarn is not None and yarn[0] != 0.0:
            ext_factor, n_ctx_orig, beta_fast, beta_slow = yarn

            def corr_dim(b):
                return n_rot * math.log(n_ctx_orig / (b * 2 * math.pi)) / (2 * math.log(base))

            lo, hi = max(0.0, math.floor(corr_dim(beta_fast))), min(n_rot - 1.0, math.ceil(corr_dim(beta_slow)))
            ramp = (1 - np.clip((np.arange(half) - lo) / max(0.001, hi - lo), 0, 1)) * ext_factor
            inv = inv * freq_scale * (1 - ramp) + inv * ramp
            mscale = mscale * (1.0 + 0.1 * math.log(1.0 / freq_scale))
        else:
            inv = inv * freq_scale
        ang = np.asarray(pos, np.float64)[:, None] * inv[None, :]  # [N, half]
        c, sn = np.cos(ang) * mscale, np.sin(ang) * mscale
        cos = np.ones((len(ang), hd))
        sin = np.zeros((len(ang), hd))
        perm = np.arange(hd)
        i = np.arange(half)
        a, b = (i, i + half) if neox else (2 * i, 2 * i + 1)  # the pairs (x_a, x_b)
        cos[:, a], cos[:, b] = c, c
        sin[:, a], sin[:, b] = -sn, sn
        perm[a], perm[b] = b, a
        rot = (perm, cos.astype(_F32)[:, None, :], sin.astype(_F32)[:, None, :])
        self._rope_memo = (pos, params, rot)
        return rot

    def rope(self, x, pos, *, n_rot=None, base=10000.0, freq_scale=1.0, freq_factors=None,
             neox=False, mscale=1.0, inplace=False, yarn=None):
        hd = x.shape[-1]
        perm, cos, sin = self._rotation(pos, hd, hd if n_rot is None else n_rot, base, freq_scale,
                                        freq_factors, neox, mscale, tuple(yarn) if yarn is not None else None)
        y = x * cos
        y += x[..., perm] * sin
        if inplace:
            x[...] = y
            return x
        return y

    def rms_norm_rope(self, x, w, eps, pos, *, n_rot=None, base=10000.0, freq_scale=1.0,
                      freq_factors=None, neox=False, mscale=1.0):
        x[...] = self.rope(self.rms_norm(x, w, eps), pos, n_rot=n_rot, base=base, freq_scale=freq_scale,
                           freq_factors=freq_factors, neox=neox, mscale=mscale)
        return x

    # -- attention ---------------------------------------------------------------
    def kv_store(self, k_cache, v_cache, k, v, slots):
        if v_cache is None:  # keys only (an MLA latent)
            self.kv_store(k_cache, k_cache[:, :, :0], k, k[:, :, :0], slots)
            return
        if len(slots) == 1:  # decode
            slot = int(slots[0])
            k_cache[:, slot] = k[0]
            v_cache[:, slot] = v[0]
            return
        slots = np.asarray(slots, dtype=np.int64).reshape(-1)
        n = len(slots)
        if n and slots[-1] - slots[0] == n - 1 and (n == 1 or np.all(np.diff(slots) == 1)):
            sl = slice(int(slots[0]), int(slots[0]) + n)  # contiguous: a plain slice copy
            k_cache[:, sl] = k.transpose(1, 0, 2)
            v_cache[:, sl] = v.transpose(1, 0, 2)
        else:
            k_cache[:, slots] = k.transpose(1, 0, 2)
            v_cache[:, slots] = v.transpose(1, 0, 2)

    def attention(self, q, k_cache, v_cache, pos, n_kv, *, scale, softcap=0.0, causal=True, window=0,
                  mask=None, v_dim=None, sinks=None, chunk=0):
        N, Hq, hd = q.shape
        Hkv = k_cache.shape[0]
        g = Hq // Hkv
        K = k_cache[:, :n_kv]  # [Hkv, n_kv, hd]
        V = v_cache[:, :n_kv] if v_cache is not None else k_cache[:, :n_kv, :v_dim]
        dv = V.shape[-1]
        sk = None if sinks is None else np.asarray(sinks, _F32).reshape(Hkv, g, 1)  # per head, after the scores
        if N == 1 and mask is None and (window <= 0 or n_kv <= window) and (chunk <= 0 or n_kv <= chunk) and (
                not causal or int(pos[0]) >= n_kv - 1):
            # decode: one query that sees every stored key
            s = (q.reshape(Hkv, g, hd) * _F32(scale)) @ K.transpose(0, 2, 1)  # [Hkv, g, n_kv]
            if softcap > 0.0:
                s = np.tanh(s / _F32(softcap)) * _F32(softcap)
            m = np.maximum.reduce(s, axis=-1, keepdims=True)
            if sk is not None:
                m = np.maximum(m, sk)
            s -= m
            np.exp(s, out=s)
            denom = np.add.reduce(s, axis=-1, keepdims=True)
            if sk is not None:
                denom += np.exp(sk - m)
            s /= denom
            return (s @ V).reshape(1, Hq, dv)
        qg = q.reshape(N, Hkv, g, hd).transpose(1, 0, 2, 3).reshape(Hkv, N * g, hd)
        s = (qg * _F32(scale)) @ K.transpose(0, 2, 1)  # [Hkv, N*g, n_kv]
        s = s.reshape(Hkv, N, g, n_kv)
        if softcap > 0.0:
            s = np.tanh(s / _F32(softcap)) * _F32(softcap)
        bias = self._visibility(pos, n_kv, causal, window, chunk)  # [N, 1, n_kv] or None
        if mask is not None:
            m = np.asarray(mask, _F32)[:, None, :]
            bias = m if bias is None else bias + m
        if bias is not None:
            s += bias
        m = np.maximum.reduce(s, axis=-1, keepdims=True)
        seen = np.isfinite(m)  # rows that see nothing: exp(-inf) = 0 everywhere, zeros out
        m[~seen] = 0
        if sk is not None:  # [Hkv, 1, g, 1] against m [Hkv, N, g, 1]
            m = np.where(seen, np.maximum(m, sk[:, None]), m)
        s -= m
        p = np.exp(s, out=s)
        denom = np.add.reduce(p, axis=-1, keepdims=True)
        if sk is not None:
            denom += np.where(seen, np.exp(sk[:, None] - m), _F32(0))
        denom[denom == 0] = 1
        p /= denom
        o = p.reshape(Hkv, N * g, n_kv) @ V  # [Hkv, N*g, dv]
        return np.ascontiguousarray(o.reshape(Hkv, N, g, dv).transpose(1, 0, 2, 3)).reshape(N, Hq, dv)

    def _visibility(self, pos, n_kv, causal, window, chunk=0):
        """Additive float32 [N, 1, n_kv] bias hiding keys outside [lo, hi] (base.py), or None
        when every key is visible. Memoized for the last positions array: every layer of a
        batch asks for the same one."""
        key = (n_kv, causal, window, chunk)
        memo = self._vis_memo
        if memo is not None and memo[0] is pos and memo[1] == key:
            return memo[2]
        p = np.asarray(pos, np.int64).reshape(-1)
        bias = None
        if (causal and int(p.min()) < n_kv - 1) or (window > 0 and int(p.max()) - window + 1 > 0) or (
                chunk > 0 and int(p.max()) >= chunk):
            j = np.arange(n_kv)
            hi = p if causal else np.full(len(p), n_kv - 1)
            lo = p - window + 1 if window > 0 else np.zeros(len(p), np.int64)
            if chunk > 0:
                lo = np.maximum(lo, p - p % chunk)
            vis = (j[None, :] >= lo[:, None]) & (j[None, :] <= hi[:, None])
            bias = np.where(vis, _F32(0), _F32(-np.inf))[:, None, :]
        self._vis_memo = (pos, key, bias)
        return bias

    def pos_scale(self, x, pos, *, floor, scale, offset=1.0):
        t = pos_temperature(pos, floor, scale, offset)
        return x * t.reshape((-1,) + (1,) * (x.ndim - 1))

    # -- multi-head latent attention ---------------------------------------------------
    def split(self, x, sizes):
        if sum(sizes) != x.shape[-1]:
            raise ValueError(f"split: sizes {list(sizes)} of {x.shape[-1]} columns")
        out, a = [], 0
        for n in sizes:
            out.append(np.ascontiguousarray(x[..., a:a + n]))
            a += n
        return out

    def concat(self, xs):
        return np.concatenate(xs, axis=-1)

    def head_matmul(self, x, w):
        N, H, K = x.shape
        if w.shape[1] != K or w.shape[0] % H:
            raise ValueError(f"head_matmul: x {x.shape} with weight {w.shape}")
        M = w.shape[0] // H
        y = np.matmul(x.transpose(1, 0, 2), w.reshape(H, M, K).transpose(0, 2, 1))  # [H, N, M]
        return np.ascontiguousarray(y.transpose(1, 0, 2))

    # -- recurrent layers ----------------------------------------------------------------
    def sigmoid(self, a):
        return _F32(1) / (_F32(1) + np.exp(-a))

    def softplus(self, a):
        with np.errstate(over="ignore"):
            return np.where(a > 20, a, np.log1p(np.exp(np.minimum(a, 20)))).astype(_F32)

    def columns(self, x, start, n):
        if not 0 <= start and start + n <= x.shape[-1]:
            raise ValueError(f"columns: {start}..{start + n} of {x.shape[-1]}")
        return np.ascontiguousarray(x[..., start:start + n])

    def ssm_conv(self, x, state, w, seqs=None):
        K = w.shape[1]
        out = np.empty(x.shape, _F32)
        for s, idx in seq_groups(seqs, x.shape[0]):
            xx = np.concatenate([state[s], x[idx]])  # [K-1+T, C]
            T = len(idx)
            y = xx[0:T] * w[:, 0]
            for j in range(1, K):
                y += xx[j:j + T] * w[:, j]
            out[idx] = y
            state[s] = xx[T:]
        return out

    def delta_net(self, q, k, v, g, beta, state, seqs=None, scale=1.0):
        Hk, Hv = q.shape[1], v.shape[1]
        rep = np.arange(Hv) % Hk
        out = np.empty(v.shape, _F32)
        for s, idx in seq_groups(seqs, v.shape[0]):
            qs, ks = q[idx][:, rep] * _F32(scale), k[idx][:, rep]
            if len(idx) == 1:  # decode: one step, float32
                S = state[s]
                S *= np.exp(g[idx[0]])[:, None, None]
                kt = ks[0][:, :, None]  # [Hv, D, 1]
                d = (v[idx[0]] - (S @ kt)[:, :, 0]) * beta[idx[0]][:, None]
                S += d[:, :, None] * kt.transpose(0, 2, 1)
                out[idx[0]] = (S @ qs[0][:, :, None])[:, :, 0]
                continue
            out[idx] = self._scan(qs, ks, v[idx], g[idx], beta[idx], state, s)
        return out

    def ssm_scan(self, x, dt, A, B, C, state, seqs=None, D=None):
        H, G = x.shape[1], B.shape[1]
        grp = np.arange(H) // (H // G)
        out = np.empty(x.shape, _F32)
        for s, idx in seq_groups(seqs, x.shape[0]):
            xs, dts = x[idx], dt[idx]
            y = self._scan(C[idx][:, grp], B[idx][:, grp], xs * dts[:, :, None], dts * A, None, state, s)
            out[idx] = y if D is None else y + xs * D[:, None]
        return out

    def _scan(self, q, k, v, g, beta, state, s):
        """Tokens [T, H, ...] of one sequence through _chunk_scan, SCAN_CHUNK at a time; updates
        state[s]. float32 [T, H, Dv]."""
        f64 = np.float64
        tr = lambda a: np.ascontiguousarray(a.transpose(1, 0, *range(2, a.ndim)), dtype=f64)  # noqa: E731
        q, k, v, g = tr(q), tr(k), tr(v), tr(g)
        beta = tr(beta) if beta is not None else None
        S = state[s].astype(f64)
        T = q.shape[1]
        out = np.empty((q.shape[0], T, v.shape[2]))
        for a in range(0, T, SCAN_CHUNK):
            e = min(T, a + SCAN_CHUNK)
            out[:, a:e], S = _chunk_scan(q[:, a:e], k[:, a:e], v[:, a:e], g[:, a:e],
                                         beta[:, a:e] if beta is not None else None, S)
        state[s] = S
        return out.transpose(1, 0, 2).astype(_F32)

    # -- selection ---------------------------------------------------------------
    def argmax(self, logits, out=None):
        idx = np.argmax(np.asarray(logits), axis=-1)
        if out is None:
            return idx
        out[...] = idx.reshape(out.shape)
        return out

    def topk(self, logits, k, n=None):
        return host_topk(logits, k, n)

    def logprobs(self, logits, rows, targets, n=None):
        return host_logprobs(logits, rows, targets, n)
