"""What one architecture or kind of layer does that the matrix (test_matrix.py) does not reach:
LongRoPE's factors, latent attention's state and ops, gemma4's shared K/V, per-layer embeddings
and exact gelu, grouped MoE routing, and the recurrent hybrids' state (prefill vs steps, prefix
reuse, system1's sequence groups, saved states, capture, backends without the ops), on the
architectures' examples (models/<arch>.py EXAMPLES)."""

import json
import subprocess
import sys

import numpy as np
import pytest

from reflex_ipc.backends.numpy_ops import NumpyOps
from reflex_ipc.engine import load_runner
from reflex_ipc.errors import ReflexError
from reflex_ipc.gguffile import GGUFFile
from reflex_ipc.models import load_model
from reflex_ipc.testing import llamaref
from reflex_ipc.testing.synthetic import examples

pytestmark = pytest.mark.usefixtures("smollm2")  # the examples borrow its tokenizer

IDS = [504, 3575, 282, 4649, 314, 7042, 30, 198, 504, 1797, 1918, 28, 253, 1230, 314, 2680]
N_CTX = 256


def _model(path, ops=None):
    ops = ops or NumpyOps()
    with GGUFFile(path) as f:
        return load_model(ops, f)


def _logits(path, ids, ops=None):
    from reflex_ipc.runtime.batch import Batch

    ops = ops or NumpyOps()
    m = _model(path, ops)
    if hasattr(m, "configure"):
        m.configure(N_CTX)
    return np.asarray(m.forward(m.new_state(ops, N_CTX), Batch(ops, ids, range(len(ids)))), dtype=np.float64)


# -- attention-side families -------------------------------------------------------------------------
def test_phi3_factors_follow_the_context(example):
    """LongRoPE: the long factors past the original context (64 here), the short ones below."""
    model = _model(example("phi3_fused_long"))
    model.configure(64)
    assert model.rope_factors is model.factors_short
    model.configure(65)
    assert model.rope_factors is model.factors_long


@pytest.mark.parametrize("name", [n for n, (a, s) in examples().items() if a == "gemma4" and not s.get("quantize")])
def test_gemma4_exact_gelu_stays_near_llama_cpp(example, name, llama_cpp):
    """With the exact gelu (what reflex computes), gemma4 stays within llama.cpp's fp16 GELU
    table's own effect; with the table emulated it is 100x closer (test_matrix's exact rule)."""
    ref = llamaref.logits(llama_cpp, example(name), IDS)
    err = np.abs(_logits(example(name), IDS) - ref).max() / np.abs(ref).max()
    assert err < 2.5e-3


def test_qwen3moe_per_layer_used_count_all_equal_is_accepted(tmp_path, smollm2, llama_cpp):
    from reflex_ipc.testing.synthetic import example_gguf

    path = example_gguf("qwen3moe", tmp_path / "m.gguf", tokenizer=smollm2, keys={"expert_used_count": [2, 2]})
    ref = llamaref.logits(llama_cpp, path, IDS)
    np.testing.assert_allclose(_logits(path, IDS), ref, rtol=0, atol=1e-3 * np.abs(ref).max())


def test_deepseek2_needs_the_latent_attention_ops(example):
    class NoMLA(NumpyOps):
        head_matmul = None

    with pytest.raises(ReflexError) as e:
        _model(example("deepseek2_v2"), NoMLA())
    assert e.value.kind == "unsupported_architecture" and "head_matmul" in e.value.message


def test_deepseek2_state_is_the_latent(example):
    """The state holds kv_lora_rank + rope dims per token and layer (one latent head)."""
    model = _model(example("deepseek2_v3"))
    keys = examples()["deepseek2_v3"][1]["keys"]
    state = model.new_state(NumpyOps(), 8)
    width = keys["attention.kv_lora_rank"] + keys["rope.dimension_count"]
    assert [tuple(L.kv.shape) for L in state.layers] == [(1, 8, width)] * keys["block_count"]


def test_gemma4_per_layer_embeddings_need_split(example):
    class NoSplit(NumpyOps):
        split = None

    with pytest.raises(ReflexError) as e:
        _model(example("gemma4_e2b"), NoSplit())
    assert e.value.kind == "unsupported_architecture" and "per-layer embeddings" in e.value.message


def test_gemma4_shared_kv_state(example):
    """Layers that reuse an earlier layer's KV hold no state of their own."""
    model = _model(example("gemma4_e2b"))
    assert [L.reuse for L in model.layers] == [None, None, None, 1, 2]
    assert [len(L.arrays) for L in model.new_state(NumpyOps(), 8).layers] == [2, 2, 2, 0, 0]


def test_moe_route_groups_against_brute_force():
    """Grouped routing: the chosen experts are the best n_used among the G_used groups whose
    two best (biased) selection values sum highest; weights are the unbiased probabilities."""
    from reflex_ipc.backends.base import moe_route

    rng = np.random.default_rng(3)
    E, G, Gu, k = 16, 4, 2, 3
    logits = rng.standard_normal((20, E)).astype(np.float32)
    bias = rng.standard_normal(E).astype(np.float32) * 0.3
    top, w = moe_route(logits, k, "sigmoid", norm=True, scale=2.5, selection_bias=bias, groups=(G, Gu))
    probs = 1 / (1 + np.exp(-logits.astype(np.float64)))
    for n in range(len(logits)):
        sel = probs[n] + bias
        score = [sorted(sel[g * 4:(g + 1) * 4])[-2:] for g in range(G)]
        groups = sorted(range(G), key=lambda g: -sum(score[g]))[:Gu]
        allowed = [e for e in range(E) if e // 4 in groups]
        want = sorted(allowed, key=lambda e: -sel[e])[:k]
        assert list(top[n]) == want
        ww = probs[n, want] / probs[n, want].sum() * 2.5
        np.testing.assert_allclose(w[n], ww, rtol=1e-5)
    plain, _ = moe_route(logits, k, "sigmoid", selection_bias=bias)
    assert (plain != top).any()  # the grouping matters for these logits


def test_latent_attention_ops():
    """attention over keys whose first v_dim dims are the values equals attention with those
    values stored apart; split/concat/head_matmul are the numpy expressions they name."""
    ops = NumpyOps()
    rng = np.random.default_rng(4)
    N, H, R, r, S = 5, 3, 6, 2, 8
    lat = ops.zeros((1, S, R + r))
    k = rng.standard_normal((N, 1, R + r)).astype(np.float32)
    ops.kv_store(lat, None, k, None, list(range(N)))
    np.testing.assert_array_equal(lat[0, :N], k[:, 0])
    q = rng.standard_normal((N, H, R + r)).astype(np.float32)
    got = ops.attention(q, lat, None, list(range(N)), N, scale=0.3, v_dim=R)
    vals = np.ascontiguousarray(lat[:, :, :R])
    want = ops.attention(q, lat, vals, list(range(N)), N, scale=0.3)
    assert got.shape == (N, H, R)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    a, b = ops.split(q, [R, r])
    np.testing.assert_array_equal(ops.concat([a, b]), q)
    w = rng.standard_normal((H * 4, R + r)).astype(np.float32)
    np.testing.assert_allclose(ops.head_matmul(q, w), np.einsum("nhk,hmk->nhm", q, w.reshape(H, 4, R + r)),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["deepseek2_v3", "gemma4_e2b"])
def test_state_reuse_and_growth(example, name):
    """Prefix reuse and a state grown past 256 slots (the latent / shared-KV layouts copied
    by State.grown) give what a fresh runner gives."""
    ids = [(i * 7919) % 40000 + 100 for i in range(300)]
    a = load_runner(example(name), device="numpy", n_ctx=1024)
    b = load_runner(example(name), device="numpy", n_ctx=1024)
    try:
        a.generate(ids[:20], max_tokens=2)
        assert a.exec.state.n_slots == 256
        got = a.generate(ids, max_tokens=4)
        assert got["cached_tokens"] == 20 and a.exec.state.n_slots >= 512
        assert got["token_ids"] == b.generate(ids, max_tokens=4, cache_prompt=False)["token_ids"]
        np.testing.assert_allclose(a.prompt_logits(ids[:40]), b.prompt_logits(ids[:40]), atol=1e-4)
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("name", ["qwen35", "granitehybrid", "deepseek2@q"])
def test_cpu_backend_refuses_what_it_cannot_run(example, name):
    """A cpu backend without the optional ops (backends.base.RECURRENT_OPS, MLA_OPS) an
    architecture needs says so at load, naming them (the real one has them: no architecture
    is in models.NO_CPU)."""
    from reflex_ipc.backends.base import MLA_OPS, RECURRENT_OPS
    from reflex_ipc.backends.cpu_ops import CpuOps
    from reflex_ipc.models import ARCHITECTURES, NO_CPU

    assert not set(NO_CPU) & set(ARCHITECTURES)
    lacking = type("Lacking", (CpuOps,), {op: None for op in RECURRENT_OPS + MLA_OPS})
    with pytest.raises(ReflexError) as e:
        _model(example(name), lacking(threads=1))
    assert e.value.kind == "unsupported_architecture"
    assert any(op in e.value.message for op in RECURRENT_OPS + MLA_OPS), e.value.message


def test_noisy_verdict_can_fail():
    from reflex_ipc.testing.parity import noisy_verdict

    def step(tok, row):
        return {"token": tok, "eog": False, "max_abs": float(np.abs(row).max()), "row": np.array(row)}

    a, b = [0.0, 1.0, 10.0, 9.9, 5.0], [0.0, 1.0, 9.9, 10.0, 5.0]  # llama.cpp's rows: quantized, exact
    ref = {"noise": 0.01, "quant": (None, [step(2, a), step(3, a)]), "exact": (None, [step(2, b), step(3, b)])}
    assert noisy_verdict(ref, [2, 3], "length", [])[0]
    assert noisy_verdict(ref, [3, 1], "length", [])[0]  # 0.1 below, its noise there 1%
    assert not noisy_verdict(ref, [4, 1], "length", [])[0]  # 5 below
    assert not noisy_verdict(ref, [2], "length", [])[0]
    eog = {"noise": 0.01, "quant": (None, [step(4, a)]), "exact": (None, [step(4, a)])}
    eog["quant"][1][0]["eog"] = True
    assert noisy_verdict(eog, [], "stop", [4])[0]
    assert not noisy_verdict(eog, [1], "length", [4])[0]


# -- the recurrent hybrids -------------------------------------------------------------------------------
KINDS = {"qwen35": [True, False, True, False], "qwen35_flags": [False, True, True, False],
         "qwen35moe": [True, True, True, False],
         "granitehybrid": [True, False, True, False], "granitehybrid_moe": [False, True, True, False]}


@pytest.mark.parametrize("name", list(KINDS))
def test_hybrid_layer_kinds(example, name):
    assert [L.recurrent for L in _model(example(name)).layers] == KINDS[name]


@pytest.fixture(scope="module", params=["qwen35", "qwen35moe", "granitehybrid_moe", "qwen35@cpu",
                                        "granitehybrid@cpu"])
def runner(example, request):
    name, _, device = request.param.partition("@")
    r = load_runner(example(name), device=device or "numpy", n_ctx=1024)
    assert r.ops.name == (device or "numpy")
    r.name = name
    yield r
    r.close()


def _tol(runner, numpy_tol, cpu_tol):
    return numpy_tol if runner.ops.name == "numpy" else cpu_tol


def test_long_prompt_logits_match_llama_cpp(example, runner, llama_cpp):
    """300 tokens: two prefill chunks, each several chunks of the parallel scan."""
    ids = [int(i) for i in np.random.default_rng(1).integers(100, 40000, size=300)]
    ref = llamaref.logits(llama_cpp, example(runner.name), ids, n_ctx=512)[-1]
    ours = runner.prompt_logits(ids)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-3 * np.abs(ref).max())


def test_system1_groups_and_prompt_reuse(example, runner, llama_cpp):
    """Four candidates: each equals itself scored alone and llama.cpp's log-probs; more candidates
    than one group of sequences (scoring.SEQ_GROUP) give the same numbers; the state holds the
    prompt afterwards (sequence 0), which a generate continuing it reuses."""
    prompt = "The capital of France is"
    cands = [" Paris", " a city in Europe", " London, or so they say", " 42"]
    res = runner.system1(prompt, cands)
    assert res["prompt_tokens"] == len(runner.tok.encode(prompt))
    for c, got in zip(cands, res["candidates"]):
        alone = runner.system1(prompt, [c], cache_prompt=False)["candidates"][0]
        assert abs(alone["logprob"] - got["logprob"]) < 1e-4 * len(got["token_ids"])
    p_ids = runner.tok.encode(prompt)
    for got in res["candidates"]:
        lsm = llamaref.log_softmax(llamaref.logits(llama_cpp, example(runner.name), p_ids + got["token_ids"],
                                                   n_ctx=512))
        per_tok = [lsm[len(p_ids) - 1 + t, tid] for t, tid in enumerate(got["token_ids"])]
        assert abs(sum(per_tok) - got["logprob"]) < _tol(runner, 1e-3, 5e-3) * len(per_tok)
    import reflex_ipc.scoring as scoring

    saved = scoring.SEQ_GROUP
    scoring.SEQ_GROUP = 3
    try:
        many = runner.system1(prompt, cands * 2, cache_prompt=False)["candidates"]
    finally:
        scoring.SEQ_GROUP = saved
    np.testing.assert_allclose([c["logprob"] for c in many], [c["logprob"] for c in res["candidates"]] * 2,
                               rtol=0, atol=1e-4)
    g = runner.generate(p_ids + [28], max_tokens=2)
    assert g["cached_tokens"] == len(p_ids)
    assert g["token_ids"] == runner.generate(p_ids + [28], max_tokens=2, cache_prompt=False)["token_ids"]


def test_long_prefill_equals_step_by_step_decode(runner):
    """A 500-token prompt prefilled in chunks (the parallel form of the recurrence) leaves the
    state that 500 single-token steps leave, and gives the same logits."""
    rng = np.random.default_rng(0)
    ids = [int(i) for i in rng.integers(100, 40000, size=500)]
    ex = runner.exec
    full, _ = ex.prefill(ids, reuse=False)
    full = np.array(full[0])
    _, prefill_layers = ex.state.snapshot()
    ex.prefill(ids[:1], reuse=False)
    for t in ids[1:-1]:
        ex.step(t)
    last = np.array(ex.step(ids[-1])[0])
    _, step_layers = ex.state.snapshot()
    tol = _tol(runner, 1e-4, 2e-3)  # cpu: a 1-ulp flip of its F16 K/V rounding (2^-10)
    np.testing.assert_allclose(last, full, atol=tol * np.abs(full).max())
    for a, b in zip(prefill_layers, step_layers):
        for name in a:
            np.testing.assert_allclose(a[name], b[name], atol=tol * max(1.0, np.abs(b[name]).max()))


def test_prefix_reuse_restarts_and_extends(runner):
    a = runner.generate(IDS, max_tokens=6)
    b = runner.generate(IDS, max_tokens=6)  # the state cannot be cut back to IDS[:-1]: restarts
    assert b["cached_tokens"] == 0 and a["token_ids"] == b["token_ids"]
    held = list(runner.exec.tokens)
    c = runner.generate(held + [28, 339], max_tokens=6)  # extends what is held: reused
    assert c["cached_tokens"] == len(held)
    assert c["token_ids"] == runner.generate(held + [28, 339], max_tokens=6, cache_prompt=False)["token_ids"]


def test_embed_and_streaming(runner):
    e = runner.embed(["hello world"], pooling="last")
    assert e["dim"] == runner.model.hp.n_embd
    seen = []
    out = runner.generate("Once upon", max_tokens=5, on_token=lambda t, text, **_: seen.append(t))
    assert seen[:len(out["token_ids"])] == out["token_ids"]


def test_saved_state_round_trip(runner, tmp_path):
    """kv_export saves the recurrent layers' state of the prompt with the attention K/V;
    kv_import continues from it as if the whole text had been evaluated."""
    path = str(tmp_path / "state.bin")
    prompt = "The capital of France is"
    runner.generate(prompt, max_tokens=1, kv_export=path)
    p_ids = runner.tok.encode(prompt)
    more = runner._continuation_ids(" Paris, and")
    b = runner.generate(" Paris, and", max_tokens=5, kv_import=path)
    assert b["cached_tokens"] == len(p_ids)
    assert b["token_ids"] == runner.generate(p_ids + more, max_tokens=5, cache_prompt=False)["token_ids"]
    s = runner.system1(" Paris", [" is", " was"], kv_import=path)["candidates"]
    ref = runner.system1(runner.tok.decode(p_ids + runner._continuation_ids(" Paris")), [" is", " was"],
                         cache_prompt=False)["candidates"]
    np.testing.assert_allclose([c["logprob"] for c in s], [c["logprob"] for c in ref], rtol=0, atol=1e-4)


def test_state_with_sequences():
    """Per-sequence arrays: fork copies one sequence into others, truncation to a shorter prefix
    restarts (reports False, zeros), growing keeps slots and sequences."""
    from reflex_ipc.runtime.state import SeqSpec, State, attention_spec

    ops = NumpyOps()
    st = State(ops, [attention_spec(1, 2), SeqSpec(s=(2,))], 4, n_seq=2)
    st.layers[1].s[0] = [1, 2]
    st.layers[0].k[0, :2] = 5
    st.tokens = [7, 8]
    st.fork(0, [1])
    np.testing.assert_array_equal(st.layers[1].s[1], [1, 2])
    g = st.grown(8, n_seq=3)
    assert g.n_slots == 8 and g.n_seq == 3 and g.tokens == [7, 8]
    np.testing.assert_array_equal(g.layers[1].s[:2], [[1, 2], [1, 2]])
    np.testing.assert_array_equal(g.layers[0].k[0, :2], 5)
    assert g.truncate(2) and g.tokens == [7, 8]
    assert not g.truncate(1) and g.tokens == []
    assert not g.layers[1].s.any()


def test_backend_without_recurrent_ops_is_unsupported(example):
    class NoScan(NumpyOps):
        name = "cuda"
        delta_net = None

    with pytest.raises(ReflexError) as ei:
        _model(example("qwen35"), NoScan())
    assert ei.value.kind == "unsupported_architecture" and "delta_net" in ei.value.message


def test_state_wider_than_the_backends_kernels_is_unsupported(example):
    """A backend whose recurrent kernels hold narrower state rows (CUDA: 256 columns) refuses the
    model at load, naming the key."""
    class Narrow(NumpyOps):
        max_state_cols = 8

    for name, key in (("qwen35", "qwen35.ssm.state_size"), ("granitehybrid", "granitehybrid.ssm.state_size")):
        with pytest.raises(ReflexError) as ei:
            _model(example(name), Narrow())
        assert ei.value.kind == "unsupported_architecture" and key in ei.value.message


def test_recurrent_models_replay_only_the_decode_step(example):
    """On a backend that captures graphs, a recurrent model's decode step is replayed from one
    (when the model is capturable), but never a padded prefill batch (ForwardGraphs' padding
    tokens come first in batch order and would enter the recurrence)."""
    from reflex_ipc.runtime.executor import Executor

    class Capturing(NumpyOps):
        def capture(self, fn):  # never called here: only its presence matters
            raise AssertionError("not expected")

    ops = Capturing()
    for name, capturable in (("qwen35", True), ("qwen35moe", False), ("granitehybrid", True),
                             ("granitehybrid_moe", False)):
        ex = Executor(ops, _model(example(name), ops), 64)
        assert ex.use_graphs == capturable and not ex.use_forward_graphs, name


def test_stdio_hybrids_stream_system1_and_auto(example):
    """The protocol loop on hybrids: streamed generate and system1 (granitehybrid), generate on
    device "auto" (qwen35: CUDA where usable, else the C cpu backend)."""
    reqs = [dict(id=1, op="generate", model=example("granitehybrid"), device="numpy", prompt="Hello", max_tokens=4,
                 stream=True),
            dict(id=2, op="system1", model=example("granitehybrid"), device="numpy", prompt="Hello",
                 candidates=[" a", " b c"]),
            dict(id=3, op="generate", model=example("qwen35"), device="auto", prompt="Hello", max_tokens=3)]
    p = subprocess.run([sys.executable, "-m", "reflex_ipc", "stdio"], input="".join(json.dumps(r) + "\n" for r in reqs),
                       capture_output=True, text=True, timeout=300)
    events = [json.loads(line) for line in p.stdout.splitlines()]
    results = {e["id"]: e for e in events if e["event"] == "result"}
    assert all(results[i]["ok"] for i in (1, 2, 3)), p.stdout
    tokens = [e["token_id"] for e in events if e["event"] == "token" and e["id"] == 1]
    assert tokens == results[1]["token_ids"] and len(tokens) == 4
    assert len(results[2]["candidates"]) == 2
    assert len(results[3]["token_ids"]) == 3


# -- gpt-oss, Llama 4 ---------------------------------------------------------------------------------
def _llama_rows(llama_cpp, path, ids, first, n_ctx, **kw):
    """llama.cpp's logits (F32 K/V cache) of the rows first..len(ids)-1 of ids: the prompt up to
    `first` in one evaluation, then one token at a time (only the last row is kept: a long
    prompt's every row would not fit)."""
    m = llama_cpp.Llama(str(path), n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=2, n_threads_batch=2,
                        verbose=False, **llamaref.F32_KV, **kw)
    try:
        n_vocab = m.n_vocab()

        def last():
            ptr = llama_cpp.llama_get_logits_ith(m.ctx, -1)
            return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).astype(np.float64, copy=True)

        m.eval(list(ids[:first + 1]))
        rows = [last()]
        for t in ids[first + 1:]:
            m.eval([t])
            rows.append(last())
        return np.array(rows)
    finally:
        m.close()


def _our_rows(ops, path, ids, first, n_ctx, chunk=256):
    from reflex_ipc.runtime.batch import Batch

    m = _model(path, ops)
    st = m.new_state(ops, n_ctx)
    for a in range(0, first, chunk):
        b = min(first, a + chunk)
        m.forward(st, Batch(ops, ids[a:b], range(a, b)), rows=slice(b - a - 1, b - a))
    rows = []
    for p in range(first, len(ids)):
        rows.append(np.asarray(ops.to_numpy(m.forward(st, Batch(ops, ids[p:p + 1], [p]))), np.float64)[0])
    return np.array(rows)


@pytest.mark.parametrize("device", ("numpy", "cpu"))
def test_llama4_chunks_and_temperature_past_8192_tokens(example, llama_cpp, device):
    """Past position 8191 Llama 4's RoPE layers attend only within their chunk of 8192 positions
    and its NoPE layer's queries take the temperature 1 + 0.1 ln 2: the rows from position 8185
    to 8200 of a 8201-token prompt against llama.cpp (F32 K/V cache)."""
    from reflex_ipc.backends.cpu_ops import CpuOps

    path = example("llama4")
    ids = list(np.random.default_rng(7).integers(100, 40000, 8201))
    first, n_ctx = 8185, 8448
    ref = _llama_rows(llama_cpp, path, ids, first, n_ctx)
    ops = NumpyOps() if device == "numpy" else CpuOps(threads=2)
    ours = _our_rows(ops, path, ids, first, n_ctx)
    tol = 1e-3 if device == "numpy" else 5e-3
    err = np.abs(ours - ref).max(axis=1) / np.abs(ref).max()
    assert err.max() <= tol, err
    # the chunks matter here: without them the rows past 8191 move well beyond the tolerance
    import reflex_ipc.models.llama4 as l4

    saved = l4.CHUNK
    l4.CHUNK = 1 << 30
    try:
        far = _our_rows(NumpyOps(), path, ids, 8190, n_ctx)[-1]
    finally:
        l4.CHUNK = saved
    assert np.abs(far - ref[-1]).max() / np.abs(ref).max() > 10 * tol


def test_llama4_chunked_masks_in_system1_and_graphs(example, monkeypatch):
    """Chunked attention through explicit masks (system1's one pass, ForwardGraphs' buckets): with
    a chunk of 8 positions the one-pass candidates equal each candidate scored alone, and a
    masked batch equals the causal runs of the same tokens."""
    import reflex_ipc.models.llama4 as l4
    from reflex_ipc.runtime.batch import Batch, attention_mask

    monkeypatch.setattr(l4, "CHUNK", 8)
    m = attention_mask(np.ones((2, 20), bool), [9, 17], np.arange(20), ("chunk", 8))
    assert list(np.flatnonzero(m[0] == 0)) == list(range(8, 20)) and list(np.flatnonzero(m[1] == 0)) == list(
        range(16, 20))
    r = load_runner(example("llama4"), device="numpy", n_ctx=N_CTX)
    try:
        prompt = "The capital of France is a city whose name"
        cands = [" Paris, of course", " London", " a city of lights and rivers"]
        res = r.system1(prompt, cands)
        for text, c in zip(cands, res["candidates"]):
            alone = r.system1(prompt, [text], cache_prompt=False)["candidates"][0]
            assert abs(alone["logprob"] - c["logprob"]) <= 1e-4 * len(c["token_ids"]), text
        ops = NumpyOps()
        model = _model(example("llama4"), ops)
        ids = IDS[:14]
        causal = model.forward(model.new_state(ops, 32), Batch(ops, ids, range(14)))
        st = model.new_state(ops, 32)
        allowed = np.tril(np.ones((14, 14), bool))
        masked = model.forward(st, Batch(ops, ids, range(14), slots=range(14), allowed=allowed,
                                         key_pos=np.arange(14)))
        np.testing.assert_allclose(masked, causal, rtol=0, atol=1e-5 * np.abs(causal).max())
    finally:
        r.close()


def test_gpt_oss_sinks_and_window_matter(example, llama_cpp):
    """gpt-oss's sinks and sliding window change its logits (llama.cpp agrees with both: the
    matrix); without either reflex's rows move away from llama.cpp's."""
    path = example("gpt-oss")
    ids = IDS + IDS[:8]
    ref = llamaref.logits(llama_cpp, path, ids)
    base = np.abs(_logits(path, ids) - ref).max() / np.abs(ref).max()
    assert base < 1e-3

    class NoSinks(NumpyOps):
        def attention(self, *a, sinks=None, **kw):
            return super().attention(*a, **kw)

    class NoWindow(NumpyOps):
        def attention(self, *a, window=0, **kw):
            return super().attention(*a, **kw)

    for ops in (NoSinks(), NoWindow()):
        assert np.abs(_logits(path, ids, ops) - ref).max() / np.abs(ref).max() > 10 * base + 1e-3


@pytest.mark.parametrize("device", ("numpy", "cpu"))
@pytest.mark.parametrize("name", ["gpt-oss", "llama4"])
def test_new_families_state_prefix_and_logprobs(example, tmp_path, name, device):
    """gpt-oss and Llama 4 like every family: a saved state continues as the unbroken run, a
    second request reuses the first's prompt state (same tokens), log-probabilities come with
    the tokens, and decode steps replay from the backend's graphs where it has them."""
    path = example(name)
    ids = IDS + IDS[:6]
    r = load_runner(path, device=device, n_ctx=N_CTX)
    try:
        full = r.generate(ids, max_tokens=10, cache_prompt=False, logprobs=2)
        assert len(full["logprobs"]) == 10 and all(len(e["top"]) == 2 for e in full["logprobs"])
        again = r.generate(ids, max_tokens=10)
        assert again["token_ids"] == full["token_ids"] and again["cached_tokens"] > 0
        state = str(tmp_path / "s.state")
        r.generate(ids[:12], max_tokens=1, kv_export=state, cache_prompt=False)
    finally:
        r.close()
    r = load_runner(path, device=device, n_ctx=N_CTX)
    try:
        cont = r.generate(ids[12:], max_tokens=10, kv_import=state)
        assert cont["token_ids"] == full["token_ids"]
    finally:
        r.close()
