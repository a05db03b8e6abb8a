"""detokenize: the text of token ids (the inverse of tokenize)."""

from typing import Annotated

from msgspec import Meta

from ._base import INT64_MAX, ModelName, ModelRequest, Result as _Result
from ..errors import ReflexError


class DetokenizeRequest(ModelRequest, kw_only=True):
    token_ids: list[Annotated[int, Meta(ge=0, le=INT64_MAX)]]
    special: Annotated[bool, Meta(
        description="render control tokens (e.g. <|im_end|>) as their text; "
                    "false drops them")] = False


class DetokenizeResult(_Result, kw_only=True):
    text: str
    model: ModelName


Request, Result = DetokenizeRequest, DetokenizeResult
RENAMED = {"ids": "token_ids"}  # old name -> new: named in the invalid_request message


def check_ids(ids, n_vocab) -> None:
    for i, t in enumerate(ids):
        if n_vocab is not None and t >= n_vocab:
            raise ReflexError("invalid_request",
                              f"`token_ids[{i}]`: {t} is out of range (n_vocab {n_vocab})")


def run(call, req) -> dict:
    return call.fields(call.model(req).detokenize_result(req))
