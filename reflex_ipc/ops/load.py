"""load: load a model (or find it in the cache) and make it the active model."""

from typing import Annotated

from msgspec import Meta

from ._base import ModelName, ModelRequest, Result as _Result
from .hello import BackendName


class LoadRequest(ModelRequest, kw_only=True):
    pass


class LoadResult(_Result, kw_only=True):
    model: ModelName
    path: str
    architecture: str
    backend: BackendName
    device: Annotated[str, Meta(description="the device it runs on: cpu or cuda")]
    n_vocab: int
    n_ctx: int
    cached: bool


Request, Result = LoadRequest, LoadResult


def run(call, req) -> dict:
    # not the active model: `model` absent means the server's default
    key, info, _ = call.runner(req, use_active=False)
    call.server.active = key
    return {**info, "cached": "load" not in call.timings}
