"""tokenize: token ids of a text, or of a chat conversation rendered with the model's template."""

from typing import Annotated, Optional

from msgspec import Meta

from ._base import (AddGenerationPrompt, ChatTemplate, EnableThinking, Messages, ModelName,
                    ModelRequest, Result as _Result, TemplateKwargs, Tools, exactly_one)


EXACTLY_ONE = ("text", "messages")  # the request gives exactly one of them (schema.json too)


class TokenizeRequest(ModelRequest, kw_only=True):
    text: Optional[Annotated[str, Meta(
        description="the text (exactly one of this and messages)")]] = None
    messages: Optional[Messages] = None
    tools: Optional[Tools] = None
    chat_template: Optional[ChatTemplate] = None
    chat_template_kwargs: Optional[TemplateKwargs] = None
    enable_thinking: EnableThinking = None
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
    return call.fields(call.model(req).tokenize_result(req, should_cancel=call.should_cancel))
