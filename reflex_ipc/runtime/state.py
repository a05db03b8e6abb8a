"""Model-owned state: what a model keeps for the tokens it has seen.

A model declares, per layer, the arrays it needs (`model.state_spec()`), and
`State` allocates them on the backend. Two kinds of layer state exist:

- `SlotSpec`: rows indexed by cache slot, one per token (attention K and V of
  the layer's own shape; a compressed latent for multi-head latent attention).
  Each array has one axis of length n_slots (marked None in the spec). A
  prefix of the slots is a prefix of the sequence: truncating is free,
  growing copies the filled rows.
- `SeqSpec`: fixed-size arrays per sequence (the conv and recurrent state of a
  linear-attention or SSM layer), with a leading axis of n_seq. They summarize
  every token seen, so they cannot be truncated to a shorter prefix; `fork`
  copies one sequence's state into others (system1's candidates).

`State.tokens` holds the ids whose state is stored (slots 0..len-1 and the
per-sequence state of sequence 0); the executor keeps it current and reuses
the longest common prefix between requests.
"""

from __future__ import annotations

import math


class SlotSpec:
    """Per-slot arrays: name -> shape with None where the slot axis goes. exact: keep them in
    the backend's `exact_kv_dtype` (float32 on CUDA) rather than its `kv_dtype` (float16 on
    CUDA and the cpu backend): deepseek2's MLA latent, which both keys and values are made of."""

    kind = "slot"

    def __init__(self, *, exact=False, **arrays):
        for name, shape in arrays.items():
            if list(shape).count(None) != 1:
                raise ValueError(f"{name}: a slot array has exactly one slot axis (None)")
        self.arrays = arrays
        self.exact = exact

    def shape(self, name, n_slots):
        return tuple(n_slots if s is None else int(s) for s in self.arrays[name])

    def slot_axis(self, name):
        return list(self.arrays[name]).index(None)

    def bytes_per_slot(self, itemsize):
        return sum(math.prod(s for s in shape if s is not None) for shape in self.arrays.values()) * itemsize


class SeqSpec:
    """Per-sequence arrays of fixed size: name -> shape (without the sequence axis)."""

    kind = "seq"
    dtype = "float32"  # a recurrence accumulates: kept in float32 whatever the KV dtype

    def __init__(self, **arrays):
        self.arrays = arrays

    def shape(self, name, n_seq):
        return (n_seq,) + tuple(int(s) for s in self.arrays[name])

    def bytes_per_seq(self, itemsize):
        return sum(math.prod(shape) for shape in self.arrays.values()) * itemsize


def attention_spec(n_kv_heads, head_dim_k, head_dim_v=None):
    """An attention layer's K [Hkv, n_slots, dk] and V [Hkv, n_slots, dv]."""
    return SlotSpec(k=(n_kv_heads, None, head_dim_k), v=(n_kv_heads, None, head_dim_v or head_dim_k))


class LayerState:
    """One layer's arrays, as attributes (`layer.k`, `layer.v`, ...)."""

    def __init__(self, spec, arrays):
        self.spec = spec
        self.arrays = arrays
        self.__dict__.update(arrays)


class State:
    """The arrays of every layer for n_slots slots and n_seq sequences."""

    def __init__(self, ops, specs, n_slots, n_seq=1, dtype=None):
        self.ops, self.specs = ops, list(specs)
        self.dtype = dtype or ops.kv_dtype
        self.n_slots, self.n_seq = int(n_slots), int(n_seq)
        self.tokens: list = []
        self.layers = [self._alloc(spec) for spec in self.specs]

    def _dtype(self, spec):
        if spec.kind != "slot":
            return spec.dtype
        return (getattr(self.ops, "exact_kv_dtype", None) or self.dtype) if spec.exact else self.dtype

    def _alloc(self, spec):
        n = self.n_slots if spec.kind == "slot" else self.n_seq
        # zeroed: masked attention may read slots no token was stored at (with -inf weight,
        # which must meet a finite score), and a recurrence starts from zeros
        return LayerState(spec, {name: self.ops.zeros(spec.shape(name, n), self._dtype(spec))
                                 for name in spec.arrays})

    @property
    def recurrent(self) -> bool:
        """Whether some layer keeps per-sequence state (which cannot be truncated)."""
        return any(s.kind == "seq" for s in self.specs)

    @staticmethod
    def nbytes(specs, n_slots, n_seq, itemsize):
        """What State(specs, n_slots, n_seq) allocates, in bytes (known before allocating);
        itemsize is the slot arrays' (per-sequence arrays are float32)."""
        return sum(s.bytes_per_slot(itemsize) * n_slots if s.kind == "slot" else s.bytes_per_seq(4) * n_seq
                   for s in specs)

    # -- sequence bookkeeping --------------------------------------------------------
    def truncate(self, n) -> bool:
        """Keep the state of the first n tokens. Always possible for slot state (the rows
        past n are simply no longer counted); per-sequence state only when nothing is cut.
        Returns whether the state now holds tokens[:n]; if not, it holds nothing."""
        n = max(0, min(int(n), len(self.tokens)))
        if n == len(self.tokens):
            return True
        kept = 0 if self.recurrent else n
        self.tokens = self.tokens[:kept]
        if kept == 0:
            self.clear()
        return kept == n

    def clear(self):
        """Hold no tokens; per-sequence state back to zeros (a new sequence starts from it)."""
        import numpy as np

        self.tokens = []
        for layer in self.layers:
            if layer.spec.kind == "seq":
                for a in layer.arrays.values():
                    self.ops.write(a, np.zeros(a.shape, layer.spec.dtype))

    def grown(self, n_slots, n_seq=None):
        """A State of n_slots slots and n_seq sequences (>= this one's) holding this one's
        tokens, rows and sequences."""
        new = State(self.ops, self.specs, n_slots, max(self.n_seq, n_seq or 0), self.dtype)
        n = len(self.tokens)
        for old_l, new_l in zip(self.layers, new.layers):
            for name, a in old_l.arrays.items():
                if old_l.spec.kind == "seq":
                    self.ops.copy(a, out=new_l.arrays[name][:self.n_seq])
                elif n:
                    _copy_slots(self.ops, a, new_l.arrays[name], old_l.spec.slot_axis(name), n)
        new.tokens = list(self.tokens)
        return new

    def fork(self, src, dsts):
        """Copy sequence src's per-sequence state into sequences dsts (slot state is shared
        between sequences: they see each other's slots only through attention masks)."""
        for layer in self.layers:
            if layer.spec.kind == "seq":
                for a in layer.arrays.values():
                    for d in dsts:
                        self.ops.copy(a[src], out=a[d])

    # -- host copies (saved state) -----------------------------------------------------
    def snapshot(self):
        """(tokens, [{name: numpy array}] per layer) of the filled part: slot arrays cut to
        len(tokens) slots, per-sequence arrays of sequence 0."""
        import numpy as np

        n = len(self.tokens)
        out = []
        for layer in self.layers:
            d = {}
            for name, a in layer.arrays.items():
                h = self.ops.to_numpy(a)
                if layer.spec.kind == "seq":
                    d[name] = np.ascontiguousarray(h[0])
                else:
                    ax = layer.spec.slot_axis(name)
                    d[name] = np.ascontiguousarray(np.take(h, np.arange(n), axis=ax))
            out.append(d)
        return list(self.tokens), out

    def restore(self, tokens, layers):
        """Load a snapshot (as `snapshot` returns it; arrays are cast to this state's dtype).
        ValueError when its shapes do not fit this state."""
        import numpy as np

        n = len(tokens)
        if n > self.n_slots or len(layers) != len(self.layers):
            raise ValueError(f"a snapshot of {len(layers)} layers and {n} tokens does not fit "
                             f"{len(self.layers)} layers of {self.n_slots} slots")
        for layer, d in zip(self.layers, layers):
            if set(d) != set(layer.arrays):
                raise ValueError(f"snapshot arrays {sorted(d)} differ from {sorted(layer.arrays)}")
            for name, a in layer.arrays.items():
                src = np.asarray(d[name])
                if layer.spec.kind == "seq":
                    want = tuple(a.shape[1:])
                    if src.shape != want:
                        raise ValueError(f"{name}: snapshot shape {src.shape} != {want}")
                    self.ops.write(a[0], src.astype(layer.spec.dtype))
                else:
                    want = layer.spec.shape(name, n)
                    if src.shape != want:
                        raise ValueError(f"{name}: snapshot shape {src.shape} != {want}")
                    if n:
                        _write_slots(self.ops, a, src.astype(self._dtype(layer.spec)), layer.spec.slot_axis(name),
                                     n)
        self.tokens = list(tokens)


def _copy_slots(ops, src, dst, axis, n):
    """dst[..., :n, ...] = src[..., :n, ...] along the slot axis, as contiguous runs (views)."""
    if axis == 0:
        ops.copy(src[:n], out=dst[:n])
        return
    for i in range(src.shape[0]):
        _copy_slots(ops, src[i], dst[i], axis - 1, n)


def _write_slots(ops, dst, src, axis, n, start=0):
    """dst[..., start:start + n, ...] = src (numpy, n along the slot axis), as contiguous
    runs."""
    if axis == 0:
        ops.write(dst[start:start + n], src)
        return
    for i in range(dst.shape[0]):
        _write_slots(ops, dst[i], src[i], axis - 1, n, start)
