"""Recurrent hybrids on the numpy backend — qwen35 / qwen35moe (Gated DeltaNet + gated attention) and
granitehybrid (Mamba-2 + attention, dense or MoE) — on synthetic F32 GGUFs
(reflex_ipc.testing.synthetic.hybrid_gguf / granite_gguf: random weights, llama.cpp's tensor
names and keys, SmolLM2's tokenizer), against llama.cpp (llama-cpp-python, F32 KV cache;
its recurrent state is F32) and against themselves: prefill vs step-by-step decode, system1
vs scoring each candidate alone, prefix reuse, bad metadata."""

import numpy as np
import pytest

from reflex_ipc.backends.numpy_ops import NumpyOps
from reflex_ipc.engine import load_runner
from reflex_ipc.errors import ReflexError
from reflex_ipc.gguffile import GGUFFile
from reflex_ipc.models import load_model
from reflex_ipc.runtime.batch import Batch
from reflex_ipc.testing.synthetic import GRANITE_CONFIGS, HYBRID_CONFIGS, granite_gguf, hybrid_gguf

pytestmark = pytest.mark.usefixtures("smollm2")  # the models borrow its tokenizer

IDS = [504, 3575, 282, 4649, 314, 7042, 30, 198, 504, 1797, 1918, 28, 339, 1510, 314, 3853]
F32_CACHE = dict(type_k=0, type_v=0)  # GGML_TYPE_F32
MODELS = {**{n: (hybrid_gguf, c) for n, c in HYBRID_CONFIGS.items()},
          **{n: (granite_gguf, c) for n, c in GRANITE_CONFIGS.items()}}
KINDS = {"qwen35": [True, False, True, False], "qwen35_flags": [False, True, True, False],
         "qwen35moe": [True, True, True, False],
         "granitehybrid": [True, False, True, False], "granitehybrid_moe": [False, True, True, False]}


@pytest.fixture(scope="module")
def models(tmp_path_factory, smollm2):
    d = tmp_path_factory.mktemp("hybrid")
    out = {}
    for name, (write, cfg) in MODELS.items():
        path = str(d / f"{name}.gguf")
        write(path, tokenizer=smollm2, **cfg)
        out[name] = path
    return out


@pytest.fixture(scope="module", params=["qwen35", "qwen35moe", "granitehybrid_moe", "qwen35@cpu",
                                        "granitehybrid@cpu"])
def runner(models, request):
    name, _, device = request.param.partition("@")
    r = load_runner(models[name], device=device or "numpy", n_ctx=1024)
    assert r.ops.name == (device or "numpy")
    r.name = name
    yield r
    r.close()


def _llama(llama_cpp, path, n_ctx=512):
    return llama_cpp.Llama(path, logits_all=True, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, verbose=False,
                           **F32_CACHE)


def _llama_logits(llama_cpp, path, ids):
    llm = _llama(llama_cpp, path)
    llm.eval(ids)
    out = np.array(llm.scores[:len(ids)], dtype=np.float64)
    llm.close()
    return out


CPU_REL_TOL = 5e-3  # the cpu backend on these F32 files: float32 products, its F16 KV cache


def _tol(runner, numpy_tol, cpu_tol):
    return numpy_tol if runner.ops.name == "numpy" else cpu_tol


def _ops(device):
    if device == "numpy":
        return NumpyOps()
    from reflex_ipc.backends.cpu_ops import CpuOps

    return CpuOps(threads=2)


@pytest.mark.parametrize("device", ["numpy", "cpu"])
@pytest.mark.parametrize("name", list(MODELS))
def test_logits_match_llama_cpp(models, name, device, llama_cpp):
    """Every token's logits of a 16-token prompt, on both CPU backends (cpu: the C recurrent kernels)."""
    path = models[name]
    ref = _llama_logits(llama_cpp, path, IDS)
    ops = _ops(device)
    with GGUFFile(path) as f:
        model = load_model(ops, f)
        assert model.recurrent == KINDS[name]
        logits = model.forward(model.new_state(ops, 64), Batch(ops, IDS, range(len(IDS))))
    tol = 1e-3 if device == "numpy" else CPU_REL_TOL
    np.testing.assert_allclose(logits, ref, rtol=0, atol=tol * np.abs(ref).max())


def test_long_prompt_logits_match_llama_cpp(models, runner, llama_cpp):
    """300 tokens: two prefill chunks, each several chunks of the parallel scan."""
    ids = [int(i) for i in np.random.default_rng(1).integers(100, 40000, size=300)]
    llm = _llama(llama_cpp, models[runner.name])
    llm.eval(ids)
    ref = np.array(llm.scores[len(ids) - 1], dtype=np.float64)
    llm.close()
    ours = runner.prompt_logits(ids)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-3 * np.abs(ref).max())


def test_greedy_matches_llama_cpp(models, runner, llama_cpp):
    """32 greedy tokens identical to llama.cpp's, except after a near-tie (< 0.2% of max|logit|)."""
    ids = IDS[:8]
    ours = runner.generate(ids, max_tokens=32, cache_prompt=False)["token_ids"]
    llm = _llama(llama_cpp, models[runner.name])
    llm.eval(ids)
    theirs = []
    for _ in range(32):
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
        top2 = np.sort(row)[-2:]
        tok = int(np.argmax(row))
        k = len(theirs)
        if k < len(ours) and ours[k] != tok:
            assert top2[1] - top2[0] < 2e-3 * np.abs(row).max(), f"token {k}: {ours[k]} != {tok}"
            break
        theirs.append(tok)
        if tok in runner.tok.eog_ids:
            break
        llm.eval([tok])
    llm.close()
    assert len(set(theirs)) > 3  # the model does not just repeat itself
    assert ours[:len(theirs)] == theirs[:len(ours)]


def test_system1_equals_each_candidate_alone_and_llama_cpp(models, runner, llama_cpp):
    prompt = "The capital of France is"
    cands = [" Paris", " a city in Europe", " London, or so they say", " 42"]
    res = runner.system1(prompt, cands)
    assert res["prompt_tokens"] == len(runner.tok.encode(prompt))
    for c, got in zip(cands, res["candidates"]):
        alone = runner.system1(prompt, [c], cache_prompt=False)["candidates"][0]
        assert abs(alone["logprob"] - got["logprob"]) < 1e-4 * len(got["token_ids"])
    p_ids = runner.tok.encode(prompt)
    for got in res["candidates"]:
        ids = p_ids + got["token_ids"]
        z = _llama_logits(llama_cpp, models[runner.name], ids)
        z = z - z.max(axis=1, keepdims=True)
        lsm = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        per_tok = [lsm[len(p_ids) - 1 + t, tid] for t, tid in enumerate(got["token_ids"])]
        assert abs(sum(per_tok) - got["logprob"]) < _tol(runner, 1e-3, CPU_REL_TOL) * len(per_tok)
    # more candidates than one group of sequences (scoring.SEQ_GROUP): the same numbers
    import reflex_ipc.scoring as scoring

    saved = scoring.SEQ_GROUP
    scoring.SEQ_GROUP = 3
    try:
        many = runner.system1(prompt, cands * 2, cache_prompt=False)["candidates"]
    finally:
        scoring.SEQ_GROUP = saved
    np.testing.assert_allclose([c["logprob"] for c in many], [c["logprob"] for c in res["candidates"]] * 2,
                               rtol=0, atol=1e-4)
    # the state holds the prompt afterwards (sequence 0): a generate continuing it reuses it
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


@pytest.mark.parametrize("change, key", [
    (dict(recurrent=[True, False, True]), "qwen35.attention.recurrent_layers"),
    (dict(meta={"ssm.inner_size": 60}), "qwen35.ssm.inner_size"),
    (dict(n_k=3, n_v=4), "qwen35.ssm.group_count"),
    (dict(meta={"rope.dimension_sections": [0, 0, 0, 0]}), "qwen35.rope.dimension_sections"),
    (dict(meta={"rope.dimension_sections": [4, 4, 4, 0]}), "qwen35.rope.dimension_sections"),
    (dict(drop=("blk.0.ssm_a",)), "blk.0.ssm_a"),
    (dict(meta={"ssm.conv_kernel": 1}), "qwen35.ssm.conv_kernel"),
])
def test_bad_qwen35_metadata_is_a_gguf_error_naming_the_key(tmp_path, smollm2, change, key):
    cfg = dict(HYBRID_CONFIGS["qwen35"], **change)
    if "recurrent" in change:
        cfg.pop("interval")
    path = tmp_path / "bad.gguf"
    hybrid_gguf(path, tokenizer=smollm2, **cfg)
    with GGUFFile(str(path)) as f, pytest.raises(ReflexError) as ei:
        load_model(NumpyOps(), f)
    assert ei.value.kind == "gguf_error" and key in ei.value.message


@pytest.mark.parametrize("change, key", [
    (dict(meta={"ssm.inner_size": 96}), "granitehybrid.ssm.inner_size"),
    (dict(n_group=3), "granitehybrid.ssm.group_count"),
    (dict(kv=[0, 3, 0, 2]), "granitehybrid.attention.head_count_kv"),
    (dict(meta={"attention.head_count_kv": [0, 2, 0]}), "granitehybrid.attention.head_count_kv"),
    (dict(drop=("blk.0.ssm_d",)), "blk.0.ssm_d"),
    (dict(n_expert=4, n_used=0), "granitehybrid.expert_used_count"),
])
def test_bad_granite_metadata_is_a_gguf_error_naming_the_key(tmp_path, smollm2, change, key):
    path = tmp_path / "bad.gguf"
    granite_gguf(path, tokenizer=smollm2, **dict(GRANITE_CONFIGS["granitehybrid"], **change))
    with GGUFFile(str(path)) as f, pytest.raises(ReflexError) as ei:
        load_model(NumpyOps(), f)
    assert ei.value.kind == "gguf_error" and key in ei.value.message


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


def test_backend_without_recurrent_ops_is_unsupported(models):
    class NoScan(NumpyOps):
        name = "cuda"
        delta_net = None

    with GGUFFile(models["qwen35"]) as f, pytest.raises(ReflexError) as ei:
        load_model(NoScan(), f)
    assert ei.value.kind == "unsupported_architecture" and "delta_net" in ei.value.message


def test_stdio_generate_stream_and_system1(models):
    """The protocol loop on hybrids: streamed generate and system1 (granitehybrid), generate on
    device "auto" (qwen35: CUDA where usable, else the C cpu backend)."""
    import json
    import subprocess
    import sys

    reqs = [dict(id=1, op="generate", model=models["granitehybrid"], device="numpy", prompt="Hello", max_tokens=4,
                 stream=True),
            dict(id=2, op="system1", model=models["granitehybrid"], device="numpy", prompt="Hello",
                 candidates=[" a", " b c"]),
            dict(id=3, op="generate", model=models["qwen35"], device="auto", prompt="Hello", max_tokens=3)]
    p = subprocess.run([sys.executable, "-m", "reflex_ipc", "stdio"], input="".join(json.dumps(r) + "\n" for r in reqs),
                       capture_output=True, text=True, timeout=300)
    events = [json.loads(line) for line in p.stdout.splitlines()]
    results = {e["id"]: e for e in events if e["event"] == "result"}
    assert all(results[i]["ok"] for i in (1, 2, 3)), p.stdout
    tokens = [e["token_id"] for e in events if e["event"] == "token" and e["id"] == 1]
    assert tokens == results[1]["token_ids"] and len(tokens) == 4
    assert len(results[2]["candidates"]) == 2
    assert len(results[3]["token_ids"]) == 3


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


def test_state_wider_than_the_backends_kernels_is_unsupported(models):
    """A backend whose recurrent kernels hold narrower state rows (CUDA: 256 columns) refuses the
    model at load, naming the key."""
    class Narrow(NumpyOps):
        max_state_cols = 8

    for name, key in (("qwen35", "qwen35.ssm.state_size"), ("granitehybrid", "granitehybrid.ssm.state_size")):
        with GGUFFile(models[name]) as f, pytest.raises(ReflexError) as ei:
            load_model(Narrow(), f)
        assert ei.value.kind == "unsupported_architecture" and key in ei.value.message


def test_recurrent_models_replay_only_the_decode_step(models):
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
        with GGUFFile(models[name]) as f:
            ex = Executor(ops, load_model(ops, f), 64)
            assert ex.use_graphs == capturable and not ex.use_forward_graphs, name
