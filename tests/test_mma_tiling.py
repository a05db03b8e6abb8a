"""A numpy model of kernels/mma.cuh's indexing (no GPU here): which W rows / chunks and
which x rows / columns each thread of a block loads into shared memory, which shared
halves each lane passes to mma.sync.m16n8k16 as its A and B registers, and where each
lane's accumulators are stored. The warp-wide MMA is modelled from the PTX ISA's fragment
layout of m16n8k16 (f16 A/B, f32 C/D): the emulated kernel must equal x @ W.T on shapes
with ragged edges in M, N and K, for the plain, accumulate and gated-unit variants."""

import numpy as np
import pytest

from reflex_ipc.testing.mma_fragments import G, T, a_coords, b_coords, c_coords
from reflex_ipc.testing.mma_model import BM, BN, C, PAD, WARPS, WN, act, emulate, splits


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
