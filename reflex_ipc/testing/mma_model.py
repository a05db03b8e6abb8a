"""A numpy model of kernels/mma.cuh's indexing (the tensor-core GEMMs: which W rows / chunks
and x rows / columns each thread loads into shared memory, which shared halves each lane
passes to mma.sync.m16n8k16, where its accumulators go), for tests/test_mma_tiling.py
(which checks it against x @ W.T) and tests/test_moe_grouped.py (the grouped MoE GEMMs
built from the same stages and warp tiles)."""

import os
import re

import numpy as np

from reflex_ipc.testing.mma_fragments import G, T, warp_mma

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout


def header_constants():
    src = open(os.path.join(ROOT, "kernels", "mma.cuh")).read()
    names = "MMA_BM|MMA_BN|MMA_BK|MMA_BK_GLU|MMA_PAD|MMA_LOADERS|MMA_THREADS|MMA_WN"
    return {k: int(v) for k, v in re.findall(rf"#define ({names}) (\d+)", src)}


C = header_constants()
BM, BN, PAD, LOADERS, THREADS, WN = (C["MMA_BM"], C["MMA_BN"], C["MMA_PAD"], C["MMA_LOADERS"], C["MMA_THREADS"],
                                     C["MMA_WN"])
WARPS = THREADS // 32


# -- the kernel, transcribed ----------------------------------------------------------------
def load_w(s, off, W, m0, k0, M, K, BK):
    """mma_load_w by every loader p: W's tile into s[off : off + BM * LD], each slot once."""
    LD, cpr = BK + PAD, BK // 8
    written = np.zeros(BM * LD, int)
    for p in range(LOADERS):
        for i in range(BM * cpr // LOADERS):
            j = p + i * LOADERS
            r, c = j // cpr, j % cpr
            m, ch = m0 + r, (k0 >> 3) + c
            v = W[m, 8 * ch:8 * ch + 8] if (m < M and ch < (K >> 3)) else np.zeros(8)
            assert (r * LD + c * 8) % 8 == 0  # a 16-byte store
            s[off + r * LD + c * 8:off + r * LD + c * 8 + 8] = v
            written[r * LD + c * 8:r * LD + c * 8 + 8] += 1
    assert (written.reshape(BM, LD)[:, :BK] == 1).all()


def load_x(s, off, X, n0, k0, N, K, BK):
    """mma_fetch_x + mma_put_x: X (already f16 from mma_x_f16) in chunks of 8 halves."""
    LD, cpr = BK + PAD, BK // 8
    written = np.zeros(BN * LD, int)
    for p in range(LOADERS):
        for i in range(BN * cpr // LOADERS):
            j = p + i * LOADERS
            r, c = j // cpr, j % cpr
            n, k = n0 + r, k0 + 8 * c
            assert k % 8 == 0 and (n * K + k) % 8 == 0  # a 16-byte load (K is a multiple of 8)
            v = X[n, k:k + 8] if (n < N and k < K) else np.zeros(8)
            assert (r * LD + c * 8) % 8 == 0  # a 16-byte store
            s[off + r * LD + c * 8:off + r * LD + c * 8 + 8] = v
            written[r * LD + c * 8:r * LD + c * 8 + 8] += 1
    assert (written.reshape(BN, LD)[:, :BK] == 1).all()


def u32(s, idx):
    """A 32-bit shared load at half index idx (per lane): the two halves, low first."""
    assert (idx % 2 == 0).all()  # 4-byte aligned
    return s[idx], s[idx + 1]


def tile(s, w_off, x_off, cw, acc, BK, ntn=2):
    """mma_tile of warp cw for one weight (the kernel loads each X fragment once for its NW
    weights: the same indices, each accumulator's MMAs in the same k order): acc [2][2] of
    [32, 4] arrays, updated in place (ntn = 1: only acc[.][0], the first 8 tokens)."""
    LD = BK + PAD
    wr, wn = (cw & 1) * 32, (cw >> 1) * WN
    for kk in range(0, BK, 16):
        a = {}
        for mt in range(2):
            p = w_off + (wr + mt * 16 + G) * LD + kk + 2 * T
            regs = [u32(s, p), u32(s, p + 8 * LD), u32(s, p + 8), u32(s, p + 8 * LD + 8)]
            a[mt] = np.stack([h for r in regs for h in r], axis=1)  # a0..a7
        b = {}
        for nt in range(ntn):
            p = x_off + (wn + nt * 8 + G) * LD + kk + 2 * T
            regs = [u32(s, p), u32(s, p + 8)]
            b[nt] = np.stack([h for r in regs for h in r], axis=1)  # b0..b3
        for mt in range(2):
            for nt in range(ntn):
                acc[mt][nt] = warp_mma(a[mt], b[nt], acc[mt][nt])


def act(v, mode):
    return v / (1 + np.exp(-v)) if mode == 0 else \
        0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v ** 3)))


def emulate(Ws, X, Y, mode, S=1):
    """mma_body<T, len(Ws)> over its whole grid (x, y, S), then for S > 1 mma_reduce: Ws
    [M, K] float weights (already dequantized). Shared memory and the partial-sum scratch
    are NaN until written, so a read of a slot not yet loaded or stored poisons the sums."""
    NW = len(Ws)
    BK = C["MMA_BK"] if NW == 1 else C["MMA_BK_GLU"]
    TILE = BM * (BK + PAD)
    M, K = Ws[0].shape
    N = X.shape[0]
    assert K % 8 == 0
    nk_all = (K + BK - 1) // BK
    per = (nk_all + S - 1) // S
    assert LOADERS == THREADS  # every thread loads, every warp multiplies
    n_mma_warps = WARPS
    grid = ((M + BM - 1) // BM, (N + BN - 1) // BN, S)
    P = np.full(S * NW * N * M, np.nan)
    for bx in range(grid[0]):
        for by in range(grid[1]):
            for bz in range(grid[2]):
                m0, n0 = bx * BM, by * BN
                kb = bz * per
                nk = max(0, min(nk_all - kb, per))
                stage = [np.full((NW + 1) * TILE, np.nan) for _ in range(2)]
                acc = [[[[np.zeros((32, 4)) for _ in range(2)] for _ in range(2)] for _ in Ws]
                       for _ in range(n_mma_warps)]

                def fill(st, k0):
                    for w in range(NW):
                        load_w(st, w * TILE, Ws[w], m0, k0, M, K, BK)
                    load_x(st, NW * TILE, X, n0, k0, N, K, BK)

                if nk > 0:
                    fill(stage[0], kb * BK)
                # between two barriers every thread fetches slice it+1, multiplies stage it&1 and
                # stores into stage (it+1)&1; here the store comes first (the harsher order)
                for it in range(nk):
                    if it + 1 < nk:
                        stage[(it + 1) & 1][:] = np.nan  # what was there is dead
                        fill(stage[(it + 1) & 1], (kb + it + 1) * BK)
                    st = stage[it & 1]
                    for cw in range(n_mma_warps):
                        for w in range(NW):
                            tile(st, w * TILE, NW * TILE, cw, acc[cw][w], BK)
                for cw in range(n_mma_warps):
                    wr, wn = (cw & 1) * 32, (cw >> 1) * WN
                    for mt in range(2):
                        for nt in range(2):
                            for i in range(4):
                                m = m0 + wr + mt * 16 + G + (i >> 1) * 8
                                n = n0 + wn + nt * 8 + 2 * T + (i & 1)
                                ok = (m < M) & (n < N)
                                mm, nn = m[ok], n[ok]
                                v = acc[cw][0][mt][nt][ok, i]
                                if S > 1:
                                    for w in range(NW):
                                        P[((bz * NW + w) * N + nn) * M + mm] = acc[cw][w][mt][nt][ok, i]
                                elif NW == 1:
                                    Y[nn, mm] = Y[nn, mm] + v if mode else v
                                else:
                                    Y[nn, mm] = act(v, mode) * acc[cw][1][mt][nt][ok, i]
    if S > 1:  # mma_reduce over e = n * M + m
        y = Y.reshape(-1)
        g = sum(P[z * NW * N * M:(z * NW + 1) * N * M] for z in range(S))
        if NW == 1:
            y[:] = y + g if mode else g
        else:
            u = sum(P[(z * NW + 1) * N * M:(z * NW + 2) * N * M] for z in range(S))
            y[:] = act(g, mode) * u
    return Y


def splits(nk, s):
    """cuda_ops._mma_splits' trim: S such that ceil(nk / S) slices a split leave none empty."""
    per = -(-nk // s)
    return -(-nk // per)
