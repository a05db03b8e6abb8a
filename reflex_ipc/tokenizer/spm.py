"""SentencePiece-style BPE (`tokenizer.ggml.model == "llama"`) as llama.cpp runs it.

Written here rather than by feeding the `sentencepiece` library a ModelProto,
because that library cannot reproduce llama.cpp: llama.cpp lets *every*
vocabulary entry take part in merges (control and byte tokens included, so the
literal text "<0x0A>" or "<s>" can merge into those tokens), it prefixes a
space after every special token, not only at the start, and its ties between
equal scores go to the leftmost pair. (Building and serializing a 32k-piece
ModelProto would also cost more than this module's whole cold start.)

Algorithm: spaces become U+2581 (after an optional leading space), the text is
split into characters, and the adjacent pair whose concatenation is a token
with the highest score is merged, leftmost first, until no pair is a token.
Symbols that are not tokens fall back to <0xNN> byte tokens.
"""

from __future__ import annotations

import heapq

from ..errors import ReflexError
from . import MAX_SPM_PIECE, Tokenizer, too_large


class SPMTokenizer(Tokenizer):
    kind = "spm"
    escape_whitespaces = True

    def __init__(self, f):
        from . import numeric_array

        tokens = f.metadata.get("tokenizer.ggml.tokens")
        n = tokens.count if getattr(tokens, "elem_type", None) == 8 else 0
        self._scores = numeric_array(f.metadata, "tokenizer.ggml.scores", n,
                                     "an array of float32 scores")
        self._bytes: dict = {}
        super().__init__(f, (1, 2, 0))

    def _flag_defaults(self):
        self.add_bos = True
        self.add_eos = False
        self.add_space_prefix = True

    def _score(self, i: int) -> float:
        return float(self._scores[i]) if self._scores is not None else 0.0

    def _encode_fragments(self, frags, out):
        prev_special = True
        for fr in frags:
            if type(fr) is int:
                out.append(fr)
                prev_special = True
                continue
            if len(fr) > MAX_SPM_PIECE:
                raise too_large("text between special tokens (characters)", len(fr),
                                MAX_SPM_PIECE)
            if self.add_space_prefix and prev_special:
                fr = " " + fr
            self._encode_text(fr.replace(" ", "\u2581"), out)
            prev_special = False

    def _encode_text(self, text: str, out):
        find = self.vocab.find
        sym = list(text)
        n = len(sym)
        if n == 0:
            return
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap = []
        memo: dict = {}

        def bigram(i, j):
            t = sym[i] + sym[j]
            tid = memo.get(t)
            if tid is None:
                tid = memo[t] = find(t.encode("utf-8"))
            if tid >= 0:
                heapq.heappush(heap, (-self._score(tid), i, j, len(t)))

        for i in range(n - 1):
            bigram(i, i + 1)
        while heap:
            _, i, j, size = heapq.heappop(heap)
            a, b = sym[i], sym[j]
            if not a or not b or len(a) + len(b) != size:
                continue
            sym[i] = a + b
            sym[j] = ""
            k = nxt[j]
            nxt[i] = k
            if k >= 0:
                prv[k] = i
            if prv[i] >= 0:
                bigram(prv[i], i)
            if k >= 0:
                bigram(i, k)
        i = 0
        while i != -1:
            s = sym[i]
            tid = find(s.encode("utf-8"))
            if tid >= 0:
                out.append(tid)
            else:
                # a symbol that is not a token is always one character (merges only
                # make tokens): spell it with byte tokens
                for c in s.encode("utf-8"):
                    out.append(self._byte_token(c))
            i = nxt[i]

    def _byte_token(self, c: int) -> int:
        t = self._bytes.get(c)
        if t is None:
            t = self.vocab.find(b"<0x%02X>" % c)
            if t < 0:
                t = self.vocab.find(bytes([c]))
            if t < 0:
                raise ReflexError("gguf_error", "the vocabulary (tokenizer.ggml.tokens) has no "
                                  f"token for byte 0x{c:02X}")
            self._bytes[c] = t
        return t

    def _normal_piece(self, i: int) -> bytes:
        return self.token_text(i).replace("\u2581", " ").encode("utf-8")
