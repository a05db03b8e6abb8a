"""Tokenizers built from GGUF metadata alone, matching llama.cpp token for token.

`load_tokenizer(f)` reads `tokenizer.ggml.*` from an open GGUFFile and returns a
Tokenizer for the two families llama.cpp calls BPE and SPM:

- `gpt2`: byte-level BPE with the pre-tokenizer `tokenizer.ggml.pre` names
  (pretok.py), and `gemma4`: BPE over raw UTF-8 with spaces escaped as U+2581
  (bpe.py).
- `llama`: SentencePiece-style BPE by token score with byte fallback (spm.py).

Construction touches as little as it can: strings stay in the file mapping and
are looked up through StrIndex (vocab.py, with a small disk cache); a token's
text is decoded only when it is used.

API
  encode(text, add_bos=None, parse_special=True) -> ids
      add_bos None: BOS (and EOS) as the GGUF's add flags say; True/False: force.
      parse_special: control/unknown token text becomes those tokens (longest
      first, with llama.cpp's lstrip/rstrip rules); user-defined tokens always do.
  decode(ids, special=False) -> str      llama_detokenize (remove_special=False)
  token_piece(id, special=False) -> bytes   llama_token_to_piece
  token_bytes(id) -> bytes               the piece with special tokens rendered
  stream_decoder(special=False)          .feed(id) -> str, .flush() -> str
  n_vocab, bos_id, eos_id, eot_id, eog_ids, is_control(id), find_text(text), token_text(id)
"""

from __future__ import annotations

from ..errors import ReflexError

# token types in tokenizer.ggml.token_type
T_UNDEFINED, T_NORMAL, T_UNKNOWN, T_CONTROL, T_USER_DEFINED, T_UNUSED, T_BYTE = range(7)
# attributes (llama.cpp's llama_token_attr bits)
A_UNDEFINED, A_UNKNOWN, A_UNUSED, A_NORMAL, A_CONTROL, A_USER_DEFINED, A_BYTE = (
    0, 1 << 0, 1 << 1, 1 << 2, 1 << 3, 1 << 4, 1 << 5)
A_NORMALIZED, A_LSTRIP, A_RSTRIP = 1 << 6, 1 << 7, 1 << 8
_TYPE_ATTR = {T_NORMAL: A_NORMAL, T_UNKNOWN: A_UNKNOWN, T_CONTROL: A_CONTROL,
              T_USER_DEFINED: A_USER_DEFINED, T_UNUSED: A_UNUSED, T_BYTE: A_BYTE}
_SPECIAL_ATTRS = A_CONTROL | A_USER_DEFINED | A_UNKNOWN

# texts llama.cpp recognises (tokenizer.ggml.*_token_id missing): first found wins
_EOT_NAMES = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
              "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<\uff5cend\u2581of\u2581sentence\uff5c>",
              "<end_of_utterance>")
_EOM_NAMES = ("<|eom_id|>",)
_FIM_NAMES = {
    "pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>", "<PRE>",
            "\u2581<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>", "<SUF>",
            "\u2581<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>", "<MID>",
            "\u2581<MID>", "<|code_middle|>", "<|middle|>"),
    "pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "sep": ("<|file_sep|>",),
}
_EOG_NAMES = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
              "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
              "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
              "<turn|>", "<|tool_response>", "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[")
_ALWAYS_RENDER = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")
_ISSPACE = " \t\n\v\f\r"  # C isspace, what llama.cpp strips for lstrip/rstrip

# Work and memory bounds (protocol/PROTOCOL.md, "Bounds"). Merging one piece costs about
# 10 us and 200 bytes per character here, so one unbroken piece is capped: a BPE
# pre-token (one piece of the pre-tokenizer's split; natural text never comes near) and
# an SPM fragment (SPM merges all the text between special tokens at once, as llama.cpp
# does, so its cap is higher). Below the caps the tokens are llama.cpp's, exactly; above
# them the request fails with `too_large` rather than answering something else.
MAX_BPE_PIECE = 1 << 18  # characters
MAX_SPM_PIECE = 1 << 20  # characters
MAX_DECODE_BYTES = 16 << 20  # detokenized text


def too_large(what: str, n: int, limit: int):
    return ReflexError("too_large", f"{what} is {n} long; the limit is {limit}")


def _str(v) -> str:
    return v if isinstance(v, str) else ""


def numeric_array(meta, key, n, what="a numeric array"):
    """metadata[key] as a numpy view, None when absent; gguf_error naming the key when it
    is not a numeric array of at least n elements (a string, a number, nested arrays)."""
    from ..gguffile import ArrayValue

    v = meta.get(key)
    if v is None:
        return None
    if not isinstance(v, ArrayValue):
        raise ReflexError("gguf_error", f"{key} must be {what}, not a {type(v).__name__}")
    try:
        arr = v.numpy()
    except TypeError:
        raise ReflexError("gguf_error", f"{key} must be {what}, not an array of "
                          f"{_VALUE_TYPE_NAMES.get(v.elem_type, v.elem_type)}") from None
    if len(arr) < n:
        raise ReflexError("gguf_error", f"{key} has {len(arr)} elements for a vocabulary of {n}")
    return arr


_VALUE_TYPE_NAMES = {8: "string", 9: "array"}


def load_tokenizer(f):
    """A Tokenizer for the open GGUFFile `f` (raises ReflexError on unsupported vocabularies)."""
    model = f.metadata.get("tokenizer.ggml.model")
    if model is not None and not isinstance(model, str):
        raise ReflexError("gguf_error", "tokenizer.ggml.model must be a string, not a "
                          f"{type(model).__name__}")
    if model == "gpt2" or model == "gemma4":
        from .bpe import BPETokenizer

        return BPETokenizer(f, model)
    if model == "llama":
        from .spm import SPMTokenizer

        return SPMTokenizer(f)
    raise ReflexError("unsupported_architecture",
                      f"tokenizer model {model!r} is not supported (gpt2, gemma4 and llama are)")


class Tokenizer:
    """What BPE and SPM share: vocabulary, attributes, special tokens, decoding."""

    kind = ""
    add_space_prefix = False
    escape_whitespaces = False  # tokens spell spaces as U+2581
    clean_spaces = False

    def __init__(self, f, default_ids=(None, None, None)):
        from .vocab import StrIndex, cache_file

        meta = f.metadata
        self.path = f.path
        tokens = meta.get("tokenizer.ggml.tokens")
        if tokens is None or getattr(tokens, "elem_type", None) != 8:
            raise ReflexError("gguf_error", "tokenizer.ggml.tokens is missing or not a string array")
        self._f = f  # keeps the mapping alive
        self._mm = f._mm
        self.n_vocab = n = tokens.count
        self.vocab = StrIndex(f._mm, tokens, first=False,
                              cache_file=cache_file(f, tokens, "tokens"))
        types = meta.get("tokenizer.ggml.token_type")
        if types is not None and (getattr(types, "elem_type", None) != 5 or types.count < n):
            raise ReflexError("gguf_error", "tokenizer.ggml.token_type must be an int32 array "
                              "as long as the vocabulary")
        # a longer array is allowed; ids past the vocabulary never exist
        self._types = types.numpy()[:n] if types is not None else None
        self._attr_override: dict = {}
        self._text_memo: dict = {}
        self._piece_memo: dict = {}

        bos, eos, unk = default_ids
        ids = {"bos": bos, "eos": eos, "unk": unk, "eot": None, "eom": None}
        for name in ("bos", "eos", "eot", "eom", "unk"):
            v = meta.get(f"tokenizer.ggml.{name}_token_id" if name != "unk" else
                         "tokenizer.ggml.unknown_token_id")
            if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < n:
                ids[name] = v
            elif ids[name] is not None and ids[name] >= n:
                ids[name] = None
        fim = {}
        for name in _FIM_NAMES:
            v = meta.get(f"tokenizer.ggml.fim_{name}_token_id")
            fim[name] = v if isinstance(v, int) and 0 <= v < n else None
        for old, new in (("prefix", "pre"), ("suffix", "suf"), ("middle", "mid")):
            v = meta.get(f"tokenizer.ggml.{old}_token_id")
            if isinstance(v, int) and 0 <= v < n:
                fim[new] = v
        self._flag_defaults()
        for key, attr in (("add_bos", "add_bos"), ("add_eos", "add_eos"),
                          ("add_space_prefix", "add_space_prefix")):
            v = meta.get(f"tokenizer.ggml.{key}_token" if key != "add_space_prefix" else
                         "tokenizer.ggml.add_space_prefix")
            if isinstance(v, bool):
                setattr(self, attr, v)
        self._after_flags()

        # end-of-generation and friends, found by text as llama.cpp does
        find = self.find_text
        if ids["eot"] is None:
            ids["eot"] = self._first_of(_EOT_NAMES, mark_control=True)
        if ids["eom"] is None:
            ids["eom"] = self._first_of(_EOM_NAMES, mark_control=True)
        for name, names in _FIM_NAMES.items():
            if fim[name] is None:
                fim[name] = self._first_of(names, mark_control=True)
        eog = {fim[k] for k in ("pad", "rep", "sep") if fim[k] is not None}
        for text in _EOG_NAMES:
            i = find(text)
            if i >= 0:
                eog.add(i)
                self._add_attr(i, A_CONTROL)
        for text in _ALWAYS_RENDER:
            i = find(text)
            if i >= 0:
                self._attr_override[i] = A_USER_DEFINED
        for k in ("eos", "eot", "eom"):
            if ids[k] is not None:
                eog.add(ids[k])
        texts = {i: self.token_text(i) for i in eog}
        vals = set(texts.values())
        has_call = "<|call|>" in vals or "<|calls|>" in vals
        if "<|end|>" in vals and has_call and ("<|return|>" in vals or "<|flush|>" in vals):
            for i, t in texts.items():
                if t == "<|end|>":
                    eog.discard(i)
                    self._attr_override[i] = A_USER_DEFINED
        if "</s>" in vals and ("<|tool_response>" in vals or "<|plamo:eos|>" in vals):
            for i, t in texts.items():
                if t == "</s>":
                    eog.discard(i)
                    self._attr_override[i] = A_NORMAL
        self.bos_id = ids["bos"]
        self.eos_id = ids["eos"]
        self.eot_id = ids["eot"]
        self.unk_id = ids["unk"]
        self.fim_ids = fim
        self.eog_ids = frozenset(eog)
        self._special_cache = None
        self._special_first = None  # (the specials list, first character -> their indices)
        self._name = _str(meta.get("general.name")).lower()
        self._arch = _str(meta.get("general.architecture"))
        self._pre_name = _str(meta.get("tokenizer.ggml.pre"))

    # -- hooks for subclasses -----------------------------------------------------
    def _flag_defaults(self):
        self.add_bos = False
        self.add_eos = False

    def _after_flags(self):
        pass

    # -- vocabulary ---------------------------------------------------------------
    def find_text(self, text: str) -> int:
        """The id of the token spelled `text` exactly, or -1."""
        return self.vocab.find(text.encode("utf-8"))

    def token_text(self, i: int) -> str:
        """The token's text as stored in the GGUF (not decoded)."""
        t = self._text_memo.get(i)
        if t is None:
            if not 0 <= i < self.n_vocab:
                raise ReflexError("invalid_request", f"token id {i} is outside the vocabulary "
                                  f"(0..{self.n_vocab - 1})")
            t = self._text_memo[i] = self.vocab.get(i).decode("utf-8", "replace")
        return t

    def attr(self, i: int) -> int:
        a = self._attr_override.get(i)
        if a is not None:
            return a
        if self._types is None:
            return A_NORMAL
        return _TYPE_ATTR.get(int(self._types[i]), A_UNDEFINED)

    def _add_attr(self, i, bits):
        self._attr_override[i] = self.attr(i) | bits

    def _first_of(self, names, mark_control=False):
        for text in names:
            i = self.find_text(text)
            if i >= 0:
                if mark_control:
                    self._add_attr(i, A_CONTROL)
                return i
        return None

    def is_control(self, i: int) -> bool:
        return bool(self.attr(i) & A_CONTROL)

    # -- special tokens -----------------------------------------------------------
    def _specials(self):
        """[(text, id, attr)] of control, user-defined and unknown tokens, longest first."""
        if self._special_cache is None:
            import numpy as np

            ids: list = []
            if self._types is not None:
                t = self._types
                ids = np.flatnonzero((t == T_CONTROL) | (t == T_USER_DEFINED) |
                                     (t == T_UNKNOWN)).tolist()
            over = self._attr_override
            if over:
                ids = sorted(set(ids) | set(over))
            ids = [i for i in ids if self.attr(i) & _SPECIAL_ATTRS]
            self._apply_strip_rules(ids)
            attr = self.attr
            raw = self.vocab.get
            items = [(raw(i), i) for i in ids]
            items.sort(key=lambda x: (-len(x[0]), x[1]))
            self._special_cache = [(b.decode("utf-8", "replace"), i, attr(i))
                                   for b, i in items if b]
            # the scan read every token type and the special tokens' strings: those pages
            # leave the resident set again (Gemma-3: ~2 MB of a cold process's peak)
            release = getattr(self._f, "release_metadata", None)
            if release is not None:
                release()
        return self._special_cache

    def _apply_strip_rules(self, special_ids):
        """llama.cpp's per-model lstrip/rstrip attributes (not stored in GGUF)."""
        name, pre, arch = self._name, self._pre_name, self._arch
        if any(s in pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or \
                any(s in arch for s in ("nomic-bert-moe", "jina-bert-v3")):
            i = self.find_text("<mask>")
            if i >= 0:
                self._add_attr(i, A_LSTRIP)
        elif "phi-3" in name or "phi3" in name:
            for i in special_ids:
                self._add_attr(i, A_RSTRIP)
            for text, on in (("</s>", True), ("<unk>", False), ("<s>", False),
                             ("<|endoftext|>", False)):
                i = self.find_text(text)
                if i >= 0:
                    a = self.attr(i)
                    self._attr_override[i] = a | A_RSTRIP if on else a & ~A_RSTRIP
        elif "modern-bert" in name:
            i = self.find_text("[MASK]")
            if i >= 0:
                self._add_attr(i, A_LSTRIP)

    def _specials_in(self, text: str) -> list:
        """The special tokens that may occur in `text` (in _specials' order): those whose first
        character is one of text's (Gemma-3 has 6416 special tokens; a prompt rarely holds any)."""
        specials = self._specials()
        by_first = self._special_first
        if by_first is None or by_first[0] is not specials:
            index: dict = {}
            for k, (tok, _, _) in enumerate(specials):
                index.setdefault(tok[0], []).append(k)
            by_first = self._special_first = (specials, index)
        index = by_first[1]
        ks = [k for c in set(text).intersection(index) for k in index[c]]
        ks.sort()
        return [specials[k] for k in ks]

    def _partition(self, text: str, parse_special: bool) -> list:
        """Split `text` into raw-text strings and special token ids (llama.cpp's order)."""
        frags: list = [text] if text else []
        for tok, tid, attr in self._specials_in(text) if text else ():
            if not parse_special and attr & (A_CONTROL | A_UNKNOWN):
                continue
            if not any(type(fr) is str and tok in fr for fr in frags):
                continue
            out = []
            for fr in frags:
                if type(fr) is not str or tok not in fr:
                    out.append(fr)
                    continue
                pos = 0
                n = len(fr)
                while True:
                    j = fr.find(tok, pos)
                    if j < 0:
                        if pos < n:
                            out.append(fr[pos:])
                        break
                    left = fr[pos:j]
                    if attr & A_LSTRIP:
                        left = left.rstrip(_ISSPACE)
                    if left:
                        out.append(left)
                    out.append(tid)
                    pos = j + len(tok)
                    if attr & A_RSTRIP:
                        while pos < n and fr[pos] in _ISSPACE:
                            pos += 1
                    if pos >= n:
                        break
            frags = out
        return frags

    # -- encoding -----------------------------------------------------------------
    def encode(self, text: str, add_bos=None, parse_special: bool = True) -> list[int]:
        """Token ids of `text`. add_bos None follows the GGUF (BOS, and EOS when the
        file asks for it); True/False force BOS on/off (and never add EOS)."""
        if not isinstance(text, str):
            raise ReflexError("invalid_request", "text to tokenize must be a string")
        bos = self.add_bos if add_bos is None else bool(add_bos)
        out: list[int] = []
        if bos and self.bos_id is not None:
            out.append(self.bos_id)
        self._encode_fragments(self._partition(text, parse_special), out)
        if add_bos is None and self.add_eos and self.eos_id is not None:
            out.append(self.eos_id)
        # the vocabulary's pages this read (with the kernel's fault-around, 64 KB for each
        # string compared) leave the resident set again: the page cache keeps them
        release = getattr(self._f, "release_metadata", None)
        if release is not None:
            release()
        return out

    def _encode_fragments(self, frags, out):
        raise NotImplementedError

    # -- decoding -----------------------------------------------------------------
    def _normal_piece(self, i: int) -> bytes:
        raise NotImplementedError

    def token_piece(self, i: int, special: bool = False) -> bytes:
        """llama_token_to_piece: the bytes a token stands for ('' for control tokens
        unless special)."""
        key = (i, special)
        b = self._piece_memo.get(key)
        if b is not None:
            return b
        a = self.attr(i)
        if a & (A_UNKNOWN | A_CONTROL) and not special:
            b = b""
        elif a & (A_UNKNOWN | A_CONTROL | A_USER_DEFINED):
            b = self.vocab.get(i)
        elif a & A_NORMAL:
            b = self._normal_piece(i)
        elif a & A_BYTE:
            b = _byte_of(self.token_text(i))
        else:
            b = b""
        self._piece_memo[key] = b
        return b

    def token_bytes(self, i: int) -> bytes:
        """The bytes token `i` decodes to (special tokens as their text)."""
        self.token_text(i)  # range check
        return self.token_piece(i, special=True)

    def decode_bytes(self, ids, special: bool = False) -> bytes:
        """llama_detokenize(remove_special=False, unparse_special=special). The text grows
        in one buffer: memory is the text (at most MAX_DECODE_BYTES), whatever the number
        of ids (a list of pieces and bytes.join's 80-byte buffer per item took 88 bytes per
        id: 8M ids of an empty control token peaked at +670 MiB)."""
        out = bytearray()
        first = True
        seen = {}  # id -> piece, for this call (a dict hit instead of two checked lookups)
        for i in ids:
            p = seen.get(i)
            if p is None:
                j = int(i)
                self.token_text(j)  # range check
                p = seen[i] = self.token_piece(j, special)
            if first:
                first = False
                if self.add_space_prefix and p[:1] == b" ":
                    p = p[1:]
            out += p
            if len(out) > MAX_DECODE_BYTES:
                raise too_large("the detokenized text (bytes)", len(out), MAX_DECODE_BYTES)
        b = bytes(out)
        del out
        if self.clean_spaces and b:
            b = _clean_spaces(b)
        return b

    def decode(self, ids, special: bool = False) -> str:
        """llama_detokenize(remove_special=False, unparse_special=special): pieces
        joined, the first token's leading space dropped when the vocabulary adds
        a space prefix (SPM), and llama.cpp's clean_spaces pass where the
        vocabulary asks for it (GPT-2, Llama 3, ...). Invalid UTF-8 -> U+FFFD."""
        return self.decode_bytes(ids, special).decode("utf-8", "replace")

    def stream_decoder(self, special: bool = False) -> "StreamDecoder":
        return StreamDecoder(self, special)


def _byte_of(text: str) -> bytes:
    """A byte token's byte: its text is <0xNN>; a file that lies gets the text itself."""
    if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
        try:
            return bytes([int(text[3:5], 16)])
        except ValueError:
            pass
    return text.encode("utf-8")


def _clean_spaces(b: bytes) -> bytes:
    """llama.cpp's clean_spaces passes over detokenized bytes."""
    for pat in (b" ?", b" !", b" .", b" ,"):
        b = b.replace(pat, pat[1:])
    # " ' " -> "'"
    out = bytearray()
    i, n = 0, len(b)
    while i < n:
        if b[i] == 0x27 and 0 < i and i + 1 < n and out and out[-1] == 0x20 and b[i + 1] == 0x20:
            out[-1] = 0x27
            i += 2
            continue
        out.append(b[i])
        i += 1
    b = bytes(out)
    for pat in (b" 's", b" 'm", b" 're", b" 've"):
        b = b.replace(pat, pat[1:])
    return b


class StreamDecoder:
    """Incremental detokenizer: feed(id) returns the newly complete text, never
    half a UTF-8 character; flush() returns what is left (invalid bytes as U+FFFD).
    Text is the plain concatenation of token pieces, as llama.cpp streams
    generated text: unlike decode() there is no clean_spaces pass and an SPM
    continuation keeps its leading space."""

    def __init__(self, tok: Tokenizer, special: bool = False):
        self._tok = tok
        self._special = special
        self._pending = b""

    def feed(self, token_id: int) -> str:
        tok = self._tok
        tok.token_text(int(token_id))
        buf = self._pending + tok.token_piece(int(token_id), self._special)
        cut = _complete_prefix(buf)
        self._pending = buf[cut:]
        return buf[:cut].decode("utf-8", "replace")

    def flush(self) -> str:
        buf, self._pending = self._pending, b""
        return buf.decode("utf-8", "replace")


def _complete_prefix(buf: bytes) -> int:
    """Length of `buf` without a trailing, still completable, partial UTF-8 character."""
    n = len(buf)
    for j in range(n - 1, max(n - 4, -1), -1):
        c = buf[j]
        if c & 0xC0 != 0x80:  # ASCII or a lead byte: the last character starts here
            if c >= 0xC0:
                try:
                    buf[j:].decode("utf-8")
                except UnicodeDecodeError as e:
                    if e.reason == "unexpected end of data":
                        return j
            return n
    return n
