"""What the architecture modules share: checked hyperparameters, checked tensors, the
state declaration, attention over a layer's state.

Hyperparameters come only from GGUF metadata, with llama.cpp's key names and
defaults, and are checked when read: a value of the wrong type, NaN or
infinite, out of range, or inconsistent with another is refused at load with a
`gguf_error` naming the key (an unsupported feature: `unsupported_architecture`).
Keys llama.cpp reads per layer (head counts, feed-forward length) may be arrays
of n_layer values; they are lists here (`hp.n_head_l[i]`), and each layer's
values sit on its weights namespace.

A model module defines `class Model(Decoder)` with

    Model(ops, f, lora=None)      load (and check) weights through the backend `ops`, with
                                  LoRA adapters (reflex_ipc.lora.LoraSet) when given
    model.state_spec()            one runtime.state spec per layer (Decoder: attention K/V)
    model.new_state(ops, n_slots) a runtime.state.State for n_slots tokens
    model.forward(state, batch, rows=None, output="logits", check=None)

`forward` runs `batch` (runtime.batch.Batch: token ids at given positions, stored at
given state slots) through every layer, then keeps the rows `rows` (a slice; None
= all) and returns the final-normed hidden states [R, n_embd] (output="hidden") or
the logits [R, n_vocab] (output="logits"). `check()`, when given, is called before
every layer (cancellation).
"""

from __future__ import annotations

import math

from ..errors import ReflexError
from ..runtime.state import State, attention_spec
from .plan import BASE_KEYS

MAX_LAYERS = 4096
MAX_DIM = 1 << 20  # widths (embedding, feed-forward)
MAX_HEADS = 1 << 12
MAX_HEAD_DIM = 1 << 12
MAX_CTX = 1 << 24


def _bad(key, msg):
    return ReflexError("gguf_error", f"metadata key {key}: {msg}")


def moe_captured(ops) -> bool:
    """Whether a forward that runs ops.moe can be captured in a graph: the backend's moe never
    waits for the device (CUDA routes experts on the device unless REFLEX_CUDA_MOE=host; the
    host backends have no graphs of their own kind and say nothing)."""
    return getattr(ops, "moe_capturable", False)


# `capturable` of a model whose every forward runs ops.moe
MOE_CAPTURABLE = property(lambda self: moe_captured(self.ops),
                          doc="Graphs hold the layers unless the backend's moe waits for the device.")


class HParams:
    """The hyperparameters every decoder here needs, from `{arch}.*` keys, checked."""

    def __init__(self, f, keys=None, rope_scalings=("none", "linear"), attention_free_layers=False):
        """keys: the architecture's KEYS (models/plan.py): a REQUIRED key missing is refused
        first, and the base keys below are required or optional as it says (default: llama's).
        rope_scalings: the rope.scaling.type values the architecture handles.
        attention_free_layers: a per-layer head_count_kv of 0 marks a layer without attention
        (granitehybrid's recurrent layers); otherwise every layer needs at least one KV head."""
        from .plan import BASE_KEYS, REQUIRED, missing_keys

        self.arch = arch = f.architecture
        self._f = f
        self.keys = BASE_KEYS if keys is None else keys
        self.read = set()  # the key suffixes read (tests check them against KEYS)
        missing = missing_keys(arch, self.keys, f.metadata)
        if missing:
            raise ReflexError("gguf_error", f"metadata key {missing[0]} is missing")
        req = {k for k, v in self.keys.items() if v is REQUIRED}
        self.n_layer = self.int("block_count", required=True, lo=1, hi=MAX_LAYERS)
        self.n_embd = self.int("embedding_length", required=True, lo=1, hi=MAX_DIM)
        self.n_ff_l = self.per_layer("feed_forward_length", required="feed_forward_length" in req, default=0,
                                     lo=0, hi=MAX_DIM)
        self.n_head_l = self.per_layer("attention.head_count", required=True, lo=1, hi=MAX_HEADS)
        self.n_head_kv_l = self.per_layer("attention.head_count_kv", default=self.n_head_l,
                                          lo=0 if attention_free_layers else 1, hi=MAX_HEADS)
        for i, (h, hkv) in enumerate(zip(self.n_head_l, self.n_head_kv_l)):
            if hkv and h % hkv:
                raise _bad(f"{arch}.attention.head_count_kv", f"layer {i}: {h} heads cannot share {hkv} KV heads")
        self.n_head, self.n_head_kv, self.n_ff = self.n_head_l[0], self.n_head_kv_l[0], max(self.n_ff_l)
        self.head_dim = self.int("attention.key_length", default=self.n_embd // self.n_head, lo=1, hi=MAX_HEAD_DIM)
        self.head_dim_v = self.int("attention.value_length", default=self.n_embd // self.n_head, lo=1,
                                   hi=MAX_HEAD_DIM)
        self.n_rot = self.int("rope.dimension_count", default=self.head_dim, lo=0, hi=self.head_dim)
        if self.n_rot % 2:
            raise _bad(f"{arch}.rope.dimension_count", f"{self.n_rot} is odd (rope rotates pairs)")
        self.eps = self.float("attention.layer_norm_rms_epsilon", required=True, gt=0.0, hi=1.0)
        self.rope_base = self.float("rope.freq_base", default=10000.0, gt=0.0)
        self.rope_scaling = scaling = self.str("rope.scaling.type", default="linear")
        if scaling not in rope_scalings:  # a model that reads YaRN's keys asks for "yarn"
            raise ReflexError("unsupported_architecture", f"metadata key {arch}.rope.scaling.type: rope scaling {scaling!r} is not supported for {arch}")
        factor = self.float("rope.scaling.factor", default=0.0, lo=0.0) or \
            self.float("rope.scale_linear", default=0.0, lo=0.0)
        self.rope_scale = 1.0 / factor if factor else 1.0
        self.n_ctx_train = self.int("context_length", required="context_length" in req, default=0, lo=0,
                                    hi=MAX_CTX)
        self.attn_scale = self.float("attention.scale", default=0.0, lo=0.0)
        self.final_softcap = self.float("final_logit_softcapping", default=0.0, lo=0.0)
        tokens = f.metadata.get("tokenizer.ggml.tokens")
        n_tok = getattr(tokens, "count", 0) if tokens is not None else 0
        self.n_vocab = self.int("vocab_size", default=0, lo=0, hi=1 << 31) or int(n_tok)

    # -- typed, checked getters ----------------------------------------------------------
    def _raw(self, key, default, required):
        self.read.add(key)
        k = f"{self.arch}.{key}"
        v = self._f.metadata.get(k)
        if v is None:
            if required:
                raise ReflexError("gguf_error", f"metadata key {k} is missing")
            return k, default
        return k, v

    def int(self, key, default=None, required=False, lo=None, hi=None):
        """An integer key within [lo, hi]."""
        k, v = self._raw(key, default, required)
        return _check_int(k, v, lo, hi)

    def float(self, key, default=None, required=False, lo=None, gt=None, hi=None):
        """A finite number key: >= lo, > gt, <= hi."""
        k, v = self._raw(key, default, required)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise _bad(k, f"expected a number, got {_type_name(v)}")
        v = float(v)
        if not math.isfinite(v):
            raise _bad(k, f"{v} is not finite")
        if (lo is not None and v < lo) or (gt is not None and v <= gt) or (hi is not None and v > hi):
            rng = f"{'>= ' + str(lo) if lo is not None else '> ' + str(gt) if gt is not None else ''}" + \
                  (f", <= {hi}" if hi is not None else "")
            raise _bad(k, f"{v} is out of range ({rng})")
        return v

    def str(self, key, default=None, required=False):
        k, v = self._raw(key, default, required)
        if v is not None and not isinstance(v, str):
            raise _bad(k, f"expected a string, got {_type_name(v)}")
        return v

    def bool(self, key, default=False):
        k, v = self._raw(key, default, False)
        if not isinstance(v, bool):
            raise _bad(k, f"expected a bool, got {_type_name(v)}")
        return v

    def per_layer(self, key, default=None, required=False, lo=None, hi=None):
        """A key llama.cpp reads per layer: a scalar (every layer) or an array of n_layer
        integers. A list of n_layer ints."""
        k, v = self._raw(key, default, required)
        from ..gguffile import ArrayValue

        if isinstance(v, ArrayValue):
            if v.count != self.n_layer:
                raise _bad(k, f"an array of {v.count} values for {self.n_layer} layers")
            v = v.tolist()
        if isinstance(v, list):
            if len(v) != self.n_layer:
                raise _bad(k, f"{len(v)} values for {self.n_layer} layers")
            return [_check_int(f"{k}[{i}]", x, lo, hi) for i, x in enumerate(v)]
        return [_check_int(k, v, lo, hi)] * self.n_layer

    def layer_flags(self, key, default=None):
        """A per-layer array of flags (bool or int), or None when absent or a scalar."""
        k, v = self._raw(key, default, False)
        from ..gguffile import ArrayValue

        if v is None or (not isinstance(v, (ArrayValue, list)) and not isinstance(v, str)):
            return None
        if isinstance(v, ArrayValue):
            if v.count > MAX_LAYERS:
                raise _bad(k, f"an array of {v.count} values")
            v = v.tolist()
        if not isinstance(v, list) or any(isinstance(x, (list, str, float)) for x in v):
            raise _bad(k, f"expected an array of flags, got {_type_name(v)}")
        return [bool(x) for x in v]

    def get(self, key, default=None):
        """An unchecked value (arrays as lists): prefer the typed getters."""
        self.read.add(key)
        return self._f.get(f"{self.arch}.{key}", default)


def _type_name(v):
    from ..gguffile import ArrayValue

    if isinstance(v, ArrayValue):
        return f"an array of {v.count}"
    return "an array" if isinstance(v, list) else type(v).__name__


def _check_int(k, v, lo, hi):
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, float) and math.isfinite(v) and v == int(v):
            v = int(v)  # an integral float (some converters write floats)
        else:
            raise _bad(k, f"expected an integer, got {_type_name(v) if not isinstance(v, float) else v}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise _bad(k, f"{v} is out of range [{lo}, {hi}]")
    return v


class Weights:
    """Loads tensors of f through the backend, checking presence and shape first.

    `w(name, shape)`: shape in numpy order ((rows, cols) for matrices, (n,) for vectors),
    an entry None where any positive size is accepted (a padded vocabulary)."""

    def __init__(self, ops, f, lora=None):
        self.ops, self.f, self.lora = ops, f, lora  # lora: a reflex_ipc.lora.LoraSet or None

    def check(self, name, shape, optional=False):
        """The tensor `name` after checking its shape (None when optional and absent)."""
        t = self.f.tensors.get(name)
        if t is None:
            if optional:
                return None
            raise ReflexError("gguf_error", f"tensor {name!r} is missing from {self.f.path}")
        got = tuple(int(d) for d in reversed(t.shape))
        if len(got) > len(shape) and all(d == 1 for d in got[:len(got) - len(shape)]):
            got = got[len(got) - len(shape):]  # leading 1s: ggml's trailing dims, loaded without them
        if len(got) != len(shape) or any(d <= 0 or (s is not None and d != s) for d, s in zip(got, shape)):
            want = "x".join("*" if s is None else str(s) for s in shape)
            raise ReflexError("gguf_error", f"tensor {name!r} has shape {'x'.join(map(str, got)) or '()'}, "
                              f"expected {want}")
        return t

    def dense(self, name, shape, optional=False, as_shape=None):
        """A small tensor that no matmul reads (a conv kernel, per-head constants, a grouped norm),
        its shape checked as `__call__` does, as a float32 backend array of `as_shape` (default
        `shape`; same element count): the same kind of array on every backend, whatever the
        tensor's dimensions in the file."""
        t = self.check(name, shape, optional)
        return None if t is None else self.load_dense(t, shape, as_shape)

    def __call__(self, name, shape, optional=False):
        t = self.check(name, shape, optional)
        return None if t is None else self.load(t, shape)

    def load(self, t, shape):
        """The tensor of TensorInfo t, checked against shape already (check), as a backend
        weight (LoRA applied) or vector."""
        # a tensor stored with ggml trailing dims of 1 ([n, 1]) loads without them (check)
        ndim = len(shape) if len(t.shape) > len(shape) else None
        w = self.ops.load_weight(self.f, t.name) if ndim is None else \
            self.ops.load_weight(self.f, t.name, ndim=ndim)
        if self.lora is not None and len(shape) == 2:
            w = self.lora.apply(t.name, w)
        return w

    def load_dense(self, t, shape, as_shape=None):
        """dense's array of TensorInfo t, checked against shape already."""
        import numpy as np

        from ..quants import dequantize

        # copied: F32 data would otherwise be a view of the file mapping
        a = np.array(dequantize(self.f.tensor_data(t), t.ggml_type, t.n_elements), np.float32)
        return self.ops.asarray(a.reshape(shape if as_shape is None else as_shape))


class Decoder:
    """What every architecture here shares: its declaration (KEYS, dims, plan: models/plan.py)
    and its loading through them, and by default an attention K/V state per layer, of the
    layer's own KV head count and head width (`layers[i].n_head_kv`, `.head_dim`)."""

    KEYS = BASE_KEYS  # the architecture's metadata keys (plan.keys(...))
    rope_scalings = ("none", "linear")  # the rope.scaling.type values it handles
    attention_free_layers = False  # a head_count_kv of 0 marks a layer without attention

    @classmethod
    def hparams(cls, f):
        """HParams of GGUFFile f (or a plan.Meta), with the architecture's keys and checks."""
        return HParams(f, cls.KEYS, cls.rope_scalings, cls.attention_free_layers)

    @classmethod
    def dims(cls, hp):
        """The sizes the tensors take: a plan.Layer with `layers`, one plan.Layer per layer."""
        raise NotImplementedError

    @classmethod
    def plan(cls, d):
        """The tensors for dims d, in file order (plan.T, plan.layer, plan.Alt entries)."""
        raise NotImplementedError

    def _load(self, ops, f, lora):
        """Read the hyperparameters and load the tensors: sets ops, hp, d, layers (the plan's
        layers with the dims' sizes on them), tok_embd, output_norm and output (the LM head:
        output.weight, else the tied token embedding, llama.cpp's fallback); returns the
        plan.Tensors."""
        from .plan import load

        self.ops = ops
        self.hp = self.hparams(f)
        self.d = d = self.dims(self.hp)
        t = load(Weights(ops, f, lora), self.plan(d), d.layers)
        self.layers = t.layers
        self.tok_embd, self.output_norm = t.token_embd, t.output_norm
        self.output = t.output if t.output is not None else t.token_embd
        return t

    def state_spec(self):
        return [attention_spec(L.n_head_kv, L.head_dim, L.head_dim) for L in self.layers]

    def new_state(self, ops, n_slots, n_seq=1):
        return State(ops, self.state_spec(), n_slots, n_seq)

    def state_bytes(self, n_slots, itemsize=2):
        """Bytes of the state for n_slots tokens (known before anything is allocated)."""
        return State.nbytes(self.state_spec(), n_slots, 1, itemsize)


def experts(hp, same_used=False):
    """(expert_count, expert_used_count per layer, the experts' width per layer:
    expert_feed_forward_length, else feed_forward_length / expert_used_count). same_used:
    differing per-layer counts are refused (llama.cpp would route every layer with layer 0's)."""
    n = hp.int("expert_count", required=True, lo=1, hi=1 << 12)
    used = hp.per_layer("expert_used_count", required=True, lo=1, hi=n)
    if same_used and len(set(used)) > 1:
        raise ReflexError("unsupported_architecture", f"metadata key {hp.arch}.expert_used_count: "
                          f"different counts per layer {used} are not supported")
    ff = hp.per_layer("expert_feed_forward_length", default=0, lo=0, hi=1 << 20)
    ff = [x or hp.n_ff_l[i] // used[i] for i, x in enumerate(ff)]
    if not all(ff):
        raise ReflexError("gguf_error", f"metadata key {hp.arch}.expert_feed_forward_length: an expert width of 0")
    return n, used, ff


def split_rows(ops, w, sizes):
    """A weight's consecutive row blocks of `sizes` rows (a fused q/k/v or gate/up tensor split
    into its parts, weight handles sharing its storage); with LoRA applied at run time, the
    adapters' B rows go with them."""
    out, start = [], 0
    for n in sizes:
        terms = getattr(w, "terms", None)  # a lora.LoraWeight
        if terms is None:
            out.append(ops.weight_rows(w, start, n))
        else:
            out.append(type(w)(ops.weight_rows(w.base, start, n),
                               [(a, ops.weight_rows(b, start, n), c) for a, b, c in terms]))
        start += n
    return out


def same_head_dims(hp):
    """unsupported_architecture unless K and V heads have one width (the attention op's)."""
    if hp.head_dim_v != hp.head_dim:
        raise ReflexError("unsupported_architecture",
                          f"key length {hp.head_dim} != value length {hp.head_dim_v}")


def default_attn_scale(hp):
    return hp.attn_scale if hp.attn_scale else 1.0 / math.sqrt(hp.head_dim)


def swa_layers(hp, n_pattern, dense_first=False):
    """Which layers are sliding-window (or chunked) ones, as llama.cpp's load_swa_pattern reads
    them: `attention.sliding_window_pattern` as an array of per-layer flags, else a period n
    (default n_pattern): layer i is windowed unless i % n == n - 1 (dense_first: unless
    i % n == 0); n = 0: every layer."""
    flags = hp.layer_flags("attention.sliding_window_pattern")
    if flags is not None:
        if len(flags) < hp.n_layer:
            raise _bad(f"{hp.arch}.attention.sliding_window_pattern",
                       f"{len(flags)} entries for {hp.n_layer} layers")
        return flags[:hp.n_layer]
    n = hp.int("attention.sliding_window_pattern", default=n_pattern, lo=0, hi=1 << 16)
    if dense_first:
        return [n == 0 or i % n != 0 for i in range(hp.n_layer)]
    return [n == 0 or i % n < n - 1 for i in range(hp.n_layer)]


def yarn_rope(hp):
    """(freq_scale, mscale, yarn) of rope for a model whose rope.scaling.type may be yarn, as
    llama.cpp's context derives them when the model sets no YaRN log multiplier: ext_factor 1
    for yarn, attn_factor = get_mscale(factor) / (1 + 0.1 ln factor) * rope.scaling.attn_factor
    (ggml's rope multiplies the 1 + 0.1 ln factor back), beta_fast 32, beta_slow 1, the
    original context rope.scaling.original_context_length (else the trained one)."""
    fs = 1.0 if hp.rope_scaling == "none" else hp.rope_scale
    rope_attn = hp.float("rope.scaling.attn_factor", default=1.0, gt=0.0)
    if hp.rope_scaling != "yarn":
        return fs, rope_attn, None
    factor = 1.0 / fs
    attn = (1.0 if factor <= 1.0 else 0.1 * math.log(factor) + 1.0) / (1.0 + 0.1 * math.log(factor))
    n_ctx_orig = hp.int("rope.scaling.original_context_length", default=hp.n_ctx_train, lo=0, hi=MAX_CTX) \
        or hp.n_ctx_train
    return fs, attn * rope_attn, (1.0, n_ctx_orig, 32.0, 1.0)
