"""Captured-graph replays of a model's forward pass, for backends with `ops.capture`.

A graph replays every kernel a forward pass launched, with the same arguments and
buffers, in one launch: a small batch's cost is then the GPU's work, not the
launch overhead of each op. What changes between replays (ids, positions, slots,
masks) lives in a fixed batch's device buffers (Batch.fixed), written before each
launch. Graphs hold the state's addresses: the executor drops them when it
replaces the state.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from .batch import Batch, attention_mask


def capture_step(ops, fn):
    """(graph, fn's result) with the step done once: captured, then launched; on a backend
    whose capture runs fn for real (`capture_runs`: the CPU records the C calls as they
    run) the recorded run is the step, so it is not computed a second time by a launch
    (a one-shot generate's first decode step cost two forward passes)."""
    if getattr(ops, "capture_runs", False):
        return ops.capture(fn, run=True)
    graph, out = ops.capture(fn)
    graph.launch()
    return graph, out


class DecodeGraph:
    """One ordinary decode step (one token, slot == position) replayed from a graph.

        logits = g(token_id, pos)   # float32 backend array [1, n_vocab], reused by every call
        g.argmax()                  # the greedy token of the last call, computed in the graph

    The first call captures model.forward plus an argmax into a device buffer."""

    def __init__(self, ops, model, state):
        self.ops, self.model, self.state = ops, model, state
        self.batch = Batch.fixed(ops, 1, state.n_slots, masked=False)
        self.next_id = ops.empty((1,), "int32")
        self._host = np.empty(2, np.int32)
        self.graph = None
        self.logits = None

    def __call__(self, token, pos):
        self._host[0], self._host[1] = token, pos
        self.batch.fill(self._host[:1], self._host[1:])
        if self.graph is None:
            def step():
                out = self.model.forward(self.state, self.batch)
                self.ops.argmax(out, out=self.next_id)
                return out

            self.graph, self.logits = capture_step(self.ops, step)
        else:
            self.graph.launch()
        return self.logits

    def argmax(self):
        return int(self.ops.to_numpy(self.next_id)[0])

    def close(self):
        if self.graph is not None:
            self.graph.close()
            self.graph = None


class ForwardGraphs:
    """Replays of model.forward for small batch shapes seen before.

        out = fg(ids, pos, slots, allowed, key_pos, rows, output)   # None: run it eagerly
        fg.saw(batch, rows, output)   # after an eager run: its next occurrence is captured

    Batches of up to 64 tokens whose kept rows end at the last token (a prefill chunk's
    last row; system1's one pass) are padded to a bucket of BUCKETS tokens: the real
    tokens last in batch order, padding first, so that prompts of different lengths share
    a graph. Padding tokens are stored at slots after every real one, which no real token
    sees (causal: later slots; masked: -inf), and their rows are not returned. A masked
    batch attends through masks over all the state's slots (which the state keeps finite:
    it starts zeroed), so where its slots start does not matter either. A shape is
    (bucket, rows kept from the end, masked, output). The returned array is reused by the
    next call of the same shape."""

    BUCKETS = (8, 16, 24, 32, 48, 64)
    MAX_GRAPHS = 8

    def __init__(self, ops, model, state):
        self.ops, self.model, self.state = ops, model, state
        self.entries = OrderedDict()  # key -> (graph, batch, out)
        self.seen = {}  # key -> the sliding windows the model asked masks for
        self.failed = set()  # keys whose capture failed: always eager
        self.captures = 0
        self.replays = 0

    def _plan(self, n, pos, slots, masked, rows, output):
        """(key, bucket) for a batch, or None when it is not replayed from a graph."""
        if rows is None or rows.stop != n or not 0 <= (rows.start or 0) < n or n > self.BUCKETS[-1]:
            return None
        nb = next(b for b in self.BUCKETS if b >= n)
        if (slots is None) == masked:  # masked batches give their slots, causal ones do not
            return None
        if int((slots if masked else pos).max()) + (nb - n) >= self.state.n_slots:
            return None  # no room for the padding after the last real slot
        return (nb, n - (rows.start or 0), masked, output), nb

    def saw(self, batch, rows=None, output="logits"):
        own = batch.slots is not batch.pos
        plan = self._plan(batch.n, batch.pos_np, batch.slots_np if own else None, batch.masked, rows, output)
        if plan is not None:
            self.seen.setdefault(plan[0], tuple(batch.masks))

    def __call__(self, ids, pos, slots=None, allowed=None, key_pos=None, rows=None, output="logits"):
        ids = np.ascontiguousarray(ids, dtype=np.int32).reshape(-1)
        n = ids.size
        pos = np.ascontiguousarray(pos, dtype=np.int32).reshape(-1)
        if slots is not None:
            slots = np.ascontiguousarray(slots, dtype=np.int32).reshape(-1)
        masked = allowed is not None
        plan = self._plan(n, pos, slots, masked, rows, output) if n else None
        if plan is None:
            return None
        key, nb = plan
        entry = self.entries.get(key)
        if entry is None:
            windows = self.seen.get(key)
            if windows is None or key in self.failed:
                return None
            data = self._padded(nb, ids, pos, slots, allowed, key_pos, windows)
            try:
                entry = self._capture(key, nb, masked, windows, data)  # captured and done
            except Exception:
                self.failed.add(key)  # e.g. a mask window the eager run did not show: stay eager
                return None
        else:
            self.entries.move_to_end(key)
            entry[1].fill(*self._padded(nb, ids, pos, slots, allowed, key_pos, tuple(entry[1].masks)))
            entry[0].launch()
        self.replays += 1
        return entry[2]

    def _padded(self, nb, ids, pos, slots, allowed, key_pos, windows):
        """Host arrays for a bucket of nb: (ids, positions, slots, masks by window). Padding
        goes to the slots after the last real one; a masked batch's masks cover every slot
        of the state (a padding token sees only itself)."""
        n = ids.size
        pad = nb - n
        ids_p = np.concatenate([np.zeros(pad, np.int32), ids])
        if allowed is None:  # causal: slots = positions
            pos_p = np.concatenate([int(pos.max()) + 1 + np.arange(pad, dtype=np.int32), pos])
            return ids_p, pos_p, pos_p, {}
        pos_p = np.concatenate([np.zeros(pad, np.int32), pos])
        pad_slots = int(slots.max()) + 1 + np.arange(pad, dtype=np.int32)
        slots_p = np.concatenate([pad_slots, slots])
        masks = {}
        for w in windows:
            m = np.full((nb, self.state.n_slots), -np.inf, dtype=np.float32)
            real = attention_mask(allowed, pos, key_pos, w)
            m[pad:, :real.shape[1]] = real
            m[np.arange(pad), pad_slots] = 0
            masks[w] = m
        return ids_p, pos_p, slots_p, masks

    def _capture(self, key, nb, masked, windows, data):
        ops = self.ops
        batch = Batch.fixed(ops, nb, self.state.n_slots, masked, windows, own_slots=masked)
        batch.fill(*data)
        rows = slice(nb - key[1], nb)
        graph, out = capture_step(ops, lambda: self.model.forward(self.state, batch, rows=rows, output=key[3]))
        while len(self.entries) >= self.MAX_GRAPHS:
            _, (old, _, _) = self.entries.popitem(last=False)
            old.close()
        self.entries[key] = (graph, batch, out)
        self.captures += 1
        return self.entries[key]

    def close(self):
        for graph, _, _ in self.entries.values():
            graph.close()
        self.entries.clear()
