#!/usr/bin/env python3
"""A Qwen3-0.6B-shaped GGUF with random weights, for GPU timing (not for quality).

    python3 scripts/make_qwen3_shaped.py OUT.gguf [--type q8_0|q4k] [--vocab VOCAB]

Shape of Qwen3-0.6B: hidden 1024, 28 layers, 16 heads, 8 KV heads, head_dim 128, FFN 3072,
vocabulary 151,936, tied embeddings, q/k RMS norms (llama.cpp arch "qwen3"). Weights:
  --type q8_0  every matrix Q8_0 (~640 MB)
  --type q4k   Q4_K, with Q6_K for attn_v, ffn_down and the (tied) token embedding, like
               llama.cpp's Q4_K_M mix (~400 MB)
Norms are F32. The blocks are written directly as random bytes with patched scales (no
float quantization), so a file is made in seconds; the scales keep activations and logits
in a sane range.

The tokenizer is Qwen2's real gpt2 BPE vocabulary (tokens, token types, merges, pre
"qwen2"): --vocab is a GGUF to copy it from (e.g. llama.cpp's models/ggml-vocab-qwen2.gguf),
or by default scripts/data/qwen2-vocab.npz, a compressed copy made with
`--dump-vocab GGUF` (so this runs where only the checkout and the `gguf` package exist).
"""

import argparse
import concurrent.futures as cf
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_synthetic import random_blocks  # noqa: E402

VOCAB_NPZ = os.path.join(HERE, "data", "qwen2-vocab.npz")
SHAPE = dict(n_embd=1024, n_layer=28, n_head=16, n_head_kv=8, head_dim=128, n_ff=3072, n_vocab=151936)


# --- the vocabulary -------------------------------------------------------------------------
def _pack_strings(items):
    lens = np.fromiter((len(b) for b in items), dtype=np.uint32, count=len(items))
    return np.frombuffer(b"".join(items), dtype=np.uint8), lens


def _unpack_strings(blob, lens):
    data, out, o = blob.tobytes(), [], 0
    for n in lens.tolist():
        out.append(data[o:o + n])
        o += n
    return out


def dump_vocab(gguf_path, out=VOCAB_NPZ):
    """Save the tokenizer.* keys of gguf_path compactly (npz, compressed)."""
    from gguf import GGUFValueType as VT

    from make_synthetic import read_tokenizer

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
    os.makedirs(os.path.dirname(out), exist_ok=True)
    np.savez_compressed(out, **arrays)
    return out


def load_vocab(path):
    """[(key, value, type, sub_type)] as make_synthetic.read_tokenizer gives them, from a
    GGUF or from a dump_vocab npz."""
    from gguf import GGUFValueType as VT

    if not path.endswith(".npz"):
        from make_synthetic import read_tokenizer

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


# --- the model --------------------------------------------------------------------------------
def tensor_plan(kind):
    """[(name, rows, cols, format, std)] in file order."""
    E, L, H, Hkv, hd, F, V = (SHAPE[k] for k in ("n_embd", "n_layer", "n_head", "n_head_kv", "head_dim", "n_ff", "n_vocab"))
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


def make_tensor(seed, rows, cols, fmt, std):
    rng = np.random.default_rng(seed)
    if fmt == "F32":
        return (std + 0.1 * rng.standard_normal(rows, dtype=np.float32)).astype(np.float32)
    return random_blocks(rng, fmt, rows, cols, std)


def build(out, kind="q8_0", vocab=VOCAB_NPZ, seed=0):
    import gguf
    from gguf import GGMLQuantizationType as T
    from gguf import GGUFValueType as VT

    from make_synthetic import BLOCK, write_shape, write_tokenizer

    E, L, H, Hkv, hd, F, V = (SHAPE[k] for k in ("n_embd", "n_layer", "n_head", "n_head_kv", "head_dim", "n_ff", "n_vocab"))
    w = gguf.GGUFWriter(out, "qwen3")
    w.add_name(f"qwen3-0.6b-shaped-random-{kind}")
    write_shape(w, n_layer=L, n_ctx=40960, n_embd=E, n_ff=F, n_head=H, n_head_kv=Hkv, head_dim=hd,
                eps=1e-6, rope_base=1000000.0)
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q8_0 if kind == "q8_0" else gguf.LlamaFileType.MOSTLY_Q4_K_M))
    n_vocab = write_tokenizer(w, load_vocab(vocab), {"tokenizer.ggml.add_bos_token": (False, VT.BOOL)})
    if n_vocab != V:
        raise SystemExit(f"the vocabulary has {n_vocab} tokens, Qwen3-0.6B has {V}")
    plan = tensor_plan(kind)
    for name, rows, cols, fmt, _ in plan:
        if fmt == "F32":
            w.add_tensor_info(name, [rows], np.dtype(np.float32), rows * 4)
        else:
            blk, bsize = BLOCK[fmt]
            w.add_tensor_info(name, [rows, cols // blk * bsize], np.dtype(np.uint8), rows * cols // blk * bsize, raw_dtype=T[fmt])
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
                pending[nxt] = ex.submit(make_tensor, int(seeds[nxt]), rows, cols, fmt, std)
                nxt += 1
            w.write_tensor_data(pending.pop(i).result())
    w.close()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?")
    ap.add_argument("--type", choices=("q8_0", "q4k"), default="q8_0")
    ap.add_argument("--vocab", default=VOCAB_NPZ, help="GGUF or dump_vocab .npz with the Qwen2 vocabulary")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dump-vocab", metavar="GGUF", help=f"write {VOCAB_NPZ} from this GGUF and exit")
    a = ap.parse_args(argv)
    if a.dump_vocab:
        print(dump_vocab(a.dump_vocab))
        return 0
    if not a.out:
        ap.error("OUT.gguf is required")
    t0 = time.perf_counter()
    build(a.out, a.type, a.vocab, a.seed)
    print(f"{a.out}: {os.path.getsize(a.out) / 1e6:.1f} MB in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
