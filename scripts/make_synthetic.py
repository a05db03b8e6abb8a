#!/usr/bin/env python3
"""Tiny random-weight GGUFs of real architectures for the llama.cpp parity goldens
(tests/data/synthetic-*.gguf, committed; tests/test_parity.py).

    python scripts/make_synthetic.py [--out tests/data] [--arch llama qwen2 ...]

Each file has llama.cpp's tensor names and metadata keys for its architecture, random
weights (fixed seed: the output is byte-for-byte reproducible), a mix of weight formats
(Q8_0, Q4_0, Q4_K, F16; norms and biases F32) and a REAL vocabulary copied from a GGUF:
the gpt2 BPE vocabulary of SmolLM2 for llama/qwen2/qwen3, the SentencePiece vocabulary
of llama.cpp's ggml-vocab-llama-spm.gguf for gemma3.

Q8_0/Q4_0 weights are quantized from normal floats with gguf.quants; Q4_K (which
gguf.quants cannot quantize) is written as well-formed random blocks whose scales give
the wanted spread (`random_blocks`, also used by make_qwen3_shaped.py). Weight scales keep
activations sane: logits with a real spread, neither ~0 nor inf.

A fixture script: it imports `gguf`, which the package never does on its load path.
"""

import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def smollm2_path():
    """The default model's GGUF, wherever it is installed (reflex_ipc.modelpath)."""
    sys.path.insert(0, ROOT)
    from reflex_ipc.modelpath import resolve_model

    return resolve_model("smollm2")

LLAMA_CPP_MODELS = "/work/oracle/llama_cpp_python-0.3.36/vendor/llama.cpp/models"
SPM_VOCAB = os.path.join(LLAMA_CPP_MODELS, "ggml-vocab-llama-spm.gguf")

# Block layouts: elements per block, bytes per block.
BLOCK = {"Q8_0": (32, 34), "Q4_0": (32, 18), "Q4_K": (256, 144), "Q6_K": (256, 210)}


# ---------------------------------------------------------------------------------------
# random quantized blocks
def _f16_bytes(x):
    return np.asarray(x, dtype=np.float16).view(np.uint8).reshape(-1, 2)


def random_blocks(rng, tname, rows, cols, std):
    """uint8 [rows, cols // blk * bsize]: well-formed random blocks of format tname whose
    values have mean ~0 and standard deviation ~std. Per-block scales vary (log-normal,
    sigma 0.25) like real weights'. Fast: one pass of random bytes plus scale patches."""
    blk, bsize = BLOCK[tname]
    if cols % blk:
        raise ValueError(f"{tname} needs rows of a multiple of {blk} values, not {cols}")
    nb = rows * cols // blk
    raw = rng.integers(0, 256, size=(nb, bsize), dtype=np.uint8)
    jitter = np.exp(0.25 * rng.standard_normal(nb, dtype=np.float32))
    if tname == "Q8_0":
        # d (f16) then 32 int8 quants; uniform int8 in [-128, 127] has std ~73.9
        raw[:, 0:2] = _f16_bytes(std / 73.9 * jitter)
    elif tname == "Q4_0":
        # d (f16) then 16 bytes of nibbles q, value d * (q - 8); q - 8 has std ~4.61
        raw[:, 0:2] = _f16_bytes(std / 4.61 * jitter)
    elif tname == "Q4_K":
        # d, dmin (f16), 12 bytes of packed 6-bit sub-block scales sc[8] and mins m[8],
        # 128 bytes of nibbles; value d*sc*q - dmin*m. With m = sc and dmin = 7.5 d every
        # sub-block has mean ~0 and std d*sc*4.61.
        sc = rng.integers(24, 64, size=(nb, 8), dtype=np.uint8)
        d = std / (4.61 * sc.mean(axis=1)) * jitter
        raw[:, 0:2] = _f16_bytes(d)
        raw[:, 2:4] = _f16_bytes(d * 7.5)
        m = sc
        raw[:, 4:8] = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
        raw[:, 8:12] = (m[:, :4] & 63) | ((m[:, 4:] >> 4) << 6)
        raw[:, 12:16] = (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4)
    elif tname == "Q6_K":
        # 128 bytes low nibbles, 64 bytes high bits, 16 int8 scales, d (f16);
        # value d*scale*(q - 32), q uniform 6-bit: std ~18.5
        scales = rng.integers(16, 128, size=(nb, 16), dtype=np.int16)
        scales *= np.where(rng.random((nb, 16)) < 0.5, -1, 1).astype(np.int16)
        raw[:, 192:208] = scales.astype(np.int8).view(np.uint8)
        raw[:, 208:210] = _f16_bytes(std / (18.5 * np.abs(scales).mean(axis=1)) * jitter)
    else:
        raise ValueError(f"no random blocks for {tname}")
    return raw.reshape(rows, -1)


def weight(rng, tname, rows, cols, std):
    """(data, raw_dtype) for GGUFWriter.add_tensor: a [rows, cols] matrix (ggml shape
    [cols, rows]) in format tname."""
    from gguf import GGMLQuantizationType as T
    import gguf.quants as gq

    if tname in ("Q4_K", "Q6_K"):
        return random_blocks(rng, tname, rows, cols, std), T[tname]
    w = (rng.standard_normal((rows, cols), dtype=np.float32) * std).astype(np.float32)
    if tname == "F32":
        return w, None
    if tname == "F16":
        return w.astype(np.float16), None
    return gq.quantize(w, T[tname]), T[tname]


# ---------------------------------------------------------------------------------------
# tokenizer metadata
def read_tokenizer(path):
    """[(key, value, type, sub_type)] of every tokenizer.* key of the GGUF at path, with
    strings as raw bytes (as stored)."""
    import gguf
    from gguf import GGUFValueType as VT

    r = gguf.GGUFReader(path)
    out = []
    for key, f in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vt = VT(f.types[0])
        if vt == VT.ARRAY:
            st = VT(f.types[1])
            if st == VT.STRING:
                val = [bytes(f.parts[i]) for i in f.data]
            else:
                val = [x.item() for i in f.data for x in f.parts[i]]
            out.append((key, val, vt, st))
        elif vt == VT.STRING:
            out.append((key, bytes(f.parts[f.data[0]]), vt, None))
        else:
            out.append((key, f.parts[f.data[0]][0].item(), vt, None))
    return out


def write_tokenizer(writer, entries, overrides=None):
    """Copy entries (read_tokenizer) into writer; overrides {key: (value, type)} replace or add."""
    overrides = dict(overrides or {})
    n_vocab = None
    for key, val, vt, st in entries:
        if key in overrides:
            val, vt = overrides.pop(key)
            st = None
        writer.add_key_value(key, val, vt, sub_type=st)
        if key == "tokenizer.ggml.tokens":
            n_vocab = len(val)
    for key, (val, vt) in overrides.items():
        writer.add_key_value(key, val, vt)
    if n_vocab is None:
        raise ValueError("the vocabulary GGUF has no tokenizer.ggml.tokens")
    return n_vocab


# ---------------------------------------------------------------------------------------
# the models
# q/k/v/o and gate/up/down formats, per layer (cycled); the token embedding's format;
# vocabulary source; whether the LM head is the token embedding.
MODELS = {
    "llama": dict(
        n_embd=64, n_layer=2, n_head=4, n_head_kv=2, head_dim=32, n_ff=256,
        rope_base=10000.0, eps=1e-5, vocab="gpt2", add_bos=True, tied=True, embd="Q4_0",
        layers=[dict(q="Q8_0", k="Q8_0", v="Q8_0", o="F16", gate="Q4_0", up="Q4_0", down="Q4_K"),
                dict(q="Q4_0", k="F16", v="Q8_0", o="Q8_0", gate="F16", up="Q8_0", down="Q4_K")]),
    "qwen2": dict(  # qwen2 wants n_head * head_dim == n_embd; q/k/v biases
        n_embd=64, n_layer=2, n_head=2, n_head_kv=1, head_dim=32, n_ff=256,
        rope_base=1000000.0, eps=1e-6, vocab="gpt2", add_bos=False, tied=False, embd="Q4_0",
        output="Q4_0",
        layers=[dict(q="F16", k="F16", v="F16", o="Q8_0", gate="Q8_0", up="Q8_0", down="Q4_K"),
                dict(q="Q8_0", k="Q4_0", v="Q8_0", o="F16", gate="Q4_0", up="F16", down="Q4_K")]),
    "qwen3": dict(  # q/k RMS norms; n_head * head_dim != n_embd, as in the real models
        n_embd=64, n_layer=3, n_head=4, n_head_kv=2, head_dim=64, n_ff=256,
        rope_base=1000000.0, eps=1e-6, vocab="gpt2", add_bos=False, tied=True, embd="Q8_0",
        layers=[dict(q="Q4_0", k="Q4_0", v="Q8_0", o="Q4_K", gate="F16", up="F16", down="Q4_K"),
                dict(q="Q8_0", k="F16", v="Q4_0", o="Q8_0", gate="Q4_0", up="Q8_0", down="F16"),
                dict(q="F16", k="Q8_0", v="F16", o="Q4_K", gate="Q8_0", up="Q4_0", down="Q4_K")]),
    "gemma3": dict(  # sandwich norms, q/k norms, sliding window on a pattern, two rope bases,
        # final logit softcap, GeGLU, embeddings scaled by sqrt(n_embd); SentencePiece vocab
        n_embd=128, n_layer=4, n_head=4, n_head_kv=1, head_dim=64, n_ff=512,
        rope_base=1000000.0, eps=1e-6, vocab="spm", add_bos=None, tied=True, embd="Q4_0",
        sliding_window=6, swa_pattern=3, rope_base_swa=10000.0, final_softcap=15.0,
        layers=[dict(q="Q8_0", k="Q8_0", v="F16", o="Q4_K", gate="Q8_0", up="Q4_0", down="Q4_K"),
                dict(q="F16", k="Q4_0", v="Q8_0", o="Q8_0", gate="F16", up="Q8_0", down="Q4_K"),
                dict(q="Q4_0", k="F16", v="Q4_0", o="Q4_K", gate="Q4_0", up="F16", down="Q8_0"),
                dict(q="Q8_0", k="Q8_0", v="Q8_0", o="F16", gate="Q8_0", up="Q8_0", down="Q4_K")]),
}


def write_shape(w, *, n_layer, n_ctx, n_embd, n_ff, n_head, n_head_kv, head_dim, eps, rope_base,
                rope_dims=False):
    """The decoder's shape keys every synthetic GGUF writes (also make_synthetic_gguf.py's and
    make_qwen3_shaped.py's), in one order; rope_dims adds rope.dimension_count = head_dim."""
    w.add_block_count(n_layer)
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    if rope_dims:
        w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(eps)
    w.add_rope_freq_base(rope_base)


def build(arch, out_path, seed=None, vocab_paths=None):
    import gguf
    from gguf import GGUFValueType as VT

    cfg = MODELS[arch]
    vocab_paths = vocab_paths or {"gpt2": smollm2_path(), "spm": SPM_VOCAB}
    # a seed per architecture so each file's bytes depend only on its own configuration
    seed = sum(arch.encode()) * 1009 if seed is None else seed
    rng = np.random.default_rng(seed)
    E, L, H, Hkv, hd, F = (cfg[k] for k in ("n_embd", "n_layer", "n_head", "n_head_kv", "head_dim", "n_ff"))

    w = gguf.GGUFWriter(out_path, arch)
    w.add_name(f"synthetic-{arch}")
    write_shape(w, n_layer=L, n_ctx=4096, n_embd=E, n_ff=F, n_head=H, n_head_kv=Hkv, head_dim=hd,
                eps=cfg["eps"], rope_base=cfg["rope_base"], rope_dims=True)
    if arch == "gemma3":
        w.add_sliding_window(cfg["sliding_window"])
        w.add_uint32(f"{arch}.attention.sliding_window_pattern", cfg["swa_pattern"])
        w.add_rope_freq_base_swa(cfg["rope_base_swa"])
        w.add_final_logit_softcapping(cfg["final_softcap"])
    overrides = {}
    if cfg["add_bos"] is not None:
        overrides["tokenizer.ggml.add_bos_token"] = (cfg["add_bos"], VT.BOOL)
    n_vocab = write_tokenizer(w, read_tokenizer(vocab_paths[cfg["vocab"]]), overrides)
    w.add_uint32(f"{arch}.vocab_size", n_vocab)

    def norm(n, center=1.0):
        return (center + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    def add(name, data, raw_dtype=None):
        w.add_tensor(name, data, raw_dtype=raw_dtype)

    # Scales: projections into a layer get std 1/sqrt(fan_in), so normed inputs give O(1)
    # values; the projections back into the residual stream get `gain` times that, so the
    # layers' contributions outweigh the input embedding (else a tied model's logits are
    # dominated by h . e_input and it repeats its last token). Gemma's embeddings are
    # scaled by sqrt(n_embd) and its layers' outputs pass through post-norms (centred on
    # `post`) instead. The logits (output_norm(h) . e_v) get a spread of a few units.
    gemma = arch == "gemma3"
    embd_std, gain, post, out_norm = (0.1, 1.0, 3.0, 3.0) if gemma else (0.5, 4.0, 1.0, 1.0)
    add("token_embd.weight", *weight(rng, cfg["embd"], n_vocab, E, embd_std))
    add("output_norm.weight", norm(E, out_norm))
    if not cfg["tied"]:
        add("output.weight", *weight(rng, cfg["output"], n_vocab, E, 0.5))
    for i in range(L):
        t = cfg["layers"][i]
        p = f"blk.{i}."
        add(p + "attn_norm.weight", norm(E))
        add(p + "attn_q.weight", *weight(rng, t["q"], H * hd, E, 1 / np.sqrt(E)))
        add(p + "attn_k.weight", *weight(rng, t["k"], Hkv * hd, E, 1 / np.sqrt(E)))
        add(p + "attn_v.weight", *weight(rng, t["v"], Hkv * hd, E, 1 / np.sqrt(E)))
        if arch == "qwen2":
            add(p + "attn_q.bias", (0.3 * rng.standard_normal(H * hd, dtype=np.float32)).astype(np.float32))
            add(p + "attn_k.bias", (0.3 * rng.standard_normal(Hkv * hd, dtype=np.float32)).astype(np.float32))
            add(p + "attn_v.bias", (0.3 * rng.standard_normal(Hkv * hd, dtype=np.float32)).astype(np.float32))
        if arch in ("qwen3", "gemma3"):
            add(p + "attn_q_norm.weight", norm(hd))
            add(p + "attn_k_norm.weight", norm(hd))
        add(p + "attn_output.weight", *weight(rng, t["o"], E, H * hd, gain / np.sqrt(H * hd)))
        if arch == "gemma3":
            add(p + "post_attention_norm.weight", norm(E, post))
        add(p + "ffn_norm.weight", norm(E))
        add(p + "ffn_gate.weight", *weight(rng, t["gate"], F, E, 1 / np.sqrt(E)))
        add(p + "ffn_up.weight", *weight(rng, t["up"], F, E, 1 / np.sqrt(E)))
        add(p + "ffn_down.weight", *weight(rng, t["down"], E, F, gain / np.sqrt(F)))
        if arch == "gemma3":
            add(p + "post_ffw_norm.weight", norm(E, post))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out_path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data"), help="output folder")
    ap.add_argument("--arch", nargs="*", choices=sorted(MODELS), default=sorted(MODELS))
    ap.add_argument("--gpt2-vocab", help="GGUF whose gpt2 vocabulary to copy (default: smollm2)")
    ap.add_argument("--spm-vocab", default=SPM_VOCAB, help="GGUF whose SentencePiece vocabulary to copy")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    for arch in a.arch:
        path = build(arch, os.path.join(a.out, f"synthetic-{arch}.gguf"),
                     vocab_paths={"gpt2": a.gpt2_vocab or smollm2_path(), "spm": a.spm_vocab})
        print(f"{path}: {os.path.getsize(path) / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
