"""Dequantization of GGML tensor data to float32, with numpy.

`dequantize(raw, ggml_type, n_elements)` turns a tensor's raw bytes into a flat
float32 array; `dequantize_tensor(f, name)` does it for a tensor of an open
GGUFFile and shapes the result in numpy order (the GGUF shape reversed).

The results are bit-for-bit those of the reference dequantizers (ggml's C
code, and `gguf.quants`, which tests/test_quants.py compares against): each
value is computed with the same float32 operations in the same order, e.g.
Q4_1 is `d * q + m` and Q4_K is `(d * sc) * q - dmin * m`, never a fused or
reordered form. Formats: F32, F16, BF16, Q4_0..Q8_0, Q2_K..Q8_K, the IQ grid formats
(IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S; ggml's grids and sign tables from
quant_tables.py, imported at the first such tensor), IQ4_NL, IQ4_XS, TQ1_0, TQ2_0, MXFP4.

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


# -- the grid formats (IQ1/IQ2/IQ3), ternary TQ1_0/TQ2_0 and MXFP4 -------------------------
# Their tables (ggml's grids, sign patterns and value lists: reflex_ipc/quant_tables.py) are
# read at the first such tensor, never on the load path of other models.
_TABLES = None


def _tables():
    """The lookup tables as numpy arrays (built once)."""
    global _TABLES
    if _TABLES is None:
        from . import quant_tables as qt

        ks = np.frombuffer(qt.KSIGNS_IQ2XS, np.uint8)
        bits = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little")
        sign_of_bits = np.where(bits == 1, np.float32(-1), np.float32(1))  # [256, 8]: a byte's sign bits
        pow3 = np.array([1, 3, 9, 27, 81], np.uint16)
        digits = ((np.arange(256, dtype=np.uint16)[:, None] * pow3) & 255) * 3 >> 8  # [256, 5]
        _TABLES = {
            "ksigns": sign_of_bits[ks],  # [128, 8]: the 7-bit sign index -> 8 signs
            "signbits": sign_of_bits,
            "iq2xxs": np.frombuffer(qt.IQ2XXS_GRID, np.uint8).reshape(-1, 8).astype(np.float32),
            "iq2xs": np.frombuffer(qt.IQ2XS_GRID, np.uint8).reshape(-1, 8).astype(np.float32),
            "iq2s": np.frombuffer(qt.IQ2S_GRID, np.uint8).reshape(-1, 8).astype(np.float32),
            "iq3xxs": np.frombuffer(qt.IQ3XXS_GRID, np.uint8).reshape(-1, 4).astype(np.float32),
            "iq3s": np.frombuffer(qt.IQ3S_GRID, np.uint8).reshape(-1, 4).astype(np.float32),
            "iq1s": np.frombuffer(qt.IQ1S_GRID, np.int8).reshape(-1, 8).astype(np.float32),
            "mxfp4": np.frombuffer(qt.KVALUES_MXFP4, np.int8).astype(np.float32),
            "tq1": (digits.astype(np.int8) - 1).astype(np.float32),  # [256, 5]: a byte's base-3 digits - 1
        }
    return _TABLES


def _u32(b, start, nbytes):
    return np.ascontiguousarray(b[:, start:start + nbytes]).view("<u4")


def _u16(b, start, nbytes):
    return np.ascontiguousarray(b[:, start:start + nbytes]).view("<u2")


_HALF, _QUARTER = np.float32(0.5), np.float32(0.25)
_IQ1_DELTA = np.float32(0.125)


def _signed_by_index(grid, idx, signs):
    """grid rows idx (..., g) times the 8 signs of each 7-bit index signs (...)."""
    return grid[idx] * _tables()["ksigns"][signs]


def _iq2_xxs(b, out):
    # d, then 8 x (4 grid bytes, a word: 4 x 7 sign bits and a 4-bit scale), 32 values each
    n, t = len(b), _tables()
    aux = _u32(b, 2, 64).reshape(n, 8, 2)[:, :, 1]
    db = _f16(b, 0) * (_HALF + (aux >> 28).astype(np.float32)) * _QUARTER
    idx = b[:, 2:].reshape(n, 8, 8)[:, :, :4]
    sidx = (aux[:, :, None] >> np.array([0, 7, 14, 21], np.uint32)) & 127
    vals = t["iq2xxs"][idx] * t["ksigns"][sidx]  # (n, 8, 4, 8)
    np.multiply(db.reshape(n, 8, 1, 1), vals, out=out.reshape(n, 8, 4, 8))


def _iq2_s_scales(b, at):
    """IQ2_XS / IQ2_S: 16 scales (one per 16 values) from the 8 bytes at `at`: d * (0.5 + s) / 4."""
    n = len(b)
    sc = np.empty((n, 8, 2), np.uint8)
    np.bitwise_and(b[:, at:at + 8], 15, out=sc[:, :, 0])
    np.right_shift(b[:, at:at + 8], 4, out=sc[:, :, 1])
    return _f16(b, 0) * (_HALF + sc.reshape(n, 16).astype(np.float32)) * _QUARTER


def _iq2_xs(b, out):
    # d, 32 x u16 (9-bit grid index, 7-bit sign index), 8 bytes of two 4-bit scales
    n, t = len(b), _tables()
    q = _u16(b, 2, 64)
    vals = t["iq2xs"][q & 511] * t["ksigns"][q >> 9]  # (n, 32, 8)
    np.multiply(_iq2_s_scales(b, 66).reshape(n, 16, 1), vals.reshape(n, 16, 16), out=out.reshape(n, 16, 16))


def _iq2_s(b, out):
    # d, qs[32] (low 8 bits of the grid index), signs[32] (a byte per 8 values), qh[8]
    # (2 high bits of each of its 4 indices), scales[8]
    n, t = len(b), _tables()
    hi = (b[:, 66:74, None] >> np.array([0, 2, 4, 6], np.uint8)) & 3
    idx = b[:, 2:34].astype(np.uint16) | (hi.reshape(n, 32).astype(np.uint16) << 8)
    vals = t["iq2s"][idx] * t["signbits"][b[:, 34:66]]  # (n, 32, 8)
    np.multiply(_iq2_s_scales(b, 74).reshape(n, 16, 1), vals.reshape(n, 16, 16), out=out.reshape(n, 16, 16))


def _iq3_xxs(b, out):
    # d, qs[64] (a 4-value grid index each), 8 words: 4 x 7 sign bits and a 4-bit scale
    n, t = len(b), _tables()
    aux = _u32(b, 66, 32)
    db = _f16(b, 0) * (_HALF + (aux >> 28).astype(np.float32)) * _HALF
    sidx = (aux[:, :, None] >> np.array([0, 7, 14, 21], np.uint32)) & 127
    vals = t["iq3xxs"][b[:, 2:66]].reshape(n, 8, 4, 8) * t["ksigns"][sidx]
    np.multiply(db.reshape(n, 8, 1, 1), vals, out=out.reshape(n, 8, 4, 8))


def _iq3_s(b, out):
    # d, qs[64] (low 8 bits of 4-value grid indices), qh[8] (their 9th bits), signs[32],
    # scales[4] (two 4-bit scales, one per 32 values: d * (1 + 2 s))
    n, t = len(b), _tables()
    idx = b[:, 2:66].astype(np.uint16) | (_bits(b, 66, 8).astype(np.uint16) << 8)
    sc = np.empty((n, 4, 2), np.uint8)
    np.bitwise_and(b[:, 106:110], 15, out=sc[:, :, 0])
    np.right_shift(b[:, 106:110], 4, out=sc[:, :, 1])
    db = _f16(b, 0) * (sc.reshape(n, 8) * np.uint8(2) + np.uint8(1))
    vals = t["iq3s"][idx].reshape(n, 8, 32) * t["signbits"][b[:, 74:106]].reshape(n, 8, 32)
    np.multiply(db.reshape(n, 8, 1), vals, out=out.reshape(n, 8, 32))


def _iq1_s(b, out):
    # d, qs[32] (low 8 bits of 11-bit grid indices), qh[8] u16: 4 x 3 high index bits, a
    # 3-bit scale (d * (2 s + 1)) and the delta's sign, per 32 values
    n, t = len(b), _tables()
    qh = _u16(b, 34, 16)
    dl = _f16(b, 0) * (((qh >> 12) & 7) * np.uint16(2) + np.uint16(1))
    delta = np.where(qh & 0x8000, -_IQ1_DELTA, _IQ1_DELTA)
    hi = (qh[:, :, None] >> np.array([0, 3, 6, 9], np.uint16)) & 7
    idx = b[:, 2:34].astype(np.uint16) | (hi.reshape(n, 32) << 8)
    vals = t["iq1s"][idx].reshape(n, 8, 4, 8) + delta.reshape(n, 8, 1, 1)
    np.multiply(dl.reshape(n, 8, 1, 1), vals, out=out.reshape(n, 8, 4, 8))


def _iq1_m(b, out):
    # qs[32], qh[16] (per 8 values: 3 high index bits and the delta's sign), 4 u16 of scales:
    # 3-bit scales per 16 values in bits 0..11, the float16 d in their top nibbles
    n, t = len(b), _tables()
    sc = _u16(b, 48, 8)
    dbits = ((sc[:, 0] >> 12) | ((sc[:, 1] >> 8) & 0x00F0) | ((sc[:, 2] >> 4) & 0x0F00)
             | (sc[:, 3] & 0xF000)).astype("<u2")
    d = dbits.view(_F16).astype(np.float32).reshape(n, 1)
    s = (sc[:, :, None] >> np.array([0, 3, 6, 9], np.uint16)) & 7
    dl = d * (s.reshape(n, 16) * np.uint16(2) + np.uint16(1))
    nib = np.empty((n, 16, 2), np.uint8)
    np.bitwise_and(b[:, 32:48], 15, out=nib[:, :, 0])
    np.right_shift(b[:, 32:48], 4, out=nib[:, :, 1])
    idx = b[:, :32].astype(np.uint16) | ((nib.reshape(n, 32) & 7).astype(np.uint16) << 8)
    delta = np.where(nib & 8, -_IQ1_DELTA, _IQ1_DELTA).reshape(n, 16, 2, 1)
    vals = t["iq1s"][idx].reshape(n, 16, 2, 8) + delta
    np.multiply(dl.reshape(n, 16, 1, 1), vals, out=out.reshape(n, 16, 2, 8))


def _tq1_0(b, out):
    # qs[48]: 5 base-3 digits a byte (bytes 0..31: values 32 p + m, bytes 32..47: 160 + 16 p + m),
    # qh[4]: 4 digits a byte (240 + 4 p + j); value d * (digit - 1)
    n, t = len(b), _tables()
    dig = t["tq1"]
    d = _f16(b, 52)
    o = out
    np.multiply(d.reshape(n, 1, 1), dig[b[:, :32]].transpose(0, 2, 1), out=o[:, :160].reshape(n, 5, 32))
    np.multiply(d.reshape(n, 1, 1), dig[b[:, 32:48]].transpose(0, 2, 1), out=o[:, 160:240].reshape(n, 5, 16))
    np.multiply(d.reshape(n, 1, 1), dig[b[:, 48:52], :4].transpose(0, 2, 1), out=o[:, 240:].reshape(n, 4, 4))


def _tq2_0(b, out):
    # qs[64]: 2 bits a value (value 128 c + 32 l + m in bits 2l of byte 32 c + m), d: d * (q - 1)
    n = len(b)
    q = (b[:, :64].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3
    qi = q.view(np.int8)
    qi -= 1
    np.multiply(_f16(b, 64).reshape(n, 1, 1, 1), qi, out=out.reshape(n, 2, 4, 32))


def _mxfp4(b, out):
    # e (E8M0: 2^(e - 127), taken at half as ggml does, the E2M1 values being doubled), qs[16]
    e = b[:, :1].astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << 23).astype(np.uint32)
    np.multiply(bits.view(np.float32), _tables()["mxfp4"][_split_nibbles(b[:, 1:])], out=out)


_KERNELS = {
    2: _q4_0, 3: _q4_1, 6: _q5_0, 7: _q5_1, 8: _q8_0,
    10: _q2_k, 11: _q3_k, 12: _q4_k, 13: _q5_k, 14: _q6_k, 15: _q8_k,
    16: _iq2_xxs, 17: _iq2_xs, 18: _iq3_xxs, 19: _iq1_s, 20: _iq4_nl, 21: _iq3_s, 22: _iq2_s,
    23: _iq4_xs, 29: _iq1_m, 34: _tq1_0, 35: _tq2_0, 39: _mxfp4,
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
