"""generate: continue a prompt or a chat conversation, greedy by default, optionally streaming tokens."""

from typing import Annotated, Any, Literal, Optional, Union

from msgspec import Meta, Struct, field

from . import MAX_TOKENS
from ._base import (INT64_MAX, AddGenerationPrompt, ChatTemplate, EnableThinking, Messages,
                    ModelName, ModelRequest, NonEmptyStr, Result as _Result, StartInfo, StateInfo, StatePath,
                    TemplateKwargs, Tools, exactly_one)

MAX_LOGPROBS = 20
MAX_N = 128  # choices of one request (OpenAI's limit for n)
MAX_WINDOW = 1048576  # the largest look-back window in tokens
DRY_BREAKERS = ["\n", ":", "\"", "*"]  # llama.cpp's default DRY sequence breakers
# a token id as a JSON object key: a decimal integer without sign or leading zero (the
# lookahead keeps Python's `$` from matching before a trailing newline, as JSON Schema's)
TokenKey = Annotated[str, Meta(pattern=r"^(0|[1-9][0-9]{0,9})(?!\n)$")]
Bias = Annotated[float, Meta(ge=-100.0, le=100.0)]
Penalty = Annotated[float, Meta(ge=-100.0, le=100.0)]


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
    typical_p: Annotated[float, Meta(gt=0.0, le=1.0, description="locally typical sampling; "
                                                                  "1 is off")] = 1.0
    repeat_penalty: Annotated[float, Meta(gt=0.0, le=100.0, description="1 is off")] = 1.0
    repeat_last_n: Annotated[int, Meta(ge=0, le=MAX_WINDOW,
                                       description="tokens the penalties look back on")] = 64
    frequency_penalty: Annotated[Penalty, Meta(
        description="subtracted from a token's logit per time it occurs in the last "
                    "repeat_last_n tokens; 0 is off")] = 0.0
    presence_penalty: Annotated[Penalty, Meta(
        description="subtracted from the logit of each token that occurs in the last "
                    "repeat_last_n tokens; 0 is off")] = 0.0
    logit_bias: Optional[Annotated[dict[TokenKey, Bias], Meta(
        max_length=4096, description="token id (a decimal string) -> a number added to its "
                                     "logit before sampling; -100 all but bans it")]] = None
    dry_multiplier: Annotated[float, Meta(
        ge=0.0, le=100.0, description="DRY: a token that would extend a repetition of the "
                                      "text's end loses multiplier * base ^ (length - "
                                      "allowed_length); 0 is off")] = 0.0
    dry_base: Annotated[float, Meta(ge=1.0, le=100.0, description="DRY's base")] = 1.75
    dry_allowed_length: Annotated[int, Meta(
        ge=0, le=MAX_WINDOW, description="DRY: repetitions up to this many tokens are free")] = 2
    dry_penalty_last_n: Annotated[int, Meta(
        ge=0, le=MAX_WINDOW, description="DRY: tokens it looks back on; 0 is off")] = 64
    dry_sequence_breakers: Annotated[list[NonEmptyStr], Meta(
        max_length=64, description="DRY: a repetition never reaches back past one of these "
                                   "strings")] = field(default_factory=lambda: list(DRY_BREAKERS))
    n: Annotated[int, Meta(ge=1, le=MAX_N, description="choices, generated one after another "
                                                       "from the prompt's state")] = 1
    thinking_budget: Optional[Annotated[int, Meta(
        ge=0, le=MAX_TOKENS, description="reasoning models: after this many tokens inside "
                                         "<think>, the block is closed; null: no limit")]] = None
    stop: Union[NonEmptyStr, Annotated[list[NonEmptyStr], Meta(max_length=16)]] = []
    stream: Annotated[bool, Meta(description="write a token line per generated token")] = False
    logprobs: Optional[Annotated[int, Meta(
        ge=0, le=MAX_LOGPROBS, description="per generated token its log-probability and the N "
                                           "most likely tokens'; null: none")]] = None
    cache_prompt: Annotated[bool, Meta(
        description="reuse the state of the longest token prefix shared with the previous "
                    "request (cached_tokens in the result)")] = True
    prefix_cache: Annotated[bool, Meta(
        description="start from the prefix cache's saved state of the prompt's leading tokens "
                    "(shared by every reflex process of the machine) and save this prompt's "
                    "state there after the answer; false: neither (REFLEX_PREFIX_CACHE=0 turns "
                    "it off for the whole process)")] = True
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
    enable_thinking: EnableThinking = None
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


FinishReason = Literal["stop", "length", "stop_string"]
ReasoningContent = Annotated[str, Meta(
    description="chat with a reasoning model: the text of its <think> block (text is then "
                "the rest)")]


class Choice(Struct, kw_only=True):
    """One of n choices (the result's own fields are choice 0's)."""

    index: Annotated[int, Meta(ge=0)]
    text: str
    token_ids: list[int]
    finish_reason: FinishReason
    completion_tokens: int
    logprobs: list[Logprob] = []
    tool_calls: list[ToolCall] = []
    content: str = ""
    reasoning_content: ReasoningContent = ""


class DecodeResult(_Result, kw_only=True):
    """generate's and infill's result fields."""

    text: str
    token_ids: list[int]
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: Annotated[int, Meta(description="choice 0's tokens")]
    cached_tokens: Annotated[int, Meta(ge=0, description="prompt tokens whose state was reused")]
    model: ModelName
    logprobs: Annotated[list[Logprob], Meta(
        description="with logprobs: one entry per generated token")] = []
    tool_calls: Annotated[list[ToolCall], Meta(
        description="with tools: the calls parsed from the text")] = []
    content: Annotated[str, Meta(description="with tool_calls: the text outside them")] = ""
    reasoning_content: ReasoningContent = ""
    choices: Annotated[list[Choice], Meta(
        description="with n > 1: every choice, choice 0 first")] = []
    start: StartInfo = None


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
    reasoning_content: Annotated[str, Meta(
        description="reasoning text that became final with this token (text: the rest)")] = ""
    index: Annotated[int, Meta(ge=0, description="with n > 1: the choice")] = 0


Request, Result = GenerateRequest, GenerateResult


def stops(req) -> list:
    return [req.stop] if isinstance(req.stop, str) else list(req.stop)


def token_callback(call, req):
    def on_token(token_id, text, **extra):
        call.first_token()
        if req.stream:
            call.emit_token(int(token_id), text, **extra)

    return on_token


def run(call, req) -> dict:
    model = call.model(req)
    return call.fields(model.generate(req, on_token=token_callback(call, req),
                                      should_cancel=call.should_cancel))
