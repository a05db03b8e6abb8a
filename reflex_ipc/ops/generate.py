"""generate: continue a prompt or a chat conversation, greedy by default, optionally streaming tokens."""

import time
from typing import Annotated, Any, Literal, Optional, Union

import msgspec
from msgspec import Meta, Struct

from . import MAX_TOKENS
from ._base import (INT64_MAX, AddGenerationPrompt, ChatTemplate, Messages, ModelName,
                    ModelRequest, NonEmptyStr, Result as _Result, StateInfo, StatePath, TemplateKwargs,
                    Tools, chat_prompt, exactly_one, kv_args, merge, ms)

MAX_LOGPROBS = 20


EXACTLY_ONE = ("prompt", "messages")  # the request gives exactly one of them (schema.json too)


class DecodeRequest(ModelRequest, kw_only=True):
    """generate's and infill's sampling, stop, stream, logprobs, reuse and constraint
    parameters."""

    max_tokens: Annotated[int, Meta(ge=1, le=MAX_TOKENS,
                                    description="the most tokens to generate")] = 64
    temperature: Annotated[float, Meta(ge=0.0, le=100.0, description="0 is greedy")] = 0.0
    top_k: Annotated[int, Meta(ge=0, le=INT64_MAX, description="0 is off")] = 0
    top_p: Annotated[float, Meta(gt=0.0, le=1.0, description="nucleus sampling; 1 is off")] = 1.0
    min_p: Annotated[float, Meta(ge=0.0, le=1.0, description="0 is off")] = 0.0
    seed: Optional[Annotated[int, Meta(ge=0, le=INT64_MAX, description="null: random")]] = None
    repeat_penalty: Annotated[float, Meta(gt=0.0, le=100.0, description="1 is off")] = 1.0
    repeat_last_n: Annotated[int, Meta(ge=0, le=1048576,
                                       description="tokens the penalty looks back on")] = 64
    stop: Union[NonEmptyStr, Annotated[list[NonEmptyStr], Meta(max_length=16)]] = []
    stream: Annotated[bool, Meta(description="write a token line per generated token")] = False
    logprobs: Optional[Annotated[int, Meta(
        ge=0, le=MAX_LOGPROBS, description="per generated token its log-probability and the N "
                                           "most likely tokens'; null: none")]] = None
    cache_prompt: Annotated[bool, Meta(
        description="reuse the state of the longest token prefix shared with the previous "
                    "request (cached_tokens in the result)")] = True
    json_schema: Optional[Annotated[Union[dict[str, Any], bool], Meta(
        description="constrain the output to this JSON Schema")]] = None
    regex: Optional[Annotated[str, Meta(
        description="constrain the output to this regular expression")]] = None
    grammar: Optional[Annotated[str, Meta(
        description="constrain the output to this Lark grammar")]] = None


class ToolChoiceFunction(Struct, kw_only=True):
    name: NonEmptyStr


class ToolChoice(Struct, kw_only=True):
    """A named function that the reply must call."""

    type: Literal["function"]
    function: ToolChoiceFunction


class GenerateRequest(DecodeRequest, kw_only=True):
    prompt: Optional[Annotated[str, Meta(
        min_length=1, description="tokenized with special tokens parsed, BOS per the GGUF "
                                  "(exactly one of this and messages)")]] = None
    messages: Optional[Messages] = None
    tools: Optional[Tools] = None
    tool_choice: Annotated[Union[Literal["auto", "none", "required"], ToolChoice], Meta(
        description="with tools: auto (the model decides), none (tools not offered), required "
                    "(at least one call) or a named function, the last two enforced by a grammar "
                    "so the arguments always parse")] = "auto"
    parallel_tool_calls: Annotated[bool, Meta(
        description="with tools: allow more than one call in a reply")] = True
    chat_template: Optional[ChatTemplate] = None
    chat_template_kwargs: Optional[TemplateKwargs] = None
    add_generation_prompt: AddGenerationPrompt = True
    kv_import: Annotated[StatePath, Meta(
        description="a saved state file (protocol/STATE.md) to start from; prompt is then the "
                    "text after its tokens")] = None
    kv_export: Annotated[StatePath, Meta(
        description="save the state to this file once the prompt is evaluated (replaced "
                    "atomically)")] = None

    def __post_init__(self):
        exactly_one(self, *EXACTLY_ONE)


class TopLogprob(Struct, kw_only=True):
    token_id: Annotated[int, Meta(ge=0)]
    text: str
    logprob: float


class Logprob(Struct, kw_only=True):
    """A generated token's log-probability and the most likely alternatives (log-softmax
    over the full vocabulary after the temperature, before truncation)."""

    token_id: Annotated[int, Meta(ge=0)]
    text: str
    logprob: float
    top: Annotated[list[TopLogprob], Meta(max_length=MAX_LOGPROBS)]


class ToolCallFunction(Struct, kw_only=True):
    name: str
    arguments: Annotated[str, Meta(description="JSON text")]


class ToolCall(Struct, kw_only=True):
    id: str
    type: Literal["function"]
    function: ToolCallFunction


class DecodeResult(_Result, kw_only=True):
    """generate's and infill's result fields."""

    text: str
    token_ids: list[int]
    finish_reason: Literal["stop", "length", "stop_string"]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: Annotated[int, Meta(ge=0, description="prompt tokens whose state was reused")]
    model: ModelName
    logprobs: Annotated[list[Logprob], Meta(
        description="with logprobs: one entry per generated token")] = []
    tool_calls: Annotated[list[ToolCall], Meta(
        description="with tools: the calls parsed from the text")] = []
    content: Annotated[str, Meta(description="with tool_calls: the text outside them")] = ""


class GenerateResult(DecodeResult, kw_only=True):
    kv_import: Optional[StateInfo] = None
    kv_export: Optional[StateInfo] = None


class Token(Struct, kw_only=True):
    """A streamed token line (generate or infill with stream: true)."""

    event: Literal["token"]
    id: Union[str, int, None]
    token_id: int
    text: str
    logprobs: Optional[Annotated[Logprob, Meta(
        description="with logprobs: this token's entry")]] = None


Request, Result = GenerateRequest, GenerateResult


def stops(req) -> list:
    return [req.stop] if isinstance(req.stop, str) else list(req.stop)


def decode(runner, req, prompt, *, on_token=None, should_cancel=None, **kw) -> dict:
    """runner.generate of `prompt` (text or token ids) with the request's decoding
    parameters (generate and infill; the CLI calls this too)."""
    from .. import prepare

    extra = prepare.generate_extras(runner, logprobs=req.logprobs, cache_prompt=req.cache_prompt,
                                    json_schema=req.json_schema, regex=req.regex,
                                    grammar=req.grammar)
    return runner.generate(
        prompt, max_tokens=req.max_tokens, temperature=req.temperature, top_k=req.top_k,
        top_p=req.top_p, min_p=req.min_p, seed=req.seed, repeat_penalty=req.repeat_penalty,
        repeat_last_n=req.repeat_last_n, stop=stops(req), on_token=on_token,
        should_cancel=should_cancel, **extra, **kw)


def execute(runner, req, *, on_token=None, should_cancel=None) -> dict:
    """runner.generate with the request's parameters (the CLI calls this too); with
    `messages` the prompt is the rendered conversation, with `tools` the result gets the
    parsed tool_calls."""
    tools = req.tools if req.tool_choice != "none" else None
    if tools is None and req.tools is not None:
        req = msgspec.structs.replace(req, tools=None)
    elif tools and req.tool_choice != "auto":
        req = _forced_call(runner, req)
    prompt = chat_prompt(runner, req)
    out = decode(runner, req, prompt, on_token=on_token, should_cancel=should_cancel,
                 **kv_args(req))
    if tools:
        from .. import prepare

        out = prepare.add_tool_calls(dict(out), tools, runner=runner, chat_template=req.chat_template,
                                     parallel=req.parallel_tool_calls)
    return out


def _forced_call(runner, req):
    """tool_choice required / named: the request with the grammar that forces the call."""
    from .. import prepare
    from ..errors import ReflexError

    if req.messages is None:
        raise ReflexError("invalid_request", "`tool_choice`: goes with `messages` and `tools`")
    if any(getattr(req, k) is not None for k in ("json_schema", "regex", "grammar")):
        raise ReflexError("invalid_request", "`tool_choice` required or named forces a tool call; "
                                             "it cannot be combined with json_schema, regex or grammar")
    choice = req.tool_choice if isinstance(req.tool_choice, str) else msgspec.to_builtins(req.tool_choice)
    thinking = (getattr(req, "enable_thinking", None) is True
                or (req.chat_template_kwargs or {}).get("enable_thinking") is True)
    g = prepare.tool_grammar(runner, req.tools, choice, req.parallel_tool_calls, req.chat_template, thinking)
    return msgspec.structs.replace(req, grammar=g)


def token_callback(call, req):
    def on_token(token_id, text, logprobs=None, **_):
        call.first_token()
        if req.stream:
            call.emit_token(int(token_id), text, logprobs)

    return on_token


def run(call, req) -> dict:
    _, info, runner = call.runner(req)
    t = time.perf_counter()
    out = execute(runner, req, on_token=token_callback(call, req), should_cancel=call.should_cancel)
    return merge(out, info.get("model"), call.timings, ms(t))
