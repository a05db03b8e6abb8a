"""Sampling parameters beyond an API's own, for the fronts whose official clients do not
type them (Anthropic's Messages, OpenAI's Responses): clients send them as extra body
fields and the front passes each one given to the engine under the same name (llama.cpp
server's names). The engine checks their values; an engine that does not have one answers
"unknown field", which the front turns into a 400 `unsupported_parameter` naming it.
`n` is not among them: these APIs answer one message."""

from typing import Any, Optional

from msgspec import Struct

FIELDS = ("top_k", "min_p", "seed", "repeat_penalty", "repeat_last_n", "frequency_penalty",
          "presence_penalty", "logit_bias", "typical_p", "dry_multiplier", "dry_base",
          "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers", "enable_thinking",
          "thinking_budget", "cache_prompt")


class Extras(Struct, kw_only=True):
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    seed: Optional[int] = None
    repeat_penalty: Optional[float] = None
    repeat_last_n: Optional[int] = None
    frequency_penalty: Optional[float] = None
    presence_penalty: Optional[float] = None
    logit_bias: Optional[Any] = None
    typical_p: Optional[float] = None
    dry_multiplier: Optional[float] = None
    dry_base: Optional[float] = None
    dry_allowed_length: Optional[int] = None
    dry_penalty_last_n: Optional[int] = None
    dry_sequence_breakers: Optional[list[str]] = None
    enable_thinking: Optional[bool] = None
    thinking_budget: Optional[int] = None
    cache_prompt: Optional[bool] = None


def extras(req) -> dict:
    """The extra sampling fields the request gave (None: left to the engine's default)."""
    return {k: getattr(req, k) for k in FIELDS if getattr(req, k, None) is not None}
