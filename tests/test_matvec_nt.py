"""A numpy model of kernels/matvec_nt.cuh (the multi-token matvecs mmt / mmtn / mmtglu): the
grid CudaOps launches, which thread reads which chunks of which rows, the warp reduce-scatter
and the block's sums in warp order, the output each thread writes, and the wide-load
dequantization (ld8_w, byte8, deq8t) on real quant bytes. Checked against plain products,
so the kernels' index math is validated without a GPU."""

import numpy as np
import pytest

from reflex_ipc.backends.cuda_ops import MMA_MIN_N, MMT_ROWS, MMT_THREADS, CudaOps
from reflex_ipc.ggml_types import TYPES
from reflex_ipc.quants import dequantize

WARPS = MMT_THREADS // 32


def warp_scatter_sum(v):
    """matvec_nt.cuh's warp_scatter_sum on v [32 lanes, V], step by step as the kernel does it:
    returns each lane's v[0] at the end."""
    v = v.copy()
    cur = v.shape[1]
    lanes = np.arange(32)
    o = 16
    while o > 0:
        partner = lanes ^ o
        if cur > 1:
            h = cur // 2
            up = (lanes & o) != 0
            send = np.where(up[:, None], v[:, :h], v[:, h:cur])
            keep = np.where(up[:, None], v[:, h:cur], v[:, :h])
            v[:, :h] = keep + send[partner]
            cur = h
        else:
            v[:, 0] = v[:, 0] + v[partner, 0]
        o //= 2
    return v[:, 0]


@pytest.mark.parametrize("V", [1, 2, 4, 8, 16, 32])
def test_warp_scatter_sum_leaves_value_l_over_32_per_V_in_lane_l(V):
    rng = np.random.default_rng(V)
    v = rng.standard_normal((32, V))
    out = warp_scatter_sum(v)
    G = 32 // V
    for lane in range(32):
        assert np.isclose(out[lane], v[:, lane // G].sum(), rtol=1e-12, atol=1e-12)


def locate(g, Ms):
    """mmt_locate: (weight index, row) of global row g of the concatenated weights, or None."""
    for i, M in enumerate(Ms):
        if g < M:
            return i, g
        g -= M
    return None


def block_sums(rows, X, n0, nt, NT, K):
    """One block of mmt_dot + mmt_block_sum: rows = the MMT_ROWS weight rows (float64 [K]) of
    its row slots; returns s[i] for the V = MMT_ROWS * NT threads i that hold a sum. Thread
    tid takes chunks tid, tid + MMT_THREADS, ...; acc[tid, j * NT + t]."""
    V = MMT_ROWS * NT
    nch = K // 8
    acc = np.zeros((MMT_THREADS, V))
    read = np.zeros((MMT_THREADS, nch), bool)
    for tid in range(MMT_THREADS):
        for ch in range(tid, nch, MMT_THREADS):
            read[tid, ch] = True
            for t in range(NT):
                if t < nt:
                    xs = X[n0 + t, ch * 8:ch * 8 + 8]
                    for j in range(MMT_ROWS):
                        acc[tid, j * NT + t] += rows[j][ch * 8:ch * 8 + 8] @ xs
    assert (read.sum(0) == 1).all()  # every chunk of K by exactly one thread
    part = np.full((WARPS, V), np.nan)
    G = 32 // V
    for w in range(WARPS):
        red = warp_scatter_sum(acc[32 * w:32 * w + 32])
        for lane in range(32):
            if lane % G == 0:
                assert np.isnan(part[w, lane // G])
                part[w, lane // G] = red[lane]
    s = part[0].copy()
    for w in range(1, WARPS):
        s += part[w]
    return s


def emulate_mmt(Ws, X, accumulate=None):
    """mmt (one weight, optional accumulate) / mmtn (up to three) with CudaOps' launch: returns
    the outputs, checking every element is written exactly once."""
    N, K = X.shape
    Ms = [W.shape[0] for W in Ws] + [0] * (3 - len(Ws))
    NT, grid, block = CudaOps._mmt_launch(sum(Ms), N)
    assert block == (MMT_THREADS, 1, 1) and grid[2] == 1
    Ys = [np.full((N, M), np.nan) if accumulate is None else accumulate.copy() for M in Ms[:len(Ws)]]
    writes = [np.zeros((N, M), int) for M in Ms[:len(Ws)]]
    for by in range(grid[1]):
        n0 = by * NT
        nt = min(NT, N - n0)
        for bx in range(grid[0]):
            slots = [locate(bx * MMT_ROWS + j, Ms) for j in range(MMT_ROWS)]
            rows = [Ws[s[0]][s[1]] if s else Ws[0][0] for s in slots]
            s = block_sums(rows, X, n0, nt, NT, K)
            for i in range(MMT_ROWS * NT):
                j, t = i // NT, i % NT
                if t < nt and slots[j]:
                    wi, r = slots[j]
                    Ys[wi][n0 + t, r] = Ys[wi][n0 + t, r] + s[i] if accumulate is not None else s[i]
                    writes[wi][n0 + t, r] += 1
    for w in writes:
        assert (w == 1).all()
    return Ys


def silu(g):
    return g / (1 + np.exp(-g))


def emulate_mmtglu(Wg, Wu, X):
    N, K = X.shape
    M = Wg.shape[0]
    RG = MMT_ROWS // 2
    NT, grid, _ = CudaOps._mmt_launch(M, N, RG)
    Y = np.full((N, M), np.nan)
    writes = np.zeros((N, M), int)
    for by in range(grid[1]):
        n0 = by * NT
        nt = min(NT, N - n0)
        for bx in range(grid[0]):
            rs = [bx * RG + j for j in range(RG)]
            rows = [Wg[r if r < M else 0] for r in rs] + [Wu[r if r < M else 0] for r in rs]
            s = block_sums(rows, X, n0, nt, NT, K)
            for i in range(RG * NT):
                j, t = i // NT, i % NT
                r = bx * RG + j
                if t < nt and r < M:
                    Y[n0 + t, r] = silu(s[i]) * s[RG * NT + i]
                    writes[n0 + t, r] += 1
    assert (writes == 1).all()
    return Y


@pytest.mark.parametrize("N,M,K", [(2, 7, 64), (3, 9, 1024), (8, 13, 2112), (9, 5, 2560), (17, 3, 256)])
def test_mmt_emulation_matches_product(N, M, K):
    rng = np.random.default_rng(N * 1000 + M)
    W = rng.standard_normal((M, K))
    X = rng.standard_normal((N, K))
    (Y,) = emulate_mmt([W], X)
    np.testing.assert_allclose(Y, X @ W.T, rtol=1e-10, atol=1e-10)
    y0 = rng.standard_normal((N, M))
    (Y,) = emulate_mmt([W], X, accumulate=y0)
    np.testing.assert_allclose(Y, y0 + X @ W.T, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("Ms,N", [((5, 3, 2), 7), ((6, 1), 9), ((2, 3, 7), 2), ((1,), 5)])
def test_mmtn_emulation_matches_products(Ms, N):
    rng = np.random.default_rng(sum(Ms) + N)
    K = 1280
    Ws = [rng.standard_normal((M, K)) for M in Ms]
    X = rng.standard_normal((N, K))
    for Y, W in zip(emulate_mmt(Ws, X), Ws):
        np.testing.assert_allclose(Y, X @ W.T, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("M,N,K", [(5, 3, 512), (4, 8, 1088), (7, 10, 2048)])
def test_mmtglu_emulation_matches_product(M, N, K):
    rng = np.random.default_rng(M * N)
    Wg, Wu = rng.standard_normal((M, K)), rng.standard_normal((M, K))
    X = rng.standard_normal((N, K)) / np.sqrt(K)
    Y = emulate_mmtglu(Wg, Wu, X)
    np.testing.assert_allclose(Y, silu(X @ Wg.T) * (X @ Wu.T), rtol=1e-10, atol=1e-12)


def test_mmt_launch_token_groups():
    """8 tokens a block; grid y covers every token once; rows per block."""
    for N in range(2, MMA_MIN_N):
        nt, grid, block = CudaOps._mmt_launch(203, N)
        assert nt == 8 and grid[1] * nt >= N > (grid[1] - 1) * nt
        assert grid[0] * MMT_ROWS >= 203 > (grid[0] - 1) * MMT_ROWS
    nt, grid, _ = CudaOps._mmt_launch(203, 9, MMT_ROWS // 2)
    assert grid[0] == 102


# -- the wide loads of deq8t (matvec_nt.cuh) on real blocks ------------------------------------

def ld8_w(buf, a):
    """ld8_w at byte address a of buf (2-aligned): the words it loads, funnel-shifted."""
    assert a % 2 == 0
    q = a & ~3
    sh = (a & 3) * 8
    words = [int.from_bytes(bytes(buf[q + 4 * i:q + 4 * i + 4]), "little") for i in range(3)]
    w0, w1 = words[0], words[1]
    w2 = words[2] if sh else 0

    def funnel_r(lo, hi, s):
        return ((hi << 32 | lo) >> s) & 0xFFFFFFFF

    return funnel_r(w0, w1, sh), funnel_r(w1, w2, sh)


def byte8(v, i):
    return ((v[0] if i < 4 else v[1]) >> (8 * (i & 3))) & 0xFF


def f16(buf, a):
    return np.float32(np.frombuffer(bytes(buf[a:a + 2]), np.float16)[0])


def kscale(buf, s, j):
    if j < 4:
        return buf[s + j] & 63, buf[s + j + 4] & 63
    return (buf[s + j + 4] & 0xF) | ((buf[s + j - 4] >> 6) << 4), (buf[s + j + 4] >> 4) | ((buf[s + j] >> 6) << 4)


def deq8t(name, buf, b, c):
    """deq8t<T>(block at byte b, chunk c) for the formats matvec_nt.cuh specializes."""
    w = np.zeros(8, np.float32)
    if name == "Q8_0":
        d = f16(buf, b)
        v = ld8_w(buf, b + 2 + 8 * c)
        for i in range(8):
            w[i] = d * np.float32(np.int8(np.uint8(byte8(v, i))))
    elif name == "Q4_K":
        e0 = 8 * c
        sub, p, l = e0 >> 5, e0 >> 6, e0 & 31
        sc, mn = kscale(buf, b + 4, sub)
        d, m = f16(buf, b) * np.float32(sc), f16(buf, b + 2) * np.float32(mn)
        v = ld8_w(buf, b + 16 + 32 * p + l)
        sh = (sub & 1) * 4
        for i in range(8):
            w[i] = d * np.float32((byte8(v, i) >> sh) & 0xF) - m
    else:  # Q6_K
        e0 = 8 * c
        n, g, l = e0 >> 7, (e0 >> 5) & 3, e0 & 31
        d = f16(buf, b + 208) * np.float32(np.int8(np.uint8(buf[b + 192 + 8 * n + 2 * g + (l >> 4)])))
        q = ld8_w(buf, b + 64 * n + 32 * (g & 1) + l)
        h = ld8_w(buf, b + 128 + 32 * n + l)
        sh = (g >> 1) * 4
        for i in range(8):
            v = ((byte8(q, i) >> sh) & 0xF) | (((byte8(h, i) >> (2 * g)) & 3) << 4)
            w[i] = d * np.float32(v - 32)
    return w


@pytest.mark.parametrize("name", ["Q8_0", "Q4_K", "Q6_K"])
@pytest.mark.parametrize("base", [0, 2])
def test_deq8t_wide_loads_match_dequantize(name, base):
    """The rows start 4-aligned (base 0) or 2 bytes off (base 2); within a row the blocks of
    34 / 210 bytes alternate between both alignments, so both funnel shifts are taken."""
    from reflex_ipc.testing.opchecks import random_weight

    rng = np.random.default_rng(7)
    tid, qk, bsize = TYPES[name]
    rows, K = 3, 512
    raw, _ = random_weight(name, rows, K, rng, ref=False)
    ref = dequantize(raw, tid, rows * K).reshape(rows, K)
    buf = np.concatenate([np.zeros(base, np.uint8), raw, np.zeros(8, np.uint8)])
    rb = K // qk * bsize
    out = np.zeros((rows, K), np.float32)
    for r in range(rows):
        for ch in range(K // 8):
            blk, c = divmod(ch, qk // 8)
            out[r, ch * 8:ch * 8 + 8] = deq8t(name, buf, base + r * rb + blk * bsize, c)
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-7)


def test_run_all_includes_check_matmul_nt():
    """gpu-check's ops section (opchecks.run_all) runs the multi-token matvec checks."""
    from reflex_ipc.testing import opchecks

    assert "check_matmul_nt" in opchecks.run_all.__code__.co_names
