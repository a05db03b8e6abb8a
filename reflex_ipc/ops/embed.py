"""embed: pooled final hidden states of one or more texts."""

import time
from typing import Annotated, Literal, Union

from msgspec import Meta

from ._base import ModelName, ModelRequest, NonEmptyStr, Result as _Result, merge, ms


class EmbedRequest(ModelRequest, kw_only=True):
    input: Union[NonEmptyStr, Annotated[list[NonEmptyStr], Meta(min_length=1, max_length=1024)]]
    pooling: Literal["mean", "last", "cls"] = "mean"
    normalize: Annotated[bool, Meta(description="scale each embedding to unit L2 norm")] = False
    prefix_cache: Annotated[bool, Meta(
        description="with pooling last: start from the prefix cache's saved state of the "
                    "text's leading tokens and save the last text's there (as in generate)")] = True


class EmbedResult(_Result, kw_only=True):
    embeddings: list[list[float]]
    dim: int
    n_tokens: Annotated[list[int], Meta(description="each input's token count")]
    model: ModelName


Request, Result = EmbedRequest, EmbedResult


def texts(req) -> list:
    return [req.input] if isinstance(req.input, str) else list(req.input)


def execute(runner, req, *, should_cancel=None) -> dict:
    out = dict(runner.embed(texts(req), pooling=req.pooling, normalize=req.normalize,
                            should_cancel=should_cancel, prefix_cache=req.prefix_cache))
    out["embeddings"] = [e.tolist() if hasattr(e, "tolist") else list(e)
                         for e in out["embeddings"]]
    return out


def run(call, req) -> dict:
    _, info, runner = call.runner(req)
    t = time.perf_counter()
    out = execute(runner, req, should_cancel=call.should_cancel)
    return merge(out, info.get("model"), call.timings, ms(t))
