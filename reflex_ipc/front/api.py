"""OpenAI's request and response shapes, mapped onto the protocol's ops.

Requests are decoded with msgspec (already a dependency of the engine's protocol) into the
structs below: a wrong type or an out-of-range value is a 400 that names the field. Fields
that OpenAI clients send and this front does not know are ignored, as OpenAI-compatible
servers do; fields it knows but cannot honour (`echo`, `best_of`, images) are a 400
naming them. The sampling fields (`n`, the penalties, `logit_bias`, and llama.cpp's
`typical_p`, `repeat_last_n`, DRY) and the reasoning switches (`enable_thinking`,
`thinking_budget`, `chat_template_kwargs`; `reasoning_effort` "none" turns thinking off)
map to the engine's parameters of the same names. A field the engine itself does not have yet (`messages`,
`logprobs`, `json_schema`, `tools`, the `infill` op) is passed on, and the engine's
"unknown field" answer becomes a 400 "not supported by this engine yet" naming the HTTP
parameter (see `engine_error`).
"""

import base64
import itertools
import os
import re
import struct
import time
from typing import Annotated, Any, Literal, Optional, Union

import msgspec
from msgspec import Meta, Struct

INT64_MAX = 2**63 - 1
MAX_TOKENS = 131072


class HTTPError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status, message, *, type=None, param=None, code=None, headers=None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or ("invalid_request_error" if status < 500 else "server_error")
        self.param = param
        self.code = code
        self.headers = headers

    def body(self):
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def unsupported(param, why="is not supported by this front"):
    return HTTPError(400, f"`{param}` {why}", param=param, code="unsupported_parameter")


# -- requests --------------------------------------------------------------------------------

Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
TopP = Annotated[float, Meta(gt=0.0, le=1.0)]
Seed = Annotated[int, Meta(ge=0, le=INT64_MAX)]
MaxTokens = Annotated[int, Meta(ge=1, le=MAX_TOKENS)]
Stop = Union[str, Annotated[list[str], Meta(max_length=16)], None]


class StreamOptions(Struct, kw_only=True):
    include_usage: bool = False


class _Sampling(Struct, kw_only=True):
    model: Optional[str] = None
    max_tokens: Optional[MaxTokens] = None
    temperature: Optional[Temperature] = None
    top_p: Optional[TopP] = None
    seed: Optional[Seed] = None
    stop: Stop = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    n: Optional[Annotated[int, Meta(ge=1, le=128)]] = None
    frequency_penalty: Optional[Annotated[float, Meta(ge=-2.0, le=2.0)]] = None
    presence_penalty: Optional[Annotated[float, Meta(ge=-2.0, le=2.0)]] = None
    logit_bias: Optional[dict[str, Annotated[float, Meta(ge=-100.0, le=100.0)]]] = None
    user: Optional[str] = None
    # llama.cpp-style extensions, passed on as the engine's parameters of the same names
    # (the engine checks their ranges: a bad value is its invalid_request, a 400)
    top_k: Optional[Annotated[int, Meta(ge=0)]] = None
    min_p: Optional[Annotated[float, Meta(ge=0.0, le=1.0)]] = None
    repeat_penalty: Optional[Annotated[float, Meta(gt=0.0, le=100.0)]] = None
    typical_p: Optional[float] = None
    repeat_last_n: Optional[int] = None
    dry_multiplier: Optional[float] = None
    dry_base: Optional[float] = None
    dry_allowed_length: Optional[int] = None
    dry_penalty_last_n: Optional[int] = None
    dry_sequence_breakers: Optional[list[str]] = None
    thinking_budget: Optional[int] = None


class CompletionRequest(_Sampling, kw_only=True):
    prompt: Union[str, Annotated[list[str], Meta(min_length=1, max_length=1)]]
    suffix: Optional[str] = None
    echo: bool = False
    best_of: Optional[Annotated[int, Meta(ge=1)]] = None
    logprobs: Optional[Annotated[int, Meta(ge=0, le=20)]] = None


class Message(Struct, kw_only=True):
    role: Annotated[str, Meta(min_length=1)]
    content: Union[str, list[dict[str, Any]], None] = None
    name: Optional[str] = None
    tool_calls: Optional[list[dict[str, Any]]] = None
    tool_call_id: Optional[str] = None


class ChatRequest(_Sampling, kw_only=True):
    messages: Annotated[list[Message], Meta(min_length=1)]
    max_completion_tokens: Optional[MaxTokens] = None
    logprobs: Optional[bool] = None
    top_logprobs: Optional[Annotated[int, Meta(ge=0, le=20)]] = None
    response_format: Optional[dict[str, Any]] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Union[str, dict[str, Any], None] = None
    parallel_tool_calls: Optional[bool] = None
    # reasoning models (the engine checks the values)
    reasoning_effort: Optional[str] = None
    enable_thinking: Optional[bool] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None


class EmbeddingRequest(Struct, kw_only=True):
    input: Union[Annotated[str, Meta(min_length=1)],
                 Annotated[list[Annotated[str, Meta(min_length=1)]], Meta(min_length=1, max_length=1024)]]
    model: Optional[str] = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[Annotated[int, Meta(ge=1)]] = None
    user: Optional[str] = None


class InputExtra(Struct, kw_only=True):
    filename: str = ""
    text: str = ""


class InfillRequest(Struct, kw_only=True):
    """llama.cpp server's /infill body (the fields this front maps)."""
    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: list[InputExtra] = []
    prompt: str = ""
    n_predict: Optional[Annotated[int, Meta(ge=-1, le=MAX_TOKENS)]] = None
    max_tokens: Optional[MaxTokens] = None
    temperature: Optional[Annotated[float, Meta(ge=0.0, le=100.0)]] = None
    top_p: Optional[TopP] = None
    top_k: Optional[Annotated[int, Meta(ge=0)]] = None
    min_p: Optional[Annotated[float, Meta(ge=0.0, le=1.0)]] = None
    repeat_penalty: Optional[Annotated[float, Meta(gt=0.0, le=100.0)]] = None
    seed: Optional[Annotated[int, Meta(ge=-1, le=INT64_MAX)]] = None
    stop: Stop = None
    stream: bool = False
    model: Optional[str] = None
    n_indent: Optional[Annotated[int, Meta(ge=0, le=2**31 - 1)]] = None
    t_max_predict_ms: Optional[Annotated[int, Meta(ge=-1, le=INT64_MAX)]] = None
    cache_prompt: Optional[bool] = None
    # the rest of llama.cpp's sampling fields (the engine checks the values)
    typical_p: Optional[float] = None
    repeat_last_n: Optional[int] = None
    frequency_penalty: Optional[float] = None
    presence_penalty: Optional[float] = None
    dry_multiplier: Optional[float] = None
    dry_base: Optional[float] = None
    dry_allowed_length: Optional[int] = None
    dry_penalty_last_n: Optional[int] = None
    dry_sequence_breakers: Optional[list[str]] = None


_PATH = re.compile(r"at `\$\.?([^`]*)`")


def decode(body: bytes, cls):
    """The request struct, or an HTTPError 400 naming the field."""
    try:
        return msgspec.json.decode(body, type=cls)
    except msgspec.ValidationError as e:
        m = _PATH.search(str(e))
        raise HTTPError(400, f"invalid request: {e}", param=m.group(1) if m else None,
                        code="invalid_value") from None
    except msgspec.DecodeError as e:
        raise HTTPError(400, f"the body is not valid JSON: {e}", code="invalid_json") from None
    except RecursionError:
        raise HTTPError(400, "the body's JSON is nested too deeply", code="invalid_json") from None


SAMPLING = ("top_p", "seed", "stop", "top_k", "min_p", "repeat_penalty", "n", "frequency_penalty",
            "presence_penalty", "logit_bias", "typical_p", "repeat_last_n", "dry_multiplier",
            "dry_base", "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers",
            "thinking_budget")


def _common(req, default_max_tokens):
    # a parameter left out is left out here: with_model_defaults fills it in from the
    # model's own defaults (its GGUF), else the engine's (greedy), not OpenAI's temperature 1
    p = {"max_tokens": req.max_tokens or default_max_tokens}
    for name in ("temperature", *SAMPLING):
        v = getattr(req, name)
        if v is not None:
            p[name] = v
    return p


# what a model's GGUF may set as its defaults (modeldefaults.py)
MODEL_SAMPLING = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n")


def with_model_defaults(params: dict, model_defaults) -> dict:
    """The engine parameters of a generate or infill request, the sampling parameters the
    request left out taken from the model's own defaults (the engine's `load` result:
    `sampling`, from the GGUF's general.sampling.* keys), as llama.cpp's server does. What
    neither gives stays out: the engine's default, greedy decoding (OpenAI's API defaults to
    temperature 1, which makes a small model's answers random)."""
    for name in MODEL_SAMPLING:
        if name not in params and name in (model_defaults or {}):
            params[name] = model_defaults[name]
    return params


def completion_params(req: CompletionRequest, default_max_tokens=16):
    """(op, engine params): `generate`, or `infill` when a `suffix` is given."""
    if req.echo:
        raise unsupported("echo")
    if req.best_of not in (None, 1):
        raise unsupported("best_of", "must be 1")
    p = _common(req, default_max_tokens)
    prompt = req.prompt if isinstance(req.prompt, str) else req.prompt[0]
    if req.logprobs is not None:
        p["logprobs"] = req.logprobs
    if req.suffix is not None:
        p.update(prefix=prompt, suffix=req.suffix)
        return "infill", p
    p["prompt"] = prompt
    return "generate", p


def _message(m: Message, i):
    content = m.content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise HTTPError(400, f"`messages[{i}].content[{j}]`: only text parts are supported "
                                f"(got type {part.get('type')!r})", param=f"messages[{i}].content[{j}]",
                                code="unsupported_parameter")
            texts.append(part["text"])
        content = "".join(texts)
    out = {"role": m.role, "content": "" if content is None else content}
    for name in ("name", "tool_calls", "tool_call_id"):
        v = getattr(m, name)
        if v is not None:
            out[name] = v
    return out


def chat_params(req: ChatRequest, default_max_tokens=512):
    """(op, engine params) of a chat completion: generate with `messages`, rendered by the
    engine with the model's chat template (the front renders nothing itself)."""
    if req.max_completion_tokens is not None:
        req.max_tokens = req.max_completion_tokens
    p = _common(req, default_max_tokens)
    p["messages"] = [_message(m, i) for i, m in enumerate(req.messages)]
    thinking = req.enable_thinking
    if thinking is None and req.reasoning_effort is not None:
        thinking = req.reasoning_effort not in ("none", "minimal")
    if thinking is not None:
        p["enable_thinking"] = thinking
    if req.chat_template_kwargs is not None:
        p["chat_template_kwargs"] = req.chat_template_kwargs
    if req.logprobs:
        p["logprobs"] = req.top_logprobs or 0
    elif req.top_logprobs:
        raise HTTPError(400, "`top_logprobs` needs `logprobs`: true", param="top_logprobs",
                        code="invalid_value")
    rf = req.response_format
    if rf is not None:
        kind = rf.get("type")
        if kind == "json_schema":
            js = rf.get("json_schema")
            if not isinstance(js, dict) or not isinstance(js.get("schema", {}), dict):
                raise HTTPError(400, "`response_format.json_schema` must be an object with a `schema` object",
                                param="response_format", code="invalid_value")
            p["json_schema"] = js.get("schema", {})
        elif kind == "json_object":
            p["json_schema"] = {"type": "object"}
        elif kind != "text":
            raise HTTPError(400, f"`response_format.type` must be text, json_object or json_schema, not {kind!r}",
                            param="response_format", code="invalid_value")
    choice = req.tool_choice
    if req.tools and choice != "none":
        for i, t in enumerate(req.tools):
            if t.get("type") != "function" or not isinstance(t.get("function"), dict):
                raise HTTPError(400, f"`tools[{i}]` must be {{\"type\": \"function\", \"function\": {{...}}}}",
                                param=f"tools[{i}]", code="invalid_value")
        p["tools"] = req.tools
        if choice == "required":
            p["tool_choice"] = "required"
        elif isinstance(choice, dict):
            fn = choice.get("function")
            if choice.get("type") != "function" or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise HTTPError(400, "`tool_choice` must be auto, none, required or {\"type\": \"function\", "
                                "\"function\": {\"name\": ...}}", param="tool_choice", code="invalid_value")
            p["tool_choice"] = {"type": "function", "function": {"name": fn["name"]}}
        elif choice not in (None, "auto"):
            raise HTTPError(400, f"`tool_choice` must be auto, none, required or a named function, not {choice!r}",
                            param="tool_choice", code="invalid_value")
        if req.parallel_tool_calls is False:
            p["parallel_tool_calls"] = False
    return "generate", p


def infill_params(req: InfillRequest):
    if req.prompt:
        raise unsupported("prompt", "is not supported on /infill (use input_prefix)")
    p = {"prefix": req.input_prefix, "suffix": req.input_suffix}
    if req.input_extra:
        p["input_extra"] = [{"filename": e.filename, "text": e.text} for e in req.input_extra]
    n = req.max_tokens if req.max_tokens is not None else req.n_predict
    if n is not None and n > 0:
        p["max_tokens"] = n
    elif n == 0:
        raise HTTPError(400, "`n_predict` must be -1 (the default) or at least 1", param="n_predict",
                        code="invalid_value")
    for name in ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "stop", "n_indent",
                 "cache_prompt", "typical_p", "repeat_last_n", "frequency_penalty", "presence_penalty",
                 "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
                 "dry_sequence_breakers"):
        v = getattr(req, name)
        if v is not None:
            p[name] = v
    if req.t_max_predict_ms is not None and req.t_max_predict_ms > 0:
        p["t_max_predict_ms"] = req.t_max_predict_ms
    if req.seed is not None and req.seed >= 0:
        p["seed"] = req.seed
    return "infill", p


# -- engine errors ---------------------------------------------------------------------------

# the engine's error kinds (PROTOCOL.md) -> HTTP status and OpenAI error code
_KINDS = {
    "parse_error": (400, "invalid_request"),
    "invalid_request": (400, "invalid_value"),
    "line_too_long": (413, "request_too_large"),
    "context_overflow": (400, "context_length_exceeded"),
    "model_not_found": (404, "model_not_found"),
    "gguf_error": (500, "model_error"),
    "state_error": (500, "state_error"),  # saved state files: no HTTP route reaches them yet
    "unsupported_architecture": (500, "model_error"),
    "out_of_memory": (503, "out_of_memory"),
    "cuda_error": (500, "cuda_error"),
    "cancelled": (503, "cancelled"),
    "internal": (500, "internal_error"),
}

_UNKNOWN_FIELD = re.compile(r"unknown field `([^`]+)`")
_FIELD = re.compile(r"`\$\.([A-Za-z_]+)")  # "at `$.x`", "at `key` in `$.x`"

# engine field -> the HTTP parameter it comes from
HTTP_PARAM = {"messages": "messages", "logprobs": "logprobs", "json_schema": "response_format",
              "tools": "tools", "tool_choice": "tool_choice", "parallel_tool_calls": "parallel_tool_calls",
              "prefix": "suffix", "suffix": "suffix", "input_extra": "input_extra",
              "n_indent": "n_indent", "t_max_predict_ms": "t_max_predict_ms"}


def engine_error(kind, message, op):
    """An engine error result -> HTTPError."""
    if kind == "unknown_op":
        return HTTPError(400, f"this engine has no `{op}` op yet: not supported by this engine yet",
                         param=op, code="unsupported_parameter")
    if kind == "invalid_request":
        m = _UNKNOWN_FIELD.search(message)
        if m:
            field = m.group(1)
            param = HTTP_PARAM.get(field, field)
            return HTTPError(400, f"`{param}` is not supported by this engine yet (its protocol has no "
                             f"`{field}` in `{op}`)", param=param, code="unsupported_parameter")
    status, code = _KINDS.get(kind, (500, kind))
    m = _FIELD.search(message)
    param = HTTP_PARAM.get(m.group(1), m.group(1)) if m else None
    return HTTPError(status, f"{kind}: {message}", param=param, code=code)


# -- responses -------------------------------------------------------------------------------

FINISH = {"stop": "stop", "stop_string": "stop", "length": "length"}


_ID_BASE = os.urandom(6).hex()  # a random 12-hex prefix per process; a counter after it
_ID_NEXT = itertools.count(1).__next__


def unique(n=24):
    """n hex digits unique in this process (and, with the random prefix, across processes):
    ids need to differ, not to be secret, so no random draw (a syscall) per request."""
    return (_ID_BASE + format(_ID_NEXT(), "012x"))[:n]


def new_id(prefix, sep="-"):
    return f"{prefix}{sep}{unique()}"


def _choices(result):
    """The engine's choices: `choices` with n > 1, else the result itself."""
    return result.get("choices") or [result]


def usage(result):
    pt = int(result.get("prompt_tokens") or 0)
    ct = sum(int(c.get("completion_tokens") or 0) for c in _choices(result))
    out = {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct}
    if "cached_tokens" in result:
        out["prompt_tokens_details"] = {"cached_tokens": int(result["cached_tokens"])}
    return out


def _entries(lp):
    """The engine's logprobs entries (a list of {"token_id","text","logprob","top": [...]})."""
    if lp is None:
        return []
    return lp if isinstance(lp, list) else [lp]


def completion_logprobs(entries, offset=0):
    tokens, lps, tops, offsets = [], [], [], []
    for e in entries:
        tokens.append(e.get("text", ""))
        lps.append(e.get("logprob"))
        tops.append({t.get("text", ""): t.get("logprob") for t in e.get("top", [])})
        offsets.append(offset)
        offset += len(e.get("text", ""))
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(entries):
    def tok(e):
        t = e.get("text", "")
        return {"token": t, "logprob": e.get("logprob"), "bytes": list(t.encode("utf-8"))}

    return {"content": [{**tok(e), "top_logprobs": [tok(t) for t in e.get("top", [])]} for e in entries],
            "refusal": None}


def tool_calls(result):
    out = []
    for i, tc in enumerate(result.get("tool_calls") or []):
        fn = tc.get("function") if isinstance(tc.get("function"), dict) else tc
        args = fn.get("arguments", {})
        if not isinstance(args, str):
            args = msgspec.json.encode(args).decode()
        out.append({"id": tc.get("id") or f"call_{unique()}", "type": "function",
                    "function": {"name": fn.get("name", ""), "arguments": args}, "index": i})
    return out


def completion_response(result, model, rid=None):
    choices = []
    for i, r in enumerate(_choices(result)):
        choices.append({"index": i, "text": r.get("text", ""),
                        "logprobs": completion_logprobs(_entries(r["logprobs"])) if "logprobs" in r else None,
                        "finish_reason": FINISH.get(r.get("finish_reason"), r.get("finish_reason"))})
    return {"id": rid or new_id("cmpl"), "object": "text_completion", "created": int(time.time()),
            "model": model, "choices": choices, "usage": usage(result), "timings": result.get("timings")}


def chat_response(result, model, rid=None):
    from .textstream import split_reasoning

    choices = []
    for i, r in enumerate(_choices(result)):
        reasoning, content, calls = split_reasoning(r)
        msg = {"role": "assistant", "content": content, "refusal": None}
        if reasoning:
            msg["reasoning_content"] = reasoning
        finish = FINISH.get(r.get("finish_reason"), r.get("finish_reason"))
        calls = tool_calls(r)
        if calls:
            msg["content"] = content or None
            msg["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} for c in calls]
            finish = "tool_calls"
        choices.append({"index": i, "message": msg, "finish_reason": finish,
                        "logprobs": chat_logprobs(_entries(r["logprobs"])) if "logprobs" in r else None})
    return {"id": rid or new_id("chatcmpl"), "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": choices, "usage": usage(result), "timings": result.get("timings")}


def embedding_response(result, model, encoding_format, dimensions=None):
    vectors = result["embeddings"]
    if dimensions is not None and dimensions != result.get("dim"):
        raise HTTPError(400, f"`dimensions`: this model's embeddings have {result.get('dim')} dimensions, "
                        f"not {dimensions}", param="dimensions", code="unsupported_parameter")
    data = []
    for i, v in enumerate(vectors):
        if encoding_format == "base64":  # little-endian float32, as OpenAI sends
            v = base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode("ascii")
        data.append({"object": "embedding", "index": i, "embedding": v})
    n = int(sum(result.get("n_tokens") or [])) if isinstance(result.get("n_tokens"), list) else int(
        result.get("n_tokens") or 0)
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": n, "total_tokens": n}, "timings": result.get("timings")}


def infill_response(result, model):
    """llama.cpp server's /infill answer (the keys editors read)."""
    fr = result.get("finish_reason")
    return {"content": result.get("text", ""), "stop": True, "model": model,
            "stop_type": {"stop": "eos", "length": "limit", "stop_string": "word"}.get(fr, fr),
            "tokens_predicted": result.get("completion_tokens", 0),
            "tokens_evaluated": result.get("prompt_tokens", 0), "truncated": False,
            "timings": result.get("timings")}
