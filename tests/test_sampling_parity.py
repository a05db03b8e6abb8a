"""The logit processors and the typical-p truncation against llama.cpp's samplers
(llama-cpp-python 0.3.36, its vendored src/llama-sampler.cpp), and greedy generation
after them on an F32 twin:

* each processor (logit bias, penalties, DRY) on random logits and histories gives the
  same float32 row as llama.cpp's sampler applied to the same token array;
* typical-p keeps the same set as llama.cpp's, and sampling under it draws tokens with
  the distribution llama.cpp's truncation leaves (a statistical test: the draw itself is
  not llama.cpp's mt19937);
* greedy decoding after the processors (llama.cpp's order: bias, penalties, DRY, then the
  argmax) picks llama.cpp's tokens, step by step, on a tiny float model with SmolLM2's
  vocabulary (prompt tokens in the penalties' window, as llama.cpp's server accepts them).
"""

import ctypes

import numpy as np
import pytest

from reflex_ipc.engine import load_runner
from reflex_ipc.generation import Params
from reflex_ipc.generation.processors import Dry, LogitBias, Penalties, build
from reflex_ipc.generation.selectors import Sampler

pytestmark = pytest.mark.usefixtures("smollm2")

N_CTX = 256


@pytest.fixture(scope="module")
def tiny_llama(tiny_models):
    return tiny_models["llama"][0]


@pytest.fixture(scope="module")
def llm(llama_cpp, tiny_llama):
    m = llama_cpp.Llama(tiny_llama, logits_all=True, n_ctx=N_CTX, n_batch=N_CTX, type_k=0, type_v=0,
                        verbose=False)
    yield m
    m.close()


@pytest.fixture(scope="module")
def runner(tiny_llama):
    r = load_runner(tiny_llama, device="numpy", n_ctx=N_CTX)
    yield r
    r.close()


def _chain(l, smpls):
    params = l.llama_sampler_chain_default_params()
    chain = l.llama_sampler_chain_init(params)
    for s in smpls:
        l.llama_sampler_chain_add(chain, s)
    return chain


def _llama_samplers(l, llm, p: Params, n_vocab):
    """llama.cpp's samplers for the processors of p, in its order (bias, penalties, DRY)."""
    out = []
    if p.logit_bias:
        arr = (l.llama_logit_bias * len(p.logit_bias))(
            *[l.llama_logit_bias(int(k), float(v)) for k, v in p.logit_bias.items()])
        out.append(l.llama_sampler_init_logit_bias(n_vocab, len(p.logit_bias), arr))
    out.append(l.llama_sampler_init_penalties(n_vocab, p.repeat_last_n, p.repeat_penalty,
                                              p.frequency_penalty, p.presence_penalty))
    if p.dry_multiplier:
        br = [s.encode() for s in p.dry_sequence_breakers]
        c = (ctypes.c_char_p * len(br))(*br)
        out.append(l.llama_sampler_init_dry(llm._model.vocab, p.dry_multiplier, p.dry_base,
                                            p.dry_allowed_length, p.dry_penalty_last_n, c, len(br)))
    return out


def _apply(l, smpl, logits):
    """llama.cpp's sampler `smpl` applied to float32 logits: {id: logit} of what it keeps."""
    n = len(logits)
    data = (l.llama_token_data * n)()
    view = np.frombuffer(data, dtype=np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")]))
    view["id"] = np.arange(n)
    view["logit"] = logits
    cur = l.llama_token_data_array(data=data, size=n, selected=-1, sorted=False)
    l.llama_sampler_apply(smpl, ctypes.byref(cur))
    kept = view[:cur.size]
    return dict(zip(kept["id"].tolist(), kept["logit"].tolist()))


def _ours(procs, logits, history):
    row = np.array(logits, np.float32)
    for p in procs:
        p.apply(row, history)
    return row


CASES = [
    dict(repeat_penalty=1.3, repeat_last_n=16),
    dict(frequency_penalty=0.7, presence_penalty=0.4, repeat_last_n=32),
    dict(repeat_penalty=0.8, frequency_penalty=-0.5, presence_penalty=1.5, repeat_last_n=64),
    dict(logit_bias={"3": 5.0, "17": -100.0, "42": 0.25}),
    dict(dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2, dry_penalty_last_n=64),
    dict(dry_multiplier=2.0, dry_base=3.0, dry_allowed_length=1, dry_penalty_last_n=40,
         dry_sequence_breakers=["\n", " the"]),
    dict(logit_bias={"5": 2.0}, repeat_penalty=1.2, frequency_penalty=0.3, dry_multiplier=1.0,
         dry_allowed_length=3, repeat_last_n=48, dry_penalty_last_n=48),
]


@pytest.mark.parametrize("case", CASES)
def test_processors_equal_llama_cpp_samplers(case, llama_cpp, llm, runner):
    """Random logits, histories full of repeats (and the breakers' tokens): our row equals
    llama.cpp's, float32 for float32, after every sampler of the case in order."""
    l = llama_cpp
    p = Params(**case)
    V = runner.n_vocab
    rng = np.random.default_rng(7)
    nl, colon = runner.tok.encode("\n", add_bos=False)[0], runner.tok.encode(":", add_bos=False)[0]
    changed = 0
    for trial in range(6):
        base = rng.integers(1000, 1060, size=12).tolist()  # ordinary word pieces
        hist = (base * 4 + rng.integers(1000, 1060, size=8).tolist() + base[:5] +
                ([nl] if trial % 2 else [colon]) + base[:7])[: 40 + 5 * trial]
        logits = (rng.standard_normal(V) * 4).astype(np.float32)
        logits[1000:1060] += 3.0  # the history's tokens are contenders
        chain = _chain(l, _llama_samplers(l, llm, p, V))
        for t in hist:
            l.llama_sampler_accept(chain, t)
        want = _apply(l, chain, logits)
        l.llama_sampler_free(chain)
        got = _ours(build(p, runner.tok, V), logits, hist)
        assert len(want) == V
        ids = np.fromiter(want.keys(), np.int64)
        ref = np.fromiter(want.values(), np.float32)
        changed += int((got != logits).any())
        np.testing.assert_array_equal(got[ids], ref, err_msg=f"{case} trial {trial}")
    assert changed >= 4  # the case does something


def _dry_row(breakers, hist, allowed=2, base=2.0, V=16):
    d = Dry(None, 1.0, base, allowed, 64, [])
    d.breakers = breakers  # {head id: [tail tuples]}, as dry_breakers builds from a vocabulary
    row = np.zeros(V, np.float32)
    d.apply(row, hist)
    return row


def test_dry_breakers_limit_and_exempt():
    """A breaker ends the look-back (a repetition counts only the tokens after it), a
    multi-token breaker counts once its tail follows its head, and a token that is a
    breaker by itself is never penalized."""
    hist = [1, 2, 3, 9, 1, 2, 3, 9, 1, 2]
    # no breaker: "1 2 3 9 1 2" repeats (6 tokens), so 3 loses base ** (6 - 2)
    assert _dry_row({}, hist)[3] == -16.0
    # 9 breaks: only "1 2" after it counts: base ** 0
    assert _dry_row({9: [()]}, hist)[3] == -1.0
    hist = [1, 2, 3, 9, 8, 1, 2, 3, 9, 8, 1, 2]
    assert _dry_row({9: [(8,)]}, hist)[3] == -1.0  # the breaker "9 8"
    assert _dry_row({9: [(7,)]}, hist)[3] < -1.0  # "9 7" never occurs: no limit
    assert _dry_row({9: [()]}, [5, 9, 5], allowed=1)[9] == 0.0  # 9 would extend "5": exempt
    assert _dry_row({}, [5, 9, 5], allowed=1)[9] == -1.0


@pytest.mark.parametrize("mass", [0.2, 0.5, 0.8, 0.95])
def test_typical_keeps_llama_cpp_set(mass, llama_cpp):
    l = llama_cpp
    rng = np.random.default_rng(int(mass * 100))
    for trial in range(20):
        logits = (rng.standard_normal(40) * 2.5).astype(np.float32)
        smpl = l.llama_sampler_init_typical(mass, 1)
        want = set(_apply(l, smpl, logits))
        l.llama_sampler_free(smpl)
        idx, _ = Sampler(temperature=1.0, typical_p=mass).candidates(logits)
        got = set(idx.tolist())
        if got != want:  # only where a cumulative sum lands on the boundary (float32 vs 64)
            p = np.exp(logits - logits.max()).astype(np.float64)
            p /= p.sum()
            assert abs(sum(p[list(got ^ want)])) < 1e-5 or \
                min(abs(np.cumsum(np.sort(p)) - mass)) < 1e-5, (trial, got ^ want)
        else:
            assert got == want


def test_typical_sampling_distribution(llama_cpp):
    """Sampling with typical_p draws from llama.cpp's typical set, renormalized."""
    l = llama_cpp
    logits = np.log(np.array([0.30, 0.25, 0.15, 0.12, 0.08, 0.05, 0.03, 0.02], np.float64)).astype(np.float32)
    smpl = l.llama_sampler_init_typical(0.6, 1)
    kept = _apply(l, smpl, logits)
    l.llama_sampler_free(smpl)
    p = np.zeros(len(logits))
    ids = list(kept)
    p[ids] = np.exp(logits[ids].astype(np.float64))
    p /= p.sum()
    s = Sampler(temperature=1.0, typical_p=0.6, seed=5)
    draws = np.bincount([s(logits) for _ in range(20000)], minlength=len(logits)) / 20000
    assert set(np.flatnonzero(draws)) == set(ids)
    np.testing.assert_allclose(draws, p, atol=0.015)


GREEDY_CASES = [  # strong enough to move this tiny model off its favourite token (44612)
    dict(repeat_penalty=3.0, repeat_last_n=32),
    dict(frequency_penalty=2.0, presence_penalty=1.0, repeat_last_n=64),
    dict(logit_bias={"44612": -100.0, "25119": 3.0, "21005": 1.5}),
    dict(dry_multiplier=1.5, dry_base=1.75, dry_allowed_length=1, dry_penalty_last_n=64),
    dict(repeat_penalty=1.5, frequency_penalty=1.0, presence_penalty=0.5, logit_bias={"25119": -5.0},
         dry_multiplier=1.0, dry_allowed_length=1, repeat_last_n=24, dry_penalty_last_n=24),
]
PROMPT = "The capital of France is Paris. The capital of France is"


@pytest.mark.parametrize("case", GREEDY_CASES)
def test_greedy_after_processors_matches_llama_cpp(case, llama_cpp, llm, runner):
    """24 greedy tokens after the processors equal llama.cpp's (its logits, its samplers,
    then the argmax), except from a step where llama.cpp's top two processed logits are
    within 0.2% of the largest |logit| (a near-tie either side may break)."""
    l = llama_cpp
    p = Params(max_tokens=24, **case)
    ids = runner.tokenize(PROMPT, add_bos=None)
    got = runner.generate(ids, p, cache_prompt=False)["token_ids"]
    plain = runner.generate(ids, max_tokens=24, cache_prompt=False)["token_ids"]
    assert got != plain  # the processors change what greedy picks
    V = runner.n_vocab
    chain = _chain(l, _llama_samplers(l, llm, p, V))
    for t in ids:
        l.llama_sampler_accept(chain, t)
    llm.reset()
    llm.eval(ids)
    same = 0
    try:
        for step, tok in enumerate(got):
            z = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)[:V]
            kept = _apply(l, chain, z)
            zs = np.full(V, -np.inf, np.float32)
            zs[list(kept)] = list(kept.values())
            want = int(np.argmax(zs))
            if tok != want:
                assert zs[want] - zs[tok] < 2e-3 * np.abs(z).max(), \
                    f"{case} step {step}: {tok} != llama.cpp's {want}"
                break
            same += 1
            if want in runner.tok.eog_ids:
                break
            l.llama_sampler_accept(chain, want)
            llm.eval([want])
    finally:
        l.llama_sampler_free(chain)
    assert same >= 16, f"{case}: only {same} steps before a near-tie"


def test_logit_bias_checks_ids(runner):
    from reflex_ipc.errors import ReflexError

    with pytest.raises(ReflexError) as ei:
        runner.generate("Hi", max_tokens=2, logit_bias={str(runner.n_vocab): 1.0})
    assert ei.value.kind == "invalid_request" and "logit_bias" in ei.value.message
    LogitBias({"0": 1.0}, runner.n_vocab)  # the first id is fine
