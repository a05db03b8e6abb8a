"""A numpy model of kernels/flash.cuh's tiling (no GPU needed): rows n * G + (h % G) of one kv
head, FLASH_BM rows a block in warps of 16, the block's key range = the union of its rows'
visible ranges walked in tiles of BN keys from the tile holding its smallest key, keys of a
tile outside that range loaded as zeros, warps whose rows see nothing in a tile skipping it,
per-element softcap / visibility / mask, online softmax in exp2 form with the same guards
(-inf running max), optional f16 rounding of the scaled Q and of P, and out = O / l (0 when
l = 0). Checked against the float64 attention reference on the shapes and cases the op
checks run on the GPU, with NaN planted in every cache slot the kernel must not read. And one
warp's registers lane by lane (the mma.m16n8k16 fragments of Q, K, P, V and O, ldmatrix.trans
for V) against Q K^T and P V."""

import itertools

import numpy as np
import pytest

from reflex_ipc.backends import cuda_ops
from reflex_ipc.testing.references import attention_ref

BM = cuda_ops.FLASH_BM
WARPS = BM // 16
LOG2E = 1.4426950408889634


def bn_of(hd):
    return 64 if hd <= 128 else 32  # FlashCfg<HD>::BN


def flash_emulate(q, K, V, pos, n_kv, scale, softcap=0.0, causal=True, window=0, mask=None, f16=True,
                  chunk=0, S=1):
    """q [N, Hq, hd]; K [Hkv, ctx, hd], V [Hkv, ctx, dv] (the caches, read only where the kernel
    reads; dv = hd but for the decompressed latent heads, 192 / 128). S > 1: key shares of
    `chunk` keys (grid z), partials merged as attention_combine does."""
    N, Hq, hd = q.shape
    Hkv, ctx, _ = K.shape
    dv = V.shape[2]
    G = Hq // Hkv
    BN = bn_of(hd)
    rows = N * G
    out = np.full((N, Hq, dv), np.nan)
    part_ml = np.full((N, Hq, S, 2), np.nan)
    part_acc = np.full((N, Hq, S, dv), np.nan)
    n_tiles = -(-rows // BM)
    for kvh, by, z in itertools.product(range(Hkv), range(n_tiles), range(S)):
        tile = n_tiles - 1 - by  # the kernel's order; each block is independent
        # per row: query, head, [lo, hi] (empty: lo = INT_MAX, hi = -1)
        r = tile * BM + np.arange(BM)
        valid = r < rows
        rn = np.where(valid, r // G, 0)
        rh = np.where(valid, kvh * G + r % G, 0)
        p = np.asarray(pos)[rn]
        hi = np.minimum(p, n_kv - 1) if causal else np.full(BM, n_kv - 1)
        lo = np.maximum(0, p - window + 1) if window > 0 else np.zeros(BM, int)
        ok = valid & (lo <= hi)
        rlo = np.where(ok, lo, 2**31 - 1)
        rhi = np.where(ok, hi, -1)
        wlo = rlo.reshape(WARPS, 16).min(1)
        whi = rhi.reshape(WARPS, 16).max(1)
        blo, bhi = int(wlo.min()), int(whi.max())
        if S > 1:
            assert chunk % 64 == 0
            blo, bhi = max(blo, z * chunk), min(bhi, z * chunk + chunk - 1)
            if blo > bhi:
                bhi = -1
        Q = np.where(valid[:, None], q[rn, rh] * scale, 0)
        if f16:  # the kernel: float32 q * scale, rounded to f16
            Q = (q[rn, rh].astype(np.float32) * np.float32(scale)).astype(np.float16)
            Q = np.where(valid[:, None], Q.astype(np.float64), 0)
        m = np.full(BM, -np.inf)
        l = np.zeros(BM)
        O = np.zeros((BM, dv))
        k0 = blo // BN * BN if bhi >= 0 else 1
        while k0 <= bhi:
            j = k0 + np.arange(BN)
            inr = (j >= blo) & (j <= bhi)
            jc = np.clip(j, 0, ctx - 1)
            Kt = np.where(inr[:, None], K[kvh, jc], 0).astype(np.float64)
            Vt = np.where(inr[:, None], V[kvh, jc], 0).astype(np.float64)
            for w in range(WARPS):
                if not (k0 <= whi[w] and k0 + BN - 1 >= wlo[w]):
                    continue  # the warp's rows see nothing here
                sl = slice(16 * w, 16 * w + 16)
                s = Q[sl] @ Kt.T  # [16, BN]
                if softcap > 0:
                    s = softcap * np.tanh(s / softcap)
                hid = (j[None, :] < rlo[sl, None]) | (j[None, :] > rhi[sl, None])
                if mask is not None:
                    mj = np.where(hid, 0.0, mask[rn[sl][:, None], np.clip(j, 0, n_kv - 1)[None, :]])
                    s = s + mj
                s = np.where(hid, -np.inf, s)
                mx = s.max(1)
                mn = np.maximum(m[sl], mx)
                mu = np.where(mn == -np.inf, 0.0, mn)
                corr = np.exp2((m[sl] - mu) * LOG2E)
                m[sl] = mn
                P = np.exp2((s - mu[:, None]) * LOG2E)
                l[sl] = l[sl] * corr + P.sum(1)
                if f16:
                    P = P.astype(np.float16).astype(np.float64)
                O[sl] = O[sl] * corr[:, None] + P @ Vt
            k0 += BN
        inv = np.where(l > 0, 1 / np.where(l > 0, l, 1), 0.0)
        for i in np.nonzero(valid)[0]:
            if S > 1:
                part_ml[rn[i], rh[i], z] = m[i], l[i]
                part_acc[rn[i], rh[i], z] = O[i]
            else:
                out[rn[i], rh[i]] = O[i] * inv[i]
    if S > 1:  # attention_combine
        M = part_ml[..., 0].max(-1)
        A = np.zeros((N, Hq, dv))
        L = np.zeros((N, Hq))
        for z in range(S):
            mz = part_ml[:, :, z, 0]
            seen = mz != -np.inf
            f = np.exp(np.where(seen, mz - np.where(seen, M, 0), -np.inf))
            L += np.where(seen, part_ml[:, :, z, 1] * f, 0)
            A += np.where(seen[..., None], part_acc[:, :, z] * f[..., None], 0)
        out = np.where(L[..., None] > 0, A / np.where(L > 0, L, 1)[..., None], 0)
    return out


def make_cache(rng, Hkv, ctx, hd, n_kv, dv=None):
    """f16-valued K [Hkv, ctx, hd], V [Hkv, ctx, dv or hd] with NaN in every slot >= n_kv (never
    to be read)."""
    K = rng.standard_normal((Hkv, ctx, hd)).astype(np.float16).astype(np.float64)
    V = rng.standard_normal((Hkv, ctx, dv or hd)).astype(np.float16).astype(np.float64)
    K[:, n_kv:] = np.nan
    V[:, n_kv:] = np.nan
    return K, V


CASES = [  # (N, hd, Hq, Hkv, past, kwargs)
    (16, 64, 16, 16, 0, {}),
    (17, 128, 16, 8, 0, {}),
    (64, 256, 8, 1, 0, {}),
    (100, 128, 16, 2, 0, {}),
    (100, 64, 8, 1, 37, {}),  # a second chunk: keys before the queries
    (512, 128, 16, 8, 0, {}),
    (70, 128, 16, 8, 50, {"window": 33}),
    (40, 256, 4, 1, 10, {"softcap": 5.0}),
    (33, 64, 16, 2, 20, {"causal": False}),
    (33, 128, 8, 8, 20, {"mask": True}),
    (130, 192, 16, 16, 0, {"dv": 128}),  # DeepSeek's decompressed latent heads (CudaOps.mla_attention)
    (70, 192, 16, 16, 45, {"dv": 128}),
    (33, 192, 4, 4, 20, {"dv": 128, "mask": True}),
]


@pytest.mark.parametrize("N,hd,Hq,Hkv,past,kw", CASES)
def test_flash_tiling_matches_attention(N, hd, Hq, Hkv, past, kw):
    rng = np.random.default_rng(N * 1000 + hd + past)
    n_kv = past + N
    ctx = n_kv + 40
    kw = dict(kw)
    K, V = make_cache(rng, Hkv, ctx, hd, n_kv, kw.pop("dv", None))
    q = rng.standard_normal((N, Hq, hd)).astype(np.float32)
    pos = np.arange(past, n_kv)
    scale = 1 / np.sqrt(hd)
    causal = kw.pop("causal", True)
    mask = None
    if kw.pop("mask", False):
        causal = False
        mask = np.where(rng.random((N, n_kv)) < 0.3, -np.inf, 0.0)
        mask[:, 0] = 0
        mask[3] = -np.inf
        mask[3, 7] = 0  # one visible key
        mask[5] = -np.inf  # none: zeros
    ref = attention_ref(q, K, V, pos, n_kv, scale, kw.get("softcap", 0.0), causal, kw.get("window", 0), mask)
    # the kernel's n_kv: n_slots for causal without a mask (CudaOps.attention)
    kn = ctx if causal and mask is None else n_kv
    exact = flash_emulate(q.astype(np.float64), K, V, pos, kn, scale, causal=causal, mask=mask, f16=False, **kw)
    assert np.all(np.isfinite(exact))
    np.testing.assert_allclose(exact, ref, rtol=0, atol=1e-9)
    if mask is not None:
        assert np.all(exact[5] == 0)
    rounded = flash_emulate(q, K, V, pos, kn, scale, causal=causal, mask=mask, f16=True, **kw)
    err = np.linalg.norm(rounded - ref) / np.linalg.norm(ref)
    assert err < 2e-3, err


SPLIT_CASES = [  # (N, hd, Hq, Hkv, past, kwargs): few row tiles over many keys
    (16, 128, 16, 8, 2000, {}),
    (24, 64, 16, 2, 1500, {"mask": True}),
    (32, 256, 16, 2, 1200, {"window": 300}),
    (40, 128, 16, 8, 1100, {"softcap": 20.0}),
    (20, 192, 16, 16, 1300, {"dv": 128}),
]


@pytest.mark.parametrize("N,hd,Hq,Hkv,past,kw", SPLIT_CASES)
def test_flash_split_keys_match_attention(N, hd, Hq, Hkv, past, kw):
    """The split form as CudaOps plans it (_flash_split on an H200's 132 SMs), eager (shares
    over the keys in use) and captured (over every slot, most shares empty)."""
    rng = np.random.default_rng(N + hd + past)
    n_kv = past + N
    ctx = n_kv + 300
    kw = dict(kw)
    K, V = make_cache(rng, Hkv, ctx, hd, n_kv, kw.pop("dv", None))
    q = rng.standard_normal((N, Hq, hd))
    pos = np.arange(past, n_kv)
    mask = None
    causal = True
    if kw.pop("mask", False):
        causal = False
        mask = np.where(rng.random((N, n_kv)) < 0.5, -np.inf, 0.0)
        mask[:, -1] = 0
        mask[2] = -np.inf
        mask[3] = -np.inf
        mask[3, 5] = 0
    ref = attention_ref(q, K, V, pos, n_kv, 0.1, kw.get("softcap", 0.0), causal, kw.get("window", 0), mask)
    ops = cuda_ops.CudaOps.__new__(cuda_ops.CudaOps)
    ops._sms = 132
    tiles = Hkv * -(-N * (Hq // Hkv) // BM)
    kn = ctx if causal else n_kv
    for span in (n_kv, kn):
        chunk, S = ops._flash_split(tiles, span)
        assert S > 1 and chunk % 64 == 0 and (S - 1) * chunk < span <= S * chunk
        out = flash_emulate(q, K, V, pos, kn, 0.1, causal=causal, mask=mask, f16=False, chunk=chunk, S=S, **kw)
        np.testing.assert_allclose(out, ref, rtol=0, atol=1e-9)
    if mask is not None:
        assert np.all(out[2] == 0)


def test_flash_tiling_arbitrary_positions():
    """Queries in any order with gaps (system1-like slots), a window: ranges per row."""
    rng = np.random.default_rng(5)
    hd, Hq, Hkv, N, n_kv = 64, 8, 2, 80, 300
    K, V = make_cache(rng, Hkv, n_kv, hd, n_kv)
    q = rng.standard_normal((N, Hq, hd))
    pos = rng.permutation(n_kv)[:N]
    for window in (0, 20):
        ref = attention_ref(q, K, V, pos, n_kv, 0.1, 0.0, True, window, None)
        out = flash_emulate(q, K, V, pos, n_kv, 0.1, window=window, f16=False)
        np.testing.assert_allclose(out, ref, rtol=0, atol=1e-9)


def test_flash_constants_match_the_kernel():
    import os
    import re

    src = open(os.path.join(os.path.dirname(__file__), "..", "kernels", "flash.cuh")).read()
    warps = int(re.search(r"#define FLASH_WARPS (\d+)", src).group(1))
    assert cuda_ops.FLASH_BM == 16 * warps == BM
    assert cuda_ops.FLASH_THREADS == 32 * warps
    assert "HD <= 128 ? 64 : 32" in src  # bn_of
    for hd in cuda_ops.FLASH_HD:
        assert f"RX_FLASH({hd})" in src
    assert "RX_FLASH_KV(192_128, 192, 128)" in src


def test_flash_op_check_runs_on_the_numpy_oracle():
    """opchecks.check_flash_attention (run on CUDA by scripts/gpu/gpu-check) on the numpy backend:
    the check itself runs and its references agree with numpy's attention (numpy keeps K/V in
    float32, so it differs from the f16-rounded reference by K/V rounding, ~3e-4)."""
    from reflex_ipc.backends.numpy_ops import NumpyOps
    from reflex_ipc.testing import opchecks

    ops = NumpyOps(blas_threads=None)
    rows = opchecks.check_flash_attention(ops, np.random.default_rng(0))
    assert len(rows) >= len(opchecks.FLASH_CASES)
    bad = [r for r in rows if not r["ok"]]
    assert not bad, bad
    rows = opchecks.check_attention(ops, np.random.default_rng(0))
    assert all(r["tol"] in (0.0, 1e-5, 1e-6) for r in rows)  # no flash kernel here: float32 bounds


# -- one warp's registers (kernels/flash.cuh's fragment indexing, lane by lane) -------------
def ldmatrix_x4_trans(smem, LD, addr):
    """ldmatrix.sync.aligned.m8n8.x4.trans.b16: lane L gives the address (in halves) of row
    L & 7 of matrix L >> 3 (8 contiguous halves); with .trans lane L receives, in register i,
    elements (row 2 (L & 3), col L >> 2) and (row 2 (L & 3) + 1, col L >> 2) of matrix i."""
    out = np.zeros((32, 4, 2))
    for i in range(4):
        rows = np.array([smem[addr[8 * i + r]:addr[8 * i + r] + 8] for r in range(8)])  # [8, 8]
        for L in range(32):
            out[L, i] = rows[2 * (L & 3), L >> 2], rows[2 * (L & 3) + 1, L >> 2]
    return out


@pytest.mark.parametrize("HD,HDV,BN", [(64, 64, 64), (128, 128, 64), (256, 256, 32), (192, 128, 32)])
def test_warp_fragments_compute_qk_and_pv(HD, HDV, BN):
    """The kernel's register-level S = Q K^T and O += P V for one warp (16 rows) and one key
    tile, built from the mma.m16n8k16 fragment layout (reflex_ipc.testing.mma_fragments): Q's A
    fragments, K's B fragments from the padded shared tile, P's A fragments taken from S's
    accumulators, V's B fragments by ldmatrix.x4.trans, O's accumulators -> rows / dims."""
    from reflex_ipc.testing.mma_fragments import G, T, c_coords, warp_mma

    rng = np.random.default_rng(HD + BN)
    LD, LDV = HD + 8, HDV + 8
    Q = rng.standard_normal((16, HD)).astype(np.float16).astype(np.float64)
    Kt = rng.standard_normal((BN, HD)).astype(np.float16).astype(np.float64)
    Vt = rng.standard_normal((BN, HDV)).astype(np.float16).astype(np.float64)
    sk = np.full(BN * LD, np.nan)
    sv = np.full(BN * LDV, np.nan)  # the padding columns must never be read
    for r in range(BN):
        sk[r * LD:r * LD + HD] = Kt[r]
        sv[r * LDV:r * LDV + HDV] = Vt[r]
    # S: a[kt] = (row g, 2t..), (row g+8, 2t..), (row g, 2t+8..), (row g+8, 2t+8..) of Q
    s = np.zeros((BN // 8, 32, 4))
    for kt in range(HD // 16):
        c0 = kt * 16 + 2 * T
        a = np.stack([Q[G, c0], Q[G, c0 + 1], Q[G + 8, c0], Q[G + 8, c0 + 1],
                      Q[G, c0 + 8], Q[G, c0 + 9], Q[G + 8, c0 + 8], Q[G + 8, c0 + 9]], 1)
        for nt in range(BN // 8):
            kp = (nt * 8 + G) * LD + kt * 16 + 2 * T
            b = np.stack([sk[kp], sk[kp + 1], sk[kp + 8], sk[kp + 9]], 1)
            s[nt] = warp_mma(a, b, s[nt])
    S = np.zeros((16, BN))
    for nt in range(BN // 8):
        for i in range(4):
            r, c = c_coords(i)
            S[r, nt * 8 + c] = s[nt][:, i]
    np.testing.assert_allclose(S, Q @ Kt.T, rtol=1e-12, atol=1e-9)
    # P V: pa = s[2kk][0..1], s[2kk][2..3], s[2kk+1][0..1], s[2kk+1][2..3] (as f16)
    p = np.abs(s) / 10
    P = np.zeros((16, BN))
    for nt in range(BN // 8):
        for i in range(4):
            r, c = c_coords(i)
            P[r, nt * 8 + c] = p[nt][:, i]
    o = np.zeros((HDV // 8, 32, 4))
    lane = np.arange(32)
    for kk in range(BN // 16):
        a = np.concatenate([p[2 * kk][:, 0:2], p[2 * kk][:, 2:4], p[2 * kk + 1][:, 0:2], p[2 * kk + 1][:, 2:4]], 1)
        vrow = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8
        for dp in range(HDV // 16):
            addr = vrow * LDV + (lane >> 4) * 8 + dp * 16
            r = ldmatrix_x4_trans(sv, LDV, addr)  # [32, 4 registers, 2 halves]
            o[2 * dp] = warp_mma(a, np.concatenate([r[:, 0], r[:, 1]], 1), o[2 * dp])
            o[2 * dp + 1] = warp_mma(a, np.concatenate([r[:, 2], r[:, 3]], 1), o[2 * dp + 1])
    O = np.full((16, HDV), np.nan)
    for d in range(HDV // 8):  # the store: rows g / g + 8, dims d * 8 + 2t (+1)
        for i in range(4):
            rr, c = c_coords(i)
            O[rr, d * 8 + c] = o[d][:, i]
    np.testing.assert_allclose(O, P @ Vt, rtol=1e-12, atol=1e-9)
