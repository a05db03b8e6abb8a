"""state_save: save the tokens the model's state holds, and their state, to a file (protocol/STATE.md)."""

from typing import Annotated

from msgspec import Meta

from ._base import ModelName, ModelRequest, Result as _Result


class StateSaveRequest(ModelRequest, kw_only=True):
    path: Annotated[str, Meta(min_length=1, description="the state file; resolved like model paths")]


class StateSaveResult(_Result, kw_only=True):
    path: Annotated[str, Meta(description="absolute")]
    n_tokens: Annotated[int, Meta(ge=0, description="the tokens whose state it holds")]
    bytes: Annotated[int, Meta(description="the file's size")]
    model: ModelName


Request, Result = StateSaveRequest, StateSaveResult


def run(call, req) -> dict:
    return call.fields(call.model(req).save_state(req))
