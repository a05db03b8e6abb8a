"""The stop matcher: generated text released as it becomes final, never past a stop
string, and holding back any tail that could still become the start of one."""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stops):
        self.stops = [s for s in stops if s]
        self.maxlen = max((len(s) for s in self.stops), default=0)
        self.text = ""
        self.emitted = 0

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
        return self._release(safe), False

    def _release(self, upto):
        out = self.text[self.emitted:upto] if upto > self.emitted else ""
        self.emitted = max(self.emitted, upto)
        return out

    def rest(self):
        """Everything held back (generation ended without completing a stop string)."""
        return self._release(len(self.text))
