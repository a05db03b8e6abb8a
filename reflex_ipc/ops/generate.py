"""generate: continue a prompt, greedy by default, optionally streaming tokens."""

import time
from typing import Annotated, Literal, Optional, Union

from msgspec import Meta, Struct

from . import MAX_TOKENS
from ._base import (INT64_MAX, ModelName, ModelRequest, NonEmptyStr, Result as _Result, StateInfo, StatePath,
                    kv_args, merge, ms)


class GenerateRequest(ModelRequest, kw_only=True):
    prompt: Annotated[str, Meta(min_length=1, description="tokenized with special tokens "
                                                          "parsed, BOS per the GGUF")]
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
    cache_prompt: Annotated[bool, Meta(
        description="reuse the state of the longest token prefix shared with the previous "
                    "request (cached_tokens in the result)")] = True
    kv_import: Annotated[StatePath, Meta(
        description="a saved state file (protocol/STATE.md) to start from; prompt is then the "
                    "text after its tokens")] = None
    kv_export: Annotated[StatePath, Meta(
        description="save the state to this file once the prompt is evaluated (replaced "
                    "atomically)")] = None


class GenerateResult(_Result, kw_only=True):
    text: str
    token_ids: list[int]
    finish_reason: Literal["stop", "length", "stop_string"]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: Annotated[int, Meta(description="prompt tokens whose state was reused")]
    model: ModelName
    kv_import: Optional[StateInfo] = None
    kv_export: Optional[StateInfo] = None


class Token(Struct, kw_only=True):
    """A streamed token line (generate with stream: true)."""

    event: Literal["token"]
    id: Union[str, int, None]
    token_id: int
    text: str


Request, Result = GenerateRequest, GenerateResult


def stops(req) -> list:
    return [req.stop] if isinstance(req.stop, str) else list(req.stop)


def execute(runner, req, *, on_token=None, should_cancel=None) -> dict:
    """runner.generate with the request's parameters (the CLI calls this too)."""
    return runner.generate(
        req.prompt, max_tokens=req.max_tokens, temperature=req.temperature, top_k=req.top_k,
        top_p=req.top_p, min_p=req.min_p, seed=req.seed, repeat_penalty=req.repeat_penalty,
        repeat_last_n=req.repeat_last_n, stop=stops(req), on_token=on_token,
        should_cancel=should_cancel, cache_prompt=req.cache_prompt, **kv_args(req))


def run(call, req) -> dict:
    _, info, runner = call.runner(req)

    def on_token(token_id, text):
        call.first_token()
        if req.stream:
            call.emit_token(int(token_id), text)

    t = time.perf_counter()
    out = execute(runner, req, on_token=on_token, should_cancel=call.should_cancel)
    return merge(out, info.get("model"), call.timings, ms(t))
