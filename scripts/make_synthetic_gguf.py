#!/usr/bin/env python3
"""Small random-weight GGUFs of real architectures, for backend parity checks (a fixture
script: it uses the `gguf` package, never on the load path).

    make_synthetic_gguf.py --tokenizer-only OUT.gguf [--from MODEL.gguf]
        copy just the tokenizer metadata of MODEL (default: SmolLM2) into a small GGUF
    make_synthetic_gguf.py --arch qwen3 --tokenizer TOK.gguf OUT.gguf [--seed N]
        a model of that architecture (llama, qwen2, qwen3, gemma3) with the tokenizer of TOK

The tensors use a mix of block formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K,
F16, BF16, F32) so that one model exercises every matmul kernel. Formats gguf can
quantize are quantized from normal weights; for the K formats the blocks are random
with scales chosen so the weights have about the same spread.
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TOKENIZER_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
                  "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id",
                  "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id",
                  "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token",
                  "tokenizer.ggml.add_space_prefix", "tokenizer.ggml.scores", "tokenizer.chat_template")

ARCH = {  # n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff
    "llama": dict(n_embd=256, n_layer=3, n_head=4, n_head_kv=2, head_dim=64, n_ff=512),
    "qwen2": dict(n_embd=256, n_layer=3, n_head=4, n_head_kv=2, head_dim=64, n_ff=512),
    "qwen3": dict(n_embd=256, n_layer=3, n_head=4, n_head_kv=2, head_dim=128, n_ff=512),
    "gemma3": dict(n_embd=256, n_layer=6, n_head=4, n_head_kv=1, head_dim=128, n_ff=512),
}
# the formats cycled through the matrices of each layer
MATRIX_TYPES = ["Q8_0", "Q4_K", "Q6_K", "Q5_0", "Q4_0", "Q5_K", "Q4_1", "Q5_1", "F16", "BF16", "F32"]


def copy_tokenizer(writer, tok_path):
    import gguf

    from reflex_ipc.gguffile import T_ARRAY, GGUFFile

    f = GGUFFile(tok_path)
    for key in TOKENIZER_KEYS:
        if key not in f.metadata:
            continue
        v = f.metadata[key]
        vt = f.value_types[key]
        if vt == T_ARRAY:
            et = v.elem_type
            items = v.raw_strings() if et == gguf.GGUFValueType.STRING else v.tolist()
            writer.add_array(key, items) if et == gguf.GGUFValueType.STRING else \
                writer.add_key_value(key, items, gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType(et))
        else:
            writer.add_key_value(key, v, gguf.GGUFValueType(vt))
    n_vocab = len(f.metadata["tokenizer.ggml.tokens"])
    f.close()
    return n_vocab


def matrix(rng, rows, cols, tname, std):
    """(data, raw_dtype) for GGUFWriter.add_tensor: a [rows, cols] weight in format tname."""
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


def build(arch, tok_path, out, seed=0):
    import gguf

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from make_synthetic import write_shape

    hp = ARCH[arch]
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(out, arch)
    n_vocab = copy_tokenizer(w, tok_path)
    E, Lh, H, Hkv, hd, F = (hp[k] for k in ("n_embd", "n_layer", "n_head", "n_head_kv", "head_dim", "n_ff"))
    write_shape(w, n_layer=Lh, n_ctx=2048, n_embd=E, n_ff=F, n_head=H, n_head_kv=Hkv, head_dim=hd,
                eps=1e-6, rope_base=1e6 if arch != "llama" else 10000.0)
    w.add_uint32(f"{arch}.vocab_size", n_vocab)
    if arch == "gemma3":
        w.add_sliding_window(8)
    tensors = []

    def add(name, data, raw_dtype=None):
        tensors.append(name)
        w.add_tensor(name, data, raw_dtype=raw_dtype)

    emb_type = {"llama": "Q8_0", "qwen2": "Q6_K", "qwen3": "Q8_0", "gemma3": "Q5_K"}[arch]
    tied = arch in ("qwen3", "gemma3")  # no output.weight: the LM head is the embedding
    # a tied embedding much larger than the layers' outputs would make every token predict itself
    add("token_embd.weight", *matrix(rng, n_vocab, E, emb_type, 0.1 if tied else 1.0))
    ones = lambda n: (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)  # noqa: E731
    add("output_norm.weight", ones(E))
    if not tied:
        add("output.weight", *matrix(rng, n_vocab, E, "Q4_K" if arch == "llama" else "Q8_0", 1 / np.sqrt(E) * 4))
    k = 0
    for i in range(Lh):
        p = f"blk.{i}."

        def mat(name, rows, cols):
            nonlocal k
            add(p + name + ".weight", *matrix(rng, rows, cols, MATRIX_TYPES[k % len(MATRIX_TYPES)],
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
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def tokenizer_only(src, out):
    import gguf

    w = gguf.GGUFWriter(out, "llama")
    copy_tokenizer(w, src)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--arch", choices=sorted(ARCH))
    ap.add_argument("--tokenizer", help="GGUF whose tokenizer to copy")
    ap.add_argument("--tokenizer-only", action="store_true")
    ap.add_argument("--from", dest="src", default=None)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.tokenizer_only:
        from reflex_ipc.modelpath import resolve_model

        print(tokenizer_only(a.src or resolve_model(None), a.out))
    else:
        if not a.arch or not a.tokenizer:
            ap.error("--arch and --tokenizer are required")
        print(build(a.arch, a.tokenizer, a.out, a.seed))


if __name__ == "__main__":
    main()
