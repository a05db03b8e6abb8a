"""Runner behaviour on tiny synthetic models (SmolLM2's tokenizer, random weights):
generate (greedy, sampling, stop strings, streaming, end of generation, limits,
cancellation), system1 (one batch == separate scoring == step-by-step logits), embed,
device selection and the CLI commands."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from reflex_ipc.engine import load_runner
from reflex_ipc.generation.stops import StopMatcher
from reflex_ipc.errors import ReflexError
from reflex_ipc.testing.references import reference_logits

pytestmark = pytest.mark.usefixtures("smollm2")  # the tiny models borrow its tokenizer

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def tiny(tiny_models):
    return {name: tiny_models[name] for name in ("llama", "gemma3")}


@pytest.fixture(scope="module")
def runner(tiny):
    r = load_runner(tiny["llama"][0], device="numpy", n_ctx=96)
    yield r
    r.close()


@pytest.fixture(scope="module")
def gemma(tiny):
    r = load_runner(tiny["gemma3"][0], device="numpy", n_ctx=96)
    yield r
    r.close()


def log_softmax(z):
    z = np.asarray(z, np.float64)
    m = z.max()
    return z - m - math.log(np.exp(z - m).sum())


# -- generate ------------------------------------------------------------------------

def test_info_and_tokenize(runner, tiny):
    info = runner.info()
    assert info["backend"] == "numpy" and info["device"] == "cpu" and info["architecture"] == "llama"
    assert info["n_vocab"] == 49152 and info["n_ctx"] == 96 and info["path"] == tiny["llama"][0]
    ids = runner.tokenize(PROMPT)
    assert ids == [504, 3575, 282, 4649, 314]
    assert runner.detokenize(ids) == PROMPT


def test_prompt_logits_match_reference(runner, tiny):
    _, t, cfg = tiny["llama"]
    ids = runner.tokenize(PROMPT)
    ref = reference_logits(t, cfg, ids)[-1]
    got = runner.prompt_logits(ids)
    assert got.dtype == np.float32 and got.shape == (49152,)
    np.testing.assert_allclose(got, ref, atol=2e-4 * np.abs(ref).max())


def test_greedy_is_argmax_of_growing_prompt(runner):
    out = runner.generate(PROMPT, max_tokens=6)
    assert out["finish_reason"] == "length"
    assert out["prompt_tokens"] == 5 and out["completion_tokens"] == 6 == len(out["token_ids"])
    assert set(out["timings"]) >= {"tokenize", "prompt_eval", "decode", "total"}
    ids = runner.tokenize(PROMPT)
    for tid in out["token_ids"][:4]:
        assert tid == int(np.argmax(runner.prompt_logits(ids)))
        ids.append(tid)
    assert out["text"] == runner.detokenize(out["token_ids"])
    assert runner.generate(PROMPT, max_tokens=6)["token_ids"] == out["token_ids"]


def test_max_tokens_zero(runner):
    out = runner.generate(PROMPT, max_tokens=0)
    assert out["token_ids"] == [] and out["text"] == "" and out["finish_reason"] == "length"


def _stream(runner, prompt, **kw):
    got = []
    out = runner.generate(prompt, on_token=lambda i, t: got.append((i, t)), **kw)
    return out, got


def test_stop_string_truncates_text_and_stream(runner):
    base = runner.generate(PROMPT, max_tokens=24)
    text = base["text"]
    assert len(text) > 12
    stop = text[8:11]
    cut = text.find(stop)
    out, got = _stream(runner, PROMPT, max_tokens=24, stop=[stop, "\x00never"])
    assert out["finish_reason"] == "stop_string"
    assert out["text"] == text[:cut]
    assert "".join(t for _, t in got) == out["text"]
    assert [i for i, _ in got] == out["token_ids"]
    assert base["token_ids"][:len(out["token_ids"])] == out["token_ids"]
    # the streamed pieces never ran past the final text at any point
    seen = ""
    for _, t in got:
        seen += t
        assert out["text"].startswith(seen)


def test_partial_stop_string_is_held_then_released(runner):
    text = runner.generate(PROMPT, max_tokens=16)["text"]
    stop = text[-2:] + "\x00"  # starts like the end of the text, never completes
    out, got = _stream(runner, PROMPT, max_tokens=16, stop=[stop])
    assert out["finish_reason"] == "length" and out["text"] == text
    assert "".join(t for _, t in got) == text
    assert got[-1][1].endswith(text[-2:])  # held back until the end


def test_stop_text_holdback_unit():
    st = StopMatcher(["END", "xyz"])
    assert st.push("abcE") == ("abc", False)
    assert st.push("N") == ("", False)
    assert st.push("x") == ("EN", False)  # "x" rules out END but may start "xyz"
    assert st.push("y!") == ("xy!", False)
    st = StopMatcher(["END"])
    assert st.push("aE") == ("a", False)
    assert st.push("ND tail") == ("", True)
    assert st.text == "a"
    st = StopMatcher([])
    assert st.push("abc") == ("abc", False)


def test_end_of_generation_stops(runner, monkeypatch):
    # pretend that the first generated token unlike the ones before it ends generation
    for prompt in (PROMPT, "Hello there, how", "Once upon a time"):
        base = runner.generate(prompt, max_tokens=8)["token_ids"]
        k = next((k for k in range(1, len(base)) if base[k] not in base[:k]), None)
        if k is not None:
            break
    assert k is not None
    eog = base[k]

    class Tok:
        def __init__(self, tok):
            self._tok = tok
            self.eog_ids = frozenset({eog})

        def __getattr__(self, name):
            return getattr(self._tok, name)

    monkeypatch.setattr(runner, "tok", Tok(runner.tok))
    out, got = _stream(runner, prompt, max_tokens=8)
    assert out["finish_reason"] == "stop"
    assert out["token_ids"] == base[:k] and out["completion_tokens"] == k
    assert eog not in out["token_ids"]
    assert "".join(t for _, t in got) == out["text"]


def test_sampling_seeds(runner):
    kw = dict(max_tokens=8, temperature=1.5)
    a = runner.generate(PROMPT, seed=7, **kw)["token_ids"]
    assert runner.generate(PROMPT, seed=7, **kw)["token_ids"] == a
    others = [runner.generate(PROMPT, seed=s, **kw)["token_ids"] for s in (8, 9, 10)]
    assert any(o != a for o in others)
    greedy = runner.generate(PROMPT, max_tokens=8)["token_ids"]
    assert runner.generate(PROMPT, seed=3, top_k=1, **kw)["token_ids"] == greedy
    assert runner.generate(PROMPT, seed=3, min_p=1.0, **kw)["token_ids"] == greedy
    assert runner.generate(PROMPT, seed=3, top_p=1e-9, **kw)["token_ids"] == greedy


def test_repeat_penalty_changes_greedy_choice(runner):
    greedy = runner.generate(PROMPT, max_tokens=12)["token_ids"]
    ids = runner.tokenize(PROMPT)
    first = runner.prompt_logits(ids)
    # a huge penalty on the prompt's tokens: the first choice is the best token not in the prompt
    out = runner.generate(PROMPT, max_tokens=1, repeat_penalty=1e6, repeat_last_n=64)
    masked = first.astype(np.float64).copy()
    for t in set(ids):
        masked[t] = masked[t] / 1e6 if masked[t] > 0 else masked[t] * 1e6
    assert out["token_ids"] == [int(np.argmax(masked))]
    assert runner.generate(PROMPT, max_tokens=12, repeat_penalty=1.0)["token_ids"] == greedy


def test_state_is_sized_on_demand_and_grows(tiny, monkeypatch):
    import reflex_ipc.runtime.executor as executor

    monkeypatch.setattr(executor, "STATE_MIN", 8)
    r = load_runner(tiny["llama"][0], device="numpy", n_ctx=40)
    fresh = load_runner(tiny["llama"][0], device="numpy", n_ctx=40)
    try:
        assert r.exec.state is None  # nothing allocated before the first request
        short = r.generate(PROMPT, max_tokens=2)
        assert r.exec.state.n_slots == 8  # prompt (5 tokens) + 2 -> the smallest size
        long = r.generate(PROMPT, max_tokens=20)  # 25 slots: grows to 32, keeping the prompt
        assert r.exec.state.n_slots == 32 and long["cached_tokens"] == 4
        assert long["token_ids"] == fresh.generate(PROMPT, max_tokens=20)["token_ids"]
        assert long["token_ids"][:2] == short["token_ids"]
        r.generate(PROMPT, max_tokens=35)  # 40 slots: capped at n_ctx
        assert r.exec.state.n_slots == 40
        assert r.generate(PROMPT, max_tokens=2)["token_ids"] == short["token_ids"]
        assert r.exec.state.n_slots == 40  # never shrinks
    finally:
        r.close()
        fresh.close()


def test_prefix_reuse_gives_the_same_results(tiny):
    """A request that shares a prefix with the previous one evaluates only the rest, and
    answers exactly what it answers from an empty state."""
    r = load_runner(tiny["llama"][0], device="numpy", n_ctx=128)
    fresh = load_runner(tiny["llama"][0], device="numpy", n_ctx=128)
    try:
        base = PROMPT + " and then some more words"
        a = r.generate(base, max_tokens=6)
        assert a["cached_tokens"] == 0
        edited = base + " edited"
        b = r.generate(edited, max_tokens=6, logprobs=3)
        n_base = len(r.tokenize(base, add_bos=None))
        assert 0 < b["cached_tokens"] <= n_base
        ref = fresh.generate(edited, max_tokens=6, logprobs=3, cache_prompt=False)
        assert b["token_ids"] == ref["token_ids"] and ref["cached_tokens"] == 0
        for x, y in zip(b["logprobs"], ref["logprobs"]):
            assert abs(x["logprob"] - y["logprob"]) < 1e-4
        # the generated tokens are held too: continuing the answer reuses them
        cont = r.generate(edited + b["text"], max_tokens=3)
        assert cont["cached_tokens"] >= b["prompt_tokens"]
        assert cont["token_ids"] == fresh.generate(edited + b["text"], max_tokens=3,
                                                   cache_prompt=False)["token_ids"]
        # system1 after generate, and generate after system1
        s1 = r.system1(edited, [" yes", " no way"])
        s2 = fresh.system1(edited, [" yes", " no way"], cache_prompt=False)
        assert s1["cached_tokens"] > 0 and s2["cached_tokens"] == 0
        for c1, c2 in zip(s1["candidates"], s2["candidates"]):
            assert abs(c1["logprob"] - c2["logprob"]) < 1e-4
        again = r.generate(edited, max_tokens=6)
        assert again["token_ids"] == ref["token_ids"] and again["cached_tokens"] == b["prompt_tokens"] - 1
    finally:
        r.close()
        fresh.close()


def test_system1_tiny_temperature_gives_numbers(runner):
    out = runner.system1(PROMPT, [" a", " b", " c"], temperature=1e-300)
    probs = [c["probability"] for c in out["candidates"]]
    assert all(isinstance(p, float) and np.isfinite(p) for p in probs)
    assert sorted(probs) == [0.0, 0.0, 1.0] and np.isfinite(out["entropy"])


def test_logprobs_are_the_full_vocabulary_log_softmax(runner):
    out = runner.generate(PROMPT, max_tokens=3, logprobs=5, cache_prompt=False)
    assert len(out["logprobs"]) == 3
    first = out["logprobs"][0]
    z = runner.prompt_logits(runner.tokenize(PROMPT, add_bos=None)).astype(np.float64)
    lse = z.max() + np.log(np.exp(z - z.max()).sum())
    assert first["token_id"] == out["token_ids"][0]
    assert abs(first["logprob"] - (z[first["token_id"]] - lse)) < 1e-6
    assert [t["token_id"] for t in first["top"]] == list(np.argsort(-z, kind="stable")[:5])
    assert first["top"][0]["token_id"] == first["token_id"]  # greedy picks the best


def test_constraint_masks_tokens(runner):
    allowed_ids = [17, 42, 99]

    class OnlyThese:
        def __init__(self):
            self.seen = []

        def allowed(self):
            m = np.zeros(runner.n_vocab, bool)
            m[allowed_ids] = True
            return m

        def commit(self, tid):
            self.seen.append(tid)

        def done(self):
            return len(self.seen) >= 4

    c = OnlyThese()
    out = runner.generate(PROMPT, max_tokens=10, constraint=c)
    assert out["token_ids"] == c.seen and len(c.seen) == 4 and out["finish_reason"] == "stop"
    assert set(out["token_ids"]) <= set(allowed_ids)
    out = runner.generate(PROMPT, max_tokens=10, constraint=OnlyThese(), temperature=0.8, seed=3)
    assert set(out["token_ids"]) <= set(allowed_ids)


def test_context_overflow_and_bad_requests(runner):
    with pytest.raises(ReflexError) as e:
        runner.generate(PROMPT, max_tokens=92)
    assert e.value.kind == "context_overflow"
    with pytest.raises(ReflexError) as e:
        runner.generate(" the" * 100, max_tokens=1)
    assert e.value.kind == "context_overflow"
    # parameter ranges (max_tokens, top_p, ...) are the protocol's, checked once when a request
    # or the CLI's options are decoded (tests/test_protocol.py, tests/test_cli.py)
    with pytest.raises(ReflexError) as e:
        runner.generate("", max_tokens=1)
    assert e.value.kind == "invalid_request"
    with pytest.raises(ReflexError) as e:
        runner.prompt_logits([49152])
    assert e.value.kind == "invalid_request"


def test_cancel_between_tokens_and_layers(runner):
    calls = []

    def cancel_after(n):
        def f():
            calls.append(1)
            return len(calls) > n
        return f

    with pytest.raises(ReflexError) as e:
        runner.generate(PROMPT, max_tokens=10, should_cancel=cancel_after(1))
    assert e.value.kind == "cancelled"
    calls.clear()
    got = []
    with pytest.raises(ReflexError):
        runner.generate(PROMPT, max_tokens=10, on_token=lambda i, t: got.append(i),
                        should_cancel=cancel_after(8))
    assert len(got) >= 1  # cancelled mid-generation, after some tokens
    # the runner is usable afterwards and gives the same greedy result
    assert runner.generate(PROMPT, max_tokens=3)["token_ids"] == runner.generate(PROMPT, max_tokens=3)["token_ids"]


# -- system1 ----------------------------------------------------------------------------

CANDS = [" Paris", " London is big", " a city", " Paris, the capital of France"]


def _stepwise_logprob(r, prompt_ids, cand_ids):
    ids, total = list(prompt_ids), 0.0
    for t in cand_ids:
        total += log_softmax(r.prompt_logits(ids))[t]
        ids.append(t)
    return total


@pytest.mark.parametrize("which", ["runner", "gemma"])
def test_system1_one_batch_equals_separate_scoring(which, request):
    r = request.getfixturevalue(which)
    out = r.system1(PROMPT, CANDS, temperature=1.0)
    p_ids = r.tokenize(PROMPT)
    assert out["prompt_tokens"] == len(p_ids)
    lps = []
    for i, c in enumerate(out["candidates"]):
        assert c["text"] == CANDS[i]
        assert p_ids + c["token_ids"] == r.tokenize(PROMPT + CANDS[i])
        alone = r.system1(PROMPT, [CANDS[i]])["candidates"][0]
        assert alone["probability"] == pytest.approx(1.0)
        assert c["logprob"] == pytest.approx(alone["logprob"], abs=1e-4)
        assert c["logprob"] == pytest.approx(_stepwise_logprob(r, p_ids, c["token_ids"]), abs=1e-3)
        assert c["mean_logprob"] == pytest.approx(c["logprob"] / len(c["token_ids"]))
        lps.append(c["logprob"])
    probs = np.array([c["probability"] for c in out["candidates"]])
    expect = np.exp(np.array(lps) - max(lps))
    expect /= expect.sum()
    np.testing.assert_allclose(probs, expect, rtol=1e-9, atol=1e-12)
    assert out["best_idx"] == int(np.argmax(lps))
    nz = expect[expect > 0]
    assert out["entropy"] == pytest.approx(float(-(nz * np.log2(nz)).sum()), abs=1e-9)


@pytest.mark.parametrize("which", ["runner", "gemma"])
def test_system1_in_chunks_equals_one_batch(which, request, monkeypatch):
    r = request.getfixturevalue(which)
    whole = r.system1(PROMPT, CANDS, cache_prompt=False)
    monkeypatch.setattr(r.exec, "chunk", 3)  # candidate batches split mid-candidate
    parts = r.system1(PROMPT, CANDS, cache_prompt=False)
    reused = r.system1(PROMPT, CANDS)  # the prompt held: only the candidates run
    assert reused["cached_tokens"] == len(r.tokenize(PROMPT, add_bos=None)) - 1
    for a, b in zip(whole["candidates"], reused["candidates"]):
        assert a["logprob"] == pytest.approx(b["logprob"], abs=1e-4)
    for a, b in zip(whole["candidates"], parts["candidates"]):
        assert a["logprob"] == pytest.approx(b["logprob"], abs=1e-4)


def test_system1_temperature(runner):
    cold = runner.system1(PROMPT, CANDS[:3], temperature=0.01)
    hot = runner.system1(PROMPT, CANDS[:3], temperature=100.0)
    assert max(c["probability"] for c in cold["candidates"]) > 0.99
    assert hot["entropy"] > cold["entropy"]
    assert cold["best_idx"] == hot["best_idx"]


def test_system1_errors(runner):
    for cands, needle in (([" Paris", ""], "candidate 1"), (["Paris"], "candidate 0"), ([], "")):
        with pytest.raises(ReflexError) as e:
            runner.system1(PROMPT + " ", cands) if cands == ["Paris"] else runner.system1(PROMPT, cands)
        assert e.value.kind == "invalid_request"
        assert needle in e.value.message
    with pytest.raises(ReflexError) as e:
        runner.system1(PROMPT, [" Paris"], temperature=0.0)
    assert e.value.kind == "invalid_request"
    with pytest.raises(ReflexError) as e:
        runner.system1(PROMPT, [" word" * 50, " word" * 50])
    assert e.value.kind == "context_overflow"


# -- embed --------------------------------------------------------------------------

@pytest.mark.parametrize("pooling", ["mean", "last", "cls"])
def test_embed_pooling_matches_reference(runner, tiny, pooling):
    _, t, cfg = tiny["llama"]
    texts = ["hello world", "The capital of France is Paris"]
    out = runner.embed(texts, pooling=pooling)
    assert out["dim"] == 32 and len(out["embeddings"]) == 2
    for text, v in zip(texts, out["embeddings"]):
        h = reference_logits(t, cfg, runner.tokenize(text), hidden=True)
        ref = {"mean": h.mean(0), "last": h[-1], "cls": h[0]}[pooling]
        np.testing.assert_allclose(v, ref, atol=1e-4)
    normed = runner.embed(texts, pooling=pooling, normalize=True)["embeddings"]
    for v, u in zip(out["embeddings"], normed):
        assert np.linalg.norm(u) == pytest.approx(1.0, abs=1e-6)
        np.testing.assert_allclose(u, np.array(v) / np.linalg.norm(v), atol=1e-6)


@pytest.mark.parametrize("pooling", ["mean", "last", "cls"])
def test_embed_matches_llama_cpp(tiny, runner, pooling, llama_cpp):
    kind = {"mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN, "last": llama_cpp.LLAMA_POOLING_TYPE_LAST,
            "cls": llama_cpp.LLAMA_POOLING_TYPE_CLS}[pooling]
    llm = llama_cpp.Llama(tiny["llama"][0], embedding=True, pooling_type=kind, n_ctx=64, verbose=False)
    text = "The capital of France is Paris"
    ref = np.array(llm.embed(text, normalize=False))
    del llm
    got = np.array(runner.embed(text, pooling=pooling)["embeddings"][0])
    np.testing.assert_allclose(got, ref, atol=2e-3 * np.abs(ref).max())


def test_embed_single_text_and_errors(runner):
    assert len(runner.embed("hello")["embeddings"]) == 1
    for bad in ([""], [], "x"):
        if bad == "x":
            with pytest.raises(ReflexError) as e:
                runner.embed("x", pooling="max")
        else:
            with pytest.raises(ReflexError) as e:
                runner.embed(bad)
        assert e.value.kind == "invalid_request"


# -- devices, CLI -----------------------------------------------------------------------

def test_device_selection(tiny):
    with pytest.raises(ReflexError) as e:
        load_runner(tiny["llama"][0], device="tpu")
    assert e.value.kind == "invalid_request"
    try:
        import pycuda.driver  # noqa: F401
        has_pycuda = True
    except Exception:
        has_pycuda = False
    if not has_pycuda:
        with pytest.raises(ReflexError) as e:
            load_runner(tiny["llama"][0], device="cuda")
        assert e.value.kind == "cuda_error"
        r = load_runner(tiny["llama"][0], device="auto", n_ctx=32)
        assert r.info()["backend"] == "cpu"  # no GPU: the compiled CPU kernels
        r.close()


def _cli(*args):
    p = subprocess.run([sys.executable, "-m", "reflex_ipc", *args], capture_output=True, text=True,
                       timeout=120)
    return p


def test_cli_generate_system1_embed(tiny, runner):
    path = tiny["llama"][0]
    p = _cli("generate", "--model", path, "--device", "cpu", "--max-tokens", "4", "--json", PROMPT)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["token_ids"] == runner.generate(PROMPT, max_tokens=4)["token_ids"]
    assert out["finish_reason"] == "length" and "prompt_eval" in out["timings"]
    p = _cli("generate", "--model", path, "--device", "cpu", "--max-tokens", "4", PROMPT)
    assert p.returncode == 0 and p.stdout.rstrip("\n") == out["text"].rstrip("\n")
    assert "prompt" in p.stderr
    p = _cli("system1", "--model", path, "--device", "cpu", "--json", PROMPT, "--candidate", " Paris",
             "--candidate", " London")
    assert p.returncode == 0, p.stderr
    s1 = json.loads(p.stdout)
    assert [c["text"] for c in s1["candidates"]] == [" Paris", " London"]
    assert {"best_idx", "entropy", "timings"} <= set(s1)
    p = _cli("embed", "--model", path, "--device", "cpu", "--json", "--normalize", "a", "b")
    assert p.returncode == 0, p.stderr
    emb = json.loads(p.stdout)["embeddings"]
    assert len(emb) == 2 and len(emb[0]) == 32
    p = _cli("system1", "--model", path, "--device", "cpu", PROMPT, "--candidate", "")
    assert p.returncode == 2 and "invalid_request" in p.stderr  # README, exit codes
