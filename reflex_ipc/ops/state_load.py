"""state_load: load a saved state (protocol/STATE.md): a later request whose tokens start with its tokens evaluates only the rest."""

from typing import Annotated

from msgspec import Meta

from ._base import ModelName, ModelRequest, Result as _Result


class StateLoadRequest(ModelRequest, kw_only=True):
    path: Annotated[str, Meta(min_length=1, description="the state file; resolved like model paths")]


class StateLoadResult(_Result, kw_only=True):
    path: Annotated[str, Meta(description="absolute")]
    n_tokens: Annotated[int, Meta(ge=0, description="the tokens whose state it holds")]
    model: ModelName


Request, Result = StateLoadRequest, StateLoadResult


def run(call, req) -> dict:
    return call.fields(call.model(req).load_state(req))
