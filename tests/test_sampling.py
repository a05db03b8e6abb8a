"""Sampler: greedy, truncations (top-k, top-p, min-p), temperature, seeds, repetition penalty."""

import numpy as np
import pytest

from reflex_ipc.generation.processors import apply_repeat_penalty
from reflex_ipc.generation.selectors import Sampler

LOGITS = np.log(np.array([0.05, 0.4, 0.1, 0.3, 0.15], np.float64)).astype(np.float32)


def freqs(sampler, logits, n=20000):
    counts = np.bincount([sampler(logits) for _ in range(n)], minlength=len(logits))
    return counts / n


def softmax(z):
    e = np.exp(z - z.max())
    return e / e.sum()


def test_greedy_first_index_on_ties():
    s = Sampler(temperature=0.0)
    assert s.greedy
    assert s(np.array([1.0, 5.0, 5.0, 2.0], np.float32)) == 1


def test_plain_sampling_follows_softmax():
    f = freqs(Sampler(temperature=1.0, seed=0), LOGITS)
    np.testing.assert_allclose(f, softmax(LOGITS.astype(np.float64)), atol=0.015)


def test_temperature_sharpens_and_flattens():
    cold = freqs(Sampler(temperature=0.5, seed=1), LOGITS, 10000)
    np.testing.assert_allclose(cold, softmax(LOGITS / 0.5), atol=0.015)
    hot = freqs(Sampler(temperature=4.0, seed=1), LOGITS, 10000)
    np.testing.assert_allclose(hot, softmax(LOGITS / 4.0), atol=0.015)


def test_top_k():
    f = freqs(Sampler(temperature=1.0, top_k=2, seed=2), LOGITS, 10000)
    expect = np.zeros(5)
    expect[[1, 3]] = np.array([0.4, 0.3]) / 0.7
    np.testing.assert_allclose(f, expect, atol=0.015)


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    # sorted probabilities 0.4, 0.3, 0.15, ...: top_p 0.7 keeps two, 0.71 keeps three
    f = freqs(Sampler(temperature=1.0, top_p=0.69, seed=3), LOGITS, 5000)
    assert set(np.flatnonzero(f)) == {1, 3}
    f = freqs(Sampler(temperature=1.0, top_p=0.71, seed=3), LOGITS, 5000)
    assert set(np.flatnonzero(f)) == {1, 3, 4}


def test_min_p_relative_to_the_best():
    # keeps p >= min_p * 0.4: 0.3 and 0.15 pass at 0.35, 0.1 does not
    f = freqs(Sampler(temperature=1.0, min_p=0.35, seed=4), LOGITS, 5000)
    assert set(np.flatnonzero(f)) == {1, 3, 4}
    assert set(np.flatnonzero(freqs(Sampler(temperature=1.0, min_p=1.0, seed=4), LOGITS, 200))) == {1}


def test_seed_reproducible():
    s1, s2 = Sampler(temperature=1.0, seed=42), Sampler(temperature=1.0, seed=42)
    assert [s1(LOGITS) for _ in range(50)] == [s2(LOGITS) for _ in range(50)]
    s3 = Sampler(temperature=1.0, seed=43)
    s1 = Sampler(temperature=1.0, seed=42)
    assert [s1(LOGITS) for _ in range(50)] != [s3(LOGITS) for _ in range(50)]


def test_repeat_penalty_llama_cpp_semantics():
    z = np.array([2.0, -2.0, 3.0, -1.0], np.float32)
    apply_repeat_penalty(z, [0, 1, 1, 1, 7, -1], 2.0)  # repeats count once; out of range ignored
    np.testing.assert_allclose(z, [1.0, -4.0, 3.0, -1.0])
    z2 = np.array([1.0, -1.0], np.float32)
    apply_repeat_penalty(z2, [0, 1], 1.0)
    np.testing.assert_allclose(z2, [1.0, -1.0])


@pytest.mark.parametrize("kw", [dict(top_k=3), dict(top_p=0.9), dict(min_p=0.1), dict()])
def test_sample_is_always_a_valid_id(kw):
    z = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    s = Sampler(temperature=0.8, seed=5, **kw)
    for _ in range(100):
        assert 0 <= s(z) < 1000
