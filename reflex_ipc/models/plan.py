"""Tensor plans: what an architecture's GGUF holds, declared once beside its model.

An architecture module (models/<arch>.py) declares

    KEYS       {key suffix: REQUIRED or llama.cpp's default}: the `{arch}.` metadata keys it
               reads (a key missing from KEYS is never read; REQUIRED ones must be present)
    dims(hp)   its sizes, read and checked from HParams (no backend: the synthetic writer
               calls it too), a namespace with `layers`, one namespace per layer
    plan(d)    the tensors those sizes take, in file order: `T` entries, a layer's entries
               grouped by `layer(i, ...)`, alternative layouts by `Alt`

and its Model loads them with `load(w, plan(d))` (w: common.Weights), which checks every
entry (presence, shape) before anything is loaded and returns the tensors as attributes:
a global tensor by its name without ".weight" (token_embd, output_norm, rope_freqs), a
layer's on `.layers[i]` by its name inside the layer, "." turned into "_" (attn_q,
attn_q_bias, ffn_gate_inp_scale, ssm_a). An absent optional tensor, or one of an
alternative the file does not use, is None. reflex_ipc.testing.synthetic writes a GGUF of
any architecture from the same KEYS, dims and plan (tests/arch runs them all).

Shapes are in numpy order ((rows, cols) for a matrix: llama.cpp's ne reversed); None
accepts any positive size (a padded vocabulary). Kinds: MAT (a matmul weight: any format,
loaded as a backend weight handle), VEC (a 1-D float tensor: norms, biases, scales), DENSE
(a small tensor no matmul reads, loaded as a float32 array of `as_shape`: conv kernels,
per-head constants).
"""

REQUIRED, OPTIONAL = "required", "optional"  # KEYS values
MAT, VEC, DENSE = "mat", "vec", "dense"


def keys(required=(), optional=(), base=None):
    """A KEYS dict: `base` (default BASE_KEYS) plus these suffixes, required or optional."""
    out = dict(BASE_KEYS if base is None else base)
    out.update({k: REQUIRED for k in required})
    out.update({k: OPTIONAL for k in optional})
    return out


# the keys every decoder's HParams reads (models/common.py), as llama.cpp's loader has them
BASE_KEYS = {
    **{k: REQUIRED for k in ("block_count", "context_length", "embedding_length", "feed_forward_length",
                             "attention.head_count", "attention.layer_norm_rms_epsilon")},
    **{k: OPTIONAL for k in ("attention.head_count_kv", "attention.key_length", "attention.value_length",
                             "rope.dimension_count", "rope.freq_base", "rope.scaling.type", "rope.scaling.factor",
                             "rope.scale_linear", "attention.scale", "final_logit_softcapping",
                             "vocab_size")},
}


_ATTR = {}  # tensor name in its layer -> attribute name


class T:
    """One tensor: name (relative to its layer inside `layer`), numpy shape, kind."""

    __slots__ = ("name", "shape", "kind", "optional", "as_shape")

    def __init__(self, name, *shape, kind=None, optional=False, as_shape=None):
        self.name, self.shape = name, tuple(shape)
        self.kind = kind or (MAT if len(shape) >= 2 else VEC)
        self.optional, self.as_shape = optional, as_shape

    def attr(self):
        a = _ATTR.get(self.name)
        if a is None:
            n = self.name[:-len(".weight")] if self.name.endswith(".weight") else self.name
            a = _ATTR[self.name] = n.replace(".", "_")
        return a

    def __repr__(self):
        return f"T({self.name!r}, {self.shape})"


def opt(name, *shape, **kw):
    """An optional tensor."""
    return T(name, *shape, optional=True, **kw)


def dense(name, *shape, as_shape=None, optional=False):
    """A small tensor loaded as a float32 array of as_shape (default: shape)."""
    return T(name, *shape, kind=DENSE, as_shape=as_shape, optional=optional)


class Alt:
    """Alternative layouts of the same tensors (a fused q/k/v or the three apart): the first
    option whose first tensor the file has (the writer: its config names), else the last."""

    __slots__ = ("options",)

    def __init__(self, *options):
        self.options = [list(o) for o in options]


class If:
    """Tensors present or absent together, as the file has the tensor `name` (relative to the
    layer; the writer: as its config names it): a layer's experts beside its dense FFN.
    `entries` may be a function returning them, called only when present (their sizes may
    come from keys that only such files have)."""

    __slots__ = ("name", "entries")

    def __init__(self, name, entries):
        self.name, self.entries = name, entries


class _Layer:
    __slots__ = ("i", "entries")

    def __init__(self, i, entries):
        self.i, self.entries = i, entries


def layer(i, *entries):
    """Layer i's entries (names relative to `blk.{i}.`; None entries are skipped)."""
    return _Layer(i, entries)


def walk(entries, has, i=None, prefix="", out=None):
    """[(layer index or None, full name, T)] of every tensor of the plan a file holds, in order:
    has(full name) says whether it holds a tensor (it decides Alt, If and optional tensors;
    the loader asks the file, the writer its config). Optional tensors are listed whatever
    has says: the loader skips the absent, the writer the unwanted."""
    out = [] if out is None else out
    for e in entries:
        if e is None:
            continue
        if isinstance(e, T):
            out.append((i, prefix + e.name, e))
        elif isinstance(e, _Layer):
            walk(e.entries, has, e.i, f"blk.{e.i}.", out)
        elif isinstance(e, Alt):
            k = next((k for k, o in enumerate(e.options[:-1]) if has(prefix + _first(o).name)),
                     len(e.options) - 1)
            walk(e.options[k], has, i, prefix, out)
        elif isinstance(e, If):
            if has(prefix + e.name):
                walk(e.entries() if callable(e.entries) else e.entries, has, i, prefix, out)
    return out


def selectors(entries, has, prefix=""):
    """{full name: "alt" or "if"}: the tensors whose presence chooses a layout (an Alt option's
    first tensor, an If's) in a file that has(full name) the tensors it has."""
    out = {}
    for e in entries:
        if isinstance(e, _Layer):
            out.update(selectors(e.entries, has, f"blk.{e.i}."))
        elif isinstance(e, Alt):
            for o in e.options[:-1]:
                out[prefix + _first(o).name] = "alt"
            for o in e.options:
                out.update(selectors(o, has, prefix))
        elif isinstance(e, If):
            out[prefix + e.name] = "if"
            if has(prefix + e.name):
                out.update(selectors(e.entries() if callable(e.entries) else e.entries, has, prefix))
    return out


def _first(entries):
    e = next(e for e in entries if e is not None)
    return _first(e.options[0]) if isinstance(e, Alt) else e


class Layer:
    """A layer's tensors (and what the model adds: sizes, flags). A tensor its plan does not
    have reads as None (the blocks skip the steps of absent optional tensors)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return None


class Tensors(Layer):
    """What `load` returns: global tensors as attributes, `layers` a Layer per layer."""

    def __init__(self, layers):
        super().__init__(layers=[Layer(**vars(L)) for L in layers])


def load(w, entries, layers):
    """Check every tensor of the plan `entries` in GGUFFile w.f (presence and shape; the first
    bad one is a gguf_error naming it), then load them through Weights w: a Tensors with every
    tensor of the plan as an attribute (None when absent and optional, or in an alternative
    the file does not use), its layers starting as copies of `layers` (the dims' layers)."""
    out = Tensors(layers)
    chosen = [(i, t, w.check(name, t.shape, t.optional)) for i, name, t in walk(entries, w.f.tensors.__contains__)]
    for i, t, info in chosen:
        if info is not None:
            v = w.load_dense(info, t.shape, t.as_shape) if t.kind == DENSE else w.load(info, t.shape)
            setattr(out if i is None else out.layers[i], t.attr(), v)
    return out


class Meta:
    """Metadata without a file, for HParams (the synthetic writer derives an architecture's
    dims from the keys it is about to write): {full key: value}, arrays as lists."""

    class _Tokens:
        def __init__(self, n):
            self.count = n

    def __init__(self, arch, metadata, n_vocab=0):
        self.architecture = arch
        self.metadata = dict(metadata)
        self.metadata["tokenizer.ggml.tokens"] = self._Tokens(n_vocab)

    def get(self, key, default=None):
        return self.metadata.get(key, default)


# The keys of a tiny model, the base of the architectures' EXAMPLES: small files of each
# architecture that reflex_ipc.testing.synthetic writes (random weights, SmolLM2's tokenizer)
# and tests/arch runs on every backend against llama.cpp.
TINY = {"block_count": 2, "context_length": 4096, "embedding_length": 32, "feed_forward_length": 48,
        "attention.head_count": 4, "attention.head_count_kv": 2, "attention.layer_norm_rms_epsilon": 1e-6,
        "rope.freq_base": 10000.0}


def example(keys, base=TINY, **spec):
    """An EXAMPLES entry: metadata keys (`base` updated by `keys`, in base's order) and the
    writer's options (synthetic.example_gguf): has / lacks (the optional tensors and layouts
    written, as write_gguf takes them), seed, gain, embd_std, rules (synthetic.Init),
    quantize (matrices quantized where rows fit: a quantized file with its F32 twin beside), vocab
    (a real vocabulary of synthetic.VOCABS instead of SmolLM2's, chat template included)."""
    return dict(spec, keys={**base, **keys})


def variant(of, keys=(), **spec):
    """An EXAMPLES entry that is example `of` of the same architecture with keys and options
    changed (a quantized file with wider matrices)."""
    return dict(spec, of=of, keys=dict(keys))


def missing_keys(arch, keys, metadata):
    """The REQUIRED keys of KEYS absent from metadata (full names)."""
    return [f"{arch}.{k}" for k, v in keys.items() if v is REQUIRED and f"{arch}.{k}" not in metadata]
