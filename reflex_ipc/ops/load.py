"""load: load a model (or find it in the cache) and make it the active model."""

from typing import Annotated, Union

from msgspec import Meta, Struct

from ._base import ModelName, ModelRequest, NonEmptyStr, Result as _Result
from .hello import BackendName


class LoraAdapter(Struct, forbid_unknown_fields=True, kw_only=True):
    """A LoRA adapter in llama.cpp's GGUF adapter format."""

    path: Annotated[NonEmptyStr, Meta(description="resolved like model")]
    scale: Annotated[float, Meta(ge=-100.0, le=100.0, description="multiplies the adapter's "
                                                                   "product")] = 1.0


class LoadRequest(ModelRequest, kw_only=True):
    lora: Annotated[list[LoraAdapter], Meta(
        max_length=16, description="adapters applied at load; the same model with other "
                                   "adapters is another cached model")] = []


class LoadResult(_Result, kw_only=True):
    model: ModelName
    path: str
    architecture: str
    backend: BackendName
    device: Annotated[str, Meta(description="the device it runs on: cpu or cuda")]
    n_vocab: int
    n_ctx: int
    cached: bool
    lora: list[LoraAdapter] = []
    sampling: Annotated[dict[str, Union[int, float]], Meta(
        description="the model's own sampling defaults (the GGUF's general.sampling.* keys "
                    "under the protocol's names: temperature, top_k, top_p, min_p, "
                    "repeat_penalty, repeat_last_n); {} when it has none. Requests do not "
                    "use them (their defaults are the protocol's); reflex http does")] = {}


Request, Result = LoadRequest, LoadResult


def run(call, req) -> dict:
    # not the active model: `model` absent means the server's default
    lora = None
    if req.lora:
        from ..modelpath import resolve_model

        lora = tuple((resolve_model(a.path), float(a.scale)) for a in req.lora)
    key, info, _ = call.runner(req, use_active=False, lora=lora)
    call.server.models.active = key
    return {**info, "cached": "load" not in call.timings}
