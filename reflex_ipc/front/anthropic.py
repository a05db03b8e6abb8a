"""Anthropic's Messages API (`POST /v1/messages`) mapped onto the protocol's `generate`
with `messages` (rendered by the engine with the model's chat template).

Request: `system` (a string or text blocks) becomes the first system message; a user
turn's `tool_result` blocks become `tool` messages (before its text), an assistant turn's
`tool_use` blocks its `tool_calls` and its `thinking` blocks its `reasoning_content`;
`tools` ({name, description, input_schema}) become function tools; `tool_choice` auto /
any / tool / none maps to auto / required / the named function / none (required and named
are enforced by a grammar in the engine); `thinking` {type: enabled, budget_tokens} is the
engine's `enable_thinking` true and `thinking_budget` (disabled: false; a budget needs a
model with <think> tokens, else a 400);
`output_config.format` {type: json_schema, schema} constrains the reply to the schema.
`temperature`, `top_p` and `top_k` are read when present (left out: the model's own
defaults, else greedy, as on every endpoint of the front), and the engine's other
sampling fields (front/sampling.py) as extra body fields under the engine's names.
Response: `content` blocks (thinking, text, tool_use), `stop_reason` end_turn /
max_tokens / stop_sequence / tool_use, `usage`. Streaming: message_start,
content_block_start / content_block_delta / content_block_stop per block, message_delta
(stop_reason, usage), message_stop.
"""

import json
import time
from typing import Annotated, Any, Literal, Optional, Union

import msgspec
from msgspec import Meta, Struct

from .api import MAX_TOKENS, HTTPError
from .api import new_id as _new_id
from .sampling import Extras, extras

# -- requests --------------------------------------------------------------------------------


class ToolChoice(Struct, kw_only=True):
    type: Literal["auto", "any", "tool", "none"]
    name: Optional[str] = None
    disable_parallel_tool_use: Optional[bool] = None


class Thinking(Struct, kw_only=True):
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: Optional[Annotated[int, Meta(ge=1, le=MAX_TOKENS)]] = None
    display: Optional[str] = None


class OutputFormat(Struct, kw_only=True):
    type: Literal["json_schema"]
    schema: dict[str, Any]


class OutputConfig(Struct, kw_only=True):
    format: Optional[OutputFormat] = None
    effort: Optional[str] = None


class Message(Struct, kw_only=True):
    role: Literal["user", "assistant"]
    content: Union[str, list[dict[str, Any]]]


class MessagesRequest(Extras, kw_only=True):
    model: Optional[str] = None
    max_tokens: Annotated[int, Meta(ge=1, le=MAX_TOKENS)]
    messages: Annotated[list[Message], Meta(min_length=1)]
    system: Union[str, list[dict[str, Any]], None] = None
    stop_sequences: Optional[Annotated[list[Annotated[str, Meta(min_length=1)]], Meta(max_length=16)]] = None
    stream: bool = False
    temperature: Optional[Annotated[float, Meta(ge=0.0, le=1.0)]] = None
    top_p: Optional[Annotated[float, Meta(gt=0.0, le=1.0)]] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[ToolChoice] = None
    thinking: Optional[Thinking] = None
    output_config: Optional[OutputConfig] = None
    metadata: Optional[dict[str, Any]] = None
    service_tier: Optional[str] = None


def _bad(param, message):
    return HTTPError(400, message, param=param, code="invalid_value")


def _text_of(blocks, where):
    """The text of a string or a list of text blocks."""
    if isinstance(blocks, str):
        return blocks
    parts = []
    for j, b in enumerate(blocks):
        if not isinstance(b, dict) or b.get("type") != "text" or not isinstance(b.get("text"), str):
            raise _bad(f"{where}[{j}]", f"`{where}[{j}]`: only text blocks are supported here "
                                        f"(got {b.get('type') if isinstance(b, dict) else type(b).__name__!r})")
        parts.append(b["text"])
    return "".join(parts)


def _messages(req: MessagesRequest):
    out = []
    if req.system is not None:
        system = _text_of(req.system, "system")
        if system:
            out.append({"role": "system", "content": system})
    for i, m in enumerate(req.messages):
        where = f"messages[{i}].content"
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
            continue
        texts, calls, results, thinking = [], [], [], []
        for j, b in enumerate(m.content):
            kind = b.get("type") if isinstance(b, dict) else None
            at = f"{where}[{j}]"
            if kind == "text" and isinstance(b.get("text"), str):
                texts.append(b["text"])
            elif kind == "tool_use" and m.role == "assistant":
                if not isinstance(b.get("name"), str) or not isinstance(b.get("id"), str):
                    raise _bad(at, f"`{at}`: a tool_use block needs `id` and `name`")
                args = b.get("input", {})
                if not isinstance(args, dict):
                    raise _bad(at, f"`{at}.input`: must be an object")
                calls.append({"id": b["id"], "type": "function",
                              "function": {"name": b["name"], "arguments": json.dumps(args, ensure_ascii=False)}})
            elif kind == "tool_result" and m.role == "user":
                if not isinstance(b.get("tool_use_id"), str):
                    raise _bad(at, f"`{at}`: a tool_result block needs `tool_use_id`")
                c = b.get("content", "")
                text = _text_of(c, f"{at}.content") if isinstance(c, (str, list)) else json.dumps(c)
                if b.get("is_error"):
                    text = f"Error: {text}"
                results.append({"role": "tool", "tool_call_id": b["tool_use_id"], "content": text})
            elif kind in ("thinking", "redacted_thinking") and m.role == "assistant":
                if isinstance(b.get("thinking"), str):
                    thinking.append(b["thinking"])
            else:
                raise HTTPError(400, f"`{at}`: block type {kind!r} is not supported in a {m.role} turn "
                                f"(text, tool_use/thinking for assistant, tool_result for user)",
                                param=at, code="unsupported_parameter")
        out.extend(results)
        if m.role == "assistant":
            msg = {"role": "assistant", "content": "".join(texts)}
            if calls:
                msg["tool_calls"] = calls
            if thinking:
                msg["reasoning_content"] = "".join(thinking)
            out.append(msg)
        elif texts or not results:
            out.append({"role": "user", "content": "".join(texts)})
    return out


def _tools(tools):
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t.get("name"), str) or not t["name"]:
            raise _bad(f"tools[{i}]", f"`tools[{i}]`: a tool needs a `name` (server tools such as "
                                      f"{t.get('type')!r} are not supported)")
        fn = {"name": t["name"], "parameters": t.get("input_schema") or {"type": "object"}}
        if isinstance(t.get("description"), str):
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    return out


def params(req: MessagesRequest, extra=None):
    """The engine's generate params of a Messages request."""
    p = {"messages": _messages(req), "max_tokens": req.max_tokens}
    # left out: the model's own default (api.with_model_defaults), else the engine's greedy
    if req.temperature is not None:
        p["temperature"] = req.temperature
    if req.top_p is not None:
        p["top_p"] = req.top_p
    p.update(extras(req))
    if req.stop_sequences:
        p["stop"] = list(req.stop_sequences)
    choice = req.tool_choice
    if req.tools and not (choice and choice.type == "none"):
        p["tools"] = _tools(req.tools)
        if choice is not None:
            if choice.type == "any":
                p["tool_choice"] = "required"
            elif choice.type == "tool":
                if not choice.name:
                    raise _bad("tool_choice.name", "`tool_choice`: type tool needs a `name`")
                p["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
            if choice.disable_parallel_tool_use:
                p["parallel_tool_calls"] = False
    fmt = req.output_config.format if req.output_config is not None else None
    if fmt is not None:
        if p.get("tool_choice") is not None:
            raise _bad("output_config.format", "`output_config.format` cannot be combined with a forced tool call")
        p["json_schema"] = fmt.schema
    if req.thinking is not None:
        on = req.thinking.type != "disabled"
        p["enable_thinking"] = on
        if on and req.thinking.budget_tokens is not None:
            p["thinking_budget"] = req.thinking.budget_tokens
        elif not on:
            p.pop("thinking_budget", None)
    if extra:
        p.update(extra)
    return p


# -- responses -------------------------------------------------------------------------------

def new_id(prefix):
    return _new_id(prefix, "_")


def stop_reason(result, stops):
    """(stop_reason, stop_sequence)."""
    if result.get("tool_calls"):
        return "tool_use", None
    fr = result.get("finish_reason")
    if fr == "length":
        return "max_tokens", None
    if fr == "stop_string":
        seq = result.get("stop_string")
        if seq is None and stops and len(stops) == 1:
            seq = stops[0]
        return "stop_sequence", seq
    return "end_turn", None


def usage(result):
    u = {"input_tokens": int(result.get("prompt_tokens") or 0),
         "output_tokens": int(result.get("completion_tokens") or 0)}
    if "cached_tokens" in result:
        u["cache_read_input_tokens"] = int(result["cached_tokens"])
        u["cache_creation_input_tokens"] = 0
    return u


def _tool_use(call):
    fn = call.get("function") or {}
    args = fn.get("arguments", "{}")
    try:
        obj = json.loads(args) if isinstance(args, str) else args
    except ValueError:
        obj = {}
    return {"type": "tool_use", "id": new_id("toolu"), "name": fn.get("name", ""),
            "input": obj if isinstance(obj, dict) else {}}


def content_blocks(result):
    blocks = []
    reasoning = result.get("reasoning_content")
    if reasoning:
        blocks.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    calls = result.get("tool_calls") or []
    text = result.get("content", "") if calls else result.get("text", "")
    if text or not calls:
        blocks.append({"type": "text", "text": text})
    blocks.extend(_tool_use(c) for c in calls)
    return blocks


def response(result, model, stops=None):
    reason, seq = stop_reason(result, stops)
    return {"id": new_id("msg"), "type": "message", "role": "assistant", "model": model,
            "content": content_blocks(result), "stop_reason": reason, "stop_sequence": seq,
            "usage": usage(result), "timings": result.get("timings")}


def error_body(e: HTTPError):
    kind = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
            404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
            503: "overloaded_error", 529: "overloaded_error"}.get(e.status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": e.message}}


def event(name, data):
    return b"event: " + name.encode() + b"\ndata: " + msgspec.json.encode({"type": name, **data}) + b"\n\n"


class StreamState:
    """The content blocks of a streamed message, opened and closed as the text comes."""

    def __init__(self):
        self.index = -1
        self.open = None  # "text" | "thinking" | None

    def start(self, kind):
        out = []
        if self.open == kind:
            return out
        out += self.stop()
        self.index += 1
        self.open = kind
        block = {"type": "text", "text": ""} if kind == "text" else {"type": "thinking", "thinking": ""}
        out.append(event("content_block_start", {"index": self.index, "content_block": block}))
        return out

    def delta(self, kind, text):
        if not text:
            return []
        out = self.start(kind)
        d = {"type": "text_delta", "text": text} if kind == "text" else {"type": "thinking_delta", "thinking": text}
        out.append(event("content_block_delta", {"index": self.index, "delta": d}))
        return out

    def stop(self):
        if self.open is None:
            return []
        out = []
        if self.open == "thinking":
            out.append(event("content_block_delta", {"index": self.index,
                                                     "delta": {"type": "signature_delta", "signature": ""}}))
        out.append(event("content_block_stop", {"index": self.index}))
        self.open = None
        return out

    def tool_use(self, call):
        out = self.stop()
        self.index += 1
        block = _tool_use(call)
        args = json.dumps(block["input"], ensure_ascii=False)
        out.append(event("content_block_start", {"index": self.index, "content_block": {**block, "input": {}}}))
        out.append(event("content_block_delta", {"index": self.index,
                                                 "delta": {"type": "input_json_delta", "partial_json": args}}))
        out.append(event("content_block_stop", {"index": self.index}))
        return out


def message_start(mid, model):
    return event("message_start", {"message": {
        "id": mid, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": 0}}})


def now():
    return int(time.time())
