"""Byte-level BPE (`gpt2`) and SPM-style BPE over raw UTF-8 (`gemma4`), as llama.cpp runs them.

Text is split by the pre-tokenizer (pretok.py); each piece is byte-encoded
(GPT-2's bytes-to-printable-characters map) unless the vocabulary spells raw
UTF-8, then merged: repeatedly the adjacent pair with the lowest merge rank,
the leftmost among equals. A final symbol that is not a token falls back to
one token per byte (single-byte tokens for gpt2, <0xNN> for gemma4).
"""

from __future__ import annotations

import heapq

from ..errors import ReflexError
from . import MAX_BPE_PIECE, Tokenizer, pretok, too_large


_MEMO_MAX = 1 << 17  # memo tables are dropped when they grow past this (long-lived servers)


def _byte_map():
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    enc = {}
    extra = 0
    for b in range(256):
        if b in keep:
            enc[b] = chr(b)
        else:
            enc[b] = chr(256 + extra)
            extra += 1
    return enc


BYTE_ENC = _byte_map()  # byte -> printable character (also a str.translate table for latin-1 text)
_DEC_TABLE = {ord(c): chr(b) for b, c in BYTE_ENC.items()}


def byte_encode(piece: str) -> str:
    return piece.encode("utf-8").decode("latin-1").translate(BYTE_ENC)


class BPETokenizer(Tokenizer):
    kind = "bpe"

    def __init__(self, f, model: str):
        from .vocab import StrIndex, cache_file

        meta = f.metadata
        merges = meta.get("tokenizer.ggml.merges")
        if merges is None or getattr(merges, "elem_type", None) != 8:
            raise ReflexError("gguf_error", "tokenizer.ggml.merges is missing or not a string array")
        self.model = model
        pre = meta.get("tokenizer.ggml.pre")
        if model == "gemma4":
            pre = "gemma4"
        self.pre = pre if isinstance(pre, str) and pre else "default"
        canon = pretok.ALIASES.get(self.pre)
        if canon is None:
            raise ReflexError("unsupported_architecture",
                              f"pre-tokenizer {self.pre!r} is not supported")
        self._regexes = pretok.regexes(canon)
        self.byte_level = model != "gemma4"
        self.escape_whitespaces = not self.byte_level
        self.ignore_merges = canon == "llama3" and self.pre not in ("chatglm-bpe", "dbrx", "smaug-bpe")
        self.ignore_merges |= self.pre in ("glm4", "glm5")
        self.clean_spaces = self.pre not in _NO_CLEAN_SPACES
        self._newline_words = canon == "newlines"
        self._merges = StrIndex(f._mm, merges, first=True,
                                cache_file=cache_file(f, merges, "merges"))
        self._ranks: dict = {}
        self._words: dict = {}
        if model == "gemma4":
            default_ids = (None, None, None)
        elif self.pre in ("chatglm-bpe", "glm4", "glm5"):
            default_ids = (None, 11, None)  # llama.cpp: no BOS unless the file names one
        else:
            default_ids = (11, 11, None)
        super().__init__(f, default_ids)

    def _flag_defaults(self):
        self.add_bos = self.pre in ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1",
                                    "pixtral", "midm-2.0", "lfm2", "jina-v5-nano", "tekken",
                                    "chameleon")
        self.add_eos = False

    def _after_flags(self):
        if self.model == "gemma4":
            self.add_bos = True  # llama.cpp forces it for Gemma 4

    # -- encoding -----------------------------------------------------------------
    def _encode_fragments(self, frags, out):
        for fr in frags:
            if type(fr) is int:
                out.append(fr)
                continue
            if self.escape_whitespaces:
                fr = fr.replace(" ", "\u2581")
            for word in pretok.split(fr, self._regexes):
                ids = self._words.get(word)
                if ids is None:
                    if len(word) > MAX_BPE_PIECE:
                        raise too_large("a pre-token (characters)", len(word), MAX_BPE_PIECE)
                    if len(self._words) >= _MEMO_MAX:
                        self._words.clear()
                    ids = self._words[word] = self._word_ids(word)
                out.extend(ids)

    def _word_ids(self, word: str) -> list[int]:
        find = self.vocab.find
        w = byte_encode(word) if self.byte_level else word
        if self.ignore_merges or (self._newline_words and not word.strip("\n")):
            i = find(w.encode("utf-8"))
            if i >= 0:
                return [i]
        out = []
        for sym in self._merge(list(w)):
            b = sym.encode("utf-8")
            i = find(b)
            if i >= 0:
                out.append(i)
                continue
            for c in b:
                j = find(bytes([c]) if self.byte_level else b"<0x%02X>" % c)
                if j >= 0:
                    out.append(j)
        return out

    def _rank(self, a: str, b: str) -> int:
        key = (a, b)
        r = self._ranks.get(key)
        if r is None:
            if len(self._ranks) >= _MEMO_MAX:
                self._ranks.clear()
            r = self._ranks[key] = self._merges.find((a + " " + b).encode("utf-8"))
        return r

    def _merge(self, sym: list[str]) -> list[str]:
        n = len(sym)
        if n < 2:
            return sym
        rank = self._rank
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap = []
        for i in range(n - 1):
            r = rank(sym[i], sym[i + 1])
            if r >= 0:
                heap.append((r, i, i + 1, sym[i] + sym[i + 1]))
        heapq.heapify(heap)
        push, pop = heapq.heappush, heapq.heappop
        while heap:
            _, i, j, text = pop(heap)
            a, b = sym[i], sym[j]
            if not a or not b or a + b != text:
                continue
            sym[i] = text
            sym[j] = ""
            k = nxt[j]
            nxt[i] = k
            if k >= 0:
                prv[k] = i
                r = rank(text, sym[k])
                if r >= 0:
                    push(heap, (r, i, k, text + sym[k]))
            p = prv[i]
            if p >= 0:
                r = rank(sym[p], text)
                if r >= 0:
                    push(heap, (r, p, i, sym[p] + text))
        return [s for s in sym if s]

    # -- decoding -----------------------------------------------------------------
    def _normal_piece(self, i: int) -> bytes:
        text = self.token_text(i)
        if self.escape_whitespaces:
            return text.replace("\u2581", " ").encode("utf-8")
        try:
            return text.translate(_DEC_TABLE).encode("latin-1")
        except UnicodeEncodeError:
            # llama.cpp spells characters outside the byte map as [UNK_BYTE_0x..<token>]
            out = bytearray()
            for ch in text:
                d = _DEC_TABLE.get(ord(ch))
                if d is not None:
                    out.append(ord(d))
                else:
                    out += b"[UNK_BYTE_0x" + ch.encode("utf-8").hex().encode() + \
                        text.encode("utf-8") + b"]"
            return bytes(out)


# pre-tokenizer names for which llama.cpp turns clean_spaces off
_NO_CLEAN_SPACES = {
    "deepseek-llm", "deepseek-coder", "deepseek-v3", "spark2_5", "youtu", "command-r", "qwen2",
    "deepseek-r1-qwen", "kormo", "f2llmv2", "qwen35", "poro-chat", "viking", "tekken", "smollm",
    "chameleon", "gpt-4o", "llama4", "kanana2", "talkie", "granite-embed-multi-97m", "tiny_aya",
    "cohere2moe", "superbpe", "trillion", "granite-docling", "bailingmoe", "bailingmoe2",
    "llada-moe", "seed-coder", "hunyuan", "hunyuan-dense", "hy_v4", "joyai-llm", "kimi-k2",
    "ufakzeka", "grok-2", "afmoe", "laguna", "minimax-m2", "solar-open", "sarvam-moe",
}
