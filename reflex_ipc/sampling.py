"""Token selection from a row of logits (numpy), in llama.cpp's sampler order.

repetition penalty -> top-k -> top-p -> min-p -> temperature -> draw.
Temperature <= 0 means greedy (argmax, first index on ties). The draw uses
numpy's PCG64 seeded with `seed`, so one seed gives one sequence of tokens
(seed None: fresh entropy).
"""

from __future__ import annotations

import numpy as np


def apply_repeat_penalty(logits, recent_ids, penalty):
    """llama.cpp's repetition penalty, in place on float logits: every distinct token among
    `recent_ids` has a positive logit divided by `penalty`, a negative one multiplied by it."""
    if penalty == 1.0 or not len(recent_ids):
        return logits
    ids = np.unique(np.asarray(recent_ids, dtype=np.int64))
    ids = ids[(ids >= 0) & (ids < logits.shape[-1])]
    v = logits[ids]
    logits[ids] = np.where(v > 0, v / penalty, v * penalty)
    return logits


class Sampler:
    def __init__(self, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, seed=None):
        self.temperature = float(temperature)
        self.top_k = int(top_k)
        self.top_p = float(top_p)
        self.min_p = float(min_p)
        self._seed = seed
        self._rng = None

    @property
    def rng(self):
        """The seeded generator, made at the first draw: numpy.random is not imported by
        greedy decoding (it costs ~20 ms of a cold start)."""
        if self._rng is None:
            self._rng = np.random.default_rng(self._seed)
        return self._rng

    @property
    def greedy(self):
        return self.temperature <= 0.0

    def __call__(self, logits) -> int:
        """The chosen token id for a 1-D logits array."""
        logits = np.asarray(logits)
        if self.greedy:
            return int(np.argmax(logits))
        z = logits.astype(np.float64)
        n = z.shape[0]
        if 0 < self.top_k < n:
            idx = np.argpartition(-z, self.top_k - 1)[:self.top_k]
        else:
            idx = np.arange(n)
        idx = idx[np.lexsort((idx, -z[idx]))]  # best first, lower id first on ties
        zs = z[idx]
        if self.top_p < 1.0:
            p = np.exp(zs - zs[0])
            c = np.cumsum(p / p.sum())
            keep = int(np.searchsorted(c, self.top_p)) + 1  # up to the token reaching top_p
            zs, idx = zs[:keep], idx[:keep]
        if self.min_p > 0.0:
            keep = max(1, int(np.count_nonzero(zs >= zs[0] + np.log(self.min_p))))
            zs, idx = zs[:keep], idx[:keep]
        p = np.exp((zs - zs[0]) / self.temperature)
        c = np.cumsum(p)
        u = self.rng.random() * c[-1]
        return int(idx[min(int(np.searchsorted(c, u, side="right")), len(idx) - 1)])
