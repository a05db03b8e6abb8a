"""`reflex http`'s decision, Anthropic Messages and OpenAI Responses endpoints against a real
engine on SmolLM2 (CPU), driven by the official `anthropic` and `openai` packages, with
raw HTTP (httpx) for the edge cases. One front with a key: the anthropic client sends it as
x-api-key, the openai client as a bearer token."""

import json
import sys

import anthropic
import httpx
import jsonschema
import openai
import pytest

from reflex_ipc.testing.http_front import Front, assert_error_shape, http_env  # noqa: E402

import reflex_ipc.front  # noqa: F401,E402  (reflex_client on the path)
from reflex_client import Client  # noqa: E402

KEY = "k3y"
T0 = {"temperature": 0}  # anthropic's typed API no longer has temperature: an extra body field
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
           "required": ["city"]}


@pytest.fixture(scope="module")
def front(smollm2):
    f = Front(["--device", "cpu"], env=http_env(REFLEX_API_KEY=KEY))
    yield f
    f.close()


@pytest.fixture(scope="module")
def engine(smollm2):
    c = Client.spawn(sys.executable, args=("-m", "reflex_ipc", "stdio", "--device", "cpu"), env=http_env(),
                     ready_timeout=180)
    yield c
    c.close()


@pytest.fixture()
def claude(front):
    return anthropic.Anthropic(base_url=front.url, api_key=KEY, max_retries=0, timeout=300)


@pytest.fixture()
def oai(front):
    return openai.OpenAI(base_url=front.url + "/v1", api_key=KEY, max_retries=0, timeout=300)


def post(front, path, body, **kw):
    return httpx.post(front.url + path, json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=300, **kw)


# -- /v1/classify ------------------------------------------------------------------------------

REVIEW = "Review: the soup was cold and the waiter was rude. Sentiment:"


def test_classify_matches_the_engine(front, engine):
    body = {"input": REVIEW, "labels": [" positive", " negative"]}
    # both engines' prefix caches hold the prompt first, so that every answer below comes from
    # the same split of the prompt (on the cpu backend a prompt evaluated in one batch and one
    # continued from the cache differ in the last bits)
    assert post(front, "/v1/classify", body).status_code == 200
    engine.request("classify", body)
    r = post(front, "/v1/classify", body)
    assert r.status_code == 200, r.text
    got = r.json()
    ref = engine.request("classify", body)
    sys1 = engine.system1(REVIEW, [" positive", " negative"])
    assert got["object"] == "classification" and got["best"] == ref["best"] == [" positive", " negative"][sys1["best_idx"]]
    for a, b, c in zip(got["labels"], ref["labels"], sys1["candidates"]):
        assert a["label"] == b["label"] and a["tokens"] == b["tokens"] == len(c["token_ids"]) == 1
        assert abs(a["probability"] - b["probability"]) < 1e-9 and abs(a["logprob"] - b["logprob"]) < 1e-9
        # system1 may take the prompt from another cache entry: the cpu backend's batch shapes
        # move these logprobs by up to ~0.1 (see test_classify_batch_over_a_shared_prefix)
        assert abs(a["probability"] - c["probability"]) < 0.02 and abs(a["logprob"] - c["logprob"]) < 0.15
    assert abs(sum(x["probability"] for x in got["labels"]) - 1) < 1e-9
    assert got["entropy"] == pytest.approx(ref["entropy"]) == pytest.approx(sys1["entropy"], abs=0.02)
    assert "warning" not in got
    assert got["usage"]["prompt_tokens"] == sys1["prompt_tokens"]


def test_classify_batch_over_a_shared_prefix(front, engine):
    doc = "Report: sales fell by a fifth in the third quarter while costs rose. " * 4
    msgs = [{"role": "system", "content": "Answer yes or no."}, {"role": "user", "content": doc}]
    qs = ["Did sales fall?", "Did costs fall?", "Is this about a company?"]
    r = post(front, "/v1/classify", {"messages": msgs, "labels": ["yes", "no", "not sure"], "questions": qs})
    assert r.status_code == 200, r.text
    got = r.json()
    assert [x["question"] for x in got["results"]] == qs and "labels" not in got
    assert "different lengths" in got["warning"]  # "not sure" is two tokens, yes/no one
    # the shared prefix is evaluated once: every later question reuses it
    assert all(x["cached_tokens"] > 0.6 * x["prompt_tokens"] for x in got["results"][1:])
    # each decision equals the same question classified alone
    for x, q in zip(got["results"], qs):
        alone = engine.request("classify", {"messages": msgs + [{"role": "user", "content": q}],
                                            "labels": ["yes", "no", "not sure"], "cache_prompt": False})
        assert x["best"] == alone["best"]
        # a two-token label's second token is evaluated in a batch of another shape here than
        # alone: the cpu backend's tiled batches move its logprob by up to ~0.05 (its distance
        # from the numpy oracle is ~0.2 on this Q4_1 model either way)
        assert [a["logprob"] for a in x["labels"]] == pytest.approx([a["logprob"] for a in alone["labels"]], abs=0.1)


@pytest.mark.parametrize("body,param", [
    ({"input": "x", "labels": [" a"] * 2}, "labels"),
    ({"input": "x", "labels": [f" l{i}" for i in range(65)]}, "labels"),
    ({"input": "x", "labels": []}, "labels"),
    ({"labels": [" a"]}, "input"),
    ({"input": "x", "messages": [{"role": "user", "content": "y"}], "labels": [" a"]}, "input"),
    ({"input": "x", "labels": [" a"], "temperature": 0}, "temperature"),
])
def test_classify_bad_requests(front, body, param):
    err = assert_error_shape(post(front, "/v1/classify", body), 400)
    assert err["param"] == param, err


# -- /v1/messages (Anthropic) ------------------------------------------------------------------

def _ask(claude, **kw):
    kw.setdefault("messages", [{"role": "user", "content": "Name a primary color."}])
    return claude.messages.create(model="any", max_tokens=kw.pop("max_tokens", 12), extra_body=T0, **kw)


def test_messages(claude, engine):
    m = _ask(claude, system="Answer in one word.")
    ref = engine.chat([{"role": "system", "content": "Answer in one word."},
                       {"role": "user", "content": "Name a primary color."}], max_tokens=12, temperature=0)
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == ref["text"]
    assert m.stop_reason == ("max_tokens" if ref["finish_reason"] == "length" else "end_turn")
    assert (m.usage.input_tokens, m.usage.output_tokens) == (ref["prompt_tokens"], ref["completion_tokens"])


def test_messages_stream(claude):
    whole = _ask(claude, max_tokens=16)
    events = []
    with claude.messages.stream(model="any", max_tokens=16, messages=[{"role": "user", "content": "Name a primary color."}],
                                extra_body=T0) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    with claude.messages.stream(model="any", max_tokens=16, messages=[{"role": "user", "content": "Name a primary color."}],
                                extra_body=T0) as s:
        events = [e.type for e in s]
    assert text == whole.content[0].text == final.content[0].text
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens
    assert events[0] == "message_start" and events[-1] == "message_stop"
    raw = [e for e in events if e in ("content_block_start", "content_block_stop", "message_delta")]
    assert raw == ["content_block_start", "content_block_stop", "message_delta"]


def test_messages_stop_sequence(claude):
    full = _ask(claude, max_tokens=12).content[0].text
    word = full.split()[1]
    m = _ask(claude, max_tokens=12, stop_sequences=[word])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == word
    assert m.content[0].text == full[:full.index(word)]


TOOLS = [{"name": "get_weather", "description": "The weather in a city", "input_schema": WEATHER}]


@pytest.mark.parametrize("stream", [False, True])
def test_messages_tool_use_and_result(claude, stream):
    kw = dict(model="any", max_tokens=40, tools=TOOLS, tool_choice={"type": "any"}, extra_body=T0,
              messages=[{"role": "user", "content": "What is the weather in Paris?"}])
    if stream:
        with claude.messages.stream(**kw) as s:
            types = [e.type for e in s]
            m = s.get_final_message()
        assert "content_block_delta" in types
    else:
        m = claude.messages.create(**kw)
    assert m.stop_reason == "tool_use"
    uses = [b for b in m.content if b.type == "tool_use"]
    assert uses and uses[0].name == "get_weather" and uses[0].id.startswith("toolu_")
    jsonschema.validate(uses[0].input, WEATHER)
    assert all("<tool_call>" not in b.text for b in m.content if b.type == "text")  # no markup as text
    # the second turn: the tool's result goes back as a tool_result block
    follow = claude.messages.create(
        model="any", max_tokens=12, tools=TOOLS, extra_body=T0,
        messages=[{"role": "user", "content": "What is the weather in Paris?"},
                  {"role": "assistant", "content": m.content},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                                "content": "Sunny, 21 C"}]}])
    assert follow.content and follow.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_messages_named_tool_and_json_output(claude):
    tools = TOOLS + [{"name": "search", "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}]
    m = claude.messages.create(model="any", max_tokens=40, tools=tools, tool_choice={"type": "tool", "name": "search"},
                               messages=[{"role": "user", "content": "Weather in Paris?"}], extra_body=T0)
    assert [b.name for b in m.content if b.type == "tool_use"] == ["search"]
    schema = {"type": "object", "properties": {"color": {"type": "string"}}, "required": ["color"]}
    m = claude.messages.create(model="any", max_tokens=30, output_config={"format": {"type": "json_schema", "schema": schema}},
                               messages=[{"role": "user", "content": "A color as JSON."}], extra_body=T0)
    jsonschema.validate(json.loads(m.content[0].text), schema)


def test_messages_errors(front, claude):
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model="any", max_tokens=8, messages=[
            {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                      "data": "AA=="}}]}])
    assert e.value.body["error"]["type"] == "invalid_request_error" and "image" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model="any", max_tokens=0, messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.AuthenticationError) as e:
        anthropic.Anthropic(base_url=front.url, api_key="wrong", max_retries=0).messages.create(
            model="any", max_tokens=4, messages=[{"role": "user", "content": "x"}])
    assert e.value.body == {"type": "error", "error": {"type": "authentication_error", "message": e.value.body["error"]["message"]}}
    r = httpx.post(front.url + "/v1/messages", headers={"x-api-key": KEY}, timeout=60,
                   json={"max_tokens": 100000, "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and r.json()["type"] == "error"


# -- /v1/responses (OpenAI) --------------------------------------------------------------------

# Requests whose answers are compared across engines or repeats prefill their whole prompt
# (cache_prompt off), so the comparison does not depend on what each engine held before or on
# any batch-shape sensitivity of a backend (ARCHITECTURE.md, "Batch-invariant": F32 weights
# through BLAS are not).
WHOLE = {"cache_prompt": False}


def test_responses(oai, engine):
    r = oai.responses.create(model="any", input="Name a primary color.", instructions="Answer in one word.",
                             max_output_tokens=12, temperature=0, extra_body=WHOLE)
    ref = engine.chat([{"role": "system", "content": "Answer in one word."},
                       {"role": "user", "content": "Name a primary color."}], max_tokens=12, temperature=0,
                      **WHOLE)
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.output_text == ref["text"] and [o.type for o in r.output] == ["message"]
    assert r.status == ("incomplete" if ref["finish_reason"] == "length" else "completed")
    assert r.usage.input_tokens == ref["prompt_tokens"] and r.usage.output_tokens == ref["completion_tokens"]
    items = [{"role": "user", "content": "Name a primary color."},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": r.output_text}]},
             {"role": "user", "content": [{"type": "input_text", "text": "Another one?"}]}]
    r2 = oai.responses.create(model="any", input=items, max_output_tokens=8, temperature=0)
    assert isinstance(r2.output_text, str) and r2.usage.input_tokens > r.usage.input_tokens


def test_responses_stream(oai):
    whole = oai.responses.create(model="any", input="Name a primary color.", max_output_tokens=16, temperature=0,
                                 extra_body=WHOLE)
    events = list(oai.responses.create(model="any", input="Name a primary color.", max_output_tokens=16,
                                       temperature=0, stream=True, extra_body=WHOLE))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text == events[-1].response.output_text
    # the SDK's stream helper wants response.completed (an incomplete one ends response.incomplete)
    kw = dict(model="any", input="Name a primary color.", instructions="Answer in one word.", max_output_tokens=64,
              temperature=0, extra_body=WHOLE)
    done = oai.responses.create(**kw)
    assert done.status == "completed"
    with oai.responses.stream(**kw) as s:
        for _ in s:
            pass
        assert s.get_final_response().output_text == done.output_text


FTOOLS = [{"type": "function", "name": "get_weather", "description": "The weather in a city", "parameters": WEATHER}]


@pytest.mark.parametrize("stream", [False, True])
def test_responses_function_calls(oai, stream):
    kw = dict(model="any", input="What is the weather in Paris?", tools=FTOOLS, tool_choice="required",
              max_output_tokens=40, temperature=0)
    if stream:
        with oai.responses.stream(**kw) as s:
            kinds = [e.type for e in s]
            r = s.get_final_response()
        assert "response.function_call_arguments.done" in kinds
    else:
        r = oai.responses.create(**kw)
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and calls[0].call_id
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
    assert not [o for o in r.output if o.type == "message"]
    r2 = oai.responses.create(model="any", tools=FTOOLS, max_output_tokens=12, temperature=0, input=[
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 21 C"}])
    assert r2.status in ("completed", "incomplete")


def test_responses_json_schema_and_errors(oai):
    schema = {"type": "object", "properties": {"color": {"type": "string"}}, "required": ["color"],
              "additionalProperties": False}
    r = oai.responses.create(model="any", input="A color as JSON.", max_output_tokens=30, temperature=0,
                             text={"format": {"type": "json_schema", "name": "c", "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(r.output_text), schema)
    with pytest.raises(openai.BadRequestError) as e:
        oai.responses.create(model="any", input="x", previous_response_id="resp_1")
    assert e.value.param == "previous_response_id"
    with pytest.raises(openai.BadRequestError) as e:
        oai.responses.create(model="any", input=[{"type": "input_image", "image_url": "x"}])
    assert e.value.code == "unsupported_parameter"


# -- chat completions: forced and streamed tool calls ----------------------------------------

def test_chat_tool_choice(oai):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = oai.chat.completions.create(model="any", messages=msgs, tools=tools, tool_choice="required",
                                    max_tokens=40, temperature=0)
    assert r.choices[0].finish_reason == "tool_calls"
    call = r.choices[0].message.tool_calls[0]
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    chunks = list(oai.chat.completions.create(model="any", messages=msgs, tools=tools, max_tokens=40, temperature=0,
                                              tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                              stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "<tool_call>" not in text
    streamed = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert streamed and streamed[0].function.name == "get_weather"
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


# -- the turn splitter alone (no engine) -------------------------------------------------------

def _run_turn(pieces, result, tools=True):
    from reflex_ipc.front.textstream import Turn

    t = Turn(tools)
    out = []
    for p in pieces:
        out += t.feed({"text": p})
    rest, calls = t.finish(result)
    joined = {}
    for kind, text in out + rest:
        joined[kind] = joined.get(kind, "") + text
    return out, joined, calls


def test_turn_holds_tool_markup_back():
    call = {"id": "call_0", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    text = 'Sure.<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    out, joined, calls = _run_turn(["Sure.", "<tool", "_call>\n{", '"name": "f", "arguments": {}}\n</tool_call>'],
                                   {"text": text, "tool_calls": [call], "content": "Sure."})
    assert joined == {"content": "Sure."} and calls == [call]
    assert all("<" not in t for _, t in out)
    # a "<" that turns out not to be a marker goes out after all
    out, joined, calls = _run_turn(["a <", "b"], {"text": "a <b"})
    assert joined == {"content": "a <b"} and calls == []
    # Llama 3: a reply that opens with "{" is a call, not text
    out, joined, _ = _run_turn(['{"name"', ': "f", "parameters": {}}'],
                               {"text": '{"name": "f", "parameters": {}}', "tool_calls": [call], "content": ""})
    assert out == [] and joined == {}


def test_turn_routes_the_engines_reasoning():
    """The engine splits the reasoning off (token events' and the result's
    reasoning_content); the turn routes it and never parses <think> itself."""
    from reflex_ipc.front.textstream import Turn

    t = Turn(False)
    assert t.feed({"text": "", "reasoning_content": "hmm"}) == [("reasoning", "hmm")]
    assert t.feed({"text": "Yes", "reasoning_content": ""}) == [("content", "Yes")]
    assert t.finish({"text": "Yes", "reasoning_content": "hmm"}) == ([], [])
    # what the stream missed (a reasoning tail released at the end) comes with finish
    t = Turn(True)
    t.feed({"text": "", "reasoning_content": "a"})
    assert t.finish({"text": "", "reasoning_content": "ab"}) == ([("reasoning", "b")], [])
    # without the engine's split, <think> in the text is content (a model without think tokens)
    out, joined, _ = _run_turn(["<think>x</think>", "y"], {"text": "<think>x</think>y"}, tools=False)
    assert joined == {"content": "<think>x</think>y"}


def test_sampling_extras_pass_through(claude, oai, engine):
    """Sampling fields the official clients do not type go as extra body fields, under the
    engine's names; one the engine lacks is a 400 naming it."""
    # cache_prompt off: each request prefills its whole prompt, whatever the engine held before
    sampled = dict(temperature=1.0, top_k=40, min_p=0.05, seed=7, repeat_penalty=1.1, cache_prompt=False)
    ref = engine.chat([{"role": "user", "content": "Name a primary color."}], max_tokens=8, **sampled)
    m = claude.messages.create(model="any", max_tokens=8, messages=[{"role": "user", "content": "Name a primary color."}],
                               extra_body=sampled)
    assert m.content[0].text == ref["text"]
    r = oai.responses.create(model="any", input="Name a primary color.", max_output_tokens=8,
                             temperature=1.0, extra_body={k: v for k, v in sampled.items() if k != "temperature"})
    assert r.output_text == ref["text"]
    try:
        engine.generate("x", max_tokens=1, typical_p=0.5)
        has_typical = True
    except Exception:
        has_typical = False
    if not has_typical:
        with pytest.raises(anthropic.BadRequestError) as e:
            claude.messages.create(model="any", max_tokens=4, messages=[{"role": "user", "content": "x"}],
                                   extra_body={"typical_p": 0.5})
        assert "typical_p" in e.value.body["error"]["message"]
        with pytest.raises(openai.BadRequestError) as e:
            oai.responses.create(model="any", input="x", max_output_tokens=4, extra_body={"typical_p": 0.5})
        assert e.value.param == "typical_p" and e.value.code == "unsupported_parameter"


# -- reasoning: a tiny model with <think> tokens behind every front ----------------------------

THINK_TEMPLATE = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                  "{%- if add_generation_prompt %}<|im_start|>assistant\n"
                  "{%- if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
                  "{%- else %}<think>\n{%- endif %}{%- endif %}")
WHY = [{"role": "user", "content": "Why?"}]


@pytest.fixture(scope="module")
def thinker(tmp_path_factory, smollm2):
    """(front, engine) on a tiny random model whose vocabulary has <think> / </think> tokens
    and whose template opens the block (Qwen3-style enable_thinking switch)."""
    from reflex_ipc.testing.synthetic import thinker_gguf

    path = thinker_gguf(tmp_path_factory.mktemp("thinker-http"), THINK_TEMPLATE)
    f = Front(["--device", "cpu", "--model", path], env=http_env(REFLEX_API_KEY=KEY))
    c = Client.spawn(sys.executable, args=("-m", "reflex_ipc", "stdio", "--device", "cpu", "--model", path),
                     env=http_env(), ready_timeout=180)
    yield f, c
    c.close()
    f.close()


def _think_ref(engine, **kw):
    ref = engine.chat(WHY, max_tokens=8, temperature=0, **kw)
    return ref.get("reasoning_content", ""), ref["text"]


def test_chat_completions_reasoning(thinker):
    front, engine = thinker
    oai = openai.OpenAI(base_url=front.url + "/v1", api_key=KEY, max_retries=0, timeout=300)
    reasoning, text = _think_ref(engine, thinking_budget=3)
    assert reasoning and text  # the budget closed the block after 3 tokens: both parts are there
    kw = dict(model="any", messages=WHY, max_tokens=8, temperature=0)
    r = oai.chat.completions.create(**kw, extra_body={"thinking_budget": 3})
    msg = r.choices[0].message
    assert msg.reasoning_content == reasoning and msg.content == text
    got = {"reasoning_content": "", "content": ""}
    for c in oai.chat.completions.create(**kw, stream=True, extra_body={"thinking_budget": 3}):
        for ch in c.choices:
            for k in got:
                got[k] += getattr(ch.delta, k, None) or ""
    assert got == {"reasoning_content": reasoning, "content": text}
    # thinking off: enable_thinking false, or reasoning_effort "none", as the engine's enable_thinking
    _, off = _think_ref(engine, enable_thinking=False)
    for extra in ({"enable_thinking": False}, {"reasoning_effort": "none"}):
        m = oai.chat.completions.create(**kw, extra_body=extra).choices[0].message
        assert getattr(m, "reasoning_content", None) is None and m.content == off
    # n > 1 streamed: each choice's reasoning under its index
    parts = {}
    for c in oai.chat.completions.create(**kw, n=2, stream=True, extra_body={"thinking_budget": 3}):
        for ch in c.choices:
            parts[ch.index] = parts.get(ch.index, "") + (getattr(ch.delta, "reasoning_content", None) or "")
    assert parts == {0: reasoning, 1: reasoning}  # greedy: the same twice


def test_messages_thinking(thinker):
    front, engine = thinker
    claude = anthropic.Anthropic(base_url=front.url, api_key=KEY, max_retries=0, timeout=300)
    reasoning, text = _think_ref(engine, thinking_budget=3, enable_thinking=True)
    kw = dict(model="any", max_tokens=8, messages=WHY, extra_body=T0)
    m = claude.messages.create(**kw, thinking={"type": "enabled", "budget_tokens": 3})
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking == reasoning and m.content[1].text == text
    with claude.messages.stream(**kw, thinking={"type": "enabled", "budget_tokens": 3}) as s:
        final = s.get_final_message()
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in final.content] == \
        [("thinking", reasoning), ("text", text)]
    _, off = _think_ref(engine, enable_thinking=False)
    m = claude.messages.create(**kw, thinking={"type": "disabled"})
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == off


def test_responses_reasoning_items(thinker):
    front, engine = thinker
    oai = openai.OpenAI(base_url=front.url + "/v1", api_key=KEY, max_retries=0, timeout=300)
    reasoning, text = _think_ref(engine, thinking_budget=3, enable_thinking=True)
    kw = dict(model="any", input=WHY, max_output_tokens=8, temperature=0)
    r = oai.responses.create(**kw, reasoning={"effort": "high"}, extra_body={"thinking_budget": 3})
    assert [o.type for o in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == reasoning and r.output_text == text
    deltas = {"response.reasoning_text.delta": "", "response.output_text.delta": ""}
    for ev in oai.responses.create(**kw, stream=True, reasoning={"effort": "high"}, extra_body={"thinking_budget": 3}):
        if ev.type in deltas:
            deltas[ev.type] += ev.delta
    assert deltas == {"response.reasoning_text.delta": reasoning, "response.output_text.delta": text}
    _, off = _think_ref(engine, enable_thinking=False)
    r = oai.responses.create(**kw, reasoning={"effort": "none"})
    assert [o.type for o in r.output] == ["message"] and r.output_text == off


def test_every_front_takes_the_engines_sampling_fields():
    """Each generating front's request struct has every sampling parameter of the engine
    (generation.Params) under its name (or its API's own name for it), so none can drift
    out of a front; n only where the API answers several choices."""
    import msgspec

    from reflex_ipc.front import anthropic as A
    from reflex_ipc.front import api
    from reflex_ipc.front import responses as R
    from reflex_ipc.generation import Params

    sampling = set(Params.DEFAULTS) - {"max_tokens", "stop", "logprobs", "reasoning", "n_indent",
                                       "t_max_predict_ms", "n"}
    own = {  # the API's own names for an engine field
        "messages": {"stop": "stop_sequences"},
        "responses": {},
    }
    fronts = {"chat": (api.ChatRequest, sampling | {"n", "enable_thinking"}),
              "completions": (api.CompletionRequest, sampling | {"n"}),
              "messages": (A.MessagesRequest, sampling | {"enable_thinking"}),
              "responses": (R.ResponsesRequest, sampling | {"enable_thinking"}),
              "infill": (api.InfillRequest, sampling - {"logit_bias", "thinking_budget"})}
    for name, (cls, want) in fronts.items():
        fields = {f.name for f in msgspec.structs.fields(cls)}
        missing = {f for f in want if f not in fields and own.get(name, {}).get(f) not in fields}
        assert not missing, (name, missing)
