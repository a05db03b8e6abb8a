"""One Batch: the tokens a forward pass runs, where they sit, and who sees whom.

A batch is token ids at rope positions, stored at state slots. An ordinary
(causal) batch has slots == positions. A masked batch (system1's candidates,
a padded graph bucket) gives `allowed`, a numpy bool [N, n_kv] (query n may
see slot j), and `key_pos`, the position of every slot 0..n_kv-1 (for sliding
windows); it then attends through an explicit additive mask.

A batch may span several sequences of per-sequence state (recurrent layers):
`seqs`, a numpy int32 [N] or None (every token in sequence 0), gives each token's;
system1 runs each candidate in its own sequence, forked from the prompt's.

Models read `ids`, `pos`, `slots`, `seqs`, `n`, `n_kv` and call `attention_args(window)`.
A batch built with `Batch.fixed` keeps its ids, positions, slots and masks in
device buffers of its own that `fill` overwrites: a captured graph replays with
new data.
"""

from __future__ import annotations

import numpy as np


def attention_mask(allowed, pos, key_pos, window=0):
    """The additive mask `ops.attention` takes (float32: 0 visible, -inf hidden) for the bool
    visibility `allowed` [N, n_kv], narrowed to a sliding window on positions when window
    > 0: query n sees key j only while pos[n] - key_pos[j] < window. window may also be
    ("chunk", c): chunked attention, query n sees key j only from the start of its chunk,
    key_pos[j] >= pos[n] - pos[n] % c (Batch.attention_args' key for it)."""
    vis = allowed
    p = np.asarray(pos)[:, None].astype(np.int64)
    if isinstance(window, tuple):
        c = window[1]
        vis = vis & (np.asarray(key_pos)[None, :] >= p - p % c)
    elif window > 0:
        vis = vis & ((p - np.asarray(key_pos)[None, :]) < window)
    return np.where(vis, np.float32(0), np.float32(-np.inf))


class Batch:
    def __init__(self, ops, ids, pos, slots=None, allowed=None, key_pos=None, seqs=None):
        self.seqs = None if seqs is None else np.asarray(seqs, dtype=np.int32).reshape(-1)
        self.ids = np.asarray(ids, dtype=np.int32).reshape(-1)
        self.n = len(self.ids)
        pos_np = np.asarray(pos, dtype=np.int32).reshape(-1)
        slots_np = pos_np if slots is None else np.asarray(slots, dtype=np.int32).reshape(-1)
        self.pos_np, self.slots_np = pos_np, slots_np
        self.n_kv = int(slots_np.max()) + 1 if self.n else 0
        self.pos = ops.positions(pos_np)
        self.slots = self.pos if slots is None else ops.positions(slots_np)
        self.masked = allowed is not None
        self.allowed, self.key_pos = allowed, key_pos
        self._ops = ops
        self.masks = {}  # window -> the backend mask array

    @classmethod
    def fixed(cls, ops, n, n_kv, masked, windows=(), own_slots=False):
        """A batch of n tokens whose data lives in device buffers (see `fill`): ids, positions,
        slots (their own buffer when own_slots, else the positions) and, when masked, one
        float32 [n, n_kv] mask per sliding window in `windows`."""
        b = cls.__new__(cls)
        b.n, b.n_kv, b.masked = n, n_kv, masked
        b.ids = ops.empty((n,), "int32")
        b.pos = ops.empty((n,), "int32")
        b.slots = ops.empty((n,), "int32") if own_slots else b.pos
        b.pos_np = b.slots_np = b.allowed = b.key_pos = b.seqs = None
        b._ops = ops
        b.masks = {w: ops.empty((n, n_kv)) for w in windows} if masked else {}
        return b

    def fill(self, ids, pos, slots=None, masks=None):
        """Copy host data (int32 ids, positions, slots; masks: window -> float32) into a
        fixed batch's buffers."""
        ops = self._ops
        ops.write(self.ids, ids)
        ops.write(self.pos, pos)
        if self.slots is not self.pos:
            ops.write(self.slots, slots)
        for w, m in (masks or {}).items():
            ops.write(self.masks[w], m)

    def attention_args(self, window=0, chunk=0):
        """Keyword arguments for ops.attention: causal (with an optional sliding window, or
        chunked attention's chunk size) or an explicit additive mask built from `allowed`
        (and the window or chunks, on key positions; masks keyed by window, or ("chunk", c))."""
        if not self.masked:
            return {"causal": True, "window": window, "mask": None, **({"chunk": chunk} if chunk else {})}
        if chunk:
            window = ("chunk", int(chunk))
        m = self.masks.get(window)
        if m is None:
            if self.allowed is None:  # a fixed batch asked for a window it has no mask for
                raise KeyError(f"no mask for sliding window {window}")
            m = self._ops.asarray(attention_mask(self.allowed, self.pos_np, self.key_pos, window))
            self.masks[window] = m
        return {"causal": False, "window": 0, "mask": m}
