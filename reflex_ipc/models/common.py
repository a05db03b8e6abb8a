"""What the architecture modules share: hyperparameters, tensor loading, the batch.

Hyperparameters come only from GGUF metadata, with llama.cpp's key names and
defaults. A model module defines `class Model` with

    Model(ops, f)                      load weights through the backend `ops`
    model.forward(cache, batch, rows=None, output="logits", check=None)

`forward` runs `batch` (token ids at given positions, stored at given cache
slots) through every layer, then keeps the rows `rows` (a slice; None = all)
and returns the final-normed hidden states [R, n_embd] (output="hidden") or
the logits [R, n_vocab] (output="logits"). `check()`, when given, is called
before every layer (cancellation).
"""

from __future__ import annotations

import math

from ..errors import ReflexError


class HParams:
    """The hyperparameters every decoder here needs, from `{arch}.*` keys."""

    def __init__(self, f):
        self.arch = arch = f.architecture

        def get(key, default=None, required=False):
            v = f.get(f"{arch}.{key}", default)
            if v is None and required:
                raise ReflexError("gguf_error", f"metadata key {arch}.{key} is missing")
            return v

        def scalar(key, default=None, required=False):
            v = get(key, default, required)
            if isinstance(v, list):  # per-layer arrays: only uniform ones are supported here
                if not v or any(x != v[0] for x in v):
                    raise ReflexError("unsupported_architecture",
                                      f"{arch}.{key} varies per layer ({v[:8]}...)")
                v = v[0]
            return v

        self.n_layer = int(scalar("block_count", required=True))
        self.n_embd = int(scalar("embedding_length", required=True))
        self.n_ff = int(scalar("feed_forward_length", required=True))
        self.n_head = int(scalar("attention.head_count", required=True))
        self.n_head_kv = int(scalar("attention.head_count_kv", self.n_head))
        if self.n_head <= 0 or self.n_head_kv <= 0 or self.n_head % self.n_head_kv:
            raise ReflexError("gguf_error", f"{self.n_head} heads cannot share {self.n_head_kv} KV heads")
        self.head_dim = int(scalar("attention.key_length", self.n_embd // self.n_head))
        self.head_dim_v = int(scalar("attention.value_length", self.n_embd // self.n_head))
        if self.head_dim_v != self.head_dim:
            raise ReflexError("unsupported_architecture",
                              f"key length {self.head_dim} != value length {self.head_dim_v}")
        self.n_rot = int(scalar("rope.dimension_count", self.head_dim))
        self.eps = float(scalar("attention.layer_norm_rms_epsilon", required=True))
        self.rope_base = float(scalar("rope.freq_base", 10000.0))
        scaling = get("rope.scaling.type", "linear")
        if scaling not in ("none", "linear"):
            raise ReflexError("unsupported_architecture", f"rope scaling {scaling!r} is not supported")
        factor = scalar("rope.scaling.factor") or scalar("rope.scale_linear") or 0.0
        self.rope_scale = 1.0 / factor if factor else 1.0
        self.n_ctx_train = int(scalar("context_length", 0) or 0)
        self.attn_scale = float(scalar("attention.scale", 0.0) or 0.0)
        self.final_softcap = float(scalar("final_logit_softcapping", 0.0) or 0.0)
        tokens = f.metadata.get("tokenizer.ggml.tokens")
        self.n_vocab = int(scalar("vocab_size", 0) or (len(tokens) if tokens is not None else 0))
        self._get = get

    def get(self, key, default=None):
        return self._get(key, default)


class Weights:
    """Loads tensors of f through the backend, with a clear error for a missing one."""

    def __init__(self, ops, f):
        self.ops, self.f = ops, f

    def has(self, name):
        return name in self.f.tensors

    def __call__(self, name, optional=False):
        if name not in self.f.tensors:
            if optional:
                return None
            raise ReflexError("gguf_error", f"tensor {name!r} is missing from {self.f.path}")
        return self.ops.load_weight(self.f, name)

    def output(self):
        """The LM head: output.weight, else the tied token embedding (llama.cpp's fallback)."""
        return self("output.weight") if self.has("output.weight") else self("token_embd.weight")


class Batch:
    """Tokens to run: ids, rope positions, cache slots, and who may attend to whom.

    Ordinary (causal) batches have slots == positions. A masked batch (system1)
    gives `allowed`, a numpy bool [N, n_kv] (query n may see slot j), and
    `key_pos`, the position of every slot 0..n_kv-1 (for sliding windows).
    """

    def __init__(self, ops, ids, pos, slots=None, allowed=None, key_pos=None):
        import numpy as np

        self.ids = np.asarray(ids, dtype=np.int32).reshape(-1)
        self.n = len(self.ids)
        pos_np = np.asarray(pos, dtype=np.int32).reshape(-1)
        slots_np = pos_np if slots is None else np.asarray(slots, dtype=np.int32).reshape(-1)
        self.pos_np, self.slots_np = pos_np, slots_np
        self.n_kv = int(slots_np.max()) + 1 if self.n else 0
        self.pos = ops.positions(pos_np)
        self.slots = self.pos if slots is None else ops.positions(slots_np)
        self.allowed, self.key_pos = allowed, key_pos
        self._ops = ops
        self._masks = {}

    def attention_args(self, window=0):
        """Keyword arguments for ops.attention: causal (with an optional sliding window) or an
        explicit additive mask built from `allowed` (and the window, on key positions)."""
        if self.allowed is None:
            return {"causal": True, "window": window, "mask": None}
        m = self._masks.get(window)
        if m is None:
            from ..backends.base import attention_mask

            m = self._ops.asarray(attention_mask(self.allowed, self.pos_np, self.key_pos, window))
            self._masks[window] = m
        return {"causal": False, "window": 0, "mask": m}


def attention_block(ops, hp, cache, layer, batch, q, k, v, *, scale, window=0, softcap=0.0):
    """Store k, v [N, Hkv, hd] at the batch's slots, attend with q [N, Hq, hd] -> [N, Hq*hd]."""
    ops.kv_store(cache, layer, k, v, batch.slots)
    out = ops.attention(q, cache, layer, batch.slots, batch.n_kv, scale=scale, softcap=softcap,
                        **batch.attention_args(window))
    return out.reshape(batch.n, hp.n_head * hp.head_dim)


def linear(ops, x, w, b=None):
    """x @ w.T (+ b)."""
    return bias(ops, ops.matmul(x, w), b)


def bias(ops, y, b):
    """y + b, or y itself when b is None."""
    return ops.add(y, b) if b is not None else y


def residual(ops, x, a, w, b=None):
    """x += a @ w.T (+ b), in place on x: x + (a @ w.T + b) as with separate ops, the
    product added into x by the matmul itself when there is no bias. x must be an array
    that nothing else reads as the old value (the model's own hidden state)."""
    if b is None:
        ops.matmul(a, w, out=x, accumulate=True)
    else:
        ops.add(x, linear(ops, a, w, b), out=x)
    return x


def default_attn_scale(hp):
    return hp.attn_scale if hp.attn_scale else 1.0 / math.sqrt(hp.head_dim)
