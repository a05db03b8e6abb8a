"""classify: pick one of a few labels for a text or a conversation (system1 with labels), for
one question or a batch of questions over one shared prefix."""

from typing import Annotated, Optional

from msgspec import Meta, Struct

from ._base import (AddGenerationPrompt, ChatTemplate, Messages, ModelName, ModelRequest,
                    NonEmptyStr, Result as _Result, TemplateKwargs, exactly_one, messages_of)

MAX_LABELS = 64
MAX_QUESTIONS = 256
EXACTLY_ONE = ("input", "messages")  # the request gives exactly one of them (schema.json too)


class ClassifyRequest(ModelRequest, kw_only=True):
    input: Optional[Annotated[str, Meta(
        min_length=1, description="the text the labels continue (exactly one of this and "
                                  "messages); with questions, the shared prefix")]] = None
    messages: Optional[Messages] = None
    labels: Annotated[list[NonEmptyStr], Meta(min_length=1, max_length=MAX_LABELS,
                                              description="the choices, distinct",
                                              extra_json_schema={"uniqueItems": True})]
    questions: Optional[Annotated[list[NonEmptyStr], Meta(
        min_length=1, max_length=MAX_QUESTIONS,
        description="a batch: each question is appended to the input (as a user message to "
                    "messages) and classified; the shared prefix is evaluated once")]] = None
    temperature: Annotated[float, Meta(gt=0.0, le=100.0,
                                       description="for the label probabilities")] = 1.0
    chat_template: Optional[ChatTemplate] = None
    chat_template_kwargs: Optional[TemplateKwargs] = None
    add_generation_prompt: AddGenerationPrompt = True
    cache_prompt: Annotated[bool, Meta(
        description="reuse the state of the longest token prefix shared with the previous "
                    "request (cached_tokens in the result)")] = True
    prefix_cache: Annotated[bool, Meta(
        description="as system1's: the machine's prefix cache read and written; false: "
                    "neither")] = True

    def __post_init__(self):
        exactly_one(self, *EXACTLY_ONE)
        if len(set(self.labels)) != len(self.labels):
            raise ValueError("`labels` must be distinct")


class Label(Struct, kw_only=True):
    label: str
    probability: Annotated[float, Meta(description="softmax of logprob / temperature over the labels")]
    logprob: Annotated[float, Meta(description="the sum of the label's token log-probabilities")]
    mean_logprob: float
    tokens: Annotated[int, Meta(description="the label's token count after this prompt")]


class Decision(Struct, kw_only=True):
    labels: Annotated[list[Label], Meta(description="in request order")]
    best: str
    best_idx: Annotated[int, Meta(ge=0)]
    entropy: Annotated[float, Meta(description="of the label probabilities, in bits")]
    prompt_tokens: int
    cached_tokens: Annotated[int, Meta(ge=0, description="prompt tokens whose state was reused")]


class Answer(Decision, kw_only=True):
    question: str


class ClassifyResult(_Result, kw_only=True):
    labels: Annotated[Optional[list[Label]], Meta(description="without questions")] = None
    best: Optional[str] = None
    best_idx: Optional[Annotated[int, Meta(ge=0)]] = None
    entropy: Optional[float] = None
    results: Annotated[Optional[list[Answer]], Meta(
        description="with questions: one decision per question, in order")] = None
    prompt_tokens: Annotated[int, Meta(description="all questions together")]
    cached_tokens: Annotated[int, Meta(ge=0, description="all questions together")]
    warning: Annotated[Optional[str], Meta(
        description="present when the labels tokenize to different lengths")] = None
    model: ModelName


Request, Result = ClassifyRequest, ClassifyResult


def _prompts(runner, req):
    """(question or None, prompt text) per item."""
    from .. import prepare

    def render(messages):
        return prepare.prompt_of(runner, messages=messages, chat_template=req.chat_template,
                                 add_generation_prompt=req.add_generation_prompt,
                                 chat_template_kwargs=req.chat_template_kwargs)

    msgs = messages_of(req)
    if req.questions is None:
        return [(None, req.input if msgs is None else render(msgs))]
    if msgs is None:
        return [(q, req.input + q) for q in req.questions]
    return [(q, render(msgs + [{"role": "user", "content": q}])) for q in req.questions]


def decision(out, labels) -> dict:
    """A system1 result as a classify decision."""
    items = [{"label": label, "probability": c["probability"], "logprob": c["logprob"],
              "mean_logprob": c["mean_logprob"], "tokens": len(c["token_ids"])}
             for label, c in zip(labels, out["candidates"])]
    best = int(out["best_idx"])
    return {"labels": items, "best": labels[best], "best_idx": best, "entropy": out["entropy"],
            "prompt_tokens": int(out["prompt_tokens"]), "cached_tokens": int(out.get("cached_tokens", 0))}


def warning(decisions) -> Optional[str]:
    lengths = sorted({it["tokens"] for d in decisions for it in d["labels"]})
    if len(lengths) < 2:
        return None
    return (f"the labels tokenize to different lengths ({lengths[0]} to {lengths[-1]} tokens): a "
            f"label's logprob sums its tokens, which favours shorter labels; labels of one token "
            f"each compare fairly (mean_logprob is given too)")


def execute(runner, req, *, should_cancel=None) -> dict:
    labels = list(req.labels)
    decisions, timings = [], {}
    for q, prompt in _prompts(runner, req):
        out = runner.system1(prompt, labels, temperature=req.temperature, should_cancel=should_cancel,
                             cache_prompt=req.cache_prompt,
                             **({} if req.prefix_cache else {"prefix_cache": False}))
        for k, v in (out.get("timings") or {}).items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                timings[k] = round(timings.get(k, 0.0) + v, 3)
        d = decision(out, labels)
        if q is not None:
            d["question"] = q
        decisions.append(d)
    res = {"prompt_tokens": sum(d["prompt_tokens"] for d in decisions),
           "cached_tokens": sum(d["cached_tokens"] for d in decisions), "timings": timings}
    if req.questions is None:
        d = decisions[0]
        res.update(labels=d["labels"], best=d["best"], best_idx=d["best_idx"], entropy=d["entropy"])
    else:
        res["results"] = decisions
    w = warning(decisions)
    if w:
        res["warning"] = w
    return res


def run(call, req) -> dict:
    return call.fields(call.model(req).classify(req, should_cancel=call.should_cancel))
