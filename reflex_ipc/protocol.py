"""Request decoding and response encoding for protocol/PROTOCOL.md.

`parse_request(line)` turns one request line into `(id, op, params)` where
params is an instance of the op's Request struct (reflex_ipc/ops/<op>.py), or raises
`RequestError` (a ReflexError that also carries the id and op it could read).
Every limit is a constraint of that struct, so a request is fully checked here,
before any model is loaded. `encode(obj)` writes one response line. msgspec
costs ~10 ms to import, so server.py writes the ready line before importing
this module.
"""

from typing import Any

import msgspec

from .errors import ReflexError
from .ops import registry

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

OPS = {name: mod.Request for name, mod in registry().items()}  # op -> its Request struct


class RequestError(ReflexError):
    """A request that failed before it ran; `id` and `op` are what could be read."""

    def __init__(self, kind, message, rid=None, op=None):
        super().__init__(kind, message)
        self.rid = rid
        self.op = op


_decode = msgspec.json.Decoder().decode  # generic: bytes -> dict / list / ...


class _Head(msgspec.Struct):
    """A line's `id` and `op`; decoding into it skips every other field without
    building it."""

    id: Any = None
    op: Any = None


_decode_head = msgspec.json.Decoder(_Head).decode
_typed = {}  # op -> decode of a whole line into (a subclass of) its Request struct


def _typed_decoder(op: str):
    dec = _typed.get(op)
    if dec is None:
        cls = OPS[op]
        # cls plus the line's id and op as fields, kept as raw JSON (read from _Head);
        # the params a request runs with are an instance of it (copying them into a
        # cls would cost more than both decodes)
        line_cls = msgspec.defstruct(f"{cls.__name__}Line", [("id", msgspec.Raw, msgspec.Raw()),
                                                              ("op", msgspec.Raw, msgspec.Raw())],
                                     bases=(cls,), kw_only=True)
        dec = _typed[op] = msgspec.json.Decoder(line_cls).decode
    return dec


def validation_message(e: msgspec.ValidationError, op: str, obj: dict) -> str:
    """msgspec's message, plus the new name of a renamed field."""
    msg = str(e)
    renamed = getattr(registry()[op], "RENAMED", {})
    for old, new in renamed.items():
        if old in obj and f"`{old}`" in msg:
            msg += f" (`{old}` was renamed `{new}`)"
    return msg


def _op_class(rid, op):
    """The Request struct class of op, after checking the request's id and op (both parse
    paths refuse them with the same kinds and messages)."""
    if not (rid is None or isinstance(rid, str)
            or (type(rid) is int and INT64_MIN <= rid <= INT64_MAX)):
        raise RequestError("invalid_request",
                           "`id` must be a string or an integer in [-2^63, 2^63)")
    if op is None:
        raise RequestError("invalid_request", "Object missing required field `op`", rid)
    if not isinstance(op, str):
        raise RequestError("invalid_request",
                           f"Expected `str`, got `{type(op).__name__}` - at `$.op`", rid)
    cls = OPS.get(op)
    if cls is None:
        raise RequestError("unknown_op", f"unknown op {op!r} (ops: {', '.join(OPS)})", rid, op)
    return cls


def parse_request(line: bytes):
    """(id, op, params Struct) of one request line (no trailing newline).

    A valid line is decoded once, straight into its op's Request struct: a first
    pass reads only `id` and `op` (skipping the rest), a second builds the struct.
    A line either pass refuses is parsed again by _parse_generic (dict first, then
    the struct), whose error is the one reported: only bad lines pay for objects
    built twice, and every error kind and message stays that path's."""
    if not line.isascii():
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise RequestError("parse_error", f"invalid UTF-8 at byte {e.start}") from None
    try:
        head = _decode_head(line)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return _parse_generic(line)
    rid, op = head.id, head.op
    _op_class(rid, op)  # a bad id or op is refused here, as the generic path would
    try:
        params = _typed_decoder(op)(line)  # an instance of a subclass of the op's class
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return _parse_generic(line)
    return rid, op, params


def _parse_generic(line: bytes):
    """parse_request by way of a generic decode: the reference for every error."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError("parse_error", f"invalid UTF-8 at byte {e.start}") from None
    try:
        obj = _decode(text)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise RequestError("parse_error", f"invalid JSON: {e}") from None
    except RecursionError:
        raise RequestError("parse_error", "JSON nested too deeply") from None
    if not isinstance(obj, dict):
        raise RequestError("invalid_request",
                           f"a request must be a JSON object, got {type(obj).__name__}")
    rid = obj.pop("id", None)
    op = obj.pop("op", None)
    cls = _op_class(rid, op)
    try:
        params = msgspec.convert(obj, cls)
    except msgspec.ValidationError as e:
        raise RequestError("invalid_request", validation_message(e, op, obj), rid, op) from None
    return rid, op, params


def _enc_hook(obj):
    tolist = getattr(obj, "tolist", None)  # numpy arrays and scalars
    if tolist is not None:
        return tolist()
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


_encode = msgspec.json.Encoder(enc_hook=_enc_hook).encode


def encode(obj: dict) -> bytes:
    """One response line, newline included."""
    return _encode(obj) + b"\n"


def result(rid, op, fields: dict, timings: dict) -> dict:
    out = {"event": "result", "id": rid, "op": op, "ok": True}
    out.update(fields)
    out["timings"] = timings
    return out


def error_result(rid, op, kind: str, message: str, timings: dict) -> dict:
    return {"event": "result", "id": rid, "op": op, "ok": False,
            "error": {"kind": kind, "message": message}, "timings": timings}


def token_event(rid, token_id: int, text: str, logprobs=None, **extra) -> bytes:
    ev = {"event": "token", "id": rid, "token_id": token_id, "text": text}
    if logprobs is not None:
        ev["logprobs"] = logprobs
    ev.update(extra)  # reasoning_content, index (only when they say something)
    return _encode(ev) + b"\n"
