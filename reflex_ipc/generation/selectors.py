"""Selectors: the last stage of generation, one token id from a row of logits (numpy).

`Greedy` takes the largest logit (first index on ties). `Sampler` truncates and draws
in llama.cpp's order of samplers after the logit processors:

    top-k -> typical-p -> top-p -> min-p -> temperature -> seeded draw

The draw uses numpy's PCG64 seeded with `seed`, so one seed gives one sequence of
tokens (seed None: fresh entropy); it is not llama.cpp's mt19937, so seeded samples are
compared with llama.cpp by their distribution, not token by token.
"""

from __future__ import annotations

import numpy as np


class Greedy:
    greedy = True
    temperature = 0.0

    def __call__(self, logits) -> int:
        return int(np.argmax(logits))


class Sampler:
    def __init__(self, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, seed=None, typical_p=1.0):
        self.temperature = float(temperature)
        self.top_k = int(top_k)
        self.top_p = float(top_p)
        self.min_p = float(min_p)
        self.typical_p = float(typical_p)
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

    def candidates(self, logits):
        """(ids, logits float64) left after the truncations, best first (lower id first on
        ties); temperature not applied."""
        z = np.asarray(logits).astype(np.float64)
        n = z.shape[0]
        if 0 < self.top_k < n:
            idx = np.argpartition(-z, self.top_k - 1)[:self.top_k]
        else:
            idx = np.arange(n)
        idx = idx[np.lexsort((idx, -z[idx]))]  # best first, lower id first on ties
        zs = z[idx]
        if zs[0] == -np.inf:  # nothing is allowed: leave the choice to the first (as argmax)
            return idx[:1], zs[:1]
        finite = np.isfinite(zs)
        if not finite.all():  # masked tokens (-inf) never come back
            idx, zs = idx[finite], zs[finite]
        if self.typical_p < 1.0:
            idx, zs = _typical(idx, zs, self.typical_p)
        if self.top_p < 1.0:
            p = np.exp(zs - zs[0])
            c = np.cumsum(p / p.sum())
            keep = int(np.searchsorted(c, self.top_p)) + 1  # up to the token reaching top_p
            zs, idx = zs[:keep], idx[:keep]
        if self.min_p > 0.0:
            keep = max(1, int(np.count_nonzero(zs >= zs[0] + np.log(self.min_p))))
            zs, idx = zs[:keep], idx[:keep]
        return idx, zs

    def __call__(self, logits) -> int:
        """The chosen token id for a 1-D logits array."""
        logits = np.asarray(logits)
        if self.greedy:
            return int(np.argmax(logits))
        idx, zs = self.candidates(logits)
        p = np.exp((zs - zs[0]) / self.temperature)
        c = np.cumsum(p)
        u = self.rng.random() * c[-1]
        return int(idx[min(int(np.searchsorted(c, u, side="right")), len(idx) - 1)])


def _typical(idx, zs, mass):
    """Locally typical sampling (Meister et al.): keep the tokens whose surprise -log p is
    closest to the distribution's entropy, most typical first, until their probabilities
    add up to more than `mass` (at least one token). Returned best first again, as the
    truncations after it expect."""
    p = np.exp(zs - zs[0])
    p /= p.sum()
    with np.errstate(divide="ignore"):
        surprise = -np.log(p)
    nz = p > 0
    entropy = float(-(p[nz] * np.log(p[nz])).sum())
    order = np.argsort(np.abs(surprise - entropy), kind="stable")
    c = np.cumsum(p[order])
    keep = int(np.searchsorted(c, mass, side="right")) + 1  # the first whose sum passes mass
    kept = np.sort(order[:min(keep, len(order))])  # back to best-first order
    return idx[kept], zs[kept]
