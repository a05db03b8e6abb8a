"""The backend ops (base.py) on the CPU with the compiled kernels (kernels/cpu/*.c).

Arrays are numpy arrays, as on the numpy backend; what differs is where the time
goes. Weights stay the GGUF's own blocks, read in place from the file mapping
(no dequantization and no copy at load: a weight handle is the tensor's address,
type and row stride). `matmul` rounds each row of activations to int8 blocks
(32 values with a float scale for Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/IQ4_NL/MXFP4 weights, 256 values
with group sums for the K-quants and the other IQ / TQ formats (kernels/cpu/iq*.c), as
ggml's CPU backend does with Q8_0/Q8_1/Q8_K)
and runs integer dot products on the packed weights; F32/F16/BF16 weights take
the float32 activations as they are. Norms, rotary, the KV store and attention
are C loops as well; the KV cache is float16 (`kv_dtype`). So are the recurrent layers'
ops (ssm_conv, delta_net, ssm_scan: each sequence's tokens step by step in float32, the
state updated in place) and the latent attention over an MLA cache; YaRN rotary and
concat run in numpy.

Numerics: the numpy backend (float32 dequantized weights, float32 KV) stays the
oracle. The activation rounding adds a relative error of about 0.5/127 per block
to each product, and the float16 KV cache about 2^-11 per value; the tests bound
the resulting differences (tests/test_cpu_ops.py, tests/arch/test_goldens.py).

The library is loaded with ctypes at first use. When it is missing or fails to
load, `available()` says why and the engine falls back to the numpy backend with
one warning (engine.make_backend).

Threads: a pool of (physical cores) threads in C, spin-then-sleep, with chunks
claimed one at a time so that a core taken by another process slows us down in
proportion instead of stalling every op at a barrier. $REFLEX_CPU_THREADS sets
the count, $REFLEX_CPU_ISA the kernel set, $REFLEX_CPU_GRAPH=0 turns the runtime's
replays of recorded steps off (reflex_ipc/settings.py).
"""

from __future__ import annotations

import ctypes
import math
import os

import numpy as np

from .base import check_glu, check_matmul_n, host_logprobs, host_topk, matmul_result, unique_ids, weight_shape
from . import cpu_launch
from .cpu_launch import ABI_VERSION, CMD_WIDTH, FLOAT_ARGS, MATMUL, OPS, SIGNATURES, Launchers, RxWeight

_F32 = np.float32
_LIB_NAME = "libreflex_cpu.so"
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_lib = None
_lib_error = None

# ggml types the kernels read in place (others are dequantized to float32 at load): the float
# types, Q4_0..Q8_0, Q4_K..Q8_K, and kernels/cpu/iq.c's IQ1_S..IQ4_XS, TQ1_0, TQ2_0, MXFP4
NATIVE_TYPES = frozenset({0, 1, 2, 3, 6, 7, 8, 12, 13, 14, 15, 30,
                          16, 17, 18, 19, 20, 21, 22, 23, 29, 34, 35, 39})


def library_path():
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "kernels", _LIB_NAME)


def load_library():
    """The ctypes library (loaded once), or None; `_lib_error` then says why."""
    global _lib, _lib_error
    if _lib is not None or _lib_error is not None:
        return _lib
    path = library_path()
    if not os.path.exists(path):
        _lib_error = (f"{path} is missing (the package was installed without building the CPU kernels; "
                      "build them with `python3 kernels/cpu/build.py`)")
        return None
    try:
        lib = ctypes.CDLL(path)
        # rx_abi_version first: a library built from another ABI table may lack the others
        lib.rx_abi_version.argtypes, lib.rx_abi_version.restype = SIGNATURES["rx_abi_version"]
        if lib.rx_abi_version() != ABI_VERSION:
            raise OSError(f"ABI version {lib.rx_abi_version()}, expected {ABI_VERSION} (built from another "
                          "reflex_ipc/backends/cpu_abi.py: rebuild the kernels)")
        for name, (args, res) in SIGNATURES.items():  # cpu_abi.py's table (generated cpu_launch.py)
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, res
        cpu_launch.bind(lib)  # the launchers' functions
        from .. import settings

        isa = settings.get().cpu_isa  # before any op: the kernel set is chosen at the first
        if lib.rx_set_isa(isa.encode()):
            raise OSError(f"the library does not know the kernel set {isa!r}")
    except (OSError, AttributeError) as e:
        _lib_error = f"{path} could not be loaded: {e}"
        return None
    _lib = lib
    return lib


def available():
    """(True, isa name) when the kernels load, else (False, why)."""
    lib = load_library()
    if lib is None:
        return False, _lib_error
    return True, lib.rx_isa_name().decode()


def physical_cores():
    """Cores this process may run on, counting SMT siblings once (Linux sysfs; else the CPU count)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
    cores = set()
    for c in cpus:
        try:
            with open(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list") as fh:
                cores.add(fh.read().strip())
        except OSError:
            cores.add(str(c))
    return max(1, len(cores))


def _ptr(a):
    return a.ctypes.data


def _empty64(shape, dtype):
    """np.empty(shape, dtype) starting on a 64-byte boundary (a cache line): the threads of a
    product write disjoint column blocks of each output row, which then share no line (numpy's
    own large arrays start 16 bytes into a page)."""
    dt = np.dtype(dtype)
    nbytes = math.prod(shape) * dt.itemsize if isinstance(shape, tuple) else int(shape) * dt.itemsize
    if nbytes < 4096:
        return np.empty(shape, dt)
    buf = np.empty(nbytes + 64, np.uint8)
    off = _off64(buf)
    return buf[off:off + nbytes].view(dt).reshape(shape)


def _off64(a):
    """Bytes from a's start to the next 64-byte boundary."""
    return -a.__array_interface__["data"][0] % 64


class CpuWeight:
    """A weight handle: `shape` (rows, cols) of ggml type `ggml_type`, read in place from
    `raw` (the mapping, or a float32 array for types the kernels do not read)."""

    __slots__ = ("shape", "ggml_type", "raw", "row_bytes", "desc", "ptr", "dense")

    def __init__(self, raw, ggml_type, rows, cols, row_bytes):
        self.shape = (rows, cols)
        self.ggml_type = ggml_type
        self.raw = raw
        self.row_bytes = row_bytes
        self.desc = RxWeight(ggml_type, raw.ctypes.data, rows, cols, row_bytes)
        self.ptr = ctypes.addressof(self.desc)
        # F32 weights: numpy's BLAS on a view of the mapping for batches
        self.dense = raw.view(_F32).reshape(rows, cols) if ggml_type == 0 else None

    @property
    def ndim(self):
        return 2

    def rows(self, ids):
        """Rows `ids` dequantized to float32 [len(ids), cols]."""
        from ..quants import dequantize

        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if self.dense is not None:
            return self.dense[ids]
        blocks = self.raw.reshape(self.shape[0], self.row_bytes)[ids]
        return dequantize(blocks.reshape(-1), self.ggml_type, len(ids) * self.shape[1]).reshape(
            len(ids), self.shape[1])


class CpuOps(Launchers):
    """The ops on the C kernels. The library's functions are methods inherited from
    cpu_launch.Launchers (generated from cpu_abi.py), called with keyword arguments:
    `self.rx_matmul(N=..., ...)`; the recorded ones append to a graph being recorded."""

    name = "cpu"
    device = "cpu"
    kv_dtype = "float16"
    prefill_chunk = 512

    def __init__(self, threads=None, kv_dtype=None):
        lib = load_library()
        if lib is None:
            raise RuntimeError(_lib_error)
        self._lib = lib
        from .. import settings

        s = settings.get()
        if threads is None:
            threads = s.cpu_threads or physical_cores()
        self.graphs = s.cpu_graph  # capture's graphs replayed by the runtime ($REFLEX_CPU_GRAPH)
        self.threads = self.rx_set_threads(n=max(1, int(threads)))
        self.isa = self.rx_isa_name().decode()
        if kv_dtype is not None:
            if kv_dtype not in ("float16", "float32"):
                raise ValueError(f"kv_dtype must be float16 or float32, not {kv_dtype!r}")
            self.kv_dtype = kv_dtype
        self._rec = None  # while recording a graph: [(op code, args)]
        self._keep = None  # ... and the buffers its commands point into
        self._consts = None  # ... and the constants converted from host data
        self._rec_bad = None  # ... or why the step cannot be replayed
        self._last_bad = None
        self._np_ops = None
        self._saved = None  # while capturing: [(recurrent state, its values before)]

    def set_threads(self, n):
        self.threads = self.rx_set_threads(n=max(1, int(n)))
        return self.threads

    # -- the C calls (Launchers' methods; recorded while capturing) ---------------------
    @staticmethod
    def _failed(code, rc):
        """A recorded function returned rc != 0 (matmul, embed: a negative error)."""
        from ..errors import ReflexError

        if code == MATMUL and rc == -2:
            raise ReflexError("out_of_memory", "cpu matmul: no memory for the activation buffer")
        raise ReflexError("internal", f"cpu kernel {OPS[code]} failed ({rc})")

    def _new(self, shape, dtype=_F32):
        if self._keep is None:
            return _empty64(shape, dtype)
        # Recording: a graph keeps its arrays for as long as it lives, so memory that the
        # recorded code no longer references (no Python object left: nothing later in the
        # recording can read it) is handed out again, as replays run the same order.
        import sys

        dt = np.dtype(dtype)
        nbytes = max(1, math.prod(shape if isinstance(shape, tuple) else (shape,)) * dt.itemsize)
        best = None
        for b in self._keep:  # base buffers; 3 references: the list, b, getrefcount's argument
            # (the arrays handed out are views whose base is b: numpy's views name the owner)
            if b.nbytes - _off64(b) >= nbytes and sys.getrefcount(b) <= 3 and (best is None or b.nbytes < best.nbytes):
                best = b
        if best is None:
            best = np.empty((nbytes + 63) // 64 * 64 + 64, np.uint8)
            self._keep.append(best)
        off = _off64(best)
        return best[off:off + nbytes].view(dt).reshape(shape)

    def _eager(self, why):
        """A step done in numpy: a recording that contains it cannot be replayed."""
        if self._rec is not None and self._rec_bad is None:
            self._rec_bad = self._last_bad = why

    def _f32(self, x):
        """x as a C-contiguous float32 array."""
        if x.dtype != _F32 or not x.flags.c_contiguous:
            self._eager("a non-contiguous or non-float32 input")
            x = np.ascontiguousarray(x, dtype=_F32)
        return x

    # -- memory ------------------------------------------------------------------
    def empty(self, shape, dtype="float32"):
        return self._new(shape, dtype)

    def zeros(self, shape, dtype="float32"):
        from .numpy_ops import NumpyOps

        return NumpyOps.zeros(self, shape, dtype)  # lazily mapped, small pages (see there)

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
        if isinstance(pos, np.ndarray) and pos.dtype == np.int32 and pos.flags.c_contiguous:
            return pos.reshape(-1)
        a = np.ascontiguousarray(list(pos) if isinstance(pos, range) else pos, dtype=np.int32).reshape(-1)
        if self._consts is not None:  # recording: a host list is a constant of the graph
            self._consts.append(a)
        return a

    def write(self, dst, host):
        np.copyto(dst, np.asarray(host).reshape(dst.shape), casting="same_kind")
        return dst

    def copy(self, src, out):
        if (src.dtype == out.dtype and src.shape == out.shape and src.flags.c_contiguous
                and out.flags.c_contiguous):
            self.rx_copy(src=src.ctypes.data, dst=out.ctypes.data, bytes=src.nbytes)
        else:
            self._eager("copy between different layouts")
            out[...] = src
        return out

    # -- weights -----------------------------------------------------------------
    def load_weight(self, f, name, ndim=None):
        from ..ggml_types import BY_ID
        from ..quants import dequantize

        t = f.tensors[name]
        shape = weight_shape(t, ndim)
        raw = f.tensor_data(t)
        if len(shape) < 2:
            return np.array(dequantize(raw, t.ggml_type, t.n_elements), dtype=_F32).reshape(shape)
        rows, cols = math.prod(shape[:-1]), shape[-1]
        if t.ggml_type not in NATIVE_TYPES:  # e.g. Q2_K, Q3_K, IQ4_*: float32 once, at load
            data = np.ascontiguousarray(dequantize(raw, t.ggml_type, t.n_elements), dtype=_F32)
            return CpuWeight(data.view(np.uint8), 0, rows, cols, cols * 4)
        _, blk, bsize = BY_ID[t.ggml_type]
        if cols % blk or raw.size != rows * (cols // blk) * bsize:
            from ..errors import ReflexError

            raise ReflexError("gguf_error", f"tensor {name!r}: {cols} columns of {BY_ID[t.ggml_type][0]} are not "
                              f"whole {blk}-value blocks, or its data size does not match")
        return CpuWeight(raw, t.ggml_type, rows, cols, cols // blk * bsize)

    def weight_rows(self, w, start, n):
        start, n = int(start), int(n)
        if not (0 <= start and n >= 0 and start + n <= w.shape[0]):
            raise ValueError(f"weight_rows: rows {start}..{start + n} of {w.shape[0]}")
        rb = w.row_bytes
        return CpuWeight(w.raw[start * rb:(start + n) * rb], w.ggml_type, n, w.shape[1], rb)

    # -- linear algebra ----------------------------------------------------------
    @staticmethod
    def _check(x, w, what="matmul"):
        if x.shape[-1] != w.shape[1]:
            raise ValueError(f"{what}: x has {x.shape[-1]} columns, weight expects {w.shape[1]}")

    def matmul(self, x, w, out=None, accumulate=False):
        self._check(x, w)
        if accumulate and out is None:
            raise ValueError("matmul: accumulate=True needs out")
        if isinstance(w, np.ndarray):  # a small float32 matrix a model made (base.py)
            self._eager("matmul with an array weight")
            y = np.asarray(x, _F32) @ np.asarray(w, _F32).T
            return matmul_result(y, out, accumulate)
        x = self._f32(x)
        K, M = x.shape[-1], w.shape[0]
        N = x.size // K if K else 0
        if w.dense is not None and N > 4 and self._rec is None:  # float32 weights: BLAS
            y = x @ w.dense.T
            return matmul_result(y, out, accumulate)
        y = out if out is not None and out.flags.c_contiguous and out.dtype == _F32 else None
        if y is None:
            y = self._new(x.shape[:-1] + (M,))
            if accumulate:
                self._eager("accumulate into a non-contiguous out")
                y[...] = out
        if N:
            self.rx_matmul(N=N, K=K, x=x.ctypes.data, ldx=K, nw=1, w0=w.ptr, w1=None, w2=None, y0=y.ctypes.data,
                           y1=None, y2=None, mode=0, accumulate=1 if accumulate else 0)
        if out is not None and y is not out:
            out[...] = y
            return out
        return y

    def matmul_n(self, x, ws):
        check_matmul_n(ws)
        for w in ws:
            self._check(x, w, "matmul_n")
        x = self._f32(x)
        K = x.shape[-1]
        N = x.size // K if K else 0
        if any(w.dense is not None for w in ws) and N > 4 and self._rec is None:
            return [self.matmul(x, w) for w in ws]
        lead = x.shape[:-1]
        ys = [self._new(lead + (w.shape[0],)) for w in ws]
        if N:
            p = [w.ptr for w in ws] + [None] * (3 - len(ws))
            yp = [y.ctypes.data for y in ys] + [None] * (3 - len(ws))
            self.rx_matmul(N=N, K=K, x=x.ctypes.data, ldx=K, nw=len(ws), w0=p[0], w1=p[1], w2=p[2], y0=yp[0],
                           y1=yp[1], y2=yp[2], mode=0, accumulate=0)
        return ys

    def matmul_glu(self, x, w_gate, w_up, act="silu"):
        check_glu(w_gate, w_up, act)
        self._check(x, w_gate, "matmul_glu")
        x = self._f32(x)
        K = x.shape[-1]
        N = x.size // K if K else 0
        if (w_gate.dense is not None or w_up.dense is not None) and N > 4 and self._rec is None:
            glu = self.swiglu if act == "silu" else self.geglu
            return glu(self.matmul(x, w_gate), self.matmul(x, w_up))
        y = self._new(x.shape[:-1] + (w_gate.shape[0],))
        if N:
            self.rx_matmul(N=N, K=K, x=x.ctypes.data, ldx=K, nw=2, w0=w_gate.ptr, w1=w_up.ptr, w2=None,
                           y0=y.ctypes.data, y1=None, y2=None, mode=1 if act == "silu" else 2, accumulate=0)
        return y

    def moe(self, x, router, w_gate, w_up, w_down, n_used, *, gating="softmax", norm=True, scale=1.0,
            selection_bias=None, act="silu", groups=None, logits=None, expert_scale=None, router_bias=None,
            gate_bias=None, up_bias=None, down_bias=None, weight_before=False):
        """base.py's moe: the routing on the host (base.moe_route), each selected expert's rows
        through the kernels (weight_rows: only those experts' blocks are read). w_up None: w_gate
        holds each expert's gate rows then its up rows (a fused gate_up tensor). gpt-oss's expert
        biases and clamped SwiGLU, Llama 4's weighted input: on the host between the kernels."""
        from .base import moe_route, swiglu_oai

        self._eager("moe routing on the host")
        x = self._f32(x)
        if logits is None:
            logits = self.matmul(x, router)
        logits = np.asarray(logits)
        if router_bias is not None:
            logits = logits + np.asarray(router_bias, _F32)
        E = logits.shape[-1]
        F, D = w_gate.shape[0] // E // (2 if w_up is None else 1), w_down.shape[0] // E
        top, w = moe_route(logits, n_used, gating, norm, scale, selection_bias, groups)
        out = np.zeros((x.shape[0], D), _F32)
        for e in unique_ids(top):
            rows, slot = np.nonzero(top == e)
            h = np.ascontiguousarray(x[rows] * w[rows, slot][:, None] if weight_before else x[rows], dtype=_F32)
            if w_up is None:
                g, u = self.weight_rows(w_gate, 2 * e * F, F), self.weight_rows(w_gate, (2 * e + 1) * F, F)
            else:
                g, u = self.weight_rows(w_gate, e * F, F), self.weight_rows(w_up, e * F, F)
            if act == "swiglu_oai" or gate_bias is not None:
                gv, uv = self.matmul_n(h, [g, u])
                if gate_bias is not None:
                    gv, uv = gv + np.asarray(gate_bias, _F32)[e], uv + np.asarray(up_bias, _F32)[e]
                a = swiglu_oai(gv, uv) if act == "swiglu_oai" else \
                    (self.swiglu(gv, uv) if act == "silu" else self.geglu(gv, uv))
            else:
                a = self.matmul_glu(h, g, u, act=act)
            y = self.matmul(np.ascontiguousarray(a, dtype=_F32), self.weight_rows(w_down, e * D, D))
            if down_bias is not None:
                y = y + np.asarray(down_bias, _F32)[e]
            if expert_scale is not None:
                y = y * np.asarray(expert_scale, _F32)[e]
            out[rows] += y if weight_before else y * w[rows, slot][:, None]
        return out

    def embed(self, w, ids, scale=1.0):
        if not isinstance(w, CpuWeight):
            self._eager("embedding from an array")
            rows = np.array(np.asarray(w)[np.asarray(ids, np.int64).reshape(-1)], dtype=_F32)
            return rows * _F32(scale) if scale != 1.0 else rows
        ids = self.positions(ids)
        N, (M, K) = len(ids), w.shape
        if N and (int(ids.min()) < 0 or int(ids.max()) >= M):
            raise ValueError(f"embed: token ids outside 0..{M - 1}")
        out = self._new((N, K))
        if w.ggml_type in NATIVE_TYPES and (N <= 8 or self._rec is not None):
            self.rx_embed(w=w.ptr, ids=ids.ctypes.data, N=N, out=out.ctypes.data, scale=float(scale))
            return out
        out[...] = w.rows(ids)  # many rows: numpy's dequantizer (threaded, exact)
        if scale != 1.0:
            out *= _F32(scale)
        return out

    # -- element-wise ------------------------------------------------------------
    def _binary(self, code, a, b, out):
        """a + b / a * b with base.py's broadcasting (b has a's shape or is a row)."""
        if (a.dtype == _F32 and b.dtype == _F32 and a.flags.c_contiguous and b.flags.c_contiguous
                and (b.shape == a.shape or (b.ndim == 1 and b.shape[0] == a.shape[-1]))
                and (out is None or (out.shape == a.shape and out.dtype == _F32 and out.flags.c_contiguous))):
            y = self._new(a.shape) if out is None else out
            if a.size:
                self.rx_binary(op=code, a=a.ctypes.data, b=b.ctypes.data, out=y.ctypes.data, n=a.size, nb=b.size)
            return y
        self._eager("element-wise op on other shapes or dtypes")
        f = np.add if code == 0 else np.multiply
        return f(a, b, out=out) if out is not None else f(a, b)

    def _unary(self, code, a, b=None, p=0.0, out=None):
        if (a.dtype == _F32 and a.flags.c_contiguous and (b is None or (
                b.shape == a.shape and b.dtype == _F32 and b.flags.c_contiguous))
                and (out is None or (out.shape == a.shape and out.dtype == _F32 and out.flags.c_contiguous))):
            y = self._new(a.shape) if out is None else out
            if a.size:
                self.rx_unary(op=code, a=a.ctypes.data, b=None if b is None else b.ctypes.data, out=y.ctypes.data,
                              n=a.size, p=float(p))
            return y
        self._eager("element-wise op on other layouts")
        a = np.asarray(a, dtype=_F32)
        if code == 0:
            y = a * _F32(p)
        elif code == 1:
            y = np.tanh(a / _F32(p)) * _F32(p)
        elif code == 6:
            y = _F32(1) / (_F32(1) + np.exp(-a))
        elif code == 7:
            with np.errstate(over="ignore"):
                y = np.where(a > 20, a, np.log1p(np.exp(np.minimum(a, 20)))).astype(_F32)
        else:
            g = a / (_F32(1) + np.exp(-a)) if code in (2, 4) else _F32(0.5) * a * (_F32(1) + np.tanh(
                _F32(_SQRT_2_OVER_PI) * (a + _F32(0.044715) * a * a * a)))
            y = g * b if code in (4, 5) else g
        if out is None:
            return y
        out[...] = y
        return out

    def add(self, a, b, out=None):
        return self._binary(0, a, b, out)

    def mul(self, a, b, out=None):
        return self._binary(1, a, b, out)

    def scale(self, a, s, out=None):
        return self._unary(0, a, p=s, out=out)

    def softcap(self, a, cap, out=None):
        return self._unary(1, a, p=cap, out=out)

    def silu(self, a):
        return self._unary(2, a)

    def gelu(self, a):
        return self._unary(3, a)

    def swiglu(self, g, u):
        return self._unary(4, g, u)

    def geglu(self, g, u):
        return self._unary(5, g, u)

    # -- normalization, rotary -------------------------------------------------------
    def rms_norm(self, x, w, eps):
        x = self._f32(x)
        D = x.shape[-1]
        if w is not None:
            w = self._f32(w)
            if w.shape[-1] != D:
                raise ValueError(f"rms_norm: weight of {w.shape[-1]} for rows of {D}")
        y = self._new(x.shape)
        if x.size:
            self.rx_rms_norm(x=x.ctypes.data, y=y.ctypes.data, w=None if w is None else w.ctypes.data, R=x.size // D,
                             D=D, eps=float(eps))
        return y

    def _rope(self, x, pos, w, eps, norm, n_rot, base, freq_scale, freq_factors, neox, mscale):
        N, H, hd = x.shape
        n_rot = hd if n_rot is None else int(n_rot)
        if n_rot > hd or n_rot % 2 or n_rot > 1024:
            raise ValueError(f"rope: n_rot {n_rot} for heads of {hd}")
        pos = self.positions(pos)
        if len(pos) != N:
            raise ValueError(f"rope: {len(pos)} positions for {N} rows")
        ff = None
        if freq_factors is not None:
            ff = self._f32(freq_factors)
            if ff.size < n_rot // 2:
                raise ValueError(f"rope: {ff.size} frequency factors for {n_rot // 2} pairs")
        if w is not None:
            w = self._f32(w)
        if x.size:
            self.rx_norm_rope(x=x.ctypes.data, N=N, H=H, hd=hd, pos=pos.ctypes.data, n_rot=n_rot, base=float(base),
                              freq_scale=float(freq_scale), ff=None if ff is None else ff.ctypes.data,
                              neox=1 if neox else 0, mscale=float(mscale), norm=1 if norm else 0,
                              w=None if w is None else w.ctypes.data, eps=float(eps))
        return x

    def _inplace_target(self, x):
        """(array to rotate, whether it must be copied back into x)."""
        if x.dtype == _F32 and x.flags.c_contiguous:
            return x, False
        self._eager("rotary on a non-contiguous array")
        return np.array(x, dtype=_F32, order="C"), True

    def rope(self, x, pos, *, n_rot=None, base=10000.0, freq_scale=1.0, freq_factors=None,
             neox=False, mscale=1.0, inplace=False, yarn=None):
        if yarn is not None and yarn[0] != 0.0:  # YaRN: the numpy backend's rotation (deepseek2)
            self._eager("YaRN rotary on the host")
            # a copy: numpy's rotation is memoized per positions array, which a graph rewrites
            return self._numpy().rope(x, np.array(self.positions(pos)), n_rot=n_rot, base=base, freq_scale=freq_scale,
                                      freq_factors=freq_factors, neox=neox, mscale=mscale, inplace=inplace,
                                      yarn=yarn)
        if inplace:
            y, back = self._inplace_target(x)
        else:
            src = self._f32(x)
            y, back = self._new(src.shape), False
            self.copy(src, y)
        self._rope(y, pos, None, 0.0, False, n_rot, base, freq_scale, freq_factors, neox, mscale)
        if back:
            x[...] = y
            return x
        return y

    def rms_norm_rope(self, x, w, eps, pos, *, n_rot=None, base=10000.0, freq_scale=1.0,
                      freq_factors=None, neox=False, mscale=1.0):
        y, back = self._inplace_target(x)
        self._rope(y, pos, w, eps, True, n_rot, base, freq_scale, freq_factors, neox, mscale)
        if back:
            x[...] = y
        return x

    # -- attention ---------------------------------------------------------------
    @staticmethod
    def _kv_f16(kc, vc):
        if kc.dtype != vc.dtype or kc.dtype not in (np.float16, np.float32):
            raise ValueError(f"KV arrays must both be float16 or float32, not {kc.dtype}/{vc.dtype}")
        if not (kc.flags.c_contiguous and vc.flags.c_contiguous) or kc.ndim != 3 or vc.ndim != 3:
            raise ValueError("KV arrays must be contiguous [n_kv_heads, n_slots, head_dim]")
        return 1 if kc.dtype == np.float16 else 0

    def kv_store(self, k_cache, v_cache, k, v, slots):
        """Write k [N, Hkv, hd_k], v [N, Hkv, hd_v] into k_cache [Hkv, n_slots, hd_k] and
        v_cache [Hkv, n_slots, hd_v] at slots[n] (a layer's state arrays)."""
        latent = v_cache is None  # keys only (an MLA latent): values of no width
        f16 = self._kv_f16(k_cache, k_cache if latent else v_cache)
        Hkv, n_slots, hdk = k_cache.shape
        k = self._f32(k)
        if latent:
            v_cache, v, hdv = k_cache, k, 0  # the kernel copies 0 values from a valid pointer
        else:
            v, hdv = self._f32(v), v_cache.shape[2]
        slots = self.positions(slots)
        N = len(slots)
        if k.size != N * Hkv * hdk or (not latent and v.size != N * Hkv * hdv):
            raise ValueError(f"kv_store: k {k.shape} / v {v.shape} for {N} slots of {Hkv} heads")
        if N and self._rec is None and (int(slots.min()) < 0 or int(slots.max()) >= n_slots):
            raise ValueError(f"kv_store: slots outside 0..{n_slots - 1}")
        self.rx_kv_store(kc=k_cache.ctypes.data, vc=v_cache.ctypes.data, k=k.ctypes.data, v=v.ctypes.data,
                         slots=slots.ctypes.data, N=N, Hkv=Hkv, n_slots=n_slots, hdk=hdk, hdv=hdv, f16=f16)

    def attention(self, q, k_cache, v_cache, pos, n_kv, *, scale, softcap=0.0, causal=True, window=0,
                  mask=None, v_dim=None, sinks=None, chunk=0):
        """base.py's attention over k_cache [Hkv, n_slots, hd_k], v_cache [Hkv, n_slots, hd_v]
        (v_cache None: the values are the first v_dim dims of the keys, one KV head)."""
        if v_cache is None:
            if sinks is not None or chunk:
                raise ValueError("attention: sinks and chunks need a v_cache")
            return self._attention_latent(q, k_cache, pos, n_kv, scale, softcap, causal, window, mask, v_dim)
        f16 = self._kv_f16(k_cache, v_cache)
        q = self._f32(q)
        N, Hq, hdk = q.shape
        Hkv, n_slots, _ = k_cache.shape
        hdv = v_cache.shape[2]
        if Hq % Hkv or k_cache.shape[2] != hdk:
            raise ValueError(f"attention: q {q.shape} against a cache of {k_cache.shape}")
        n_kv, pos, m = self._attention_keys(n_kv, n_slots, pos, mask, N)
        if sinks is not None:
            sinks = self._f32(sinks)
            if sinks.shape != (Hq,):
                raise ValueError(f"attention: sinks {sinks.shape} for {Hq} heads")
        out = self._new((N, Hq, hdv))
        self.rx_attention(q=q.ctypes.data, kc=k_cache.ctypes.data, vc=v_cache.ctypes.data, out=out.ctypes.data,
                          pos=pos.ctypes.data, mask=None if m is None else m.ctypes.data, N=N, Hq=Hq, Hkv=Hkv,
                          n_slots=n_slots, hdk=hdk, hdv=hdv, n_kv=n_kv, scale=float(scale), softcap=float(softcap),
                          causal=1 if causal else 0, window=int(window), f16=f16,
                          sinks=None if sinks is None else sinks.ctypes.data, chunk=int(chunk))
        return out

    def pos_scale(self, x, pos, *, floor, scale, offset=1.0):
        """base.py's pos_scale on the host (Llama 4's NoPE layers; its MoE layers run on the host too)."""
        from .base import pos_temperature

        self._eager("attention temperature on the host")
        x = np.asarray(x, _F32)
        return x * pos_temperature(self.positions(pos), floor, scale, offset).reshape((-1,) + (1,) * (x.ndim - 1))

    def _attention_keys(self, n_kv, n_slots, pos, mask, N):
        """attention's key range, positions and mask (float32 [N, n_kv] or None), checked."""
        n_kv = int(n_kv)
        if not 0 <= n_kv <= n_slots:
            raise ValueError(f"attention: n_kv {n_kv} outside 0..{n_slots}")
        pos = self.positions(pos)
        m = None
        if mask is not None:
            m = self._f32(mask)
            if m.shape != (N, n_kv):
                raise ValueError(f"attention: mask {m.shape}, expected {(N, n_kv)}")
        return n_kv, pos, m

    def _attention_latent(self, q, kc, pos, n_kv, scale, softcap, causal, window, mask, v_dim):
        f16 = self._kv_f16(kc, kc)
        q = self._f32(q)
        N, Hq, hdk = q.shape
        n_slots = kc.shape[1]
        v_dim = int(v_dim)
        if kc.shape[0] != 1 or kc.shape[2] != hdk or not 0 < v_dim <= hdk:
            raise ValueError(f"attention: latent q {q.shape} against {kc.shape} with values of {v_dim}")
        n_kv, pos, m = self._attention_keys(n_kv, n_slots, pos, mask, N)
        self._eager("latent attention (not a recorded op)")
        out = self._new((N, Hq, v_dim))
        self.rx_attention_latent(q=q.ctypes.data, kc=kc.ctypes.data, out=out.ctypes.data, pos=pos.ctypes.data,
                                 mask=None if m is None else m.ctypes.data, N=N, Hq=Hq, n_slots=n_slots, hdk=hdk,
                                 hdv=v_dim, n_kv=n_kv, scale=float(scale), softcap=float(softcap),
                                 causal=1 if causal else 0, window=int(window), f16=f16)
        return out

    def _numpy(self):
        """A NumpyOps for the few steps done on the host (YaRN rotary)."""
        if getattr(self, "_np_ops", None) is None:
            from .numpy_ops import NumpyOps

            self._np_ops = NumpyOps(blas_threads=None)
        return self._np_ops

    # -- multi-head latent attention (base.MLA_OPS) ---------------------------------------
    def split(self, x, sizes):
        if sum(sizes) != x.shape[-1]:
            raise ValueError(f"split: sizes {list(sizes)} of {x.shape[-1]} columns")
        out, a = [], 0
        for n in sizes:
            out.append(self.columns(x, a, n))
            a += n
        return out

    def concat(self, xs):
        self._eager("concat on the host")
        return np.concatenate([np.asarray(x, _F32) for x in xs], axis=-1)

    def head_matmul(self, x, w):
        """y[n, h] = w[h] @ x[n, h]: each head's rows of w through the matmul kernels (quantized
        weights read in place)."""
        x = self._f32(x)
        N, H, K = x.shape
        if w.shape[1] != K or w.shape[0] % H:
            raise ValueError(f"head_matmul: x {x.shape} with weight {w.shape}")
        M = w.shape[0] // H
        out = self._new((N, H, M))
        if N != 1:
            self._eager("head_matmul over several rows")
        for h in range(H):
            wh = self.weight_rows(w, h * M, M)
            if N == 1:  # x[0, h] and out[0, h] are contiguous rows
                self.matmul(x[:, h], wh, out=out[:, h])
            else:
                out[:, h] = self.matmul(np.ascontiguousarray(x[:, h]), wh)
        return out

    # -- recurrent layers (base.RECURRENT_OPS) ---------------------------------------------
    def sigmoid(self, a):
        return self._unary(6, a)

    def softplus(self, a):
        return self._unary(7, a)

    def columns(self, x, start, n):
        start, n = int(start), int(n)
        if not (0 <= start and n >= 0 and start + n <= x.shape[-1]):
            raise ValueError(f"columns: {start}..{start + n} of {x.shape[-1]}")
        x = self._f32(x)
        cols = x.shape[-1]
        rows = x.size // cols if cols else 0
        y = self._new(x.shape[:-1] + (n,))
        if y.size:
            self.rx_columns(src=x.ctypes.data, dst=y.ctypes.data, rows=rows, cols=cols, start=start, n=n)
        return y

    def _groups(self, seqs, N, state):
        """The kernels' sequence table (base.seq_group_table) and its group count; the state
        must be contiguous float32 with a sequence for every id."""
        from .base import seq_group_table

        if state.dtype != _F32 or not state.flags.c_contiguous:
            raise ValueError(f"recurrent state must be contiguous float32, not {state.dtype}")
        if seqs is not None and N and self._rec is None:
            ids = np.asarray(seqs).reshape(-1)
            if len(ids) != N or int(ids.min()) < 0 or int(ids.max()) >= state.shape[0]:
                raise ValueError(f"sequence ids {ids.tolist()} for {N} tokens and {state.shape[0]} sequences")
        if self._saved is not None and not any(a is state for a, _ in self._saved):
            self._saved.append((state, state.copy()))  # capturing: put back afterwards (capture)
        tab, G = seq_group_table(seqs, N)
        tab = np.ascontiguousarray(tab, dtype=np.int32)
        if self._consts is not None:  # recording: the table is a constant of the graph
            self._consts.append(tab)
        return tab, G

    def ssm_conv(self, x, state, w, seqs=None):
        x = self._f32(x)
        w = self._f32(w.dense if isinstance(w, CpuWeight) and w.dense is not None else
                      w.rows(np.arange(w.shape[0])) if isinstance(w, CpuWeight) else w)
        N, C = x.shape
        K = w.shape[1]
        if w.shape[0] != C or state.shape[1:] != (K - 1, C) or not 1 <= K <= 64:
            raise ValueError(f"ssm_conv: x {x.shape}, weight {w.shape}, state {state.shape}")
        tab, G = self._groups(seqs, N, state)
        out = self._new((N, C))
        if N and C:
            self.rx_ssm_conv(x=x.ctypes.data, state=state.ctypes.data, w=w.ctypes.data, out=out.ctypes.data,
                             tab=tab.ctypes.data, G=G, N=N, C=C, K=K)
        return out

    def delta_net(self, q, k, v, g, beta, state, seqs=None, scale=1.0):
        q, k, v, g, beta = (self._f32(a) for a in (q, k, v, g, beta))
        N, Hk, D = q.shape
        Hv = v.shape[1]
        if (k.shape != q.shape or v.shape != (N, Hv, D) or g.shape != (N, Hv) or beta.shape != (N, Hv)
                or state.shape[1:] != (Hv, D, D)):
            raise ValueError(f"delta_net: q {q.shape}, k {k.shape}, v {v.shape}, g {g.shape}, beta {beta.shape}, "
                             f"state {state.shape}")
        tab, G = self._groups(seqs, N, state)
        out = self._new((N, Hv, D))
        if N and D:
            self.rx_delta_net(q=q.ctypes.data, k=k.ctypes.data, v=v.ctypes.data, g=g.ctypes.data, beta=beta.ctypes.data,
                              state=state.ctypes.data, out=out.ctypes.data, tab=tab.ctypes.data, G=G, N=N, Hk=Hk,
                              Hv=Hv, D=D, scale=float(scale))
        return out

    def ssm_scan(self, x, dt, A, B, C, state, seqs=None, D=None):
        x, dt, A, B, C = (self._f32(a) for a in (x, dt, A, B, C))
        Dp = None if D is None else self._f32(D)
        N, H, P = x.shape
        Ng, Ns = B.shape[1], B.shape[2]
        if (dt.shape != (N, H) or A.shape != (H,) or B.shape != (N, Ng, Ns) or C.shape != B.shape or not Ng
                or H % Ng or state.shape[1:] != (H, P, Ns) or (Dp is not None and Dp.shape != (H,))):
            raise ValueError(f"ssm_scan: x {x.shape}, dt {dt.shape}, A {A.shape}, B {B.shape}, C {C.shape}, "
                             f"state {state.shape}")
        tab, G = self._groups(seqs, N, state)
        out = self._new((N, H, P))
        if N and P:
            self.rx_ssm_scan(x=x.ctypes.data, dt=dt.ctypes.data, A=A.ctypes.data, B=B.ctypes.data, C=C.ctypes.data,
                             Dp=None if Dp is None else Dp.ctypes.data, state=state.ctypes.data, out=out.ctypes.data,
                             tab=tab.ctypes.data, G=G, N=N, H=H, P=P, Ng=Ng, Ns=Ns)
        return out

    # -- selection ---------------------------------------------------------------
    def argmax(self, logits, out=None):
        if out is None:
            return np.argmax(np.asarray(logits), axis=-1)
        x = self._f32(logits)
        V = x.shape[-1]
        rows = x.size // V if V else 0
        if out.dtype != np.int32 or not out.flags.c_contiguous or out.size != rows:
            raise ValueError(f"argmax: out must be int32 with one entry per row ({rows})")
        if rows:
            self.rx_argmax(x=x.ctypes.data, rows=rows, V=V, out=out.ctypes.data)
        return out

    def topk(self, logits, k, n=None):
        return host_topk(logits, k, n)

    def logprobs(self, logits, rows, targets, n=None):
        return host_logprobs(logits, rows, targets, n)

    # -- graphs ------------------------------------------------------------------
    def record(self, fn):
        """Run fn() (ops on this backend) and record the C calls it makes: (Graph, fn's result),
        or (None, result) when a step ran in numpy instead (the result is right, but the step
        cannot be replayed)."""
        if self._rec is not None:
            raise RuntimeError("record: already recording")
        self._rec, self._keep, self._consts, self._rec_bad = [], [], [], None
        try:
            result = fn()
            rec, keep, bad = self._rec, self._keep + self._consts, self._rec_bad
        finally:
            self._rec = self._keep = self._consts = self._rec_bad = None
        if bad is not None:
            return None, result
        return Graph(self._lib, rec, keep), result

    # capture(fn, run=True) keeps the recorded run's effect (runtime/graphs.capture_step)
    capture_runs = True

    def capture(self, fn, run=False):
        """base.py's capture: (graph, fn's result); graph.launch() reruns fn's C calls on the same
        arrays (the runtime writes new inputs into them first), in one call. When fn did
        something in numpy that a replay would miss (a mixture of experts' routing, say), the
        graph runs fn again at each launch and copies its result into the first one's array.
        As on CUDA, where a capture runs nothing, the step takes effect at launch: capturing
        runs fn, so the recurrent state it updated in place is put back afterwards (the KV
        store it made is rewritten with the same values by the launch). run=True: the step
        has taken effect when capture returns (the recorded run is the step: nothing is put
        back, and the caller does not launch the graph for this step)."""
        self._saved = None if run else []
        try:
            graph, result = self.record(fn)
            for a, before in self._saved or ():
                np.copyto(a, before)
        finally:
            self._saved = None
        if graph is None:
            graph = EagerGraph(fn, result, self._last_bad)
        return graph, result


class EagerGraph:
    """capture's fallback for steps that cannot be recorded: launch() runs the step again and
    copies its result into the array the capture returned."""

    def __init__(self, fn, result, why):
        self.fn, self.result, self.why = fn, result, why

    def launch(self):
        np.copyto(self.result, self.fn())

    replay = launch

    def close(self):
        self.fn = self.result = None


class Graph:
    """A recorded op sequence: one C call (rx_run) replays it."""

    def __init__(self, lib, rec, keep):
        import struct

        cmds = np.zeros((max(1, len(rec)), CMD_WIDTH), np.int64)
        for i, (code, args) in enumerate(rec):
            cmds[i, 0] = code
            floats = FLOAT_ARGS[code]  # float and double arguments: the bits of a double
            for j, a in enumerate(args, 1):
                if j in floats:
                    cmds[i, j] = struct.unpack("<q", struct.pack("<d", a))[0]
                elif a is not None:
                    cmds[i, j] = a
        # the replay: one call of rx_run (cmds, n, stride) straight through ctypes
        self.cmds, self.n, self.keep, self._run = cmds, len(rec), keep, lib.rx_run

    def launch(self):
        rc = self._run(self.cmds.ctypes.data, self.n, CMD_WIDTH)
        if rc:
            raise ValueError(f"graph replay failed ({rc}): a token id out of range?")

    replay = launch

    def close(self):
        self.cmds = self.keep = None
        self.n = 0
