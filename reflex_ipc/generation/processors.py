"""Logit processors: the stages between the model's logits and the selector.

A processor changes a row of logits (numpy float32 [n_vocab], in place) before a token
is chosen: `apply(row, history)`, where history is the token ids the choice continues
(prompt, then what was generated). `accept(token_id)` is told each token taken.
They run in llama.cpp's order of samplers:

    logit bias -> penalties (repeat, frequency, presence) -> DRY -> thinking budget

(then the selector: selectors.py). Each is built only when its parameters ask for it
(`build`), so a plain greedy request runs none and keeps its argmax on the device. The
arithmetic is float32, as llama.cpp's, so that greedy decoding after a processor picks
the same token as llama.cpp does.

The grammar constraint is a stage of its own (`ConstraintStage`): it masks the logits
on the backend (the argmax can then stay on the device) and says when it is done.
"""

from __future__ import annotations

import numpy as np

from ..errors import ReflexError

F32 = np.float32


def _bad(msg):
    return ReflexError("invalid_request", msg)


class LogitBias:
    """Adds a fixed bias to chosen tokens' logits (OpenAI's and llama.cpp's logit_bias)."""

    def __init__(self, bias: dict, n_vocab: int):
        ids = [int(k) for k in bias]
        bad = [i for i in ids if not 0 <= i < n_vocab]
        if bad:
            raise _bad(f"logit_bias: token id {bad[0]} is outside the vocabulary (0..{n_vocab - 1})")
        self.ids = np.asarray(ids, np.int64)
        self.bias = np.asarray([float(v) for v in bias.values()], F32)

    def apply(self, row, history):
        row[self.ids] += self.bias

    def accept(self, token_id):
        pass


class Penalties:
    """llama.cpp's penalties over the last `last_n` tokens of the history (-1: all of it):
    each distinct token there has a positive logit divided by `repeat` (a negative one
    multiplied), then `frequency` times its count and `presence` subtracted."""

    def __init__(self, repeat=1.0, frequency=0.0, presence=0.0, last_n=64):
        self.repeat, self.frequency, self.presence = F32(repeat), F32(frequency), F32(presence)
        self.last_n = int(last_n)

    def apply(self, row, history):
        window = history if self.last_n < 0 else history[-self.last_n:] if self.last_n else ()
        if not len(window):
            return
        ids, counts = np.unique(np.asarray(window, np.int64), return_counts=True)
        ok = (ids >= 0) & (ids < row.shape[-1])
        ids, counts = ids[ok], counts[ok].astype(F32)
        v = row[ids]
        if self.repeat != 1.0:
            v = np.where(v <= 0, v * self.repeat, v / self.repeat).astype(F32)
        if self.frequency != 0.0 or self.presence != 0.0:
            v = v - (counts * self.frequency + self.presence)
        row[ids] = v

    def accept(self, token_id):
        pass


def apply_repeat_penalty(logits, recent_ids, penalty):
    """The repetition penalty alone, in place on float logits (every distinct token among
    `recent_ids`: a positive logit divided by `penalty`, a negative one multiplied)."""
    if penalty != 1.0 and len(recent_ids):
        Penalties(repeat=penalty, last_n=-1).apply(logits, list(recent_ids))
    return logits


# -- DRY ("don't repeat yourself", koboldcpp's sampler as llama.cpp runs it) ---------------

DRY_MAX_BREAKER_CHARS = 40  # llama.cpp truncates a sequence breaker to this many bytes
DRY_MAX_BREAKER_TAIL = 20  # and the tokens after a breaker's first one to this many
FLOAT_MAX_LOG = 88.7228391  # log of float32's largest value: bounds the penalty's exponent


def dry_breakers(tok, breakers) -> dict:
    """{head token id: [tail tuples]} for the sequence breakers: a token whose text contains
    a breaker is a breaker by itself (empty tail); a token whose text ends with the start of
    a breaker heads a multi-token breaker whose tail is the rest of the breaker, tokenized.
    Built from every token's text (special tokens rendered), as llama.cpp does; memoized
    on the tokenizer."""
    key = tuple(breakers)
    memo = tok.__dict__.setdefault("_dry_breakers", {})
    out = memo.get(key)
    if out is not None:
        return out
    texts = tok.__dict__.get("_dry_texts")
    if texts is None:
        texts = tok._dry_texts = [tok.decode_bytes([i], special=True) for i in range(tok.n_vocab)]
    out = {}
    for s in breakers:
        b = s.encode("utf-8")[:DRY_MAX_BREAKER_CHARS]
        if not b:
            continue
        heads = [b[:k] for k in range(1, len(b))]
        for i, w in enumerate(texts):
            if b in w:
                tails = out.setdefault(i, [])
                if () not in tails:
                    tails.append(())
                continue
            for k, h in enumerate(heads, 1):
                if w.endswith(h):
                    rest = b[k:].decode("utf-8", "replace")
                    tail = tuple(tok.encode(rest, add_bos=False, parse_special=False)[:DRY_MAX_BREAKER_TAIL])
                    tails = out.setdefault(i, [])
                    if tail not in tails:
                        tails.append(tail)
    memo[key] = out
    return out


def _reverse_z(seq):
    """z[k] = the length of the longest common suffix of seq and seq[:len(seq) - k] (k >= 1):
    how far the text before position len - k repeats the text's end (the Z-function of the
    reversed sequence, linear time)."""
    r = seq[::-1]
    n = len(r)
    z = [0] * n
    lo = hi = 0  # r[lo:hi] == r[0:hi - lo], the rightmost such box
    for k in range(1, n):
        m = min(hi - k, z[k - lo]) if k < hi else 0
        while k + m < n and r[m] == r[k + m]:
            m += 1
        z[k] = m
        if k + m > hi:
            lo, hi = k, k + m
    return z


class Dry:
    """Penalizes a token that would extend a repetition of the text's end: if the last L
    tokens also occur earlier, followed by token t, and L >= allowed_length, t's logit drops
    by multiplier * base ** (L - allowed_length) (the longest such L per token). Repetitions
    are looked for in the last `last_n` tokens (-1: all) and never reach back past the most
    recent sequence breaker; a token that is a breaker by itself is never penalized."""

    def __init__(self, tok, multiplier, base, allowed_length, last_n, breakers):
        # float32 parameters, the penalty in double as llama.cpp computes them
        self.multiplier, self.base = float(F32(multiplier)), float(F32(base))
        self.allowed = int(allowed_length)
        self.last_n = int(last_n)
        self.breakers = dry_breakers(tok, breakers) if breakers else {}
        self.max_exp = int(F32(FLOAT_MAX_LOG) / np.log(F32(base))) if self.base > 1.000001 else 0

    def _limit(self, win):
        """How many of the last tokens may count as repeated: those after the most recent
        sequence breaker (its head at distance i from the end, its tail after it)."""
        n = len(win)
        for i in range(n):
            tails = self.breakers.get(win[n - 1 - i])
            if tails is None:
                continue
            longest = -1
            for tail in tails:
                L = len(tail)
                if longest < L <= i and all(tail[o] == win[n - i + o] for o in range(L)):
                    longest = L
            if longest >= 0:
                return i - longest
        return n

    def apply(self, row, history):
        win = list(history if self.last_n < 0 else history[-self.last_n:])
        n = len(win)
        if n <= self.allowed:
            return
        limit = self._limit(win)
        if limit < self.allowed:
            return
        z = _reverse_z(win)
        worst = {}
        for k in range(1, n):
            m = min(z[k], limit)
            if m >= self.allowed:
                t = win[n - k]  # the token that followed the earlier occurrence
                if m > worst.get(t, -1):
                    worst[t] = m
        for t, m in worst.items():
            if not 0 <= t < row.shape[-1] or () in self.breakers.get(t, ()):
                continue
            e = m - self.allowed
            if self.max_exp > 0 and e > self.max_exp:
                e = self.max_exp
            row[t] -= F32(self.multiplier * self.base ** e)

    def accept(self, token_id):
        pass


# -- reasoning budget ------------------------------------------------------------------

def utf8_complete(piece: bytes) -> bool:
    """Whether the bytes end on a character boundary."""
    from ..tokenizer import _complete_prefix

    return _complete_prefix(piece) == len(piece)


class ThinkingBudget:
    """After `budget` tokens inside a reasoning block (<think> ... </think>) the block is
    closed: the end tag's tokens are forced one after another (every other logit -inf),
    once the last token completed its UTF-8 character. `open_` says the prompt left a block
    open; a start tag generated later opens (and counts) a new one."""

    def __init__(self, tok, budget, start_ids, end_ids, open_=False):
        self.tok = tok
        self.budget = int(budget)
        self.start, self.end = list(start_ids), list(end_ids)
        self.recent = []  # the last tokens, to match the tags
        self.state = "idle"
        self.forced = 0
        if open_:
            self._open()

    def _open(self):
        self.state, self.left = "counting", self.budget
        if self.left <= 0:
            self.state, self.forced = "forcing", 0

    def apply(self, row, history):
        if self.state == "forcing":
            t = self.end[self.forced]
            keep = row[t]
            row[:] = -np.inf
            row[t] = keep if np.isfinite(keep) else 0.0

    def accept(self, token_id):
        self.recent = (self.recent + [int(token_id)])[-max(len(self.start), len(self.end)):]
        ends = self.recent[-len(self.end):] == self.end
        if self.state in ("idle", "done"):
            if self.recent[-len(self.start):] == self.start:
                self._open()
        elif self.state == "forcing":
            self.forced += 1
            if self.forced >= len(self.end) or ends:
                self.state = "done"
        elif ends:
            self.state = "done"  # closed by the model itself
        else:
            if self.state == "counting":
                self.left -= 1
            if self.left <= 0:
                complete = utf8_complete(self.tok.token_piece(int(token_id)))
                self.state, self.forced = ("forcing", 0) if complete else ("utf8", 0)


class ConstraintStage:
    """A grammar constraint (constrain.py: allowed() -> numpy bool [n_vocab] | None,
    commit(id), done()): the tokens it disallows get -inf on the backend, before the host
    sees the logits."""

    def __init__(self, constraint, ops, n_vocab):
        self.c, self.ops, self.n_vocab = constraint, ops, n_vocab

    def apply_device(self, logits):
        allowed = self.c.allowed()
        if allowed is None:
            return logits
        bias = np.full((1, logits.shape[-1]), -np.inf, F32)
        bias[0, :self.n_vocab][np.asarray(allowed, bool)[:self.n_vocab]] = 0.0
        return self.ops.add(logits, self.ops.asarray(bias))

    def accept(self, token_id):
        self.c.commit(token_id)

    def done(self) -> bool:
        return self.c.done()


def build(p, tok, n_vocab, think=None, think_open=False) -> list:
    """The processors that the parameters `p` (generation.Params) ask for, in order."""
    out = []
    if p.logit_bias:
        out.append(LogitBias(p.logit_bias, n_vocab))
    if p.repeat_last_n != 0 and (p.repeat_penalty != 1.0 or p.frequency_penalty != 0.0
                                 or p.presence_penalty != 0.0):
        out.append(Penalties(p.repeat_penalty, p.frequency_penalty, p.presence_penalty,
                             p.repeat_last_n))
    if p.dry_multiplier != 0.0 and p.dry_base >= 1.0 and p.dry_penalty_last_n != 0:
        out.append(Dry(tok, p.dry_multiplier, p.dry_base, p.dry_allowed_length,
                       p.dry_penalty_last_n, p.dry_sequence_breakers))
    if p.thinking_budget is not None:
        if think is None:
            raise _bad("thinking_budget: the model has no <think> and </think> tokens")
        out.append(ThinkingBudget(tok, p.thinking_budget, *think, open_=think_open))
    return out
