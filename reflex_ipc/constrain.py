"""Constrained decoding with llguidance: `json_schema`, `regex` and `grammar` (Lark).

Imported only when a request carries one of them (llguidance is the optional
`constrain` extra: `pip install 'reflex-ipc[constrain]'`). The llguidance
tokenizer is built once per model from the GGUF's own vocabulary: every token's
bytes as llama.cpp renders them (control tokens, and user-defined tokens
spelled `<...>`, marked special with llguidance's 0xFF prefix, so a grammar
never produces them as text), the end-of-generation ids as its EOS set, and
reflex's own tokenizer for the text llguidance needs tokenized.

`Constraint` is the object the runtime drives (engine.Runner.generate's
`constraint=`): `allowed()` -> numpy bool [n_vocab] (None = no restriction),
`commit(token_id)` after each generated token, `done()` -> True once the
grammar is complete and allows nothing but stopping (the runtime then ends with
finish_reason "stop"). When the grammar allows stopping, the mask allows the
end-of-generation tokens too.

Bad constraints are ReflexError("invalid_request", ...) naming the field:
a schema that is not a JSON object or uses a feature llguidance does not
support, a regex that does not compile (a trailing lone backslash included,
which llguidance would read as the empty language), a Lark grammar with
errors, and a constraint no output can satisfy (an empty character class,
a rule that only derives itself, a schema that only refers to itself: found
when the first mask is computed, at construction). One past llguidance's own
limits (its lexer's fuel and size, e.g. `a{1000000}`) is `too_large`, at
construction or when a later step hits it; a panic inside llguidance on an
input is `invalid_request` too (it names the panic). Nothing the request
says ends in `internal`.

Versions: every llguidance from 0.7.30 (LLMatcher with unsafe_compute_mask_ptr)
on; `eos_token` is one id (1.6 and older take no list), the other
end-of-generation ids are allowed by `Constraint.allowed` itself.
"""

from __future__ import annotations

import json

from .errors import ReflexError

FIELDS = ("json_schema", "regex", "grammar")


def _import():
    try:
        import llguidance
    except ImportError:
        raise ReflexError("invalid_request", "constrained output (json_schema, regex, grammar) "
                                             "needs llguidance: pip install 'reflex-ipc[constrain]'"
                          ) from None
    return llguidance


class _Wrapper:
    """What llguidance.TokenizerWrapper reads from a tokenizer object."""

    def __init__(self, tok, tokens, eos):
        self.tokens = tokens
        self.eos_token_id = eos
        self.bos_token_id = tok.bos_id
        self.special_token_ids = [i for i, t in enumerate(tokens) if t[:1] == b"\xff"]
        self._tok = tok

    def __call__(self, s):
        if isinstance(s, bytes):
            s = s.decode("utf-8", errors="replace")
        return self._tok.encode(s, add_bos=False, parse_special=False)


def token_table(tok) -> list:
    """Each token's bytes, special ones prefixed with 0xFF (llguidance's convention)."""
    from .tokenizer import A_CONTROL, A_USER_DEFINED

    out = []
    for i in range(tok.n_vocab):
        b = tok.token_bytes(i)
        a = tok.attr(i)
        if a & A_CONTROL or (a & A_USER_DEFINED and b.startswith(b"<") and b.endswith(b">")):
            b = b"\xff" + b
        out.append(b)
    return out


_LLTOK = {}  # id(tok) -> (tok, LLTokenizer)


def lltokenizer(tok):
    """The llguidance tokenizer of `tok` (built once per tokenizer object)."""
    hit = _LLTOK.get(id(tok))
    if hit is not None and hit[0] is tok:
        return hit[1]
    llg = _import()
    eog = sorted(tok.eog_ids) or ([tok.eos_id] if tok.eos_id is not None else [])
    eos = tok.eos_id if tok.eos_id in tok.eog_ids else (eog[0] if eog else 0)
    wrapper = llg.TokenizerWrapper(_Wrapper(tok, token_table(tok), eos))
    # one id: llguidance <= 1.6 takes no list; Constraint.allowed adds the other EOG ids
    llt = llg.LLTokenizer(wrapper, n_vocab=tok.n_vocab, eos_token=int(eos))
    _LLTOK[id(tok)] = (tok, llt)
    return llt


def grammar_for(json_schema=None, regex=None, grammar=None) -> tuple:
    """(field, llguidance grammar string) of the one constraint given (None when none)."""
    given = [(k, v) for k, v in (("json_schema", json_schema), ("regex", regex),
                                  ("grammar", grammar)) if v is not None]
    if not given:
        return None, None
    if len(given) > 1:
        raise ReflexError("invalid_request", "give at most one of `json_schema`, `regex`, `grammar`")
    field, value = given[0]
    llg = _import()
    M = llg.LLMatcher
    if field == "json_schema":
        if isinstance(value, bool):
            value = {} if value else {"not": {}}
        if not isinstance(value, dict):
            raise ReflexError("invalid_request", "`json_schema`: must be a JSON Schema object")
        _check_schema(value)
        g = _call(field, M.grammar_from_json_schema, json.dumps(value),
                  defaults={"whitespace_flexible": False})
    elif field == "regex":
        if not isinstance(value, str):
            raise ReflexError("invalid_request", "`regex`: must be a string")
        if (len(value) - len(value.rstrip("\\"))) % 2:
            raise ReflexError("invalid_request", "`regex`: it ends with a lone backslash, which "
                                                 "escapes nothing")
        g = _call(field, M.grammar_from_regex, value)
    else:
        if not isinstance(value, str) or not value.strip():
            raise ReflexError("invalid_request", "`grammar`: must be a Lark grammar (a string)")
        g = _call(field, M.grammar_from_lark, value)
    return field, g


def _check_schema(schema):
    """The schema is JSON Schema (checked against its meta-schema when jsonschema is
    installed; llguidance then names any feature it does not support)."""
    try:
        import jsonschema
    except ImportError:
        return
    try:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        cls.check_schema(schema)
    except jsonschema.exceptions.SchemaError as e:
        where = "/".join(str(p) for p in e.path)
        raise ReflexError("invalid_request", f"`json_schema`: not a valid JSON Schema"
                                             f"{' at ' + where if where else ''}: {e.message}"
                          ) from None


def _clean(msg: str) -> str:
    msg = msg.strip()
    for pre in ("Error: ", "error: "):
        if msg.startswith(pre):
            msg = msg[len(pre):]
    if "<state>" in msg:  # the matcher's dump of its parser state follows the reason
        msg = msg[:msg.index("<state>")].strip()
    return msg.splitlines()[0] if len(msg) > 400 else msg


# what llguidance says when a constraint is past its limits (lexer fuel, sizes)
_LIMIT_WORDS = ("too many", "fuel", "limit", "too large", "too big", "exceed", "max_")


def _failure(field, msg, after=None) -> ReflexError:
    """The error of a matcher that stopped: too_large past llguidance's limits, else the
    constraint allows nothing more (invalid_request)."""
    msg = _clean(msg or "")
    where = f" after {after} tokens" if after else ""
    if any(w in msg.lower() for w in _LIMIT_WORDS):
        return ReflexError("too_large", f"`{field}`: past llguidance's limits{where}: {msg}")
    if after is None or msg.startswith("NoExtension"):
        what = "no output satisfies it" if after is None else "no continuation satisfies it"
        return ReflexError("invalid_request", f"`{field}`: {what}{where} ({msg})")
    return ReflexError("invalid_request", f"`{field}`: the constraint failed{where}: {msg}")


def _call(field, fn, *args, **kw):
    """fn(*args) of llguidance with its errors, and its panics (pyo3's PanicException, a
    BaseException), as the request's error."""
    try:
        return fn(*args, **kw)
    except (ValueError, TypeError, RuntimeError) as e:
        raise ReflexError("invalid_request", f"`{field}`: {_clean(str(e))}") from None
    except BaseException as e:
        if type(e).__name__ != "PanicException":
            raise
        raise ReflexError("invalid_request", f"`{field}`: llguidance cannot handle it (it panicked: "
                                             f"{_clean(str(e))[:200]})") from None


class Constraint:
    """One request's llguidance matcher, as the runtime's `constraint=` object."""

    def __init__(self, tok, field, grammar):
        import numpy as np

        llg = _import()
        self.field = field
        self.tok = tok
        self.n_vocab = tok.n_vocab
        for t in (None, "tok"):  # the grammar alone first: no tokenizer built for a bad one
            llt = lltokenizer(tok) if t else None
            err = _call(field, llg.LLMatcher.validate_grammar, grammar, llt)
            if err and not err.startswith("WARNING"):
                raise ReflexError("invalid_request", f"`{field}`: {_clean(err)}")
        self.m = _call(field, llg.LLMatcher, llt, grammar, log_level=0)
        if self.m.is_error():
            raise _failure(field, self.m.get_error())
        self._words = (self.n_vocab + 31) // 32
        self._buf = np.empty(self._words, dtype=np.int32)
        self._eog = np.array(sorted(tok.eog_ids), dtype=np.int64)
        self._np = np
        self.n_committed = 0
        # the first mask now: a constraint nothing satisfies is refused before generation
        self._first = self._mask()
        if not self._first.any():
            raise ReflexError("invalid_request", f"`{field}`: no output satisfies it (the first "
                                                 f"token can be none of the vocabulary's)")

    def _mask(self):
        np = self._np
        _call(self.field, self.m.unsafe_compute_mask_ptr, self._buf.ctypes.data, self._buf.nbytes)
        if self.m.is_error():
            raise _failure(self.field, self.m.get_error(), self.n_committed or None)
        # bit i of word w allows token 32 * w + i: little-endian bits of the bytes
        mask = np.unpackbits(self._buf.view(np.uint8), bitorder="little")[: self.n_vocab]
        mask = mask.view(bool)
        if self.m.is_accepting() and len(self._eog):
            mask[self._eog] = True
        return mask

    def allowed(self):
        first, self._first = self._first, None
        return first if first is not None else self._mask()

    def commit(self, token_id: int) -> None:
        if int(token_id) in self.tok.eog_ids and self.m.is_accepting():
            return  # ending the text where the grammar may end
        self._first = None
        if not _call(self.field, self.m.consume_token, int(token_id)):
            raise _failure(self.field, self.m.get_error() or f"token {token_id} was refused",
                           self.n_committed + 1)
        self.n_committed += 1

    def done(self) -> bool:
        return self.m.is_stopped()

    def reset(self) -> None:
        """Back to the grammar's start (the next choice of a request with n > 1)."""
        self.m.reset()


def make_constraint(tok, json_schema=None, regex=None, grammar=None):
    """A Constraint for the one field given, or None when none is."""
    field, g = grammar_for(json_schema, regex, grammar)
    if field is None:
        return None
    return Constraint(tok, field, g)
