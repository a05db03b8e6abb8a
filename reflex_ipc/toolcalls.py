"""Tool calls in generated text, for requests that sent `tools`.

Two formats, the ones the chat templates of tests/data/chat_templates ask for:

- Hermes / Qwen2.5 / Qwen3: one or more
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks; the text
  outside them is the content.
- Llama 3.1-3.3 and Llama 4 (JSON tool calling): the whole reply is one JSON object
  `{"name": ..., "parameters": {...}}` (or "arguments"), optionally after
  `<|python_tag|>`; the content is then empty.
- gpt-oss (harmony): messages `... to=functions.NAME<|channel|>commentary json<|message|>{...}`
  (reflex_ipc/harmony.py); the content is the final channel's text.

`parse_tool_calls(text, tool_names)` -> (content, tool_calls) where
tool_calls is OpenAI's shape: [{"id": "call_0", "type": "function",
"function": {"name", "arguments": JSON text}}], or None when the text holds no
call in either format. A block that is not valid JSON, or that names a
function not in `tools`, is left in the content as text.
"""

from __future__ import annotations

import json
import re

_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
_PY_TAG = "<|python_tag|>"


def _call(obj, names, i):
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    args = obj.get("arguments", obj.get("parameters", {}))
    if not isinstance(name, str) or (names and name not in names):
        return None
    if isinstance(args, str):
        try:
            json.loads(args)
        except ValueError:
            return None
        text = args
    elif isinstance(args, dict):
        text = json.dumps(args, ensure_ascii=False)
    else:
        return None
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": text}}


def parse_tool_calls(text: str, tool_names=()):
    names = set(tool_names or ())
    if "<|message|>" in text:  # gpt-oss's harmony messages to functions.NAME (reflex_ipc/harmony.py)
        from .harmony import tool_calls

        content, found = tool_calls(text, names)
        if found:
            return content, [{"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": a}}
                             for i, (n, a) in enumerate(found)]
    if "<tool_call>" in text:
        calls, pieces, last = [], [], 0
        for m in _HERMES.finditer(text):
            try:
                obj = json.loads(m.group(1))
            except ValueError:
                continue
            call = _call(obj, names, len(calls))
            if call is None:
                continue
            calls.append(call)
            pieces.append(text[last:m.start()])
            last = m.end()
        if calls:
            pieces.append(text[last:])
            return "".join(pieces).strip(), calls
        return text, None
    body = text.strip()
    for tag in (_PY_TAG, "<|python_start|>"):  # Llama 3's, Llama 4's
        if body.startswith(tag):
            body = body[len(tag):].strip()
    if body.endswith("<|python_end|>"):
        body = body[:-len("<|python_end|>")].strip()
    if body.startswith("{") and body.endswith("}"):
        try:
            obj = json.loads(body)
        except ValueError:
            return text, None
        if isinstance(obj, dict) and ("parameters" in obj or "arguments" in obj):
            call = _call(obj, names, 0)
            if call is not None:
                return "", [call]
    return text, None
