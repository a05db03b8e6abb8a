"""The multi-head latent attention ops (deepseek2) and what the CUDA backend runs for them,
checked here without a GPU: opchecks.check_mla on the numpy oracle (the checks themselves),
and numpy models of the indexing of mla.cuh's kernels and of CudaOps' host arguments (YaRN's
correction dims, the key split of the latent attention, the per-head matmul's offsets)."""

import math

import numpy as np
import pytest

from reflex_ipc.backends import cuda_ops
from reflex_ipc.backends.numpy_ops import NumpyOps
from reflex_ipc.testing import opchecks
from reflex_ipc.testing.references import attention_ref


@pytest.fixture(scope="module")
def ops():
    return NumpyOps(blas_threads=None)


def test_gpu_checks_of_the_mla_ops_pass_on_numpy(ops):
    rows = opchecks.check_mla(ops, np.random.default_rng(3))
    assert rows and all(r["ok"] for r in rows), [r for r in rows if not r["ok"]][:3]
    assert {r["op"] for r in rows} >= {"split", "concat", "head_matmul", "rope_yarn", "latent_attention",
                                      "kv_store", "mla_step"}


def _rope_yarn_kernel(x, pos, n_rot, base, freq_scale, ff, neox, mscale, ext, lo, hi):
    """rope_yarn_f32 (mla.cuh) pair by pair, in float64, from CudaOps' host arguments."""
    x = x.astype(np.float64).copy()
    N, H, hd = x.shape
    half = n_rot // 2
    for n in range(N):
        for i in range(half):
            te = base ** (-2.0 * i / n_rot)
            if ff is not None:
                te /= float(ff[i])  # in double, as the kernel
            y = min(1.0, max(0.0, (i - lo) / max(0.001, hi - lo)))
            ramp = (1.0 - y) * ext
            ang = math.fmod(pos[n] * (te * freq_scale * (1 - ramp) + te * ramp), 2 * math.pi)
            s, c = math.sin(ang), math.cos(ang)
            a, b = (i, i + half) if neox else (2 * i, 2 * i + 1)
            x0, x1 = x[n, :, a].copy(), x[n, :, b].copy()
            x[n, :, a] = (x0 * c - x1 * s) * mscale
            x[n, :, b] = (x0 * s + x1 * c) * mscale
    return x


@pytest.mark.parametrize("hd,n_rot,fs,yarn,neox,ff", [
    (8, 8, 0.25, (1.0, 32, 32.0, 1.0), False, False),  # the synthetic deepseek2's
    (64, 64, 1 / 40, (1.0, 4096, 32.0, 1.0), False, False),  # DeepSeek-V2-Lite's
    (40, 24, 0.5, (0.5, 2048, 16.0, 2.0), True, True),
])
def test_yarn_kernel_arguments_match_numpy_rope(ops, hd, n_rot, fs, yarn, neox, ff):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 3, hd)).astype(np.float32)
    pos = np.array([0, 3, 17, 1000, 30000], np.int32)
    factors = rng.uniform(1, 3, n_rot // 2).astype(np.float32) if ff else None
    want = ops.rope(x, pos, n_rot=n_rot, base=10000.0, freq_scale=fs, freq_factors=factors, neox=neox,
                    mscale=0.9, yarn=yarn)
    ext, lo, hi, ms = cuda_ops.yarn_args(yarn, n_rot, 10000.0, fs, 0.9)
    got = _rope_yarn_kernel(x, pos, n_rot, 10000.0, fs, factors, neox, ms, ext, lo, hi)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _mla_attention_kernel(q, lat, pos, n_kv, scale, dv, causal, window, mask, n_rows_for_plan):
    """mla_attention_split over its grid (h, n, s) with CudaOps' split plan, then
    attention_combine, in float64: the per-block key ranges and the partial merge."""
    N, H, dk = q.shape
    chunk, S = cuda_ops.mla_split_plan(n_rows_for_plan, n_kv)
    ml = np.zeros((N * H * S, 2))
    acc = np.full((N * H * S, dv), np.nan)
    for h in range(H):
        for n in range(N):
            for s in range(S):
                slot = (n * H + h) * S + s
                p = int(pos[n])
                hi = min(min(p, n_kv - 1) if causal else n_kv - 1, min(n_kv - 1, (s + 1) * chunk - 1))
                lo = max(max(0, p - window + 1) if window > 0 else 0, s * chunk)
                if lo > hi:
                    ml[slot] = (-np.inf, 0.0)
                    acc[slot] = 0.0
                    continue
                j = np.arange(lo, hi + 1)
                sc = lat[j] @ q[n, h] * scale
                if mask is not None:
                    sc = sc + mask[n, j]
                keep = np.isfinite(sc)
                if not keep.any():
                    ml[slot] = (-np.inf, 0.0)
                    acc[slot] = 0.0
                    continue
                m = sc[keep].max()
                e = np.exp(sc[keep] - m)
                ml[slot] = (m, e.sum())
                acc[slot] = e @ lat[j[keep], :dv]
    out = np.zeros((N, H, dv))
    for h in range(H):
        for n in range(N):
            base = (n * H + h) * S
            M = ml[base:base + S, 0].max()
            a, L = np.zeros(dv), 0.0
            for s in range(S):
                m, l_ = ml[base + s]
                if m == -np.inf:
                    continue
                f = math.exp(m - M)
                L += l_ * f
                a += acc[base + s] * f
            out[n, h] = a / L if L > 0 else 0.0
    return out


@pytest.mark.parametrize("n_kv,N,rows_for_plan,window,masked", [
    (300, 2, 8, 0, False),  # split-K: 128-key blocks, the last one partial
    (1500, 1, 16, 0, False),
    (1500, 2, 16, 300, False),  # a window: leading blocks see nothing
    (700, 2, 8, 0, True),  # a mask, not causal
    (64, 5, 500, 0, False),  # one block per (head, query)
])
def test_latent_attention_split_plan(n_kv, N, rows_for_plan, window, masked):
    rng = np.random.default_rng(n_kv)
    H, dk, dv = 2, 24, 16
    q = rng.standard_normal((N, H, dk))
    lat = rng.standard_normal((n_kv, dk))
    pos = np.arange(n_kv - N, n_kv)
    mask = np.where(rng.random((N, n_kv)) < 0.5, -np.inf, 0.0) if masked else None
    causal = not masked
    got = _mla_attention_kernel(q, lat, pos, n_kv, 0.2, dv, causal, window, mask, rows_for_plan)
    want = attention_ref(q, lat[None], lat[None, :, :dv], pos, n_kv, 0.2, 0.0, causal, window, mask)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_head_matmul_indexing():
    """hmm (mla.cuh): warp `row` of H*M reads head h = row // M at x + t*H*K + h*K and writes
    y + t*H*M + row; that is y[n, h] = w[h] @ x[n, h]."""
    rng = np.random.default_rng(2)
    N, H, M, K = 3, 4, 5, 16
    x = rng.standard_normal((N, H, K))
    w = rng.standard_normal((H * M, K))
    xf, y = x.reshape(-1), np.zeros(N * H * M)
    for row in range(H * M):
        h = row // M
        for t in range(N):
            y[t * H * M + row] = w[row] @ xf[t * H * K + h * K:t * H * K + h * K + K]
    np.testing.assert_allclose(y.reshape(N, H, M), NumpyOps(blas_threads=None).head_matmul(x, w), rtol=1e-12)


def test_auto_without_cuda_runs_deepseek2_on_numpy(monkeypatch):
    """deepseek2 is in models.CUDA_TOO: device auto tries CUDA, and without it falls back to
    numpy (the cpu backend lacks the latent attention ops), not to cpu."""
    from reflex_ipc import cuda, engine
    from reflex_ipc.models import CUDA_TOO, NUMPY_ONLY

    assert "deepseek2" in CUDA_TOO and set(CUDA_TOO) <= set(NUMPY_ONLY)
    monkeypatch.setattr(cuda, "start_init", lambda: False)
    assert engine.make_backend("auto", "numpy").name == "numpy"
