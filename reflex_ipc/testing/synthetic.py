"""The synthetic-GGUF writer: every random-weight GGUF the tests, the fixture scripts and
the GPU harnesses use, written with the `gguf` package (never on the package's load path).

Four recipes share the pieces below (random quantized blocks, tokenizer copying, the
decoder's shape keys, the writer's finish):

- `parity_model`: tiny models of real architectures for the llama.cpp parity goldens
  (tests/data/synthetic-*.gguf, committed; tests/test_parity.py). llama.cpp's tensor names
  and metadata keys, a mix of weight formats (Q8_0, Q4_0, Q4_K, F16; norms and biases F32)
  and a REAL vocabulary copied from a GGUF: SmolLM2's gpt2 BPE vocabulary for
  llama/qwen2/qwen3, llama.cpp's ggml-vocab-llama-spm.gguf's SentencePiece one for gemma3.
- `mixed_model`: small models whose matrices cycle through every block format (Q8_0,
  Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, F16, BF16, F32), so that one model exercises
  every matmul kernel (scripts/gpu/gpu_check_models.py); `tokenizer_only` copies just a
  tokenizer.
- `qwen3_shaped`: a Qwen3-0.6B-shaped model (Q8_0 or a Q4_K_M-like mix) for GPU timing,
  generated in parallel in seconds; its vocabulary is Qwen2's, from a GGUF or from the
  compact npz that `dump_vocab` writes (scripts/fixtures/data/qwen2-vocab.npz).
- `tiny_gguf`: float-weight models for the model and engine tests (tests/test_models.py,
  tests/test_engine.py ...), returning the float64 weights for the references of
  reflex_ipc.testing.references.
- `hybrid_gguf` / `granite_gguf`: tiny F32 recurrent hybrids (qwen35, qwen35moe; granitehybrid
  dense and MoE) with llama.cpp's names and keys, for tests/test_hybrid.py (HYBRID_CONFIGS,
  GRANITE_CONFIGS).
- `tensors_gguf`: just the given raw tensors (the op checks' hand-made weight blocks).

Every recipe is deterministic (fixed seeds): its output is byte-for-byte reproducible.
Weight scales keep activations sane: logits with a real spread, neither ~0 nor inf.

    python3 scripts/fixtures/make_gguf.py {parity,mixed,tokenizer-only,qwen3-shaped,hybrid,dump-vocab} ...
"""

import argparse
import concurrent.futures as cf
import json
import math
import os
import sys
import time

import numpy as np

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


def add_kv(w, key, v):
    """One metadata key on a gguf.GGUFWriter, typed by the Python value: bool, str, float32,
    an array for a list, else uint32."""
    if isinstance(v, bool):
        w.add_bool(key, v)
    elif isinstance(v, str):
        w.add_string(key, v)
    elif isinstance(v, float):
        w.add_float32(key, v)
    elif isinstance(v, list):
        w.add_array(key, v)
    else:
        w.add_uint32(key, v)


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
# the parity models
# q/k/v/o and gate/up/down formats, per layer (cycled); the token embedding's format;
# vocabulary source; whether the LM head is the token embedding.
PARITY_MODELS = {
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
    """The decoder's shape keys of the parity, mixed and qwen3-shaped models, in one order;
    rope_dims adds rope.dimension_count = head_dim."""
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


def finish(w):
    """Write what w holds (header, metadata, tensors) and close it."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def default_vocab_paths():
    """{"gpt2": SmolLM2's GGUF, "spm": llama.cpp's ggml-vocab-llama-spm.gguf}: the
    vocabularies of the parity models (the spm one from the llama-cpp-python sdist, fetched
    once by reflex_ipc.testing.sdist)."""
    from reflex_ipc.modelpath import resolve_model

    from .sdist import vocab_models_dir

    return {"gpt2": resolve_model("smollm2"),
            "spm": os.path.join(vocab_models_dir(), "ggml-vocab-llama-spm.gguf")}


def parity_model(arch, out_path, seed=None, vocab_paths=None):
    """Write PARITY_MODELS[arch] to out_path (vocab_paths: default_vocab_paths())."""
    import gguf
    from gguf import GGUFValueType as VT

    cfg = PARITY_MODELS[arch]
    vocab_paths = vocab_paths or default_vocab_paths()
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
    finish(w)
    return out_path




def f32_twin(src, dst):
    """Write dst: src with every tensor dequantized to F32 (metadata copied as is)."""
    import gguf

    r = gguf.GGUFReader(src)
    w = _copy_metadata(r, dst)
    w.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    for t in r.tensors:
        shape = [int(x) for x in reversed(t.shape)]  # numpy order
        w.add_tensor(t.name, np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape),
                                                  dtype=np.float32))
    finish(w)
    return dst


def tensors_gguf(path, tensors, arch="llama"):
    """Write a GGUF holding just tensors {name: (raw block bytes, ggml type id, numpy-order
    shape)}, the bytes stored as given (any type gguf knows: F32, F16, BF16, the block
    formats); for loading hand-made weights through the real GGUFFile."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    for name, (raw, tid, shape) in tensors.items():
        t = gguf.GGMLQuantizationType(tid)
        blk, bsize = gguf.GGML_QUANT_SIZES[t]
        data = np.ascontiguousarray(raw, dtype=np.uint8).reshape(*shape[:-1], shape[-1] // blk * bsize)
        w.add_tensor(name, data, raw_dtype=t)
    finish(w)
    return path


def _copy_metadata(r, dst):
    """A GGUFWriter for dst holding the metadata of the GGUFReader r (but the file type)."""
    import gguf
    from gguf import GGUFValueType as VT

    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    w = gguf.GGUFWriter(dst, arch)
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.alignment", "general.file_type"):
            continue
        vt = VT(f.types[0])
        if vt == VT.ARRAY:
            st = VT(f.types[1])
            val = ([bytes(f.parts[i]) for i in f.data] if st == VT.STRING
                   else [x.item() for i in f.data for x in f.parts[i]])
            w.add_key_value(key, val, vt, sub_type=st)
        elif vt == VT.STRING:
            w.add_key_value(key, bytes(f.parts[f.data[0]]), vt)
        else:
            w.add_key_value(key, f.parts[f.data[0]][0].item(), vt)
    return w


# tensors that stay F32 in _quantized_writer's files: norms, convolutions, SSM parameters, scales, biases
# and rope factors (llama.cpp multiplies or adds them elementwise, never through a matmul)
_KEEP_F32 = ("norm", "ssm_conv1d", "ssm_a", "ssm_d", "ssm_dt", "rope_", ".scale", ".bias", "layer_output_scale")


def _quantized_writer(path, arch, seed=0):
    """A GGUFWriter for path that stores the F32 matrices given to add_tensor quantized where
    their rows fit the blocks: rows of a multiple of 256 values alternate Q4_K and Q6_K
    (random well-formed blocks with the F32 tensor's standard deviation, random_blocks),
    other rows of a multiple of 32 values Q8_0 (the F32 values quantized); the rest stays
    F32. It writes `{path}.twin.gguf` beside it: the same metadata with every tensor as
    stored dequantized to F32 (the f32_twin, the exact-arithmetic reference)."""
    import gguf
    import gguf.quants as gq
    from gguf import GGMLQuantizationType as T

    class Writer(gguf.GGUFWriter):
        def __init__(self):
            super().__init__(str(path), arch)
            self.twin = gguf.GGUFWriter(f"{path}.twin.gguf", arch)
            self.rng = np.random.default_rng(seed)
            self.k = 0

        def add_key_value(self, key, val, vtype, **kw):
            super().add_key_value(key, val, vtype, **kw)
            if not key.startswith("general."):
                self.twin.add_key_value(key, val, vtype, **kw)

        def add_tensor(self, name, a, raw_shape=None, raw_dtype=None, tensor_endianess=None):
            shape, cols = a.shape, a.shape[-1]
            if raw_dtype is not None or a.dtype != np.float32 or a.ndim < 2 or cols % 32 or any(
                    s in name for s in _KEEP_F32):
                super().add_tensor(name, a, raw_dtype=raw_dtype)
                self.twin.add_tensor(name, a if raw_dtype is None else np.ascontiguousarray(
                    gq.dequantize(a, raw_dtype), dtype=np.float32))
                return
            if cols % 256 == 0:
                t = T[("Q4_K", "Q6_K")[self.k % 2]]
                self.k += 1
                q = random_blocks(self.rng, t.name, int(np.prod(shape[:-1])), cols, float(a.std()))
                q = q.reshape(*shape[:-1], -1)
            else:
                t, q = T.Q8_0, gq.quantize(np.ascontiguousarray(a), T.Q8_0)
            super().add_tensor(name, q, raw_dtype=t)
            self.twin.add_tensor(name, np.ascontiguousarray(gq.dequantize(q, t).reshape(shape), dtype=np.float32))

        def write_header_to_file(self, *args, **kw):
            super().write_header_to_file(*args, **kw)
            self.twin.write_header_to_file(*args, **kw)

        def write_kv_data_to_file(self):
            super().write_kv_data_to_file()
            self.twin.write_kv_data_to_file()

        def write_tensors_to_file(self, *args, **kw):
            super().write_tensors_to_file(*args, **kw)
            self.twin.write_tensors_to_file(*args, **kw)

        def close(self):
            super().close()
            self.twin.close()

    return Writer()


# ---------------------------------------------------------------------------------------
# the mixed-format models (every matmul kernel in one model)
TOKENIZER_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
                  "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id",
                  "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id",
                  "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token",
                  "tokenizer.ggml.add_space_prefix", "tokenizer.ggml.scores", "tokenizer.chat_template")

MIXED_MODELS = {  # n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff
    "llama": dict(n_embd=256, n_layer=3, n_head=4, n_head_kv=2, head_dim=64, n_ff=512),
    "qwen2": dict(n_embd=256, n_layer=3, n_head=4, n_head_kv=2, head_dim=64, n_ff=512),
    "qwen3": dict(n_embd=256, n_layer=3, n_head=4, n_head_kv=2, head_dim=128, n_ff=512),
    "gemma3": dict(n_embd=256, n_layer=6, n_head=4, n_head_kv=1, head_dim=128, n_ff=512),
}
# the formats cycled through the matrices of each layer
MATRIX_TYPES = ["Q8_0", "Q4_K", "Q6_K", "Q5_0", "Q4_0", "Q5_K", "Q4_1", "Q5_1", "F16", "BF16", "F32"]


def copy_tokenizer(writer, tok_path, keys=TOKENIZER_KEYS):
    """Copy the tokenizer keys of the GGUF at tok_path that are among `keys` into writer, in
    the order of `keys`; the vocabulary size."""
    entries = {e[0]: e for e in read_tokenizer(tok_path)}
    return write_tokenizer(writer, [entries[k] for k in keys if k in entries])


def mixed_matrix(rng, rows, cols, tname, std):
    """(data, raw_dtype) for GGUFWriter.add_tensor: a [rows, cols] weight in format tname
    (K formats: random blocks with fixed scales, every sub-block's mean ~0)."""
    import gguf.quants as gq
    from gguf import GGMLQuantizationType as T

    t = T[tname]
    if tname in ("Q4_K", "Q5_K", "Q6_K"):
        from reflex_ipc.ggml_types import TYPES

        _, blk, bsize = TYPES[tname]
        nb = rows * cols // blk
        raw = rng.integers(0, 256, size=(nb, bsize), dtype=np.uint8)
        f16 = lambda a: np.asarray(a, np.float16).view(np.uint8).reshape(nb, 2)  # noqa: E731
        if tname == "Q6_K":
            raw[:, 208:210] = f16(np.full(nb, std / (74 * 18)))
        else:
            levels, rms = (7.5, 4.6) if tname == "Q4_K" else (15.5, 9.2)
            d = std / (36 * rms)
            raw[:, 0:2] = f16(np.full(nb, d))
            raw[:, 2:4] = f16(np.full(nb, d * levels))
            # make every sub-block's min equal its scale (bytes 4..7 = 8..11, and each nibble
            # pair of 12..15 equal), so its mean d*sc*levels - dmin*m is ~0
            raw[:, 8:12] = raw[:, 4:8]
            raw[:, 12:16] = (raw[:, 12:16] & 0x0F) * 17
        return raw.reshape(rows, -1), t
    w = (rng.standard_normal((rows, cols)) * std).astype(np.float32)
    if tname == "F32":
        return w, None
    if tname == "F16":
        return w.astype(np.float16), None
    return gq.quantize(w, t), t


def mixed_model(arch, tok_path, out, seed=0):
    """Write MIXED_MODELS[arch] with the tokenizer of the GGUF at tok_path to out."""
    import gguf

    hp = MIXED_MODELS[arch]
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(out, arch)
    n_vocab = copy_tokenizer(w, tok_path)
    E, Lh, H, Hkv, hd, F = (hp[k] for k in ("n_embd", "n_layer", "n_head", "n_head_kv", "head_dim", "n_ff"))
    write_shape(w, n_layer=Lh, n_ctx=2048, n_embd=E, n_ff=F, n_head=H, n_head_kv=Hkv, head_dim=hd,
                eps=1e-6, rope_base=1e6 if arch != "llama" else 10000.0)
    w.add_uint32(f"{arch}.vocab_size", n_vocab)
    if arch == "gemma3":
        w.add_sliding_window(8)

    def add(name, data, raw_dtype=None):
        w.add_tensor(name, data, raw_dtype=raw_dtype)

    emb_type = {"llama": "Q8_0", "qwen2": "Q6_K", "qwen3": "Q8_0", "gemma3": "Q5_K"}[arch]
    tied = arch in ("qwen3", "gemma3")  # no output.weight: the LM head is the embedding
    # a tied embedding much larger than the layers' outputs would make every token predict itself
    add("token_embd.weight", *mixed_matrix(rng, n_vocab, E, emb_type, 0.1 if tied else 1.0))
    ones = lambda n: (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)  # noqa: E731
    add("output_norm.weight", ones(E))
    if not tied:
        add("output.weight", *mixed_matrix(rng, n_vocab, E, "Q4_K" if arch == "llama" else "Q8_0",
                                           1 / np.sqrt(E) * 4))
    k = 0
    for i in range(Lh):
        p = f"blk.{i}."

        def mat(name, rows, cols):
            nonlocal k
            add(p + name + ".weight", *mixed_matrix(rng, rows, cols, MATRIX_TYPES[k % len(MATRIX_TYPES)],
                                                    1 / np.sqrt(cols)))
            k += 1

        add(p + "attn_norm.weight", ones(E))
        mat("attn_q", H * hd, E)
        mat("attn_k", Hkv * hd, E)
        mat("attn_v", Hkv * hd, E)
        mat("attn_output", E, H * hd)
        if arch == "qwen2":
            for n, d in (("attn_q", H * hd), ("attn_k", Hkv * hd), ("attn_v", Hkv * hd)):
                add(p + n + ".bias", (0.5 * rng.standard_normal(d)).astype(np.float32))
        if arch in ("qwen3", "gemma3"):
            add(p + "attn_q_norm.weight", ones(hd))
            add(p + "attn_k_norm.weight", ones(hd))
        if arch == "gemma3":
            add(p + "post_attention_norm.weight", ones(E))
            add(p + "post_ffw_norm.weight", ones(E))
        add(p + "ffn_norm.weight", ones(E))
        mat("ffn_gate", F, E)
        mat("ffn_up", F, E)
        mat("ffn_down", E, F)
    finish(w)
    return out


def tokenizer_only(src, out):
    """A GGUF holding just the tokenizer of the GGUF at src."""
    import gguf

    w = gguf.GGUFWriter(out, "llama")
    copy_tokenizer(w, src)
    finish(w)
    return out


# ---------------------------------------------------------------------------------------
# the Qwen3-0.6B-shaped model (GPU timing, not quality)
# Shape of Qwen3-0.6B: hidden 1024, 28 layers, 16 heads, 8 KV heads, head_dim 128, FFN 3072,
# vocabulary 151,936, tied embeddings, q/k RMS norms (llama.cpp arch "qwen3"). Weights:
# kind "q8_0" every matrix Q8_0 (~640 MB); kind "q4k" Q4_K, with Q6_K for attn_v, ffn_down
# and the (tied) token embedding, like llama.cpp's Q4_K_M mix (~400 MB). Norms F32. The
# blocks are random bytes with patched scales (random_blocks: no float quantization).
QWEN3_SHAPE = dict(n_embd=1024, n_layer=28, n_head=16, n_head_kv=8, head_dim=128, n_ff=3072, n_vocab=151936)


def _pack_strings(items):
    lens = np.fromiter((len(b) for b in items), dtype=np.uint32, count=len(items))
    return np.frombuffer(b"".join(items), dtype=np.uint8), lens


def _unpack_strings(blob, lens):
    data, out, o = blob.tobytes(), [], 0
    for n in lens.tolist():
        out.append(data[o:o + n])
        o += n
    return out


def dump_vocab(gguf_path, out):
    """Save the tokenizer.* keys of gguf_path compactly (npz, compressed)."""
    from gguf import GGUFValueType as VT

    arrays, scalars, order = {}, {}, []
    for key, val, vt, st in read_tokenizer(gguf_path):
        order.append(key)
        short = key[len("tokenizer."):]
        if vt == VT.ARRAY and st == VT.STRING:
            arrays[short + ".blob"], arrays[short + ".lens"] = _pack_strings(val)
        elif vt == VT.ARRAY:
            arrays[short + ".values"] = np.asarray(val, dtype={VT.INT32: np.int32, VT.FLOAT32: np.float32}[st])
        else:
            scalars[key] = [val.decode("utf-8") if isinstance(val, bytes) else val, int(vt)]
    meta = {"order": order, "scalars": scalars}
    arrays["scalars.json"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    np.savez_compressed(out, **arrays)
    return out


def load_vocab(path):
    """[(key, value, type, sub_type)] as read_tokenizer gives them, from a GGUF or from a
    dump_vocab npz."""
    from gguf import GGUFValueType as VT

    if not path.endswith(".npz"):
        return read_tokenizer(path)
    entries = []
    with np.load(path) as z:
        meta = json.loads(z["scalars.json"].tobytes())
        for key in meta["order"]:
            short = key[len("tokenizer."):]
            if key in meta["scalars"]:
                val, vt = meta["scalars"][key]
                entries.append((key, val, VT(vt), None))
            elif short + ".blob" in z.files:
                entries.append((key, _unpack_strings(z[short + ".blob"], z[short + ".lens"]), VT.ARRAY, VT.STRING))
            else:
                v = z[short + ".values"]
                entries.append((key, v.tolist(), VT.ARRAY, VT.INT32 if v.dtype == np.int32 else VT.FLOAT32))
    return entries


def qwen3_tensor_plan(kind):
    """[(name, rows, cols, format, std)] in file order."""
    E, L, H, Hkv, hd, F, V = (QWEN3_SHAPE[k] for k in ("n_embd", "n_layer", "n_head", "n_head_kv", "head_dim",
                                                       "n_ff", "n_vocab"))
    q4 = kind == "q4k"
    mat = "Q4_K" if q4 else "Q8_0"
    big = "Q6_K" if q4 else "Q8_0"
    # tied embedding: logits = output_norm(h) . e_v, std ~ sqrt(E) * std_e ~ 3
    plan = [("token_embd.weight", V, E, big, 3.0 / np.sqrt(E)), ("output_norm.weight", E, None, "F32", 1.0)]
    for i in range(L):
        p = f"blk.{i}."
        plan += [
            (p + "attn_norm.weight", E, None, "F32", 1.0),
            (p + "attn_q.weight", H * hd, E, mat, 1 / np.sqrt(E)),
            (p + "attn_k.weight", Hkv * hd, E, mat, 1 / np.sqrt(E)),
            (p + "attn_v.weight", Hkv * hd, E, big, 1 / np.sqrt(E)),
            (p + "attn_q_norm.weight", hd, None, "F32", 1.0),
            (p + "attn_k_norm.weight", hd, None, "F32", 1.0),
            (p + "attn_output.weight", E, H * hd, mat, 1 / np.sqrt(H * hd)),
            (p + "ffn_norm.weight", E, None, "F32", 1.0),
            (p + "ffn_gate.weight", F, E, mat, 1 / np.sqrt(E)),
            (p + "ffn_up.weight", F, E, mat, 1 / np.sqrt(E)),
            (p + "ffn_down.weight", E, F, big, 1 / np.sqrt(F)),
        ]
    return plan


def _qwen3_tensor(seed, rows, cols, fmt, std):
    rng = np.random.default_rng(seed)
    if fmt == "F32":
        return (std + 0.1 * rng.standard_normal(rows, dtype=np.float32)).astype(np.float32)
    return random_blocks(rng, fmt, rows, cols, std)


def qwen3_shaped(out, kind="q8_0", vocab=None, seed=0):
    """Write the Qwen3-0.6B-shaped model of kind "q8_0" or "q4k" to out; vocab: a GGUF or a
    dump_vocab npz with Qwen2's vocabulary."""
    import gguf
    from gguf import GGMLQuantizationType as T
    from gguf import GGUFValueType as VT

    if vocab is None:
        raise ValueError("qwen3_shaped needs the Qwen2 vocabulary (a GGUF or a dump_vocab .npz)")
    E, L, H, Hkv, hd, F, V = (QWEN3_SHAPE[k] for k in ("n_embd", "n_layer", "n_head", "n_head_kv", "head_dim",
                                                       "n_ff", "n_vocab"))
    w = gguf.GGUFWriter(out, "qwen3")
    w.add_name(f"qwen3-0.6b-shaped-random-{kind}")
    write_shape(w, n_layer=L, n_ctx=40960, n_embd=E, n_ff=F, n_head=H, n_head_kv=Hkv, head_dim=hd,
                eps=1e-6, rope_base=1000000.0)
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q8_0 if kind == "q8_0" else gguf.LlamaFileType.MOSTLY_Q4_K_M))
    n_vocab = write_tokenizer(w, load_vocab(vocab), {"tokenizer.ggml.add_bos_token": (False, VT.BOOL)})
    if n_vocab != V:
        raise ValueError(f"the vocabulary has {n_vocab} tokens, Qwen3-0.6B has {V}")
    plan = qwen3_tensor_plan(kind)
    for name, rows, cols, fmt, _ in plan:
        if fmt == "F32":
            w.add_tensor_info(name, [rows], np.dtype(np.float32), rows * 4)
        else:
            blk, bsize = BLOCK[fmt]
            w.add_tensor_info(name, [rows, cols // blk * bsize], np.dtype(np.uint8), rows * cols // blk * bsize,
                              raw_dtype=T[fmt])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    seeds = np.random.SeedSequence(seed).generate_state(len(plan))
    with cf.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as ex:
        # generated in parallel (bounded look-ahead), written in file order
        pending, nxt = {}, 0
        for i in range(len(plan)):
            while nxt < len(plan) and nxt < i + 2 * (os.cpu_count() or 2):
                _, rows, cols, fmt, std = plan[nxt]
                pending[nxt] = ex.submit(_qwen3_tensor, int(seeds[nxt]), rows, cols, fmt, std)
                nxt += 1
            w.write_tensor_data(pending.pop(i).result())
    w.close()
    return out


# ---------------------------------------------------------------------------------------
# the tiny float-weight models of the model and engine tests
TINY_N_VOCAB = 49152  # SmolLM2's vocabulary, whose tokenizer they borrow

TINY_CONFIGS = {
    "llama": dict(arch="llama", n_layer=2),
    "llama_untied_ff": dict(arch="llama", n_layer=2, untied=True, rope_freqs=True, rope_base=500.0),
    "llama_q8_0": dict(arch="llama", n_layer=2, qtype="Q8_0"),
    "qwen2": dict(arch="qwen2", n_layer=2, qkv_bias=True, rope_base=1e6),
    "qwen3": dict(arch="qwen3", n_layer=2, qk_norm=True, rope_base=1e6, head_dim=16),
    "gemma3": dict(arch="gemma3", n_layer=3, qk_norm=True, window=3, pattern=3, rope_base=1e6,
                   rope_base_swa=10000.0, rope_factor=4.0, final_softcap=5.0),
}

_TINY_TOKENIZER = {}

THINK_IDS = (49150, 49151)  # the thinker's <think> and </think>: SmolLM2's last two tokens, renamed


def thinker_gguf(dir_path, chat_template=None):
    """A tiny llama (TINY_CONFIGS["llama"]) whose vocabulary is SmolLM2's with its last two
    tokens renamed <think> and </think> (user-defined, as Qwen3's are): a reasoning model's
    tokens on random weights. Returns the GGUF's path (dir_path/thinker.gguf)."""
    import gguf

    from reflex_ipc.modelpath import resolve_model

    think, end = THINK_IDS
    entries = []
    for key, val, vt, st in read_tokenizer(resolve_model("smollm2")):
        if key == "tokenizer.ggml.tokens":
            val = list(val)
            val[think], val[end] = b"<think>", b"</think>"
        elif key == "tokenizer.ggml.token_type":
            val = list(val)
            val[think] = val[end] = 4  # user-defined
        entries.append((key, val, vt, st))
    vocab = os.path.join(str(dir_path), "thinker-vocab.gguf")
    w = gguf.GGUFWriter(vocab, "llama")
    write_tokenizer(w, entries)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    path = os.path.join(str(dir_path), "thinker.gguf")
    tiny_gguf(path, tokenizer=vocab, chat_template=chat_template, **TINY_CONFIGS["llama"])
    return path


def _tiny_tokenizer(path):
    """The tokenizer.* entries of the GGUF at path but its chat template (read_tokenizer),
    read once per path."""
    if path not in _TINY_TOKENIZER:
        _TINY_TOKENIZER[path] = [e for e in read_tokenizer(path) if e[0] != "tokenizer.chat_template"]
    return _TINY_TOKENIZER[path]


def tiny_gguf(path, arch="llama", n_layer=2, n_embd=32, n_head=4, n_head_kv=2, head_dim=None,
              n_ff=64, rope_base=10000.0, eps=1e-5, untied=False, qkv_bias=False, qk_norm=False,
              rope_freqs=False, window=0, pattern=None, rope_base_swa=None, rope_factor=None,
              final_softcap=None, attn_softcap=None, qtype=None, seed=0, drop=(), tokenizer=None,
              chat_template=None):
    """Write a random tiny model with the tokenizer of the GGUF `tokenizer` (default: SmolLM2,
    whose vocabulary of TINY_N_VOCAB tokens the embedding assumes) and no chat template
    unless `chat_template` is given; returns {tensor name: float64 numpy array (numpy
    order)} as stored (quantized ones dequantized)."""
    import gguf
    import gguf.quants

    if tokenizer is None:
        from reflex_ipc.modelpath import resolve_model

        tokenizer = resolve_model("smollm2")
    rng = np.random.default_rng(seed)
    hd = head_dim or n_embd // n_head
    w = gguf.GGUFWriter(str(path), arch)
    write_tokenizer(w, _tiny_tokenizer(tokenizer))
    if chat_template is not None:
        w.add_chat_template(chat_template)
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

    add("token_embd.weight", (TINY_N_VOCAB, n_embd), 1.0, matrix=True)
    add("output_norm.weight", (n_embd,), 0.1, 1.0)
    if untied:
        add("output.weight", (TINY_N_VOCAB, n_embd), 1 / math.sqrt(n_embd), matrix=True)
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
    finish(w)
    return tensors


# ---------------------------------------------------------------------------------------
# the float-weight models of the attention-side families (qwen3moe, phi3, deepseek2):
# tests/test_families.py checks them against llama.cpp. F32 weights, SmolLM2's tokenizer.
FAMILY_CONFIGS = {
    "qwen3moe": dict(arch="qwen3moe", n_layer=2, n_embd=32, n_head=4, n_head_kv=2, head_dim=16,
                     n_expert=8, n_used=2, n_ff_exp=24),
    "phi3_fused_long": dict(arch="phi3", n_layer=2, n_embd=32, n_head=4, n_head_kv=2, n_ff=48, fused=True,
                            n_ctx_orig=64),
    "phi3_split_short": dict(arch="phi3", n_layer=2, n_embd=32, n_head=4, n_head_kv=2, n_ff=48, fused=False,
                             n_ctx_orig=4096),
    # DeepSeek-V2-Lite-like: plain attn_q, softmax gating, one leading dense layer, YaRN
    "deepseek2_v2": dict(arch="deepseek2", n_layer=3, n_embd=32, n_head=4, q_lora=0, kv_lora=16, nope=8,
                         rope=8, v_dim=12, n_ff=48, n_dense=1, n_expert=8, n_used=2, n_ff_exp=16, n_shared=1,
                         gating=1, norm=False, w_scale=1.0, yarn=(4.0, 0.0707, 32)),
    # DeepSeek-V3-like: q LoRA, sigmoid gating with a selection bias, grouped routing, scale
    "deepseek2_v3": dict(arch="deepseek2", n_layer=3, n_embd=32, n_head=4, q_lora=24, kv_lora=16, nope=8,
                         rope=8, v_dim=8, n_ff=48, n_dense=1, n_expert=8, n_used=3, n_ff_exp=16, n_shared=1,
                         gating=2, norm=True, w_scale=2.5, groups=(4, 2), probs_bias=True,
                         yarn=(8.0, 0.1, 16)),
    # Gemma 4 (dense text): sliding/global layers with their own head widths, rope bases and
    # rope dims, per-layer KV head counts, V = K where attn_v is absent, layer output scales
    "gemma4": dict(arch="gemma4", n_layer=4, n_embd=32, n_head=4, n_head_kv=[2, 2, 1, 2], head_dim=32,
                   head_dim_swa=16, n_ff=64, swa=[True, True, False, True], window=4, no_v=(2,), fused=False),
    # Gemma 4 26B-A4B-like: experts beside the dense FFN on some layers (gate/up fused on one)
    "gemma4_moe": dict(arch="gemma4", n_layer=3, n_embd=32, n_head=4, n_head_kv=2, head_dim=32, head_dim_swa=16,
                       n_ff=64, swa=[True, False, True], window=4, fused=False, n_expert=8, n_used=2,
                       n_ff_exp=32, moe_layers=(0, 2), fused_exps=(2,), seed=2),
    # Gemma 4 E2B-like: per-layer embeddings, the last layers sharing earlier layers' KV
    "gemma4_e2b": dict(arch="gemma4", n_layer=5, n_embd=32, n_head=4, n_head_kv=2, head_dim=32, head_dim_swa=16,
                       n_ff=64, swa=[True, True, False, True, False], window=4, fused=False, n_pl=8,
                       shared_kv=2, seed=3),
    "gemma4_fused_qkv": dict(arch="gemma4", n_layer=3, n_embd=32, n_head=2, n_head_kv=1, head_dim=32,
                             head_dim_swa=16, n_ff=64, swa=[True, False, True], window=3, fused=True, seed=1),
}


def _glu_ffn(add, prefix, kind, E, F, down_gain=1.0, n_expert=0):
    """A gated FFN's gate, up and down matrices through a writer's `add` (name, shape, scale):
    kind "" (dense), "_exps" (n_expert routed experts, 3-D) or "_shexp" (shared experts), in
    llama.cpp's names; weights of std 1/sqrt(fan-in), the down projection's times down_gain."""
    lead = (n_expert,) if kind == "_exps" else ()
    add(prefix + f"ffn_gate{kind}.weight", lead + (F, E), 1 / math.sqrt(E))
    add(prefix + f"ffn_up{kind}.weight", lead + (F, E), 1 / math.sqrt(E))
    add(prefix + f"ffn_down{kind}.weight", lead + (E, F), down_gain / math.sqrt(F))


def family_gguf(path, arch, n_layer=2, n_embd=32, n_head=4, n_head_kv=2, head_dim=None, n_ff=48, n_expert=8,
                n_used=2, n_ff_exp=24, fused=True, n_ctx_orig=64, q_lora=0, kv_lora=16, nope=8, rope=8,
                v_dim=8, n_dense=1, n_shared=1, gating=None, norm=None, w_scale=None, groups=None,
                probs_bias=False, yarn=None, n_ctx_train=4096, seed=0, drop=(), keys=None, shapes=None,
                tokenizer=None, qtype=None, head_dim_swa=None, swa=None, window=0, no_v=(), extra=None,
                moe_layers=(), fused_exps=(), n_pl=0, shared_kv=0, quantize=False):
    """Write a random F32 model of a FAMILY_CONFIGS architecture (qwen3moe, phi3, deepseek2)
    with the tokenizer of the GGUF `tokenizer` (default SmolLM2). For the bad-input tests:
    `drop` leaves tensors out, `keys` {key: value} overrides or adds `{arch}.` metadata (None
    removes), `shapes` {tensor: numpy shape} overrides tensor shapes, `extra` {tensor: shape}
    adds tensors. n_used may be a per-layer
    list; yarn is (factor, yarn_log_multiplier, original context length). gemma4: head_dim
    (global layers), head_dim_swa, swa (per-layer flags), window, no_v (layers without
    attn_v), moe_layers (layers with experts), fused_exps (of those, with ffn_gate_up_exps), n_pl
    (per-layer embedding width), shared_kv (layers reusing earlier KV). qtype (e.g. "Q8_0"):
    matrices whose rows fit its blocks are stored quantized (the GPU checks)."""
    import gguf
    import gguf.quants

    if tokenizer is None:
        from reflex_ipc.modelpath import resolve_model

        tokenizer = resolve_model("smollm2")
    rng = np.random.default_rng(seed)
    E, H = n_embd, n_head
    hd = head_dim or E // H
    kv = {"block_count": n_layer, "context_length": n_ctx_train, "embedding_length": E,
          "feed_forward_length": n_ff, "attention.head_count": H, "attention.head_count_kv": n_head_kv,
          "attention.layer_norm_rms_epsilon": 1e-6, "rope.freq_base": 10000.0}
    if arch == "qwen3moe":
        kv.update({"attention.key_length": hd, "attention.value_length": hd, "rope.freq_base": 1e6,
                   "expert_count": n_expert, "expert_used_count": n_used,
                   "expert_feed_forward_length": n_ff_exp})
    elif arch == "phi3":
        kv.update({"rope.dimension_count": hd, "rope.scaling.original_context_length": n_ctx_orig,
                   "rope.scaling.attn_factor": 1.19, "attention.layer_norm_rms_epsilon": 1e-5})
    elif arch == "deepseek2":
        kv.update({"attention.head_count_kv": 1, "attention.key_length": kv_lora + rope,
                   "attention.value_length": kv_lora, "attention.key_length_mla": nope + rope,
                   "attention.value_length_mla": v_dim, "rope.dimension_count": rope,
                   "attention.q_lora_rank": q_lora, "attention.kv_lora_rank": kv_lora,
                   "leading_dense_block_count": n_dense, "expert_count": n_expert, "expert_used_count": n_used,
                   "expert_feed_forward_length": n_ff_exp, "expert_shared_count": n_shared})
        if gating is not None:
            kv["expert_gating_func"] = gating
        if norm is not None:
            kv["expert_weights_norm"] = norm
        if w_scale is not None:
            kv["expert_weights_scale"] = w_scale
        if groups:
            kv["expert_group_count"], kv["expert_group_used_count"] = groups
        if yarn:
            kv.update({"rope.scaling.type": "yarn", "rope.scaling.factor": yarn[0],
                       "rope.scaling.yarn_log_multiplier": yarn[1],
                       "rope.scaling.original_context_length": yarn[2]})
    elif arch == "gemma4":
        kv.update({"attention.key_length": hd, "attention.value_length": hd,
                   "attention.key_length_swa": head_dim_swa, "attention.value_length_swa": head_dim_swa,
                   "rope.dimension_count": hd, "rope.dimension_count_swa": head_dim_swa,
                   "rope.freq_base": 1e6, "rope.freq_base_swa": 10000.0, "attention.sliding_window": window,
                   "attention.sliding_window_pattern": list(swa), "embedding_length_per_layer_input": n_pl,
                   "attention.shared_kv_layers": shared_kv or None,
                   "final_logit_softcapping": 15.0})
        if moe_layers:
            kv.update({"expert_count": n_expert, "expert_used_count": n_used,
                       "expert_feed_forward_length": n_ff_exp})
    else:
        raise ValueError(f"no family recipe for {arch!r}")
    kv.update(keys or {})

    w = _quantized_writer(path, arch, seed) if quantize else gguf.GGUFWriter(str(path), arch)
    write_tokenizer(w, _tiny_tokenizer(tokenizer))
    for k, v in kv.items():
        if v is not None:
            add_kv(w, f"{arch}.{k}", v)

    quant = getattr(gguf.GGMLQuantizationType, qtype) if qtype else None

    def add(name, shape, scale, offset=0.0):
        shape = (shapes or {}).get(name, shape)
        a = (offset + scale * rng.standard_normal(shape)).astype(np.float32)
        if name in drop:
            return
        if quant is not None and len(shape) >= 2 and shape[-1] % gguf.GGML_QUANT_SIZES[quant][0] == 0:
            w.add_tensor(name, gguf.quants.quantize(a, quant), raw_dtype=quant)
        else:
            w.add_tensor(name, a)

    def norm_w(name, n):
        add(name, (n,), 0.1, 1.0)

    V = TINY_N_VOCAB
    for name, shape in (extra or {}).items():
        add(name, shape, 0.1)
    add("token_embd.weight", (V, E), 1.0)
    norm_w("output_norm.weight", E)
    if arch == "gemma4":
        if n_pl:
            add("per_layer_token_embd.weight", (V, n_layer * n_pl), 0.3)
            add("per_layer_model_proj.weight", (n_layer * n_pl, E), 1 / math.sqrt(E))
            norm_w("per_layer_proj_norm.weight", n_pl)
        _gemma4_layers(add, norm_w, n_layer, E, H, n_head_kv, hd, head_dim_swa, n_ff, swa, no_v, fused,
                       moe_layers, fused_exps, n_expert, n_ff_exp, n_pl)
        finish(w)
        return str(path)
    if arch != "qwen3moe":
        add("output.weight", (V, E), 1 / math.sqrt(E))
    if arch == "phi3":
        add("rope_factors_long.weight", (hd // 2,), 0.5, 2.0)
        add("rope_factors_short.weight", (hd // 2,), 0.2, 1.1)
    for i in range(n_layer):
        p = f"blk.{i}."
        norm_w(p + "attn_norm.weight", E)
        if arch == "deepseek2":
            qd = nope + rope
            if q_lora:
                add(p + "attn_q_a.weight", (q_lora, E), 1 / math.sqrt(E))
                norm_w(p + "attn_q_a_norm.weight", q_lora)
                add(p + "attn_q_b.weight", (H * qd, q_lora), 1 / math.sqrt(q_lora))
            else:
                add(p + "attn_q.weight", (H * qd, E), 1 / math.sqrt(E))
            add(p + "attn_kv_a_mqa.weight", (kv_lora + rope, E), 1 / math.sqrt(E))
            norm_w(p + "attn_kv_a_norm.weight", kv_lora)
            add(p + "attn_k_b.weight", (H, kv_lora, nope), 1 / math.sqrt(nope))
            add(p + "attn_v_b.weight", (H, v_dim, kv_lora), 1 / math.sqrt(kv_lora))
            add(p + "attn_output.weight", (E, H * v_dim), 1 / math.sqrt(H * v_dim))
        elif arch == "phi3" and fused:
            add(p + "attn_qkv.weight", ((H + 2 * n_head_kv) * hd, E), 1 / math.sqrt(E))
        else:
            add(p + "attn_q.weight", (H * hd, E), 1 / math.sqrt(E))
            add(p + "attn_k.weight", (n_head_kv * hd, E), 1 / math.sqrt(E))
            add(p + "attn_v.weight", (n_head_kv * hd, E), 1 / math.sqrt(E))
        if arch == "qwen3moe":
            norm_w(p + "attn_q_norm.weight", hd)
            norm_w(p + "attn_k_norm.weight", hd)
        if arch != "deepseek2":
            add(p + "attn_output.weight", (E, H * hd), 1 / math.sqrt(H * hd))
        norm_w(p + "ffn_norm.weight", E)
        if arch == "phi3":
            add(p + "ffn_up.weight", (2 * n_ff, E), 1 / math.sqrt(E))
            add(p + "ffn_down.weight", (E, n_ff), 1 / math.sqrt(n_ff))
        elif arch == "deepseek2" and i < n_dense:
            _glu_ffn(add, p, "", E, n_ff)
        else:
            add(p + "ffn_gate_inp.weight", (n_expert, E), 1.0)
            if probs_bias:
                add(p + "exp_probs_b.bias", (n_expert,), 0.3)
            _glu_ffn(add, p, "_exps", E, n_ff_exp, n_expert=n_expert)
            if arch == "deepseek2":
                _glu_ffn(add, p, "_shexp", E, n_ff_exp * n_shared)
    finish(w)
    return str(path)


def _gemma4_layers(add, norm_w, n_layer, E, H, n_head_kv, hd, hd_swa, n_ff, swa, no_v, fused, moe_layers,
                   fused_exps, X, Fe, n_pl):
    add("rope_freqs.weight", (hd // 2,), 0.3, 1.5)
    for i in range(n_layer):
        p = f"blk.{i}."
        d = hd_swa if swa[i] else hd
        Hkv = n_head_kv[i] if isinstance(n_head_kv, list) else n_head_kv
        norm_w(p + "attn_norm.weight", E)
        if fused:
            add(p + "attn_qkv.weight", ((H + 2 * Hkv) * d, E), 1 / math.sqrt(E))
        else:
            add(p + "attn_q.weight", (H * d, E), 1 / math.sqrt(E))
            add(p + "attn_k.weight", (Hkv * d, E), 1 / math.sqrt(E))
            if i not in no_v:
                add(p + "attn_v.weight", (Hkv * d, E), 1 / math.sqrt(E))
        norm_w(p + "attn_q_norm.weight", d)
        norm_w(p + "attn_k_norm.weight", d)
        add(p + "attn_output.weight", (E, H * d), 1 / math.sqrt(H * d))
        norm_w(p + "post_attention_norm.weight", E)
        norm_w(p + "ffn_norm.weight", E)
        _glu_ffn(add, p, "", E, n_ff)
        norm_w(p + "post_ffw_norm.weight", E)
        add(p + "layer_output_scale.weight", (1,), 0.2, 0.8)
        if n_pl:
            add(p + "inp_gate.weight", (n_pl, E), 0.2 / math.sqrt(E))  # O(1) inputs to its gelu
            add(p + "proj.weight", (E, n_pl), 1 / math.sqrt(n_pl))
            norm_w(p + "post_norm.weight", E)
        if i in moe_layers:
            add(p + "ffn_gate_inp.weight", (X, E), 1.0)
            add(p + "ffn_gate_inp.scale", (E,), 0.3, 1.0)
            for n in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"):
                norm_w(p + n + ".weight", E)
            if i in fused_exps:
                add(p + "ffn_gate_up_exps.weight", (X, 2 * Fe, E), 1 / math.sqrt(E))
            else:
                add(p + "ffn_gate_exps.weight", (X, Fe, E), 1 / math.sqrt(E))
                add(p + "ffn_up_exps.weight", (X, Fe, E), 1 / math.sqrt(E))
            add(p + "ffn_down_exps.weight", (X, E, Fe), 1 / math.sqrt(Fe))
            add(p + "ffn_down_exps.scale", (X,), 0.3, 1.0)


# ---------------------------------------------------------------------------------------
# recurrent hybrids (F32 weights: the file is its own F32 twin for llama.cpp)
HYBRID_CONFIGS = {
    # 4 layers: DeltaNet, attention, DeltaNet, attention (full_attention_interval 2);
    # 4 value heads over 2 key heads (ggml's tiled sharing), partial rope (8 of 16 dims)
    "qwen35": dict(arch="qwen35", n_layer=4, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_rot=8,
                   n_ff=128, d_conv=4, d_state=16, n_k=2, n_v=4, interval=2, sections=[2, 1, 1, 0]),
    # the layer kinds as an explicit array (attention first and last); fused attn_qkv
    "qwen35_flags": dict(arch="qwen35", n_layer=4, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_rot=8,
                         n_ff=128, d_conv=4, d_state=16, n_k=2, n_v=4, recurrent=[False, True, True, False],
                         sections=[2, 1, 1, 0], seed=1, fused_qkv=True),
    # qwen35moe: 4 experts (2 used, width 32) and a gated shared expert (width 64) in every layer
    "qwen35moe": dict(arch="qwen35moe", n_layer=4, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_rot=8,
                      n_ff=128, d_conv=4, d_state=16, n_k=2, n_v=4, interval=4, sections=[2, 1, 1, 0], seed=2,
                      n_expert=4, n_used=2, n_ff_exp=32, n_ff_sh=64),
}


def hybrid_gguf(path, arch="qwen35", n_layer=4, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_rot=8,
                n_ff=128, d_conv=4, d_state=16, n_k=2, n_v=4, interval=None, recurrent=None,
                sections=(2, 1, 1, 0), eps=1e-6, rope_base=1e6, seed=0, tokenizer=None, meta=None, drop=(),
                gain=4.0, embd_std=0.5, n_expert=0, n_used=0, n_ff_exp=0, n_ff_sh=0, fused_qkv=False,
                quantize=False):
    """Write a random-weight recurrent hybrid (qwen35) with llama.cpp's tensor names and keys, F32
    weights, and the tokenizer of the GGUF `tokenizer` (default SmolLM2). `recurrent` (per-layer
    flags) is written as attention.recurrent_layers, else `interval` as full_attention_interval;
    `meta` {key suffix: value} adds or overrides keys (bad-input tests); `drop` omits tensors.
    The projections back into the residual stream get `gain` times 1/sqrt(fan_in), so that the
    layers outweigh the (tied) input embedding and greedy decoding does not loop at once."""
    import gguf

    if tokenizer is None:
        from reflex_ipc.modelpath import resolve_model

        tokenizer = resolve_model("smollm2")
    rng = np.random.default_rng(seed)
    w = _quantized_writer(path, arch, seed) if quantize else gguf.GGUFWriter(str(path), arch)
    n_vocab = write_tokenizer(w, _tiny_tokenizer(tokenizer))
    keys = {"context_length": 512, "block_count": n_layer, "embedding_length": n_embd,
            "feed_forward_length": n_ff, "attention.head_count": n_head, "attention.head_count_kv": n_head_kv,
            "attention.key_length": head_dim, "attention.value_length": head_dim,
            "rope.dimension_count": n_rot, "rope.freq_base": float(rope_base),
            "attention.layer_norm_rms_epsilon": float(eps), "rope.dimension_sections": list(sections),
            "ssm.conv_kernel": d_conv, "ssm.inner_size": d_state * n_v, "ssm.state_size": d_state,
            "ssm.time_step_rank": n_v, "ssm.group_count": n_k}
    if n_expert:
        keys.update({"expert_count": n_expert, "expert_used_count": n_used, "expert_feed_forward_length": n_ff_exp,
                     "expert_shared_feed_forward_length": n_ff_sh})
    if recurrent is not None:
        keys["attention.recurrent_layers"] = [bool(r) for r in recurrent]
    elif interval is not None:
        keys["full_attention_interval"] = interval
    keys.update(meta or {})
    for k, v in keys.items():
        if isinstance(v, list):
            w.add_array(f"{arch}.{k}", v)
        elif isinstance(v, float):
            w.add_float32(f"{arch}.{k}", v)
        else:
            w.add_uint32(f"{arch}.{k}", v)
    if recurrent is None:
        recurrent = [(i + 1) % (interval or 4) != 0 for i in range(n_layer)]
    recurrent = list(recurrent[:n_layer]) + [False] * (n_layer - len(recurrent))  # a bad-input file
    E, hd, d = n_embd, head_dim, d_state
    conv_dim, vd = 2 * d * n_k + d * n_v, d * n_v
    tensors = {}

    def add(name, shape, scale, offset=0.0):
        a = (offset + scale * rng.standard_normal(shape)).astype(np.float32)
        if name not in drop:
            w.add_tensor(name, a)
        tensors[name] = a

    add("token_embd.weight", (n_vocab, E), embd_std)
    add("output_norm.weight", (E,), 0.1, 1.0)
    for i in range(n_layer):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", (E,), 0.1, 1.0)
        add(p + "post_attention_norm.weight", (E,), 0.1, 1.0)
        if recurrent[i]:
            add(p + "attn_qkv.weight", (conv_dim, E), 1 / math.sqrt(E))
            add(p + "attn_gate.weight", (vd, E), 1 / math.sqrt(E))
            add(p + "ssm_conv1d.weight", (conv_dim, d_conv), 0.5)
            add(p + "ssm_dt.bias", (n_v,), 0.5)
            tensors[p + "ssm_a"] = a = -np.exp(0.5 * rng.standard_normal(n_v)).astype(np.float32)
            if p + "ssm_a" not in drop:
                w.add_tensor(p + "ssm_a", a)
            add(p + "ssm_beta.weight", (n_v, E), 1 / math.sqrt(E))
            add(p + "ssm_alpha.weight", (n_v, E), 1 / math.sqrt(E))
            add(p + "ssm_norm.weight", (d,), 0.1, 1.0)
            add(p + "ssm_out.weight", (E, vd), gain / math.sqrt(vd))
        else:
            if fused_qkv:
                add(p + "attn_qkv.weight", ((2 * n_head + 2 * n_head_kv) * hd, E), 1 / math.sqrt(E))
            else:
                add(p + "attn_q.weight", (2 * n_head * hd, E), 1 / math.sqrt(E))
                add(p + "attn_k.weight", (n_head_kv * hd, E), 1 / math.sqrt(E))
                add(p + "attn_v.weight", (n_head_kv * hd, E), 1 / math.sqrt(E))
            add(p + "attn_q_norm.weight", (hd,), 0.1, 1.0)
            add(p + "attn_k_norm.weight", (hd,), 0.1, 1.0)
            add(p + "attn_output.weight", (E, n_head * hd), gain / math.sqrt(n_head * hd))
        if n_expert:
            add(p + "ffn_gate_inp.weight", (n_expert, E), 1.0)
            _glu_ffn(add, p, "_exps", E, n_ff_exp, gain, n_expert)
            add(p + "ffn_gate_inp_shexp.weight", (E,), 1 / math.sqrt(E))
            _glu_ffn(add, p, "_shexp", E, n_ff_sh, gain)
        else:
            _glu_ffn(add, p, "", E, n_ff, gain)
    finish(w)
    return tensors


GRANITE_CONFIGS = {
    # Mamba-2, attention, Mamba-2, attention; dense SwiGLU; rope; Granite's four scales
    "granitehybrid": dict(n_layer=4, kv=[0, 2, 0, 2]),
    # attention first, MoE (4 experts, 2 used) with a shared expert, NoPE (rope.scaling.finetuned false)
    "granitehybrid_moe": dict(n_layer=4, kv=[2, 0, 0, 2], n_expert=4, n_used=2, n_ff=32, n_ff_shexp=64,
                              rope=False, seed=3),
}


def granite_gguf(path, n_layer=4, kv=(0, 2, 0, 2), n_embd=64, n_head=4, n_ff=128, d_conv=4, d_state=16,
                 n_ssm_head=8, n_group=2, n_expert=0, n_used=0, n_ff_shexp=0, rope=True, eps=1e-5,
                 embedding_scale=2.0, residual_scale=0.5, logit_scale=2.0, attention_scale=0.2, seed=0,
                 tokenizer=None, meta=None, drop=(), gain=4.0, quantize=False):
    """Write a random-weight `granitehybrid` (Mamba-2 + attention; head_count_kv 0 marks a Mamba
    layer) with llama.cpp's tensor names and keys, F32 weights, the tokenizer of `tokenizer`
    (default SmolLM2); dense FFN, or MoE with n_expert > 0 (shared expert with n_ff_shexp)."""
    import gguf

    if tokenizer is None:
        from reflex_ipc.modelpath import resolve_model

        tokenizer = resolve_model("smollm2")
    arch = "granitehybrid"
    rng = np.random.default_rng(seed)
    w = _quantized_writer(path, arch, seed) if quantize else gguf.GGUFWriter(str(path), arch)
    n_vocab = write_tokenizer(w, _tiny_tokenizer(tokenizer))
    E, hd, di = n_embd, n_embd // n_head, 2 * n_embd
    keys = {"context_length": 512, "block_count": n_layer, "embedding_length": E, "feed_forward_length": n_ff,
            "attention.head_count": n_head, "attention.head_count_kv": list(kv), "rope.freq_base": 10000.0,
            "attention.layer_norm_rms_epsilon": float(eps), "ssm.conv_kernel": d_conv, "ssm.inner_size": di,
            "ssm.state_size": d_state, "ssm.time_step_rank": n_ssm_head, "ssm.group_count": n_group,
            "embedding_scale": float(embedding_scale), "residual_scale": float(residual_scale),
            "logit_scale": float(logit_scale), "attention.scale": float(attention_scale),
            "rope.scaling.finetuned": bool(rope)}
    if n_expert:
        keys.update({"expert_count": n_expert, "expert_used_count": n_used})
        if n_ff_shexp:
            keys["expert_shared_feed_forward_length"] = n_ff_shexp
    keys.update(meta or {})
    for k, v in keys.items():
        add_kv(w, f"{arch}.{k}", v)
    cd = di + 2 * n_group * d_state
    tensors = {}

    def add(name, shape, scale, offset=0.0, data=None):
        a = data if data is not None else (offset + scale * rng.standard_normal(shape)).astype(np.float32)
        if name not in drop:
            w.add_tensor(name, a)
        tensors[name] = a

    add("token_embd.weight", (n_vocab, E), 0.5 / embedding_scale)
    add("output_norm.weight", (E,), 0.1, 1.0)
    for i in range(n_layer):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", (E,), 0.1, 1.0)
        if kv[i] == 0:
            add(p + "ssm_in.weight", (2 * di + 2 * n_group * d_state + n_ssm_head, E), 1 / math.sqrt(E))
            add(p + "ssm_conv1d.weight", (cd, d_conv), 0.5)
            add(p + "ssm_conv1d.bias", (cd,), 0.1)
            add(p + "ssm_dt.bias", (n_ssm_head,), 0.5)
            add(p + "ssm_a", None, 0, data=-np.exp(0.5 * rng.standard_normal((n_ssm_head, 1))).astype(np.float32))
            add(p + "ssm_d", (n_ssm_head, 1), 0.5, 1.0)
            add(p + "ssm_norm.weight", (n_group, di // n_group), 0.1, 1.0)
            add(p + "ssm_out.weight", (E, di), gain / math.sqrt(di))
        else:
            add(p + "attn_q.weight", (n_head * hd, E), 1 / math.sqrt(E))
            add(p + "attn_k.weight", (kv[i] * hd, E), 1 / math.sqrt(E))
            add(p + "attn_v.weight", (kv[i] * hd, E), 1 / math.sqrt(E))
            add(p + "attn_output.weight", (E, n_head * hd), gain / math.sqrt(n_head * hd))
        add(p + "ffn_norm.weight", (E,), 0.1, 1.0)
        if n_expert:
            add(p + "ffn_gate_inp.weight", (n_expert, E), 1.0)
            _glu_ffn(add, p, "_exps", E, n_ff, gain, n_expert)
            if n_ff_shexp:
                _glu_ffn(add, p, "_shexp", E, n_ff_shexp, gain)
        else:
            _glu_ffn(add, p, "", E, n_ff, gain)
    finish(w)
    return tensors


# ---------------------------------------------------------------------------------------
# one model of each architecture the seed issues added, quantized where the shapes allow
# (tests/test_new_archs.py: parity with llama.cpp on the quantized files, every op over
# every transport, bad input). The FFN widths are 256 so that some matrices take K-quant
# blocks (rows of 256 values); the other dimensions stay those of the F32 configs above.
ARCH_CONFIGS = {
    "qwen3moe": ("family", dict(FAMILY_CONFIGS["qwen3moe"], n_ff_exp=256)),
    "phi3": ("family", dict(FAMILY_CONFIGS["phi3_fused_long"], n_ff=256)),
    "deepseek2": ("family", dict(FAMILY_CONFIGS["deepseek2_v3"], n_ff=256, n_ff_exp=256)),
    "gemma4": ("family", dict(FAMILY_CONFIGS["gemma4_moe"], n_ff=256, n_ff_exp=256)),
    "qwen35": ("hybrid", dict(HYBRID_CONFIGS["qwen35"], n_ff=256)),
    "qwen35moe": ("hybrid", dict(HYBRID_CONFIGS["qwen35moe"], n_ff_exp=256, n_ff_sh=256)),
    "granitehybrid": ("granite", dict(GRANITE_CONFIGS["granitehybrid_moe"], n_ff=256, n_ff_shexp=256)),
}


def arch_gguf(name, path, tokenizer=None, quantize=True, **changes):
    """Write the ARCH_CONFIGS model `name` to path, quantized where its shapes allow
    (_quantized_writer: its F32 twin goes to `{path}.twin.gguf`) unless quantize is False;
    `changes` override the config (the writers' bad-input options: keys/meta, drop, shapes)."""
    kind, cfg = ARCH_CONFIGS[name]
    write = {"family": family_gguf, "hybrid": hybrid_gguf, "granite": granite_gguf}[kind]
    write(str(path), tokenizer=tokenizer, quantize=quantize, **dict(cfg, **changes))
    return str(path)


# ---------------------------------------------------------------------------------------
# the command line (scripts/fixtures/make_gguf.py)
def main(argv=None, qwen2_vocab=None):
    """The CLI; qwen2_vocab: the default of qwen3-shaped --vocab and dump-vocab --out."""
    ap = argparse.ArgumentParser(prog="make_gguf.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("parity", help="the parity models (tests/data/synthetic-*.gguf)")
    p.add_argument("--out", required=True, help="output folder (the committed ones: tests/data)")
    p.add_argument("--arch", nargs="*", choices=sorted(PARITY_MODELS), default=sorted(PARITY_MODELS))
    p.add_argument("--gpt2-vocab", help="GGUF whose gpt2 vocabulary to copy (default: SmolLM2)")
    p.add_argument("--spm-vocab", help="GGUF whose SentencePiece vocabulary to copy (default: "
                   "ggml-vocab-llama-spm.gguf of the llama-cpp-python sdist)")
    p = sub.add_parser("mixed", help="a model whose matrices use every block format")
    p.add_argument("out")
    p.add_argument("--arch", required=True, choices=sorted(MIXED_MODELS))
    p.add_argument("--tokenizer", required=True, help="GGUF whose tokenizer to copy")
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("tokenizer-only", help="just the tokenizer of a GGUF")
    p.add_argument("out")
    p.add_argument("--from", dest="src", default=None, help="the GGUF (default: SmolLM2)")
    p = sub.add_parser("qwen3-shaped", help="a Qwen3-0.6B-shaped model for GPU timing")
    p.add_argument("out")
    p.add_argument("--type", choices=("q8_0", "q4k"), default="q8_0")
    p.add_argument("--vocab", default=qwen2_vocab, required=qwen2_vocab is None,
                   help=f"GGUF or dump-vocab .npz with the Qwen2 vocabulary (default: {qwen2_vocab})")
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("hybrid", help="a tiny F32 recurrent hybrid (qwen35, qwen35moe, granitehybrid)")
    p.add_argument("out")
    p.add_argument("--config", required=True, choices=sorted(HYBRID_CONFIGS) + sorted(GRANITE_CONFIGS))
    p.add_argument("--tokenizer", default=None, help="GGUF whose tokenizer to copy (default: SmolLM2)")
    p = sub.add_parser("dump-vocab", help="save a GGUF's tokenizer as a compact .npz (for qwen3-shaped)")
    p.add_argument("gguf", help="e.g. llama.cpp's models/ggml-vocab-qwen2.gguf")
    p.add_argument("--out", default=qwen2_vocab, required=qwen2_vocab is None)
    a = ap.parse_args(argv)
    if a.cmd == "parity":
        vocab = None
        if not (a.gpt2_vocab and a.spm_vocab):
            vocab = default_vocab_paths()
        vocab = {"gpt2": a.gpt2_vocab or vocab["gpt2"], "spm": a.spm_vocab or vocab["spm"]}
        os.makedirs(a.out, exist_ok=True)
        for arch in a.arch:
            path = parity_model(arch, os.path.join(a.out, f"synthetic-{arch}.gguf"), vocab_paths=vocab)
            print(f"{path}: {os.path.getsize(path) / 1e6:.2f} MB")
    elif a.cmd == "mixed":
        print(mixed_model(a.arch, a.tokenizer, a.out, a.seed))
    elif a.cmd == "tokenizer-only":
        from reflex_ipc.modelpath import resolve_model

        print(tokenizer_only(a.src or resolve_model("smollm2"), a.out))
    elif a.cmd == "hybrid":
        if a.config in HYBRID_CONFIGS:
            hybrid_gguf(a.out, tokenizer=a.tokenizer, **HYBRID_CONFIGS[a.config])
        else:
            granite_gguf(a.out, tokenizer=a.tokenizer, **GRANITE_CONFIGS[a.config])
        print(a.out)
    elif a.cmd == "qwen3-shaped":
        t0 = time.perf_counter()
        qwen3_shaped(a.out, a.type, a.vocab, a.seed)
        print(f"{a.out}: {os.path.getsize(a.out) / 1e6:.1f} MB in {time.perf_counter() - t0:.1f} s")
    else:
        print(dump_vocab(a.gguf, a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
