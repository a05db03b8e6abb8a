"""Dequantization of GGML tensor data to float32, with numpy.

`dequantize(raw, ggml_type, n_elements)` turns a tensor's raw bytes into a flat
float32 array; `dequantize_tensor(f, name)` does it for a tensor of an open
GGUFFile and shapes the result in numpy order (the GGUF shape reversed).

The results are bit-for-bit those of the reference dequantizers (ggml's C
code, and `gguf.quants`, which tests/test_quants.py compares against): each
value is computed with the same float32 operations in the same order, e.g.
Q4_1 is `d * q + m` and Q4_K is `(d * sc) * q - dmin * m`, never a fused or
reordered form.

Speed: the blocks are processed in chunks small enough for the temporaries
to stay in cache, and large tensors are split across threads (numpy releases
the GIL inside its loops).
"""

from __future__ import annotations

import os

import numpy as np

from .errors import ReflexError
from .ggml_types import BY_ID, type_name

_CHUNK_ELEMENTS = 1 << 18  # per chunk: 1 MiB of float32 output, so temporaries stay in cache
_THREAD_MIN_ELEMENTS = 1 << 21  # a thread gets at least this much work
_F16 = np.dtype("<f2")
_IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                       dtype=np.float32)


def _f16(b, start):
    """The little-endian float16 at byte `start` of each block, as float32 (n, 1)."""
    return b[:, start:start + 2].view(_F16).astype(np.float32)


_LOW_NIBBLES = np.uint64(0x0F0F0F0F0F0F0F0F)


def _split_nibbles(qs):
    """(n, ..., k) bytes -> (n, ..., 2k) uint8: the k low nibbles, then the k high nibbles.

    Works on 8 bytes at a time, one column of 64-bit words per numpy call:
    numpy's per-row overhead would dominate on rows of 16 or 32 bytes.
    """
    n, *mid, k = qs.shape
    q = np.empty((n, *mid, 2, k), np.uint8)
    w = qs.view("<u8")
    q64 = q.view("<u8")
    for idx in np.ndindex(*mid, k // 8):
        *g, j = idx
        src = w[(slice(None), *g, j)]
        np.bitwise_and(src, _LOW_NIBBLES, out=q64[(slice(None), *g, 0, j)])
        hi = q64[(slice(None), *g, 1, j)]
        np.right_shift(src, 4, out=hi)
        hi &= _LOW_NIBBLES
    return q.reshape(n, *mid, 2 * k)


def _bits(b, start, nbytes):
    """The nbytes at `start` of each block as little-endian bits, (n, 8 * nbytes) of 0/1."""
    return np.unpackbits(b[:, start:start + nbytes], axis=1, bitorder="little")


# Each kernel fills out (n, block_size) float32 from b (n, type_size) uint8.

def _q4_0(b, out):
    q = _split_nibbles(b[:, 2:]).view(np.int8)
    q -= 8
    np.multiply(_f16(b, 0), q, out=out)


def _q4_1(b, out):
    q = _split_nibbles(b[:, 4:])
    np.multiply(_f16(b, 0), q, out=out)
    out += _f16(b, 2)


def _q5_q(b, qs_at, qh_at):
    q = _split_nibbles(b[:, qs_at:])
    q |= _bits(b, qh_at, 4) << 4
    return q


def _q5_0(b, out):
    q = _q5_q(b, 6, 2).view(np.int8)
    q -= 16
    np.multiply(_f16(b, 0), q, out=out)


def _q5_1(b, out):
    q = _q5_q(b, 8, 4)
    np.multiply(_f16(b, 0), q, out=out)
    out += _f16(b, 2)


def _q8_0(b, out):
    np.multiply(b[:, 2:].view(np.int8), _f16(b, 0), out=out)


def _q2_k(b, out):
    n = len(b)
    sc = b[:, :16]
    dl = (_f16(b, 80) * (sc & 15)).reshape(n, 16, 1)
    ml = (_f16(b, 82) * (sc >> 4)).reshape(n, 16, 1)
    qs = b[:, 16:80].reshape(n, 2, 1, 32)
    q = np.empty((n, 2, 4, 32), np.uint8)
    for s in range(4):
        np.bitwise_and(qs[:, :, 0] >> (2 * s), 3, out=q[:, :, s])
    o = out.reshape(n, 16, 16)
    np.multiply(dl, q.reshape(n, 16, 16), out=o)
    o -= ml


def _q3_k(b, out):
    n = len(b)
    scb = b[:, 96:108]
    low = _split_nibbles(scb[:, :8])
    high = np.empty((n, 4, 4), np.uint8)
    for s in range(4):
        np.bitwise_and(scb[:, 8:] >> (2 * s), 3, out=high[:, s])
    sc = (low.reshape(n, 16) | (high.reshape(n, 16) << 4)).view(np.int8)
    sc -= 32
    dl = (_f16(b, 108) * sc.astype(np.float32)).reshape(n, 16, 1)
    qs = b[:, 32:96].reshape(n, 2, 32)
    q = np.empty((n, 2, 4, 32), np.uint8)
    for s in range(4):
        np.bitwise_and(qs >> (2 * s), 3, out=q[:, :, s])
    # a clear hmask bit subtracts 4
    hbits = _bits(b, 0, 32).reshape(n, 32, 8).transpose(0, 2, 1).reshape(n, 2, 4, 32)
    qi = q.view(np.int8)
    qi -= (hbits ^ 1).view(np.int8) << 2
    np.multiply(dl, qi.reshape(n, 16, 16), out=out.reshape(n, 16, 16))


def _k_scales(b, at):
    """Q4_K/Q5_K 6-bit scales and mins from the 12 bytes at `at`: two (n, 8) uint8."""
    s = b[:, at:at + 12]
    d, m, md = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([d & 63, (md & 15) | ((d >> 2) & 48)], axis=1)
    mn = np.concatenate([m & 63, (md >> 4) | ((m >> 2) & 48)], axis=1)
    return sc, mn


def _q4_k_like(b, out, q):
    n = len(b)
    sc, mn = _k_scales(b, 4)
    d = (_f16(b, 0) * sc.astype(np.float32)).reshape(n, 8, 1)
    dm = (_f16(b, 2) * mn.astype(np.float32)).reshape(n, 8, 1)
    o = out.reshape(n, 8, 32)
    np.multiply(d, q, out=o)
    o -= dm


def _q4_k(b, out):
    n = len(b)
    q = _split_nibbles(b[:, 16:].reshape(n, 4, 32)).reshape(n, 8, 32)
    _q4_k_like(b, out, q)


def _q5_k(b, out):
    n = len(b)
    q = _split_nibbles(b[:, 48:].reshape(n, 4, 32)).reshape(n, 8, 32)
    q |= _bits(b, 16, 32).reshape(n, 32, 8).transpose(0, 2, 1) << 4
    _q4_k_like(b, out, q)


def _q6_k(b, out):
    n = len(b)
    d = (_f16(b, 208) * b[:, 192:208].view(np.int8).astype(np.float32)).reshape(n, 16, 1)
    q = _split_nibbles(b[:, :128].reshape(n, 2, 64)).reshape(n, 2, 4, 32)
    qh = b[:, 128:192].reshape(n, 2, 32)
    for s in range(4):
        q[:, :, s] |= ((qh >> (2 * s)) & 3) << 4
    qi = q.view(np.int8)
    qi -= 32
    np.multiply(d, qi.reshape(n, 16, 16), out=out.reshape(n, 16, 16))


def _q8_k(b, out):
    d = np.ascontiguousarray(b[:, :4]).view("<f4")
    np.multiply(d, b[:, 4:260].view(np.int8), out=out)


def _iq4_nl(b, out):
    q = _split_nibbles(b[:, 2:])
    np.multiply(_f16(b, 0), _IQ4_VALUES[q], out=out)


def _iq4_xs(b, out):
    n = len(b)
    low = np.empty((n, 4, 2), np.uint8)
    np.bitwise_and(b[:, 4:8], 15, out=low[:, :, 0])
    np.right_shift(b[:, 4:8], 4, out=low[:, :, 1])
    sh = np.ascontiguousarray(b[:, 2:4]).view("<u2")
    high = (sh >> np.arange(0, 16, 2, dtype=np.uint16)) & 3
    sc = (low.reshape(n, 8) | high.astype(np.uint8) << 4).view(np.int8)
    sc -= 32
    dl = (_f16(b, 0) * sc.astype(np.float32)).reshape(n, 8, 1)
    q = _split_nibbles(b[:, 8:].reshape(n, 8, 16)).reshape(n, 8, 32)
    np.multiply(dl, _IQ4_VALUES[q], out=out.reshape(n, 8, 32))


_KERNELS = {
    2: _q4_0, 3: _q4_1, 6: _q5_0, 7: _q5_1, 8: _q8_0,
    10: _q2_k, 11: _q3_k, 12: _q4_k, 13: _q5_k, 14: _q6_k, 15: _q8_k,
    20: _iq4_nl, 23: _iq4_xs,
}
SUPPORTED = frozenset(_KERNELS) | {0, 1, 30}


def _f16_kernel(b, out):
    np.copyto(out, b.view(_F16), casting="same_kind")


def _bf16_kernel(b, out):
    np.left_shift(b.view("<u2"), 16, out=out.view(np.uint32), dtype=np.uint32)


def _run(kernel, blocks, out):
    """Apply kernel over the blocks in cache-sized chunks, on several threads when large."""
    n, blk = out.shape
    chunk = max(1, _CHUNK_ELEMENTS // blk)

    def work(lo, hi):
        # corrupt scales (inf, nan) give inf/nan values, as in ggml: no warnings
        with np.errstate(all="ignore"):
            for a in range(lo, hi, chunk):
                z = min(a + chunk, hi)
                kernel(blocks[a:z], out[a:z])

    n_threads = max(1, min(_cpu_count(), n * blk // _THREAD_MIN_ELEMENTS))
    if n_threads <= 1:
        work(0, n)
        return
    import threading

    bounds = [n * i // n_threads for i in range(n_threads + 1)]
    errors = []

    def guarded(lo, hi):
        try:
            work(lo, hi)
        except BaseException as e:  # re-raised in the caller's thread
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(bounds[i], bounds[i + 1]))
               for i in range(1, n_threads)]
    for t in threads:
        t.start()
    guarded(bounds[0], bounds[1])
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def dequantize(raw: np.ndarray, ggml_type: int, n_elements: int) -> np.ndarray:
    """Raw tensor bytes (uint8) -> flat float32 array of n_elements.

    F32 data comes back as a view of `raw` (read-only when raw is); every other
    type as a new array. Raises ReflexError("gguf_error") for a type this module
    cannot dequantize or a byte count that does not match.
    """
    entry = BY_ID.get(ggml_type)
    if entry is None or ggml_type not in SUPPORTED:
        raise ReflexError("gguf_error", f"cannot dequantize tensor type {type_name(ggml_type)}"
                          f" (id {ggml_type})")
    name, blk, bsize = entry
    if n_elements < 0 or n_elements % blk:
        raise ReflexError("gguf_error", f"{name}: {n_elements} elements is not a whole number "
                          f"of {blk}-element blocks")
    n_blocks = n_elements // blk
    raw = np.asarray(raw)
    if raw.dtype != np.uint8 or raw.ndim != 1:
        raw = raw.reshape(-1).view(np.uint8)
    if raw.size != n_blocks * bsize:
        raise ReflexError("gguf_error", f"{name}: {n_elements} elements need {n_blocks * bsize} "
                          f"bytes, got {raw.size}")
    if ggml_type == 0:
        return raw.view("<f4")
    out = np.empty((n_blocks, blk), np.float32)
    if ggml_type == 1:
        _run(_f16_kernel, raw.reshape(-1, 2), out.reshape(-1, 1))
    elif ggml_type == 30:
        _run(_bf16_kernel, raw.reshape(-1, 2), out.reshape(-1, 1))
    else:
        _run(_KERNELS[ggml_type], raw.reshape(n_blocks, bsize), out)
    return out.reshape(-1)


def dequantize_tensor(f, name: str) -> np.ndarray:
    """A GGUFFile tensor as float32, shaped in numpy order (the GGUF shape reversed)."""
    t = f.tensors[name]
    arr = dequantize(f.tensor_data(t), t.ggml_type, t.n_elements)
    return arr.reshape(tuple(reversed(t.shape)) if t.shape else ())
