"""Request decoding and response encoding for protocol/PROTOCOL.md (version 1).

`parse_request(line)` turns one request line into `(id, op, params)` where
params is a msgspec Struct of the op, or raises `RequestError` (a ReflexError
that also carries the id and op it could read). `encode(obj)` writes one
response line. msgspec costs ~13 ms to import, so server.py writes the ready
line before importing this module.
"""

from typing import Annotated, Any, Literal, Optional, Union

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from . import __version__
from .errors import KINDS, ReflexError

PROTOCOL = 1
VERSION = __version__
MAX_TOKENS = 131072
DEFAULT_MAX_LINE_BYTES = 16 * 1024 * 1024
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

NonEmptyStr = Annotated[str, Meta(min_length=1)]
Device = Annotated[str, Meta(pattern=r"^(auto|cpu|cuda)$")]


class _Request(Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class _ModelRequest(_Request, kw_only=True):
    model: Optional[NonEmptyStr] = None
    device: Optional[Device] = None


class Hello(_Request, kw_only=True):
    protocol: Optional[int] = None


class Load(_ModelRequest, kw_only=True):
    pass


class ContentPart(Struct, kw_only=True):
    type: Literal["text"]
    text: str


class Message(Struct, kw_only=True):
    """A chat message (protocol/PROTOCOL.md, "Chat"); fields left out stay out of what
    the template sees (to_builtins drops UNSET), as templates test `'tool_calls' in m`."""

    role: NonEmptyStr
    content: Union[str, list[ContentPart], None, UnsetType] = UNSET
    name: Union[str, UnsetType] = UNSET
    tool_calls: Union[list[dict[str, Any]], None, UnsetType] = UNSET
    tool_call_id: Union[str, UnsetType] = UNSET
    reasoning_content: Union[str, None, UnsetType] = UNSET


def messages_of(params):
    """The request's messages as plain dicts (None when it has none)."""
    m = getattr(params, "messages", None)
    return None if m is None else msgspec.to_builtins(m)


Messages = Annotated[list[Message], Meta(min_length=1)]
Tools = list[dict[str, Any]]
MAX_LOGPROBS = 20
Logprobs = Annotated[int, Meta(ge=0, le=MAX_LOGPROBS)]


class _Decode(_ModelRequest, kw_only=True):
    """generate's and infill's sampling, stop, stream and issue-14 parameters."""

    max_tokens: Annotated[int, Meta(ge=1, le=MAX_TOKENS)] = 64
    temperature: Annotated[float, Meta(ge=0.0, le=100.0)] = 0.0
    top_k: Annotated[int, Meta(ge=0, le=INT64_MAX)] = 0
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] = 1.0
    min_p: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.0
    seed: Optional[Annotated[int, Meta(ge=0, le=INT64_MAX)]] = None
    repeat_penalty: Annotated[float, Meta(gt=0.0, le=100.0)] = 1.0
    repeat_last_n: Annotated[int, Meta(ge=0, le=1048576)] = 64
    stop: Union[NonEmptyStr, Annotated[list[NonEmptyStr], Meta(max_length=16)]] = []
    stream: bool = False
    logprobs: Optional[Logprobs] = None
    cache_prompt: bool = True
    json_schema: Optional[Union[dict[str, Any], bool]] = None
    regex: Optional[str] = None
    grammar: Optional[str] = None


class Generate(_Decode, kw_only=True):
    prompt: Optional[str] = None
    messages: Optional[Messages] = None
    tools: Optional[Tools] = None
    chat_template: Optional[NonEmptyStr] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None
    add_generation_prompt: bool = True


class ExtraChunk(Struct, forbid_unknown_fields=True, kw_only=True):
    filename: str = "tmp"
    text: str = ""


class Infill(_Decode, kw_only=True):
    prefix: str
    suffix: str = ""
    input_extra: Annotated[list[ExtraChunk], Meta(max_length=4096)] = []
    prompt: str = ""


class System1(_ModelRequest, kw_only=True):
    prompt: Optional[str] = None
    messages: Optional[Messages] = None
    chat_template: Optional[NonEmptyStr] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None
    add_generation_prompt: bool = True
    cache_prompt: bool = True
    candidates: Annotated[list[NonEmptyStr], Meta(min_length=1, max_length=1024)]
    temperature: Annotated[float, Meta(gt=0.0, le=100.0)] = 1.0


class Embed(_ModelRequest, kw_only=True):
    input: Union[NonEmptyStr, Annotated[list[NonEmptyStr], Meta(min_length=1, max_length=1024)]]
    pooling: Literal["mean", "last", "cls"] = "mean"
    normalize: bool = False


class Tokenize(_ModelRequest, kw_only=True):
    text: Optional[str] = None
    messages: Optional[Messages] = None
    tools: Optional[Tools] = None
    chat_template: Optional[NonEmptyStr] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None
    add_generation_prompt: bool = True
    add_bos: bool = False
    parse_special: bool = True


class Detokenize(_ModelRequest, kw_only=True):
    ids: list[Annotated[int, Meta(ge=0, le=INT64_MAX)]]


class Ping(_Request, kw_only=True):
    pass


class Shutdown(_Request, kw_only=True):
    pass


OPS = {
    "hello": Hello,
    "load": Load,
    "generate": Generate,
    "infill": Infill,
    "system1": System1,
    "embed": Embed,
    "tokenize": Tokenize,
    "detokenize": Detokenize,
    "ping": Ping,
    "shutdown": Shutdown,
}
MODEL_OPS = frozenset(("load", "generate", "infill", "system1", "embed", "tokenize", "detokenize"))


_EXACTLY_ONE = {"generate": ("prompt", "messages"), "system1": ("prompt", "messages"),
                "tokenize": ("text", "messages")}


class RequestError(ReflexError):
    """A request that failed before it ran; `id` and `op` are what could be read."""

    def __init__(self, kind, message, rid=None, op=None):
        super().__init__(kind, message)
        self.rid = rid
        self.op = op


_decode = msgspec.json.Decoder().decode


def parse_request(line: bytes):
    """(id, op, params Struct) of one request line (no trailing newline)."""
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
    if not (rid is None or isinstance(rid, str)
            or (type(rid) is int and INT64_MIN <= rid <= INT64_MAX)):
        raise RequestError("invalid_request",
                           "`id` must be a string or an integer in [-2^63, 2^63)")
    op = obj.pop("op", None)
    if op is None:
        raise RequestError("invalid_request", "Object missing required field `op`", rid)
    if not isinstance(op, str):
        raise RequestError("invalid_request",
                           f"Expected `str`, got `{type(op).__name__}` - at `$.op`", rid)
    cls = OPS.get(op)
    if cls is None:
        raise RequestError("unknown_op", f"unknown op {op!r} (ops: {', '.join(OPS)})", rid, op)
    try:
        params = msgspec.convert(obj, cls)
    except msgspec.ValidationError as e:
        raise RequestError("invalid_request", str(e), rid, op) from None
    pair = _EXACTLY_ONE.get(op)
    if pair is not None and (getattr(params, pair[0]) is None) == (getattr(params, pair[1]) is None):
        raise RequestError("invalid_request", f"give exactly one of `{pair[0]}` and `{pair[1]}`",
                           rid, op)
    if op == "hello" and params.protocol not in (None, PROTOCOL):
        raise RequestError("invalid_request",
                           f"`protocol`: this server speaks {PROTOCOL}, not {params.protocol}",
                           rid, op)
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


def token_event(rid, token_id: int, text: str, logprobs=None) -> bytes:
    ev = {"event": "token", "id": rid, "token_id": token_id, "text": text}
    if logprobs is not None:
        ev["logprobs"] = logprobs
    return _encode(ev) + b"\n"


ERROR_KINDS = list(KINDS)
