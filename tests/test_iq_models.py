"""Models quantized in the IQ formats, the ternary ones and MXFP4 (issue 31), against llama.cpp.

One small llama model per format (synthetic.tiny_gguf: SmolLM2's tokenizer, 2 layers of width
256, every matrix, the tied embedding and output included, in that format: gguf-py's
quantization for TQ1_0 / TQ2_0 / MXFP4, random well-formed blocks for the IQ formats, which
gguf-py cannot quantize) and its F32 twin (written beside it: the blocks dequantized by
gguf-py). Checked as tests/test_new_archs.py checks the quantized architectures:

- the numpy backend on the quantized file computes with the dequantized weights, so it
  matches llama.cpp on the F32 twin (F32 KV cache) within 1e-3 of max|logit|, greedy tokens
  identical under the near-tie rule; and quantized llama.cpp within max(1e-2, 1.5 x
  llama.cpp's own rounding noise) (noise: max|quantized - exact llama.cpp| / max|logit|);
- the cpu backend (the blocks read in place, its own int8 activation rounding) within
  max(1e-2, 2 x that noise) of both, greedy tokens llama.cpp's on the twin under a near-tie
  rule of that noise.
"""

import numpy as np
import pytest

from reflex_ipc.engine import load_runner
from reflex_ipc.testing.parity import CPU_NOISE_FACTOR, LOGIT_REL_TOL, NOISE_FACTOR, TIE_REL, greedy_verdict, logit_error
from reflex_ipc.testing.synthetic import tiny_gguf

pytestmark = pytest.mark.usefixtures("smollm2")  # the models borrow its tokenizer

FORMATS = ["IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0",
           "MXFP4"]
CONFIG = dict(arch="llama", n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=512)
N_CTX = 128
IDS = [504, 3575, 282, 4649, 314, 7042, 30, 198, 504, 1797, 1918, 28, 253, 1230, 314, 2680]
STEPS = 24
EXACT_REL_TOL = 1e-3
EXACT_TIE = 2e-3


@pytest.fixture(scope="session")
def iq_model(tmp_path_factory, smollm2):
    """iq_model(fmt): the path of the model in format fmt (its F32 twin: path + '.twin.gguf')."""
    d = tmp_path_factory.mktemp("iq_models")
    paths = {}

    def get(fmt):
        if fmt not in paths:
            p = d / f"{fmt}.gguf"
            tiny_gguf(p, tokenizer=smollm2, qtype=fmt, seed=31, twin=str(p) + ".twin.gguf", **CONFIG)
            paths[fmt] = str(p)
        return paths[fmt]
    return get


_RUNNERS, _REFS = {}, {}


@pytest.fixture(scope="module", autouse=True)
def _close_runners():
    yield
    for r in _RUNNERS.values():
        r.close()
    _RUNNERS.clear()
    _REFS.clear()


def runner(path, device):
    if (path, device) not in _RUNNERS:
        r = load_runner(path, device=device, n_ctx=N_CTX)
        assert r.ops.name == device
        _RUNNERS[path, device] = r
    return _RUNNERS[path, device]


def _steps(llama_cpp, llm):
    vocab, n_vocab = llm._model.vocab, llm.n_vocab()

    def last():
        ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).astype(np.float64, copy=True)

    llm.reset()
    llm.eval(IDS)
    z = first = last()
    steps = []
    for _ in range(STEPS):
        order = np.argsort(-z, kind="stable")[:5]
        tok = int(order[0])
        steps.append({"token": tok, "gap": float(z[order[0]] - z[order[1]]), "max_abs": float(np.abs(z).max()),
                      "eog": bool(llama_cpp.llama_vocab_is_eog(vocab, tok)),
                      "top5": [[int(t), float(z[t])] for t in order], "row": z})
        llm.eval([tok])
        z = last()
    return first, steps


def reference(llama_cpp, path):
    """llama.cpp on the quantized file and on its F32 twin (F32 KV cache), and its rounding noise."""
    if path not in _REFS:
        g = {}
        for key, p, kw in (("quant", path, {}), ("exact", path + ".twin.gguf", dict(type_k=0, type_v=0))):
            llm = llama_cpp.Llama(p, n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, n_threads=1, n_threads_batch=1,
                                  verbose=False, **kw)
            try:
                g[key] = _steps(llama_cpp, llm)
            finally:
                llm.close()
        q, x = g["quant"][0], g["exact"][0]
        _REFS[path] = dict(g, noise=float((np.abs(q - x) / np.abs(q).max()).max()))
    return _REFS[path]


@pytest.mark.parametrize("device", ["numpy", "cpu"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_logits_match_llama_cpp(iq_model, llama_cpp, fmt, device):
    path = iq_model(fmt)
    ref = reference(llama_cpp, path)
    ours = runner(path, device).prompt_logits(IDS)
    factor = NOISE_FACTOR if device == "numpy" else CPU_NOISE_FACTOR
    bound = max(LOGIT_REL_TOL, factor * ref["noise"])
    err = logit_error(ours, ref["quant"][0])
    assert err <= bound, f"vs quantized llama.cpp: {err:.3g} (bound {bound:.3g}, its noise {ref['noise']:.3g})"
    exact = EXACT_REL_TOL if device == "numpy" else bound
    err = logit_error(ours, ref["exact"][0])
    assert err <= exact, f"vs llama.cpp on the F32 twin: {err:.3g} (limit {exact:.3g})"


@pytest.mark.parametrize("device", ["numpy", "cpu"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_greedy_matches_llama_cpp(iq_model, llama_cpp, fmt, device):
    path = iq_model(fmt)
    ref = reference(llama_cpp, path)
    r = runner(path, device)
    out = r.generate(list(IDS), max_tokens=STEPS, temperature=0.0, cache_prompt=False)
    tie = EXACT_TIE if device == "numpy" else max(TIE_REL, CPU_NOISE_FACTOR * ref["noise"])
    ok, msg = greedy_verdict(ref["exact"][1], out["token_ids"], out["finish_reason"], sorted(r.tok.eog_ids), tie=tie)
    assert ok, "vs llama.cpp on the F32 twin: " + msg


@pytest.mark.parametrize("fmt", FORMATS)
def test_cpu_reads_the_blocks_in_place(iq_model, fmt):
    """No dequantized copy: the cpu backend's matrices are views of the file's blocks, of its type."""
    from reflex_ipc.ggml_types import TYPES

    m = runner(iq_model(fmt), "cpu").model
    L = m.layers[0]
    ws = [m.tok_embd, m.output] + [getattr(L, n) for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate",
                                                             "ffn_up", "ffn_down")]
    for w in ws:
        if w is None:  # the LM head is the (tied) embedding
            continue
        assert w.ggml_type == TYPES[fmt][0] and w.raw.dtype == np.uint8 and not w.raw.flags.owndata, fmt
