"""embed: pooled final hidden states of one or more texts."""

from typing import Annotated, Literal, Union

from msgspec import Meta

from ._base import ModelName, ModelRequest, NonEmptyStr, Result as _Result, StartInfo


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
    start: StartInfo = None


Request, Result = EmbedRequest, EmbedResult


def run(call, req) -> dict:
    return call.fields(call.model(req).embed(req, should_cancel=call.should_cancel))
