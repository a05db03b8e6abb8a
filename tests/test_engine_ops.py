"""The numpy backend ops against straightforward float64 references (base.py semantics)."""

import math

import numpy as np
import pytest

from reflex_ipc.backends.base import OPS, missing_ops
from reflex_ipc.backends.numpy_ops import NumpyOps
from reflex_ipc.testing.references import attention_ref  # base.py's formula in float64

rng = np.random.default_rng(1234)


@pytest.fixture(scope="module")
def ops():
    return NumpyOps()


def f32(*shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def test_numpy_backend_provides_every_op(ops):
    assert missing_ops(ops) == []
    assert missing_ops(object()) == list(OPS)


def test_matmul_and_accumulate(ops):
    x, w = f32(5, 32), f32(7, 32)
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    np.testing.assert_allclose(ops.matmul(x, w), ref, rtol=1e-5, atol=1e-5)
    out = f32(5, 7)
    expect = out.astype(np.float64) + ref
    ops.matmul(x, w, out=out, accumulate=True)
    np.testing.assert_allclose(out, expect, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError):
        ops.matmul(f32(2, 31), w)


def test_embed_rows_and_scale(ops):
    w = f32(10, 8)
    np.testing.assert_array_equal(ops.embed(w, [3, 0, 3]), w[[3, 0, 3]])
    np.testing.assert_allclose(ops.embed(w, [9], scale=2.5), w[[9]] * 2.5, rtol=1e-6)


def test_elementwise(ops):
    a, b, row = f32(4, 6), f32(4, 6), f32(6)
    a64 = a.astype(np.float64)
    np.testing.assert_allclose(ops.add(a, b), a64 + b, rtol=1e-6)
    np.testing.assert_allclose(ops.add(a, row), a64 + row, rtol=1e-6)
    np.testing.assert_allclose(ops.mul(a, row), a64 * row, rtol=1e-6)
    np.testing.assert_allclose(ops.scale(a, 0.5), a64 * 0.5, rtol=1e-6)
    np.testing.assert_allclose(ops.softcap(a * 20, 15.0), 15.0 * np.tanh(a64 * 20 / 15.0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ops.silu(a), a64 / (1 + np.exp(-a64)), rtol=1e-5, atol=1e-6)
    gelu = 0.5 * a64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (a64 + 0.044715 * a64 ** 3)))
    np.testing.assert_allclose(ops.gelu(a), gelu, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ops.swiglu(a, b), a64 / (1 + np.exp(-a64)) * b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ops.geglu(a, b), gelu * b, rtol=1e-5, atol=1e-6)
    out = np.empty_like(a)
    assert ops.add(a, b, out=out) is out


def test_rms_norm(ops):
    x, w = f32(3, 16, scale=3.0), f32(16)
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(ops.rms_norm(x, w, 1e-5), ref, rtol=1e-5, atol=1e-6)
    # per-head norm: [N, H, hd] with w [hd]; w None = no weight
    xh, wh = f32(3, 4, 8), f32(8)
    xh64 = xh.astype(np.float64)
    refh = xh64 / np.sqrt((xh64 ** 2).mean(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(ops.rms_norm(xh, wh, 1e-6), refh * wh, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ops.rms_norm(xh, None, 1e-6), refh, rtol=1e-5, atol=1e-6)


def rope_ref(x, pos, n_rot, base, freq_scale, neox, factors=None, mscale=1.0):
    x = x.astype(np.float64)
    y = x.copy()
    half = n_rot // 2
    for n in range(x.shape[0]):
        for i in range(half):
            theta = pos[n] * base ** (-2 * i / n_rot) * freq_scale
            if factors is not None:
                theta /= float(factors[i])
            c, s = math.cos(theta), math.sin(theta)
            a, b = (i, i + half) if neox else (2 * i, 2 * i + 1)
            y[n, :, a] = (x[n, :, a] * c - x[n, :, b] * s) * mscale
            y[n, :, b] = (x[n, :, a] * s + x[n, :, b] * c) * mscale
    return y


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("n_rot", [16, 8])
def test_rope(ops, neox, n_rot):
    x = f32(5, 3, 16)
    pos = [0, 1, 7, 100, 3000]
    got = ops.rope(x, ops.positions(pos), n_rot=n_rot, base=10000.0, freq_scale=0.5, neox=neox)
    np.testing.assert_allclose(got, rope_ref(x, pos, n_rot, 10000.0, 0.5, neox), rtol=1e-4, atol=1e-4)
    # a copy unless inplace
    assert not np.shares_memory(got, x)
    ff = (1 + rng.random(n_rot // 2)).astype(np.float32)
    y = x.copy()
    ops.rope(y, ops.positions(pos), n_rot=n_rot, base=500.0, freq_factors=ff, neox=neox, mscale=1.5,
             inplace=True)
    np.testing.assert_allclose(y, rope_ref(x, pos, n_rot, 500.0, 1.0, neox, ff, 1.5), rtol=1e-4, atol=1e-4)


def _filled_cache(ops, n_kv, Hkv=2, hd=8, n_slots=16):
    kc, vc = ops.zeros((Hkv, n_slots, hd), ops.kv_dtype), ops.zeros((Hkv, n_slots, hd), ops.kv_dtype)
    k, v = f32(n_kv, Hkv, hd), f32(n_kv, Hkv, hd)
    ops.kv_store(kc, vc, k, v, ops.positions(range(n_kv)))
    np.testing.assert_array_equal(kc[:, :n_kv], k.transpose(1, 0, 2))
    return (kc, vc), k.transpose(1, 0, 2), v.transpose(1, 0, 2)


@pytest.mark.parametrize("window", [0, 3])
@pytest.mark.parametrize("softcap", [0.0, 2.0])
def test_attention_causal_prefill_and_decode(ops, window, softcap):
    n_kv = 9
    cache, K, V = _filled_cache(ops, n_kv)
    q = f32(n_kv, 6, 8)  # GQA: 6 query heads over 2 KV heads
    pos = list(range(n_kv))
    got = ops.attention(q, *cache, ops.positions(pos), n_kv, scale=0.3, softcap=softcap, window=window)
    ref = attention_ref(q, K, V, pos, n_kv, 0.3, softcap, True, window)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    # decode: the last query alone sees every stored key (or its window)
    got1 = ops.attention(q[-1:], *cache, ops.positions([n_kv - 1]), n_kv, scale=0.3, softcap=softcap,
                         window=window)
    np.testing.assert_allclose(got1, ref[-1:], rtol=1e-4, atol=1e-5)


def test_attention_explicit_mask(ops):
    n_kv = 7
    cache, K, V = _filled_cache(ops, n_kv)
    q = f32(3, 4, 8)
    allowed = rng.random((3, n_kv)) < 0.6
    allowed[:, 0] = True
    allowed[2] = False  # a query that sees nothing gets zeros
    mask = np.where(allowed, 0.0, -np.inf).astype(np.float32)
    pos = [6, 6, 6]
    got = ops.attention(q, *cache, ops.positions(pos), n_kv, scale=0.5, causal=False, mask=ops.asarray(mask))
    ref = attention_ref(q, K, V, pos, n_kv, 0.5, causal=False, mask=mask)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    assert np.all(got[2] == 0)


def test_kv_store_scattered_slots(ops):
    kc, vc = ops.zeros((2, 10, 4)), ops.zeros((2, 10, 4))
    k, v = f32(3, 2, 4), f32(3, 2, 4)
    ops.kv_store(kc, vc, k, v, ops.positions([7, 2, 5]))
    for n, slot in enumerate([7, 2, 5]):
        np.testing.assert_array_equal(kc[:, slot], k[n])
        np.testing.assert_array_equal(vc[:, slot], v[n])


def test_argmax_first_on_ties(ops):
    x = np.array([[1.0, 3.0, 3.0], [5.0, 0.0, 5.0]], np.float32)
    assert ops.argmax(x).tolist() == [1, 0]
    out = ops.empty((2,), "int32")
    assert ops.argmax(x, out=out) is out and ops.to_numpy(out).tolist() == [1, 0]


def test_topk_best_first_lower_index_on_ties(ops):
    x = np.array([[1.0, 3.0, 3.0, -1.0, 7.0]], np.float32)
    assert ops.topk(x, 3).tolist() == [4, 1, 2]
    assert ops.topk(x, 9).tolist() == [4, 1, 2, 0, 3]
    assert ops.topk(x, 2, n=3).tolist() == [1, 2]  # only the first n columns
    assert ops.topk(x, 0).tolist() == []


def test_write_and_copy(ops):
    a = ops.zeros((3, 4))
    assert np.all(ops.to_numpy(a) == 0)
    h = f32(3, 4)
    ops.write(a, h)
    b = ops.copy(a, out=ops.empty((3, 4)))
    np.testing.assert_array_equal(ops.to_numpy(b), h)
    ops.write(a[1], np.zeros(4, np.float32))  # a leading-axis view is written in place
    assert np.all(ops.to_numpy(a)[1] == 0) and np.array_equal(ops.to_numpy(a)[0], h[0])


def test_asarray_positions_to_numpy(ops):
    assert ops.asarray([1, 2]).dtype == np.int32
    assert ops.asarray([1.5]).dtype == np.float32
    assert ops.positions(range(3)).tolist() == [0, 1, 2]
    assert ops.positions(range(3)).dtype == np.int32
    a = f32(2, 2)
    assert ops.to_numpy(a) is a


def test_logprobs_of_chosen_tokens(ops):
    logits = f32(5, 300, scale=8.0)
    rows = [0, 0, 3, 4, 2, 0]
    targets = [7, 299, 0, 250, 5, 12]
    for n in (None, 260):
        z = logits[:, :n].astype(np.float64) if n else logits.astype(np.float64)
        t = [min(x, z.shape[1] - 1) for x in targets]
        ref = [z[r, k] - (z[r].max() + math.log(np.exp(z[r] - z[r].max()).sum())) for r, k in zip(rows, t)]
        out = ops.logprobs(logits, rows, t, n=n)
        assert out.dtype == np.float64 and out.shape == (len(rows),)
        np.testing.assert_allclose(out, ref, rtol=0, atol=1e-12)
    # huge logits do not overflow: the maximum is subtracted first
    big = np.array([[1e4, 1e4 - 1.0, 0.0]], np.float32)
    np.testing.assert_allclose(ops.logprobs(big, [0], [0]), [-math.log1p(math.exp(-1.0))], atol=1e-9)
