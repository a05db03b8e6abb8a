"""`POST /v1/classify`: the protocol's `classify` op (system1 with labels) over HTTP.

Body: `{"model", "input" or "messages", "labels": [...] (1-64, distinct), "temperature",
"questions"}`; the answer is the op's result (labels with probability, logprob,
mean_logprob and tokens; best, best_idx, entropy; `warning` when the labels tokenize to
different lengths; with `questions`, `results` per question) with OpenAI-style `object`,
`model` and `usage`.
"""

from typing import Annotated, Any, Optional, Union

from msgspec import Meta, Struct

from .api import HTTPError, Message, _message

MAX_LABELS = 64


class ClassifyRequest(Struct, kw_only=True):
    model: Optional[str] = None
    input: Optional[Annotated[str, Meta(min_length=1)]] = None
    messages: Optional[Annotated[list[Message], Meta(min_length=1)]] = None
    labels: Annotated[list[Annotated[str, Meta(min_length=1)]], Meta(min_length=1, max_length=MAX_LABELS)]
    questions: Optional[Annotated[list[Annotated[str, Meta(min_length=1)]], Meta(min_length=1, max_length=256)]] = None
    temperature: Optional[Annotated[float, Meta(gt=0.0, le=100.0)]] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None
    user: Optional[str] = None


def params(req: ClassifyRequest):
    if (req.input is None) == (req.messages is None):
        raise HTTPError(400, "give exactly one of `input` and `messages`", param="input", code="invalid_value")
    if len(set(req.labels)) != len(req.labels):
        raise HTTPError(400, "`labels` must be distinct", param="labels", code="invalid_value")
    p: dict[str, Union[str, list, float, dict]] = {"labels": list(req.labels)}
    if req.input is not None:
        p["input"] = req.input
    else:
        p["messages"] = [_message(m, i) for i, m in enumerate(req.messages)]
        if req.chat_template_kwargs is not None:
            p["chat_template_kwargs"] = req.chat_template_kwargs
    if req.questions is not None:
        p["questions"] = list(req.questions)
    if req.temperature is not None:
        p["temperature"] = req.temperature
    return p


def response(result, model):
    out = {"object": "classification", "model": model}
    for k in ("labels", "best", "best_idx", "entropy", "results", "warning"):
        if result.get(k) is not None:
            out[k] = result[k]
    pt = int(result.get("prompt_tokens") or 0)
    out["usage"] = {"prompt_tokens": pt, "total_tokens": pt,
                    "prompt_tokens_details": {"cached_tokens": int(result.get("cached_tokens") or 0)}}
    out["timings"] = result.get("timings")
    return out
