"""gpt-oss's harmony replies (reflex_ipc/harmony.py): the channels split into content and
reasoning_content as the text streams in, tool calls (messages to functions.NAME) in OpenAI's
shape through toolcalls.parse_tool_calls, and the generation pipeline on a vocabulary with
harmony's special tokens (the tokens of a scripted reply fed through it)."""

import json

import pytest

from reflex_ipc.harmony import HarmonySplitter, call_block, tool_calls
from reflex_ipc.toolcalls import parse_tool_calls

A = "<|channel|>analysis<|message|>"
NEXT = "<|end|><|start|>assistant"
CASES = [  # generated text (after the prompt's <|start|>assistant), content, reasoning
    (A + "Two and two.<|end|><|start|>assistant<|channel|>final<|message|>It is 4.", "It is 4.", "Two and two."),
    ("<|channel|>final<|message|>Direct answer, no analysis.", "Direct answer, no analysis.", ""),
    (A + "Need the weather." + NEXT + "<|channel|>commentary to=functions.get_weather <|constrain|>json"
     "<|message|>{\"city\": \"Paris\"}", call_block("get_weather", '{"city": "Paris"}'), "Need the weather."),
    (A + "x" + NEXT + " to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Oslo\"}",
     call_block("get_weather", '{"city": "Oslo"}'), "x"),
    (A + "plan" + NEXT + "<|channel|>commentary<|message|>Checking now." + NEXT +
     "<|channel|>commentary to=functions.f<|message|>{}", "Checking now." + call_block("f", "{}"), "plan"),
    (A + "thinking that never ends", "", "thinking that never ends"),
    ("Plain text, not harmony at all <|message|> here", "Plain text, not harmony at all <|message|> here", ""),
    ("", "", ""),
]


@pytest.mark.parametrize("text,content,reasoning", CASES)
def test_splitter_over_any_pieces(text, content, reasoning):
    for step in (1, 2, 3, 5, 11, 10 ** 6):
        s = HarmonySplitter()
        c = r = ""
        for i in range(0, len(text), step):
            a, b = s.push(text[i:i + step])
            c, r = c + a, r + b
        a, b = s.finish()
        assert (c + a, r + b) == (content, reasoning), step


def test_tool_calls_raw_and_split():
    raw = CASES[2][0]
    for text in (raw, CASES[2][1]):
        content, calls = parse_tool_calls(text, ["get_weather"])
        assert content == "" and [c["function"] for c in calls] == [{"name": "get_weather",
                                                                    "arguments": '{"city": "Paris"}'}]
        assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    content, calls = parse_tool_calls("It is sunny." + call_block("get_weather", '{"city": "Nice"}'), ["get_weather"])
    assert content == "It is sunny." and calls[0]["function"]["name"] == "get_weather"
    # unknown functions and arguments that are not a JSON object stay text
    for bad in (call_block("other", "{}"), call_block("get_weather", "not json"), call_block("get_weather", "[1]")):
        assert parse_tool_calls(bad, ["get_weather"]) == (bad, None)
        assert tool_calls(bad, ["get_weather"]) == (bad, [])
    # two calls in one reply
    two = call_block("a", '{"x": 1}') + call_block("b", '{"y": 2}')
    content, calls = parse_tool_calls(two, ["a", "b"])
    assert content == "" and [c["function"]["name"] for c in calls] == ["a", "b"]
    assert [c["id"] for c in calls] == ["call_0", "call_1"]


@pytest.fixture(scope="module")
def harmony_runner(tmp_path_factory, smollm2):
    """A tiny llama whose vocabulary has harmony's special tokens at SmolLM2's last ids."""
    import gguf

    from reflex_ipc.engine import load_runner
    from reflex_ipc.testing.synthetic import TINY_CONFIGS, read_tokenizer, tiny_gguf, write_tokenizer

    names = ["<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>"]
    ids = {n: 49151 - i for i, n in enumerate(names)}
    d = tmp_path_factory.mktemp("harmony")
    entries = []
    for key, val, vt, st in read_tokenizer(smollm2):
        if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type"):
            val = list(val)
            for n, i in ids.items():
                val[i] = n.encode() if key == "tokenizer.ggml.tokens" else 3  # control
        entries.append((key, val, vt, st))
    vocab = d / "vocab.gguf"
    w = gguf.GGUFWriter(str(vocab), "llama")
    write_tokenizer(w, entries)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    path = d / "harmony.gguf"
    tiny_gguf(path, tokenizer=str(vocab), **TINY_CONFIGS["llama"])
    r = load_runner(str(path), device="numpy", n_ctx=256)
    yield r, ids
    r.close()


TEMPLATE = ("{%- for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endfor %}"
            "{%- if add_generation_prompt %}<|start|>assistant{% endif %}")


def _scripted(runner, monkeypatch, script, **fields):
    """A chat generate whose tokens are `script` (the executor's decode replaced)."""
    from reflex_ipc import protocol
    from reflex_ipc.api import Model

    monkeypatch.setattr(runner.exec, "decode", lambda logits, choose, check=None: iter(script))
    _, _, req = protocol.parse_request(json.dumps({"op": "generate", "messages": [
        {"role": "user", "content": "Weather in Paris?"}], "chat_template": TEMPLATE, "max_tokens": 64,
        **fields}).encode())
    events = []
    out = Model(runner).generate(req, on_token=lambda t, text, **x: events.append((t, text, x)))
    return out, events


def test_generation_splits_the_channels(harmony_runner, monkeypatch):
    r, ids = harmony_runner
    tok = r.tok
    assert ids["<|end|>"] not in tok.eog_ids and {ids["<|return|>"], ids["<|call|>"]} <= set(tok.eog_ids)

    def words(s):
        return tok.encode(s, add_bos=False, parse_special=False)

    script = ([ids["<|channel|>"]] + words("analysis") + [ids["<|message|>"]] + words("Let me think.") +
              [ids["<|end|>"], ids["<|start|>"]] + words("assistant") + [ids["<|channel|>"]] + words("final") +
              [ids["<|message|>"]] + words("Sunny, 21 degrees.") + [ids["<|return|>"]])
    out, events = _scripted(r, monkeypatch, script)
    assert out["reasoning_content"] == "Let me think." and out["text"] == "Sunny, 21 degrees."
    assert out["finish_reason"] == "stop"
    assert "".join(e[1] for e in events) == out["text"]
    assert "".join(e[2].get("reasoning_content", "") for e in events) == out["reasoning_content"]
    # a tool call: the call message ends the reply with <|call|>
    script = ([ids["<|channel|>"]] + words("commentary to=functions.get_weather ") + [ids["<|constrain|>"]] +
              words("json") + [ids["<|message|>"]] + words('{"city": "Paris"}') + [ids["<|call|>"]])
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    out, _ = _scripted(r, monkeypatch, script, tools=tools)
    assert out["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert out["content"] == ""


def test_llama4_json_tool_call():
    """Llama 4 writes the Llama 3 JSON call, possibly between its python tags."""
    for text in ('<|python_start|>{"name": "get_weather", "parameters": {"city": "Paris"}}<|python_end|>',
                 '{"name": "get_weather", "parameters": {"city": "Paris"}}'):
        content, calls = parse_tool_calls(text, ["get_weather"])
        assert content == "" and calls[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
