"""The fault and hostile-input suite of issue 12 (seeded generators, no network).

Phases, each counting what it did and every violation it saw:

  lines    request lines (valid, mistyped, out of range, broken JSON and UTF-8, deep
           nesting, CRLF, blank, over-long, huge single words, hostile model paths)
           through one long-lived `reflex stdio --device cpu`
  gguf     mutated GGUFs (well-formed files with wrong hyperparameters, tensor shapes
           and types, tokenizer metadata of the wrong type, removed keys and tensors,
           and byte-level damage: flips, truncation, huge lengths) loaded and used
           through the same kind of server (load, tokenize, generate, embed)
  signals  fresh servers sent SIGINT/SIGTERM/SIGHUP at random moments
  clients  `reflex uds` with clients that stall mid-line, never read, idle while
           others wait, or vanish mid-generation; a good client must always get served
  cache    the tokenizer disk cache corrupted at random between loads
  files    model files truncated, rewritten in place (same size and mtime too) or
           renamed over under a live server
  numpy    the request lines again, against the numpy backend alone (`--device numpy`)
  templates  `messages` rendered by hostile, mutated and composed chat templates (the
           request's and the GGUF's own): each ends in its kind within the template budgets;
           SIGINT and SIGTERM while a render would not end
  constraints  random, hostile and unsatisfiable json_schema / regex / grammar
  adapters `load` with LoRA adapters well-formed and broken (rank 0, NaN/inf/huge values,
           absurd alpha or scale, wrong shapes/architecture/type, damaged bytes)
  http     `reflex http` with streaming clients that never read; the next client is served

Violations: an `internal` result, a traceback on a server's stderr, a response that
does not match protocol/schema.json, a line answered twice, out of order or not at
all, a server that dies or hangs, wrong tokens (caches), an exit code or exit time
off the spec.

    python -m reflex_ipc.testing.fuzz [--mode short|long] [--seed N] [--out FILE.json]
        [--lines N] [--gguf N] [--signals N] [--clients N] [--cache N] [--files N] [--numpy N]
        [--templates N] [--constraints N] [--adapters N] [--http N]

tests/test_fuzz.py runs the short mode in the normal pytest run (REFLEX_FUZZ=long
there runs the long one); scripts/fuzz-long writes bench/results/fuzz-long-DATE.json.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import random
import resource
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

from reflex_ipc import settings

ROOT = pathlib.Path(__file__).resolve().parents[2]  # the checkout (schema, tests/data)
SCHEMA = json.loads((ROOT / "protocol" / "schema.json").read_text())

SHORT = dict(lines=3000, gguf=300, signals=6, clients=2, cache=40, files=8, numpy=600, templates=120,
             constraints=60, adapters=40, http=2)
LONG = dict(lines=100_000, gguf=10_000, signals=60, clients=20, cache=1000, files=100, numpy=10_000,
            templates=2000, constraints=800, adapters=600, http=20)
SERVER_AS_LIMIT = 3 << 30  # RLIMIT_AS of fuzzed servers: a runaway allocation is a MemoryError


# ---------------------------------------------------------------- a tiny GGUF writer

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
        BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}
GGML_F32, GGML_F16, GGML_Q8_0 = 0, 1, 8


def _val(vtype, v) -> bytes:
    if vtype == STR:
        b = v if isinstance(v, bytes) else str(v).encode("utf-8", "surrogatepass")
        return struct.pack("<Q", len(b)) + b
    if vtype == ARR:
        etype, items = v
        return struct.pack("<IQ", etype, len(items)) + b"".join(_val(etype, x) for x in items)
    return struct.pack(_FMT[vtype], v)


def write_gguf(path, kvs, tensors, version=3, align=32):
    """kvs: [(key, vtype, value)] (arrays: (elem_type, items)); tensors: [(name, dims in
    ggml order, ggml_type, raw bytes)]."""
    with open(path, "wb") as fh:
        fh.write(gguf_bytes(kvs, tensors, version, align))
    return path


def gguf_bytes(kvs, tensors, version=3, align=32) -> bytes:
    out = bytearray(b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs)))
    for k, t, v in kvs:
        out += _val(STR, k) + struct.pack("<I", t) + _val(t, v)
    off = 0
    offs = []
    for name, dims, gt, data in tensors:
        offs.append(off)
        out += _val(STR, name) + struct.pack("<I", len(dims))
        out += b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", gt, off)
        off += (len(data) + align - 1) // align * align
    out += bytes(-len(out) % align)
    for (_, _, _, data), o in zip(tensors, offs):
        out += data + bytes(-len(data) % align)
    return bytes(out)


def _gpt2_chars():
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def tiny_vocab(kind):
    """[(key, vtype, value)] of a small, well-formed vocabulary: 'gpt2' (byte-level BPE)
    or 'spm' (SentencePiece with byte fallback)."""
    if kind == "gpt2":
        enc = _gpt2_chars()
        toks = [enc[b] for b in range(256)]
        merges = []
        for a, b in [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("e", "r"),
                     ("o", "n"), ("Ġ", "w"), ("o", "r"), ("l", "l"), ("Ġw", "or"), ("l", "d"),
                     ("Ġwor", "ld"), ("H", "e"), ("He", "ll"), ("Hell", "o")]:
            merges.append(f"{a} {b}")
            toks.append(a + b)
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        types = [1] * len(toks) + [3] * len(specials)
        toks += specials
        return [("tokenizer.ggml.model", STR, "gpt2"), ("tokenizer.ggml.pre", STR, "smollm"),
                ("tokenizer.ggml.tokens", ARR, (STR, toks)),
                ("tokenizer.ggml.token_type", ARR, (I32, types)),
                ("tokenizer.ggml.merges", ARR, (STR, merges)),
                ("tokenizer.ggml.bos_token_id", U32, len(toks) - 2),
                ("tokenizer.ggml.eos_token_id", U32, len(toks) - 1),
                ("tokenizer.ggml.add_bos_token", BOOL, False)]
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0] * len(toks)
    words = ["\u2581", "\u2581t", "he", "\u2581the", "in", "\u2581a", "er", "on", "\u2581w",
             "or", "ll", "\u2581wor", "ld", "\u2581world", "He", "llo", "Hello", "\u2581Hello"]
    words += [chr(c) for c in range(ord("a"), ord("z") + 1)] + [chr(c) for c in range(65, 91)]
    for i, w in enumerate(words):
        toks.append(w)
        types.append(1)
        scores.append(-float(i))
    return [("tokenizer.ggml.model", STR, "llama"), ("tokenizer.ggml.tokens", ARR, (STR, toks)),
            ("tokenizer.ggml.scores", ARR, (F32, scores)),
            ("tokenizer.ggml.token_type", ARR, (I32, types)),
            ("tokenizer.ggml.bos_token_id", U32, 1), ("tokenizer.ggml.eos_token_id", U32, 2),
            ("tokenizer.ggml.unknown_token_id", U32, 0)]


ARCHS = ("llama", "qwen2", "qwen3", "gemma3")


def tiny_model(arch, rng=None, vocab=None):
    """(kvs, tensors) of a tiny random-weight model of `arch` (F32/F16/Q8_0 weights)."""
    import numpy as np

    rng = rng or np.random.default_rng(sum(arch.encode()))
    vocab = vocab or ("spm" if arch == "gemma3" else "gpt2")
    voc = tiny_vocab(vocab)
    n_vocab = len(next(v for k, t, v in voc if k == "tokenizer.ggml.tokens")[1])
    E, L, H, Hkv, hd, F = 32, 2, 4, 2, 8, 64
    if arch == "qwen2":
        H, Hkv, hd = 4, 2, 8  # n_head * head_dim == n_embd
    a = arch
    kvs = [("general.architecture", STR, arch), ("general.name", STR, f"fuzz-{arch}"),
           (f"{a}.block_count", U32, L), (f"{a}.context_length", U32, 512),
           (f"{a}.embedding_length", U32, E), (f"{a}.feed_forward_length", U32, F),
           (f"{a}.attention.head_count", U32, H), (f"{a}.attention.head_count_kv", U32, Hkv),
           (f"{a}.attention.key_length", U32, hd), (f"{a}.attention.value_length", U32, hd),
           (f"{a}.rope.dimension_count", U32, hd),
           (f"{a}.attention.layer_norm_rms_epsilon", F32, 1e-5),
           (f"{a}.rope.freq_base", F32, 10000.0), (f"{a}.vocab_size", U32, n_vocab)]
    if arch == "gemma3":
        kvs += [(f"{a}.attention.sliding_window", U32, 4),
                (f"{a}.attention.sliding_window_pattern", U32, 2),
                (f"{a}.rope.freq_base_swa", F32, 10000.0),
                (f"{a}.final_logit_softcapping", F32, 15.0)]
    kvs += voc
    tensors = []

    def add(name, rows, cols=None, gt=GGML_F32, std=0.3, center=0.0):
        shape = (rows,) if cols is None else (rows, cols)
        x = (center + std * rng.standard_normal(shape)).astype(np.float32)
        if gt == GGML_F16 and cols is not None:
            data = x.astype(np.float16).tobytes()
        elif gt == GGML_Q8_0 and cols is not None and cols % 32 == 0:
            blocks = x.reshape(-1, 32)
            d = np.abs(blocks).max(axis=1) / 127 + 1e-8
            q = np.clip(np.round(blocks / d[:, None]), -127, 127).astype(np.int8)
            rec = np.zeros(len(blocks), dtype=[("d", "<f2"), ("q", "i1", 32)])
            rec["d"], rec["q"] = d, q
            data = rec.tobytes()
        else:
            gt = GGML_F32
            data = x.tobytes()
        dims = [shape[0]] if cols is None else [cols, rows]
        tensors.append((name, dims, gt, data))

    add("token_embd.weight", n_vocab, E, GGML_Q8_0)
    add("output_norm.weight", E, center=1.0, std=0.05)
    if arch == "qwen2":
        add("output.weight", n_vocab, E, GGML_F16)
    for i in range(L):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", E, center=1.0, std=0.05)
        add(p + "attn_q.weight", H * hd, E, GGML_Q8_0)
        add(p + "attn_k.weight", Hkv * hd, E, GGML_F16)
        add(p + "attn_v.weight", Hkv * hd, E)
        if arch == "qwen2":
            for n, r in (("q", H * hd), ("k", Hkv * hd), ("v", Hkv * hd)):
                add(p + f"attn_{n}.bias", r)
        if arch in ("qwen3", "gemma3"):
            add(p + "attn_q_norm.weight", hd, center=1.0, std=0.05)
            add(p + "attn_k_norm.weight", hd, center=1.0, std=0.05)
        add(p + "attn_output.weight", E, H * hd, GGML_Q8_0)
        if arch == "gemma3":
            add(p + "post_attention_norm.weight", E, center=1.0, std=0.05)
        add(p + "ffn_norm.weight", E, center=1.0, std=0.05)
        add(p + "ffn_gate.weight", F, E, GGML_Q8_0)
        add(p + "ffn_up.weight", F, E, GGML_F16)
        add(p + "ffn_down.weight", E, F)
        if arch == "gemma3":
            add(p + "post_ffw_norm.weight", E, center=1.0, std=0.05)
    return kvs, tensors


# ---------------------------------------------------------------- hostile chat templates

# (name, template source, the error kind it must give) -- issue 32 item 4 and 7: work and memory
# bombs end in `too_large` within chat.RENDER_SECONDS, templates that cannot compile or fail on
# their own terms in `invalid_request`; none may answer `internal`, hang or grow the server.
HOSTILE_TEMPLATES = [
    ("nested_range", "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                     "{% endfor %}", "too_large"),
    ("repeat", "{{ 'x' * 10**9 }}", "too_large"),
    ("format_width", "{{ '{:>1000000000}'.format('a') }}", "too_large"),
    ("format_nested_width", "{{ '{:>{w}}'.format('a', w=10**9) }}", "too_large"),
    ("macro_fanout", "{% macro f(n) %}{% if n > 0 %}{{ f(n-1) }}{{ f(n-1) }}{% endif %}{% endmacro %}"
                     "{{ f(40) }}", "too_large"),
    ("doubling", "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                 "{% endfor %}{{ ns.s|length }}", "too_large"),
    ("plus_doubling", "{% set ns = namespace(s='ab') %}{% for i in range(64) %}"
                      "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}", "too_large"),
    ("percent_width", "{{ '%0999999999d' % 1 }}", "too_large"),
    ("percent_star", "{{ '%*d' % (999999999, 1) }}", "too_large"),
    ("format_filter", "{{ '%0999999999d'|format(1) }}", "too_large"),
    ("center", "{{ 'x'|center(10**9) }}", "too_large"),
    ("ljust", "{{ 'x'.ljust(10**9) }}", "too_large"),
    ("tojson_shared", "{{ (['x' * 1000] * 100000)|tojson }}", "too_large"),
    ("join_shared", "{{ (['x' * 1000] * 10000)|join }}", "too_large"),
    ("output_shared", "{{ ['x' * 10000] * 100000 }}", "too_large"),
    ("pow", "{{ 2 ** (10**9) }}", "too_large"),
    ("int_square", "{% set ns = namespace(x=3) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}"
                   "{% endfor %}", "too_large"),
    ("to_bytes", "{{ (1).to_bytes(10**9, 'big') }}", "too_large"),
    ("replace", "{{ ('x' * 1000)|replace('x', 'y' * 100000) }}", "too_large"),
    ("str_replace", "{{ ('x' * 1000).replace('x', 'y' * 100000) }}", "too_large"),
    ("indent", "{{ ('\n' * 10000)|indent(100000) }}", "too_large"),
    ("expandtabs", "{{ ('\t' * 1000).expandtabs(1000000) }}", "too_large"),
    ("batch_fill", "{{ [1]|batch(10**9, 'x')|list }}", "too_large"),
    ("sum_lists", "{{ ([[1] * 1000] * 10000)|sum(start=[]) }}", "too_large"),
    ("wordwrap", "{{ ('x' * 100000)|wordwrap(1, true, 'y' * 1000) }}", "too_large"),
    ("strftime", "{{ strftime_now('%Y' * 100000) }}", "too_large"),
    ("translate", "{{ ('a' * 1000).translate({97: 'b' * 100000}) }}", "too_large"),
    ("list_repeat", "{{ ([1] * 1000000) * 1000 }}", "too_large"),
    ("endless_cycle", "{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}"
                      "{% endfor %}", "too_large"),
    ("too_big", "x" * ((128 << 10) + 1), "too_large"),
    ("recursion", "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "invalid_request"),
    ("nested_if", "{% if true %}" * 5000 + "x" + "{% endif %}" * 5000, "invalid_request"),
    ("nested_for", "{% for a in [1] %}" * 200 + "x" + "{% endfor %}" * 200, "invalid_request"),
    ("huge_int_literal", "{{ 10**5000 }}", "invalid_request"),
    ("range_cap", "{{ range(100001)|list|length }}", "invalid_request"),
    ("lone_surrogate", "{{ '\\ud800' }}", "invalid_request"),
    ("lipsum", "{{ lipsum(10**6) }}", "invalid_request"),
    ("syntax", "{% for %}", "invalid_request"),
    ("sandbox", "{{ messages.__class__.__mro__[1].__subclasses__() }}", "invalid_request"),
    ("raises", "{{ raise_exception('no') }}", "invalid_request"),
    ("divide", "{{ 1 / 0 }}", "invalid_request"),
]


def read_gguf(path):
    """(kvs, tensors) of a GGUF file as write_gguf takes them (keys with their value types,
    tensors' raw bytes): to rewrite a real model with a key dropped or a tensor changed."""
    import gguf

    r = gguf.GGUFReader(str(path))
    kvs = []
    for fld in r.fields.values():
        if fld.name.startswith("GGUF."):
            continue
        t = int(fld.types[0])
        if t == ARR:
            et = int(fld.types[1])
            items = [bytes(fld.parts[i]) if et == STR else fld.parts[i][0].item() for i in fld.data]
            kvs.append((fld.name, ARR, (et, items)))
        elif t == STR:
            kvs.append((fld.name, STR, bytes(fld.parts[fld.data[0]])))
        else:
            kvs.append((fld.name, t, fld.parts[fld.data[0]][0].item()))
    tensors = [(t.name, [int(x) for x in t.shape], int(t.tensor_type), t.data.tobytes()) for t in r.tensors]
    return kvs, tensors


# ---------------------------------------------------------------- GGUF mutations

_BAD_SCALARS = [(F32, math.nan), (F32, math.inf), (F32, -math.inf), (F64, math.nan),
                (I32, 0), (I32, -1), (I64, -(2**40)), (U32, 0), (U32, 2**31), (U64, 2**63),
                (U64, 2**64 - 1), (U32, 2**32 - 1), (F32, 0.0), (F32, -1.0), (F32, 1e30),
                (STR, "12"), (STR, ""), (BOOL, True), (ARR, (U32, [1, 2, 3])),
                (ARR, (STR, ["x"])), (ARR, (ARR, [(U32, [1])])), (ARR, (U32, [])),
                (U8, 255), (I8, -128), (F32, 1e-40), (U32, 3), (U32, 7), (U32, 1)]


def mutate_model(rng, kvs, tensors):
    """(kvs, tensors, description) after 1-3 structural mutations."""
    kvs = list(kvs)
    tensors = list(tensors)
    what = []
    for _ in range(rng.randint(1, 3)):
        op = rng.random()
        if op < 0.45 and kvs:  # a metadata value of another type or value
            i = rng.randrange(len(kvs))
            k = kvs[i][0]
            if rng.random() < 0.15:
                del kvs[i]
                what.append(f"drop {k}")
            else:
                t, v = rng.choice(_BAD_SCALARS)
                kvs[i] = (k, t, v)
                what.append(f"{k}={v!r}")
        elif op < 0.8 and tensors:  # a tensor's shape or type
            i = rng.randrange(len(tensors))
            name, dims, gt, data = tensors[i]
            m = rng.random()
            if m < 0.2:
                dims = [0] + list(dims[1:])
            elif m < 0.35:
                dims = []
            elif m < 0.5:
                dims = list(reversed(dims))
            elif m < 0.6:
                dims = list(dims) + [rng.choice([1, 2, 3])]
            elif m < 0.7:
                dims = [d * rng.choice([2, 3]) if j == rng.randrange(len(dims)) else d
                        for j, d in enumerate(dims)] if dims else [7]
                data = data + bytes(len(data) * 2)
            elif m < 0.8:
                gt = rng.choice([GGML_F32, GGML_F16, GGML_Q8_0, 2, 12, 14, 30, 39, 1000])
            elif m < 0.9:
                del tensors[i]
                what.append(f"drop {name}")
                continue
            else:
                dims = [d // 2 or 1 for d in dims]
                data = data[: len(data) // 2]
            tensors[i] = (name, dims, gt, data)
            what.append(f"{name} {dims} t{gt}")
        else:  # an extra key or a duplicated tensor name
            if rng.random() < 0.5 and tensors:
                t = rng.choice(tensors)
                tensors.append(t)
                what.append(f"dup {t[0]}")
            else:
                arch = next((v for k, t, v in kvs if k == "general.architecture"), "llama")
                key = rng.choice(["rope.scaling.type", "rope.scaling.factor", "attention.scale",
                                  "expert_count", "attention.sliding_window"])
                t, v = rng.choice(_BAD_SCALARS + [(STR, "yarn"), (STR, "none")])
                kvs.append((f"{arch}.{key}", t, v))
                what.append(f"+{arch}.{key}={v!r}")
    return kvs, tensors, "; ".join(what)


def mutate_bytes(rng, data: bytes):
    """Byte-level damage: flips, overwritten fields, truncation, huge lengths."""
    b = bytearray(data)
    m = rng.random()
    head = min(len(b), 4096 + rng.randrange(max(1, len(b) - 4096)))
    if m < 0.3:
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(head)
            b[i] ^= 1 << rng.randrange(8)
        return bytes(b), "bit flips"
    if m < 0.5:
        return bytes(b[:rng.randrange(len(b))]), "truncated"
    if m < 0.75:
        i = rng.randrange(max(1, head - 8))
        b[i:i + 8] = struct.pack("<Q", rng.choice([2**63, 2**64 - 1, 2**32, 2**31 - 1, 0, 1]))
        return bytes(b), f"u64 at {i}"
    i = rng.randrange(head)
    n = rng.randint(1, 64)
    b[i:i + n] = bytes(rng.randrange(256) for _ in range(n))
    return bytes(b), f"random bytes at {i}"


# ---------------------------------------------------------------- checking results


class Report:
    def __init__(self):
        self.counts = {}
        self.kinds = {}
        self.violations = []
        self.peak_rss_kib = {}
        self.after_load = {}  # gguf: "kind: message" of failures after a successful load
        self.rss_series = []  # lines: (lines done, server VmRSS KiB) every ~10k lines

    def add(self, what, n=1):
        self.counts[what] = self.counts.get(what, 0) + n

    def violation(self, phase, what, detail=""):
        self.add("violations")
        if len(self.violations) < 2000:
            self.violations.append({"phase": phase, "what": what, "detail": str(detail)[:600]})

    def rss(self, phase, kib):
        if kib:
            self.peak_rss_kib[phase] = max(self.peak_rss_kib.get(phase, 0), kib)


_validators = {}


def schema_ok(obj) -> str | None:
    """None, or why obj does not match the schema's response. The response's branch is
    picked first by event, ok and op (a oneOf over every kind of line costs ~4 ms a
    line); a line that fits no branch is checked against the whole `response`."""
    name = "response"
    if isinstance(obj, dict):
        ev, ok = obj.get("event"), obj.get("ok")
        if ev == "token":
            name = "token"
        elif ev == "result" and ok is False:
            name = "result_error"
        elif ev == "result" and ok is True and f"result_{obj.get('op')}" in SCHEMA["$defs"]:
            name = f"result_{obj.get('op')}"
    v = _validators.get(name)
    if v is None:
        import jsonschema

        v = _validators[name] = jsonschema.Draft202012Validator(
            {"$ref": f"#/$defs/{name}", "$defs": SCHEMA["$defs"]})
    err = next(iter(v.iter_errors(obj)), None)
    return None if err is None else f"{err.message} at {list(err.path)}"


def peak_rss_kib(pid, field="VmHWM") -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _limit_as():
    resource.setrlimit(resource.RLIMIT_AS, (SERVER_AS_LIMIT, SERVER_AS_LIMIT))


def server_env(cache_dir):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["REFLEX_CACHE"] = str(cache_dir)
    env["OPENBLAS_NUM_THREADS"] = "1"
    return env


class Server:
    """`reflex stdio` as a subprocess; request() -> (token events, result)."""

    def __init__(self, argv, env, report, phase):
        self.report, self.phase = report, phase
        self.err = tempfile.TemporaryFile()
        self.p = subprocess.Popen([sys.executable, "-m", "reflex_ipc", "stdio", *argv],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=self.err, env=env, cwd=str(ROOT),
                                  preexec_fn=_limit_as)
        self.buf = b""
        ready = self.read(120)
        if not ready or ready.get("event") != "ready":
            raise RuntimeError(f"no ready line: {ready!r} {self.stderr()[-2000:]}")
        self.err_seen = 0

    def read(self, timeout):
        fd = self.p.stdout.fileno()
        end = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = end - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError(f"no line in {timeout} s")
            data = os.read(fd, 1 << 20)
            if not data:
                return None
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def send_raw(self, data: bytes):
        try:
            self.p.stdin.write(data)
            self.p.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the server died: reading its answer says so (EOF)

    def send_async(self, data: bytes):
        """Write from a thread while the caller reads the answers: a batch bigger than the
        pipes would otherwise deadlock (and the server would rightly drop us after its
        --write-timeout)."""
        import threading

        def send():
            try:
                self.send_raw(data)
            except (BrokenPipeError, OSError):
                pass  # the server died: the reader sees EOF
        t = threading.Thread(target=send, daemon=True)
        t.start()
        return t

    def response(self, timeout=120):
        tokens = []
        while True:
            obj = self.read(timeout)
            if obj is None:
                raise EOFError("the server exited: " + self.stderr()[-2000:])
            if obj.get("event") == "token":
                tokens.append(obj)
                continue
            return tokens, obj

    def stderr(self) -> str:
        self.err.seek(0)
        return self.err.read().decode("utf-8", "replace")

    def check_stderr(self):
        text = self.stderr()
        new = text[self.err_seen:]
        self.err_seen = len(text)
        while "Traceback" in new:  # each one, by its last frame and message
            tb = new[new.index("Traceback"):]
            nxt = tb.find("Traceback", 10)
            one, new = (tb, "") if nxt < 0 else (tb[:nxt], tb[nxt:])
            frames = [ln.strip() for ln in one.splitlines() if ln.strip().startswith("File ")]
            last = frames[-1] if frames else ""
            msg = one.strip().splitlines()[-1] if one.strip() else ""
            self.report.violation(self.phase, "traceback on stderr", f"{last} | {msg}")

    def close(self):
        self.report.rss(self.phase, peak_rss_kib(self.p.pid))
        if self.p.poll() is None:
            try:
                self.p.stdin.close()
            except OSError:
                pass
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.report.violation(self.phase, "no exit 30 s after EOF")
                self.p.kill()
                self.p.wait()
        self.check_stderr()
        self.p.stdout.close()
        self.err.close()


def check_result(report, phase, obj, want_id, line_desc, tokens=()):
    report.add("responses")
    why = schema_ok(obj)
    if why:
        report.violation(phase, "response does not match the schema", f"{why}: {obj!r:.300} "
                         f"<- {line_desc}")
    for t in tokens:
        why = schema_ok(t)
        if why:
            report.violation(phase, "token event does not match the schema", why)
    if obj.get("event") != "result":
        report.violation(phase, "not a result", obj)
        return
    if obj.get("id") != want_id:
        report.violation(phase, "wrong id", f"got {obj.get('id')!r}, want {want_id!r}: {line_desc}")
    if not obj.get("ok"):
        kind = obj.get("error", {}).get("kind")
        report.kinds[kind] = report.kinds.get(kind, 0) + 1
        if kind == "internal":
            report.violation(phase, "internal", f"{obj['error'].get('message')} <- {line_desc}")
    else:
        report.kinds["ok"] = report.kinds.get("ok", 0) + 1


# ---------------------------------------------------------------- request lines

_TEXTS = ["", "Hello world", "the world", " ", "\n\n", "caf\u00e9 \u4f60\u597d \U0001f600",
          "<|im_start|>user<|im_end|>", "<s></s><unk>", "\u0000\u0001\u001f", "\ud7ff\ue000",
          "Hello" * 50, "a b c " * 40, "\u2581\u2581x", "<0x41>", "'s 're 've 123456789"]


def _num(rng):
    return rng.choice([0, 1, -1, 2, 64, 2**31, 2**53 + 1, 2**63 - 1, -(2**63), 2**64, 0.5,
                       1e308, -0.0, 1e-320, 3.7, 100.0, 100.0001, "1", None, True, [], {}])


def _text(rng, huge):
    r = rng.random()
    if huge and r < 0.5:
        n = rng.choice([1 << 16, 1 << 18, (1 << 18) + 1, 1 << 19, 1 << 20, (1 << 20) + 1])
        return rng.choice("aZ\u00e9\u4f60x") * n
    if r < 0.6:
        return rng.choice(_TEXTS)
    n = rng.randint(0, 60)
    return "".join(chr(rng.choice([rng.randint(32, 126), rng.randint(0, 0x2FF),
                                   rng.randint(0x4E00, 0x4EFF), rng.randint(0x1F600, 0x1F64F),
                                   10, 13, 9]))
                   for _ in range(n))


def gen_request(rng, models, huge=False):
    """(line bytes, expected id or None, description)."""
    rid = rng.choice([rng.randint(-(2**63), 2**63 - 1), f"r{rng.randint(0, 10**6)}",
                      rng.randint(0, 10**6)])
    op = rng.choice(["generate", "generate", "tokenize", "tokenize", "detokenize", "embed",
                     "system1", "load", "hello", "ping", "bogus", None])
    req = {"id": rid, "op": op}
    model = rng.choice(models) if rng.random() < 0.3 else None
    if model is not None:
        req["model"] = model
    if rng.random() < 0.05:
        req["device"] = rng.choice(["cpu", "cuda", "gpu", "", 3])
    if op == "generate":
        req["prompt"] = _text(rng, huge)
        req["max_tokens"] = rng.choice([1, 2, 4, 8, 0, -1, 131073, "8"])
        for k in ("temperature", "top_k", "top_p", "min_p", "seed", "repeat_penalty",
                  "repeat_last_n"):
            if rng.random() < 0.3:
                req[k] = _num(rng) if rng.random() < 0.5 else rng.choice([0.0, 0.5, 1.0, 1e-30])
        if rng.random() < 0.2:
            req["stop"] = rng.choice(["\n", ["a", "b"], [], [""], ["x"] * 17, 5])
        if rng.random() < 0.3:
            req["stream"] = rng.choice([True, False, 1])
    elif op == "tokenize":
        req["text"] = _text(rng, huge)
        if rng.random() < 0.3:
            req["add_bos"] = rng.choice([True, False, None, 1])
        if rng.random() < 0.3:
            req["parse_special"] = rng.choice([True, False, "no"])
    elif op == "detokenize":
        n = rng.choice([0, 1, 5, 50, 2000])
        req["ids"] = [rng.choice([rng.randint(0, 350), rng.randint(0, 400), -1, 2**63, 1.5])
                      if rng.random() < 0.1 else rng.randint(0, 300) for _ in range(n)]
    elif op == "embed":
        req["input"] = rng.choice([_text(rng, False) or "x", ["a", "b"], [], [""], "", 5])
        if rng.random() < 0.3:
            req["pooling"] = rng.choice(["mean", "last", "cls", "max"])
        if rng.random() < 0.3:
            req["normalize"] = rng.choice([True, False])
    elif op == "system1":
        req["prompt"] = _text(rng, False)
        req["candidates"] = rng.choice([["yes", "no"], ["a"], [], [""], ["x"] * 3,
                                        [" Hello", " world", "!"]])
        if rng.random() < 0.5:
            req["temperature"] = rng.choice([1.0, 1e-30, 1e-300, 5e-324, 0.0, 100.0, 0.01, 1e-8])
    elif op == "hello" and rng.random() < 0.3:
        req["protocol"] = rng.choice([1, 2, "1", None])
    if rng.random() < 0.05:
        req["unexpected"] = 1
    if op is None:
        del req["op"]
    line = json.dumps(req, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")
    want = rid
    r = rng.random()
    if r < 0.03:  # broken JSON
        line = line[:rng.randrange(1, len(line))]
        want = None
    elif r < 0.05:  # broken UTF-8
        line = line[:-1] + b"\xff\xfe}"
        want = None
    elif r < 0.06:  # not an object / deep nesting / huge numbers
        line = rng.choice([b"[1,2,3]", b"42", b"null", b'"x"', b"[" * 100000 + b"]" * 100000,
                           b'{"id": 1e999, "op": "ping"}', b'{"op": "ping", "id": ' +
                           b"9" * 5000 + b"}"])
        want = None
    elif r < 0.07:
        line = b"{" + b'"a":' * 3 + b"}"
        want = None
    return line, want, (op or "-") + (" " + str(model) if model else "")


def phase_lines(report, n, seed, work, model_path, extra_models, long_mode, device="cpu", phase="lines"):
    """device "numpy": the same lines against the numpy backend alone (the `numpy` phase)."""
    rng = random.Random(seed)
    env = server_env(work / "cache")
    limit = 1 << 21  # a smaller --max-line-bytes keeps the over-long lines cheap
    srv = Server(["--device", device, "--model", str(model_path), "--max-line-bytes", str(limit)],
                 env, report, phase)
    models = [str(model_path), "smollm2-nope", "/dev/zero", "/", "/proc/self/status",
              "/sys/kernel/mm/transparent_hugepage/enabled", str(work), "../../etc/passwd",
              "x" * 5000, "\u00e9", *extra_models]
    fifo = work / "fifo.gguf"
    if not fifo.exists():
        os.mkfifo(fifo)
    models.append(str(fifo))
    junk = work / "junk.gguf"
    junk.write_bytes(b"GGUF" + bytes(range(256)) * 4)
    models.append(str(junk))
    done = 0
    try:
        while done < n:
            batch = []
            for _ in range(min(32, n - done)):
                r = rng.random()
                if r < 0.005:
                    line, want, desc = b"x" * (limit + rng.choice([1, 100, 70000])), None, "long"
                    kind_want = "line_too_long"
                elif r < 0.01:
                    line, want, desc = b"", "blank", "blank"
                    kind_want = None
                elif r < 0.012:  # one unbroken word just over the BPE cap
                    n_ = (1 << 18) + rng.choice([1, 1000])
                    line = json.dumps({"id": 8, "op": "tokenize", "model": str(model_path),
                                       "text": "a" * n_}).encode()  # a BPE model
                    want, desc, kind_want = 8, "huge single word", "too_large"
                elif r < 0.015:
                    head = b'{"id": 7, "op": "ping"'
                    line = head + b" " * (limit - len(head) - 1) + b"}"
                    want, desc, kind_want = 7, "ping at the limit", None
                else:
                    huge = rng.random() < 0.003
                    line, want, desc = gen_request(rng, models, huge=huge)
                    kind_want = None
                    if len(line) > limit:  # a huge text made the line too long
                        want, kind_want = None, "line_too_long"
                eol = b"\r\n" if rng.random() < 0.2 else b"\n"
                batch.append((line + eol, want, desc, kind_want))
            # a few at once, then read their answers (the pipe holds them)
            sender = srv.send_async(b"".join(x[0] for x in batch))
            for line, want, desc, kind_want in batch:
                done += 1
                report.add("lines")
                if want == "blank":
                    continue
                try:
                    tokens, obj = srv.response(timeout=300)
                except (TimeoutError, EOFError) as e:
                    report.violation(phase, "no answer", f"{e} <- {desc}")
                    srv.p.kill()
                    srv.close()
                    srv = Server(["--device", device, "--model", str(model_path),
                                  "--max-line-bytes", str(limit)], env, report, phase)
                    break
                check_result(report, phase, obj, want, desc, tokens)
                if kind_want and obj.get("error", {}).get("kind") != kind_want:
                    report.violation(phase, f"expected {kind_want}", obj)
            sender.join(60)
            srv.check_stderr()
            if done % 10000 < 32 and phase == "lines":
                report.rss_series.append((done, peak_rss_kib(srv.p.pid, "VmRSS")))
    finally:
        srv.close()


# ---------------------------------------------------------------- GGUF mutations


def phase_gguf(report, n, seed, work):
    import numpy as np

    rng = random.Random(seed)
    phase = "gguf"
    env = server_env(work / "cache")
    seeds, raw = {}, {}
    for arch in ARCHS:
        seeds[arch] = tiny_model(arch, np.random.default_rng(seed + len(arch)))
        raw[arch] = gguf_bytes(*seeds[arch])
    d = work / "gguf"
    d.mkdir(exist_ok=True)
    srv = Server(["--device", "cpu"], env, report, phase)
    try:
        for i in range(n):
            arch = rng.choice(ARCHS)
            kvs, tensors = seeds[arch]
            path = d / f"m{i}.gguf"
            r = rng.random()
            if r < 0.6:
                kvs2, tensors2, desc = mutate_model(rng, kvs, tensors)
                write_gguf(path, kvs2, tensors2)
            else:
                data, desc = mutate_bytes(rng, raw[arch])
                path.write_bytes(data)
            report.add("gguf_files")
            desc = f"{arch}: {desc}"
            m = str(path)
            reqs = [{"id": 1, "op": "load", "model": m},
                    {"id": 2, "op": "tokenize", "model": m,
                     "text": "Hello world <|im_end|> caf\u00e9"},
                    {"id": 3, "op": "generate", "model": m, "prompt": "Hello the world",
                     "max_tokens": 3},
                    {"id": 4, "op": "system1", "model": m, "prompt": "Hi",
                     "candidates": ["a", " world"], "temperature": rng.choice([1.0, 1e-30])},
                    {"id": 5, "op": "embed", "model": m, "input": "Hello"},
                    {"id": 6, "op": "detokenize", "model": m, "ids": [1, 2, 3, 200]}]
            sender = srv.send_async(b"".join(json.dumps(r).encode() + b"\n" for r in reqs))
            loaded = True
            for k, r in enumerate(reqs):
                report.add("lines")
                try:
                    tokens, obj = srv.response(timeout=120)
                except (TimeoutError, EOFError) as e:
                    report.violation(phase, "no answer (hang or crash)", f"{e} <- {desc}")
                    srv.p.kill()
                    srv.close()
                    srv = Server(["--device", "cpu"], env, report, phase)
                    break
                check_result(report, phase, obj, r["id"], f"{r['op']} of {desc}", tokens)
                if k == 0:
                    loaded = obj.get("ok", False)
                    report.add("gguf_loaded" if loaded else "gguf_refused")
                elif loaded and not obj.get("ok"):
                    kind = obj["error"]["kind"]
                    if kind in ("gguf_error", "unsupported_architecture", "out_of_memory"):
                        report.add("gguf_failed_after_load")  # validation missed it at load
                        msg = obj["error"]["message"]
                        key = f"{kind}: {msg.split(':')[-1].strip()[:80]}"
                        report.after_load[key] = report.after_load.get(key, 0) + 1
            sender.join(60)
            srv.check_stderr()
            try:
                path.unlink()
            except OSError:
                pass
    finally:
        srv.close()


# ---------------------------------------------------------------- signals


def phase_signals(report, n, seed, work, model_path):
    rng = random.Random(seed)
    phase = "signals"
    env = server_env(work / "cache")
    for i in range(n):
        srv = Server(["--device", "cpu", "--model", str(model_path)], env, report, phase)
        sig = rng.choice([signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
        busy = rng.random() < 0.7
        if busy:
            # SIGTERM/SIGHUP must find the request running (a signal that comes before
            # the server has read the line finds it idle: exit at once, as specified), so
            # those wait for its first token; SIGINT comes at any moment
            stream = sig != signal.SIGINT or rng.random() < 0.5
            srv.send_raw(json.dumps({"id": 1, "op": "generate", "prompt": "Hello",
                                     "max_tokens": 400, "stream": stream}).encode() + b"\n")
            if sig != signal.SIGINT:
                try:
                    first = srv.read(60)
                    if first is None or first.get("event") != "token":
                        report.violation(phase, "no first token", first)
                    else:
                        srv.buf = json.dumps(first).encode() + b"\n" + srv.buf  # re-read
                except TimeoutError as e:
                    report.violation(phase, "no first token", e)
            time.sleep(rng.uniform(0.0, 0.5))
        t = time.monotonic()
        srv.p.send_signal(sig)
        report.add("signals")
        if sig == signal.SIGINT:
            if busy:
                try:
                    tokens, obj = srv.response(timeout=60)
                    check_result(report, phase, obj, 1, "generate + SIGINT", tokens)
                    if not obj.get("ok") and obj["error"]["kind"] != "cancelled":
                        report.violation(phase, "SIGINT: not cancelled", obj)
                except (TimeoutError, EOFError) as e:
                    report.violation(phase, "SIGINT: no result", e)
            srv.send_raw(b'{"id": 2, "op": "ping"}\n')
            try:
                _, obj = srv.response(timeout=30)
                check_result(report, phase, obj, 2, "ping after SIGINT")
            except (TimeoutError, EOFError) as e:
                report.violation(phase, "SIGINT: server gone", e)
            srv.close()
            continue
        if busy:
            try:
                tokens, obj = srv.response(timeout=120)
                check_result(report, phase, obj, 1, f"generate + signal {sig}", tokens)
                if not obj.get("ok"):
                    report.violation(phase, "SIGTERM/SIGHUP: the request did not finish", obj)
            except (TimeoutError, EOFError) as e:
                report.violation(phase, "SIGTERM/SIGHUP: no result", e)
        try:
            rc = srv.p.wait(60)
            if rc != 0:
                report.violation(phase, f"exit code {rc} after signal {sig}")
        except subprocess.TimeoutExpired:
            report.violation(phase, f"no exit after signal {sig}")
        if not busy and time.monotonic() - t > 5:
            report.violation(phase, "idle server took over 5 s to exit")
        srv.close()


# ---------------------------------------------------------------- stalled clients (uds)


def _uds_connect(path, timeout=30):
    s = socket.socket(socket.AF_UNIX)
    end = time.monotonic() + timeout
    while True:
        try:
            s.connect(str(path))
            return s
        except (FileNotFoundError, ConnectionRefusedError):
            if time.monotonic() > end:
                raise
            time.sleep(0.02)


def _uds_line(s, timeout):
    buf = b""
    end = time.monotonic() + timeout
    while b"\n" not in buf:
        left = end - time.monotonic()
        if left <= 0 or not select.select([s], [], [], left)[0]:
            raise TimeoutError("no line")
        data = s.recv(1 << 16)
        if not data:
            return None
        buf += data
    return json.loads(buf.split(b"\n", 1)[0])


def phase_clients(report, n, seed, work, model_path):
    rng = random.Random(seed)
    phase = "clients"
    env = server_env(work / "cache")
    path = work / "s.sock"
    err = tempfile.TemporaryFile()
    p = subprocess.Popen([sys.executable, "-m", "reflex_ipc", "uds", str(path), "--device",
                          "cpu", "--model", str(model_path), "--write-timeout", "1",
                          "--read-timeout", "0.5", "--idle-timeout", "0.5"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                         env=env, cwd=str(ROOT), preexec_fn=_limit_as)
    try:
        for i in range(n):
            for kind in ("half-line", "non-reader", "idle", "vanish"):
                bad = _uds_connect(path, 60)
                if kind == "half-line":
                    bad.sendall(b'{"id": 1, "op": "generate", "prompt": "x"')
                elif kind == "non-reader":
                    bad.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                    bad.sendall(json.dumps({"id": 1, "op": "detokenize",
                                            "ids": [rng.randint(0, 300)] * 200000}).encode()
                                + b"\n")
                elif kind == "vanish":
                    bad.sendall(b'{"id": 1, "op": "generate", "prompt": "x", "max_tokens": 300,'
                                b' "stream": true}\n')
                    time.sleep(rng.uniform(0, 0.3))
                    bad.close()
                time.sleep(0.1)
                t = time.monotonic()
                report.add("clients")
                try:
                    good = _uds_connect(path, 30)
                    ready = _uds_line(good, 30)
                    good.sendall(b'{"id": 2, "op": "tokenize", "text": "Hello world"}\n')
                    obj = _uds_line(good, 30)
                    check_result(report, phase, obj, 2, f"after a {kind} client")
                    good.close()
                    if ready is None or time.monotonic() - t > 15:
                        report.violation(phase, f"a {kind} client held the server",
                                         time.monotonic() - t)
                except (TimeoutError, OSError) as e:
                    report.violation(phase, f"a {kind} client blocked everyone", e)
                try:
                    bad.close()
                except OSError:
                    pass
        report.rss(phase, peak_rss_kib(p.pid))
        p.send_signal(signal.SIGTERM)
        rc = p.wait(30)
        if rc != 0:
            report.violation(phase, f"exit code {rc}")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        err.seek(0)
        text = err.read().decode("utf-8", "replace")
        if "Traceback" in text:
            report.violation(phase, "traceback on stderr", text[text.index("Traceback"):])
        err.close()


# ---------------------------------------------------------------- tokenizer cache corruption

_CACHE_TEXTS = ["Hello world, the world.", "caf\u00e9 \u4f60\u597d", "Hello" * 20 + " the end",
                "<|im_start|>user\nHi<|im_end|>"]


def phase_cache(report, n, seed, work):
    """In process: encode with a cache that is corrupted at random between loads; the
    tokens must equal those of the cache-less tokenizer."""
    rng = random.Random(seed)
    phase = "cache"
    from reflex_ipc.gguffile import GGUFFile
    from reflex_ipc.tokenizer import load_tokenizer

    cache = work / "tokcache"
    models = [ROOT / "tests" / "data" / n_ for n_ in
              ("synthetic-llama.gguf", "synthetic-gemma3.gguf", "synthetic-qwen2.gguf")]
    local = []
    for m in models:
        dst = work / ("c-" + m.name)
        shutil.copy(m, dst)
        local.append(dst)

    def encode(path, cached):
        # the cache folder and switch of this process's settings, for this load
        with settings.override(cache=str(cache), tokenizer_cache=cached), GGUFFile(str(path)) as f:
            t = load_tokenizer(f)
            return [t.encode(x) for x in _CACHE_TEXTS]

    for i in range(n):
        path = rng.choice(local)
        if rng.random() < 0.15:  # same size and mtime, another vocabulary order
            _swap_tokens(path, rng)
        want = encode(path, False)
        got = encode(path, True)  # fills or reads the cache
        report.add("cache_checks")
        if got != want:
            report.violation(phase, "wrong tokens from the tokenizer cache", path.name)
        files = sorted((cache / "tokenizer").glob("*")) if (cache / "tokenizer").exists() \
            else []
        for f_ in files:
            if rng.random() < 0.5:
                _damage(f_, rng, files)
        got = encode(path, True)
        report.add("cache_checks")
        if got != want:
            report.violation(phase, "wrong tokens from a corrupted tokenizer cache",
                             path.name)


def _swap_tokens(path, rng):
    from reflex_ipc.gguffile import GGUFFile

    with GGUFFile(str(path)) as f:
        toks = f.metadata["tokenizer.ggml.tokens"]
        starts, lengths = list(toks.starts), list(toks.lengths)
    by_len = {}
    for i, n in enumerate(lengths):
        by_len.setdefault(n, []).append(i)
    group = rng.choice([g for n, g in by_len.items() if len(g) > 2 and n > 1])
    a, b = rng.sample(group, 2)
    st = os.stat(path)
    with open(path, "r+b") as fh:
        fh.seek(starts[a])
        ta = fh.read(lengths[a])
        fh.seek(starts[b])
        tb = fh.read(lengths[b])
        fh.seek(starts[a])
        fh.write(tb)
        fh.seek(starts[b])
        fh.write(ta)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _damage(f_, rng, files):
    data = bytearray(f_.read_bytes())
    m = rng.random()
    if m < 0.25 and data:
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif m < 0.45:
        data = data[:rng.randrange(len(data) + 1)]
    elif m < 0.6:
        data[32:] = bytes(max(0, len(data) - 32))
    elif m < 0.75 and len(files) > 1:
        data = bytearray(rng.choice(files).read_bytes())
    elif m < 0.9:
        data = bytearray(rng.randbytes(len(data)))
    else:
        data += b"\0" * 8
    f_.write_bytes(bytes(data))


# ---------------------------------------------------------------- files changed under a live server


def phase_files(report, n, seed, work):
    rng = random.Random(seed)
    phase = "files"
    from reflex_ipc.gguffile import GGUFFile
    from reflex_ipc.tokenizer import load_tokenizer

    env = server_env(work / "cache")
    srcs = [ROOT / "tests" / "data" / x for x in
            ("synthetic-llama.gguf", "synthetic-gemma3.gguf", "synthetic-qwen2.gguf")]
    text = "Hello world, the files phase."

    def expected(path):
        try:
            with settings.override(tokenizer_cache=False), GGUFFile(str(path)) as f:
                return load_tokenizer(f).encode(text, add_bos=False)
        except Exception:  # noqa: BLE001  (not a GGUF now: the server must say gguf_error)
            return None

    model = work / "live.gguf"
    shutil.copy(srcs[0], model)
    srv = Server(["--device", "cpu", "--model", str(model)], env, report, phase)
    try:
        for i in range(n):
            how = rng.choice(["truncate", "rewrite", "rename", "same-size", "busy-truncate"])
            src = rng.choice(srcs)
            if how == "busy-truncate":
                srv.send_raw(b'{"id": 0, "op": "generate", "prompt": "Hi", "max_tokens": 300}\n')
                time.sleep(rng.uniform(0, 0.5))
            if how in ("truncate", "busy-truncate"):
                with open(model, "r+b") as fh:
                    fh.truncate(rng.randrange(0, 5000))
            elif how == "rewrite":
                data = src.read_bytes()
                with open(model, "r+b") as fh:
                    fh.truncate(0)
                    fh.write(data)
            elif how == "rename":
                tmp = work / "tmp.gguf"
                shutil.copy(src, tmp)
                os.replace(tmp, model)
            else:
                if expected(model) is None:
                    shutil.copy(src, model)
                _swap_tokens(model, rng)
            if how == "busy-truncate":
                try:
                    tokens, obj = srv.response(timeout=120)
                    check_result(report, phase, obj, 0, "generate while truncated", tokens)
                except (TimeoutError, EOFError) as e:
                    report.violation(phase, "the server died or hung (truncated under it)", e)
                    srv = Server(["--device", "cpu"], env, report, phase)
            report.add("file_changes")
            want = expected(model)
            srv.send_raw(json.dumps({"id": 1, "op": "tokenize", "model": str(model),
                                     "text": text}).encode() + b"\n")
            try:
                _, obj = srv.response(timeout=120)
            except (TimeoutError, EOFError) as e:
                report.violation(phase, f"the server died or hung ({how})", e)
                srv = Server(["--device", "cpu"], env, report, phase)
                continue
            check_result(report, phase, obj, 1, f"tokenize after {how}")
            if want is None:
                if obj.get("ok"):
                    report.violation(phase, "a damaged file answered", how)
            elif obj.get("token_ids") != want:
                report.violation(phase, f"stale tokens after {how}", obj)
            if rng.random() < 0.3 or want is None:
                shutil.copy(rng.choice(srcs), model)
        srv.check_stderr()
    finally:
        srv.close()


# ---------------------------------------------------------------- chat templates (issue 32)

_TEMPLATE_SNIPPETS = [
    "{{ messages[0].content }}", "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}",
    "{{ bos_token }}", "{% if add_generation_prompt %}<|assistant|>{% endif %}", "{{ 'ab' * 1000 }}",
    "{% for i in range(2000) %}{{ i }}{% endfor %}", "{{ messages|tojson }}", "{{ tools|tojson }}",
    "{{ (messages[0].content ~ '!') * 100 }}", "{{ '%05d'|format(3) }}", "{{ '{:>20}'.format('x') }}",
    "{% set ns = namespace(s='') %}{% for i in range(100) %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.s }}",
    "{{ raise_exception('x') }}", "{{ messages[5].content }}", "{{ undefined_var.attr }}", "{{ 1 // 0 }}",
    "{{ strftime_now('%Y-%m-%d') }}", "{% for %}", "{{ '\\ud800' }}", "{{ [1, 2]|join(',') }}",
    "{{ 'x'|center(100) }}", "{{ ('a' * 100).replace('a', 'bb') }}", "{{ 2 ** 100 }}", "{{ 10 ** 100000 }}",
    "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(50) }}",
    "{{ (['x'] * 1000)|join }}", "{{ 'x'.ljust(1000) }}", "{{ range(10)|batch(3)|list }}",
]
# HOSTILE_TEMPLATES that run until the time budget ends them: rare in the mix
_SLOW_TEMPLATES = {"nested_range", "macro_fanout", "endless_cycle"}


def _real_templates():
    d = ROOT / "tests" / "data" / "chat_templates"
    return [p.read_text() for p in sorted(d.glob("*.jinja"))] if d.is_dir() else []


def _mutate_text(rng, src):
    b = list(src)
    for _ in range(rng.randint(1, 4)):
        m = rng.random()
        i = rng.randrange(len(b) + 1)
        if m < 0.3 and b:
            del b[i:i + rng.randint(1, 20)]
        elif m < 0.6:
            b[i:i] = list(rng.choice(["{%", "%}", "{{", "}}", "{#", " if ", " for ", "endfor", "(", ")",
                                      "'", '"', "|", "~", "*", "**", "%", " 10**6 ", "[", "]"]))
        elif b:
            j = rng.randrange(len(b))
            b[i:i] = b[j:j + rng.randint(1, 200)]
    return "".join(b)


def gen_template(rng, long_mode):
    """(source, expected kind or None, description)."""
    r = rng.random()
    if r < 0.35:
        name, src, kind = rng.choice(HOSTILE_TEMPLATES)
        if name in _SLOW_TEMPLATES and rng.random() > (0.2 if long_mode else 0.05):
            name, src, kind = HOSTILE_TEMPLATES[1]
        return src, kind, f"hostile {name}"
    reals = _real_templates()
    if r < 0.65 and reals:
        return _mutate_text(rng, rng.choice(reals)), None, "mutated real template"
    parts = [rng.choice(_TEMPLATE_SNIPPETS) for _ in range(rng.randint(1, 4))]
    return "".join(parts), None, "composed: " + " + ".join(p[:30] for p in parts)


def _messages(rng, valid=False):
    """1-4 messages; valid: nothing the request's own checks refuse (an empty role)."""
    roles = ["system", "user", "assistant", "user"]
    n = rng.randint(1, 4)
    return [{"role": roles[i % 4] if rng.random() < 0.9 else rng.choice(["tool", "x"] + [""] * (not valid)),
             "content": rng.choice(["Hi", "caf\u00e9 \u4f60\u597d", "", "x" * rng.choice([1, 100, 5000])])}
            for i in range(n)]


def _template_model(work, name, template, seed):
    import numpy as np

    kvs, tensors = tiny_model("llama", np.random.default_rng(seed))
    path = work / f"tmpl-{name}.gguf"
    write_gguf(path, kvs + [("tokenizer.chat_template", STR, template)], tensors)
    return path


def phase_templates(report, n, seed, work, model_path, long_mode):
    """Requests with `messages` rendered by hostile, mutated and composed chat templates (as
    `chat_template` and as the GGUF's own): each ends in its kind (never internal) within the
    template budgets; SIGINT during a render that would not end answers `cancelled` at once,
    SIGTERM during one ends the server (exit 0) within the render budget."""
    from reflex_ipc import chat

    rng = random.Random(seed)
    phase = "templates"
    env = server_env(work / "cache")
    bound = chat.COMPILE_SECONDS + chat.RENDER_SECONDS + 10
    slow = next(s for name, s, _ in HOSTILE_TEMPLATES if name == "nested_range")
    own = {name: _template_model(work, name, src, seed) for name, src, _ in HOSTILE_TEMPLATES[:6]}
    srv = Server(["--device", "cpu", "--model", str(model_path)], env, report, phase)
    try:
        for i in range(n):
            src, kind, desc = gen_template(rng, long_mode)
            req = {"id": i, "op": rng.choice(["tokenize", "tokenize", "generate", "system1"])}
            if rng.random() < 0.1:  # the model's own hostile template
                name = rng.choice(sorted(own))
                req["model"] = str(own[name])
                kind = next(k for nm, _, k in HOSTILE_TEMPLATES if nm == name)
                desc = f"GGUF template {name}"
            else:
                req["chat_template"] = src
            req["messages"] = _messages(rng, valid=kind is not None)
            if req["op"] == "generate":
                req["max_tokens"] = 2
            elif req["op"] == "system1":
                req["candidates"] = ["a", "b"]
            t = time.monotonic()
            srv.send_raw(json.dumps(req).encode("utf-8", "surrogatepass") + b"\n")
            report.add("templates")
            try:
                tokens, obj = srv.response(timeout=bound + 60)
            except (TimeoutError, EOFError) as e:
                report.violation(phase, "no answer", f"{e} <- {desc}")
                srv.p.kill()
                srv.close()
                srv = Server(["--device", "cpu", "--model", str(model_path)], env, report, phase)
                continue
            took = time.monotonic() - t
            check_result(report, phase, obj, i, desc, tokens)
            if took > bound:
                report.violation(phase, f"a template took {took:.1f} s", desc)
            got = None if obj.get("ok") else obj.get("error", {}).get("kind")
            if kind and got != kind:
                report.violation(phase, f"expected {kind}, got {got}", f"{desc}: {obj.get('error')}")
        srv.check_stderr()
        report.rss(phase, peak_rss_kib(srv.p.pid))
    finally:
        srv.close()
    # signals while a render would not end
    for sig in (signal.SIGINT, signal.SIGTERM):
        srv = Server(["--device", "cpu", "--model", str(model_path)], env, report, phase)
        try:
            srv.send_raw(json.dumps({"id": 1, "op": "tokenize", "messages": [{"role": "user", "content": "x"}],
                                     "chat_template": slow}).encode() + b"\n")
            time.sleep(0.5)
            t = time.monotonic()
            srv.p.send_signal(sig)
            report.add("template_signals")
            if sig == signal.SIGINT:
                _, obj = srv.response(timeout=30)
                if obj.get("error", {}).get("kind") != "cancelled" or time.monotonic() - t > 1.5:
                    report.violation(phase, "SIGINT during a render", f"{obj!r:.300} after {time.monotonic() - t:.1f} s")
            else:
                try:
                    rc = srv.p.wait(chat.RENDER_SECONDS + 10)
                    if rc != 0:
                        report.violation(phase, f"exit code {rc} after SIGTERM during a render")
                except subprocess.TimeoutExpired:
                    report.violation(phase, "no exit after SIGTERM during a render")
        except (TimeoutError, EOFError) as e:
            report.violation(phase, f"signal {sig} during a render", e)
        finally:
            srv.close()


# ---------------------------------------------------------------- constraints (issue 32)

_REGEX_ATOMS = ["a", "[a-z]", "[0-9]", "\\d", "\\w", ".", "(ab|cd)", "[^\\x00-\\U0010FFFF]", "[^a]", "\\p{L}",
                "x", "\u00e9", "\u4f60", "(", ")", "[", "]", "\\", "{2}", "+", "*", "?", "|", "\\\\", "a{2,1}"]


def _gen_regex(rng, long_mode):
    out = []
    for _ in range(rng.randint(1, 5)):
        out.append(rng.choice(_REGEX_ATOMS))
        if rng.random() < 0.3:
            out.append(rng.choice(["*", "+", "?", "{3}", "{0,5}", "{1,1000}",
                                   "{100000}" if long_mode else "{2000}"]))
    return "".join(out)


def _gen_schema(rng, depth=0):
    r = rng.random()
    if depth > 2 or r < 0.2:
        return rng.choice([{"type": "string"}, {"type": "integer", "minimum": 0, "maximum": 9},
                           {"type": "boolean"}, {"enum": ["a", "b", 1]}, {"type": "string", "maxLength": 3},
                           {"type": "string", "pattern": "^[a-c]{1,3}$"}, {"const": "x"}, {"type": "null"},
                           True, False, {}, {"not": {}}, {"type": "bogus"}, {"$ref": "#"}, 5, "x",
                           {"type": "string", "minLength": 100000}, {"type": "string", "pattern": "\\"}])
    if r < 0.55:
        props = {f"k{i}": _gen_schema(rng, depth + 1) for i in range(rng.randint(0, 3))}
        s = {"type": "object", "properties": props, "required": list(props)[:rng.randint(0, len(props))]}
        if rng.random() < 0.5:
            s["additionalProperties"] = False
        return s
    if r < 0.75:
        return {"type": "array", "items": _gen_schema(rng, depth + 1), "maxItems": rng.choice([0, 1, 3]),
                "minItems": rng.choice([0, 1, 5])}
    if r < 0.85:
        return {"anyOf": [_gen_schema(rng, depth + 1) for _ in range(rng.randint(1, 3))]}
    return {"$defs": {"a": {"$ref": "#/$defs/" + rng.choice(["a", "b"])},
                      "b": {"type": "object", "properties": {"n": {"$ref": "#/$defs/b"}}}},
            "$ref": "#/$defs/" + rng.choice(["a", "b"])}


_LARK = ['start: "a" | "b"', "start: x\nx: x", 'start: start "a" | "a"', "start: y", 'start: "(" start ")" | "x"',
         'start: /[a-z]+/', 'start: "a"{3}', "start: ", "start: /[/", 'start: %json {"type": "string"}',
         'start: "x" "y"*', "bad grammar %%%", 'start: "a"{2000}']


def phase_constraints(report, n, seed, work, model_path, long_mode):
    """generate with random, hostile and unsatisfiable json_schema / regex / grammar: one
    stable kind each (invalid_request, too_large or ok), never internal, the server alive."""
    rng = random.Random(seed)
    phase = "constraints"
    env = server_env(work / "cache")
    srv = Server(["--device", "cpu", "--model", str(model_path)], env, report, phase)
    try:
        for i in range(n):
            field = rng.choice(["json_schema", "json_schema", "regex", "grammar"])
            value = (_gen_schema(rng) if field == "json_schema" else _gen_regex(rng, long_mode)
                     if field == "regex" else rng.choice(_LARK))
            req = {"id": i, "op": "generate", "prompt": "Answer:", "max_tokens": rng.choice([1, 3, 8]),
                   field: value}
            if rng.random() < 0.05:
                req["regex" if field != "regex" else "grammar"] = "a"  # two at once
            srv.send_raw(json.dumps(req).encode() + b"\n")
            report.add("constraints")
            desc = f"{field}={json.dumps(value)[:200]}"
            try:
                tokens, obj = srv.response(timeout=300)
            except (TimeoutError, EOFError) as e:
                report.violation(phase, "no answer", f"{e} <- {desc}")
                srv.p.kill()
                srv.close()
                srv = Server(["--device", "cpu", "--model", str(model_path)], env, report, phase)
                continue
            check_result(report, phase, obj, i, desc, tokens)
        srv.check_stderr()
        report.rss(phase, peak_rss_kib(srv.p.pid))
    finally:
        srv.close()


# ---------------------------------------------------------------- LoRA adapters (issue 32)


def _adapter_bytes(rng, case):
    """A LoRA adapter for the tiny llama (blk.0 attention q/v), well-formed or broken by `case`."""
    import numpy as np

    nrng = np.random.default_rng(rng.randrange(1 << 30))
    rank = 0 if case == "rank0" else rng.choice([1, 2, 4])
    kvs = [("general.architecture", STR, "qwen2" if case == "arch" else "llama"),
           ("general.type", STR, "model" if case == "type" else "adapter"), ("adapter.type", STR, "lora"),
           ("adapter.lora.alpha", F32, {"alpha_huge": 1e38, "alpha_nan": math.nan}.get(case, 4.0))]
    tensors = []
    for name, n_in, n_out in (("blk.0.attn_q.weight", 32, 32), ("blk.1.attn_v.weight", 32, 16)):
        a = (nrng.standard_normal((rank, n_in)) * 0.1).astype(np.float32)
        b = (nrng.standard_normal((n_out, rank)) * 0.1).astype(np.float32)
        if case in ("nan", "inf", "huge") and a.size:
            a.flat[nrng.integers(a.size)] = {"nan": np.nan, "inf": np.inf, "huge": 1e30}[case]
        ashape = [n_in, rank] if case != "shape" else [n_in + 1, rank]
        tensors.append((name + ".lora_a", ashape, GGML_F32, a.tobytes() + (bytes(4 * rank) if case == "shape" else b"")))
        if case != "half":
            tensors.append((name + ".lora_b", [rank, n_out], GGML_F32, b.tobytes()))
    data = gguf_bytes(kvs, tensors)
    if case == "bytes":
        data, _ = mutate_bytes(rng, data)
    return data


_ADAPTER_CASES = ["ok", "ok", "ok", "rank0", "nan", "inf", "huge", "alpha_huge", "alpha_nan", "arch", "type",
                  "shape", "half", "bytes", "bytes"]


def phase_adapters(report, n, seed, work, model_path):
    """`load` with LoRA adapters, well-formed and broken (rank 0, NaN/inf/huge values, absurd
    alpha or scale, wrong shapes, architecture or type, missing halves, damaged bytes): a
    stable kind each, and a loaded adapter generates."""
    rng = random.Random(seed)
    phase = "adapters"
    env = server_env(work / "cache")
    srv = Server(["--device", "cpu"], env, report, phase)
    try:
        for i in range(n):
            case = rng.choice(_ADAPTER_CASES)
            path = work / f"lora-{i % 16}.gguf"
            path.write_bytes(_adapter_bytes(rng, case))
            scale = rng.choice([1.0, 1.0, 0.0, -1.0, 2.5, 1e30, 1e300])
            srv.send_raw(json.dumps({"id": i, "op": "load", "model": str(model_path),
                                     "lora": [{"path": str(path), "scale": scale}]}).encode() + b"\n")
            report.add("adapters")
            desc = f"adapter {case} scale {scale}"
            try:
                _, obj = srv.response(timeout=120)
                check_result(report, phase, obj, i, desc)
                if obj.get("ok"):
                    if case not in ("ok", "bytes"):
                        report.violation(phase, "a broken adapter loaded", desc)
                    srv.send_raw(json.dumps({"id": -i - 1, "op": "generate", "prompt": "Hello",
                                             "max_tokens": 2}).encode() + b"\n")
                    tokens, obj = srv.response(timeout=120)
                    check_result(report, phase, obj, -i - 1, "generate after " + desc, tokens)
                elif case == "ok" and scale < 1e29:
                    report.violation(phase, "a good adapter was refused", f"{desc}: {obj.get('error')}")
            except (TimeoutError, EOFError) as e:
                report.violation(phase, "no answer", f"{e} <- {desc}")
                srv.p.kill()
                srv.close()
                srv = Server(["--device", "cpu"], env, report, phase)
        srv.check_stderr()
        report.rss(phase, peak_rss_kib(srv.p.pid))
    finally:
        srv.close()


# ---------------------------------------------------------------- HTTP front (issue 32)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http(port, method, path, body=None, timeout=30):
    import http.client

    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, body=None if body is None else json.dumps(body),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def phase_http(report, n, seed, work, model_path):
    """`reflex http` with streaming clients that never read (a tiny receive buffer, a long
    generation, the socket left open): the next client is served within a bound once the
    stalled stream ends or its client is gone, and the front keeps its memory."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        report.add("http_skipped")
        return
    rng = random.Random(seed)
    phase = "http"
    env = server_env(work / "cache")
    port = _free_port()
    err = tempfile.TemporaryFile()
    p = subprocess.Popen([sys.executable, "-m", "reflex_ipc", "http", "--port", str(port), "--model",
                          str(model_path), "--device", "cpu"], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=str(ROOT), preexec_fn=_limit_as)
    try:
        end = time.monotonic() + 120
        while True:
            try:
                if _http(port, "GET", "/health", timeout=5)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > end or p.poll() is not None:
                report.violation(phase, "the front did not come up")
                return
            time.sleep(0.2)
        for i in range(n):
            bad = socket.socket()
            bad.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
            bad.connect(("127.0.0.1", port))
            body = json.dumps({"model": "x", "prompt": "Once upon a time", "max_tokens": rng.choice([500, 2000]),
                               "stream": True, "temperature": 0}).encode()
            bad.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            time.sleep(rng.uniform(0.5, 2.0))
            report.add("http_stalled_streams")
            if rng.random() < 0.5:
                bad.close()  # the client goes away without reading
            t = time.monotonic()
            try:
                st, data = _http(port, "POST", "/v1/completions",
                                 {"model": "x", "prompt": "Hello", "max_tokens": 2, "temperature": 0}, timeout=180)
                if st != 200:
                    report.violation(phase, f"HTTP {st} after a stalled stream", data[:300])
            except OSError as e:
                report.violation(phase, "no answer after a stalled stream", e)
            report.add("http_requests")
            if time.monotonic() - t > 120:
                report.violation(phase, "a stalled stream held the front", time.monotonic() - t)
            try:
                bad.close()
            except OSError:
                pass
        report.rss(phase, peak_rss_kib(p.pid))
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            report.violation(phase, "the front did not exit on SIGTERM")
            p.kill()
            p.wait()
        err.seek(0)
        text = err.read().decode("utf-8", "replace")
        if "Traceback" in text:
            report.violation(phase, "traceback on stderr", text[text.index("Traceback"):][:1500])
        err.close()


# ---------------------------------------------------------------- driver


def run(mode="short", seed=12, counts=None, out=None, log=print):
    counts = dict(SHORT if mode == "short" else LONG, **(counts or {}))
    report = Report()
    t0 = time.monotonic()
    times = {}
    with tempfile.TemporaryDirectory(prefix="rxfuzz") as d:
        work = pathlib.Path(d)
        import numpy as np

        model = work / "tiny-llama.gguf"
        write_gguf(model, *tiny_model("llama", np.random.default_rng(seed)))
        extra = []
        for arch in ARCHS[1:]:
            p = work / f"tiny-{arch}.gguf"
            write_gguf(p, *tiny_model(arch, np.random.default_rng(seed)))
            extra.append(str(p))
        phases = [("lines", lambda: phase_lines(report, counts["lines"], seed, work, model, extra,
                                                mode == "long")),
                  ("gguf", lambda: phase_gguf(report, counts["gguf"], seed + 1, work)),
                  ("signals", lambda: phase_signals(report, counts["signals"], seed + 2, work,
                                                    model)),
                  ("clients", lambda: phase_clients(report, counts["clients"], seed + 3, work,
                                                    model)),
                  ("cache", lambda: phase_cache(report, counts["cache"], seed + 4, work)),
                  ("files", lambda: phase_files(report, counts["files"], seed + 5, work)),
                  ("numpy", lambda: phase_lines(report, counts["numpy"], seed + 6, work, model, extra,
                                                mode == "long", device="numpy", phase="numpy")),
                  ("templates", lambda: phase_templates(report, counts["templates"], seed + 7, work, model,
                                                        mode == "long")),
                  ("constraints", lambda: phase_constraints(report, counts["constraints"], seed + 8, work,
                                                            model, mode == "long")),
                  ("adapters", lambda: phase_adapters(report, counts["adapters"], seed + 9, work, model)),
                  ("http", lambda: phase_http(report, counts["http"], seed + 10, work, model))]
        for name, fn in phases:
            if not counts.get(name):
                continue
            t = time.monotonic()
            fn()
            times[name] = round(time.monotonic() - t, 1)
            log(f"fuzz {name}: {times[name]} s, {report.counts.get('violations', 0)} violations")
    result = {
        "mode": mode, "seed": seed, "asked": counts,
        "lines": report.counts.get("lines", 0),
        "gguf_files": report.counts.get("gguf_files", 0),
        "violations": report.counts.get("violations", 0),
        "internal": report.kinds.get("internal", 0),
        "counts": report.counts, "result_kinds": dict(sorted(report.kinds.items(),
                                                            key=lambda kv: str(kv[0]))),
        "peak_rss_mib": {k: round(v / 1024, 1) for k, v in report.peak_rss_kib.items()},
        "server_rlimit_as_mib": SERVER_AS_LIMIT >> 20,
        "gguf_failed_after_load": report.after_load,
        "lines_server_rss_kib_series": report.rss_series,
        "phase_seconds": times, "elapsed_s": round(time.monotonic() - t0, 1),
        "violation_samples": report.violations[:200],
    }
    if out:
        pathlib.Path(out).write_text(json.dumps(result, indent=1) + "\n")
    return result


def main(argv=None):
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=("short", "long"), default="short")
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument("--out")
    for k in SHORT:
        ap.add_argument(f"--{k}", type=int)
    a = ap.parse_args(argv)
    counts = {k: getattr(a, k) for k in SHORT if getattr(a, k) is not None}
    res = run(a.mode, a.seed, counts, a.out, log=lambda m: print(m, file=sys.stderr, flush=True))
    print(json.dumps({k: v for k, v in res.items() if k != "violation_samples"}, indent=1))
    for v in res["violation_samples"][:20]:
        print(json.dumps(v), file=sys.stderr)
    return 1 if res["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
