"""Tool-call formats (reflex_ipc/toolcalls.py) with each model family's real chat template
(tests/data/chat_templates): the template renders an assistant turn with tool calls, the
parser gets the same calls back from it; the grammar of tool_choice required / named
accepts that rendering, compiles with llguidance, and whatever it lets through parses
into calls whose arguments validate against the tool's schema; the engine enforces it."""

import json
import os
import sys

import jsonschema
import numpy as np
import pytest

from reflex_ipc import chat, toolcalls
from reflex_ipc.toolcalls import detect, grammar, parse_tool_calls

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATES = os.path.join(HERE, "data", "chat_templates")

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 9},
    "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city", "days"]}
SEARCH = {"type": "object", "properties": {"q": {"type": "string", "maxLength": 12}}, "required": ["q"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather forecast",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "search", "description": "Web search", "parameters": SEARCH}}]
SCHEMAS = {"get_weather": WEATHER, "search": SEARCH}

# (template file, the format it asks for, its EOS text, its BOS text, calls it can render at
# once, the text that opens an assistant turn in the history)
CASES = [
    ("qwen3.jinja", "hermes", "<|im_end|>", "", 2, "<|im_start|>assistant\n"),
    ("hermes-3.jinja", "hermes", "<|im_end|>", "<|begin_of_text|>", 2, "<|im_start|>assistant\n"),
    ("llama3.jinja", "llama3", "<|eot_id|>", "<|begin_of_text|>", 1,
     "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    ("mistral-nemo.jinja", "mistral", "</s>", "<s>", 2, ""),
    ("mistral-small-3.2.jinja", "mistral_args", "</s>", "<s>", 2, ""),
    ("qwen3-coder.jinja", "qwen3_coder", "<|im_end|>", "", 2, "<|im_start|>assistant"),
    ("deepseek-r1.jinja", "deepseek_r1", "<｜end▁of▁sentence｜>", "<｜begin▁of▁sentence｜>", 2, "<｜Assistant｜>"),
    ("deepseek-v3.1.jinja", "deepseek_v3", "<｜end▁of▁sentence｜>", "<｜begin▁of▁sentence｜>", 2,
     "<｜Assistant｜><think></think>"),
]
IDS = [c[0] for c in CASES]


def template(name):
    with open(os.path.join(TEMPLATES, name), encoding="utf-8") as f:
        return f.read()


class _Tok:
    """What chat.render reads of a tokenizer: the BOS/EOS texts."""

    def __init__(self, bos, eos):
        self.bos_id, self.eos_id = (0 if bos else None), 1
        self._t = {0: bos, 1: eos}

    def token_text(self, i):
        return self._t[i]


CALLS = [{"id": "abc123def", "type": "function",
          "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}},
         {"id": "xyz789uvw", "type": "function",
          "function": {"name": "search", "arguments": {"q": "café 🙂"}}}]


def rendered_reply(name, eos, bos, header, calls):
    """The assistant turn holding `calls` exactly as the template writes it in the history:
    the conversation with the turn less the one without it, less the turn's header, up to
    its EOS."""
    tok = _Tok(bos, eos)
    src = template(name)
    user = [{"role": "user", "content": "Weather in Paris for 3 days? Also search café."}]
    turn = {"role": "assistant", "content": "", "tool_calls": calls}
    before = chat.render(tok, None, user, tools=TOOLS, chat_template=src, add_generation_prompt=False)
    full = chat.render(tok, None, user + [turn], tools=TOOLS, chat_template=src, add_generation_prompt=False)
    assert full.startswith(before)
    reply = full[len(before):]
    assert reply.startswith(header), reply
    return reply[len(header):].split(eos)[0].strip()


@pytest.mark.parametrize("name,fmt,eos,bos,n,header", CASES, ids=IDS)
def test_template_round_trip(name, fmt, eos, bos, n, header):
    src = template(name)
    assert detect(src) == fmt
    reply = rendered_reply(name, eos, bos, header, CALLS[:n])
    content, calls = parse_tool_calls(reply, TOOLS, fmt)
    assert calls is not None, reply
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == \
        [(c["function"]["name"], c["function"]["arguments"]) for c in CALLS[:n]], reply
    assert content.replace("<think>\n\n</think>", "") == ""  # Qwen3 writes an empty think block
    # any format: the parser that tries them all finds the same calls
    assert parse_tool_calls(reply, TOOLS)[1] == calls or fmt.startswith("mistral")
    if fmt.startswith("mistral"):  # Mistral's templates want 9 alphanumeric ids
        assert all(len(c["id"]) == 9 and c["id"].isalnum() for c in calls)


@pytest.mark.parametrize("name,fmt,eos,bos,n,header", CASES, ids=IDS)
def test_object_arguments_for_the_template(name, fmt, eos, bos, n, header):
    """OpenAI's JSON-text arguments become objects for templates that tojson or iterate them,
    so the history renders as the model writes calls."""
    src = template(name)
    as_text = [{**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
               for c in CALLS[:n]]
    msgs = [{"role": "assistant", "content": "", "tool_calls": as_text}]
    assert toolcalls.wants_object_arguments(src)
    fixed = toolcalls.object_arguments(msgs)
    assert fixed[0]["tool_calls"][0]["function"]["arguments"] == CALLS[0]["function"]["arguments"]
    assert msgs[0]["tool_calls"][0]["function"]["arguments"] == as_text[0]["function"]["arguments"]  # a copy


def test_content_around_calls():
    text = 'Checking.\n<tool_call>\n<function=search>\n<parameter=q>\ncafé\n</parameter>\n</function>\n</tool_call>'
    content, calls = parse_tool_calls(text, TOOLS, "qwen3_coder")
    assert content == "Checking." and json.loads(calls[0]["function"]["arguments"]) == {"q": "café"}
    text = "Let me look.[TOOL_CALLS]search[ARGS]{\"q\": \"x\"}"
    content, calls = parse_tool_calls(text, TOOLS, "mistral_args")
    assert content == "Let me look." and calls[0]["function"]["name"] == "search"
    text = "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>search<｜tool▁sep｜>{\"q\": \"x\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    content, calls = parse_tool_calls(text, TOOLS, "deepseek_v3")
    assert content == "Sure." and len(calls) == 1


@pytest.mark.parametrize("fmt,text", [
    ("mistral", "[TOOL_CALLS][{\"name\": \"nope\", \"arguments\": {}}]"),
    ("mistral", "[TOOL_CALLS][{\"name\": \"search\", \"arguments\": "),
    ("mistral_args", "[TOOL_CALLS]search[ARGS]{bad json}"),
    ("qwen3_coder", "<tool_call>\n<function=nope>\n</function>\n</tool_call>"),
    ("deepseek_v3", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>search<｜tool▁sep｜>[1]<｜tool▁call▁end｜>"),
    ("deepseek_r1", "no calls here"),
])
def test_bad_calls_stay_text(fmt, text):
    assert parse_tool_calls(text, TOOLS, fmt) == (text, None)


def test_detect_unknown():
    assert detect("{{ messages }}") is None and detect(None) is None


# -- grammars ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tok(smollm2):
    from reflex_ipc.gguffile import GGUFFile
    from reflex_ipc.tokenizer import load_tokenizer

    return load_tokenizer(GGUFFile(smollm2))


def _matcher(tok, g):
    import llguidance

    from reflex_ipc.constrain import lltokenizer

    m = llguidance.LLMatcher(lltokenizer(tok), llguidance.LLMatcher.grammar_from_lark(g), log_level=0)
    assert not m.is_error(), m.get_error()
    return m


@pytest.mark.parametrize("name,fmt,eos,bos,n,header", CASES, ids=IDS)
def test_grammar_accepts_the_templates_rendering(tok, name, fmt, eos, bos, n, header):
    reply = rendered_reply(name, eos, bos, header, CALLS[:n])
    if fmt == "llama3":  # the template's spacing; the grammar writes json.dumps' spacing too
        reply = json.dumps({"name": "get_weather", "parameters": CALLS[0]["function"]["arguments"]})
    m = _matcher(tok, grammar(fmt, TOOLS, "required", parallel=True, tok=tok, think="</think>" in template(name)))
    ids = tok.encode(reply, add_bos=False, parse_special=False)
    assert m.consume_tokens(ids), (reply, m.get_error())
    assert m.is_accepting(), reply


def _sample(tok, m, seed, max_tokens=400, prefix=""):
    """Random logits under the grammar (a stand-in model that drifts towards closing
    tags and quotes, so free text ends) after `prefix`; returns the text."""
    rng = np.random.default_rng(seed)
    if prefix:
        assert m.consume_tokens(tok.encode(prefix, add_bos=False, parse_special=False)), m.get_error()
    closers = np.array([any(ch in tok.token_text(i) for ch in '<"}]\n') for i in range(tok.n_vocab)])
    buf = np.zeros((tok.n_vocab + 31) // 32, dtype=np.int32)
    out = []
    for step in range(max_tokens):
        m.unsafe_compute_mask_ptr(buf.ctypes.data, buf.nbytes)
        mask = np.unpackbits(buf.view(np.uint8), bitorder="little")[:tok.n_vocab].astype(bool)
        if m.is_accepting():
            mask[list(tok.eog_ids)] = True
        assert mask.any(), tok.decode(out)
        logits = rng.standard_normal(tok.n_vocab) * 3 + closers * step / 8
        logits[~mask] = -np.inf
        tid = int(np.argmax(logits))
        if tid in tok.eog_ids:
            break
        assert m.consume_token(tid)
        out.append(tid)
        if m.is_stopped():
            break
    else:
        pytest.fail(f"no end after {max_tokens} tokens: {tok.decode(out)!r}")
    return prefix + tok.decode(out)


@pytest.mark.parametrize("fmt", toolcalls.FORMATS)
@pytest.mark.parametrize("choice,parallel", [("required", True), ("required", False),
                                             ({"type": "function", "function": {"name": "search"}}, True)])
def test_forced_calls_always_parse(tok, fmt, choice, parallel):
    for seed in range(3):
        think = seed == 2 and fmt != "harmony"  # gpt-oss thinks in its analysis channel instead
        m = _matcher(tok, grammar(fmt, TOOLS, choice, parallel=parallel, tok=tok, think=think))
        text = _sample(tok, m, seed, prefix="<think>\nA tool answers this.\n</think>\n\n" if think else "")
        content, calls = parse_tool_calls(text, TOOLS, fmt)
        assert calls, text
        assert content == "" or (seed == 2 and content.startswith("<think>")), text
        if not parallel or fmt in ("llama3", "harmony"):
            assert len(calls) == 1, text
        for c in calls:
            name = c["function"]["name"]
            if isinstance(choice, dict):
                assert name == "search"
            jsonschema.validate(json.loads(c["function"]["arguments"]), SCHEMAS[name])


def test_named_choice_must_exist():
    from reflex_ipc.errors import ReflexError

    with pytest.raises(ReflexError) as e:
        grammar("hermes", TOOLS, {"type": "function", "function": {"name": "nope"}})
    assert e.value.kind == "invalid_request" and "tool_choice" in e.value.message


class _SpecialTok:
    """A vocabulary where [TOOL_CALLS] and [ARGS] are control tokens (Mistral's)."""

    def __init__(self):
        self.ids = {"[TOOL_CALLS]": 5, "[ARGS]": 6}

    def find_text(self, t):
        return self.ids.get(t, -1)

    def attr(self, i):
        from reflex_ipc.tokenizer import A_CONTROL

        return A_CONTROL

    def token_text(self, i):
        return {v: k for k, v in self.ids.items()}[i]


def test_markers_that_are_special_tokens():
    g = grammar("mistral_args", TOOLS, "required", tok=_SpecialTok())
    assert "<[5]>" in g and "<[6]>" in g and '"[TOOL_CALLS]"' not in g


# -- the engine --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def engine(smollm2):
    import reflex_ipc.front  # noqa: F401  (reflex_client on the path)
    from reflex_client import Client

    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.dirname(HERE) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    c = Client.spawn(sys.executable, args=("-m", "reflex_ipc", "stdio", "--device", "cpu"), env=env,
                     ready_timeout=180)
    yield c
    c.close()


@pytest.mark.parametrize("name", ["qwen3.jinja", "mistral-nemo.jinja", "qwen3-coder.jinja", "deepseek-v3.1.jinja"])
def test_engine_forces_a_call(engine, name):
    """SmolLM2 knows none of these formats: tool_choice required still gets calls that parse,
    in the format of the template given."""
    msgs = [{"role": "user", "content": "What is the weather in Paris for 3 days?"}]
    r = engine.generate(messages=msgs, tools=TOOLS, tool_choice="required", chat_template=template(name),
                        max_tokens=120, temperature=0)
    assert r["tool_calls"], r["text"]
    for c in r["tool_calls"]:
        jsonschema.validate(json.loads(c["function"]["arguments"]), SCHEMAS[c["function"]["name"]])
    named = engine.generate(messages=msgs, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "search"}},
                            parallel_tool_calls=False, chat_template=template(name), max_tokens=120, temperature=0)
    assert [c["function"]["name"] for c in named["tool_calls"]] == ["search"], named["text"]


def test_engine_tool_choice_errors(engine):
    from reflex_client import ReflexError

    msgs = [{"role": "user", "content": "hi"}]
    for kw, words in [({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "nope"),
                      ({"tool_choice": "required", "json_schema": {"type": "object"}}, "json_schema"),
                      ({"tool_choice": "sometimes"}, "tool_choice")]:
        with pytest.raises(ReflexError) as e:
            engine.generate(messages=msgs, tools=TOOLS, max_tokens=4, **kw)
        assert e.value.kind == "invalid_request" and words in e.value.message, e.value.message
    # none: the tools are not offered and nothing is parsed
    r = engine.generate(messages=msgs, tools=TOOLS, tool_choice="none", max_tokens=4, temperature=0)
    assert "tool_calls" not in r or not r["tool_calls"]
