"""A numpy model of kernels/matvec.cuh (no GPU here): the word loads from 2-byte aligned
addresses (ldw_a2's funnel shifts), the exact byte -> float conversion (byte_perm under 2^23),
and for Q4_K / Q5_K / Q6_K / Q8_0 each lane's slice of a block (MV<T>::load, load_x, dot), the
split of the quant blocks over the warps and steps of a block (mv_core), and the rows a
block takes (mv_body / mvn_body / mvglu_body): the emulated kernels must equal the
dequantized weights times x (Q5_K: Q4_K's slices plus the fifth bits). Also checks that the
backend's variant table matches the kernel's instantiations and the argument layouts in
core.SIGNATURES."""

import os
import re

import numpy as np
import pytest

from reflex_ipc.ggml_types import TYPES
from reflex_ipc.quants import dequantize
from reflex_ipc.testing.opchecks import random_weight

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
M32 = 0xFFFFFFFF


def byte_perm(x, y, s):
    """CUDA __byte_perm: byte n of the result is byte (s >> 4n) & 7 of y:x."""
    src = [(x >> (8 * i)) & 0xFF for i in range(4)] + [(y >> (8 * i)) & 0xFF for i in range(4)]
    return sum(src[(s >> (4 * n)) & 7] << (8 * n) for n in range(4))


def byte_f(w, k, bias):
    bits = np.uint32(byte_perm(w, 0x4B000000, 0x7540 | k))
    return np.float32(bits.view(np.float32)) - np.float32(bias)


def funnelshift_r(lo, hi, sh):
    return (((hi << 32) | lo) >> (sh & 31)) & M32


def ldw_a2(buf, addr, n):
    """The n words ldw_a2 makes from the bytes at addr of buf (addr 2-byte aligned); also
    returns the highest byte index it read."""
    assert addr % 2 == 0
    a = addr & ~3
    sh = (addr & 2) * 8
    word = lambda i: int.from_bytes(bytes(buf[a + 4 * i:a + 4 * i + 4]), "little")
    v = [word(i) for i in range(n)] + [word(n) if sh else 0]
    top = a + 4 * (n + (1 if sh else 0)) - 1
    return [funnelshift_r(v[i], v[i + 1], sh) for i in range(n)], top


def words_le(b):
    return [int.from_bytes(bytes(b[4 * i:4 * i + 4]), "little") for i in range(len(b) // 4)]


def half(v):
    return float(np.array([v & 0xFFFF], np.uint16).view(np.float16)[0])


def test_byte_to_float_is_exact():
    for b in range(256):
        w = (b << 16) | 0xA5  # byte 2 of the word, others noise
        assert byte_f(w, 2, 8388608.0) == b
        # int8 with the sign bit flipped
        q = b - 256 if b >= 128 else b
        assert byte_f(w ^ 0x80808080, 2, 8388608.0 + 128.0) == q


def test_ldw_a2_reads_the_bytes_and_no_word_past_them():
    rng = np.random.default_rng(1)
    buf = rng.integers(0, 256, 64, dtype=np.uint8)
    for addr in range(0, 40, 2):
        for n in (2, 4):
            out, top = ldw_a2(buf, addr, n)
            assert out == words_le(buf[addr:addr + 4 * n])
            # the last word read holds a byte that is needed (no word wholly past them)
            assert top - 3 <= addr + 4 * n - 1


# -- each type's slice of a block, as MV<T>::load / load_x / dot ------------------------------
def q4k_part(blk, xb, part):
    hw = words_le(blk[0:16])  # h.x h.y h.z h.w
    q = words_le(blk[16 + 16 * part:32 + 16 * part])
    p, h = part >> 1, part & 1
    xv = np.concatenate([xb[64 * p + 16 * h:64 * p + 16 * h + 16], xb[64 * p + 32 + 16 * h:64 * p + 48 + 16 * h]])

    sc0, mn0 = q4k_scale(hw, 2 * p)
    sc1, mn1 = q4k_scale(hw, 2 * p + 1)
    d, dm = half(hw[0]), half(hw[0] >> 16)
    s0 = s1 = 0.0
    for i in range(4):
        lo, hi = q[i] & 0x0F0F0F0F, (q[i] >> 4) & 0x0F0F0F0F
        for k in range(4):
            s0 += byte_f(lo, k, 8388608.0) * xv[4 * i + k]
            s1 += byte_f(hi, k, 8388608.0) * xv[16 + 4 * i + k]
    xs0, xs1 = xv[:16].sum(), xv[16:].sum()
    return (d * sc0 * s0 - dm * mn0 * xs0) + (d * sc1 * s1 - dm * mn1 * xs1)


def q5k_part(blk, xb, part):
    hw = words_le(blk[0:16])
    qh = words_le(blk[16 + 16 * (part & 1):32 + 16 * (part & 1)])
    q = words_le(blk[48 + 16 * part:64 + 16 * part])
    p, h = part >> 1, part & 1
    xv = np.concatenate([xb[64 * p + 16 * h:64 * p + 16 * h + 16], xb[64 * p + 32 + 16 * h:64 * p + 48 + 16 * h]])
    sc0, mn0 = q4k_scale(hw, 2 * p)
    sc1, mn1 = q4k_scale(hw, 2 * p + 1)
    d, dm = half(hw[0]), half(hw[0] >> 16)
    s0 = s1 = 0.0
    for i in range(4):
        lo = (q[i] & 0x0F0F0F0F) | (((qh[i] >> (2 * p)) & 0x01010101) << 4)
        hi = ((q[i] >> 4) & 0x0F0F0F0F) | (((qh[i] >> (2 * p + 1)) & 0x01010101) << 4)
        for k in range(4):
            s0 += byte_f(lo, k, 8388608.0) * xv[4 * i + k]
            s1 += byte_f(hi, k, 8388608.0) * xv[16 + 4 * i + k]
    return (d * sc0 * s0 - dm * mn0 * xv[:16].sum()) + (d * sc1 * s1 - dm * mn1 * xv[16:].sum())


def q4k_scale(hw, j):
    k = j & 3
    y, z, w = [(hw[i] >> (8 * k)) & 0xFF for i in (1, 2, 3)]
    if j < 4:
        return y & 63, z & 63
    return (w & 0xF) | ((y >> 6) << 4), (w >> 4) | ((z >> 6) << 4)


def q6k_part(blk, xb, part, base):
    """base: the block's address (mod 4) in the emulated memory, for ldw_a2's shifts."""
    mem = np.concatenate([np.zeros(base, np.uint8), blk, np.zeros(8, np.uint8)])
    n, l0 = part >> 2, 8 * (part & 3)
    a, _ = ldw_a2(mem, base + 64 * n + l0, 2)
    b, _ = ldw_a2(mem, base + 64 * n + 32 + l0, 2)
    hq, _ = ldw_a2(mem, base + 128 + 32 * n + l0, 2)
    s, top = ldw_a2(mem, base + 192 + 8 * n, 2)
    assert top < base + 210  # inside the block
    d = half(int(blk[208]) | (int(blk[209]) << 8))
    xv = np.concatenate([xb[128 * n + 32 * g + l0:128 * n + 32 * g + l0 + 8] for g in range(4)])
    t = (part & 3) >> 1
    sums = [0.0] * 4
    for i in range(2):
        gw = [(a[i] & 0x0F0F0F0F) | ((hq[i] << 4) & 0x30303030),
              (b[i] & 0x0F0F0F0F) | ((hq[i] << 2) & 0x30303030),
              ((a[i] >> 4) & 0x0F0F0F0F) | (hq[i] & 0x30303030),
              ((b[i] >> 4) & 0x0F0F0F0F) | ((hq[i] >> 2) & 0x30303030)]
        for g in range(4):
            for k in range(4):
                sums[g] += byte_f(gw[g] & M32, k, 8388608.0) * xv[8 * g + 4 * i + k]
    acc = 0.0
    for g in range(4):
        sc = np.int8(np.uint8((s[g >> 1] >> (8 * (2 * (g & 1) + t))) & 0xFF))
        acc += float(sc) * (sums[g] - 32.0 * xv[8 * g:8 * g + 8].sum())
    return d * acc


def q80_part(blk, xb, part, base):
    mem = np.concatenate([np.zeros(base, np.uint8), blk, np.zeros(8, np.uint8)])
    q, top = ldw_a2(mem, base + 2 + 16 * part, 4)
    assert top - 3 < base + 34  # the last word read holds a byte of the block
    d = half(int(blk[0]) | (int(blk[1]) << 8))
    s = 0.0
    for i in range(4):
        for k in range(4):
            s += byte_f(q[i] ^ 0x80808080, k, 8388608.0 + 128.0) * xb[16 * part + 4 * i + k]
    return d * s


PARTS = {"Q4_K": 8, "Q5_K": 8, "Q6_K": 8, "Q8_0": 2}


def part_dot(name, blk, xb, part, base):
    if name == "Q4_K":
        return q4k_part(blk, xb, part)
    if name == "Q5_K":
        return q5k_part(blk, xb, part)
    if name == "Q6_K":
        return q6k_part(blk, xb, part, base)
    return q80_part(blk, xb, part, base)


def core_row(name, row_raw, x, W, U, row_addr):
    """mv_core for one row: the sum over every (thread, step) of its slice dots; also checks
    that the threads' (block, part) pairs cover each block's parts exactly once."""
    _, QK, BYTES = TYPES[name]
    P = PARTS[name]
    BPW = 32 // P
    STEP = BPW * W
    nb = len(x) // QK
    seen = np.zeros((nb, P), int)
    total = 0.0
    for tid in range(32 * W):
        lane, warp = tid & 31, tid >> 5
        part = lane % P
        qb0 = warp * BPW + lane // P
        while qb0 < nb:
            for u in range(U):
                qb = qb0 + u * STEP
                if qb < nb:
                    seen[qb, part] += 1
                    blk = row_raw[qb * BYTES:(qb + 1) * BYTES]
                    total += part_dot(name, blk, x[qb * QK:(qb + 1) * QK], part, (row_addr + qb * BYTES) % 4)
            qb0 += U * STEP
    assert (seen == 1).all()
    return total


def variants():
    src = open(os.path.join(ROOT, "kernels", "matvec.cuh")).read()
    return {v: tuple(int(a) for a in (r, w, g, u)) for v, r, w, g, u in
            re.findall(r"RX_MV_V\((\w), NAME, T, (\d+), (\d+), (\d+), (\d+)\)", src)}


def test_backend_variant_table_matches_the_kernels():
    from reflex_ipc.backends import cuda_ops
    from reflex_ipc.cuda.core import MV_TYPES, MV_VARIANTS, SIGNATURES

    assert variants() == cuda_ops.MV_VARIANTS
    assert tuple(variants()) == MV_VARIANTS
    assert {cuda_ops.MV_KERNEL[t] for t in cuda_ops.MV_KERNEL} == set(MV_TYPES)
    src = open(os.path.join(ROOT, "kernels", "matvec.cuh")).read()
    for t in MV_TYPES:
        assert f"RX_MV({t}," in src
        for v in MV_VARIANTS:
            # the same layouts as the fused kernels they stand in for
            assert SIGNATURES[f"mvn{v}_{t}"] == SIGNATURES[f"mmnorm1_{t}"]
            assert SIGNATURES[f"mvglu{v}_{t}"] == SIGNATURES[f"mmgnorm1_{t}"]
            assert SIGNATURES[f"mv{v}_{t}"] == "QQQiiqi"


@pytest.mark.parametrize("name,K", [("Q4_K", 768), ("Q5_K", 512), ("Q6_K", 1280), ("Q8_0", 96), ("Q8_0", 1056)])
def test_emulated_rows_equal_the_dequantized_dot(name, K):
    rng = np.random.default_rng(K)
    M = 5
    raw, ref = random_weight(name, M, K, rng)
    rb = len(raw) // M
    x = rng.standard_normal(K).astype(np.float32)
    want = ref @ x.astype(np.float64)
    scale = np.abs(ref) @ np.abs(x.astype(np.float64))
    for v, (R, W, G, U) in variants().items():
        for r in range(M):
            # rows at odd 2-byte offsets too (row_addr), for the shifted word loads
            got = core_row(name, raw[r * rb:(r + 1) * rb], x, W, U, row_addr=r * rb + (2 if r % 2 else 0))
            assert abs(got - want[r]) <= 1e-5 * scale[r], (v, r, got, want[r])


def test_rows_of_a_block_cover_the_three_weights():
    """mvn_body's rows (mv_row0 of each group, written by lane 0 of the group's first warp,
    mv_writer) and its row -> (weight, row) mapping, with the backend's grid (mv_grid), for
    every variant: each row of each weight exactly once, in order."""
    from reflex_ipc.backends.cuda_ops import mv_grid

    for v, (R, W, G, _) in variants().items():
        for Ms in ((201, 70, 57), (5, 0, 0), (3, 4, 0), (1, 1, 1), (4096, 1024, 1024)):
            total = sum(Ms)
            grid, block = mv_grid(v, total)
            assert block == (32 * W * G, 1, 1)
            got = []
            for blk in range(grid[0]):
                for warp in range(W * G):
                    if warp % W:  # not the group's writer
                        continue
                    row0 = (blk * G + warp // W) * R
                    for r in range(R):
                        row = row0 + r
                        if row < Ms[0]:
                            got.append((0, row))
                        elif row - Ms[0] < Ms[1]:
                            got.append((1, row - Ms[0]))
                        elif row - Ms[0] - Ms[1] < Ms[2]:
                            got.append((2, row - Ms[0] - Ms[1]))
            want = [(i, j) for i in range(3) for j in range(Ms[i])]
            assert got == want, v


def test_mv_pick():
    """The variants the H200 sweep chose (scripts/gpu/gpu-matvec, bench/results/matvec-h200-*):
    per kind and format, None where the older kernels were faster (short Q8_0 rows)."""
    from reflex_ipc.backends import cuda_ops as co
    from reflex_ipc.ggml_types import Q4_K, Q5_K, Q6_K, Q8_0

    assert co.mv_pick(Q4_K, 1024, 4096, "mvn") == co.mv_pick(Q8_0, 4096, 6144, "mvn") == "e"
    assert co.mv_pick(Q6_K, 1024, 151936, "mvn") == "d" and co.mv_pick(Q6_K, 4096, 6144, "mvn") == "e"
    assert co.mv_pick(Q4_K, 4096, 12288, "mvglu") == "e" and co.mv_pick(Q6_K, 1024, 3072, "mvglu") == "d"
    assert co.mv_pick(Q8_0, 5120, 25600, "mvglu") == "c"
    assert co.mv_pick(Q4_K, 2048, 1024) == "b" and co.mv_pick(Q4_K, 12288, 4096) == "c"
    assert co.mv_pick(Q5_K, 12288, 4096) == "c" and co.mv_pick(Q6_K, 25600, 5120) == "b"
    assert co.mv_pick(Q8_0, 3072, 1024) is None and co.mv_pick(Q8_0, 4096, 4096) == "c"
    for t in co.MV_KERNEL:
        for kind in ("mv", "mvn", "mvglu"):
            for K in (1024, 4096, 25600):
                assert co.mv_pick(t, K, 4096, kind) in (None, *co.MV_VARIANTS)


def test_gpu_check_of_the_matvec_kernels_holds_on_numpy():
    """opchecks.check_matvec on the numpy oracle (given the CUDA backend's two switches, which
    change nothing there): its references and tolerances hold."""
    from reflex_ipc.backends.numpy_ops import NumpyOps
    from reflex_ipc.testing import opchecks

    ops = NumpyOps()
    assert opchecks.check_matvec(ops, np.random.default_rng(0)) == []  # not a CUDA backend: nothing
    ops.matvec, ops.mv_variant = False, None
    rows = opchecks.check_matvec(ops, np.random.default_rng(0))
    assert len(rows) == len(opchecks.MV_CHECK_TYPES) * 2 * 7 * len(variants()) * 2
    assert all(r["ok"] for r in rows), [r for r in rows if not r["ok"]][:3]
    assert (ops.matvec, ops.mv_variant) == (False, None)  # restored
