"""tokenize: token ids of a text, or of a chat conversation rendered with the model's template."""

import time
from typing import Annotated, Optional

from msgspec import Meta

from ._base import (AddGenerationPrompt, ChatTemplate, Messages, ModelName, ModelRequest,
                    Result as _Result, TemplateKwargs, Tools, chat_prompt, exactly_one, ms)


EXACTLY_ONE = ("text", "messages")  # the request gives exactly one of them (schema.json too)


class TokenizeRequest(ModelRequest, kw_only=True):
    text: Optional[Annotated[str, Meta(
        description="the text (exactly one of this and messages)")]] = None
    messages: Optional[Messages] = None
    tools: Optional[Tools] = None
    chat_template: Optional[ChatTemplate] = None
    chat_template_kwargs: Optional[TemplateKwargs] = None
    add_generation_prompt: AddGenerationPrompt = True
    add_bos: Annotated[bool, Meta(description="prepend the BOS token (text only; messages: "
                                              "per the GGUF)")] = False
    parse_special: Annotated[bool, Meta(
        description="control-token text (e.g. <|im_end|>) becomes those tokens (text only)")] = True

    def __post_init__(self):
        exactly_one(self, *EXACTLY_ONE)


class TokenizeResult(_Result, kw_only=True):
    token_ids: list[int]
    model: ModelName
    prompt: Annotated[str, Meta(description="with messages: the rendered conversation")] = ""


Request, Result = TokenizeRequest, TokenizeResult


def run(call, req) -> dict:
    _, info, runner = call.runner(req)
    t = time.perf_counter()
    if req.messages is not None:
        text = chat_prompt(runner, req, "text", call.should_cancel)
        ids = runner.tokenize(text, add_bos=None, parse_special=True)
        call.timings["tokenize"] = ms(t)
        return {"token_ids": list(ids), "prompt": text, "model": info.get("model")}
    if req.tools is not None or req.chat_template is not None or req.chat_template_kwargs is not None:
        chat_prompt(runner, req, "text")  # raises: they go with messages
    ids = runner.tokenize(req.text, add_bos=req.add_bos, parse_special=req.parse_special)
    call.timings["tokenize"] = ms(t)
    return {"token_ids": list(ids), "model": info.get("model")}
