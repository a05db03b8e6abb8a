"""The stop matcher: generated text released as it becomes final, never past a stop
string, and holding back any tail that could still become the start of one.

llama.cpp server's limits for editors (infill's n_indent and t_max_predict_ms) stop here
too: n_indent > 0 ends generation at the first line after a newline whose indentation
(spaces and tabs) is less than n_indent, the text cut before that line's first other
character (a line's leading whitespace is held back until it is decided);
t_max_predict_ms > 0 ends it at a token whose text holds a newline once that many ms have
passed since `t0` (the start of generation). Both set `reason` "length", as llama.cpp's
limits do (a stop string leaves it None)."""

from __future__ import annotations

import time


class StopMatcher:
    def __init__(self, stops, n_indent=0, t_max_predict_ms=0):
        self.stops = [s for s in stops if s]
        self.maxlen = max((len(s) for s in self.stops), default=0)
        self.text = ""
        self.emitted = 0
        self.n_indent = int(n_indent or 0)
        self.t_max = float(t_max_predict_ms or 0)
        self.t0 = time.perf_counter()
        self.scan = 0  # where the next newline whose line is undecided is looked for
        self.reason = None

    def push(self, piece):
        """Add decoded text; returns (newly final text, stopped)."""
        before = len(self.text)
        self.text += piece
        safe = len(self.text)
        if self.stops:
            start = max(0, before - self.maxlen + 1)
            hits = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
            if hits:
                cut = min(hits)
                self.text = self.text[:cut]
                return self._release(cut), True
            hold = 0
            for s in self.stops:
                for k in range(min(len(s) - 1, len(self.text)), hold, -1):
                    if self.text.endswith(s[:k]):
                        hold = k
                        break
            safe -= hold
        if self.n_indent > 0:
            while True:
                nl = self.text.find("\n", self.scan)
                if nl < 0:
                    break
                p = start = nl + 1
                while p < len(self.text) and self.text[p] in " \t":
                    p += 1
                if p == len(self.text):  # only whitespace so far: undecided
                    if p - start < self.n_indent:
                        safe = min(safe, start)
                    break
                if p - start < self.n_indent:
                    self.text = self.text[:p]
                    self.reason = "length"
                    return self._release(p), True
                self.scan = p
        if self.t_max > 0 and "\n" in piece and (time.perf_counter() - self.t0) * 1e3 > self.t_max:
            self.reason = "length"
            return self._release(len(self.text)), True
        return self._release(safe), False

    def _release(self, upto):
        out = self.text[self.emitted:upto] if upto > self.emitted else ""
        self.emitted = max(self.emitted, upto)
        return out

    def rest(self):
        """Everything held back (generation ended without completing a stop string)."""
        return self._release(len(self.text))
