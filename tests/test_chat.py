"""Chat templates (reflex_ipc/chat.py) against llama-cpp-python 0.3.36's chat formatting.

The oracle: llama_cpp.llama_chat_format.Jinja2ChatFormatter built as Llama.__init__
builds it for a GGUF's template (bos/eos texts from the vocabulary), its prompt
tokenized as its chat handler does (llama.cpp's tokenizer, special tokens parsed,
no BOS added). Templates: SmolLM2's own (ChatML, the real model file), Llama 3.3,
Gemma 2 (raises on a bad role order), Qwen3 with thinking on and off, with tools.
The non-SmolLM2 ones run on vocabulary-only GGUFs (tests/vocabgguf.py) whose
vocabulary has that format's special tokens.
"""

import os

import pytest

from reflex_ipc.testing import vocab as vg

from reflex_ipc import chat
from reflex_ipc.errors import ReflexError
from reflex_ipc.gguffile import GGUFFile
from reflex_ipc.tokenizer import load_tokenizer

pytestmark = pytest.mark.usefixtures("smollm2", "llama_cpp")
TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "chat_templates")


def template(name):
    with open(os.path.join(TEMPLATES, name + ".jinja"), encoding="utf-8") as fh:
        return fh.read()


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "city name, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}]

CONVERSATIONS = {
    "one": [{"role": "user", "content": "What is the capital of France?"}],
    "system": [{"role": "system", "content": "You are terse. Ünïcödé 🙂"},
               {"role": "user", "content": "Hi <b>there</b>\n\n  spaces  "}],
    "multi": [{"role": "user", "content": "2+2?"},
              {"role": "assistant", "content": "4"},
              {"role": "user", "content": "and 3+3?"}],
}

FORMATS = {  # name -> (template, extra tokens, tokenizer metadata)
    "llama3": ("llama3", vg.LLAMA3, {"tokenizer.ggml.add_bos_token": True}),
    "gemma": ("gemma", vg.GEMMA, {"tokenizer.ggml.add_bos_token": True}),
    "qwen3": ("qwen3", vg.QWEN3, {}),
    "gpt-oss": ("gpt-oss", vg.HARMONY, {}),
    "llama4": ("llama4", vg.LLAMA4, {"tokenizer.ggml.add_bos_token": True}),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name -> (path, template source)."""
    out = {"chatml": (vg.smollm2_path(), None)}
    d = tmp_path_factory.mktemp("chat")
    for name, (tname, extra, meta) in FORMATS.items():
        src = template(tname)
        path = str(d / f"{name}.gguf")
        ids = vg.vocab_gguf(path, extra, {"tokenizer.chat_template": src})
        if name == "llama3":
            ids = vg.vocab_gguf(path, extra, {"tokenizer.chat_template": src, **meta,
                                              "tokenizer.ggml.bos_token_id": ids["<|begin_of_text|>"],
                                              "tokenizer.ggml.eos_token_id": ids["<|eot_id|>"]})
        elif name == "gpt-oss":
            vg.vocab_gguf(path, extra, {"tokenizer.chat_template": src,
                                        "tokenizer.ggml.bos_token_id": ids["<|startoftext|>"],
                                        "tokenizer.ggml.eos_token_id": ids["<|return|>"]})
        elif name == "llama4":
            vg.vocab_gguf(path, extra, {"tokenizer.chat_template": src, **meta,
                                        "tokenizer.ggml.bos_token_id": ids["<|begin_of_text|>"],
                                        "tokenizer.ggml.eos_token_id": ids["<|eot|>"]})
        elif name == "gemma":
            vg.vocab_gguf(path, extra, {"tokenizer.chat_template": src, **meta,
                                        "tokenizer.ggml.bos_token_id": ids["<bos>"],
                                        "tokenizer.ggml.eos_token_id": ids["<eos>"]})
        out[name] = (path, src)
    return out


_cache = {}


def reflex_tok(path):
    if path not in _cache:
        f = GGUFFile(path)
        _cache[path] = (f, load_tokenizer(f))
    return _cache[path]


_oracles = {}


@pytest.fixture(scope="module", autouse=True)
def _close_oracles():
    yield
    for llm in _oracles.values():
        llm.close()
    _oracles.clear()


def oracle(path):
    import llama_cpp

    if path not in _oracles:
        _oracles[path] = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    return _oracles[path]


def oracle_ids(path, messages, tools=None, add_generation_prompt=True, **kwargs):
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    llm = oracle(path)
    eos, bos = llm.token_eos(), llm.token_bos()
    fmt = Jinja2ChatFormatter(
        template=llm.metadata["tokenizer.chat_template"],
        eos_token=llm._model.token_get_text(eos) if eos != -1 else "",
        bos_token=llm._model.token_get_text(bos) if bos != -1 else "",
        add_generation_prompt=add_generation_prompt)
    res = fmt(messages=messages, tools=tools, **kwargs)
    return llm.tokenize(res.prompt.encode("utf-8"), add_bos=not res.added_special, special=True)


def ours(path, messages, **kw):
    f, tok = reflex_tok(path)
    return chat.chat_prompt(tok, f, messages, **kw)


@pytest.mark.parametrize("conv", sorted(CONVERSATIONS))
@pytest.mark.parametrize("fmt", ["chatml", "llama3", "qwen3", "gpt-oss", "llama4"])
def test_matches_llama_cpp_python(models, fmt, conv):
    path, _ = models[fmt]
    msgs = CONVERSATIONS[conv]
    assert ours(path, msgs) == oracle_ids(path, msgs)
    assert ours(path, msgs, add_generation_prompt=False) == \
        oracle_ids(path, msgs, add_generation_prompt=False)


@pytest.mark.parametrize("conv", ["one", "multi"])
def test_gemma_matches(models, conv):
    path, _ = models["gemma"]
    msgs = CONVERSATIONS[conv]
    got = ours(path, msgs)
    assert got == oracle_ids(path, msgs)
    f, tok = reflex_tok(path)
    assert got[0] == tok.bos_id and got.count(tok.bos_id) == 1  # the template's BOS, once


def test_special_tokens_are_parsed(models):
    f, tok = reflex_tok(models["llama3"][0])
    ids = ours(models["llama3"][0], CONVERSATIONS["one"])
    assert ids[0] == tok.bos_id and ids.count(tok.bos_id) == 1
    assert tok.find_text("<|start_header_id|>") in ids and tok.find_text("<|eot_id|>") in ids


@pytest.mark.parametrize("thinking", [None, True, False])
def test_qwen3_thinking(models, thinking):
    path, _ = models["qwen3"]
    kw = {} if thinking is None else {"chat_template_kwargs": {"enable_thinking": thinking}}
    okw = {} if thinking is None else {"enable_thinking": thinking}
    got = ours(path, CONVERSATIONS["multi"], **kw)
    assert got == oracle_ids(path, CONVERSATIONS["multi"], **okw)
    f, tok = reflex_tok(path)
    assert (tok.find_text("<think>") in got) == (thinking is False)


@pytest.mark.parametrize("fmt", ["qwen3", "llama3", "gpt-oss", "llama4"])
def test_tools_in_template(models, fmt):
    path, _ = models[fmt]
    msgs = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                "name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "content": '{"temp": 21}'},
            ]
    got = ours(path, msgs, tools=TOOLS)
    assert got == oracle_ids(path, msgs, tools=TOOLS)
    f, tok = reflex_tok(path)
    assert "get_weather" in tok.decode(got) and "Weather in Paris?" in tok.decode(got)


def test_template_raises_is_invalid_request(models):
    path, _ = models["gemma"]
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(ValueError):  # the oracle raises too
        oracle_ids(path, bad)
    with pytest.raises(ReflexError) as e:
        ours(path, bad)
    assert e.value.kind == "invalid_request" and "`messages`" in e.value.message
    assert "alternate" in e.value.message
    with pytest.raises(ReflexError) as e:
        ours(path, [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}])
    assert "System role not supported" in e.value.message


@pytest.mark.parametrize("msgs, field", [
    ([], "messages"), ("hi", "messages"), ([1], "messages[0]"),
    ([{"content": "x"}], "messages[0].role"), ([{"role": 3, "content": "x"}], "messages[0].role"),
    ([{"role": "user"}], "messages[0].content"), ([{"role": "user", "content": 5}], "messages[0].content"),
    ([{"role": "user", "content": [{"type": "image"}]}], "messages[0].content[0]"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": None, "tool_calls": 3}],
     "messages[1].tool_calls"),
])
def test_malformed_messages(models, msgs, field):
    with pytest.raises(ReflexError) as e:
        ours(models["chatml"][0], msgs)
    assert e.value.kind == "invalid_request" and e.value.message.startswith(f"`{field}`")


def test_template_override_and_errors(models):
    path = models["chatml"][0]
    got = ours(path, CONVERSATIONS["one"], chat_template="{% for m in messages %}[{{ m.role }}]"
                                                          "{{ m.content }}{% endfor %}")
    f, tok = reflex_tok(path)
    assert tok.decode(got) == "[user]What is the capital of France?"
    # the guarded filters keep jinja's calling conventions (`list` takes the eval context
    # first; Mistral's templates use it)
    got = ours(path, CONVERSATIONS["one"], chat_template="{{ 'abc'|list|join('-') }}|{{ [1, 2]|list|sum }}")
    assert tok.decode(got) == "a-b-c|3"
    with pytest.raises(ReflexError) as e:
        ours(path, CONVERSATIONS["one"], chat_template="{% for %}")
    assert e.value.kind == "invalid_request" and e.value.message.startswith("`chat_template`")
    with pytest.raises(ReflexError) as e:  # the sandbox holds
        ours(path, CONVERSATIONS["one"],
             chat_template="{{ messages.__class__.__mro__[1].__subclasses__() }}")
    assert e.value.kind == "invalid_request"
    with pytest.raises(ReflexError) as e:  # immutable: no list.append
        ours(path, CONVERSATIONS["one"], chat_template="{{ messages.append(1) }}")
    assert e.value.kind == "invalid_request"
    with pytest.raises(ReflexError) as e:
        ours(path, CONVERSATIONS["one"], tools="nope")
    assert e.value.message.startswith("`tools`")


def test_no_template(tmp_path):
    path = str(tmp_path / "plain.gguf")
    vg.vocab_gguf(path)
    f = GGUFFile(path)
    with pytest.raises(ReflexError) as e:
        chat.chat_prompt(load_tokenizer(f), f, CONVERSATIONS["one"])
    assert e.value.kind == "invalid_request" and "no chat template" in e.value.message


def test_bos_as_llama_cpp_server(tmp_path):
    """A template without BOS on a vocabulary that adds BOS: llama.cpp's chat path
    (tokenize with the vocabulary's add flags) gives BOS once; a template that
    writes BOS itself on such a vocabulary gives it once too (stripped, re-added)."""
    import llama_cpp

    src = vg.smollm2_path()
    f0 = GGUFFile(src)
    chatml = f0.metadata["tokenizer.chat_template"]
    path = str(tmp_path / "bos.gguf")
    vg.vocab_gguf(path, meta={"tokenizer.chat_template": chatml,  # BOS <|endoftext|>
                              "tokenizer.ggml.add_bos_token": True,
                              "tokenizer.ggml.bos_token_id": 0})
    f = GGUFFile(path)
    tok = load_tokenizer(f)
    text = chat.render(tok, f, CONVERSATIONS["one"])
    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    want = llm.tokenize(text.encode(), add_bos=True, special=True)
    llm.close()
    got = chat.chat_prompt(tok, f, CONVERSATIONS["one"])
    assert got == want and got[0] == tok.bos_id and got.count(tok.bos_id) == 1
    got2 = chat.chat_prompt(tok, f, CONVERSATIONS["one"], chat_template="{{ bos_token }}" + chatml)
    assert got2 == got


def test_compiled_once():
    chat.compile_template.cache_clear()
    for _ in range(3):
        chat.compile_template("{{ messages[0].content }}")
    assert chat.compile_template.cache_info().misses == 1


def test_fuzzed_messages_give_ids_or_invalid_request(models):
    """Any JSON value as `messages` (and as a message's fields) ends in token ids or one
    invalid_request, on a template that raises (Gemma) and one that does not (ChatML)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    json_values = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
        max_leaves=8)
    message = st.fixed_dictionaries({}, optional={
        "role": st.sampled_from(["user", "assistant", "system", "tool", "", "weird"]) | json_values,
        "content": st.text(max_size=30) | json_values,
        "tool_calls": json_values})
    conversations = st.lists(message, max_size=4) | json_values

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(conversations, st.sampled_from(["chatml", "gemma"]))
    def check(msgs, fmt):
        try:
            ids = ours(models[fmt][0], msgs)
        except ReflexError as e:
            assert e.kind == "invalid_request" and e.message.startswith("`")
        else:
            assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)

    check()


def test_harmony_prompt(models):
    """gpt-oss: the system and developer messages, the reasoning effort from the template's kwargs,
    the generation prompt `<|start|>assistant`; <|end|> is not an end of generation, <|return|>
    and <|call|> are."""
    path, _ = models["gpt-oss"]
    msgs = CONVERSATIONS["system"]
    kw = {"reasoning_effort": "high"}
    got = ours(path, msgs, chat_template_kwargs=kw, tools=TOOLS)
    assert got == oracle_ids(path, msgs, tools=TOOLS, **kw)
    f, tok = reflex_tok(path)
    text = tok.decode(got)
    assert "Reasoning: high" in text and text.endswith("<|start|>assistant")
    assert "# Instructions" in text and "namespace functions" in text
    assert tok.find_text("<|end|>") not in tok.eog_ids
    assert {tok.find_text("<|return|>"), tok.find_text("<|call|>")} <= set(tok.eog_ids)
