"""The synthetic-GGUF writer: every random-weight GGUF the tests, the fixture scripts and
the GPU harnesses use, written with the `gguf` package (never on the package's load path).

One writer, `write_gguf`, writes a file of any architecture from the architecture's own
declaration (models/<arch>.py: KEYS, dims, plan; models/plan.py): the metadata keys given,
then every tensor of the plan for the dims those keys give, in plan order, drawn by an init
function. It has no per-architecture code. The recipes are what they draw:

- `example_gguf`: the architectures' EXAMPLES (models/<arch>.py; `examples()` lists them):
  tiny files of every architecture with SmolLM2's tokenizer, F32 or quantized where rows fit
  (with an F32 twin), drawn by `Init` (one seeded generator; a tensor's std from its name).
  tests/arch runs them all against llama.cpp on every backend; gpu-check on CUDA.
- `parity_model`: tiny models of real architectures for the llama.cpp parity goldens
  (tests/data/synthetic-*.gguf, committed; tests/arch/test_goldens.py). A mix of weight
  formats per layer (Q8_0, Q4_0, Q4_K, F16; norms and biases F32) and a REAL vocabulary
  copied from a GGUF: SmolLM2's gpt2 BPE vocabulary for llama/qwen2/qwen3, llama.cpp's
  ggml-vocab-llama-spm.gguf's SentencePiece one for gemma3.
- `mixed_model`: small models whose matrices cycle through every block format (Q8_0,
  Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, F16, BF16, F32), so that one model exercises
  every matmul kernel (scripts/gpu/gpu_check_models.py); `tokenizer_only` copies just a
  tokenizer.
- `qwen3_shaped`: a Qwen3-0.6B-shaped model (Q8_0 or a Q4_K_M-like mix) for GPU timing,
  generated in parallel in seconds (its tensor list: `qwen3_tensor_plan`, from the plan);
  its vocabulary is Qwen2's, from a GGUF or from the compact npz that `dump_vocab` writes
  (scripts/fixtures/data/qwen2-vocab.npz). testing/shaped.py writes larger ones the same way.
- `tiny_gguf`: float-weight models of the llama family for the model and engine tests
  (tests/arch/test_reference.py, tests/test_engine.py ...), returning the float64 weights
  for the references of reflex_ipc.testing.references.
- `tensors_gguf`: just the given raw tensors (the op checks' hand-made weight blocks).

Every recipe is deterministic (fixed seeds): its output is byte-for-byte reproducible.
Weight scales keep activations sane: logits with a real spread, neither ~0 nor inf.

    python3 scripts/fixtures/make_gguf.py {parity,mixed,tokenizer-only,qwen3-shaped,example,dump-vocab} ...
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
BLOCK = {"Q8_0": (32, 34), "Q4_0": (32, 18), "Q4_K": (256, 144), "Q6_K": (256, 210), "MXFP4": (32, 17)}


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
    elif tname == "MXFP4":
        # an E8M0 exponent e then 16 bytes of 32 E2M1 nibbles, value kvalues[q] * 2^(e - 128)
        # (ggml's), kvalues {0, 1, 2, 3, 4, 6, 8, 12} with signs: uniform nibbles have std ~5.85
        e = np.rint(128 + np.log2(std * jitter / 5.85)).clip(1, 254)
        raw[:, 0] = e.astype(np.uint8)
    else:
        raise ValueError(f"no random blocks for {tname}")
    return raw.reshape(rows, -1)


# the block formats gguf-py cannot quantize (the IQ ones) take random well-formed blocks: any
# bytes are a valid block (grid indices, sign bits, sub-block scales), then the block's scale is
# set so that its values have the wanted standard deviation. Where the float16 d of each lives
# (IQ1_M spreads it over the top nibbles of its scale words; MXFP4's is a power of two).
IQ_SCALE_AT = {"IQ2_XXS": 0, "IQ2_XS": 0, "IQ2_S": 0, "IQ3_XXS": 0, "IQ3_S": 0, "IQ1_S": 0, "IQ4_NL": 0,
               "IQ4_XS": 0, "IQ1_M": None}


def _set_block_scale(tname, raw, d):
    """Write the per-block scales d (float64 [nb]) into the blocks raw [nb, bytes] of format tname."""
    if tname == "MXFP4":  # E8M0, taken at half by ggml: d = 2^(e - 128)
        raw[:, 0] = np.clip(np.round(np.log2(np.maximum(d, 1e-30))) + 128, 2, 254).astype(np.uint8)
    elif tname == "IQ1_M":
        h = np.asarray(d, np.float16).view(np.uint16)
        sc = np.ascontiguousarray(raw[:, 48:56]).view("<u2") & np.uint16(0x0FFF)
        for k in range(4):
            sc[:, k] |= ((h >> (4 * k)) & 0xF).astype(np.uint16) << 12
        raw[:, 48:56] = sc.view(np.uint8)
    else:
        at = IQ_SCALE_AT[tname]
        raw[:, at:at + 2] = _f16_bytes(d)


def random_iq_blocks(rng, tname, rows, cols, std):
    """uint8 [rows, row bytes]: random blocks of an IQ format (IQ_SCALE_AT) or MXFP4 whose values
    have standard deviation ~std (per-block scales log-normal, sigma 0.25, like random_blocks')."""
    from reflex_ipc.ggml_types import TYPES
    from reflex_ipc.quants import dequantize  # gguf-py's values (tests/test_quants.py), faster

    tid, blk, bsize = TYPES[tname]
    if cols % blk:
        raise ValueError(f"{tname} needs rows of a multiple of {blk} values, not {cols}")
    nb = rows * cols // blk
    raw = rng.integers(0, 256, size=(nb, bsize), dtype=np.uint8)
    _set_block_scale(tname, raw, np.ones(nb))
    unit = dequantize(raw.reshape(-1), tid, nb * blk).reshape(nb, blk).std(axis=1, dtype=np.float64)
    jitter = np.exp(0.25 * rng.standard_normal(nb))
    _set_block_scale(tname, raw, std / np.maximum(unit, 1e-3) * jitter)
    return raw.reshape(rows, -1)


def quantized(rng, a, tname):
    """The F32 matrix a [..., cols] in block format tname: gguf-py's quantization where it has
    one, else random blocks of a's standard deviation (random_iq_blocks; a's values are lost)."""
    from gguf import GGMLQuantizationType as T
    import gguf.quants as gq

    if tname in IQ_SCALE_AT:
        raw = random_iq_blocks(rng, tname, int(np.prod(a.shape[:-1])), a.shape[-1], float(a.std()))
        return raw.reshape(*a.shape[:-1], -1)
    return gq.quantize(np.ascontiguousarray(a, dtype=np.float32), T[tname])


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
# the one writer: any architecture from its declaration (models/<arch>.py: KEYS, dims, plan)
VOCAB = "<the tokenizer's vocabulary size>"  # a key value write_gguf replaces by that size


def model_class(arch):
    """The Model class of an architecture (its module is imported)."""
    from reflex_ipc.models import module

    return module(arch).Model


def _relative(name):
    """A tensor's name inside its layer ("blk.3.attn_q.weight" -> "attn_q.weight")."""
    return name.split(".", 2)[2] if name.startswith("blk.") else name


def write_gguf(path, arch, keys, init, *, tokenizer=(), tokenizer_overrides=None, tokenizer_at=0, name=None,
               has=(), lacks=(), override=None, extra=None, writer=None, layout=None):
    """Write a GGUF of architecture `arch` from its declaration and return {tensor name: (data,
    raw ggml type or None)} of what it wrote.

    Metadata: general.name (when given), then `keys` ({suffix: value}, typed by add_kv; VOCAB:
    the vocabulary's size) with the tokenizer entries (read_tokenizer's) written before
    keys[tokenizer_at:] (tokenizer_overrides: write_tokenizer's); `override` changes the metadata only (None removes a key), so that the
    tensors still follow `keys` (the bad-input files). Tensors: `extra` {name: shape} first, then
    every tensor of the architecture's plan (Model.plan(Model.dims(HParams of `keys`))) in plan
    order; an optional tensor, the first layout of an Alt and the tensors of an If are written
    when `has` names them (by full name, or by the name inside the layer for every layer) and
    `lacks` does not (full names). A tensor's values are init(name, shape, T) -> (data, raw type)
    or None (not written); a shape of None (a vocabulary dimension) is the vocabulary's size.
    writer: a GGUFWriter to use (default: a plain one for path). layout: the architecture whose
    plan to write (default `arch`; another for a file of an architecture reflex lacks)."""
    import gguf

    w = writer if writer is not None else gguf.GGUFWriter(str(path), arch)
    if name:
        w.add_name(name)
    meta = dict(keys)
    meta.update(override or {})
    items = list(meta.items())
    n_vocab = 0

    def put(kvs):
        for k, v in kvs:
            if v is not None:
                add_kv(w, f"{arch}.{k}", n_vocab if v is VOCAB else v)

    put(items[:tokenizer_at])
    if tokenizer:
        n_vocab = write_tokenizer(w, tokenizer, tokenizer_overrides)
    put(items[tokenizer_at:])
    n_vocab = n_vocab or int(keys.get("vocab_size") or 0)
    plan = [(n, tuple(shape), None) for n, shape in (extra or {}).items()]
    plan += plan_shapes(layout or arch, keys, n_vocab, has, lacks)
    written = {}
    for full, shape, t in plan:
        got = init(full, shape, t)
        if got is not None:
            w.add_tensor(full, got[0], raw_dtype=got[1])
            written[full] = got
    finish(w)
    return written


def plan_shapes(arch, keys, n_vocab=0, has=(), lacks=()):
    """[(name, numpy shape, plan.T)] of the tensors a file of `arch` with metadata `keys`
    ({suffix: value}) holds, in plan order: write_gguf's list (has, lacks: its), a vocabulary
    dimension n_vocab."""
    from reflex_ipc.models.plan import Meta, walk

    cls = model_class(arch)
    hp = cls.hparams(Meta(arch, {f"{arch}.{k}": (n_vocab if v is VOCAB else v) for k, v in keys.items()
                                 if v is not None}, n_vocab))
    has, lacks = set(has), set(lacks)

    def held(full):
        return full not in lacks and (full in has or _relative(full) in has)

    return [(full, tuple(n_vocab if s is None else s for s in t.shape), t)
            for _, full, t in walk(cls.plan(cls.dims(hp)), held) if not t.optional or held(full)]


class Init:
    """The random values of the tensors write_gguf writes, drawn in file order from one seeded
    generator: offset + std * N(0, 1) as float32, the (offset, std) chosen by the tensor's name
    inside its layer: `rules` {name: (offset, std)} first, then RULES; norms (any name with
    "norm") 1 +- 0.1; the projections back into the residual stream (OUT) `gain` / sqrt(fan-in);
    anything else 1 / sqrt(fan-in) (its last dimension); token_embd `embd_std`. ssm_a is
    -exp(0.5 N(0, 1)) (a negative decay). `shapes` {name: shape} changes a tensor's shape,
    `drop` leaves tensors out (after their draw), qtype (e.g. "Q8_0", or an IQ format: `quantized`)
    stores the tensors of two or more dimensions whose rows fit its blocks quantized (but DENSE
    ones); with `blocks`, those
    are random well-formed blocks of that std (random_blocks: fast, for large timing models)."""

    RULES = {"per_layer_token_embd.weight": (0.0, 0.3), "rope_freqs.weight": (1.5, 0.3),
             "rope_factors_long.weight": (2.0, 0.5), "rope_factors_short.weight": (1.1, 0.2),
             "layer_output_scale.weight": (0.8, 0.2), "ffn_gate_inp.weight": (0.0, 1.0),
             "ffn_gate_inp.scale": (1.0, 0.3), "ffn_down_exps.scale": (1.0, 0.3), "exp_probs_b.bias": (0.0, 0.3),
             "ssm_conv1d.weight": (0.0, 0.5), "ssm_conv1d.bias": (0.0, 0.1), "ssm_dt.bias": (0.0, 0.5),
             "ssm_d": (1.0, 0.5), "inp_gate.weight": (0.0, "0.2/fan")}
    OUT = ("attn_output.weight", "ffn_down.weight", "ffn_down_exps.weight", "ffn_down_shexp.weight", "ssm_out.weight")
    BIAS_STD = 0.5

    def __init__(self, seed=0, *, embd_std=1.0, gain=1.0, qtype=None, drop=(), shapes=None, rules=None,
                 blocks=False):
        self.rng = np.random.default_rng(seed)
        self.embd_std, self.gain, self.qtype, self.blocks = embd_std, gain, qtype, blocks
        self.drop, self.shapes, self.rules = set(drop), dict(shapes or {}), dict(rules or {})

    def params(self, name, shape):
        """(offset, std) of a tensor."""
        rel = _relative(name)
        rule = self.rules.get(rel, self.RULES.get(rel))
        if rule is not None:
            off, std = rule
            return off, 0.2 / math.sqrt(shape[-1]) if std == "0.2/fan" else std
        if rel == "token_embd.weight":
            return 0.0, self.embd_std
        if "norm" in rel:
            return 1.0, 0.1
        if rel.endswith(".bias"):
            return 0.0, self.BIAS_STD
        return 0.0, (self.gain if rel in self.OUT else 1.0) / math.sqrt(shape[-1])

    def __call__(self, name, shape, t):
        from reflex_ipc.models.plan import DENSE

        shape = tuple(self.shapes.get(name, shape))
        if self.blocks and self.qtype in BLOCK and len(shape) >= 2 and (t is None or t.kind != DENSE) and \
                shape[-1] % BLOCK[self.qtype][0] == 0 and name not in self.drop:
            from gguf import GGMLQuantizationType as T

            raw = random_blocks(self.rng, self.qtype, int(np.prod(shape[:-1])), shape[-1], self.params(name, shape)[1])
            return raw.reshape(*shape[:-1], -1), T[self.qtype]
        if _relative(name) == "ssm_a":
            a = -np.exp(0.5 * self.rng.standard_normal(shape)).astype(np.float32)
        else:
            off, std = self.params(name, shape)
            a = (off + std * self.rng.standard_normal(shape)).astype(np.float32)
        if name in self.drop:
            return None
        if self.qtype is not None and (t is None or t.kind != DENSE) and len(shape) >= 2:
            import gguf.quants
            from gguf import GGMLQuantizationType as T

            q = T[self.qtype]
            if shape[-1] % gguf.GGML_QUANT_SIZES[q][0] == 0:
                return quantized(self.rng, a, self.qtype), q  # the IQ formats: random blocks
        return a, None


def examples():
    """{name: (arch, spec)}: every architecture's EXAMPLES (models/<arch>.py, plan.example /
    plan.variant), a variant's spec resolved against the example it changes."""
    from reflex_ipc.models import ARCHITECTURES

    out = {}
    for arch in ARCHITECTURES:
        own = model_class(arch).__dict__.get("EXAMPLES", {})
        for name, spec in own.items():
            if "of" in spec:
                base = own[spec["of"]]
                spec = dict(base, **{k: v for k, v in spec.items() if k not in ("of", "keys")},
                            keys={**base["keys"], **spec["keys"]})
            out[name] = (arch, spec)
    return out


def example_gguf(name, path, *, tokenizer=None, keys=None, override=None, quantize=None, has=(), lacks=(),
                 drop=(), shapes=None, extra=None, seed=None, qtype=None, blocks=False):
    """Write the example `name` (examples()) to path with the tokenizer of the GGUF `tokenizer`
    (default SmolLM2; an example that names a `vocab`, VOCABS, has that one); returns path. keys: changed keys (the tensors follow them); override:
    metadata-only changes (None removes a key; the tensors do not follow: bad-input files);
    has / lacks: more optional tensors and layouts (write_gguf); drop, shapes, extra: tensors
    left out, reshaped or added (Init, write_gguf); quantize (default: the example's): matrices
    quantized where their rows fit (_quantized_writer: the F32 twin goes to `{path}.twin.gguf`);
    qtype: matrices stored in that format where rows fit (the GPU checks), as random blocks with
    `blocks` (Init: large timing models)."""
    arch, spec = examples()[name]
    if tokenizer is None and not spec.get("vocab"):
        from reflex_ipc.modelpath import resolve_model

        tokenizer = resolve_model("smollm2")
    seed = spec.get("seed", 0) if seed is None else seed
    quantize = spec.get("quantize", False) if quantize is None else quantize
    init = Init(seed, embd_std=spec.get("embd_std", 1.0), gain=spec.get("gain", 1.0), qtype=qtype, drop=drop,
                shapes=shapes, rules=spec.get("rules"), blocks=blocks)
    toks = _vocab_entries(spec["vocab"]) if spec.get("vocab") else _tiny_tokenizer(tokenizer)
    write_gguf(path, arch, {**spec["keys"], **(keys or {})}, init, tokenizer=toks,
               has=set(spec.get("has", ())) | set(has), lacks=set(spec.get("lacks", ())) | set(lacks),
               override=override, extra=extra, writer=_quantized_writer(path, arch, seed) if quantize else None)
    return str(path)


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
    from gguf import GGUFValueType as VT

    cfg = PARITY_MODELS[arch]
    vocab_paths = vocab_paths or default_vocab_paths()
    # a seed per architecture so each file's bytes depend only on its own configuration
    seed = sum(arch.encode()) * 1009 if seed is None else seed
    rng = np.random.default_rng(seed)
    E, hd = cfg["n_embd"], cfg["head_dim"]
    keys = {"block_count": cfg["n_layer"], "context_length": 4096, "embedding_length": E,
            "feed_forward_length": cfg["n_ff"], "attention.head_count": cfg["n_head"],
            "attention.head_count_kv": cfg["n_head_kv"], "attention.key_length": hd, "attention.value_length": hd,
            "rope.dimension_count": hd, "attention.layer_norm_rms_epsilon": cfg["eps"],
            "rope.freq_base": cfg["rope_base"]}
    if arch == "gemma3":
        keys.update({"attention.sliding_window": cfg["sliding_window"],
                     "attention.sliding_window_pattern": cfg["swa_pattern"], "rope.freq_base_swa": cfg["rope_base_swa"],
                     "final_logit_softcapping": cfg["final_softcap"]})
    keys["vocab_size"] = VOCAB
    overrides = {}
    if cfg["add_bos"] is not None:
        overrides["tokenizer.ggml.add_bos_token"] = (cfg["add_bos"], VT.BOOL)

    # Scales: projections into a layer get std 1/sqrt(fan_in), so normed inputs give O(1)
    # values; the projections back into the residual stream get `gain` times that, so the
    # layers' contributions outweigh the input embedding (else a tied model's logits are
    # dominated by h . e_input and it repeats its last token). Gemma's embeddings are
    # scaled by sqrt(n_embd) and its layers' outputs pass through post-norms (centred on
    # `post`) instead. The logits (output_norm(h) . e_v) get a spread of a few units.
    gemma = arch == "gemma3"
    embd_std, gain, post, out_norm = (0.1, 1.0, 3.0, 3.0) if gemma else (0.5, 4.0, 1.0, 1.0)
    short = {"attn_q.weight": "q", "attn_k.weight": "k", "attn_v.weight": "v", "attn_output.weight": "o",
             "ffn_gate.weight": "gate", "ffn_up.weight": "up", "ffn_down.weight": "down"}

    def init(name, shape, t):
        rel = _relative(name)
        if rel == "token_embd.weight":
            return weight(rng, cfg["embd"], shape[0], E, embd_std)
        if rel == "output.weight":
            return weight(rng, cfg["output"], shape[0], E, 0.5)
        if "norm" in rel:
            center = out_norm if rel == "output_norm.weight" else post if rel.startswith("post_") else 1.0
            return (center + 0.1 * rng.standard_normal(shape[0], dtype=np.float32)).astype(np.float32), None
        if rel.endswith(".bias"):
            return (0.3 * rng.standard_normal(shape[0], dtype=np.float32)).astype(np.float32), None
        fmt = cfg["layers"][int(name.split(".")[1])][short[rel]]
        g = gain if rel in ("attn_output.weight", "ffn_down.weight") else 1.0
        return weight(rng, fmt, *shape, g / np.sqrt(shape[1]))

    has = (() if cfg["tied"] else ("output.weight",)) + \
        (("attn_q.bias", "attn_k.bias", "attn_v.bias") if arch == "qwen2" else ())
    write_gguf(out_path, arch, keys, init, tokenizer=read_tokenizer(vocab_paths[cfg["vocab"]]),
               tokenizer_overrides=overrides, tokenizer_at=len(keys) - 1, name=f"synthetic-{arch}", has=has)
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
    hp = MIXED_MODELS[arch]
    rng = np.random.default_rng(seed)
    entries = {e[0]: e for e in read_tokenizer(tok_path)}
    tokenizer = [entries[k] for k in TOKENIZER_KEYS if k in entries]
    E, hd = hp["n_embd"], hp["head_dim"]
    keys = {"block_count": hp["n_layer"], "context_length": 2048, "embedding_length": E,
            "feed_forward_length": hp["n_ff"], "attention.head_count": hp["n_head"],
            "attention.head_count_kv": hp["n_head_kv"], "attention.key_length": hd, "attention.value_length": hd,
            "attention.layer_norm_rms_epsilon": 1e-6, "rope.freq_base": 1e6 if arch != "llama" else 10000.0,
            "vocab_size": VOCAB}
    if arch == "gemma3":
        keys["attention.sliding_window"] = 8
    emb_type = {"llama": "Q8_0", "qwen2": "Q6_K", "qwen3": "Q8_0", "gemma3": "Q5_K"}[arch]
    tied = arch in ("qwen3", "gemma3")  # no output.weight: the LM head is the embedding
    k = 0

    def init(name, shape, t):
        nonlocal k
        rel = _relative(name)
        if rel == "token_embd.weight":
            # a tied embedding much larger than the layers' outputs would make every token predict itself
            return mixed_matrix(rng, shape[0], E, emb_type, 0.1 if tied else 1.0)
        if rel == "output.weight":
            return mixed_matrix(rng, shape[0], E, "Q4_K" if arch == "llama" else "Q8_0", 1 / np.sqrt(E) * 4)
        if t.kind != "mat":
            off, std = (1.0, 0.1) if "norm" in rel else (0.0, 0.5)
            return (off + std * rng.standard_normal(shape)).astype(np.float32), None
        k += 1
        return mixed_matrix(rng, *shape, MATRIX_TYPES[(k - 1) % len(MATRIX_TYPES)], 1 / np.sqrt(shape[1]))

    has = (() if tied else ("output.weight",)) + (("attn_q.bias", "attn_k.bias", "attn_v.bias") if arch == "qwen2" else ())
    write_gguf(out, arch, keys, init, tokenizer=tokenizer, has=has)
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
    """[(name, rows, cols, format, std)] in file order (the qwen3 plan's tensors)."""
    E, L, H, Hkv, hd, F, V = (QWEN3_SHAPE[k] for k in ("n_embd", "n_layer", "n_head", "n_head_kv", "head_dim",
                                                       "n_ff", "n_vocab"))
    q4 = kind == "q4k"
    mat = "Q4_K" if q4 else "Q8_0"
    big = "Q6_K" if q4 else "Q8_0"
    keys = {"block_count": L, "context_length": 4096, "embedding_length": E, "feed_forward_length": F,
            "attention.head_count": H,
            "attention.head_count_kv": Hkv, "attention.key_length": hd, "attention.value_length": hd,
            "attention.layer_norm_rms_epsilon": 1e-6}
    plan = []
    for name, shape, _ in plan_shapes("qwen3", keys, V):
        rel = _relative(name)
        if len(shape) == 1:
            plan.append((name, shape[0], None, "F32", 1.0))
        elif rel == "token_embd.weight":  # tied embedding: logits = output_norm(h) . e_v, std ~ sqrt(E) * std_e ~ 3
            plan.append((name, *shape, big, 3.0 / np.sqrt(E)))
        else:
            plan.append((name, *shape, big if rel in ("attn_v.weight", "ffn_down.weight") else mat, 1 / np.sqrt(shape[1])))
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

TINY_ARCHS = ("llama", "qwen2", "qwen3", "gemma3")  # tiny_gguf's (another name: llama's tensors)
_TINY_TOKENIZER = {}
# vocabularies an example may name (plan.example(..., vocab=)): dump_vocab npz files of real ones
VOCABS = {"o200k-harmony": "o200k-harmony-vocab.npz"}  # gpt-oss's (scripts/fixtures/make_o200k_vocab.py)


def vocab_path(name):
    """The npz of a VOCABS vocabulary (scripts/fixtures/data/)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.path.join(root, "scripts", "fixtures", "data", VOCABS[name])


def _vocab_entries(name):
    """The tokenizer entries (chat template included) of a VOCABS vocabulary, read once."""
    if name not in _TINY_TOKENIZER:
        _TINY_TOKENIZER[name] = load_vocab(vocab_path(name))
    return _TINY_TOKENIZER[name]

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


def _twin_writer(path, arch, twin):
    """A GGUFWriter for path that also writes `twin`: the same metadata (but general.*) and every
    tensor given to add_tensor as F32 (quantized ones dequantized by gguf-py): an f32_twin
    written at once, without reading the file back."""
    import gguf
    import gguf.quants as gq

    class Writer(gguf.GGUFWriter):
        def __init__(self):
            super().__init__(str(path), arch)
            self.twin = gguf.GGUFWriter(str(twin), arch)

        def add_key_value(self, key, val, vtype, **kw):
            super().add_key_value(key, val, vtype, **kw)
            if not key.startswith("general."):
                self.twin.add_key_value(key, val, vtype, **kw)

        def add_tensor(self, name, a, raw_shape=None, raw_dtype=None, tensor_endianess=None):
            super().add_tensor(name, a, raw_dtype=raw_dtype)
            f = a if raw_dtype is None else gq.dequantize(a, raw_dtype)
            self.twin.add_tensor(name, np.ascontiguousarray(f, dtype=np.float32))

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


def tiny_gguf(path, arch="llama", n_layer=2, n_embd=32, n_head=4, n_head_kv=2, head_dim=None,
              n_ff=64, rope_base=10000.0, eps=1e-5, untied=False, qkv_bias=False, qk_norm=False,
              rope_freqs=False, window=0, pattern=None, rope_base_swa=None, rope_factor=None,
              final_softcap=None, attn_softcap=None, qtype=None, seed=0, drop=(), tokenizer=None, twin=None,
              chat_template=None):
    """Write a random tiny model of the llama family (llama, qwen2, qwen3, gemma3: the options are
    reflex_ipc.testing.references' model configuration; qk_norm follows the architecture) with
    the tokenizer of the GGUF `tokenizer` (default: SmolLM2, whose vocabulary of TINY_N_VOCAB
    tokens the embedding assumes) and no chat template unless `chat_template` is given; returns
    {tensor name: float64 numpy array (numpy order)} as stored (quantized ones dequantized).
    qtype: the matrices' block format (any; the IQ ones as random blocks: `quantized`); twin:
    also write the F32 twin there (_twin_writer)."""
    import gguf.quants

    if tokenizer is None:
        from reflex_ipc.modelpath import resolve_model

        tokenizer = resolve_model("smollm2")
    keys = {"context_length": 128, "block_count": n_layer, "embedding_length": n_embd, "feed_forward_length": n_ff,
            "attention.head_count": n_head, "attention.head_count_kv": n_head_kv, "rope.freq_base": float(rope_base),
            "attention.layer_norm_rms_epsilon": float(eps)}
    if head_dim:
        keys["attention.key_length"] = keys["attention.value_length"] = head_dim
    if window:
        keys["attention.sliding_window"] = window
        keys["attention.sliding_window_pattern"] = pattern  # per-layer flags or a period
    if rope_base_swa is not None:
        keys["rope.freq_base_swa"] = float(rope_base_swa)
    if rope_factor:
        keys["rope.scaling.type"], keys["rope.scaling.factor"] = "linear", float(rope_factor)
    if final_softcap:
        keys["final_logit_softcapping"] = float(final_softcap)
    if attn_softcap:
        keys["attn_logit_softcapping"] = float(attn_softcap)
    has = {"output.weight"} if untied else set()
    has |= {"rope_freqs.weight"} if rope_freqs else set()
    has |= {"attn_q.bias", "attn_k.bias", "attn_v.bias"} if qkv_bias else set()
    init = Init(seed, qtype=qtype, drop=drop, rules={"rope_freqs.weight": (1.5, 0.5)})
    entries = _tiny_tokenizer(tokenizer)
    if chat_template is not None:
        from gguf import GGUFValueType

        entries = [*entries, ("tokenizer.chat_template", chat_template, GGUFValueType.STRING, None)]
    written = write_gguf(path, arch, keys, init, tokenizer=entries, has=has,
                         layout=arch if arch in TINY_ARCHS else "llama",
                         writer=None if twin is None else _twin_writer(path, arch, twin))
    return {name: (gguf.quants.dequantize(a, raw) if raw is not None else a).astype(np.float64)
            for name, (a, raw) in written.items()}


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
    p = sub.add_parser("example", help="an architecture's example (models/<arch>.py EXAMPLES)")
    p.add_argument("out")
    p.add_argument("--name", required=True, choices=sorted(examples()))
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
    elif a.cmd == "example":
        print(example_gguf(a.name, a.out, tokenizer=a.tokenizer))
    elif a.cmd == "qwen3-shaped":
        t0 = time.perf_counter()
        qwen3_shaped(a.out, a.type, a.vocab, a.seed)
        print(f"{a.out}: {os.path.getsize(a.out) / 1e6:.1f} MB in {time.perf_counter() - t0:.1f} s")
    else:
        print(dump_vocab(a.gguf, a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
