"""A numpy model of the mixture-of-experts prefill on tensor cores (no GPU here):
moe.cuh's moe_group_i32 (the (token, slot) pairs sorted by expert, stably, by warps that
count, scan and place their segments; the tile table) and mma.cuh's grouped GEMMs
(mmaglu_moe_* / mma_moe_*: each block's expert and rows from the tile table, X rows gathered
through per-thread row pointers, the stages and warp tiles of the dense kernel, H stored in
group order, the down projection's rows stored at their pairs) and moe_wsum_f32. The
emulation must equal numpy's moe (the backend's oracle) on ragged shapes, with NaN planted
wherever the kernels must not read or leave unwritten."""

import re

import numpy as np
import pytest

from reflex_ipc.backends import cuda_ops
from reflex_ipc.backends.base import moe_route, swiglu_oai
from reflex_ipc.backends.numpy_ops import NumpyOps
from reflex_ipc.testing.mma_fragments import G, T
from reflex_ipc.testing.mma_model import BM, BN, C, LOADERS, PAD, ROOT, WARPS, WN, act, load_w, tile  # noqa: F401


def lanes_match_any(vals):
    """__match_any_sync over 32 lanes: for each lane the mask of lanes holding its value."""
    vals = np.asarray(vals)
    return np.array([int(sum(1 << j for j in range(32) if vals[j] == vals[i])) for i in range(32)])


def popc(x):
    return bin(int(x)).count("1")


def group_emulate(ids, E, W, bn):
    """moe_group_i32 with W warps: (order [P], eoff [E + 1], tiles [1 + 2 TMAX])."""
    ids = np.asarray(ids).reshape(-1)
    P = ids.size
    tmax = P // bn + min(E, P)
    order = np.full(P, -7)
    tiles = np.full(1 + 2 * tmax, -7)
    cnt = np.zeros((W, E), int)
    seg = -(-P // W)
    for w in range(W):  # pass 1: the lowest lane of each expert adds the lanes holding it
        pb, pe = w * seg, min(P, w * seg + seg)
        for b in range(pb, pe, 32):
            p = b + np.arange(32)
            e = np.where(p < pe, np.clip(ids[np.minimum(p, P - 1)], 0, E - 1), -1)
            same = lanes_match_any(e)
            for lane in range(32):
                if e[lane] >= 0 and same[lane] & ((1 << lane) - 1) == 0:
                    cnt[w, e[lane]] += popc(same[lane])
    size = cnt.sum(0)
    cnt = np.cumsum(cnt, 0) - cnt  # pairs of e in earlier warps
    ntile = -(-size // bn)
    off = np.concatenate([[0], np.cumsum(size)])
    toff = np.concatenate([[0], np.cumsum(ntile)])
    tiles[0] = toff[E]
    for e in range(E):
        for j in range(ntile[e]):
            tiles[1 + 2 * (toff[e] + j)] = e
            tiles[2 + 2 * (toff[e] + j)] = j * bn
    for w in range(W):  # pass 2: placement
        pb, pe = w * seg, min(P, w * seg + seg)
        for b in range(pb, pe, 32):
            p = b + np.arange(32)
            e = np.where(p < pe, np.clip(ids[np.minimum(p, P - 1)], 0, E - 1), -1)
            same = lanes_match_any(e)
            for lane in range(32):
                if e[lane] >= 0:
                    dst = off[e[lane]] + cnt[w, e[lane]] + popc(same[lane] & ((1 << lane) - 1))
                    assert order[dst] == -7  # each slot once
                    order[dst] = p[lane]
            for lane in range(32):
                if e[lane] >= 0 and same[lane] & ((1 << lane) - 1) == 0:
                    cnt[w, e[lane]] += popc(same[lane])
    assert toff[E] <= tmax
    return order, off, tiles


@pytest.mark.parametrize("N,k,E,W", [(17, 8, 128, 32), (512, 8, 128, 32), (300, 6, 64, 7), (1, 2, 8, 32),
                                     (40, 3, 5, 1), (64, 4, 4, 3)])
def test_group_is_a_stable_sort_by_expert(N, k, E, W):
    rng = np.random.default_rng(N + 31 * k + E)
    ids = np.stack([rng.choice(E, k, replace=False) for _ in range(N)])
    if N >= 64:  # a skewed routing: a few experts take most pairs (several tiles each)
        hot = rng.random(N) < 0.7
        ids[hot, 0] = 1
    order, off, tiles = group_emulate(ids, E, W, BN)
    flat = ids.reshape(-1)
    ref = np.argsort(flat, kind="stable")
    assert np.array_equal(order, ref)
    assert np.array_equal(off, np.concatenate([[0], np.cumsum(np.bincount(flat, minlength=E))]))
    T_ = tiles[0]
    pairs = [(tiles[1 + 2 * t], tiles[2 + 2 * t]) for t in range(T_)]
    want = [(e, r) for e in range(E) for r in range(0, off[e + 1] - off[e], BN)]
    assert pairs == want


def group_shared_warps(E):
    """cuda_ops._moe_grouped's warp count for E experts (the counts fit the shared budget)."""
    return max(1, min(cuda_ops.MOE_GROUP_WARPS, (cuda_ops.MOE_GROUP_SHARED // 4 - 2 * (E + 1)) // E))


def test_group_shared_memory_fits():
    for E in (4, 64, 128, 256, 384, 512, 1024, 3900):  # 4 * (3E + 2) bytes at most (_moe_mma_takes)
        assert 4 * (3 * E + 2) <= cuda_ops.MOE_GROUP_SHARED
        W = group_shared_warps(E)
        assert 4 * (W * E + 2 * (E + 1)) <= cuda_ops.MOE_GROUP_SHARED
        assert W >= 1


def test_kernel_constants_match_the_sources():
    src = open(f"{ROOT}/kernels/mma.cuh").read()
    assert "if (t >= tiles[0]) return;" in src
    assert cuda_ops.MMA_BN == BN and cuda_ops.MMA_BM == BM
    moe = open(f"{ROOT}/kernels/moe.cuh").read()
    assert re.search(r"int\* cnt = mg_sh;\s+// \[W\]\[E\]", moe)
    assert "4 * (W * E + 2 * (E + 1))" in moe


def load_x_rows(s, off, X, srow, k0, K, BK):
    """mma_fetch_xrows + mma_put_x: thread p's job i has row (p + i*LOADERS) / (BK/8) of the
    tile, whose pointer (srow: X row or -1) it computed once; chunks past K or of a null row
    are zeros."""
    LD, cpr = BK + PAD, BK // 8
    written = np.zeros(BN * LD, int)
    for p in range(LOADERS):
        for i in range(BN * cpr // LOADERS):
            j = p + i * LOADERS
            r, c = j // cpr, j % cpr
            k = k0 + 8 * c
            v = X[srow[r], k:k + 8] if (srow[r] >= 0 and k < K) else np.zeros(8)
            s[off + r * LD + c * 8:off + r * LD + c * 8 + 8] = v
            written[r * LD + c * 8:r * LD + c * 8 + 8] += 1
    assert (written.reshape(BN, LD)[:, :BK] == 1).all()


def warp_ntn(nr, cw, skip):
    """mma_moe_body's ntn: warp cw's 8-token tiles that hold rows of a group of nr (MOE_SKIP)."""
    if not skip:
        return 2
    return min(2, max(0, int((nr - (cw >> 1) * WN + 7) / 8)))  # C's division truncates toward zero


def grouped_emulate(Ws, X, order, eoff, tiles, tmax, k, es, gather, mode, out, bg=None, bu=None, skip=False,
                    macs=None):
    """mma_moe_body<T, len(Ws), gather> over its grid (ceil(M / BM), tmax): Ws are the whole
    expert tensors [E * es, K] (expert e's rows from e * es), out the H (gather) or Y array;
    mode 2 (gpt-oss): swiglu_oai of the products plus the expert's biases bg, bu [E, M].
    skip: flags' MOE_SKIP (warps multiply only their 8-token tiles that hold rows); macs, a
    one-element list, counts the m16n8k16 MMAs issued."""
    NW = len(Ws)
    BK = C["MMA_BK"] if NW == 1 else C["MMA_BK_GLU"]
    TILE = BM * (BK + PAD)
    M = out.shape[1]
    K = X.shape[1]
    nk = -(-K // BK)
    for bx in range(-(-M // BM)):
        for t in range(tmax):
            if t >= tiles[0]:
                continue
            e, r0 = tiles[1 + 2 * t], tiles[2 + 2 * t]
            g0 = eoff[e] + r0
            nr = min(BN, eoff[e + 1] - g0)
            assert nr >= 1
            srow = np.full(BN, -1)
            sout = np.full(BN, -1)
            for r in range(nr):
                pair = order[g0 + r]
                srow[r] = pair // k if gather else g0 + r
                sout[r] = g0 + r if gather else pair
            We = [w[e * es:e * es + M] for w in Ws]
            m0 = bx * BM
            stage = [np.full((NW + 1) * TILE, np.nan) for _ in range(2)]
            acc = [[[[np.zeros((32, 4)) for _ in range(2)] for _ in range(2)] for _ in Ws] for _ in range(WARPS)]

            def fill(st, k0):
                for w in range(NW):
                    load_w(st, w * TILE, We[w], m0, k0, M, K, BK)
                load_x_rows(st, NW * TILE, X, srow, k0, K, BK)

            fill(stage[0], 0)
            for it in range(nk):
                if it + 1 < nk:
                    stage[(it + 1) & 1][:] = np.nan
                    fill(stage[(it + 1) & 1], (it + 1) * BK)
                for cw in range(WARPS):
                    ntn = warp_ntn(nr, cw, skip)
                    for w in range(NW if ntn > 0 else 0):
                        tile(stage[it & 1], w * TILE, NW * TILE, cw, acc[cw][w], BK, ntn)
                        if macs is not None:
                            macs[0] += 2 * ntn * (BK // 16)
            for cw in range(WARPS):
                wr, wn = (cw & 1) * 32, (cw >> 1) * WN
                for mt in range(2):
                    for nt in range(2):
                        for i in range(4):
                            m = m0 + wr + mt * 16 + G + (i >> 1) * 8
                            n = wn + nt * 8 + 2 * T + (i & 1)
                            ok = (m < M) & (n < nr)
                            rows = sout[n[ok]]
                            assert (rows >= 0).all()
                            if NW == 2:
                                g, u = acc[cw][0][mt][nt][ok, i], acc[cw][1][mt][nt][ok, i]
                                if mode == 2:
                                    g = g + (bg[e, m[ok]] if bg is not None else 0)
                                    u = u + (bu[e, m[ok]] if bu is not None else 0)
                                    v = swiglu_oai(g, u)
                                else:
                                    v = act(g, mode) * u
                            else:
                                v = acc[cw][0][mt][nt][ok, i]
                            assert np.isnan(out[rows, m[ok]]).all()  # each element once
                            out[rows, m[ok]] = v


@pytest.mark.parametrize("N,k,E,K,F,D,fused,act_", [(19, 3, 5, 72, 40, 70, False, "silu"),
                                                     (70, 2, 3, 40, 24, 136, True, "gelu"),
                                                     (9, 4, 4, 200, 72, 24, False, "silu")])
def test_grouped_gemms_equal_numpy_moe(N, k, E, K, F, D, fused, act_):
    rng = np.random.default_rng(N * 7 + K)
    x = rng.standard_normal((N, K)).astype(np.float32)
    router = rng.standard_normal((E, K)).astype(np.float32) * 0.3
    wg = rng.standard_normal(((2 if fused else 1) * E * F, K)).astype(np.float32) * 0.2
    wu = None if fused else rng.standard_normal((E * F, K)).astype(np.float32) * 0.2
    wd = rng.standard_normal((E * D, F)).astype(np.float32) * 0.2
    want = NumpyOps().moe(x, router, wg, wu, wd, k, act=act_)
    ids, wts = moe_route(x.astype(np.float32) @ router.T, k)
    P = N * k
    order, eoff, tiles = group_emulate(ids, E, 3, BN)
    tmax = P // BN + min(E, P)
    es = 2 * F if fused else F
    g_rows = wg.astype(np.float64)
    u_rows = g_rows[F:] if fused else wu.astype(np.float64)  # expert e's up rows from e * es (+ F)
    H = np.full((P, F), np.nan)
    grouped_emulate([g_rows, u_rows], x.astype(np.float64), order, eoff, tiles, tmax, k, es, True,
                    0 if act_ == "silu" else 1, H)
    assert not np.isnan(H).any()
    Y = np.full((P, D), np.nan)
    grouped_emulate([wd.astype(np.float64)], H, order, eoff, tiles, tmax, k, D, False, 0, Y)
    assert not np.isnan(Y).any()
    out = np.zeros((N, D))
    for n in range(N):  # moe_wsum_f32: slot order
        for j in range(k):
            out[n] += wts[n, j] * Y[n * k + j]
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("N,k,E,K,F,D,form", [(19, 4, 5, 72, 40, 70, "gpt-oss"), (70, 2, 3, 40, 24, 136, "gpt-oss"),
                                                (9, 1, 4, 200, 72, 24, "llama4"), (40, 2, 6, 48, 16, 40, "llama4")])
def test_grouped_gemms_gpt_oss_llama4_equal_numpy_moe(N, k, E, K, F, D, form):
    """gpt-oss's experts (softmax_weight routing over biased logits, gate/up biases and the
    clamped SwiGLU in mmaglu_moe's epilogue, act 2; down biases added after moe_wsum by
    moe_down_bias_f32) and Llama 4's (each pair's input weighted first: X holds a row per pair,
    gathered with k = 1; unit weights in the sum) through the grouped GEMMs, equal to numpy."""
    rng = np.random.default_rng(N * 5 + K)
    x = (rng.standard_normal((N, K)) * 2).astype(np.float32)
    router = rng.standard_normal((E, K)).astype(np.float32) * 0.3
    wg = rng.standard_normal((E * F, K)).astype(np.float32) * 0.5  # gate values past the clamp of 7
    wu = rng.standard_normal((E * F, K)).astype(np.float32) * 0.5
    wd = rng.standard_normal((E * D, F)).astype(np.float32) * 0.2
    if form == "gpt-oss":
        b = {"router_bias": rng.standard_normal(E), "gate_bias": rng.standard_normal((E, F)) * 2,
             "up_bias": rng.standard_normal((E, F)) * 2, "down_bias": rng.standard_normal((E, D)) * 0.5}
        b = {n: a.astype(np.float32) for n, a in b.items()}
        kw = dict(gating="softmax_weight", norm=False, act="swiglu_oai", **b)
        ids, wts = moe_route(x @ router.T + b["router_bias"], k, "softmax_weight", False)
        X, x_div, mode = x.astype(np.float64), k, 2
    else:
        kw = dict(gating="sigmoid", norm=False, weight_before=True)
        ids, wts = moe_route(x @ router.T, k, "sigmoid", False)
        X = (np.repeat(x, k, 0) * wts.reshape(-1, 1)).astype(np.float64)  # moe_weight_input_f32
        wts, x_div, mode = np.ones_like(wts), 1, 0
    want = NumpyOps().moe(x, router, wg, wu, wd, k, **kw)
    assert np.abs(x @ wg.T).max() > 7  # the clamp bites
    P = N * k
    order, eoff, tiles = group_emulate(ids, E, 3, BN)
    tmax = P // BN + min(E, P)
    H = np.full((P, F), np.nan)
    grouped_emulate([wg.astype(np.float64), wu.astype(np.float64)], X, order, eoff, tiles, tmax, x_div, F, True,
                    mode, H, kw.get("gate_bias"), kw.get("up_bias"))
    assert not np.isnan(H).any()
    Y = np.full((P, D), np.nan)
    grouped_emulate([wd.astype(np.float64)], H, order, eoff, tiles, tmax, k, D, False, 0, Y)
    out = np.zeros((N, D))
    for n in range(N):  # moe_wsum_f32, then moe_down_bias_f32: slot order
        for j in range(k):
            out[n] += wts[n, j] * Y[n * k + j]
        if "down_bias" in kw:
            for j in range(k):
                out[n] += wts[n, j] * kw["down_bias"][ids[n, j]]
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_grouped_epilogue_matches_the_kernel_source():
    """mmaglu_moe's act 2 adds the expert's biases [E, M] at (e, m) before swiglu_oai, the
    unit common.cuh shares with archops.cuh's moe_swiglu_oai_f32."""
    src = open(f"{ROOT}/kernels/mma.cuh").read()
    assert "if (bg) gv += bg[(long long)e * M + m];" in src and "hv = swiglu_oai(gv, uv, alpha, limit);" in src
    assert "xrow = GATHER ? pair / k : g0 + r;" in src
    assert "H[i] = swiglu_oai(g, u, alpha, limit);" in open(f"{ROOT}/kernels/archops.cuh").read()


def test_moe_grouped_op_check_runs_on_the_numpy_oracle():
    """opchecks.check_moe_grouped (run on CUDA by scripts/gpu/gpu-check and gpu-bigmodel) on the
    numpy backend dressed as one whose moe has a grouped path from 32 tokens: the check runs,
    its references agree, and it reports a call that did not take the path as a failure."""
    from reflex_ipc.testing import opchecks

    class Ops(NumpyOps):
        moe_mma, moe_mma_min_n, moe_mma_launches, moe_skip, mma_wide = True, 32, 0, True, True

        def moe(self, x, *a, **kw):
            self.moe_mma_launches += x.shape[0] >= self.moe_mma_min_n
            return super().moe(x, *a, **kw)

    rows = opchecks.check_moe_grouped(Ops(blas_threads=None), np.random.default_rng(0))
    assert len(rows) >= 2 * (len(opchecks.MOE_MMA_FORMATS) * 2 + 10)
    bad = [r for r in rows if not r["ok"]]
    assert not bad, bad
    cases = " | ".join(r["case"] for r in rows)
    for want in ("groups of 1..70 rows N=290", "E=128 k=8 N=600", "N=290 moe_skip=0: same bits",
                 "N=290 mma_wide=0: same bits", "N=290 moe_skip=0 mma_wide=0: same bits",
                 "gpt-oss-like F16/F16/F16 E=32 k=4 N=150 moe_skip=0"):
        assert want in cases, want

    class Missed(Ops):  # a backend whose calls never take the path
        def moe(self, x, *a, **kw):
            return NumpyOps.moe(self, x, *a, **kw)

    rows = opchecks.check_moe_grouped(Missed(blas_threads=None), np.random.default_rng(0))
    assert not any(r["ok"] for r in rows if "same bits" not in r["case"])


@pytest.mark.parametrize("sizes", [(1, 7, 16, 17, 33, 70), (8, 9, 24, 25, 40, 63, 64, 65)])
def test_skip_writes_the_same_bits_with_fewer_mmas(sizes):
    """flags' MOE_SKIP (REFLEX_MOE_SKIP): warps whose 8-token tiles lie past the
    group's rows multiply nothing there; every row the kernels write is the same sum in the
    same order, so H and Y are bit-identical to the plain tiles', from fewer MMAs (groups of
    1..70 rows: partial, full and two-tile experts)."""
    rng = np.random.default_rng(sum(sizes))
    E, k = len(sizes), 2
    lab = rng.permutation(np.repeat(np.arange(E), sizes))
    if lab.size % k:
        lab = np.append(lab, 0)
    ids = lab.reshape(-1, k)
    N, P = ids.shape[0], lab.size
    K, F, D = 48, 24, 40
    x = rng.standard_normal((N, K))
    wg, wu = rng.standard_normal((E * F, K)) * 0.2, rng.standard_normal((E * F, K)) * 0.2
    wd = rng.standard_normal((E * D, F)) * 0.2
    order, eoff, tiles = group_emulate(ids, E, 2, BN)
    tmax = P // BN + min(E, P)
    out = {}
    for skip in (False, True):
        macs = [0]
        H = np.full((P, F), np.nan)
        grouped_emulate([wg, wu], x, order, eoff, tiles, tmax, k, F, True, 0, H, skip=skip, macs=macs)
        Y = np.full((P, D), np.nan)
        grouped_emulate([wd], H, order, eoff, tiles, tmax, k, D, False, 0, Y, skip=skip, macs=macs)
        assert not np.isnan(H).any() and not np.isnan(Y).any()
        out[skip] = H, Y, macs[0]
    assert np.array_equal(out[True][0], out[False][0]) and np.array_equal(out[True][1], out[False][1])
    # the MMAs: a group of n rows takes ceil(n / 8) of the 8 token tiles of each of its tiles
    sz = np.bincount(lab, minlength=E)
    full = sum(-(-int(n) // BN) * (BN // 8) for n in sz)
    part = sum(-(-int(n) // 8) for n in sz)
    # per 8 tokens: 2 warps along the rows x 2 row tiles of 16, per 16 columns, weight and row block
    ks = lambda K_, bk: -(-K_ // C[bk]) * (C[bk] // 16)  # noqa: E731
    per_tile8 = 4 * (2 * ks(K, "MMA_BK_GLU") * -(-F // BM) + ks(F, "MMA_BK") * -(-D // BM))
    assert out[False][2] == full * per_tile8 and out[True][2] == part * per_tile8
    # and equal to numpy: x's rows through each expert
    g = np.einsum("pk,pfk->pf", x[np.arange(P) // k], wg.reshape(E, F, K)[lab])
    u = np.einsum("pk,pfk->pf", x[np.arange(P) // k], wu.reshape(E, F, K)[lab])
    h = act(g, 0) * u
    np.testing.assert_allclose(out[True][0][np.argsort(order)], h, rtol=1e-9, atol=1e-12)


def test_skip_and_wide_match_the_kernel_source():
    """mma_moe_body's ntn (warp_ntn above) and the flags' values as cuda_ops passes them."""
    src = open(f"{ROOT}/kernels/mma.cuh").read()
    assert "const int ntn = (flags & MOE_SKIP) ? min(2, max(0, (nr - (cw >> 1) * MMA_WN + 7) / 8)) : 2;" in src
    assert re.search(r"#define MOE_SKIP 1\b", src) and re.search(r"#define MOE_WIDE 2\b", src)
    assert (cuda_ops.MOE_SKIP, cuda_ops.MOE_WIDE, cuda_ops.MMA_WIDE) == (1, 2, 4)
    assert re.search(r"#define MMA_WIDE 4\b", src)
    for nr in range(1, BN + 1):  # a warp multiplies exactly the 8-token tiles holding rows < nr
        for cw in range(WARPS):
            wn = (cw >> 1) * WN
            assert warp_ntn(nr, cw, True) == sum(wn + 8 * nt < nr for nt in range(2))


def test_bench_moe_tile_runs_on_the_numpy_oracle():
    """opchecks.bench_moe_tile (scripts/gpu/gpu-moetile's timing) on the numpy backend dressed
    with the switches and a fake event clock, at small shapes: every variant timed, restored
    afterwards, same_bits true (numpy ignores the switches), a speedup reported."""
    from reflex_ipc.testing import opchecks

    class Ev:
        t = [0.0]

        def record(self, stream):
            Ev.t[0] += 1.0
            self.at = Ev.t[0]

        def synchronize(self):
            pass

        def time_since(self, other):
            return self.at - other.at

    class Ops(NumpyOps):
        moe_mma, moe_mma_min_n, moe_skip, mma_wide, wide_launches = False, 48, True, True, 0

        class rt:
            stream = None

            class drv:
                Event = Ev

        def synchronize(self):
            pass

    ops = Ops(blas_threads=None)
    rows = opchecks.bench_moe_tile(ops, np.random.default_rng(0), shapes=("tiny",), N=40, rounds=2, reps=2,
                                   table={"tiny": (8, 2, 256, 256, "Q4_K", "Q6_K")}, dense=(("Q4_K", 96, 256),))
    assert [r["case"] for r in rows] == ["moe tiny N=40", "matmul Q4_K 256->96 N=40"]
    for r in rows:
        assert r["same_bits"] and r["speedup"] > 0
        assert {f"skip{a}_wide{b}_us" for a in (0, 1) for b in (0, 1)} <= set(r)
    assert (ops.moe_skip, ops.mma_wide, ops.moe_mma, ops.moe_mma_min_n) == (True, True, False, 48)


def test_unique_ids_equals_np_unique():
    from reflex_ipc.backends.base import unique_ids

    rng = np.random.default_rng(0)
    for shape in [(0,), (1,), (1, 8), (7, 8), (2330, 8), (3, 1)]:
        a = rng.integers(0, 128, size=shape)
        got = unique_ids(a)
        assert got.dtype == a.dtype and np.array_equal(got, np.unique(a)), shape
    assert unique_ids([5, 5, 5]).tolist() == [5]
