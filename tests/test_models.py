"""Each architecture on tiny synthetic GGUFs: against a float64 reference written from the
architecture's definition, against llama.cpp (llama-cpp-python) on the same file, and the
KV cache against full recomputation.

The tiny models borrow SmolLM2's tokenizer metadata (so llama.cpp and our tokenizer both
load them) and have random weights. `tiny_gguf` is also used by tests/test_engine.py.
"""

import math

import numpy as np
import pytest

from reflex_ipc.backends.numpy_ops import NumpyOps
from reflex_ipc.errors import ReflexError
from reflex_ipc.gguffile import GGUFFile
from reflex_ipc.models import load_model
from reflex_ipc.runtime.batch import Batch
from reflex_ipc.modelpath import resolve_model

gguf = pytest.importorskip("gguf")

_TOKENIZER_KV = None


def _tokenizer_kv():
    """SmolLM2's tokenizer.* metadata as (key, value, type, subtype) tuples, read once."""
    global _TOKENIZER_KV
    if _TOKENIZER_KV is None:
        r = gguf.GGUFReader(resolve_model(None))
        kv = []
        for name, field in r.fields.items():
            if name.startswith("tokenizer.") and name != "tokenizer.chat_template":
                sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
                kv.append((name, field.contents(), field.types[0], sub))
        _TOKENIZER_KV = kv
    return _TOKENIZER_KV


N_VOCAB = 49152

CONFIGS = {
    "llama": dict(arch="llama", n_layer=2),
    "llama_untied_ff": dict(arch="llama", n_layer=2, untied=True, rope_freqs=True, rope_base=500.0),
    "llama_q8_0": dict(arch="llama", n_layer=2, qtype="Q8_0"),
    "qwen2": dict(arch="qwen2", n_layer=2, qkv_bias=True, rope_base=1e6),
    "qwen3": dict(arch="qwen3", n_layer=2, qk_norm=True, rope_base=1e6, head_dim=16),
    "gemma3": dict(arch="gemma3", n_layer=3, qk_norm=True, window=3, pattern=3, rope_base=1e6,
                   rope_base_swa=10000.0, rope_factor=4.0, final_softcap=5.0),
}


def tiny_gguf(path, arch="llama", n_layer=2, n_embd=32, n_head=4, n_head_kv=2, head_dim=None,
              n_ff=64, rope_base=10000.0, eps=1e-5, untied=False, qkv_bias=False, qk_norm=False,
              rope_freqs=False, window=0, pattern=None, rope_base_swa=None, rope_factor=None,
              final_softcap=None, attn_softcap=None, qtype=None, seed=0, drop=()):
    """Write a random tiny model; returns {tensor name: float64 numpy array (numpy order)}."""
    rng = np.random.default_rng(seed)
    hd = head_dim or n_embd // n_head
    w = gguf.GGUFWriter(str(path), arch)
    for name, value, vtype, sub in _tokenizer_kv():
        w.add_key_value(name, value, vtype, sub_type=sub)
    w.add_context_length(128)
    w.add_block_count(n_layer)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_freq_base(rope_base)
    w.add_layer_norm_rms_eps(eps)
    if head_dim:
        w.add_key_length(hd)
        w.add_value_length(hd)
    if window:
        w.add_sliding_window(window)
        if isinstance(pattern, list):  # per-layer flags
            w.add_array(f"{arch}.attention.sliding_window_pattern", pattern)
        else:
            w.add_uint32(f"{arch}.attention.sliding_window_pattern", pattern)
    if rope_base_swa is not None:
        w.add_float32(f"{arch}.rope.freq_base_swa", rope_base_swa)
    if rope_factor:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope_factor)
    if final_softcap:
        w.add_final_logit_softcapping(final_softcap)
    if attn_softcap:
        w.add_float32(f"{arch}.attn_logit_softcapping", attn_softcap)

    tensors = {}
    quant = getattr(gguf.GGMLQuantizationType, qtype) if qtype else None

    def add(name, shape, scale, offset=0.0, matrix=False):
        if name in drop:
            return
        a = (offset + scale * rng.standard_normal(shape)).astype(np.float32)
        if matrix and quant is not None:
            q = gguf.quants.quantize(a, quant)
            tensors[name] = gguf.quants.dequantize(q, quant).astype(np.float64)
            w.add_tensor(name, q, raw_dtype=quant)
        else:
            tensors[name] = a.astype(np.float64)
            w.add_tensor(name, a)

    add("token_embd.weight", (N_VOCAB, n_embd), 1.0, matrix=True)
    add("output_norm.weight", (n_embd,), 0.1, 1.0)
    if untied:
        add("output.weight", (N_VOCAB, n_embd), 1 / math.sqrt(n_embd), matrix=True)
    if rope_freqs:
        add("rope_freqs.weight", (hd // 2,), 0.5, 1.5)
    for i in range(n_layer):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", (n_embd,), 0.1, 1.0)
        add(p + "attn_q.weight", (n_head * hd, n_embd), 1 / math.sqrt(n_embd), matrix=True)
        add(p + "attn_k.weight", (n_head_kv * hd, n_embd), 1 / math.sqrt(n_embd), matrix=True)
        add(p + "attn_v.weight", (n_head_kv * hd, n_embd), 1 / math.sqrt(n_embd), matrix=True)
        if qkv_bias:
            add(p + "attn_q.bias", (n_head * hd,), 0.5)
            add(p + "attn_k.bias", (n_head_kv * hd,), 0.5)
            add(p + "attn_v.bias", (n_head_kv * hd,), 0.5)
        if qk_norm:
            add(p + "attn_q_norm.weight", (hd,), 0.1, 1.0)
            add(p + "attn_k_norm.weight", (hd,), 0.1, 1.0)
        add(p + "attn_output.weight", (n_embd, n_head * hd), 1 / math.sqrt(n_head * hd), matrix=True)
        add(p + "ffn_norm.weight", (n_embd,), 0.1, 1.0)
        add(p + "ffn_gate.weight", (n_ff, n_embd), 1 / math.sqrt(n_embd), matrix=True)
        add(p + "ffn_up.weight", (n_ff, n_embd), 1 / math.sqrt(n_embd), matrix=True)
        add(p + "ffn_down.weight", (n_embd, n_ff), 1 / math.sqrt(n_ff), matrix=True)
        if arch == "gemma3":
            add(p + "post_attention_norm.weight", (n_embd,), 0.1, 1.0)
            add(p + "post_ffw_norm.weight", (n_embd,), 0.1, 1.0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tensors


# -- the float64 reference, written from the architectures' definitions ------------------

def _rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope(x, pos, base, scale, neox, factors=None):
    N, H, hd = x.shape
    half = hd // 2
    inv = base ** (-np.arange(half) * 2.0 / hd) * scale
    if factors is not None:
        inv = inv / factors
    ang = np.asarray(pos, np.float64)[:, None, None] * inv[None, None, :]
    c, s = np.cos(ang), np.sin(ang)
    y = x.copy()
    ia, ib = (np.arange(half), np.arange(half) + half) if neox else (np.arange(0, hd, 2), np.arange(1, hd, 2))
    y[..., ia] = x[..., ia] * c - x[..., ib] * s
    y[..., ib] = x[..., ia] * s + x[..., ib] * c
    return y


def reference_logits(t, cfg, ids, hidden=False):
    arch = cfg["arch"]
    n_embd = t["token_embd.weight"].shape[1]
    n_layer, n_head, n_kv = cfg["n_layer"], cfg.get("n_head", 4), cfg.get("n_head_kv", 2)
    hd = cfg.get("head_dim") or n_embd // n_head
    eps = cfg.get("eps", 1e-5)
    gemma = arch == "gemma3"
    neox = arch != "llama"
    N = len(ids)
    pos = np.arange(N)
    x = t["token_embd.weight"][ids] * (math.sqrt(n_embd) if gemma else 1.0)
    for i in range(n_layer):
        p = f"blk.{i}."
        pattern = cfg.get("pattern")
        if isinstance(pattern, list):
            swa = gemma and cfg.get("window") and pattern[i]
        else:
            swa = gemma and cfg.get("window") and i % pattern < pattern - 1
        if gemma and swa:
            base, scale = cfg.get("rope_base_swa", 10000.0), 1.0
        else:
            base = cfg.get("rope_base", 10000.0)
            scale = 1.0 / cfg["rope_factor"] if cfg.get("rope_factor") else 1.0
        h = _rms(x, t[p + "attn_norm.weight"], eps)
        q = h @ t[p + "attn_q.weight"].T + t.get(p + "attn_q.bias", 0.0)
        k = h @ t[p + "attn_k.weight"].T + t.get(p + "attn_k.bias", 0.0)
        v = h @ t[p + "attn_v.weight"].T + t.get(p + "attn_v.bias", 0.0)
        q, k, v = q.reshape(N, n_head, hd), k.reshape(N, n_kv, hd), v.reshape(N, n_kv, hd)
        if cfg.get("qk_norm"):
            q = _rms(q, t[p + "attn_q_norm.weight"], eps)
            k = _rms(k, t[p + "attn_k_norm.weight"], eps)
        q = _rope(q, pos, base, scale, neox, t.get("rope_freqs.weight"))
        k = _rope(k, pos, base, scale, neox, t.get("rope_freqs.weight"))
        att = np.zeros((N, n_head, hd))
        for hq in range(n_head):
            kv = hq // (n_head // n_kv)
            s = q[:, hq] @ k[:, kv].T / math.sqrt(hd)
            if cfg.get("attn_softcap"):
                s = cfg["attn_softcap"] * np.tanh(s / cfg["attn_softcap"])
            ok = pos[None, :] <= pos[:, None]
            if swa:
                ok &= pos[:, None] - pos[None, :] < cfg["window"]
            s = np.where(ok, s, -np.inf)
            e = np.exp(s - s.max(-1, keepdims=True))
            att[:, hq] = (e / e.sum(-1, keepdims=True)) @ v[:, kv]
        o = att.reshape(N, -1) @ t[p + "attn_output.weight"].T
        if gemma:
            o = _rms(o, t[p + "post_attention_norm.weight"], eps)
        x = x + o
        h = _rms(x, t[p + "ffn_norm.weight"], eps)
        g = h @ t[p + "ffn_gate.weight"].T
        if gemma:
            g = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))
        else:
            g = g / (1 + np.exp(-g))
        f = (g * (h @ t[p + "ffn_up.weight"].T)) @ t[p + "ffn_down.weight"].T
        if gemma:
            f = _rms(f, t[p + "post_ffw_norm.weight"], eps)
        x = x + f
    x = _rms(x, t["output_norm.weight"], eps)
    if hidden:
        return x
    logits = x @ t.get("output.weight", t["token_embd.weight"]).T
    if cfg.get("final_softcap"):
        logits = cfg["final_softcap"] * np.tanh(logits / cfg["final_softcap"])
    return logits


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """name -> (path, float64 tensors, config)"""
    d = tmp_path_factory.mktemp("tiny_models")
    out = {}
    for name, cfg in CONFIGS.items():
        path = d / f"{name}.gguf"
        t = tiny_gguf(path, **cfg)
        out[name] = (str(path), t, cfg)
    return out


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
def test_logits_match_llama_cpp(tiny, name):
    llama_cpp = pytest.importorskip("llama_cpp")
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
        assert model.is_swa == [True, True, False]
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
        assert model.is_swa == [False, True, True]
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


def test_smollm2_hparams_from_metadata():
    with GGUFFile(resolve_model(None)) as f:
        from reflex_ipc.models.common import HParams

        hp = HParams(f)
    assert (hp.n_layer, hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_ff) == (30, 576, 9, 3, 64, 1536)
    assert hp.rope_base == 100000.0 and hp.rope_scale == 1.0 and hp.n_vocab == 49152
