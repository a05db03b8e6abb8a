"""system1: score candidate continuations of a prompt in one forward pass."""

import time
from typing import Annotated, Optional

from msgspec import Meta, Struct

from ._base import (ModelName, ModelRequest, NonEmptyStr, Result as _Result, StateInfo, StatePath, kv_args,
                    merge, ms)


class System1Request(ModelRequest, kw_only=True):
    prompt: NonEmptyStr
    candidates: Annotated[list[NonEmptyStr], Meta(min_length=1, max_length=1024)]
    temperature: Annotated[float, Meta(gt=0.0, le=100.0,
                                       description="for the candidate probabilities")] = 1.0
    cache_prompt: Annotated[bool, Meta(
        description="reuse the state of the longest token prefix shared with the previous "
                    "request (cached_tokens in the result)")] = True
    kv_import: Annotated[StatePath, Meta(
        description="a saved state file (protocol/STATE.md) to start from; prompt is then the "
                    "text after its tokens")] = None
    kv_export: Annotated[StatePath, Meta(
        description="save the state (the prompt) to this file (replaced atomically)")] = None


class Candidate(Struct):
    text: str
    token_ids: list[int]
    logprob: float
    mean_logprob: float
    probability: float


class System1Result(_Result, kw_only=True):
    candidates: list[Candidate]
    best_idx: Annotated[int, Meta(ge=0)]
    entropy: float
    prompt_tokens: int
    candidate_tokens: Annotated[int, Meta(description="the candidates' tokens, all together")]
    cached_tokens: Annotated[int, Meta(description="prompt tokens whose state was reused")]
    model: ModelName
    kv_import: Optional[StateInfo] = None
    kv_export: Optional[StateInfo] = None


Request, Result = System1Request, System1Result


def execute(runner, req, *, should_cancel=None) -> dict:
    return runner.system1(req.prompt, list(req.candidates), temperature=req.temperature,
                          should_cancel=should_cancel, cache_prompt=req.cache_prompt, **kv_args(req))


def run(call, req) -> dict:
    _, info, runner = call.runner(req)
    t = time.perf_counter()
    out = execute(runner, req, should_cancel=call.should_cancel)
    return merge(out, info.get("model"), call.timings, ms(t))
