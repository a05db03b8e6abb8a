"""The architecture matrix: every architecture's examples (models/<arch>.py EXAMPLES, written by
reflex_ipc.testing.synthetic from the architecture's own declaration) x backend x parity rule.
An architecture added with its EXAMPLES is tested here without another line; the CUDA column
is scripts/gpu/gpu-check (gpu_check_models.example_paths: the same examples, CUDA = numpy).

Rules:
- exact, on the F32 examples: llama.cpp (llama-cpp-python) on the same file with an F32 K/V
  cache, so that neither side rounds activations: every prompt row's logits within 1e-3 of
  max|logit| (the cpu backend, float32 products and its F16 K/V cache: 5e-3); 32 greedy tokens
  identical, a divergence passing only where the two tokens are within 0.2% of max|logit|
  (cpu: 0.5%); system1's candidate log-probabilities within 1e-3 (cpu 5e-3) per token, and
  equal to each candidate scored alone. gemma4's GELU: llama.cpp's CPU backend evaluates it
  through a float16 table (GGML_GELU_FP16), which alone moves its logits by 2e-4..1.2e-3 of
  max|logit| here, so the numpy backend runs gemma4 with that table
  (references.ggml_cpu_gelu) against llama.cpp; test_arch_features bounds the exact gelu.
- noise, on the quantized examples (`@q`: Q8_0, Q4_K, Q6_K matrices where rows fit, an F32 twin
  beside): as tests/arch/test_goldens.py holds the committed fixtures (reflex_ipc.testing.parity):
  logits within max(1e-2, 1.5 x llama.cpp's rounding noise) of quantized llama.cpp (2 x for the
  cpu backend) and within 1e-3 of llama.cpp on the twin; 32 greedy tokens llama.cpp's, a
  divergence judged by the noise at that step (parity.noisy_verdict). The noise (max|quantized
  llama.cpp - exact llama.cpp| / max|logit|) is measured here, not recorded.
- fused: the model on testing.fused_numpy.FusedNumpy (numpy plus every fused op written
  independently) equals it on the plain ops: the fused decode path of the layer blocks,
  without a GPU.
- kernels: the CUDA kernels of a decode step per layer (a recording CUDA runtime,
  testing.fake_cuda), fused and plain, pinned per example.
- plan: what the loader reads is what the architecture declares: keys read are in KEYS, the
  file's tensors are the plan's, and every REQUIRED key and planned tensor missing, or a
  tensor of another shape, is a gguf_error naming it.
- ops: generate (greedy, sampled, streaming, stop strings, cancel), system1 and embed over the
  CLI, `reflex stdio` and `reflex uds` answer as the Runner.
"""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from reflex_ipc.backends.numpy_ops import NumpyOps
from reflex_ipc.errors import ReflexError
from reflex_ipc.gguffile import GGUFFile
from reflex_ipc.models import load_model
from reflex_ipc.runtime.batch import Batch
from reflex_ipc.testing import llamaref
from reflex_ipc.testing.parity import (CPU_NOISE_FACTOR, EXACT_REL_TOL, LOGIT_REL_TOL, NOISE_FACTOR, TIE_REL,
                                      greedy_verdict, logit_error, noisy_verdict)
from reflex_ipc.testing.synthetic import examples

pytestmark = pytest.mark.usefixtures("smollm2")  # the examples borrow its tokenizer

EXAMPLES = examples()
F32 = [n for n, (_, s) in EXAMPLES.items() if not s.get("quantize")]
QUANT = [n for n, (_, s) in EXAMPLES.items() if s.get("quantize")]
BACKENDS = ("numpy", "cpu")
N_CTX = 256
IDS = [504, 3575, 282, 4649, 314, 7042, 30, 198, 504, 1797, 1918, 28, 253, 1230, 314, 2680]
PROMPT = "The capital of France is"
CANDIDATES = [" Paris", " London, of course", " a city"]
STEPS = 32
TOL = {"numpy": 1e-3, "cpu": 5e-3}  # exact rule: logits, system1 per token
TIE = {"numpy": 2e-3, "cpu": 5e-3}  # exact rule: greedy near-tie
RECURRENT = ("qwen35", "qwen35moe", "granitehybrid")


def _arch(name):
    return EXAMPLES[name][0]


def _ops(device):
    if device == "numpy":
        return NumpyOps()
    from reflex_ipc.backends.cpu_ops import CpuOps

    return CpuOps(threads=2)


def _gelu_table(monkeypatch, name, device):
    """gemma4 on numpy against llama.cpp: its CPU backend's float16 GELU table (module docstring).
    Returns the runner tag that keeps such runners apart from exact-gelu ones."""
    if _arch(name) == "gemma4" and device == "numpy":
        from reflex_ipc.testing.references import ggml_cpu_gelu

        monkeypatch.setattr(NumpyOps, "gelu", lambda self, a: ggml_cpu_gelu(a))
        return "ggml-gelu"
    return ""


def _forward(ops, path, ids, n_slots=N_CTX):
    with GGUFFile(path) as f:
        model = load_model(ops, f)
        if hasattr(model, "configure"):
            model.configure(N_CTX)
        out = model.forward(model.new_state(ops, n_slots), Batch(ops, ids, range(len(ids))))
        return np.asarray(ops.to_numpy(out), dtype=np.float64)


# -- exact: the F32 examples against llama.cpp on the same file --------------------------------------
@pytest.mark.parametrize("device", BACKENDS)
@pytest.mark.parametrize("name", F32)
def test_logits_exact(example, name, device, llama_cpp, monkeypatch):
    path = example(name)
    ref = llamaref.logits(llama_cpp, path, IDS)
    assert np.abs(ref).max() > 1.0  # logits with a real spread
    _gelu_table(monkeypatch, name, device)
    ours = _forward(_ops(device), path, IDS)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=TOL[device] * np.abs(ref).max())


@pytest.mark.parametrize("device", BACKENDS)
@pytest.mark.parametrize("name", F32)
def test_greedy_exact(example, runners, name, device, llama_cpp, monkeypatch):
    """32 greedy tokens after an 8-token prompt, llama.cpp's up to a near-tie."""
    path = example(name)
    r = runners(path, device, tag=_gelu_table(monkeypatch, name, device))
    out = r.generate(IDS[:8], max_tokens=STEPS, cache_prompt=False)
    got = out["token_ids"]
    ok, msg, _ = llamaref.greedy_check(llama_cpp, path, IDS[:8], got, r.tok.eog_ids, TIE[device])
    assert ok, msg
    assert len(got) == STEPS or out["finish_reason"] == "stop"
    if _arch(name) in RECURRENT:
        assert len(set(got)) > 3  # the hybrids' examples do not just repeat themselves


@pytest.mark.parametrize("device", BACKENDS)
@pytest.mark.parametrize("name", F32)
def test_system1_exact(example, runners, name, device, llama_cpp, monkeypatch):
    """One pass over the candidates equals scoring each alone, and llama.cpp's log-probabilities;
    mean_logprob is the length-normalized score, best_idx the best."""
    path = example(name)
    r = runners(path, device, tag=_gelu_table(monkeypatch, name, device))
    res = r.system1(PROMPT, CANDIDATES)
    p_ids = r._prompt_ids(PROMPT)
    for text, c in zip(CANDIDATES, res["candidates"]):
        n = len(c["token_ids"])
        assert n >= 1 and abs(c["mean_logprob"] - c["logprob"] / n) < 1e-9
        alone = r.system1(PROMPT, [text], cache_prompt=False)["candidates"][0]
        assert alone["token_ids"] == c["token_ids"]
        assert abs(alone["logprob"] - c["logprob"]) <= 1e-4 * n
        lp = llamaref.log_softmax(llamaref.logits(llama_cpp, path, p_ids + c["token_ids"]))
        want = sum(lp[len(p_ids) - 1 + t, tid] for t, tid in enumerate(c["token_ids"]))
        # gemma4 on cpu: the exact gelu against llama.cpp's float16 table (5.1e-3 measured on gemma4_e2b)
        tol = 1e-2 if device == "cpu" and _arch(name) == "gemma4" else TOL[device]
        assert abs(c["logprob"] - want) <= tol * n, (text, c["logprob"], want)
    assert res["best_idx"] == int(np.argmax([c["logprob"] for c in res["candidates"]]))


# -- noise: the quantized examples against quantized llama.cpp and the F32 twin ------------------------
@pytest.mark.parametrize("device", BACKENDS)
@pytest.mark.parametrize("name", QUANT)
def test_quantized_logits(example, runners, name, device, llama_cpp):
    path = example(name)
    ref = llamaref.quantized_reference(llama_cpp, path, IDS, STEPS)
    ours = runners(path, device).prompt_logits(IDS)
    bound = max(LOGIT_REL_TOL, (NOISE_FACTOR if device == "numpy" else CPU_NOISE_FACTOR) * ref["noise"])
    err = logit_error(ours, ref["quant"][0])
    assert err <= bound, f"vs quantized llama.cpp: {err:.3g} (bound {bound:.3g}, its noise {ref['noise']:.3g})"
    # cpu: its own int8 rounding of activations, a draw of noise of llama.cpp's size (1.55x it
    # measured on qwen35moe's random weights, whose rounding noise is chaotic), so the factor of
    # the bound against quantized llama.cpp; test_quantized_cpu_on_the_twin holds its ops to exactness
    exact = EXACT_REL_TOL if device == "numpy" else max(LOGIT_REL_TOL, CPU_NOISE_FACTOR * ref["noise"])
    err = logit_error(ours, ref["exact"][0])
    assert err <= exact, f"vs llama.cpp on the F32 twin: {err:.3g} (limit {exact:.3g})"


@pytest.mark.parametrize("device", BACKENDS)
@pytest.mark.parametrize("name", QUANT)
def test_quantized_greedy(example, runners, name, device, llama_cpp):
    path = example(name)
    ref = llamaref.quantized_reference(llama_cpp, path, IDS, STEPS)
    r = runners(path, device)
    out = r.generate(list(IDS), max_tokens=STEPS, temperature=0.0, cache_prompt=False)
    eog = sorted(r.tok.eog_ids)
    ok, msg = noisy_verdict(ref, out["token_ids"], out["finish_reason"], eog,
                            NOISE_FACTOR if device == "numpy" else CPU_NOISE_FACTOR)
    assert ok, "vs quantized llama.cpp: " + msg
    tie = 2e-3 if device == "numpy" else max(TIE_REL, ref["noise"])
    ok, msg = greedy_verdict(ref["exact"][1], out["token_ids"], out["finish_reason"], eog, tie=tie)
    assert ok, "vs llama.cpp on the F32 twin: " + msg


@pytest.mark.parametrize("name", QUANT)
def test_quantized_cpu_on_the_twin(example, runners, name, llama_cpp):
    """The cpu backend on the F32 twin (no activation rounding: F32 weights take float32
    activations) against llama.cpp on it (F32 K/V cache): its ops, the recurrent and latent
    attention ones included, within the rounding of its F16 K/V cache, prompt and greedy."""
    ref = llamaref.quantized_reference(llama_cpp, example(name), IDS, STEPS)["exact"]
    r = runners(example(name) + ".twin.gguf", "cpu")
    err = logit_error(r.prompt_logits(IDS), ref[0])
    assert err <= TOL["cpu"], f"{err:.3g} of max|logit| (limit {TOL['cpu']})"
    out = r.generate(list(IDS), max_tokens=STEPS, temperature=0.0, cache_prompt=False)
    ok, msg = greedy_verdict(ref[1], out["token_ids"], out["finish_reason"], sorted(r.tok.eog_ids), tie=2e-3)
    assert ok, msg


@pytest.mark.parametrize("name", QUANT)
def test_quantized_system1_on_the_twin(example, runners, name, llama_cpp):
    """On the F32 twin (numpy): the one-pass scores equal each candidate scored alone and
    llama.cpp's (F32 K/V cache) within 1e-3 per token."""
    path = example(name) + ".twin.gguf"
    r = runners(path)
    res = r.system1(PROMPT, CANDIDATES)
    p_ids = r._prompt_ids(PROMPT)
    for text, c in zip(CANDIDATES, res["candidates"]):
        n = len(c["token_ids"])
        alone = r.system1(PROMPT, [text], cache_prompt=False)["candidates"][0]
        assert alone["token_ids"] == c["token_ids"] and abs(alone["logprob"] - c["logprob"]) <= 1e-4 * n
        lp = llamaref.log_softmax(llamaref.logits(llama_cpp, path, p_ids + c["token_ids"]))
        want = sum(lp[len(p_ids) - 1 + t, tid] for t, tid in enumerate(c["token_ids"]))
        assert abs(c["logprob"] - want) <= EXACT_REL_TOL * n, (text, c["logprob"], want)
    assert res["best_idx"] == int(np.argmax([c["logprob"] for c in res["candidates"]]))


@pytest.mark.parametrize("name", QUANT)
def test_quantized_files_hold_k_quants(example, name):
    """Every quantized example holds Q8_0 matrices and K-quant ones (its widths of 256)."""
    with GGUFFile(example(name)) as f:
        types = {t.type_name for t in f.tensors.values()}
    assert {"Q8_0", "Q4_K", "Q6_K"} <= types, types


def test_every_architecture_has_examples_of_both_rules():
    from reflex_ipc.models import ARCHITECTURES

    archs = {a for a, _ in EXAMPLES.values()}
    assert archs == set(ARCHITECTURES)
    seeds = {"qwen3moe", "phi3", "deepseek2", "gemma4", "qwen35", "qwen35moe", "granitehybrid"}
    assert seeds <= {_arch(n) for n in QUANT}


# -- fused: the fused decode path of the blocks, on numpy ------------------------------------------------
@pytest.mark.parametrize("name", F32)
def test_fused_path_equals_the_plain_ops(example, name, monkeypatch):
    """The model on FusedNumpy (every fused op written independently) with fusion on equals it
    with REFLEX_FUSE=0 (the plain ops): a prefill of two interleaved sequences, then one-token
    decodes; fusion on calls the fused ops (the hybrids' element-wise ones included), off none."""
    from reflex_ipc.backends.base import FUSED_OPS
    from reflex_ipc.testing.fused_numpy import FusedNumpy

    outs, used = [], {}
    for fuse in ("1", "0"):
        monkeypatch.setenv("REFLEX_FUSE", fuse)
        ops = FusedNumpy()
        calls = []
        for op in FUSED_OPS:
            f = getattr(ops, op)
            setattr(ops, op, lambda *a, f=f, op=op, **k: calls.append(op) or f(*a, **k))
        with GGUFFile(example(name)) as fh:
            m = load_model(ops, fh)
        st = m.new_state(ops, 16, n_seq=2)
        a = m.forward(st, Batch(ops, [1, 2, 3, 4, 5, 6], [0, 0, 1, 1, 2, 2], slots=[0, 8, 1, 9, 2, 10],
                                seqs=[0, 1, 0, 1, 0, 1]))
        b = m.forward(st, Batch(ops, [5], [3], seqs=[0]))
        c = m.forward(st, Batch(ops, [7], [4], seqs=[0]))
        outs.append(np.concatenate([a, b, c]))
        used[fuse] = set(calls)
    np.testing.assert_allclose(outs[0], outs[1], rtol=2e-5, atol=2e-5 * np.abs(outs[1]).max())
    assert not used["0"] and {"rms_norm_matmul_n"} <= used["1"], used
    if _arch(name) in RECURRENT[:2]:
        assert {"delta_gates", "ssm_conv_silu", "delta_qkv", "rms_norm_gate", "sigmoid_gate"} <= used["1"]


# -- kernels: the CUDA decode step per layer (recording runtime) -------------------------------------------
# Kernels per decode layer of each F32 example (F32 weights; one token), fused (the default) and
# plain (REFLEX_FUSE=0), in layer order. Before the layer blocks (models/blocks.py) gemma3, phi3,
# deepseek2, gemma4 and granitehybrid made no fused call: gemma3 14, phi3 10, deepseek2 21 dense /
# 26 MoE, gemma4 16 (27 with experts, 22 / 19 E2B), qwen35 10 / 10 (attention / DeltaNet), qwen35moe
# 20 / 20, granitehybrid 22 Mamba-2 / 14 attention (17 / 27 with experts).
KERNELS = {
    "deepseek2_v2": ([18, 24, 24], [20, 25, 25]),
    "deepseek2_v3": ([19, 25, 25], [22, 27, 27]),
    "gemma3": ([8, 8, 8], [15, 15, 15]),
    "gemma4": ([9, 9, 9, 9], [17, 17, 17, 17]),
    "gemma4_moe": ([20, 9, 20], [28, 17, 28]),
    "gemma4_e2b": ([14, 14, 14, 13, 13], [23, 23, 23, 20, 20]),
    "gemma4_fused_qkv": ([9, 9, 9], [17, 17, 17]),
    "gpt-oss": ([21, 21, 21, 21], [23, 23, 23, 23]),  # its output biases go on before the residual (llama.cpp's order)
    "granitehybrid": ([18, 8, 18, 8], [22, 15, 22, 15]),
    "granitehybrid_moe": ([13, 23, 23, 13], [17, 26, 26, 17]),
    "llama": ([6, 6], [11, 11]),
    "llama4": ([6, 13, 6, 14], [11, 17, 11, 16]),
    "phi3_fused_long": ([6, 6], [11, 11]),
    "phi3_split_short": ([6, 6], [11, 11]),
    "qwen2": ([9, 9], [14, 14]),
    "qwen3": ([6, 6], [11, 11]),
    "qwen35": ([10, 8, 10, 8], [25, 15, 25, 15]),
    "qwen35_flags": ([8, 10, 10, 8], [15, 25, 25, 15]),
    "qwen35moe": ([20, 20, 20, 18], [34, 34, 34, 24]),
    "qwen3moe": ([10, 10], [14, 14]),
}


@pytest.mark.parametrize("name", F32)
def test_fused_decode_kernels_per_layer(example, name, monkeypatch):
    from reflex_ipc.testing.fake_cuda import decode_layer_kernels, recording_ops

    counts = {}
    for fuse in ("1", "0"):
        monkeypatch.setenv("REFLEX_FUSE", fuse)
        ops = recording_ops()
        with GGUFFile(example(name)) as f:
            layers, head = decode_layer_kernels(ops, load_model(ops, f))
        counts[fuse] = [len(x) for x in layers]
    assert all(a < b for a, b in zip(counts["1"], counts["0"])), counts
    assert (counts["1"], counts["0"]) == KERNELS[name], counts


# -- plan: the loader reads what the architecture declares -------------------------------------------------
class _Altered:
    """A GGUFFile seen without some keys or tensors, or with a tensor of another shape."""

    def __init__(self, f, keys=(), tensors=(), shape=None):
        self._f = f
        self.metadata = {k: v for k, v in f.metadata.items() if k not in keys}
        self.tensors = {n: t for n, t in f.tensors.items() if n not in tensors}
        if shape is not None:
            from reflex_ipc.gguffile import TensorInfo

            n, s = shape
            t = f.tensors[n]
            self.tensors[n] = TensorInfo(n, s, t.ggml_type, t.offset, t.nbytes, t.n_elements)

    def get(self, key, default=None):
        v = self.metadata.get(key, default)
        return v.tolist() if hasattr(v, "tolist") and not isinstance(v, (int, float)) else v

    def __getattr__(self, name):
        return getattr(self._f, name)


@pytest.mark.parametrize("name", F32)
def test_the_plan_is_what_the_loader_reads(example, name):
    from reflex_ipc.models.plan import REQUIRED, selectors, walk
    from reflex_ipc.testing.synthetic import model_class

    cls = model_class(_arch(name))
    ops = NumpyOps()
    with GGUFFile(example(name)) as f:
        model = load_model(ops, f)
        assert model.hp.read <= set(cls.KEYS), model.hp.read - set(cls.KEYS)
        planned = [n for _, n, t in walk(cls.plan(model.d), f.tensors.__contains__) if n in f.tensors]
        assert sorted(planned) == sorted(f.tensors), set(f.tensors) ^ set(planned)
        required = [k for k, v in cls.KEYS.items() if v is REQUIRED and f"{f.architecture}.{k}" in f.metadata]
        for k in required:
            with pytest.raises(ReflexError) as e:
                load_model(ops, _Altered(f, keys={f"{f.architecture}.{k}"}))
            assert e.value.kind == "gguf_error" and f"{f.architecture}.{k}" in e.value.message, k
        needed = [n for _, n, t in walk(cls.plan(model.d), f.tensors.__contains__) if not t.optional]
        choose = selectors(cls.plan(model.d), f.tensors.__contains__)  # their absence picks another layout (Alt) or none (If)
        for n in needed:
            if choose.get(n) != "if":
                with pytest.raises(ReflexError) as e:
                    load_model(ops, _Altered(f, tensors={n}))
                assert e.value.kind == "gguf_error" and (n in e.value.message or choose.get(n) == "alt"), n
            t = f.tensors[n]
            with pytest.raises(ReflexError) as e:
                load_model(ops, _Altered(f, shape=(n, (t.shape[0] + 1,) + tuple(t.shape[1:]))))
            assert e.value.kind == "gguf_error" and n in e.value.message, n


# -- ops over the CLI, stdio and uds -----------------------------------------------------------------------
def _env():
    e = dict(os.environ)
    e.pop("REFLEX_MODEL", None)
    return e


def _requests(path, greedy_text):
    """The ops of one example as protocol requests (ids 1..5), and the stop string used."""
    m = dict(model=path, device="numpy")
    cut = next(i for i in range(1, len(greedy_text)) if greedy_text[i:i + 2].strip())
    stop_at = greedy_text[cut:cut + 2]
    return [dict(id=1, op="generate", prompt=PROMPT, max_tokens=8, stream=True, **m),
            dict(id=2, op="generate", prompt=PROMPT, max_tokens=8, temperature=0.9, top_k=40, seed=7, **m),
            dict(id=3, op="generate", prompt=PROMPT, max_tokens=8, stop=[stop_at], **m),
            dict(id=4, op="system1", prompt=PROMPT, candidates=CANDIDATES, **m),
            dict(id=5, op="embed", input=["a b", "c"], **m)], stop_at


@pytest.fixture(scope="module")
def expected(example):
    """Per example: its protocol requests and what the Runner answers to them (a fresh runner:
    nothing cached from other tests)."""
    from reflex_ipc.engine import load_runner

    out = {}
    for name in F32 + QUANT:
        path = example(name)
        r = load_runner(path, device="numpy")
        try:
            greedy = r.generate(PROMPT, max_tokens=8)
            reqs, stop_at = _requests(path, greedy["text"])
            sampled = r.generate(PROMPT, max_tokens=8, temperature=0.9, top_k=40, seed=7)
            want = {1: greedy["token_ids"], 2: sampled["token_ids"], 3: greedy["text"][:greedy["text"].index(stop_at)],
                    4: [c["logprob"] for c in r.system1(PROMPT, CANDIDATES)["candidates"]],
                    5: r.embed(["a b", "c"])["embeddings"]}
        finally:
            r.close()
        out[name] = (path, reqs, want)
    return out


def _one_per_arch():
    seen, out = set(), []
    for n in F32:
        if _arch(n) not in seen:
            seen.add(_arch(n))
            out.append(n)
    return out


def _check(name, want, tokens, res):
    """tokens: {id: [token events]}, res: {id: result}."""
    assert all(res[i]["ok"] for i in range(1, 6)), (name, res)
    assert res[1]["token_ids"] == want[1] and [t["token_id"] for t in tokens.get(1, [])] == want[1], name
    assert res[2]["token_ids"] == want[2], name
    assert res[3]["finish_reason"] == "stop_string" and res[3]["text"] == want[3], (name, res[3])
    np.testing.assert_allclose([c["logprob"] for c in res[4]["candidates"]], want[4], rtol=0, atol=1e-6)
    np.testing.assert_allclose(res[5]["embeddings"], want[5], rtol=0, atol=1e-5)


def _collect(read):
    tokens, res = {}, {}
    while len(res) < 5:
        m = read()
        assert m is not None, "the server went away"
        if m.get("event") == "token":
            tokens.setdefault(m["id"], []).append(m)
        elif m.get("event") == "result":
            res[m["id"]] = m
    return tokens, res


def _long(path, rid):
    return dict(id=rid, op="generate", model=path, device="numpy", prompt=PROMPT, max_tokens=200, stream=True,
                temperature=1.0, seed=1)


def test_stdio_every_op_on_every_example(expected):
    """One `reflex stdio` serving every example in turn (model and device per request): each
    op's answer is the Runner's; SIGINT cancels a generation and serving goes on."""
    from reflex_ipc.testing.fake_server import Proc

    p = Proc([sys.executable, "-m", "reflex_ipc", "stdio"], env=_env(), ready=True)
    try:
        for name, (path, reqs, want) in expected.items():
            p.send(*reqs)
            _check(name, want, *_collect(lambda: p.read(timeout=120)))
            p.send(_long(path, 9))
            assert p.read(timeout=120)["event"] == "token"
            p.p.send_signal(signal.SIGINT)
            toks, res = p.response()
            assert res["id"] == 9 and not res["ok"] and res["error"]["kind"] == "cancelled", (name, res)
            assert len(toks) < 199
        p.send({"id": 10, "op": "shutdown"})
        assert p.response()[1]["ok"]
        assert p.wait() == 0
    finally:
        p.close()


def test_uds_every_op_on_every_architecture(expected, tmp_path):
    """One `reflex uds` serving one example of every architecture and every quantized one: the
    same answers; a client hanging up in the middle of a generation cancels it and the next
    connection is served."""
    from reflex_ipc.testing.fake_server import UdsClient, stop

    sock = tmp_path / "r.sock"
    proc = subprocess.Popen([sys.executable, "-m", "reflex_ipc", "uds", str(sock)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    try:
        c = UdsClient(sock, timeout=120)
        for name in _one_per_arch() + QUANT:
            path, reqs, want = expected[name]
            c.send(*reqs)
            _check(name, want, *_collect(lambda: c.read(timeout=120)))
            c.send(_long(path, 9))
            assert c.read(timeout=120)["event"] == "token"
            c.close()  # hangs up mid-generation
            t = time.monotonic()
            c = UdsClient(sock, timeout=120)
            assert time.monotonic() - t < 60
            assert c.request({"id": 11, "op": "ping"})[1]["ok"]
        c.close()
    finally:
        rc, out = stop(proc)
    assert rc == 0 and out == b""


def _cli(*args):
    p = subprocess.run([sys.executable, "-m", "reflex_ipc", *args], capture_output=True, text=True, timeout=300,
                       env=_env())
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.mark.parametrize("name", F32 + QUANT)
def test_cli_every_op(example, name):
    """The CLI's generate (greedy, sampled, with a stop string), system1 and embed answer as the
    Runner (device numpy, the file's own context)."""
    from reflex_ipc.engine import load_runner

    path = example(name)
    r = load_runner(path, device="numpy")
    try:
        greedy = r.generate(PROMPT, max_tokens=8)
        sampled = r.generate(PROMPT, max_tokens=8, temperature=0.9, top_k=40, seed=7)
        scores = [c["logprob"] for c in r.system1(PROMPT, CANDIDATES)["candidates"]]
        emb = r.embed(["a b", "c"])
    finally:
        r.close()
    common = ("--model", path, "--device", "numpy", "--json")
    assert _cli("generate", *common, "--max-tokens", "8", PROMPT)["token_ids"] == greedy["token_ids"]
    out = _cli("generate", *common, "--max-tokens", "8", "--temperature", "0.9", "--top-k", "40", "--seed", "7",
               PROMPT)
    assert out["token_ids"] == sampled["token_ids"]
    _, stop_at = _requests(path, greedy["text"])
    out = _cli("generate", *common, "--max-tokens", "8", "--stop", stop_at, PROMPT)
    assert out["finish_reason"] == "stop_string" and out["text"] == greedy["text"][:greedy["text"].index(stop_at)]
    out = _cli("system1", *common, *(f"--candidate={c}" for c in CANDIDATES), PROMPT)
    np.testing.assert_allclose([c["logprob"] for c in out["candidates"]], scores, rtol=0, atol=1e-4)
    out = _cli("embed", *common, "a b", "c")
    assert len(out["embeddings"]) == 2 and len(out["embeddings"][0]) == emb["dim"]
    np.testing.assert_allclose(out["embeddings"], emb["embeddings"], rtol=0, atol=1e-4)
