"""A numpy model of kernels/mma.cuh's indexing (no GPU here): which W rows / chunks and
which x rows / columns each thread of a block loads into shared memory, which shared
halves each lane passes to mma.sync.m16n8k16 as its A and B registers, and where each
lane's accumulators are stored. The warp-wide MMA is modelled from the PTX ISA's fragment
layout of m16n8k16 (f16 A/B, f32 C/D): the emulated kernel must equal x @ W.T on shapes
with ragged edges in M, N and K, for the plain, accumulate and gated-unit variants."""

import os

import numpy as np
import pytest

from reflex_ipc.testing.mma_fragments import G, T, a_coords, b_coords, c_coords
from reflex_ipc.testing.mma_model import ROOT, BM, BN, C, PAD, WARPS, WN, act, emulate, splits


# -- the PTX fragment layout of mma.m16n8k16 (reflex_ipc/testing/mma_fragments.py) ----------
def test_fragment_layouts_cover_tiles():
    a = np.zeros((16, 16), int)
    for i in range(8):
        r, c = a_coords(i)
        np.add.at(a, (r, c), 1)
    b = np.zeros((16, 8), int)
    for i in range(4):
        r, c = b_coords(i)
        np.add.at(b, (r, c), 1)
    c_ = np.zeros((16, 8), int)
    for i in range(4):
        r, c = c_coords(i)
        np.add.at(c_, (r, c), 1)
    assert (a == 1).all() and (b == 1).all() and (c_ == 1).all()


@pytest.mark.parametrize("M,N,K,S", [(70, 20, 136, 1), (64, 64, 64, 1), (129, 65, 40, 1), (70, 20, 328, 3),
                                     (70, 9, 328, 6), (129, 65, 200, 4)])
def test_emulated_mma_matches_matmul(M, N, K, S):
    rng = np.random.default_rng(M * 1000 + N + K)
    W = rng.standard_normal((M, K))
    X = rng.standard_normal((N, K))
    Y = emulate([W], X, np.full((N, M), np.nan), 0, S)
    np.testing.assert_allclose(Y, X @ W.T, rtol=1e-10, atol=1e-10)
    # accumulate: Y += x W^T over an existing output
    Y0 = rng.standard_normal((N, M))
    Y = emulate([W], X, Y0.copy(), 1, S)
    np.testing.assert_allclose(Y, Y0 + X @ W.T, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("S", [1, 2, 4])
def test_emulated_mma_glu(S):
    rng = np.random.default_rng(7)
    M, N, K = 70, 19, 104
    Wg, Wu = rng.standard_normal((M, K)), rng.standard_normal((M, K))
    X = rng.standard_normal((N, K))
    g, u = X @ Wg.T, X @ Wu.T
    for mode in (0, 1):
        Y = emulate([Wg, Wu], X, np.full((N, M), np.nan), mode, S)
        np.testing.assert_allclose(Y, act(g, mode) * u, rtol=1e-10, atol=1e-10)


def test_split_counts_leave_no_split_empty():
    """Every block of a split grid gets at least one slice, and the slices are covered once."""
    for nk in range(1, 60):
        for s0 in range(1, nk + 1):
            S = splits(nk, s0)
            per = -(-nk // S)
            sizes = [max(0, min(nk - z * per, per)) for z in range(S)]
            assert 1 <= S <= s0 and min(sizes) >= 1 and sum(sizes) == nk


@pytest.mark.parametrize("bk", ["MMA_BK", "MMA_BK_GLU"])
def test_shared_fragment_loads_are_bank_conflict_free(bk):
    """Each 32-bit fragment load of a warp touches 32 distinct banks (row stride LD halves),
    and every tile starts 16-byte aligned (the uint4 stores)."""
    BK = C[bk]
    LD = BK + PAD
    assert (LD * 2) % 16 == 0 and (BM * LD * 2) % 16 == 0
    for kk in range(0, BK, 16):
        for base in (0, 8, 16, 24):
            words = ((base + G) * LD + kk + 2 * T) // 2
            assert len(set((words % 32).tolist())) == 32


def test_shared_memory_fits_the_static_limit():
    for NW, bk in ((1, "MMA_BK"), (2, "MMA_BK_GLU")):
        assert 2 * (NW + 1) * BM * (C[bk] + PAD) * 2 <= 48 * 1024


def test_warps_cover_the_block_tile():
    """The 8 warps' 32 x 16 tiles (2 along the rows x 4 along the tokens) cover the
    MMA_BM x MMA_BN output tile once."""
    cover = np.zeros((BM, BN), int)
    for cw in range(WARPS):
        wr, wn = (cw & 1) * 32, (cw >> 1) * WN
        for mt in range(2):
            for nt in range(2):
                for i in range(4):
                    np.add.at(cover, (wr + mt * 16 + G + (i >> 1) * 8, wn + nt * 8 + 2 * T + (i & 1)), 1)
    assert (cover == 1).all()


# -- DeqWide (the grouped MoE GEMMs' MOE_WIDE): the words it loads, transcribed ------------
def _u32(mem, a, limit):
    """A 32-bit little-endian load at byte a (4-byte aligned), inside [0, limit)."""
    assert a % 4 == 0 and 0 <= a and a + 4 <= limit
    return int.from_bytes(bytes(mem[a:a + 4]), "little")


def _ld8_w2(mem, p, lo, hi):
    """ld8_w2: bytes p..p+7 from the aligned 8-byte words at p & ~7 and 8 after it, each load
    inside [lo, hi) (the tensor); the funnel shifts (__funnelshift_r: (hi:lo) >> s, low word)."""
    assert p % 2 == 0
    a = p & ~7
    u = [_u32(mem, a + 4 * i, hi) for i in range(4)]
    assert a >= lo
    s = p & 7
    x0, x1, x2 = (u[1], u[2], u[3]) if s & 4 else (u[0], u[1], u[2])
    fs = lambda l, h, n: (((h << 32) | l) >> n) & 0xFFFFFFFF  # noqa: E731
    return fs(x0, x1, 8 * (s & 3)), fs(x1, x2, 8 * (s & 3))


def _bytes8(words):
    return [(words[i >> 2] >> (8 * (i & 3))) & 0xFF for i in range(8)]


def _f16(v):
    return float(np.array([v & 0xFFFF], np.uint16).view(np.float16)[0])


def _kscale(s, j):
    if j < 4:
        return s[j] & 63, s[j + 4] & 63
    return (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4)


def deq8_bytes(t, blk, c):
    """quants.cuh's deq8<T> for Q4_K / Q5_K / Q6_K: (scale, min, integer values) of chunk c."""
    e0 = 8 * c
    if t in ("Q4_K", "Q5_K"):
        sub, p, l = e0 >> 5, e0 >> 6, e0 & 31
        sc, mn = _kscale(blk[4:16], sub)
        q = blk[(16 if t == "Q4_K" else 48) + 32 * p + l:][:8]
        v = [(int(b) >> ((sub & 1) * 4)) & 0xF for b in q]
        if t == "Q5_K":
            v = [x | (((int(h) >> sub) & 1) << 4) for x, h in zip(v, blk[16 + l:24 + l])]
        d16 = int(blk[0]) | int(blk[1]) << 8
        m16 = int(blk[2]) | int(blk[3]) << 8
        return _f16(d16) * sc, _f16(m16) * mn, v
    n, g, l = e0 >> 7, (e0 >> 5) & 3, e0 & 31
    d = _f16(int(blk[208]) | int(blk[209]) << 8) * float(np.int8(blk[192 + 8 * n + 2 * g + (l >> 4)]))
    q, h = blk[64 * n + 32 * (g & 1) + l:][:8], blk[128 + 32 * n + l:][:8]
    return d, 0.0, [(((int(a) >> ((g >> 1) * 4)) & 0xF) | (((int(b) >> (2 * g)) & 3) << 4)) - 32 for a, b in zip(q, h)]


def deq_wide_bytes(t, mem, b, c, limit):
    """mma.cuh's DeqWide<T>::deq at block offset b of the tensor mem [0, limit): the same."""
    e0 = 8 * c
    if t in ("Q4_K", "Q5_K"):
        sub, p, l = e0 >> 5, e0 >> 6, e0 & 31
        assert b % 16 == 0  # the uint4 header load
        h = [_u32(mem, b + 4 * i, limit) for i in range(4)]
        s = [(h[1 + (j >> 2)] >> (8 * (j & 3))) & 0xFF for j in range(12)]  # hbyte
        sc, mn = _kscale(s, sub)
        qa = b + (16 if t == "Q4_K" else 48) + 32 * p + l
        assert qa % 8 == 0  # the uint2 loads
        v = [(x >> ((sub & 1) * 4)) & 0xF for x in _bytes8([_u32(mem, qa, limit), _u32(mem, qa + 4, limit)])]
        if t == "Q5_K":
            assert (b + 16 + l) % 8 == 0
            hb = _bytes8([_u32(mem, b + 16 + l, limit), _u32(mem, b + 20 + l, limit)])
            v = [x | (((y >> sub) & 1) << 4) for x, y in zip(v, hb)]
        return _f16(h[0]) * sc, _f16(h[0] >> 16) * mn, v
    n, g, l = e0 >> 7, (e0 >> 5) & 3, e0 & 31
    d = _f16(int(mem[b + 208]) | int(mem[b + 209]) << 8) * float(np.int8(mem[b + 192 + 8 * n + 2 * g + (l >> 4)]))
    q = _bytes8(_ld8_w2(mem, b + 64 * n + 32 * (g & 1) + l, 0, limit))
    hb = _bytes8(_ld8_w2(mem, b + 128 + 32 * n + l, 0, limit))
    for p in (b + 64 * n + 32 * (g & 1) + l, b + 128 + 32 * n + l):  # the words: this block's (or <= 6
        assert b - 6 <= p & ~7 and (p & ~7) + 16 <= b + 210        # bytes of the block before it)
    return d, 0.0, [(((x >> ((g >> 1) * 4)) & 0xF) | (((y >> (2 * g)) & 3) << 4)) - 32 for x, y in zip(q, hb)]


@pytest.mark.parametrize("t,K", [("Q4_K", 512), ("Q5_K", 768), ("Q6_K", 768), ("Q6_K", 256)])
def test_wide_dequant_reads_the_same_values_inside_the_tensor(t, K):
    """DeqWide's loads (cuda_ops._wide_ok sets MMA_WIDE / MOE_WIDE for tensors that start 16-byte
    aligned for Q4_K / Q5_K, 8-byte for Q6_K) give deq8's scale, min and integer values for
    every chunk of every block (Q6_K's 210-byte blocks at each alignment mod 8), every load
    aligned and inside the tensor; and the values are quants.dequantize's."""
    from reflex_ipc import quants
    from reflex_ipc.backends import cuda_ops
    from reflex_ipc.ggml_types import Q4_K, Q5_K, Q6_K

    tid, bsize = {"Q4_K": (Q4_K, 144), "Q5_K": (Q5_K, 176), "Q6_K": (Q6_K, 210)}[t]
    assert cuda_ops.WIDE_ALIGN[tid] == (8 if t == "Q6_K" else 16)
    rng = np.random.default_rng(K + bsize)
    rows, nb = 5, K // 256
    mem = rng.integers(0, 256, rows * nb * bsize, dtype=np.uint8)
    for r in range(rows * nb):  # finite scales: d (and dmin) as f16 of modest values
        o = r * bsize + (208 if t == "Q6_K" else 0)
        mem[o:o + 2] = np.array([rng.uniform(-1, 1)], np.float16).view(np.uint8)
        if t != "Q6_K":
            mem[o + 2:o + 4] = np.array([rng.uniform(-1, 1)], np.float16).view(np.uint8)
    ref = quants.dequantize(mem, tid, rows * K).reshape(rows * nb, 256)
    for blk in range(rows * nb):
        b = blk * bsize
        for c in range(32):
            want = deq8_bytes(t, mem[b:b + bsize], c)
            got = deq_wide_bytes(t, mem, b, c, mem.size)
            assert got == want, (blk, c)
            d, m, v = got
            vals = np.float32(d) * np.array(v, np.float32) - np.float32(m)
            np.testing.assert_allclose(vals, ref[blk, 8 * c:8 * c + 8], rtol=1e-6, atol=1e-6 * abs(d))
    if t == "Q6_K":
        assert {(blk * bsize) % 8 for blk in range(rows * nb)} >= ({0, 2, 4, 6} if nb % 4 else {0})


def qf(v, bias):
    """mma.cuh's qf: the float32 with bits 0x4B000000 | v, minus bias, in float32."""
    return np.float32(np.array([0x4B000000 | v], np.uint32).view(np.float32)[0] - np.float32(bias))


def test_qf_is_the_exact_conversion():
    """qf(v, 2^23) == (float)v for every 6-bit value, qf(v, 2^23 + 32) == (float)(v - 32)."""
    for v in range(64):
        assert qf(v, 8388608.0) == np.float32(v) and qf(v, 8388608.0 + 32) == np.float32(v - 32)


def test_wide_dequant_matches_the_kernel_source():
    """The expressions of DeqWide's readers are deq8's (the same floats from the same bytes:
    qf is (float) of the same integer, exactly)."""
    src = open(os.path.join(ROOT, "kernels", "mma.cuh")).read()
    q = open(os.path.join(ROOT, "kernels", "quants.cuh")).read()
    assert "w[i] = d * (float)((q[i] >> sh) & 0xF) - m;" in q and \
        "w[i] = d * qf((qbyte(q, i) >> sh) & 0xF, DEQ_TWO23) - m;" in src
    assert q.count("w[i] = d * (float)v - m;") == 1 and src.count("w[i] = d * qf(v, DEQ_TWO23) - m;") == 1
    assert "w[i] = d * (float)(v - 32);" in q and "w[i] = d * qf(v, DEQ_TWO23 + 32.f);" in src
    assert "#define DEQ_TWO23 8388608.f" in src
    assert "return __int_as_float(0x4B000000 | v) - bias;" in src
    assert "const float d = ld_f16(b) * sc, m = ld_f16(b + 2) * mn;" in q
    assert src.count("const float d = lo_f16(h.x) * sc, m = hi_f16(h.x) * mn;") == 2
    assert "if (DeqWide<T>::has && wide)" in src
