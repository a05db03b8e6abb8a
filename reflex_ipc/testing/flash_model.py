"""A numpy model of kernels/flash.cuh's tiling, for tests/test_flash_tiling.py (which
checks it against the float64 attention reference and describes what it models) and for the
tests that run flash_attention through it (tests/test_mla_ops.py)."""

import itertools

import numpy as np

from reflex_ipc.backends import cuda_ops

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
