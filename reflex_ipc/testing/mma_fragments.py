"""The PTX fragment layout of mma.sync.m16n8k16 (.f16/.bf16 A and B, .f32 C/D), lane by lane,
for the numpy models of the tensor-core kernels (tests/test_mma_tiling.py: kernels/mma.cuh;
tests/test_flash_tiling.py: kernels/flash.cuh)."""

import numpy as np

LANES = np.arange(32)
G, T = LANES >> 2, LANES & 3  # groupID, threadID_in_group


def a_coords(i):
    """(row, col) of element a_i (i = 0..7) for every lane: rows g (a0, a1, a4, a5) or g+8,
    cols 2t + (i & 1), plus 8 for a4..a7."""
    row = G + (0 if (i < 2 or 4 <= i < 6) else 8)
    col = T * 2 + (i & 1) + (8 if i >= 4 else 0)
    return row, col


def b_coords(i):
    """(row = k, col = n) of element b_i (i = 0..3): k = 2t + (i & 1), plus 8 for b2, b3; n = g."""
    return T * 2 + (i & 1) + (8 if i >= 2 else 0), G


def c_coords(i):
    """(row, col) of accumulator c_i (i = 0..3): row g (c0, c1) or g+8, col 2t + (i & 1)."""
    return G + (8 if i >= 2 else 0), T * 2 + (i & 1)


def warp_mma(a_regs, b_regs, c):
    """One mma.sync.m16n8k16: a_regs [32, 8] (a0..a7 per lane), b_regs [32, 4], c [32, 4]
    -> d [32, 4], assembling the matrices from the lanes by the PTX layout."""
    A = np.zeros((16, 16))
    B = np.zeros((16, 8))
    for i in range(8):
        A[a_coords(i)] = a_regs[:, i]
    for i in range(4):
        B[b_coords(i)] = b_regs[:, i]
    D = A @ B
    d = c.copy()
    for i in range(4):
        d[:, i] += D[c_coords(i)]
    return d
