"""What generate, system1, tokenize and infill requests add on top of a plain prompt
(issue 14), shared by the protocol ops and the CLI: chat messages rendered with the
model's template, infill layouts, constraints, logprobs and tool-call parsing.

Every import of a feature's dependency happens here, inside the function that a
request using it calls: jinja2 (chat.py) only for `messages`, llguidance
(constrain.py) only for `json_schema`/`regex`/`grammar`.
"""

from __future__ import annotations

from .errors import ReflexError

MAX_LOGPROBS = 20


def _bad(msg):
    return ReflexError("invalid_request", msg)


def chat_text(runner, messages, *, tools=None, chat_template=None, add_generation_prompt=True,
              chat_template_kwargs=None, should_cancel=None) -> str:
    """The conversation rendered with the model's template, as the text that the
    runner's tokenizer (special tokens parsed, the vocabulary's BOS/EOS flags) turns
    into llama.cpp's chat-path ids."""
    from . import chat

    text = chat.render(runner.tok, runner.f, messages, tools=tools,
                       add_generation_prompt=add_generation_prompt, chat_template=chat_template,
                       chat_template_kwargs=chat_template_kwargs, should_cancel=should_cancel)
    return chat.strip_specials(runner.tok, text)


def prompt_of(runner, *, prompt=None, messages=None, tools=None, chat_template=None,
              add_generation_prompt=True, chat_template_kwargs=None, enable_thinking=None,
              should_cancel=None) -> str:
    """The prompt text of a request with exactly one of `prompt` / `messages`."""
    if (prompt is None) == (messages is None):
        raise _bad("give exactly one of `prompt` and `messages`")
    if messages is None:
        if (tools is not None or chat_template is not None or chat_template_kwargs is not None
                or enable_thinking is not None):
            raise _bad("`tools`, `chat_template`, `chat_template_kwargs` and `enable_thinking` "
                       "go with `messages`")
        return prompt
    if enable_thinking is not None:
        kw = dict(chat_template_kwargs or {})
        if kw.get("enable_thinking", enable_thinking) != enable_thinking:
            raise _bad("`enable_thinking` and `chat_template_kwargs.enable_thinking` differ")
        kw["enable_thinking"] = enable_thinking
        chat_template_kwargs = kw
    return chat_text(runner, messages, tools=tools, chat_template=chat_template,
                     add_generation_prompt=add_generation_prompt,
                     chat_template_kwargs=chat_template_kwargs, should_cancel=should_cancel)


def infill_ids(runner, prefix, suffix, *, input_extra=None, prompt="", max_tokens=64,
               prefix_cache=False) -> list:
    """The FIM prompt's ids; with prefix_cache (and the prefix cache on) a long prefix is cut
    at a block boundary (infill.py) so that an edit keeps the saved state before it."""
    from .infill import infill_prompt

    align = 0
    if prefix_cache:
        from .runtime import prefixstore

        align = prefixstore.block_size() if prefixstore.enabled() else 0
    return infill_prompt(runner.tok, prefix, suffix, input_extra=input_extra, prompt=prompt,
                         n_ctx=runner.n_ctx, max_tokens=max_tokens, align=align)


def check_logprobs(n):
    if n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_LOGPROBS:
        raise _bad(f"`logprobs`: must be an integer in [0, {MAX_LOGPROBS}], not {n!r}")
    return n


def constraint_of(runner, *, json_schema=None, regex=None, grammar=None):
    """The llguidance constraint of the request, or None."""
    if json_schema is None and regex is None and grammar is None:
        return None
    from .constrain import make_constraint

    return make_constraint(runner.tok, json_schema=json_schema, regex=regex, grammar=grammar)


def generate_extras(runner, *, logprobs=None, cache_prompt=True, json_schema=None, regex=None,
                    grammar=None, prefix_cache=True) -> dict:
    """The keyword arguments Runner.generate takes beyond the sampling parameters;
    only those that differ from its defaults (so a plain request calls it as before)."""
    kw = {}
    n = check_logprobs(logprobs)
    if n is not None:
        kw["logprobs"] = n
    if cache_prompt is False:
        kw["cache_prompt"] = False
    if prefix_cache is False:
        kw["prefix_cache"] = False
    c = constraint_of(runner, json_schema=json_schema, regex=regex, grammar=grammar)
    if c is not None:
        kw["constraint"] = c
    return kw


def add_tool_calls(out: dict, tools) -> dict:
    """With `tools` in the request: parse the generated text for tool calls (Hermes /
    Qwen `<tool_call>` blocks, Llama 3 JSON); when there are some, the result gets
    `tool_calls` and `content` (the text outside them)."""
    if not tools:
        return out
    from .toolcalls import parse_tool_calls

    names = [t["function"]["name"] for t in tools
             if isinstance(t, dict) and isinstance(t.get("function"), dict)]
    for part in [out, *out.get("choices", ())]:  # with n > 1: each choice too
        content, calls = parse_tool_calls(part.get("text", ""), names)
        if calls:
            part["tool_calls"] = calls
            part["content"] = content
    return out
