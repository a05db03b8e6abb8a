"""The client against the real server (`reflex stdio`, or $REFLEX_CMD)."""
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time

import pytest
from conftest import reflex_argv, uds_argv
from vectors import load_cases, model_under_test, run_case, vector_files

from reflex_client import AsyncClient, Client, ReflexConnectionError, ReflexError, ReflexTimeout

LONG = dict(prompt="Once upon a time, in a land far away,", max_tokens=256, temperature=0.0)


@pytest.fixture(scope="module")
def client():
    argv = reflex_argv()
    with Client.spawn(argv[0], argv[1:]) as c:
        yield c


def test_vector_files_exist():
    assert vector_files(), "protocol/vectors/*.jsonl: no conformance cases found"


@pytest.mark.parametrize("path", vector_files(), ids=os.path.basename)
def test_vectors(client, path):
    failures = {}
    for case in load_cases(path, model_under_test(client)):
        bad = run_case(client, case)
        if bad:
            failures[case["name"]] = bad
    assert not failures


def test_generate_matches_stream(client):
    r = client.generate("The capital of France is", max_tokens=6)
    assert r["ok"] and r["completion_tokens"] == len(r["token_ids"]) <= 6
    events = list(client.stream("The capital of France is", max_tokens=6))
    tokens, result = events[:-1], events[-1]
    assert all(e["event"] == "token" for e in tokens) and result["event"] == "result"
    assert "".join(e["text"] for e in tokens) == result["text"] == r["text"]
    assert [e["token_id"] for e in tokens] == result["token_ids"] == r["token_ids"]


def test_other_ops(client):
    ids = client.tokenize("Hello world")["token_ids"]
    assert client.detokenize(ids)["text"] == "Hello world"
    special = client.tokenize("Hello <|im_end|>")["token_ids"]
    assert client.detokenize(special, special=True)["text"] == "Hello <|im_end|>"
    assert client.detokenize(token_ids=special)["text"] == "Hello "
    s = client.system1("Is the sky blue? Answer:", [" yes", " no"])
    assert len(s["candidates"]) == 2 and s["best_idx"] in (0, 1)
    e = client.embed(["a", "b"], normalize=True)
    assert len(e["embeddings"]) == 2 and len(e["embeddings"][0]) == e["dim"]
    assert client.hello()["protocol"] == 1


def test_saved_state(client, tmp_path):
    path = str(tmp_path / "p.state")
    full = client.generate("The capital of France is Paris. The capital of Italy is", max_tokens=4)
    a = client.generate("The capital of France is Paris.", max_tokens=1, kv_export=path)
    assert a["kv_export"]["path"] == path and a["kv_export"]["n_tokens"] == a["prompt_tokens"]
    b = client.generate(" The capital of Italy is", max_tokens=4, kv_import=path)
    assert b["cached_tokens"] == a["prompt_tokens"] and b["token_ids"] == full["token_ids"]
    saved = client.state_save(str(tmp_path / "q.state"))
    assert saved["n_tokens"] > 0 and saved["bytes"] > 0
    assert client.state_load(path)["n_tokens"] == a["prompt_tokens"]
    with pytest.raises(ReflexError) as e:
        client.state_load(str(tmp_path / "missing.state"))
    assert e.value.kind == "state_error"


def test_errors_carry_the_protocol_kind(client):
    with pytest.raises(ReflexError) as ei:
        client.request("frobnicate")
    assert ei.value.kind == "unknown_op" and ei.value.response["ok"] is False
    with pytest.raises(ReflexError) as ei:
        client.generate("x", max_tokens=0)
    assert ei.value.kind == "invalid_request" and "max_tokens" in ei.value.message
    with pytest.raises(ReflexError) as ei:
        client.generate("x", model="/nonexistent/model.gguf")
    assert ei.value.kind == "model_not_found"
    assert client.ping()["ok"] is True


def test_cancel_mid_stream_keeps_the_server(client):
    pid = client.ready["pid"]
    stream = client.stream(**LONG)
    got = [next(stream) for _ in range(2)]
    assert [e["event"] for e in got] == ["token", "token"]
    t0 = time.monotonic()
    stream.close()  # SIGINT, drained to the cancelled result
    assert time.monotonic() - t0 < 5
    with pytest.raises(ReflexTimeout):
        client.generate(**LONG, timeout=0.5)
    assert client.generate("Hi", max_tokens=2)["ok"] and client.ready["pid"] == pid


def test_child_killed_from_outside(client):
    stream = client.stream(**LONG)
    assert next(stream)["event"] == "token"
    pid = client.ready["pid"]
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(ReflexConnectionError, match="signal 9"):
        list(stream)
    assert client.ping()["ok"] and client.ready["pid"] != pid  # restarted
    pid = client.ready["pid"]
    os.kill(pid, signal.SIGKILL)  # while idle: replaced on the next call
    time.sleep(0.2)
    assert client.ping()["ok"] and client.ready["pid"] != pid


def _uds_server(path):
    proc = subprocess.Popen(uds_argv(path))
    deadline = time.monotonic() + 30
    while not os.path.exists(path):
        assert proc.poll() is None and time.monotonic() < deadline, "reflex uds did not start"
        time.sleep(0.02)
    return proc


def test_uds():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "reflex.sock")
        proc = _uds_server(path)
        try:
            with Client.connect(path) as c:
                assert c.ready["pid"] == proc.pid
                events = list(c.stream("Hello", max_tokens=3))
                assert events[-1]["ok"] and len(events) >= 2
                stream = c.stream(**LONG)
                next(stream)
                stream.close()  # closes the connection: the server cancels, the next call reconnects
                assert c.generate("Hi", max_tokens=2)["ok"]
                with pytest.raises(ReflexTimeout):
                    c.generate(**LONG, timeout=0.5)
                assert c.tokenize("Hi")["token_ids"]
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0


def test_async_client():
    async def main():
        argv = reflex_argv()
        async with await AsyncClient.spawn(argv[0], argv[1:]) as c:
            pid = c.ready["pid"]
            r1, r2 = await asyncio.gather(c.generate("Hi", max_tokens=3), c.tokenize("Hi"))
            assert r1["ok"] and r2["token_ids"]
            async with contextlib.aclosing(c.stream(**LONG)) as s:
                async for ev in s:
                    assert ev["event"] == "token"
                    break
            task = asyncio.ensure_future(c.generate(**LONG))
            await asyncio.sleep(0.5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            with pytest.raises(ReflexError) as ei:
                await c.request("frobnicate")
            assert ei.value.kind == "unknown_op"
            assert (await c.generate("Hi", max_tokens=2))["ok"] and c.ready["pid"] == pid
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "reflex.sock")
            proc = _uds_server(path)
            try:
                async with await AsyncClient.connect(path) as c:
                    events = [ev async for ev in c.stream("Hello", max_tokens=3)]
                    assert events[-1]["ok"]
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=30)

    asyncio.run(main())


CAPITAL = [{"role": "user", "content": "What is the capital of France?"}]
WEEK = [{"role": "user", "content": "How many days are in a week?"}]


def test_chat_infill_logprobs_schema(client):
    r = client.chat(WEEK, max_tokens=24)
    assert "7" in r["text"] and r["finish_reason"] == "stop"
    streamed = "".join(ev["text"] for ev in client.stream_chat(WEEK, max_tokens=24)
                       if ev["event"] == "token")
    assert streamed == r["text"]
    t = client.tokenize(messages=WEEK)
    assert t["prompt"].endswith("<|im_start|>assistant\n") and len(t["token_ids"]) == r["prompt_tokens"]
    with pytest.raises(ReflexError) as ei:
        client.infill("def f(", ")")
    assert ei.value.kind == "invalid_request" and "fill-in-the-middle" in ei.value.message
    lp = client.chat(CAPITAL, max_tokens=3, logprobs=2)
    assert len(lp["logprobs"]) == 3 and len(lp["logprobs"][0]["top"]) == 2
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
              "required": ["city"], "additionalProperties": False}
    js = client.chat(CAPITAL, json_schema=schema, max_tokens=40)
    assert js["finish_reason"] == "stop" and isinstance(json.loads(js["text"])["city"], str)
    with pytest.raises(ReflexError) as ei:
        client.chat(CAPITAL, json_schema={"type": "nope"})
    assert ei.value.kind == "invalid_request" and "json_schema" in ei.value.message


def test_classify(client):
    """The decision op: labels with probabilities (equal to system1's), best, entropy, a warning
    when the labels' token counts differ, and a batch of questions over one shared prefix."""
    # cache_prompt off: both evaluate the whole prompt in one pass, so the two agree exactly
    # whatever batch shapes the backend's kernels are sensitive to (ARCHITECTURE.md, "Batch-invariant")
    r = client.classify([" yes", " no"], "Is the sky blue? Answer:", cache_prompt=False)
    s = client.system1("Is the sky blue? Answer:", [" yes", " no"], cache_prompt=False)
    assert [x["label"] for x in r["labels"]] == [" yes", " no"] and r["best"] == [" yes", " no"][s["best_idx"]]
    assert [x["probability"] for x in r["labels"]] == pytest.approx([c["probability"] for c in s["candidates"]])
    assert r["entropy"] == pytest.approx(s["entropy"]) and "warning" not in r
    chat = client.classify(["Paris", "London", "Berlin"], messages=CAPITAL)
    assert chat["best"] == "Paris"
    batch = client.classify(["yes", "no", "not sure"], messages=[{"role": "user", "content": "Water is wet. " * 8}],
                            questions=["Is water wet?", "Is water dry?"])
    assert [x["question"] for x in batch["results"]] == ["Is water wet?", "Is water dry?"]
    assert "different lengths" in batch["warning"] and batch["results"][1]["cached_tokens"] > 0
    with pytest.raises(ReflexError) as ei:
        client.classify([" a", " a"], "x")
    assert ei.value.kind == "invalid_request"

    async def main():
        argv = reflex_argv()
        async with await AsyncClient.spawn(argv[0], argv[1:]) as c:
            return await c.classify([" yes", " no"], "Is the sky blue? Answer:")

    assert asyncio.run(main())["best"] == r["best"]


def test_prefix_cache_switch(client):
    """prefix_cache=False passes through: the machine's prefix cache is neither read nor
    written (the result's timings then have no prefix_cache_tokens)."""
    long = "word " * 200
    r = client.generate(long, max_tokens=1, prefix_cache=False)
    assert "prefix_cache_tokens" not in r["timings"]
    s = client.system1(long, [" a", " b"], prefix_cache=False)
    assert "prefix_cache_tokens" not in s["timings"]


def test_sampling_fields_n_and_thinking(client):
    """The sampling parameters of issue 30 reach the server: penalties and logit_bias change
    greedy output, n gives choices (streamed with their index), a thinking budget needs a
    model with <think> tokens (SmolLM2 has none)."""
    plain = client.generate("The capital of France is", max_tokens=6)
    r = client.generate("The capital of France is", max_tokens=6, frequency_penalty=1.0,
                        presence_penalty=0.5, logit_bias={str(plain["token_ids"][0]): -100},
                        dry_multiplier=0.8, typical_p=0.95)
    assert r["token_ids"][0] != plain["token_ids"][0]
    n = client.generate("The capital of France is", max_tokens=3, n=2, temperature=0.8, seed=1)
    assert [c["index"] for c in n["choices"]] == [0, 1] and n["text"] == n["choices"][0]["text"]
    events = [ev for ev in client.stream("The capital of France is", max_tokens=2, n=2) if ev["event"] == "token"]
    assert sorted({ev.get("index", 0) for ev in events}) == [0, 1]
    with pytest.raises(ReflexError) as ei:
        client.chat(CAPITAL, thinking_budget=4, enable_thinking=True, max_tokens=2)
    assert ei.value.kind == "invalid_request" and "<think>" in ei.value.message
