"""LoRA adapters in llama.cpp's GGUF adapter format, applied at load.

An adapter file is a GGUF with `general.type = "adapter"`, `adapter.type = "lora"`,
`adapter.lora.alpha` (float; 0 or absent = no alpha scaling), the base model's
`general.architecture`, and for each adapted base tensor NAME (a 2-D weight such as
`blk.0.attn_q.weight`) a pair NAME.lora_a (ggml [n_in, r], numpy [r, n_in]) and
NAME.lora_b (ggml [r, n_out], numpy [n_out, r]). With llama.cpp's formula, each adapter i
loaded with a user scale s_i changes the weight's product to

    y = x W^T + sum_i  c_i (x A_i^T) B_i^T,   c_i = s_i * alpha_i / r_i  (s_i when alpha_i = 0)

Two ways to apply them, chosen per backend (`$REFLEX_LORA=merge|runtime` overrides):

- merge (numpy's default): W += sum_i c_i B_i A_i once at load, in the float32 weights the
  numpy backend keeps anyway. Costs one [n_out, r] x [r, n_in] product per adapted tensor
  at load and nothing per token.
- runtime (CUDA's default): the base weight stays as uploaded (quantized), and every
  product through an adapted weight adds the low-rank term with plain backend ops
  (two small matmuls, a scale, an accumulate). No quantizer is needed and a quantized
  base stays bit-for-bit what it was; each token pays 2 extra small matmuls per adapted
  weight. Merging on CUDA would mean dequantize-merge-requantize (a quantizer per ggml
  type, and requantization error) at load: not implemented.

Mismatches between adapter and base (architecture, a tensor the base lacks or the model does
not use, shapes, ranks) are `invalid_request` naming the tensor; a file that is not a LoRA
adapter is `invalid_request` too, a malformed one `gguf_error`: a rank of 0, values that are
NaN or infinite, or values and an alpha that could change a weight by more than MAX_DELTA
(the bound |c| * max_o |B[o, :]| * max_i |A[:, i]|, Cauchy-Schwarz on every entry of c B A;
real adapters stay below 1). A user scale that takes a sane adapter past that bound is
`invalid_request`. All of it is checked at load, before any weight is touched.
"""

from __future__ import annotations

import math
import os

from .errors import ReflexError

MODES = ("merge", "runtime")
MAX_DELTA = 1e4  # the most an adapter may change one weight entry (see the docstring)


def parse_spec(text):
    """CLI `FILE[:SCALE]` -> (path, scale). A suffix after the last ':' is a scale only when
    it parses as a number (paths may contain ':')."""
    path, sep, tail = text.rpartition(":")
    if sep and path:
        try:
            return path, _scale(float(tail))
        except ValueError:
            pass
    return text, 1.0


def _scale(s):
    if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(float(s)):
        raise ReflexError("invalid_request", f"a LoRA scale must be a finite number, not {s!r}")
    return float(s)


def normalize(specs):
    """[(path, scale)] from a list of "FILE[:SCALE]" strings, {"path", "scale"} dicts or
    (path, scale) pairs."""
    out = []
    for s in specs or ():
        if isinstance(s, str):
            out.append(parse_spec(s))
        elif isinstance(s, dict):
            if not isinstance(s.get("path"), str) or not s["path"]:
                raise ReflexError("invalid_request", "a LoRA adapter needs a non-empty `path`")
            out.append((s["path"], _scale(s.get("scale", 1.0))))
        else:
            path, scale = s
            out.append((path, _scale(scale)))
    return out


class Adapter:
    """One opened adapter: path, scale, alpha, digest and pairs {base name: (a, b) TensorInfo}."""

    def __init__(self, path, scale, f):
        self.path, self.scale, self.f = path, scale, f
        self.alpha = 0.0
        self.pairs = {}
        self.bounds = {}  # base name -> max_o |B[o, :]| * max_i |A[:, i]| (2-norms)

    def factor(self, name):
        """c = scale * alpha / rank (scale when alpha is 0) for the base tensor `name`."""
        rank = self.pairs[name][1].shape[0]  # b's ggml ne[0]
        return self.scale * self.alpha / rank if self.alpha else self.scale

    def close(self):
        self.f.close()


def open_adapters(specs, base):
    """Open and check the adapters [(path, scale)] against the base GGUFFile."""
    from .gguffile import GGUFFile
    from .modelpath import resolve_model

    out = []
    try:
        for path, scale in specs:
            path = resolve_model(path)
            a = Adapter(path, scale, GGUFFile(path))
            out.append(a)
            _check(a, base)
    except BaseException:
        for a in out:
            a.close()
        raise
    return out


def _check(ad, base):
    f, name = ad.f, os.path.basename(ad.path)

    def bad(msg, kind="invalid_request"):
        return ReflexError(kind, f"LoRA adapter {name}: {msg}")

    gtype = f.get("general.type")
    if gtype != "adapter":
        raise bad(f"not an adapter (general.type is {gtype!r}, not 'adapter')")
    atype = f.get("adapter.type")
    if atype != "lora":
        raise bad(f"adapter type {atype!r} is not supported (only 'lora')")
    if any(k.startswith("adapter.alora") for k in f.metadata):
        raise bad("activated LoRA (adapter.alora.*) is not supported")
    if f.architecture != base.architecture:
        raise bad(f"made for architecture {f.architecture!r}; the model is {base.architecture!r}")
    alpha = f.get("adapter.lora.alpha", 0.0)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise bad(f"adapter.lora.alpha is {alpha!r}, not a finite number", "gguf_error")
    ad.alpha = float(alpha)
    halves = {}
    for tname, t in f.tensors.items():
        stem, dot, part = tname.rpartition(".")
        if part not in ("lora_a", "lora_b") or not stem:
            raise bad(f"tensor {tname!r} is neither NAME.lora_a nor NAME.lora_b", "gguf_error")
        halves.setdefault(stem, {})[part] = t
    if not halves:
        raise bad("holds no lora_a/lora_b tensors", "gguf_error")
    for stem, p in halves.items():
        if set(p) != {"lora_a", "lora_b"}:
            missing = "lora_b" if "lora_a" in p else "lora_a"
            raise bad(f"{stem}.{missing} is missing", "gguf_error")
        a, b = p["lora_a"], p["lora_b"]
        if len(a.shape) != 2 or len(b.shape) != 2:
            raise bad(f"{stem}: lora_a and lora_b must be matrices", "gguf_error")
        w = base.tensors.get(stem)
        if w is None:
            raise bad(f"the model has no tensor {stem!r}")
        if stem == "token_embd.weight":
            raise bad("LoRA on token_embd.weight is not supported")
        if len(w.shape) != 2:
            raise bad(f"{stem} is not a matrix")
        n_in, n_out = w.shape[0], w.shape[1]  # ggml order
        if a.shape[1] != b.shape[0]:
            raise bad(f"{stem}: lora_a has rank {a.shape[1]}, lora_b {b.shape[0]} (lora_a must be "
                      f"stored transposed, ggml [n_in, rank])", "gguf_error")
        if a.shape[0] != n_in or b.shape[1] != n_out:
            raise bad(f"{stem}: lora_a {list(a.shape)} / lora_b {list(b.shape)} do not fit the model's "
                      f"{list(w.shape)} (ggml order)")
        if a.shape[1] < 1:
            raise bad(f"{stem}: rank 0 (lora_a {list(a.shape)}, lora_b {list(b.shape)})", "gguf_error")
        ad.pairs[stem] = (a, b)
        ad.bounds[stem] = _bound(f, a, b, lambda msg: bad(f"{stem}: {msg}", "gguf_error"))
    for stem in ad.pairs:  # the file's own values first (whatever the scale), then the scale's
        own = abs(ad.alpha / ad.pairs[stem][1].shape[0] if ad.alpha else 1.0) * ad.bounds[stem]
        if not own <= MAX_DELTA:  # NaN too
            raise bad(f"{stem}: its values and alpha {ad.alpha:g} could change a weight by "
                      f"{own:.3g}; the limit is {MAX_DELTA:g}", "gguf_error")
        delta = abs(ad.factor(stem)) * ad.bounds[stem]
        if not delta <= MAX_DELTA:
            raise bad(f"the scale {ad.scale:g} makes {stem} change a weight by up to {delta:.3g}; "
                      f"the limit is {MAX_DELTA:g}")


def _bound(f, ta, tb, bad):
    """max_o |B[o, :]|_2 * max_i |A[:, i]|_2 of one pair, after checking that every value
    is finite (raises bad(msg))."""
    import numpy as np

    out = 1.0
    for t, axis in ((ta, 0), (tb, 1)):  # A [r, n_in]: columns; B [n_out, r]: rows
        x = _host(f, t).astype(np.float64)
        if not np.isfinite(x).all():
            raise bad(f"{t.name} holds NaN or infinite values")
        out *= float(np.sqrt((x * x).sum(axis=axis)).max()) if x.size else 0.0
    return out


def digest(ad):
    """The adapter's identity for saved states: sha256 of its header, metadata and tensor
    directory (as runtime.statefile.model_digest)."""
    from .runtime.statefile import model_digest

    return model_digest(ad.f)


def default_mode(ops):
    from . import settings

    return settings.get().lora or ("merge" if ops.name == "numpy" else "runtime")


class LoraWeight:
    """A base weight handle with low-rank terms [(A [r, n_in], B [n_out, r], c)] added to every
    product through it (runtime mode; LoraOps does the adding)."""

    def __init__(self, base, terms):
        self.base, self.terms = base, terms
        self.shape = base.shape

    def __getattr__(self, name):  # dtype, ggml type, ... of the base
        return getattr(self.base, name)


class LoraSet:
    """The adapters of one model load; `Weights` asks `apply(name, w)` for each 2-D weight."""

    def __init__(self, ops, adapters, mode=None):
        self.ops, self.adapters = ops, adapters
        self.mode = mode or default_mode(ops)
        self.used = set()
        self.runtime = False  # a LoraWeight was made: the model needs LoraOps

    def names(self):
        return {n for a in self.adapters for n in a.pairs}

    def apply(self, name, w):
        terms = [(a, a.pairs[name], a.factor(name)) for a in self.adapters if name in a.pairs]
        if not terms:
            return w
        self.used.add(name)
        ops = self.ops
        if self.mode == "merge":
            import numpy as np

            if not isinstance(w, np.ndarray):
                raise ReflexError("invalid_request", f"LoRA merge needs float weights on the host; the "
                                  f"{ops.name} backend keeps {name} on the device (use REFLEX_LORA=runtime)")
            for a, (ta, tb), c in terms:
                A = _host(a.f, ta)
                B = _host(a.f, tb)
                w += np.float32(c) * (B @ A)
            return w
        self.runtime = True
        return LoraWeight(w, [self._pair(a, ta, tb, c) for a, (ta, tb), c in terms])

    def _pair(self, a, ta, tb, c):
        """(A, B, c) as backend weights. A backend whose matmul wants an inner dimension of a
        multiple of 8 (CUDA's kernels) gets the rank padded with zero rows of A and zero
        columns of B (the same product), through its `host_weight`."""
        ops = self.ops
        rank = ta.shape[1]  # ggml [n_in, rank]
        if rank % 8 and hasattr(ops, "host_weight"):
            import numpy as np

            A, B = _host(a.f, ta), _host(a.f, tb)  # [r, n_in], [n_out, r]
            r8 = -(-rank // 8) * 8
            Ap = np.zeros((r8, A.shape[1]), np.float32)
            Ap[:rank] = A
            Bp = np.zeros((B.shape[0], r8), np.float32)
            Bp[:, :rank] = B
            return ops.host_weight(Ap, ta.name), ops.host_weight(Bp, tb.name), float(c)
        return ops.load_weight(a.f, ta.name), ops.load_weight(a.f, tb.name), float(c)

    def check_used(self):
        unused = sorted(self.names() - self.used)
        if unused:
            raise ReflexError("invalid_request", f"LoRA adapter tensors for {', '.join(unused[:4])} "
                              f"match no weight the model uses")


def _host(f, t):
    """A tensor of an adapter as float32 numpy, numpy order."""
    import numpy as np

    from .quants import dequantize

    shape = tuple(reversed(t.shape))
    return np.asarray(dequantize(f.tensor_data(t), t.ggml_type, t.n_elements), dtype=np.float32).reshape(shape)


class LoraOps:
    """Backend ops whose matmuls also take LoraWeight handles (runtime mode): the base
    product, then + c * (x A^T) B^T per term, with the backend's own ops. Everything else
    is the wrapped backend's."""

    def __init__(self, ops):
        self._ops = ops

    def __getattr__(self, name):
        return getattr(self._ops, name)

    def matmul(self, x, w, out=None, accumulate=False):
        ops = self._ops
        if not isinstance(w, LoraWeight):
            return ops.matmul(x, w, out=out, accumulate=accumulate)
        y = ops.matmul(x, w.base, out=out, accumulate=accumulate)
        for A, B, c in w.terms:
            t = ops.matmul(x, A)
            if c != 1.0:
                t = ops.scale(t, c)
            ops.matmul(t, B, out=y, accumulate=True)
        return y

    def matmul_n(self, x, ws):
        if not any(isinstance(w, LoraWeight) for w in ws):
            return self._ops.matmul_n(x, ws)
        return [self.matmul(x, w) for w in ws]

    def matmul_glu(self, x, w_gate, w_up, act="silu"):
        if not isinstance(w_gate, LoraWeight) and not isinstance(w_up, LoraWeight):
            return self._ops.matmul_glu(x, w_gate, w_up, act=act)
        g, u = self.matmul(x, w_gate), self.matmul(x, w_up)
        return self._ops.swiglu(g, u) if act == "silu" else self._ops.geglu(g, u)
