"""tokenize: token ids of a text with the model's tokenizer."""

import time
from typing import Annotated

from msgspec import Meta

from ._base import ModelName, ModelRequest, Result as _Result, ms


class TokenizeRequest(ModelRequest, kw_only=True):
    text: str
    add_bos: Annotated[bool, Meta(description="prepend the BOS token")] = False
    parse_special: Annotated[bool, Meta(
        description="control-token text (e.g. <|im_end|>) becomes those tokens")] = True


class TokenizeResult(_Result, kw_only=True):
    token_ids: list[int]
    model: ModelName


Request, Result = TokenizeRequest, TokenizeResult


def run(call, req) -> dict:
    _, info, runner = call.runner(req)
    t = time.perf_counter()
    ids = runner.tokenize(req.text, add_bos=req.add_bos, parse_special=req.parse_special)
    call.timings["tokenize"] = ms(t)
    return {"token_ids": list(ids), "model": info.get("model")}
