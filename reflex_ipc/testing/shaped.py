#!/usr/bin/env python3
"""Large model-shaped synthetic GGUFs for GPU timing, written fast (random quantized blocks).

    make_shaped.py MODEL OUT.gguf [--tiny] [--vocab NPZ]
    make_shaped.py --list

MODEL is one of SHAPES (Qwen3 dense 0.6B..32B, Qwen3-30B-A3B, DeepSeek-V2-Lite, a ~2B
Qwen3.5, gpt-oss-20b). Real tensor names and metadata (llama.cpp's), the real Qwen2 vocabulary
(151,936 tokens; scripts/fixtures/data/qwen2-vocab.npz) for every model but gpt-oss (its
o200k_harmony one, scripts/fixtures/data/o200k-harmony-vocab.npz), random weights.

Weights: a Q4_K mix like llama.cpp's Q4_K_M but uniform over layers: every matrix Q4_K, except
Q6_K for output (and token_embd when it is tied to the output), attn_v, ffn_down,
ffn_down_exps and ffn_down_shexp in EVERY layer (Q4_K_M keeps Q6_K in only about half of the
layers); a matrix whose rows are not a multiple of 256 values falls back to Q8_0 (llama.cpp
falls back to Q5_0/Q8_0); norms, the MoE routers (ffn_gate_inp), the conv kernel, ssm_a,
ssm_dt, ssm_alpha/ssm_beta stay F32.

Fast: the quantized data are not quantized from floats. For each (format, std) one pool of
P well-formed random blocks (reflex_ipc.testing.synthetic.random_blocks: random quants, fp16
scales giving values of std ~ 1/sqrt(fan-in)) is built once, and every tensor of that kind is
written as the pool repeated from a per-tensor offset. The content is irrelevant to timing;
values are finite and of realistic magnitude, so logits are finite and spread.

--tiny writes the same model with tiny dimensions (same code path, same names, keys and
formats) for the tests here (tests/test_gpu_bench_scripts.py) and for llama.cpp's check.
"""

import argparse
import concurrent.futures as cf
import math
import os
import sys
import time

import numpy as np

from reflex_ipc.testing.synthetic import BLOCK, add_kv, load_vocab, random_blocks, write_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout

QWEN2_VOCAB = os.path.join(ROOT, "scripts", "fixtures", "data", "qwen2-vocab.npz")
POOL_BLOCKS = 32749  # a prime: pool repeats never line up with row lengths

# kind: qwen3 (dense), qwen3moe, deepseek2, qwen35. Values from the models' config.json.
SHAPES = {
    "qwen3-0.6b": dict(kind="qwen3", E=1024, L=28, H=16, Hkv=8, hd=128, F=3072, tied=True, ctx=40960),
    "qwen3-4b": dict(kind="qwen3", E=2560, L=36, H=32, Hkv=8, hd=128, F=9728, tied=True, ctx=40960),
    "qwen3-8b": dict(kind="qwen3", E=4096, L=36, H=32, Hkv=8, hd=128, F=12288, tied=False, ctx=40960),
    "qwen3-14b": dict(kind="qwen3", E=5120, L=40, H=40, Hkv=8, hd=128, F=17408, tied=False, ctx=40960),
    "qwen3-32b": dict(kind="qwen3", E=5120, L=64, H=64, Hkv=8, hd=128, F=25600, tied=False, ctx=40960),
    # Qwen3-30B-A3B: 48 layers, 128 experts (8 used) of width 768, GQA 32/4 heads of 128
    "qwen3-30b-a3b": dict(kind="qwen3moe", E=2048, L=48, H=32, Hkv=4, hd=128, F=6144, X=128, used=8, Fe=768,
                          tied=False, ctx=40960),
    # DeepSeek-V2-Lite: MLA without q LoRA, kv_lora_rank 512, qk nope/rope 128/64, v 128; layer 0
    # dense (10944), then 64 routed experts of 1408 (6 used, softmax, no renormalization, scale 1)
    # + 2 shared; YaRN factor 40 over 4096, mscale_all_dim 0.707 (llama.cpp: log multiplier
    # 0.1 * 0.707). Its own vocabulary has 102,400 tokens; here Qwen2's (151,936).
    "deepseek-v2-lite": dict(kind="deepseek2", E=2048, L=27, H=16, R=512, nope=128, rope=64, v=128, X=64,
                             shared=2, used=6, F=10944, Fe=1408, dense=1, ctx=163840),
    # a Qwen3.5 small model (~1.9B with this vocabulary): 24 layers, full attention every 4th
    # (8 gated q heads / 2 kv heads of 256, rope on 64 dims, sections 11/11/10), Gated DeltaNet
    # elsewhere (16 key heads and 16 value heads of 128, conv 4), FFN 6144. Assumed, not copied
    # from a released config.
    "qwen35-2b": dict(kind="qwen35", E=2048, L=24, H=8, Hkv=2, hd=256, rot=64, F=6144, d=128, n_k=16, n_v=16,
                      interval=4, sections=[11, 11, 10, 0], ctx=262144),
    # gpt-oss-20b (openai/gpt-oss-20b config.json): 24 layers, hidden 2880, 64 query heads of 64,
    # 8 KV heads, attention sinks and biases, a window of 128 on even layers, 32 experts of 2880
    # (4 used; router bias, softmax over the chosen) in MXFP4 as released, rope 150000 with YaRN
    # factor 32 over 4096, the o200k_harmony vocabulary (201,088 tokens). Matrices of 2880 columns
    # are not whole Q4_K blocks: Q8_0 (as the Q4_K mix's fallback).
    "gpt-oss-20b": dict(kind="gpt-oss", E=2880, L=24, H=64, Hkv=8, hd=64, F=2880, X=32, used=4, Fe=2880,
                        window=128, tied=False, ctx=131072, vocab="o200k-harmony", experts="MXFP4"),
    # the same with Q8_0 experts (a backend without MXFP4 kernels; ~20 GB)
    "gpt-oss-20b-q8_0": dict(kind="gpt-oss", E=2880, L=24, H=64, Hkv=8, hd=64, F=2880, X=32, used=4, Fe=2880,
                             window=128, tied=False, ctx=131072, vocab="o200k-harmony", experts="Q8_0"),
}

# the same models, tiny (every quantized row still a multiple of 256 where the full one is)
TINY = {
    "qwen3": dict(E=256, L=2, H=4, Hkv=2, hd=64, F=512),
    "qwen3moe": dict(E=256, L=2, H=4, Hkv=2, hd=64, F=512, X=4, used=2, Fe=256),
    "deepseek2": dict(E=256, L=2, H=4, R=256, nope=64, rope=32, v=64, X=4, shared=2, used=2, F=352, Fe=160,
                      dense=1),
    "qwen35": dict(E=256, L=4, H=2, Hkv=1, hd=64, rot=16, F=512, d=64, n_k=2, n_v=4, sections=[3, 3, 2, 0]),
    "gpt-oss": dict(E=256, L=2, H=4, Hkv=2, hd=64, F=256, X=4, used=2, Fe=256, window=16),
}


def config(name, tiny=False):
    cfg = dict(SHAPES[name])
    if tiny:
        cfg.update(TINY[cfg["kind"]])
        cfg["ctx"] = 4096
    return cfg


# ---------------------------------------------------------------------------------------
# the tensor plan: (name, numpy shape, format, std, f32 fill)
Q6_NAMES = ("attn_v.weight", "ffn_down.weight", "ffn_down_exps.weight", "ffn_down_shexp.weight", "output.weight")
F32_NAMES = ("ffn_gate_inp.weight", "ssm_conv1d.weight", "ssm_alpha.weight", "ssm_beta.weight")


def fmt_for(name, shape, tied, experts=None):
    if len(shape) == 1 or name.endswith(F32_NAMES) or name.endswith("ssm_a") or name.endswith(".bias"):
        return "F32"
    if experts and name.endswith("_exps.weight") and shape[-1] % BLOCK[experts][0] == 0:
        return experts  # the experts' own format (gpt-oss: MXFP4)
    want = "Q6_K" if name.endswith(Q6_NAMES) or (name == "token_embd.weight" and tied) else "Q4_K"
    cols = shape[-1]
    if cols % 256 == 0:
        return want
    return "Q8_0" if cols % 32 == 0 else "F32"


# tensors of F32 fills other than a matrix's: (fill, std or None for 1 / sqrt(fan-in))
FILLS = {"ssm_conv1d.weight": ("small", 0.5), "ssm_dt.bias": ("small", 0.5), "ssm_a": ("neg", None),
         "ssm_beta.weight": ("small", None), "ssm_alpha.weight": ("small", None)}


def tensor_plan(cfg, n_vocab):
    """[(name, shape, fmt, std, fill)]: the tensors of the architecture's plan (models/<kind>.py)
    for the model's metadata, in file order; fill is "norm" / "neg" / "small" for F32 tensors."""
    from .synthetic import plan_shapes

    E, tied = cfg["E"], cfg.get("tied", False)
    has = (() if tied else ("output.weight",)) + (("attn_q.bias", "attn_k.bias", "attn_v.bias")
                                                  if cfg["kind"] == "gpt-oss" else ())
    out = []
    for name, shape, _ in plan_shapes(cfg["kind"], metadata(cfg, n_vocab), n_vocab, has=has):
        rel = name.split(".", 2)[2] if name.startswith("blk.") else name
        fill, std = FILLS.get(rel, ("norm" if "norm" in rel else "mat", None))
        if rel == "token_embd.weight":
            std = 3.0 / math.sqrt(E) if tied else 1.0
        elif rel == "output.weight":
            std = 3.0 / math.sqrt(E)
        elif rel == "ffn_gate_inp.weight":
            std = 2.0 / math.sqrt(E)
        elif (rel.endswith(".bias") or rel == "attn_sinks.weight") and rel not in FILLS:
            fill, std = "small", 0.1 if rel.endswith(".bias") else 1.0
        out.append((name, shape, fmt_for(name, shape, tied, cfg.get("experts")),
                    float(1.0 / math.sqrt(shape[-1]) if std is None else std), fill))
    return out


def metadata(cfg, n_vocab):
    """{key suffix: value} under `{arch}.` (llama.cpp's keys)."""
    k = cfg["kind"]
    kv = {"context_length": cfg["ctx"], "block_count": cfg["L"], "embedding_length": cfg["E"],
          "feed_forward_length": cfg["F"], "attention.head_count": cfg["H"],
          "attention.layer_norm_rms_epsilon": 1e-6, "rope.freq_base": 1e6}
    if k in ("qwen3", "qwen3moe"):
        kv.update({"attention.head_count_kv": cfg["Hkv"], "attention.key_length": cfg["hd"],
                   "attention.value_length": cfg["hd"]})
        if k == "qwen3moe":
            kv.update({"expert_count": cfg["X"], "expert_used_count": cfg["used"],
                       "expert_feed_forward_length": cfg["Fe"]})
    elif k == "deepseek2":
        R, rope = cfg["R"], cfg["rope"]
        kv.update({"attention.head_count_kv": 1, "attention.key_length": R + rope, "attention.value_length": R,
                   "attention.key_length_mla": cfg["nope"] + rope, "attention.value_length_mla": cfg["v"],
                   "rope.dimension_count": rope, "rope.freq_base": 10000.0, "attention.q_lora_rank": 0,
                   "attention.kv_lora_rank": R, "leading_dense_block_count": cfg["dense"],
                   "expert_count": cfg["X"], "expert_used_count": cfg["used"], "expert_shared_count": cfg["shared"],
                   "expert_feed_forward_length": cfg["Fe"], "expert_weights_scale": 1.0,
                   "expert_weights_norm": False, "expert_gating_func": 1, "vocab_size": n_vocab,
                   "rope.scaling.type": "yarn", "rope.scaling.factor": 40.0,
                   "rope.scaling.yarn_log_multiplier": 0.0707, "rope.scaling.original_context_length": 4096})
    elif k == "gpt-oss":
        kv.update({"attention.head_count_kv": cfg["Hkv"], "attention.key_length": cfg["hd"],
                   "attention.value_length": cfg["hd"], "expert_count": cfg["X"], "expert_used_count": cfg["used"],
                   "expert_feed_forward_length": cfg["Fe"], "attention.sliding_window": cfg["window"],
                   "rope.freq_base": 150000.0, "rope.scaling.type": "yarn", "rope.scaling.factor": 32.0,
                   "rope.scaling.original_context_length": 4096, "attention.layer_norm_rms_epsilon": 1e-5})
    elif k == "qwen35":
        d, n_v = cfg["d"], cfg["n_v"]
        kv.update({"attention.head_count_kv": cfg["Hkv"], "attention.key_length": cfg["hd"],
                   "attention.value_length": cfg["hd"], "rope.dimension_count": cfg["rot"],
                   "rope.dimension_sections": list(cfg["sections"]), "ssm.conv_kernel": 4,
                   "ssm.inner_size": d * n_v, "ssm.state_size": d, "ssm.time_step_rank": n_v,
                   "ssm.group_count": cfg["n_k"], "full_attention_interval": cfg["interval"]})
    return kv


def n_params(plan):
    return sum(int(np.prod(s)) for _, s, _, _, _ in plan)


# ---------------------------------------------------------------------------------------
class Pools:
    """One pool of POOL_BLOCKS random blocks per (format, std), doubled so that any run of up
    to POOL_BLOCKS blocks from any offset is one contiguous slice."""

    def __init__(self, seed, blocks=POOL_BLOCKS):
        self.rng = np.random.default_rng(seed)
        self.blocks = blocks
        self.pools = {}

    def get(self, fmt, std):
        key = (fmt, round(std, 9))
        if key not in self.pools:
            blk, bsize = BLOCK[fmt]
            one = random_blocks(self.rng, fmt, 1, self.blocks * blk, std).reshape(-1)
            self.pools[key] = memoryview(np.concatenate([one, one]).tobytes())
        return self.pools[key]

    def slices(self, fmt, std, nblocks, offset, at):
        """[(file offset, memoryview)]: nblocks blocks of the pool from block `offset` on,
        cycling, to be written from file offset `at`."""
        pool = self.get(fmt, std)
        bsize = BLOCK[fmt][1]
        pos = offset % self.blocks
        out = []
        while nblocks:
            n = min(nblocks, self.blocks)
            out.append((at, pool[pos * bsize:(pos + n) * bsize]))
            at += n * bsize
            nblocks -= n
            pos = (pos + n) % self.blocks
        return out


def _pwrite_all(fd, data, at):
    mv = memoryview(data)
    while mv:
        k = os.pwrite(fd, mv, at)
        mv, at = mv[k:], at + k


def f32_data(rng, shape, std, fill):
    n = int(np.prod(shape))
    if fill == "norm":
        a = 1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)
    elif fill == "neg":
        a = -np.exp(0.5 * rng.standard_normal(n, dtype=np.float32))
    else:
        a = std * rng.standard_normal(n, dtype=np.float32)
    return a.astype(np.float32).reshape(shape)


def nbytes(shape, fmt):
    n = int(np.prod(shape))
    if fmt == "F32":
        return 4 * n
    blk, bsize = BLOCK[fmt]
    return n // blk * bsize


_ARRAYS = {}


def _pack_array(val):
    """A GGUF array value's bytes (after its value type): numpy for numbers, one join for
    strings (the writer's per-item packing takes seconds on a 151,936-token vocabulary)."""
    import struct

    from gguf import GGUFValueType as VT

    sub = val.sub_type
    head = struct.pack("<IQ", int(sub), len(val.value))
    if sub == VT.STRING:
        enc = [s.encode("utf-8") if isinstance(s, str) else bytes(s) for s in val.value]
        lens = np.array([len(e) for e in enc], dtype="<u8")
        return head + b"".join(l + e for l, e in zip(map(bytes, lens.reshape(-1, 1).view(np.uint8)), enc))
    dt = {VT.INT32: "<i4", VT.FLOAT32: "<f4", VT.UINT32: "<u4", VT.UINT8: "u1", VT.INT8: "i1"}.get(sub)
    if dt is None:
        return None
    return head + np.asarray(val.value, dtype=dt).tobytes()


def write_kv_fast(w):
    """GGUFWriter.write_kv_data_to_file with the long arrays packed at once (cached per
    object: the same vocabulary for every model of a process)."""
    from gguf import GGUFValueType as VT
    from gguf.gguf_writer import WriterState

    out = bytearray()
    for key, val in w.kv_data[0].items():
        out += w._pack_val(key, VT.STRING, add_vtype=False)
        if val.type == VT.ARRAY and len(val.value) > 64:
            ck = (key, id(val.value), len(val.value))
            if ck not in _ARRAYS:
                _ARRAYS[ck] = (val.value, _pack_array(val))  # the value kept: its id stays unique
            packed = _ARRAYS[ck][1]
            if packed is not None:
                out += w._pack("I", VT.ARRAY) + packed
                continue
        out += w._pack_val(val.value, val.type, add_vtype=True, sub_type=val.sub_type)
    w.fout[0].write(out)
    w.flush()
    w.state = WriterState.KV_DATA


_VOCABS = {}


def write_model(name, out, tiny=False, vocab=None, seed=0, threads=None):
    """Write model `name` to `out`; returns {name, path, bytes, params, seconds, GB_per_s}.
    vocab: a GGUF or dump_vocab npz (default: the shape's own, else Qwen2's)."""
    import gguf
    from gguf import GGMLQuantizationType as T
    from gguf import GGUFValueType as VT

    from .synthetic import vocab_path

    t0 = time.perf_counter()
    cfg = config(name, tiny)
    if vocab is None:
        vocab = vocab_path(cfg["vocab"]) if cfg.get("vocab") else QWEN2_VOCAB
    arch = cfg["kind"]
    w = gguf.GGUFWriter(str(out), arch)
    w.add_name(f"{name}{'-tiny' if tiny else ''}-shaped-random-q4_k")
    if vocab not in _VOCABS:
        _VOCABS[vocab] = load_vocab(vocab)
    n_vocab = write_tokenizer(w, _VOCABS[vocab], {"tokenizer.ggml.add_bos_token": (False, VT.BOOL)})
    for k, v in metadata(cfg, n_vocab).items():
        add_kv(w, f"{arch}.{k}", v)
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q4_K_M))
    plan = tensor_plan(cfg, n_vocab)
    for tname, shape, fmt, _, _ in plan:
        nb = nbytes(shape, fmt)
        if fmt == "F32":
            w.add_tensor_info(tname, list(shape), np.dtype(np.float32), nb)
        else:
            blk, bsize = BLOCK[fmt]
            w.add_tensor_info(tname, [*shape[:-1], shape[-1] // blk * bsize], np.dtype(np.uint8), nb,
                              raw_dtype=T[fmt])
    w.write_header_to_file()
    write_kv_fast(w)
    w.write_ti_data_to_file()
    fout = w.fout[0]
    align = w.data_alignment
    fout.flush()
    data_start = fout.tell() + (-fout.tell() % align)
    rng = np.random.default_rng(seed)
    pools = Pools(seed + 1)
    # every tensor at its aligned offset (as the tensor infos say), written by `threads` writers
    # with pwrite: the copy into the page cache is the cost, and it runs in parallel
    chunks, off = [], data_start
    for i, (tname, shape, fmt, std, fill) in enumerate(plan):
        nb = nbytes(shape, fmt)
        if fmt == "F32":
            chunks.append((off, f32_data(rng, shape, std, fill).tobytes()))
        else:
            chunks += pools.slices(fmt, std, nb // BLOCK[fmt][1], offset=i * 7919, at=off)
        off += nb + (-nb % align)
    fd = fout.fileno()
    os.ftruncate(fd, off)
    with cf.ThreadPoolExecutor(max_workers=threads or min(8, os.cpu_count() or 1)) as ex:
        list(ex.map(lambda c: _pwrite_all(fd, c[1], c[0]), chunks))
    w.close()
    size = os.path.getsize(out)
    dt = time.perf_counter() - t0
    return {"model": name, "tiny": tiny, "path": str(out), "bytes": size, "params": n_params(plan),
            "seconds": round(dt, 3), "GB_per_s": round(size / dt / 1e9, 3)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", choices=sorted(SHAPES))
    ap.add_argument("out", nargs="?")
    ap.add_argument("--tiny", action="store_true", help="tiny dimensions, same layout (tests)")
    ap.add_argument("--vocab", default=None, help="GGUF or dump_vocab npz (default: the model's own, else Qwen2's)")
    ap.add_argument("--list", action="store_true", help="the models, their parameters and file sizes")
    a = ap.parse_args(argv)
    if a.list or not a.model:
        for name in SHAPES:
            plan = tensor_plan(config(name), 151936)
            print(f"{name:18} {n_params(plan) / 1e9:6.2f} B params  "
                  f"{sum(nbytes(s, f) for _, s, f, _, _ in plan) / 1e9:6.2f} GB")
        return 0
    if not a.out:
        ap.error("OUT.gguf is needed")
    import json

    print(json.dumps(write_model(a.model, a.out, tiny=a.tiny, vocab=a.vocab)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
