"""infill: fill in the middle between a prefix and a suffix (models with FIM tokens)."""

from typing import Annotated

from msgspec import Meta, Struct

from .generate import DecodeRequest, DecodeResult, token_callback


class ExtraChunk(Struct, forbid_unknown_fields=True, kw_only=True):
    """Another file of the project, laid out before the prefix."""

    filename: str = "tmp"
    text: str = ""


class InfillRequest(DecodeRequest, kw_only=True):
    prefix: Annotated[str, Meta(description="the text before the cursor")]
    suffix: Annotated[str, Meta(description="the text after the cursor")] = ""
    input_extra: Annotated[list[ExtraChunk], Meta(
        max_length=4096, description="other files as context (repo-level layout)")] = []
    prompt: Annotated[str, Meta(description="text added after the prefix, before the "
                                            "middle")] = ""
    n_indent: Annotated[int, Meta(
        ge=0, le=2**31 - 1, description="end at the first generated line (after a newline) "
                                        "indented by fewer spaces/tabs, cut before its text "
                                        "(finish_reason length; llama.cpp's n_indent); 0 is off")] = 0
    t_max_predict_ms: Annotated[int, Meta(
        ge=-1, le=2**63 - 1, description="end at a token holding a newline once this many ms "
                                         "passed since generation began (finish_reason "
                                         "length; llama.cpp's); 0 or -1 is off")] = 0


class InfillResult(DecodeResult, kw_only=True):
    pass


Request, Result = InfillRequest, InfillResult


def run(call, req) -> dict:
    model = call.model(req)
    return call.fields(model.infill(req, on_token=token_callback(call, req),
                                    should_cancel=call.should_cancel))
