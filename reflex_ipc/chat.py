"""Chat templates: `messages` (and `tools`) rendered with the GGUF's
`tokenizer.chat_template`, then tokenized as llama.cpp's chat path does.

Imported only when a request carries `messages` (jinja2 costs ~30 ms to import;
nothing on the cold path may pay it). Templates run in jinja2's
ImmutableSandboxedEnvironment with what Hugging Face's and llama.cpp's chat
templates expect: `trim_blocks`/`lstrip_blocks`, the `loopcontrols` extension,
`{% generation %}` blocks passed through, `tojson` writing non-ASCII as is,
`raise_exception(msg)` and `strftime_now(fmt)`, and the variables `messages`,
`tools`, `add_generation_prompt`, `bos_token`, `eos_token` plus any
`chat_template_kwargs` (such as Qwen3's `enable_thinking`).

BOS/EOS as llama.cpp's server chat path: the rendered text loses a leading
BOS text when the vocabulary adds BOS itself (and a trailing EOS text when it
adds EOS), then it is tokenized with special tokens parsed and the
vocabulary's own add flags. For a template that writes `{{ bos_token }}`
(Llama 3, Gemma) or one on a vocabulary without BOS (ChatML, Qwen) this gives
the same ids as llama-cpp-python's Jinja2ChatFormatter (tests/test_chat.py).

Every failure is ReflexError("invalid_request", ...) naming the field:
`messages` for malformed messages or a template that raises on them,
`chat_template` for a template that does not compile.
"""

from __future__ import annotations

import json
from functools import lru_cache

from .errors import ReflexError

ROLES_HINT = "system, user, assistant, tool"


def _bad(field, msg):
    return ReflexError("invalid_request", f"`{field}`: {msg}")


def validate_messages(messages) -> list:
    """The messages as plain dicts, checked: a non-empty list of objects, each
    with a string `role` and a `content` that is a string, null, or a list of
    text parts ({"type": "text", "text": ...}). Other keys (name, tool_calls,
    tool_call_id, reasoning_content) pass through to the template."""
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "must be a non-empty array of {role, content} objects")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _bad(where, f"must be an object, got {type(m).__name__}")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise _bad(f"{where}.role", "must be a non-empty string")
        if "content" not in m and "tool_calls" not in m:
            raise _bad(f"{where}.content", "is required")
        c = m.get("content")
        if isinstance(c, list):
            for j, part in enumerate(c):
                if not (isinstance(part, dict) and part.get("type") == "text"
                        and isinstance(part.get("text"), str)):
                    raise _bad(f"{where}.content[{j}]",
                               'content parts must be {"type": "text", "text": string}')
        elif c is not None and not isinstance(c, str):
            raise _bad(f"{where}.content", f"must be a string, null or an array of text parts, "
                                           f"got {type(c).__name__}")
        tc = m.get("tool_calls")
        if tc is not None:
            if not isinstance(tc, list):
                raise _bad(f"{where}.tool_calls", "must be an array")
            for j, call in enumerate(tc):
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise _bad(f"{where}.tool_calls[{j}]",
                               'must be {"type": "function", "function": {"name", "arguments"}}')
        out.append(dict(m))
    return out


def validate_tools(tools):
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise _bad("tools", "must be an array of {type: function, function: {name, ...}}")
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise _bad(f"tools[{i}]", 'must be {"type": "function", "function": {"name", '
                                      '"description", "parameters"}}')
    return tools


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt):
    from datetime import datetime

    return datetime.now().strftime(fmt)


class _TemplateRaised(Exception):
    pass


def _raise_exception(message):
    raise _TemplateRaised(str(message))


def _need_jinja2():
    """invalid_request naming the extra when jinja2 (the `chat` extra) is not installed."""
    try:
        import jinja2  # noqa: F401
    except ImportError:
        raise ReflexError("invalid_request", "chat templates (`messages`, --chat) need jinja2: "
                          "pip install 'reflex-ipc[chat]'") from None


@lru_cache(maxsize=8)
def compile_template(source: str):
    """The compiled jinja2 template (cached by source: compiled once per model)."""
    _need_jinja2()
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class _Generation(jinja2.ext.Extension):
        """Hugging Face's `{% generation %}...{% endgeneration %}`: rendered as is."""

        tags = {"generation"}

        def parse(self, parser):
            parser.stream.skip(1)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise _bad("chat_template", f"the template does not compile: {e.message} "
                                    f"(line {e.lineno})") from None


def template_of(tok, f, override=None) -> str:
    """The template source: `override` when given, else the GGUF's."""
    if override is not None:
        if not isinstance(override, str) or not override.strip():
            raise _bad("chat_template", "must be a non-empty string")
        return override
    src = f.metadata.get("tokenizer.chat_template") if f is not None else None
    if not isinstance(src, str) or not src.strip():
        raise _bad("messages", "this model has no chat template (tokenizer.chat_template); "
                               "send `prompt`, or give `chat_template`")
    return src


def special_text(tok, tid) -> str:
    """A special token's text as stored in the vocabulary ("" when absent)."""
    if tid is None or tid < 0:
        return ""
    return tok.token_text(tid)


def render(tok, f, messages, *, tools=None, add_generation_prompt=True, chat_template=None,
           chat_template_kwargs=None) -> str:
    """The rendered prompt text (before llama.cpp's BOS/EOS stripping)."""
    _need_jinja2()
    import jinja2

    messages = validate_messages(messages)
    tools = validate_tools(tools)
    if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, dict):
        raise _bad("chat_template_kwargs", "must be an object")
    tmpl = compile_template(template_of(tok, f, chat_template))
    ctx = dict(chat_template_kwargs or {})
    ctx.update(messages=messages, tools=tools, add_generation_prompt=bool(add_generation_prompt),
               bos_token=special_text(tok, tok.bos_id), eos_token=special_text(tok, tok.eos_id))
    if tools is None:
        ctx.pop("tools")  # templates test `tools is defined` as well as `tools is not none`
    try:
        return tmpl.render(**ctx)
    except _TemplateRaised as e:
        raise _bad("messages", f"the chat template rejected them: {e}") from None
    except jinja2.exceptions.SecurityError as e:
        raise _bad("chat_template", f"the template did something the sandbox forbids: {e}") from None
    except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError,
            IndexError, ZeroDivisionError, RecursionError) as e:
        raise _bad("messages", f"the chat template failed on them: {type(e).__name__}: {e}") from None


def strip_specials(tok, text: str) -> str:
    """llama.cpp's chat path: a leading BOS text goes when the vocabulary adds BOS
    itself, a trailing EOS text when it adds EOS (tokenization puts them back)."""
    bos = special_text(tok, tok.bos_id)
    eos = special_text(tok, tok.eos_id)
    if getattr(tok, "add_bos", False) and bos and text.startswith(bos):
        text = text[len(bos):]
    if getattr(tok, "add_eos", False) and eos and text.endswith(eos):
        text = text[: -len(eos)]
    return text


def chat_prompt(tok, f, messages, **kw) -> list:
    """Token ids of the rendered conversation, as llama.cpp's chat path makes them."""
    text = strip_specials(tok, render(tok, f, messages, **kw))
    return tok.encode(text, add_bos=None, parse_special=True)
