"""Tool-call parsing (reflex_ipc/toolcalls.py): Hermes/Qwen3 <tool_call> blocks, Llama 3 JSON."""

import json

import pytest

from reflex_ipc.toolcalls import parse_tool_calls

NAMES = ["get_weather", "search"]


def args(call):
    return json.loads(call["function"]["arguments"])


def test_hermes_one_and_many():
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            '</tool_call>\n<tool_call>\n{"name": "search", "arguments": {"q": "café 🙂"}}\n</tool_call>')
    content, calls = parse_tool_calls(text, NAMES)
    assert content == "Let me check."
    assert [c["function"]["name"] for c in calls] == ["get_weather", "search"]
    assert args(calls[0]) == {"city": "Paris"} and args(calls[1]) == {"q": "café 🙂"}
    assert [c["id"] for c in calls] == ["call_0", "call_1"] and calls[0]["type"] == "function"


def test_hermes_string_arguments_and_bad_blocks():
    text = ('<tool_call>{"name": "search", "arguments": "{\\"q\\": 1}"}</tool_call>'
            '<tool_call>{not json}</tool_call><tool_call>{"name": "nope", "arguments": {}}</tool_call>')
    content, calls = parse_tool_calls(text, NAMES)
    assert len(calls) == 1 and args(calls[0]) == {"q": 1}
    assert "{not json}" in content and "nope" in content


def test_llama3_json():
    for text in ('{"name": "get_weather", "parameters": {"city": "Oslo"}}',
                 '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}  \n'):
        content, calls = parse_tool_calls(text, NAMES)
        assert content == "" and len(calls) == 1
        assert calls[0]["function"]["name"] == "get_weather" and args(calls[0]) == {"city": "Oslo"}


@pytest.mark.parametrize("text", [
    "The weather in Paris is sunny.", '{"answer": 42}', '{"name": "unknown_fn", "parameters": {}}',
    '{"name": "get_weather", "parameters": ', "<tool_call>unterminated",
])
def test_plain_text_has_no_calls(text):
    content, calls = parse_tool_calls(text, NAMES)
    assert calls is None and content == text
