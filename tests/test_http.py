"""`reflex http` against a real engine on SmolLM2 (CPU): the official `openai` package as the
client, raw HTTP (httpx) for the edge cases. The front is a subprocess, as users run it."""

import base64
import contextlib
import json
import math
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

import httpx
import openai
import pytest

import reflex_ipc.front  # noqa: F401  (reflex_client: installed with the wheel, else clients/python)
from reflex_client import Client, ReflexError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROMPT = "The three primary colors are"
LONG = 2000  # max_tokens of the requests a test cancels (minutes of CPU decode)
COUNT = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"  # a prompt SmolLM2 continues without ending (counting)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("REFLEX_API_KEY", None)
    env.update(extra)
    return env


class Front:
    def __init__(self, args, env=None):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-m", "reflex_ipc", "http", "--port", str(self.port), *args],
                                     env=env or _env(), stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 180
        while True:
            assert self.proc.poll() is None, f"reflex http exited:\n{self.output()}"
            try:
                r = httpx.get(self.url + "/health", timeout=5)
                if r.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"reflex http not ready:\n{self.output()}"
            time.sleep(0.1)

    def output(self):
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace")

    def health(self):
        return httpx.get(self.url + "/health", timeout=10).json()

    def wait(self, pred, timeout=30):
        deadline = time.monotonic() + timeout
        while True:
            h = self.health()
            if pred(h):
                return h
            assert time.monotonic() < deadline, f"timed out; last /health: {h}"
            time.sleep(0.02)

    def close(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def front(smollm2):
    f = Front(["--device", "cpu", "--queue", "1", "--max-body-bytes", str(1 << 20)])
    yield f
    pid = f.health()["engine"]["pid"]
    f.close()
    # uvicorn shuts down gracefully on SIGTERM, then exits by that signal; the engine goes with it
    assert f.proc.returncode in (0, -signal.SIGTERM)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.fixture(scope="module")
def engine(smollm2):
    """The same engine spoken to directly: the reference for what the front answers."""
    c = Client.spawn(sys.executable, args=("-m", "reflex_ipc", "stdio", "--device", "cpu"), env=_env(),
                     ready_timeout=180)
    yield c
    c.close()


@pytest.fixture()
def oai(front):
    return openai.OpenAI(base_url=front.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def _engine_has(engine, op, **params):
    """Whether the engine accepts these parameters (it answers "unknown field"/"unknown_op" when
    it does not have them yet); any other answer, error or not, means it has them."""
    try:
        engine.request(op, params)
    except ReflexError as e:
        if e.kind == "unknown_op" or (e.kind == "invalid_request" and "unknown field" in e.message):
            return False
    return True


def _assert_error_shape(r, status, code=None):
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    assert "Traceback" not in err["message"]
    assert err["type"] == ("invalid_request_error" if status < 500 else "server_error")
    if code is not None:
        assert err["code"] == code, err
    return err


# -- the openai client ------------------------------------------------------------------------

def test_models(front, oai):
    models = oai.models.list().data
    assert len(models) == 1
    h = front.health()
    assert h["status"] == "ok" and h["engine"]["backend"] == "cpu"  # auto, no GPU: the C kernels
    assert oai.models.retrieve(models[0].id).id == models[0].id
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve("no-such-model")


def test_completion_matches_engine(oai, engine):
    ref = engine.generate(PROMPT, max_tokens=8, temperature=0)
    r = oai.completions.create(model="any", prompt=PROMPT, max_tokens=8, temperature=0)
    assert r.object == "text_completion"
    assert r.choices[0].text == ref["text"] and ref["text"].strip()
    assert r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (ref["prompt_tokens"], 8)
    assert r.usage.total_tokens == ref["prompt_tokens"] + 8


def test_completion_stream(oai):
    full = oai.completions.create(model="any", prompt=PROMPT, max_tokens=8, temperature=0).choices[0].text
    chunks = list(oai.completions.create(model="any", prompt=PROMPT, max_tokens=8, temperature=0, stream=True,
                                         stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8
    assert len({c.id for c in chunks}) == 1


def test_stop_and_seed(oai):
    full = oai.completions.create(model="any", prompt=PROMPT, max_tokens=8, temperature=0).choices[0].text
    word = full.split()[2]
    r = oai.completions.create(model="any", prompt=PROMPT, max_tokens=8, temperature=0, stop=[word])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == full[:full.index(word)]
    a, b = (oai.completions.create(model="any", prompt=PROMPT, max_tokens=6, temperature=1.0, top_p=0.9,
                                   seed=1234).choices[0].text for _ in range(2))
    assert a == b


def test_completion_errors(oai):
    with pytest.raises(openai.BadRequestError) as e:
        oai.completions.create(model="any", prompt=PROMPT, max_tokens=100000)
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        oai.completions.create(model="any", prompt=PROMPT, logit_bias={"x": 1})
    assert e.value.param == "logit_bias"
    with pytest.raises(openai.BadRequestError) as e:
        oai.completions.create(model="any", prompt=PROMPT, temperature=3)
    assert e.value.param == "temperature"


def test_sampling_parameters_follow_the_engine(oai, engine):
    """n, the penalties, logit_bias and llama.cpp's typical_p / DRY reach the engine as its
    parameters of the same names: the front's answer is the engine's."""
    kw = dict(max_tokens=6, temperature=0, frequency_penalty=1.5, presence_penalty=0.5,
              logit_bias={"7042": -100})
    r = oai.completions.create(model="any", prompt=PROMPT, **kw)
    ref = engine.generate(PROMPT, **kw)
    assert r.choices[0].text == ref["text"]
    assert ref["text"] != engine.generate(PROMPT, max_tokens=6, temperature=0)["text"]
    extra = dict(typical_p=0.9, dry_multiplier=0.8, dry_allowed_length=1, repeat_last_n=16)
    r = oai.completions.create(model="any", prompt=PROMPT, max_tokens=5, temperature=0.9, seed=7,
                               n=3, extra_body=extra)
    ref = engine.generate(PROMPT, max_tokens=5, temperature=0.9, seed=7, n=3, **extra)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.text for c in r.choices] == [c["text"] for c in ref["choices"]]
    assert r.usage.completion_tokens == sum(c["completion_tokens"] for c in ref["choices"])
    # streamed, n > 1: per-index chunks that join to the same choices
    texts, finish = {}, {}
    for c in oai.completions.create(model="any", prompt=PROMPT, max_tokens=5, temperature=0.9, seed=7,
                                    n=3, stream=True, extra_body=extra):
        for ch in c.choices:
            texts[ch.index] = texts.get(ch.index, "") + ch.text
            finish[ch.index] = ch.finish_reason or finish.get(ch.index)
    assert [texts[i] for i in range(3)] == [c["text"] for c in ref["choices"]]
    assert [finish[i] for i in range(3)] == [c.finish_reason for c in r.choices]
    # the chat prompt's state cached first and the streamed request right after the plain one: a
    # prompt computed cold (one batch) and one mostly from the prefix cache (its last token alone)
    # differ in the last bits, enough to move a token sampled at temperature 0.9
    oai.chat.completions.create(model="any", messages=[{"role": "user", "content": "Hi"}], max_tokens=1)
    chat = oai.chat.completions.create(model="any", messages=[{"role": "user", "content": "Hi"}],
                                       max_tokens=3, temperature=0.9, seed=7, n=2)
    assert [c.index for c in chat.choices] == [0, 1]
    roles, texts, finish = {}, {}, {}
    chunks = list(oai.chat.completions.create(model="any", messages=[{"role": "user", "content": "Hi"}],
                                              max_tokens=3, temperature=0.9, seed=7, n=2, stream=True,
                                              stream_options={"include_usage": True}))
    for c in chunks:
        for ch in c.choices:
            roles[ch.index] = roles.get(ch.index) or ch.delta.role
            texts[ch.index] = texts.get(ch.index, "") + (ch.delta.content or "")
            finish[ch.index] = ch.finish_reason or finish.get(ch.index)
    assert roles == {0: "assistant", 1: "assistant"}
    assert [texts[i] for i in range(2)] == [c.message.content for c in chat.choices]
    assert [finish[i] for i in range(2)] == [c.finish_reason for c in chat.choices]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == chat.usage.completion_tokens


def test_embeddings_match_engine(oai, engine):
    texts = ["hello world", "the sky is blue"]
    ref = engine.embed(texts, normalize=True)
    for fmt in ("float", "base64"):
        r = oai.embeddings.create(model="any", input=texts, encoding_format=fmt)
        assert [d.index for d in r.data] == [0, 1]
        for d, v in zip(r.data, ref["embeddings"]):
            got = d.embedding
            if isinstance(got, str):  # the client leaves base64 alone when asked for it explicitly
                raw = base64.b64decode(got)
                got = struct.unpack(f"<{len(raw) // 4}f", raw)
            assert len(got) == ref["dim"]
            assert max(abs(a - b) for a, b in zip(got, v)) < 1e-6
            assert abs(math.sqrt(sum(x * x for x in got)) - 1) < 1e-4
        assert r.usage.prompt_tokens == sum(ref["n_tokens"])
    one = oai.embeddings.create(model="any", input="hello world")  # the client's default: base64
    assert max(abs(a - b) for a, b in zip(one.data[0].embedding, ref["embeddings"][0])) < 1e-6


def _chat(oai, **kw):
    return oai.chat.completions.create(model="any", messages=[{"role": "user", "content": "What is 2+2?"}],
                                       max_tokens=8, temperature=0, **kw)


def test_chat(oai, engine):
    """Chat goes through the engine's `messages` (its chat template): the front renders nothing.
    When the engine does not have `messages` yet, the answer is a 400 that says so."""
    if _engine_has(engine, "generate", messages=[{"role": "user", "content": "hi"}], max_tokens=1):
        r = _chat(oai)
        assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
        assert isinstance(r.choices[0].message.content, str)
        assert r.choices[0].finish_reason in ("stop", "length")
        chunks = list(_chat(oai, stream=True))
        assert chunks[0].choices[0].delta.role == "assistant"
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == r.choices[0].message.content
    else:
        for kw in ({}, {"stream": True}):
            with pytest.raises(openai.BadRequestError) as e:
                _chat(oai, **kw)
            assert e.value.code == "unsupported_parameter" and e.value.param == "messages"
            assert "not supported by this engine yet" in e.value.message


@pytest.mark.parametrize("http_kw,engine_kw", [
    ({"logprobs": True, "top_logprobs": 2}, {"logprobs": 2}),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}}},
     {"json_schema": {"type": "object"}}),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]},
     {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}),
])
def test_chat_features_follow_the_engine(oai, engine, http_kw, engine_kw):
    msgs = [{"role": "user", "content": "hi"}]
    if not _engine_has(engine, "generate", messages=msgs, max_tokens=1):
        with pytest.raises(openai.BadRequestError) as e:
            _chat(oai, **http_kw)
        assert e.value.code == "unsupported_parameter"
        return
    field = next(iter(engine_kw))
    if _engine_has(engine, "generate", messages=msgs, max_tokens=1, **engine_kw):
        r = _chat(oai, **http_kw)
        if field == "logprobs":
            lp = r.choices[0].logprobs.content
            assert len(lp) == r.usage.completion_tokens and all(len(t.top_logprobs) == 2 for t in lp)
        if field == "json_schema":
            assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:
        with pytest.raises(openai.BadRequestError) as e:
            _chat(oai, **http_kw)
        assert e.value.code == "unsupported_parameter" and "not supported by this engine yet" in e.value.message
        assert e.value.param == {"logprobs": "logprobs", "json_schema": "response_format", "tools": "tools"}[field]


def test_completion_logprobs_and_infill_follow_the_engine(front, oai, engine):
    if _engine_has(engine, "generate", prompt=PROMPT, max_tokens=1, logprobs=2):
        r = oai.completions.create(model="any", prompt=PROMPT, max_tokens=3, temperature=0, logprobs=2)
        lp = r.choices[0].logprobs
        assert "".join(lp.tokens) == r.choices[0].text and len(lp.token_logprobs) == 3
    else:
        with pytest.raises(openai.BadRequestError) as e:
            oai.completions.create(model="any", prompt=PROMPT, max_tokens=3, logprobs=2)
        assert e.value.param == "logprobs" and "not supported by this engine yet" in e.value.message
    has_infill = _engine_has(engine, "infill", prefix="def add(a, b):\n    return ", suffix="\n", max_tokens=1)
    r = httpx.post(front.url + "/infill", json={"input_prefix": "def add(a, b):\n    return ",
                                                "input_suffix": "\n", "n_predict": 4}, timeout=300)
    if has_infill:  # SmolLM2 has no FIM tokens: the engine's invalid_request, a 400
        err = _assert_error_shape(r, 400)
        assert "fill-in-the-middle" in err["message"]
    else:
        err = _assert_error_shape(r, 400, "unsupported_parameter")
        assert "not supported by this engine yet" in err["message"]


def test_the_engine_has_the_issue14_fields(engine):
    """This engine has messages, logprobs, json_schema, tools and infill, so the tests above
    take their live branches (the fallbacks are for an older engine behind --connect)."""
    msgs = [{"role": "user", "content": "hi"}]
    assert _engine_has(engine, "generate", messages=msgs, max_tokens=1)
    assert _engine_has(engine, "generate", prompt=PROMPT, max_tokens=1, logprobs=2)
    assert _engine_has(engine, "generate", messages=msgs, max_tokens=1, json_schema={"type": "object"})
    assert _engine_has(engine, "generate", messages=msgs, max_tokens=1,
                       tools=[{"type": "function", "function": {"name": "f"}}])
    assert _engine_has(engine, "infill", prefix="def f(", suffix=")", max_tokens=1)


def test_infill_on_a_fim_model(tmp_path, smollm2):
    """/infill through the engine's infill op on a model with FIM tokens (a synthetic one
    with Qwen2.5-Coder's): llama.cpp server's answer shape, the engine's text."""
    from reflex_ipc.testing import vocab as vg
    from reflex_ipc.testing.synthetic import parity_model

    vocab = str(tmp_path / "vocab.gguf")
    vg.vocab_gguf(vocab, vg.FIM_QWEN)
    model = parity_model("llama", str(tmp_path / "fim.gguf"), vocab_paths={"gpt2": vocab})
    body = {"input_prefix": "def add(a, b):\n    return ", "input_suffix": "\n", "n_predict": 4}
    f = Front(["--device", "cpu", "--model", model])
    try:
        r = httpx.post(f.url + "/infill", json=body, timeout=300)
    finally:
        f.close()
    assert r.status_code == 200, r.text
    c = Client.spawn(sys.executable, args=("-m", "reflex_ipc", "stdio", "--device", "cpu", "--model", model),
                     env=_env(), ready_timeout=180)
    try:
        ref = c.request("infill", {"prefix": body["input_prefix"], "suffix": "\n", "max_tokens": 4})
    finally:
        c.close()
    assert r.json()["content"] == ref["text"] and isinstance(r.json()["stop"], bool)


def test_cancel_by_closing_the_stream(front, oai):
    before = front.health()["cancelled"]
    stream = oai.completions.create(model="any", prompt=COUNT, max_tokens=LONG, temperature=0, stream=True)
    got = []
    for chunk in stream:
        got.append(chunk.choices[0].text)
        if len(got) == 3:
            break
    t0 = time.monotonic()
    stream.close()
    h = front.wait(lambda h: not h["queue"]["busy"] and h["cancelled"] == before + 1)
    assert time.monotonic() - t0 < 20  # LONG tokens would take minutes
    assert h["engine"]["deaths"] == 0
    r = oai.completions.create(model="any", prompt=PROMPT, max_tokens=2, temperature=0)
    assert r.choices[0].finish_reason == "length"


def test_cancel_by_disconnect_before_the_result(front):
    before = front.health()["cancelled"]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(front.url + "/v1/completions", json={"prompt": COUNT, "max_tokens": LONG, "temperature": 0}, timeout=1.5)
    front.wait(lambda h: not h["queue"]["busy"] and h["cancelled"] == before + 1)


# -- raw HTTP ---------------------------------------------------------------------------------

@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", b'{"prompt": "x", "max_tokens": ', None),
    ("/v1/completions", b'[1, 2]', None),
    ("/v1/completions", b'', None),
    ("/v1/completions", b'\xff\xfe{}', None),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": "ten"}', "max_tokens"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 0}', "max_tokens"),
    ("/v1/completions", b'{"prompt": "x", "stream": "yes"}', "stream"),
    ("/v1/completions", b'{"prompt": "x", "stop": [1]}', "stop[0]"),
    ("/v1/completions", b'{"prompt": [1, 2, 3]}', "prompt[0]"),
    ("/v1/completions", b'{"max_tokens": 1}', None),
    ("/v1/completions", b'{"prompt": "x", "seed": -1}', "seed"),
    ("/v1/completions", b'{"prompt": "x", "top_p": 0}', "top_p"),
    ("/v1/chat/completions", b'{"messages": "hi"}', "messages"),
    ("/v1/chat/completions", b'{"messages": []}', "messages"),
    ("/v1/chat/completions", b'{"messages": [{"content": "hi"}]}', "messages[0]"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": 5}]}', "messages[0].content"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}',
     "messages[0].content[0]"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}}',
     "response_format"),
    ("/v1/embeddings", b'{"input": ""}', "input"),
    ("/v1/embeddings", b'{"input": [[1, 2]]}', "input[0]"),
    ("/v1/embeddings", b'{"input": "x", "encoding_format": "hex"}', "encoding_format"),
    ("/infill", b'{"input_prefix": 3}', "input_prefix"),
    ("/v1/completions", b'{"prompt": "x", "a": ' + b'[' * 5000 + b']' * 5000 + b'}', None),
])
def test_bad_requests_are_400(front, path, body, param):
    r = httpx.post(front.url + path, content=body, headers={"content-type": "application/json"}, timeout=60)
    err = _assert_error_shape(r, 400)
    if param is not None:
        assert err["param"] == param, err


def test_oversized_body(front):
    big = json.dumps({"prompt": "x" * (1 << 20), "max_tokens": 1}).encode()
    _assert_error_shape(httpx.post(front.url + "/v1/completions", content=big, timeout=60), 413, "request_too_large")

    def chunked():  # no Content-Length: the limit holds while reading
        yield b'{"prompt": "'
        for _ in range(20):
            yield b"x" * 65536
        yield b'"}'

    _assert_error_shape(httpx.post(front.url + "/v1/completions", content=chunked(), timeout=60), 413)


def test_routes_and_methods(front):
    _assert_error_shape(httpx.get(front.url + "/v2/nothing"), 404, "not_found")
    _assert_error_shape(httpx.get(front.url + "/v1/completions"), 405, "method_not_allowed")


def test_queue_full_is_503(front):
    """--queue 1: one request runs, one waits, the next is refused at once."""
    with httpx.Client(timeout=300) as http:
        with http.stream("POST", front.url + "/v1/completions",
                         json={"prompt": COUNT, "max_tokens": LONG, "stream": True, "temperature": 0}) as running:
            assert running.status_code == 200
            lines = running.iter_lines()
            assert next(lines).startswith("data: ")
            waiting = {}
            t = threading.Thread(target=lambda: waiting.update(r=httpx.post(
                front.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 1}, timeout=300)))
            t.start()
            front.wait(lambda h: h["queue"]["waiting"] == 1)
            r = httpx.post(front.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 1}, timeout=30)
            _assert_error_shape(r, 503, "queue_full")
            assert int(r.headers["retry-after"]) >= 1
        t.join(120)  # closing the stream cancelled it: the waiting request runs
        assert waiting["r"].status_code == 200, waiting["r"].text


def test_engine_death_is_reported_and_the_engine_restarted(front):
    pid = front.health()["engine"]["pid"]
    out = {}
    t = threading.Thread(target=lambda: out.update(r=httpx.post(
        front.url + "/v1/completions", json={"prompt": COUNT, "max_tokens": LONG, "temperature": 0}, timeout=300)))
    t.start()
    front.wait(lambda h: h["queue"]["busy"])
    time.sleep(0.3)
    os.kill(pid, signal.SIGKILL)
    t.join(60)
    err = _assert_error_shape(out["r"], 503, "engine_died")
    assert "killed by signal 9" in err["message"], err
    h = front.health()
    assert h["engine"]["deaths"] == 1 and h["error"]
    r = httpx.post(front.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 2}, timeout=300)
    assert r.status_code == 200, r.text
    h = front.health()
    assert h["status"] == "ok" and h["engine"]["pid"] != pid and h["engine"]["starts"] == 2

    # mid-stream: the headers are out, so the death comes as an error event, which the
    # openai client raises
    oai = openai.OpenAI(base_url=front.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    stream = oai.completions.create(model="any", prompt=COUNT, max_tokens=LONG, temperature=0, stream=True)
    with pytest.raises(openai.APIError) as e:
        for i, _ in enumerate(stream):
            if i == 1:
                os.kill(h["engine"]["pid"], signal.SIGKILL)
    assert "engine died" in e.value.message and "killed by signal 9" in e.value.message
    r = httpx.post(front.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 2}, timeout=300)
    assert r.status_code == 200, r.text
    h = front.health()
    assert h["engine"]["deaths"] == 2 and h["engine"]["starts"] == 3


# -- --connect, the bearer token --------------------------------------------------------------

def _uds_engine(path):
    eng = subprocess.Popen([sys.executable, "-m", "reflex_ipc", "uds", path, "--device", "cpu"], env=_env(),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        assert eng.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    return eng


@pytest.fixture(scope="module")
def secured(smollm2):
    """`reflex http --connect` to a `reflex uds` started here, with a bearer token."""
    d = tempfile.mkdtemp(prefix="reflex-http-test-")
    path = os.path.join(d, "engine.sock")
    engines = [_uds_engine(path)]
    f = Front(["--connect", path], env=_env(REFLEX_API_KEY="s3cret"))
    f.sock, f.engines = path, engines
    yield f
    f.close()
    for eng in engines:
        eng.terminate()
        eng.wait(20)
    with contextlib.suppress(OSError):
        os.rmdir(d)


def test_bearer_token(secured):
    assert httpx.get(secured.url + "/health").status_code == 200  # probes need no token
    assert secured.health()["engine"]["mode"] == "connect"
    for key in ("wrong", ""):
        c = openai.OpenAI(base_url=secured.url + "/v1", api_key=key or "x", max_retries=0,
                          default_headers=None if key else {"Authorization": ""})
        with pytest.raises(openai.AuthenticationError) as e:
            c.models.list()
        assert e.value.code == "invalid_api_key"
    r = httpx.post(secured.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 1})
    _assert_error_shape(r, 401, "invalid_api_key")
    assert r.headers["www-authenticate"] == "Bearer"
    ok = openai.OpenAI(base_url=secured.url + "/v1", api_key="s3cret", max_retries=0, timeout=300)
    assert ok.completions.create(model="any", prompt=PROMPT, max_tokens=2, temperature=0).usage.completion_tokens == 2


# -- the mapping alone (the shapes the engine's coming fields take; no engine needed) ----------

def test_mapping_of_engine_fields():
    from reflex_ipc.front import api

    lp = [{"token_id": 5, "text": "Hé", "logprob": -0.5, "top": [{"token_id": 5, "text": "Hé", "logprob": -0.5},
                                                              {"token_id": 6, "text": "x", "logprob": -1.5}]},
          {"token_id": 7, "text": "!", "logprob": -0.1, "top": []}]
    result = {"text": "Hé!", "finish_reason": "stop_string", "prompt_tokens": 3, "completion_tokens": 2,
              "cached_tokens": 2, "logprobs": lp, "timings": {"total": 1.0}}
    c = api.completion_response(result, "m")
    assert c["choices"][0]["finish_reason"] == "stop"
    assert c["choices"][0]["logprobs"] == {"tokens": ["Hé", "!"], "token_logprobs": [-0.5, -0.1],
                                           "top_logprobs": [{"Hé": -0.5, "x": -1.5}, {}], "text_offset": [0, 2]}
    assert c["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                          "prompt_tokens_details": {"cached_tokens": 2}}
    ch = api.chat_response(result, "m")
    content = ch["choices"][0]["logprobs"]["content"]
    assert content[0]["bytes"] == list("Hé".encode()) and content[0]["top_logprobs"][1]["token"] == "x"
    assert ch["choices"][0]["message"]["content"] == "Hé!"
    calls = api.chat_response({**result, "logprobs": None, "tool_calls": [
        {"name": "f", "arguments": {"a": 1}}, {"function": {"name": "g", "arguments": "{}"}, "id": "call_x"}]}, "m")
    msg = calls["choices"][0]["message"]
    assert calls["choices"][0]["finish_reason"] == "tool_calls"
    assert [(t["function"]["name"], json.loads(t["function"]["arguments"])) for t in msg["tool_calls"]] == \
        [("f", {"a": 1}), ("g", {})]
    assert msg["tool_calls"][1]["id"] == "call_x" and msg["tool_calls"][0]["id"].startswith("call_")
    inf = api.infill_response({"text": "x", "finish_reason": "length", "completion_tokens": 1, "prompt_tokens": 4}, "m")
    assert (inf["content"], inf["stop_type"], inf["tokens_predicted"]) == ("x", "limit", 1)
    emb = api.embedding_response({"embeddings": [[0.5, -1.0]], "dim": 2, "n_tokens": [3]}, "m", "base64")
    assert struct.unpack("<2f", base64.b64decode(emb["data"][0]["embedding"])) == (0.5, -1.0)
    assert emb["usage"] == {"prompt_tokens": 3, "total_tokens": 3}


def test_mapping_of_requests():
    from reflex_ipc.front import api

    req = api.decode(json.dumps({
        "model": "x", "messages": [{"role": "system", "content": [{"type": "text", "text": "be "},
                                                                   {"type": "text", "text": "brief"}]},
                                   {"role": "user", "content": "hi"}],
        "max_completion_tokens": 7, "logprobs": True, "top_logprobs": 3, "seed": 9, "stop": "\n",
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "array"}}},
        "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto",
        "unknown_field_from_a_newer_client": 1}).encode(), api.ChatRequest)
    op, p = api.chat_params(req)
    assert op == "generate"
    assert p == {"max_tokens": 7, "seed": 9, "stop": "\n",
                 "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
                 "logprobs": 3, "json_schema": {"type": "array"},
                 "tools": [{"type": "function", "function": {"name": "f"}}]}
    op, p = api.completion_params(api.decode(b'{"prompt": ["a"], "suffix": "b", "temperature": 0}',
                                             api.CompletionRequest))
    assert (op, p) == ("infill", {"max_tokens": 16, "temperature": 0.0, "prefix": "a", "suffix": "b"})
    op, p = api.infill_params(api.decode(b'{"input_prefix": "a", "input_suffix": "b", "n_predict": -1, '
                                         b'"input_extra": [{"filename": "f.py", "text": "x"}], "seed": -1}',
                                         api.InfillRequest))
    assert (op, p) == ("infill", {"prefix": "a", "suffix": "b", "input_extra": [{"filename": "f.py", "text": "x"}]})
    # llama.cpp's sampling fields pass on /infill under their names
    sampled = {"typical_p": 0.9, "repeat_last_n": 32, "frequency_penalty": 0.5, "presence_penalty": 0.25,
               "dry_multiplier": 0.8, "dry_base": 1.5, "dry_allowed_length": 3, "dry_penalty_last_n": 16,
               "dry_sequence_breakers": ["\n"]}
    op, p = api.infill_params(api.decode(json.dumps({"input_prefix": "a", **sampled}).encode(), api.InfillRequest))
    assert p == {"prefix": "a", "suffix": "", **sampled}
    # chat's reasoning switches: reasoning_effort "none"/"minimal" is enable_thinking false, an explicit one wins
    for body, want in (({"reasoning_effort": "none"}, {"enable_thinking": False}),
                       ({"reasoning_effort": "high"}, {"enable_thinking": True}),
                       ({"reasoning_effort": "none", "enable_thinking": True, "thinking_budget": 8},
                        {"enable_thinking": True, "thinking_budget": 8}),
                       ({"chat_template_kwargs": {"x": 1}}, {"chat_template_kwargs": {"x": 1}})):
        _, p = api.chat_params(api.decode(json.dumps({"messages": [{"role": "user", "content": "hi"}], **body}).encode(),
                                          api.ChatRequest))
        assert {k: p[k] for k in want} == want and ("enable_thinking" in p) == ("enable_thinking" in want)
    e = api.engine_error("invalid_request", "Object contains unknown field `json_schema`", "generate")
    assert (e.status, e.param, e.code) == (400, "response_format", "unsupported_parameter")
    for kind, status in (("context_overflow", 400), ("model_not_found", 404), ("internal", 500),
                         ("out_of_memory", 503), ("line_too_long", 413)):
        assert api.engine_error(kind, "m", "generate").status == status


def test_connect_mode_reports_a_dead_engine_and_reconnects(secured):
    ok = openai.OpenAI(base_url=secured.url + "/v1", api_key="s3cret", max_retries=0, timeout=300)
    assert ok.completions.create(model="any", prompt=PROMPT, max_tokens=1).usage.completion_tokens == 1
    secured.engines[-1].kill()
    secured.engines[-1].wait()
    with pytest.raises(openai.APIStatusError) as e:  # nobody there: 503, the front stays up
        ok.completions.create(model="any", prompt=PROMPT, max_tokens=1)
    assert e.value.status_code == 503 and e.value.code == "engine_died"
    assert secured.health()["status"] == "error"
    secured.engines.append(_uds_engine(secured.sock))  # (its supervisor restarts it)
    assert ok.completions.create(model="any", prompt=PROMPT, max_tokens=1).usage.completion_tokens == 1
    assert secured.health()["status"] == "ok"


# -- the sampling a request leaves out (issue 33) ---------------------------------------------
def test_omitted_temperature_is_greedy_on_a_model_without_defaults(oai, engine, front):
    """SmolLM2's GGUF has no general.sampling.* keys: a request without `temperature` is
    decoded greedily (the engine's default), not at OpenAI's temperature 1, so the answer a
    newcomer copies is the same each time and the same as the CLI's."""
    ref = engine.generate(PROMPT, max_tokens=8)["text"]
    for _ in range(2):
        assert oai.completions.create(model="any", prompt=PROMPT, max_tokens=8).choices[0].text == ref
    chat = engine.chat([{"role": "user", "content": "Name the three primary colors."}], max_tokens=12)["text"]
    r = oai.chat.completions.create(model="any", max_tokens=12,
                                    messages=[{"role": "user", "content": "Name the three primary colors."}])
    assert r.choices[0].message.content == chat
    assert httpx.get(front.url + "/v1/models", timeout=10).json()["data"][0]["sampling_defaults"] == {}


def test_a_models_own_sampling_defaults_apply(tmp_path, engine):
    """A GGUF with general.sampling.* keys (llama.cpp's converter writes them from the
    model's generation_config.json): the front uses them for what a request leaves out, as
    llama.cpp's server does; what the request gives wins."""
    import gguf

    from reflex_ipc.testing.synthetic import _copy_metadata, finish

    src = os.path.join(REPO, "tests", "data", "synthetic-llama.gguf")
    path = str(tmp_path / "with-defaults.gguf")
    r = gguf.GGUFReader(src)
    w = _copy_metadata(r, path)
    w.add_float32("general.sampling.temp", 0.7)
    w.add_int32("general.sampling.top_k", 5)
    w.add_float32("general.sampling.top_p", 0.9)
    w.add_float32("general.sampling.min_p", 7.0)  # out of range: ignored
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    finish(w)
    f = Front(["--model", path, "--device", "cpu"])
    try:
        want = {"temperature": 0.7, "top_k": 5, "top_p": 0.9}
        model = httpx.get(f.url + "/v1/models", timeout=10).json()["data"][0]
        assert model["sampling_defaults"] == want
        oai_ = openai.OpenAI(base_url=f.url + "/v1", api_key="unused", max_retries=0, timeout=300)
        got = oai_.completions.create(model="any", prompt="Hello", max_tokens=12, seed=3).choices[0].text
        ref = engine.generate("Hello", model=path, max_tokens=12, seed=3, **want)["text"]
        assert got == ref
        greedy = engine.generate("Hello", model=path, max_tokens=12)["text"]
        assert oai_.completions.create(model="any", prompt="Hello", max_tokens=12,
                                       temperature=0).choices[0].text == greedy
    finally:
        f.close()
