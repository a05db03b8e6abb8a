"""The logprob recorder: for each chosen token its log-probability and the N most likely
tokens', from the logits as the model gave them (before the processors and the
constraint), divided by the temperature (1 when greedy); log-softmax over the full
vocabulary, on the backend (only the numbers asked for cross to the host)."""

from __future__ import annotations


class LogprobRecorder:
    def __init__(self, ops, tok, n_vocab, n, temperature):
        self.ops, self.tok, self.n_vocab = ops, tok, n_vocab
        self.n = int(n)
        self.temperature = float(temperature)
        self.entries = []

    def _text(self, tid):
        return self.tok.token_bytes(int(tid)).decode("utf-8", "replace")

    def record(self, logits, tid) -> dict:
        """The entry of token tid chosen from logits [1, V] (a backend array); kept."""
        ops, t = self.ops, self.temperature
        z = logits if t <= 0.0 or t == 1.0 else ops.scale(logits, 1.0 / t)
        top = [int(x) for x in ops.topk(z, self.n, n=self.n_vocab)] if self.n > 0 else []
        lp = ops.logprobs(z, [0] * (len(top) + 1), [tid, *top], n=self.n_vocab)
        e = {"token_id": int(tid), "text": self._text(tid), "logprob": float(lp[0]),
             "top": [{"token_id": x, "text": self._text(x), "logprob": float(v)}
                     for x, v in zip(top, lp[1:])]}
        self.entries.append(e)
        return e

    def drop_last(self):
        """The last token was not output (an end-of-generation token)."""
        self.entries.pop()
