"""Parity of the CPU engine with llama.cpp, on goldens recorded by
scripts/fixtures/record_goldens.py (llama-cpp-python 0.3.36) in tests/goldens/.

For every golden model (SmolLM2 and the synthetic GGUFs of tests/data/) and prompt, against
two llama.cpp references:

1. llama.cpp on the model as it is (quantized weights, F16 KV cache, the default settings):
   - tokenization equals llama.cpp's (special tokens parsed, the model's add_bos);
   - logits after the prompt: max|ours - llama.cpp| / max|llama.cpp logit| within
     max(1e-2, 1.5 * rounding_noise);
   - greedy 32 tokens (temperature 0) are llama.cpp's; a divergence passes only at a step
     where llama.cpp's top two logits were within max(0.5%, rounding_noise_top) of
     max|logit| and our token was one of the near-tied ones; the rest of that sequence is
     then not compared.
2. llama.cpp in exact arithmetic (the model's weights dequantized to F32, F32 KV cache: no
   rounding of activations anywhere), which is what a float engine computes:
   - logits after the prompt within 1e-3 * max|logit|;
   - greedy 32 tokens identical, a divergence passing only at a top-2 gap < 0.5%.
   The cpu backend is held there to llama.cpp's own distance from exact arithmetic: a
   divergence passes at a gap < rounding_noise_top (as against 1.), or where our logits of
   llama.cpp's best token and of ours (in its top 5) are each within rounding_noise_top of
   llama.cpp's: a gap is the difference of two logits, so that distance flips gaps up to
   twice it (seen on an AVX2-only host: synthetic-qwen3 code_unicode step 20, gap 2.03%,
   our two logits 1.5% and 0.5% away, with llama.cpp's noise 2.0%).

Every test runs on both CPU backends: `numpy` (the float32 oracle, held to all of the
above) and `cpu` (the compiled kernels). The cpu backend rounds activations to int8 per
block and keeps an F16 KV cache, as llama.cpp does, so its reference is llama.cpp on the
quantized model (1.); against exact arithmetic (2.) it is held to the quantized bounds
(logit_bound, tie_rel), i.e. to llama.cpp's own distance from exact arithmetic. Against
quantized llama.cpp two independent roundings of that size meet (ours and llama.cpp's), so
its logit bound there is CPU_NOISE_FACTOR (2.0, about sqrt(2) with a margin) times the noise.
Measured on these goldens (commit of issue 18): cpu vs exact 0.64-1.31x rounding_noise,
cpu vs quantized llama.cpp 0.55-1.53x.
$REFLEX_PARITY_DEVICES (default "numpy,cpu") narrows the list.

rounding_noise (recorded per prompt) is max|quantized llama.cpp - exact llama.cpp| /
max|logit| (rounding_noise_top: over llama.cpp's 20 best tokens). llama.cpp rounds
activations to 8 bits in quantized matmuls (F16 for F16 weights and the KV cache); on these
models that alone moves its logits by 2-4% of max|logit| and flips greedy choices at gaps
up to ~0.7%. llama.cpp does not meet a fixed 1e-2 even against itself with an F32 instead
of an F16 KV cache (`self_noise` in the goldens), so bounds against the quantized run are
scaled by that noise (never looser than 1e-2 / 0.5%); the exact run is held to tight fixed
bounds.
"""

import hashlib
import json
import os

import numpy as np
import pytest

from reflex_ipc import settings
from reflex_ipc.testing.parity import (CPU_NOISE_FACTOR, EXACT_REL_TOL, LOGIT_REL_TOL, NOISE_FACTOR,  # noqa: F401
                                      TIE_REL, greedy_verdict, logit_error)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOLDENS = os.path.join(ROOT, "tests", "goldens")


def logit_bound(p, factor=NOISE_FACTOR):
    return max(LOGIT_REL_TOL, factor * p["rounding_noise"])


def tie_rel(p):
    return max(TIE_REL, p["rounding_noise_top"])


def _goldens():
    out = {}
    for fn in sorted(os.listdir(GOLDENS)):
        if fn.endswith(".json"):
            with open(os.path.join(GOLDENS, fn), encoding="utf-8") as f:
                out[fn[:-5]] = json.load(f)
    return out


GOLDEN = _goldens()
DEVICES = [d for d in settings.get().parity_devices.split(",") if d]
CASES = [pytest.param(name, i, dev, id=f"{dev}-{name}-{p['kind']}")
         for dev in DEVICES for name, g in GOLDEN.items() for i, p in enumerate(g["prompts"])]


# --- the rules: reflex_ipc.testing.parity (checked on their own below) -----------------


# --- the engine --------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _smollm2_when_named(request):
    """The SmolLM2 goldens need SmolLM2 (the conftest fixture skips, or fails in CI)."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.params.get("name") == "smollm2":
        request.getfixturevalue("smollm2")


_RUNNERS = {}
_GREEDY = {}


def _model_path(g):
    if g["model"] == "smollm2":
        from reflex_ipc.modelpath import resolve_model

        return resolve_model(None)
    return os.path.join(ROOT, g["model"])


def runner_for(name, device="numpy"):
    if (name, device) not in _RUNNERS:
        from reflex_ipc.engine import load_runner

        g = GOLDEN[name]
        path = _model_path(g)
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        assert h.hexdigest() == g["sha256"], f"{path} is not the file the golden {name} was recorded on"
        r = load_runner(path, device=device, n_ctx=g["settings"]["n_ctx"])
        assert r.ops.name == device, f"asked for the {device} backend, got {r.ops.name}"
        _RUNNERS[name, device] = r
    return _RUNNERS[name, device]


@pytest.fixture(scope="module", autouse=True)
def _close_runners():
    yield
    for r in _RUNNERS.values():
        r.close()
    _RUNNERS.clear()
    _GREEDY.clear()


def greedy_output(name, i, device="numpy"):
    """The engine's greedy continuation of prompt i (computed once for both references)."""
    if (name, i, device) not in _GREEDY:
        g = GOLDEN[name]
        r = runner_for(name, device)
        p = g["prompts"][i]
        backends = []  # the backend that computed each step's logits (reflex check records it too)
        logits = []  # per step, ours for the tokens of both references' top 5 there

        def seen(step, row):
            backends.append(r.ops.name)
            toks = {int(t) for ref in (p["steps"], p["exact_steps"]) if step < len(ref)
                    for t, _ in ref[step]["top5"]}
            logits.append({t: float(row.reshape(-1)[t]) for t in toks})
        out = r.generate(p["text"], max_tokens=g["steps"], temperature=0.0, on_logits=seen)
        out["step_backends"] = backends
        out["step_logits"] = logits
        _GREEDY[name, i, device] = out
    return _GREEDY[name, i, device]


def _first_logits(name, p, key="first_logits"):
    with np.load(os.path.join(GOLDENS, name + ".npz")) as z:
        return z[p[key]]


# --- parity --------------------------------------------------------------------------------
@pytest.mark.parametrize("name,i,device", CASES)
def test_tokenization(name, i, device):
    p = GOLDEN[name]["prompts"][i]
    ids = runner_for(name, device).tokenize(p["text"], add_bos=p["add_bos"], parse_special=True)
    assert ids == p["ids"]


@pytest.mark.parametrize("name,i,device", CASES)
def test_first_logits(name, i, device):
    p = GOLDEN[name]["prompts"][i]
    ref = _first_logits(name, p)
    ours = runner_for(name, device).prompt_logits(p["ids"])
    err = logit_error(ours, ref)
    bound = logit_bound(p, NOISE_FACTOR if device == "numpy" else CPU_NOISE_FACTOR)
    assert err <= bound, (f"max|diff| / max|logit| = {err:.3g} (bound {bound:.3g}; llama.cpp's "
                          f"rounding noise {p['rounding_noise']:.3g}); argmax ours "
                          f"{int(np.argmax(ours))} llama.cpp {int(np.argmax(ref))}")


@pytest.mark.parametrize("name,i,device", CASES)
def test_first_logits_exact(name, i, device):
    p = GOLDEN[name]["prompts"][i]
    ref = _first_logits(name, p, "exact_logits")
    ours = runner_for(name, device).prompt_logits(p["ids"])
    err = logit_error(ours, ref)
    limit = EXACT_REL_TOL if device == "numpy" else logit_bound(p)
    assert err <= limit, (f"max|diff| / max|logit| = {err:.3g} vs llama.cpp in exact arithmetic "
                          f"(limit {limit:.3g}); argmax ours {int(np.argmax(ours))} "
                          f"llama.cpp {int(np.argmax(ref))}")


@pytest.mark.parametrize("name,i,device", CASES)
def test_greedy(name, i, device):
    g = GOLDEN[name]
    p = g["prompts"][i]
    out = greedy_output(name, i, device)
    assert out["step_backends"] == [device] * len(out["step_backends"]), \
        f"steps computed by {out['step_backends']}, not all by the {device} backend"
    assert out["prompt_tokens"] == len(p["ids"]), "the prompt was tokenized differently"
    ok, msg = greedy_verdict(p["steps"], out["token_ids"], out["finish_reason"], g["eog_ids"],
                             tie=tie_rel(p))
    assert ok, f"{msg} (every step on the {device} backend)"
    if msg.startswith("identical"):
        assert out["text"] == p["greedy_text"]


@pytest.mark.parametrize("name,i,device", CASES)
def test_greedy_exact(name, i, device):
    g = GOLDEN[name]
    p = g["prompts"][i]
    out = greedy_output(name, i, device)
    if device == "numpy":
        ok, msg = greedy_verdict(p["exact_steps"], out["token_ids"], out["finish_reason"], g["eog_ids"], tie=TIE_REL)
    else:  # held to llama.cpp's own distance from exact arithmetic: per logit, where a flip happens
        ok, msg = greedy_verdict(p["exact_steps"], out["token_ids"], out["finish_reason"], g["eog_ids"],
                                 tie=tie_rel(p), our_logits=out["step_logits"], noise=p["rounding_noise_top"])
    assert ok, msg


# --- the rules can fail ------------------------------------------------------------------
def test_logit_bound_rejects_a_perturbed_vector():
    name = next(iter(GOLDEN))
    ref = _first_logits(name, GOLDEN[name]["prompts"][0])
    m = np.abs(ref).max()
    noisy = ref + np.random.default_rng(0).uniform(-1e-3, 1e-3, ref.shape).astype(np.float32) * m
    assert logit_error(noisy, ref) <= LOGIT_REL_TOL
    bumped = ref.copy()
    bumped[123] += 0.02 * m
    assert logit_error(bumped, ref) > LOGIT_REL_TOL
    bumped[123] = ref[123] + 2 * EXACT_REL_TOL * m
    assert logit_error(bumped, ref) > EXACT_REL_TOL
    scaled = ref * 1.05
    assert logit_error(scaled, ref) > LOGIT_REL_TOL
    nan = ref.copy()
    nan[7] = np.nan
    assert logit_error(nan, ref) > LOGIT_REL_TOL
    with pytest.raises(AssertionError):
        logit_error(ref[:-1], ref)


def _step(tok, gap, max_abs=10.0, second=None, eog=False):
    second = tok + 1 if second is None else second
    return {"token": tok, "gap": gap, "max_abs": max_abs, "eog": eog,
            "top5": [[tok, max_abs], [second, max_abs - gap], [999, max_abs - 5], [998, -6], [997, -7]]}


def test_greedy_rule():
    steps = [_step(10, 1.0), _step(11, 0.01), _step(12, 1.0), _step(13, 1.0)]
    assert greedy_verdict(steps, [10, 11, 12, 13], "length", [2])[0]
    # a real divergence (large gap) fails; a near-tie one passes only with the runner-up
    assert not greedy_verdict(steps, [10, 11, 99, 13], "length", [2])[0]
    assert greedy_verdict(steps, [10, 12, 5, 5], "length", [2])[0]
    assert not greedy_verdict(steps, [10, 500, 5, 5], "length", [2])[0]
    # stopping early: fails unless at a near-tie with an end-of-generation runner-up
    assert not greedy_verdict(steps, [10], "stop", [2])[0]
    assert not greedy_verdict(steps, [10, 11], "length", [2])[0]
    assert greedy_verdict([_step(10, 1.0), _step(11, 0.01, second=2)], [10], "stop", [2])[0]
    # a divergence at a larger gap, explained by per-logit rounding within `noise`: passes only
    # when our token is in llama.cpp's top 5 and our two logits are each that close to its
    st = [_step(10, 1.0), _step(11, 0.4), _step(12, 1.0)]  # step 1: gap 4% of max|logit| 10
    near = [{}, {11: 9.8, 12: 9.8}, {}]  # each 0.2 (2% of max|logit|) from llama.cpp's 10 / 9.6
    assert not greedy_verdict(st, [10, 12, 0], "length", [2], tie=0.02)[0]
    assert greedy_verdict(st, [10, 12, 0], "length", [2], tie=0.02, our_logits=near, noise=0.025)[0]
    assert not greedy_verdict(st, [10, 12, 0], "length", [2], tie=0.02, our_logits=near, noise=0.015)[0]
    far = [{}, {11: 9.5, 12: 9.9}, {}]  # llama.cpp's best moved by 0.5: beyond the noise
    assert not greedy_verdict(st, [10, 12, 0], "length", [2], tie=0.02, our_logits=far, noise=0.025)[0]
    assert not greedy_verdict(st, [10, 55, 0], "length", [2], tie=0.02,  # not in its top 5
                              our_logits=[{}, {11: 9.8, 55: 9.9}, {}], noise=0.025)[0]
    # llama.cpp ended generation: we must stop there too
    ended = [_step(10, 1.0), _step(2, 1.0, eog=True), _step(5, 1.0)]
    assert greedy_verdict(ended, [10], "stop", [2])[0]
    assert not greedy_verdict(ended, [10, 7], "length", [2])[0]
    assert not greedy_verdict(ended, [10], "length", [2])[0]
