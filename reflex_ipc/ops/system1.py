"""system1: score candidate continuations of a prompt or a chat conversation in one forward pass."""

from typing import Annotated, Optional

from msgspec import Meta, Struct

from ._base import (AddGenerationPrompt, ChatTemplate, EnableThinking, Messages, ModelName,
                    ModelRequest, NonEmptyStr, Result as _Result, StartInfo, StateInfo, StatePath,
                    TemplateKwargs, exactly_one)


EXACTLY_ONE = ("prompt", "messages")  # the request gives exactly one of them (schema.json too)


class System1Request(ModelRequest, kw_only=True):
    prompt: Optional[Annotated[str, Meta(
        min_length=1, description="the text the candidates continue (exactly one of this "
                                  "and messages)")]] = None
    messages: Optional[Messages] = None
    chat_template: Optional[ChatTemplate] = None
    chat_template_kwargs: Optional[TemplateKwargs] = None
    enable_thinking: EnableThinking = None
    add_generation_prompt: AddGenerationPrompt = True
    candidates: Annotated[list[NonEmptyStr], Meta(min_length=1, max_length=1024)]
    temperature: Annotated[float, Meta(gt=0.0, le=100.0,
                                       description="for the candidate probabilities")] = 1.0
    cache_prompt: Annotated[bool, Meta(
        description="reuse the state of the longest token prefix shared with the previous "
                    "request (cached_tokens in the result)")] = True
    prefix_cache: Annotated[bool, Meta(
        description="start from the prefix cache's saved state of the prompt's leading tokens "
                    "(shared by every reflex process of the machine) and save this prompt's "
                    "state there after the answer; false: neither (REFLEX_PREFIX_CACHE=0 turns "
                    "it off for the whole process)")] = True
    kv_import: Annotated[StatePath, Meta(
        description="a saved state file (protocol/STATE.md) to start from; prompt is then the "
                    "text after its tokens")] = None
    kv_export: Annotated[StatePath, Meta(
        description="save the state (the prompt) to this file (replaced atomically)")] = None

    def __post_init__(self):
        exactly_one(self, *EXACTLY_ONE)


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
    cached_tokens: Annotated[int, Meta(ge=0, description="prompt tokens whose state was reused")]
    model: ModelName
    kv_import: Optional[StateInfo] = None
    kv_export: Optional[StateInfo] = None
    start: StartInfo = None


Request, Result = System1Request, System1Result


def run(call, req) -> dict:
    return call.fields(call.model(req).decide(req, should_cancel=call.should_cancel))
