"""What the op modules share: the request base structs, the constrained types,
and the helpers that fold an engine result into a protocol result."""

import time
from typing import Annotated, Any, Literal, Optional, Union

from msgspec import UNSET, Meta, Struct, UnsetType

from . import DEVICES

INT64_MAX = 2**63 - 1

NonEmptyStr = Annotated[str, Meta(min_length=1)]
Device = Literal[DEVICES]  # type: ignore[valid-type]
Backend = Literal["numpy", "cpu", "cuda"]
ModelName = Annotated[Optional[str], Meta(description="the model's general.name; null when none is loaded")]


class Request(Struct, forbid_unknown_fields=True, kw_only=True):
    """An op's parameters (besides `id` and `op`)."""


class ModelRequest(Request, kw_only=True):
    """The parameters of an op that uses a model."""

    model: Optional[Annotated[str, Meta(
        min_length=1, description="GGUF path or alias; null or absent: the active model, "
                                  "else the server's default")]] = None
    device: Optional[Annotated[Device, Meta(
        description="auto: CUDA when usable, else CPU; null or absent: the active "
                    "model's device, else the server's --device")]] = None


class ContentPart(Struct, kw_only=True):
    type: Literal["text"]
    text: str


class Message(Struct, kw_only=True):
    """A chat message (protocol/PROTOCOL.md, "Chat"); fields left out stay out of what
    the template sees (messages_of drops UNSET), as templates test `'tool_calls' in m`."""

    role: NonEmptyStr
    content: Union[str, list[ContentPart], None, UnsetType] = UNSET
    name: Union[str, UnsetType] = UNSET
    tool_calls: Union[list[dict[str, Any]], None, UnsetType] = UNSET
    tool_call_id: Union[str, UnsetType] = UNSET
    reasoning_content: Union[str, None, UnsetType] = UNSET


Messages = Annotated[list[Message], Meta(
    min_length=1, description="a conversation rendered with the model's chat template "
                              "(exactly one of this and the text)")]
Tools = Annotated[list[dict[str, Any]], Meta(
    description="OpenAI function tools, passed to the template (with messages)")]
ChatTemplate = Annotated[str, Meta(min_length=1, description="a Jinja template used instead "
                                                             "of the GGUF's")]
TemplateKwargs = Annotated[dict[str, Any], Meta(
    description="extra variables for the template (e.g. enable_thinking)")]
AddGenerationPrompt = Annotated[bool, Meta(
    description="end the rendered conversation with the assistant's turn opening")]
EnableThinking = Optional[Annotated[bool, Meta(
    description="the chat template's thinking switch (Qwen3-style templates): passed to it "
                "as enable_thinking, as chat_template_kwargs would; null: the template's "
                "default")]]


def messages_of(req):
    """The request's messages as plain dicts (None when it has none); unset fields dropped."""
    m = getattr(req, "messages", None)
    if m is None:
        return None
    import msgspec

    return msgspec.to_builtins(m)


def exactly_one(req, a: str, b: str) -> None:
    """ValueError (msgspec makes it a ValidationError: invalid_request) unless exactly
    one of the fields `a` and `b` is given."""
    if (getattr(req, a) is None) == (getattr(req, b) is None):
        raise ValueError(f"give exactly one of `{a}` and `{b}`")


def chat_prompt(runner, req, text_field: str = "prompt", should_cancel=None) -> str:
    """The request's text, or its messages rendered with the model's chat template (which
    stops with `cancelled` once should_cancel() says so)."""
    from .. import prepare

    return prepare.prompt_of(
        runner, prompt=getattr(req, text_field), messages=messages_of(req),
        tools=getattr(req, "tools", None), chat_template=req.chat_template,
        add_generation_prompt=req.add_generation_prompt,
        chat_template_kwargs=req.chat_template_kwargs, enable_thinking=req.enable_thinking,
        should_cancel=should_cancel)


StatePath = Optional[Annotated[str, Meta(min_length=1)]]


def kv_args(req) -> dict:
    """kv_import / kv_export of a generate or system1 request, those given only."""
    return {k: getattr(req, k) for k in ("kv_import", "kv_export") if getattr(req, k) is not None}


class StateInfo(Struct, kw_only=True):
    """A saved state file (protocol/STATE.md) a request read or wrote."""

    path: Annotated[str, Meta(description="absolute")]
    n_tokens: Annotated[int, Meta(description="the tokens whose state it holds")]
    bytes: Optional[Annotated[int, Meta(description="the file's size (written files)")]] = None


StartInfo = Annotated[Optional[dict[str, Any]], Meta(description=(
    "device auto on a CUDA host, a request that came while the GPU was coming up: where it ran "
    "(reflex_ipc/startrule.py): choice (cpu, gpu or race), mode (REFLEX_START), est_ms {cpu, gpu, "
    "race}, steps [{backend, tokens}] (which backend computed each token's logits, in order), "
    "handovers [{from, to, ms, bytes, tokens}]"))]


class Result(Struct, kw_only=True):
    """A result's op-specific fields (the envelope -- event, id, op, ok, timings --
    is added by protocol.result). Servers may add fields."""


def ms(t0: float, t1: float = None) -> float:
    return round(((time.perf_counter() if t1 is None else t1) - t0) * 1e3, 3)


def merge(out: dict, model_name, timings: dict, run_ms: float) -> dict:
    """The runner's result with its timings folded into the request's. prompt_eval
    and decode are always there: system1's candidate pass counts as its decode; an
    engine that times only the whole call (embed) gets it as prompt_eval, decode 0."""
    fields = dict(out)
    engine_t = fields.pop("timings", None) or {}
    for k, v in engine_t.items():  # numbers only (ms, or rates such as tokens/s)
        if k != "total" and isinstance(v, (int, float)) and not isinstance(v, bool):
            timings[k] = v
    if "decode" not in timings:
        timings["decode"] = timings.get("candidates_eval", 0.0)
    if "prompt_eval" not in timings:
        timings["prompt_eval"] = round(max(0.0, run_ms - timings["decode"]), 3)
    fields["model"] = model_name
    return fields
