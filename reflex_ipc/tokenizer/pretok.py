"""Pre-tokenizers of llama.cpp's byte-level BPE, by the name in `tokenizer.ggml.pre`.

llama.cpp splits text with a list of regexes applied in turn, each to the
pieces left by the one before (text between matches becomes a piece too).
Unicode classes (\\p{L}, \\p{N}, ...) are matched on a *collapsed* copy of the
text in which every non-ASCII code point is replaced by one marker character
per class, and non-ASCII whitespace by \\v; ASCII stays itself. We do the same
with Python's `re` (ASCII mode, so \\s is exactly C's isspace), which has the
same leftmost-first alternation as ECMAScript. llama.cpp's hand-written fast
paths for the GPT-2, Llama-3, Qwen2 and Qwen3.5 regexes give the same pieces as
these regexes over the collapsed text (checked against llama.cpp's test
vectors and the llama.cpp library itself in tests/test_tokenizer_conformance.py).
Character classes follow Python's unicodedata categories, plus a small table
for code points assigned after Python 3.11's Unicode 14.0.
"""

from __future__ import annotations

import re
import unicodedata
from bisect import bisect_right

# markers for non-ASCII code points, by class (llama.cpp's choice of bytes)
_MARK = {"N": "\xd1", "L": "\xd2", "P": "\xd3", "M": "\xd4", "S": "\xd5"}
_OTHER = "\xd0"
_VT = "\x0b"
# llama.cpp's whitespace set (\\s), non-ASCII part
_WS = (0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000)


# Code points assigned after Unicode 14.0 (Python 3.11's unicodedata), with the
# class llama.cpp's newer tables give them: (first, last, class). Only consulted
# for code points this Python calls unassigned.
_NEWER = (
    (0x00CF3, 0x00CF3, "M"), (0x00ECE, 0x00ECE, "M"), (0x02FFC, 0x02FFF, "S"),
    (0x031EF, 0x031EF, "S"), (0x10EFD, 0x10EFF, "M"), (0x1123F, 0x11240, "L"),
    (0x11241, 0x11241, "M"), (0x11B00, 0x11B09, "P"), (0x11F00, 0x11F01, "M"),
    (0x11F02, 0x11F02, "L"), (0x11F03, 0x11F03, "M"), (0x11F04, 0x11F10, "L"),
    (0x11F12, 0x11F33, "L"), (0x11F34, 0x11F3A, "M"), (0x11F3E, 0x11F42, "M"),
    (0x11F43, 0x11F4F, "P"), (0x11F50, 0x11F59, "N"), (0x1342F, 0x1342F, "L"),
    (0x13440, 0x13440, "M"), (0x13441, 0x13446, "L"), (0x13447, 0x13455, "M"),
    (0x1B132, 0x1B132, "L"), (0x1B155, 0x1B155, "L"), (0x1D2C0, 0x1D2D3, "N"),
    (0x1DF25, 0x1DF2A, "L"), (0x1E030, 0x1E06D, "L"), (0x1E08F, 0x1E08F, "M"),
    (0x1E4D0, 0x1E4EB, "L"), (0x1E4EC, 0x1E4EF, "M"), (0x1E4F0, 0x1E4F9, "N"),
    (0x1F6DC, 0x1F6DC, "S"), (0x1F774, 0x1F776, "S"), (0x1F77B, 0x1F77F, "S"),
    (0x1F7D9, 0x1F7D9, "S"), (0x1FA75, 0x1FA77, "S"), (0x1FA87, 0x1FA88, "S"),
    (0x1FAAD, 0x1FAAF, "S"), (0x1FABB, 0x1FABD, "S"), (0x1FABF, 0x1FABF, "S"),
    (0x1FACE, 0x1FACF, "S"), (0x1FADA, 0x1FADB, "S"), (0x1FAE8, 0x1FAE8, "S"),
    (0x1FAF7, 0x1FAF8, "S"), (0x2B739, 0x2B739, "L"), (0x2EBF0, 0x2EE5D, "L"),
    (0x31350, 0x323AF, "L"),
)
_NEWER_FIRST = [r[0] for r in _NEWER]


def _category(cp: int) -> str:
    cat = unicodedata.category(chr(cp))
    if cat == "Cn":
        k = bisect_right(_NEWER_FIRST, cp) - 1
        if k >= 0 and cp <= _NEWER[k][1]:
            return _NEWER[k][2]
    return cat[0]


class _Collapse(dict):
    """str.translate table: non-ASCII code point -> its class marker (memoized)."""

    def __missing__(self, cp):
        if cp < 128:
            raise LookupError
        c = _MARK.get(_category(cp), _OTHER)
        self[cp] = c
        return c


_COLLAPSE = _Collapse({cp: _VT for cp in _WS})
_WS_ONLY = {cp: _VT for cp in _WS}

# class bodies for use inside [...] on collapsed text
L = "\xd2A-Za-z"
N = "\xd10-9"
P = "\xd3!-#%-*,-/:;?@\\[-\\]_{}"
M = "\xd4"
S = "\xd5\\$+<=>^`|~"


def _c(pattern: str):
    """A regex over the collapsed text (mode 'c'), compiled when first used."""
    return ("c", pattern.format(L=L, N=N, P=P, M=M, S=S))


def _w(pattern: str):
    """A regex over the text with non-ASCII whitespace as \\v (mode 'w'), compiled when used."""
    return ("w", pattern)


_CONTRACTIONS = "'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]"
GPT2 = _c(r"'s|'t|'re|'ve|'m|'ll|'d| ?[{L}]+| ?[{N}]+| ?[^\s{L}{N}]+|\s+(?!\S)")
LLAMA3 = _c(r"(?:" + _CONTRACTIONS + r")|[^\r\n{L}{N}]?[{L}]+|[{N}]{{1,3}}"
            r"| ?[^\s{L}{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = _c(r"(?:" + _CONTRACTIONS + r")|[^\r\n{L}{N}]?[{L}]+|[{N}]"
           r"| ?[^\s{L}{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN35 = _c(r"(?:" + _CONTRACTIONS + r")|[^\r\n{L}{N}]?[{L}{M}]+|[{N}]"
            r"| ?[^\s{L}{M}{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# GPT-4o / o200k (gpt-oss, Llama 4): case-aware words as llama.cpp rewrites tiktoken's pattern
# (a letter that is not a-z, then one that is not A-Z: a collapsed non-ASCII letter is both)
_UP, _LO = r"(?:(?=[{L}])[^a-z])", r"(?:(?=[{L}])[^A-Z])"
GPT4O = _c(r"[^\r\n{L}{N}]?" + _UP + "*" + _LO + r"+(?:" + _CONTRACTIONS + r")?"
           r"|[^\r\n{L}{N}]?" + _UP + "+" + _LO + r"*(?:" + _CONTRACTIONS + r")?"
           r"|[{N}]{{1,3}}| ?[^\s{L}{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
# DeepSeek LLM's letter class (a regex character class, as llama.cpp spells it)
_DS_LETTERS = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-"
    "\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-"
    "\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5"
    "\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00"
    "-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-"
    "\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-"
    "\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-"
    "\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149"
    "\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13"
    "-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    "\U0001e900-\U0001e943"
)
NEWLINES = _w(r"[^\n]+|\n+")

# pre-tokenizer name -> regex list (llama.cpp's grouping of names)
_LISTS = {
    "default": lambda: [_c(r"[{P}$\+<=>\^~\|]+"), GPT2, _c(r"[{N}]+"), _w("[0-9][0-9][0-9]")],
    "gpt2": lambda: [GPT2],
    "llama3": lambda: [LLAMA3],
    "qwen2": lambda: [QWEN2],
    "qwen35": lambda: [QWEN35],
    "gpt4o": lambda: [GPT4O],
    "starcoder": lambda: [_c(r"[{N}]"), GPT2],
    "falcon": lambda: [_c(r"[{P}$\+<=>\^~\|`]+"), GPT2, _w("[0-9][0-9][0-9]")],
    "deepseek-llm": lambda: [
        _w("[\r\n]"),
        _w(r"\s?[" + _DS_LETTERS + "]+"),
        _w(r"\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+"),
        _w(r"\s+\Z"),
        _w(_CJK),
        _c(r"[{N}]+"),
    ],
    "deepseek-coder": lambda: [
        _w("[\r\n]"), _c(r"\s?[{L}]+"), _c(r"\s?[{P}]+"), _w(_CJK), _c(r"[{N}]"),
    ],
    "newlines": lambda: [NEWLINES],
}

ALIASES = {
    "default": "default",
    "gpt-2": "gpt2", "phi-2": "gpt2", "mpt": "gpt2", "olmo": "gpt2", "jais": "gpt2",
    "jina-es": "gpt2", "jina-de": "gpt2", "gigachat": "gpt2", "jina-v2-es": "gpt2",
    "jina-v2-de": "gpt2", "a.x-4.0": "gpt2", "mellum": "gpt2", "modern-bert": "gpt2",
    "exaone4": "gpt2", "trillion": "gpt2", "granite-docling": "gpt2",
    "llama3": "llama3", "llama-v3": "llama3", "llama-bpe": "llama3", "falcon3": "llama3",
    "falcon-h1": "llama3", "pixtral": "llama3", "midm-2.0": "llama3", "lfm2": "llama3",
    "jina-v5-nano": "llama3", "dbrx": "llama3", "smaug-bpe": "llama3",
    "chatglm-bpe": "llama3", "glm4": "llama3", "glm5": "llama3",
    "qwen2": "qwen2", "deepseek-r1-qwen": "qwen2", "kormo": "qwen2", "f2llmv2": "qwen2",
    "megrez": "qwen2", "stablelm2": "qwen2", "hunyuan": "qwen2", "solar-open": "qwen2",
    "qwen35": "qwen35",
    "gpt-4o": "gpt4o", "llama4": "gpt4o", "kanana2": "gpt4o", "talkie": "gpt4o",
    "starcoder": "starcoder", "refact": "starcoder", "command-r": "starcoder",
    "smollm": "starcoder", "codeshell": "starcoder", "exaone": "starcoder",
    "minerva-7b": "starcoder", "mellum2": "starcoder",
    "falcon": "falcon",
    "deepseek-llm": "deepseek-llm",
    "deepseek-coder": "deepseek-coder",
    "gemma4": "newlines",
}

_cache: dict = {}


def regexes(name: str):
    """The regex list for a canonical pre-tokenizer name (see ALIASES)."""
    got = _cache.get(name)
    if got is None:
        got = _cache[name] = [(mode, re.compile(rx, re.ASCII)) for mode, rx in _LISTS[name]()]
    return got


def split(text: str, exprs) -> list[str]:
    """Split `text` the way llama.cpp's unicode_regex_split does (before byte encoding)."""
    if not text:
        return []
    if text.isascii():
        coll = ws = text
    else:
        coll = ws = None
    bounds = [(0, len(text))]
    for mode, rx in exprs:
        if mode == "c":
            if coll is None:
                coll = text.translate(_COLLAPSE)
            s = coll
        else:
            if ws is None:
                ws = text.translate(_WS_ONLY)
            s = ws
        out = []
        add = out.append
        for a, b in bounds:
            last = a
            for m in rx.finditer(s, a, b):
                i, j = m.span()
                if i == j:
                    continue
                if i > last:
                    add((last, i))
                add((i, j))
                last = j
            if last < b:
                add((last, b))
        bounds = out
    return [text[a:b] for a, b in bounds]
