"""OpenAI's Responses API (`POST /v1/responses`) mapped onto the protocol's `generate` with
`messages`.

Request: `input` (a string: one user message; or a list of items: messages with string or
input_text/output_text parts, `function_call` and `function_call_output` items, reasoning
items) and `instructions` (a system message first); `tools` ({type: function, name,
description, parameters}), `tool_choice` auto / none / required / {type: function, name},
`parallel_tool_calls`; `text.format` json_schema / json_object / text; `max_output_tokens`,
`temperature`, `top_p` and the engine's other sampling fields (front/sampling.py) as
extra body fields; `reasoning.effort` "none"/"minimal" is the engine's `enable_thinking`
false, other efforts true (an extra `enable_thinking` wins), and the engine's
`reasoning_content` comes back as a reasoning item. Nothing is stored: `store` is accepted and ignored,
`previous_response_id` is refused (send the whole conversation).
Response: `output` items (reasoning, message with output_text, function_call), `status`
completed or incomplete (max_output_tokens), `usage`. Streaming: response.created,
response.in_progress, response.output_item.added / .done, response.content_part.added /
.done, response.output_text.delta / .done, response.reasoning_text.delta / .done,
response.function_call_arguments.delta / .done, response.completed, each with its
`sequence_number`.
"""

import json
import time
from typing import Annotated, Any, Optional, Union

import msgspec
from msgspec import Meta

from .api import MAX_TOKENS, HTTPError, unsupported
from .api import new_id as _new_id
from .sampling import Extras, extras


class ResponsesRequest(Extras, kw_only=True):
    model: Optional[str] = None
    input: Union[Annotated[str, Meta(min_length=1)], Annotated[list[dict[str, Any]], Meta(min_length=1)]]
    instructions: Optional[str] = None
    max_output_tokens: Optional[Annotated[int, Meta(ge=1, le=MAX_TOKENS)]] = None
    temperature: Optional[Annotated[float, Meta(ge=0.0, le=2.0)]] = None
    top_p: Optional[Annotated[float, Meta(gt=0.0, le=1.0)]] = None
    stream: bool = False
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Union[str, dict[str, Any], None] = None
    parallel_tool_calls: Optional[bool] = None
    text: Optional[dict[str, Any]] = None
    reasoning: Optional[dict[str, Any]] = None
    store: Optional[bool] = None
    previous_response_id: Optional[str] = None
    metadata: Optional[dict[str, Any]] = None
    user: Optional[str] = None
    top_logprobs: Optional[Annotated[int, Meta(ge=0, le=20)]] = None
    include: Optional[list[str]] = None
    truncation: Optional[str] = None


def _bad(param, message):
    return HTTPError(400, message, param=param, code="invalid_value")


def _content_text(content, where):
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(where, f"`{where}`: must be a string or a list of content parts")
    parts = []
    for j, p in enumerate(content):
        kind = p.get("type") if isinstance(p, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(p.get("text"), str):
            parts.append(p["text"])
        else:
            raise HTTPError(400, f"`{where}[{j}]`: only text parts are supported (got {kind!r})",
                            param=f"{where}[{j}]", code="unsupported_parameter")
    return "".join(parts)


def _messages(req: ResponsesRequest):
    out = []
    if req.instructions:
        out.append({"role": "system", "content": req.instructions})
    if isinstance(req.input, str):
        out.append({"role": "user", "content": req.input})
        return out
    pending_reasoning = None
    for i, item in enumerate(req.input):
        where = f"input[{i}]"
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise _bad(f"{where}.role", f"`{where}.role`: must be user, assistant, system or developer")
            msg = {"role": "system" if role == "developer" else role,
                   "content": _content_text(item.get("content", ""), f"{where}.content")}
            if role == "assistant" and pending_reasoning:
                msg["reasoning_content"], pending_reasoning = pending_reasoning, None
            out.append(msg)
        elif kind == "function_call":
            if not isinstance(item.get("name"), str) or not isinstance(item.get("call_id"), str):
                raise _bad(where, f"`{where}`: a function_call item needs `call_id` and `name`")
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item.get("arguments") or "{}"}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            else:
                msg = {"role": "assistant", "content": "", "tool_calls": [call]}
                if pending_reasoning:
                    msg["reasoning_content"], pending_reasoning = pending_reasoning, None
                out.append(msg)
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise _bad(where, f"`{where}`: a function_call_output item needs `call_id`")
            output = item.get("output", "")
            out.append({"role": "tool", "tool_call_id": item["call_id"],
                        "content": output if isinstance(output, str) else _content_text(output, f"{where}.output")})
        elif kind == "reasoning":
            texts = [c.get("text", "") for c in (item.get("content") or []) if isinstance(c, dict)]
            pending_reasoning = "".join(texts) or None
        else:
            raise HTTPError(400, f"`{where}`: item type {kind!r} is not supported (message, function_call, "
                            f"function_call_output, reasoning)", param=where, code="unsupported_parameter")
    if not out or all(m["role"] == "system" for m in out):
        raise _bad("input", "`input` has no message to answer")
    return out


def _tools(tools):
    out = []
    for i, t in enumerate(tools):
        if t.get("type") != "function" or not isinstance(t.get("name"), str):
            raise HTTPError(400, f"`tools[{i}]`: only function tools ({{\"type\": \"function\", \"name\", "
                            f"\"parameters\"}}) are supported, not {t.get('type')!r}", param=f"tools[{i}]",
                            code="unsupported_parameter")
        fn = {"name": t["name"], "parameters": t.get("parameters") or {"type": "object"}}
        if isinstance(t.get("description"), str):
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    return out


def params(req: ResponsesRequest, default_max_tokens=512, extra=None):
    if req.previous_response_id is not None:
        raise unsupported("previous_response_id", "is not supported: this server stores nothing; send the "
                          "whole conversation in `input`")
    p = {"messages": _messages(req), "max_tokens": req.max_output_tokens or default_max_tokens}
    # left out: the model's own default (api.with_model_defaults), else the engine's greedy
    if req.temperature is not None:
        p["temperature"] = req.temperature
    if req.top_p is not None:
        p["top_p"] = req.top_p
    p.update(extras(req))
    if req.top_logprobs:
        p["logprobs"] = req.top_logprobs
    choice = req.tool_choice
    if req.tools and choice != "none":
        p["tools"] = _tools(req.tools)
        if choice in ("required",):
            p["tool_choice"] = "required"
        elif isinstance(choice, dict):
            name = choice.get("name") or (choice.get("function") or {}).get("name")
            if choice.get("type") != "function" or not isinstance(name, str):
                raise _bad("tool_choice", "`tool_choice`: auto, none, required or {\"type\": \"function\", \"name\"}")
            p["tool_choice"] = {"type": "function", "function": {"name": name}}
        elif choice not in (None, "auto"):
            raise _bad("tool_choice", "`tool_choice`: auto, none, required or {\"type\": \"function\", \"name\"}")
        if req.parallel_tool_calls is False:
            p["parallel_tool_calls"] = False
    fmt = (req.text or {}).get("format") if isinstance(req.text, dict) else None
    if isinstance(fmt, dict):
        kind = fmt.get("type")
        if kind == "json_schema":
            if not isinstance(fmt.get("schema"), dict):
                raise _bad("text.format.schema", "`text.format`: json_schema needs a `schema` object")
            p["json_schema"] = fmt["schema"]
        elif kind == "json_object":
            p["json_schema"] = {"type": "object"}
        elif kind != "text":
            raise _bad("text.format.type", f"`text.format.type`: text, json_object or json_schema, not {kind!r}")
    effort = (req.reasoning or {}).get("effort") if isinstance(req.reasoning, dict) else None
    if effort is not None and "enable_thinking" not in p:
        p["enable_thinking"] = effort not in ("none", "minimal")
    if extra:
        p.update(extra)
    return p


# -- responses -------------------------------------------------------------------------------

def new_id(prefix):
    return _new_id(prefix, "_")


def usage(result, reasoning_tokens=0):
    pt = int(result.get("prompt_tokens") or 0)
    ct = int(result.get("completion_tokens") or 0)
    return {"input_tokens": pt, "input_tokens_details": {"cached_tokens": int(result.get("cached_tokens") or 0)},
            "output_tokens": ct, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": pt + ct}


def reasoning_item(text, rid=None):
    return {"type": "reasoning", "id": rid or new_id("rs"), "summary": [],
            "content": [{"type": "reasoning_text", "text": text}], "status": "completed"}


def message_item(text, mid=None, status="completed"):
    return {"type": "message", "id": mid or new_id("msg"), "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def call_item(call, status="completed"):
    fn = call.get("function") or {}
    args = fn.get("arguments", "{}")
    if not isinstance(args, str):
        args = json.dumps(args, ensure_ascii=False)
    return {"type": "function_call", "id": new_id("fc"), "call_id": new_id("call"),
            "name": fn.get("name", ""), "arguments": args, "status": status}


def envelope(rid, req: ResponsesRequest, model, created, status, output, result=None):
    incomplete = None
    if status == "incomplete":
        incomplete = {"reason": "max_output_tokens"}
    return {"id": rid, "object": "response", "created_at": created, "status": status, "error": None,
            "incomplete_details": incomplete, "instructions": req.instructions, "model": model,
            "output": output, "parallel_tool_calls": req.parallel_tool_calls is not False,
            "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
            "tools": req.tools or [], "temperature": req.temperature,
            "top_p": req.top_p,
            "max_output_tokens": req.max_output_tokens, "metadata": req.metadata or {},
            "text": req.text or {"format": {"type": "text"}}, "store": False, "truncation": "disabled",
            "usage": usage(result) if result is not None else None}


def status_of(result):
    return "incomplete" if result.get("finish_reason") == "length" and not result.get("tool_calls") else "completed"


def response(result, req, model, reasoning, content, calls):
    output = []
    if reasoning:
        output.append(reasoning_item(reasoning))
    if content or not calls:
        output.append(message_item(content))
    output.extend(call_item(c) for c in calls)
    out = envelope(new_id("resp"), req, model, int(time.time()), status_of(result), output, result)
    out["timings"] = result.get("timings")
    return out


class Events:
    """Numbered server-sent events of a streamed response."""

    def __init__(self):
        self.n = 0

    def __call__(self, kind, **data):
        data = {"type": kind, "sequence_number": self.n, **data}
        self.n += 1
        return b"event: " + kind.encode() + b"\ndata: " + msgspec.json.encode(data) + b"\n\n"
