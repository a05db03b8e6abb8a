"""Each architecture on tiny synthetic GGUFs: against a float64 reference written from the
architecture's definition, against llama.cpp (llama-cpp-python) on the same file, and the
KV cache against full recomputation.

The tiny models borrow SmolLM2's tokenizer metadata (so llama.cpp and our tokenizer both
load them) and have random weights; `tiny_gguf` and `reference_logits` live in
reflex_ipc.testing (synthetic, references).
"""

import numpy as np
import pytest

from reflex_ipc.backends.numpy_ops import NumpyOps
from reflex_ipc.errors import ReflexError
from reflex_ipc.gguffile import GGUFFile
from reflex_ipc.models import load_model
from reflex_ipc.runtime.batch import Batch
from reflex_ipc.testing.references import reference_logits
from reflex_ipc.testing.synthetic import TINY_CONFIGS as CONFIGS
from reflex_ipc.testing.synthetic import tiny_gguf

pytestmark = pytest.mark.usefixtures("smollm2")  # the tiny models borrow its tokenizer


@pytest.fixture(scope="module")
def tiny(tiny_models):
    """name -> (path, float64 tensors, config)"""
    return tiny_models


IDS = [504, 3575, 282, 4649, 314, 7042, 30, 198, 504, 1797, 1918]


def _run(ops, model, ids, n_ctx=64, rows=None, output="logits"):
    state = model.new_state(ops, n_ctx)
    return state, model.forward(state, Batch(ops, ids, range(len(ids))), rows=rows, output=output)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_forward_matches_float64_reference(tiny, name):
    path, t, cfg = tiny[name]
    ops = NumpyOps()
    with GGUFFile(path) as f:
        model = load_model(ops, f)
        _, logits = _run(ops, model, IDS)
        ref = reference_logits(t, cfg, IDS)
        np.testing.assert_allclose(logits, ref, rtol=0, atol=2e-4 * np.abs(ref).max())
        _, hidden = _run(ops, model, IDS, output="hidden")
        np.testing.assert_allclose(hidden, reference_logits(t, cfg, IDS, hidden=True), rtol=0, atol=1e-4)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_kv_cache_decode_matches_full_pass(tiny, name):
    """Prefill a prefix, then one token at a time: every step's logits equal the full pass's row."""
    path, _, _ = tiny[name]
    ops = NumpyOps()
    with GGUFFile(path) as f:
        model = load_model(ops, f)
        _, full = _run(ops, model, IDS)
        cache, first = _run(ops, model, IDS[:4], rows=slice(3, 4))
        np.testing.assert_allclose(first[0], full[3], atol=1e-4)
        for p in range(4, len(IDS)):
            step = model.forward(cache, Batch(ops, [IDS[p]], [p]))
            np.testing.assert_allclose(step[0], full[p], atol=1e-4)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_match_llama_cpp(tiny, name, llama_cpp):
    path, _, _ = tiny[name]
    llm = llama_cpp.Llama(path, logits_all=True, n_ctx=64, n_batch=64, verbose=False)
    llm.eval(IDS)
    ref = np.array(llm.scores[:len(IDS)], dtype=np.float64)
    del llm
    ops = NumpyOps()
    with GGUFFile(path) as f:
        _, logits = _run(ops, load_model(ops, f), IDS)
    # llama.cpp keeps K/V in float16 (and rounds activations to Q8_0 for the Q8_0 model)
    tol = (2e-2 if "q8" in name else 2e-3) * np.abs(ref).max()
    np.testing.assert_allclose(logits, ref, rtol=0, atol=tol)


def test_gemma3_ignores_attention_softcap_key_like_llamacpp(tmp_path):
    """llama.cpp's gemma3 graph never applies attn_logit_softcapping (only gemma2's
    does): a gemma3 file carrying the key gives the logits of one without it."""
    cfg = dict(CONFIGS["gemma3"], attn_softcap=0.5)
    path = tmp_path / "g.gguf"
    t = tiny_gguf(path, **cfg)
    ops = NumpyOps()
    with GGUFFile(str(path)) as f:
        model = load_model(ops, f)
        assert [L.swa for L in model.layers] == [True, True, False]
        _, logits = _run(ops, model, IDS)
    ref = reference_logits(t, dict(cfg, attn_softcap=None), IDS)
    np.testing.assert_allclose(logits, ref, rtol=0, atol=2e-4 * np.abs(ref).max())
    capped = reference_logits(t, cfg, IDS)
    assert np.abs(capped - ref).max() > 1e-2  # the key would matter if it were applied


def test_gemma3_sliding_window_pattern_as_flags(tmp_path):
    cfg = dict(CONFIGS["gemma3"], pattern=[False, True, True])
    path = tmp_path / "g.gguf"
    t = tiny_gguf(path, **cfg)
    ops = NumpyOps()
    with GGUFFile(str(path)) as f:
        model = load_model(ops, f)
        assert [L.swa for L in model.layers] == [False, True, True]
        _, logits = _run(ops, model, IDS)
    ref = reference_logits(t, cfg, IDS)
    np.testing.assert_allclose(logits, ref, rtol=0, atol=2e-4 * np.abs(ref).max())
    other = reference_logits(t, CONFIGS["gemma3"], IDS)
    assert np.abs(other - ref).max() > 1e-3  # the layer pattern matters for these weights


def test_unsupported_architecture(tmp_path):
    path = tmp_path / "m.gguf"
    tiny_gguf(path, arch="gpt2")
    with GGUFFile(str(path)) as f:
        with pytest.raises(ReflexError) as e:
            load_model(NumpyOps(), f)
    assert e.value.kind == "unsupported_architecture"
    assert "gpt2" in e.value.message


def test_missing_tensor_is_named(tmp_path):
    path = tmp_path / "m.gguf"
    tiny_gguf(path, arch="qwen3", qk_norm=True, drop=("blk.1.attn_k_norm.weight",))
    with GGUFFile(str(path)) as f:
        with pytest.raises(ReflexError) as e:
            load_model(NumpyOps(), f)
    assert e.value.kind == "gguf_error"
    assert "blk.1.attn_k_norm.weight" in e.value.message


def test_tied_output_falls_back_to_token_embd(tiny):
    path, t, _ = tiny["llama"]
    assert "output.weight" not in t
    with GGUFFile(path) as f:
        model = load_model(NumpyOps(), f)
    np.testing.assert_array_equal(model.output, t["token_embd.weight"].astype(np.float32))


def test_smollm2_hparams_from_metadata(smollm2):
    with GGUFFile(smollm2) as f:
        from reflex_ipc.models.common import HParams

        hp = HParams(f)
    assert (hp.n_layer, hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_ff) == (30, 576, 9, 3, 64, 1536)
    assert hp.rope_base == 100000.0 and hp.rope_scale == 1.0 and hp.n_vocab == 49152
