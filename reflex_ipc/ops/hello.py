"""hello: the server's protocol version, build, limits, ops and cached models."""

import os
from typing import Annotated, Literal, Optional

from msgspec import Meta, Struct

from . import BACKENDS, MAX_TOKENS, NAMES, PROTOCOL
from ..errors import KINDS
from ._base import ModelName, Request as _Request, Result as _Result

BackendName = Annotated[Optional[Literal[BACKENDS]], Meta(  # type: ignore[valid-type]
    description="the active model's backend: numpy (the numpy reference), cpu (the C CPU "
                "backend) or cuda; null when no model is loaded yet")]


class HelloRequest(_Request, kw_only=True):
    protocol: Optional[Literal[PROTOCOL]] = None  # type: ignore[valid-type]


class Limits(Struct):
    max_line_bytes: int
    max_tokens: int


NextBackend = Annotated[Optional[Literal[BACKENDS]], Meta(  # type: ignore[valid-type]
    description="with device auto on a CUDA host: the backend the active model moves to once it is "
                "ready (cuda) while `backend` (cpu) serves; absent or null otherwise")]


class CachedModel(Struct):
    model: ModelName
    path: str
    device: str
    backend: BackendName


class HelloResult(_Result, kw_only=True):
    protocol: Literal[PROTOCOL]  # type: ignore[valid-type]
    version: str
    pid: int
    backend: BackendName
    model: ModelName
    ops: list[str]
    error_kinds: list[Literal[KINDS]]  # type: ignore[valid-type]
    limits: Limits
    models: list[CachedModel]
    next_backend: NextBackend = None


class Ready(Struct, kw_only=True):
    """The first line on each transport (written by server.py without msgspec)."""

    event: Literal["ready"]
    id: None
    protocol: Literal[PROTOCOL]  # type: ignore[valid-type]
    version: str
    pid: int
    backend: BackendName
    model: ModelName
    timings: dict[str, float]
    next_backend: NextBackend = None


Request, Result = HelloRequest, HelloResult


def run(call, req) -> dict:
    from .. import __version__

    srv = call.server
    info = srv.models.active_info()
    models = srv.models.listing()  # keys are file identities: the entries know their paths
    out = {"protocol": PROTOCOL, "version": __version__, "pid": os.getpid(),
           "backend": info.get("backend"), "model": info.get("model"), "ops": list(NAMES),
           "error_kinds": list(KINDS),
           "limits": {"max_line_bytes": srv.max_line_bytes, "max_tokens": MAX_TOKENS},
           "models": models}
    if info.get("next_backend"):
        out["next_backend"] = info["next_backend"]
    return out
