"""The real `reflex stdio` / `reflex uds` subprocess, CPU engine, SmolLM2.

Every protocol vector; hypothesis-generated request lines (each gets exactly
one result, the process stays up); half-written lines, a 100 MB line, binary
garbage, valid requests between bad ones, a client that vanishes mid-stream,
signals, uds.
"""

import base64
import json
import os
import pathlib
import random
import signal
import stat
import subprocess
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reflex_ipc.testing.fake_server import Proc, UdsClient, check_schema, lines_of, stop

pytestmark = pytest.mark.usefixtures("smollm2")  # the model every test here serves

ROOT = pathlib.Path(__file__).resolve().parent.parent
VECTOR_FILES = sorted((ROOT / "protocol" / "vectors").glob("*.jsonl"))
COUNTING = "1, 2, 3, 4, 5,"  # SmolLM2 greedily counts on for 1000+ tokens (no EOS)


def env():
    e = dict(os.environ)
    e.pop("REFLEX_MODEL", None)
    return e


def stdio(*args, **kw):
    return Proc(["reflex", "stdio", "--device", "cpu", *args], env=env(), **kw)


@pytest.fixture(scope="module")
def srv():
    p = stdio("--model", "smollm2")
    yield p
    p.close()


# ---------------------------------------------------------------- vectors


def dotted(obj, key):
    for part in key.split("."):
        if not isinstance(obj, dict) or part not in obj:
            raise KeyError(key)
        obj = obj[part]
    return obj


def case_line(case, model) -> bytes:
    """The case's line, "$MODEL" replaced with `model` (protocol/vectors/README.md)."""
    if "request_base64" in case:
        raw = base64.b64decode(case["request_base64"])
    elif isinstance(case["request"], str):
        raw = case["request"].encode("utf-8")
    else:
        req = dict(case["request"])
        if req.get("model") == "$MODEL":
            req["model"] = model
        raw = json.dumps(req, ensure_ascii=False).encode("utf-8")
    return raw + b"\n"


def send_case(p, case, model):
    p.p.stdin.write(case_line(case, model))
    p.p.stdin.flush()


def model_under_test(p) -> str:
    """The server's default model, as the vectors' "$MODEL" stands for it."""
    _, res = p.request({"op": "load"})
    assert res["ok"], res
    return res["path"]


def check_case(case, tokens, res):
    """protocol/vectors/README.md, as a function."""
    exp = case["expect"]
    req = case.get("request")
    rid = req.get("id") if isinstance(req, dict) else None
    if not (isinstance(rid, str) or (type(rid) is int and -2**63 <= rid < 2**63)):
        rid = None
    want_id = exp.get("id", rid)
    for t in tokens:
        assert t["event"] == "token" and t["id"] == want_id
        assert isinstance(t["token_id"], int) and isinstance(t["text"], str)
    assert res["event"] == "result" and res["id"] == want_id
    assert isinstance(res["timings"]["total"], (int, float))
    assert isinstance(res["timings"]["parse"], (int, float))
    assert res["op"] is None or isinstance(res["op"], str)
    assert res["ok"] is exp["ok"], res
    if not exp["ok"]:
        assert res["error"]["kind"] == exp["error_kind"], res
        if "message_contains" in exp:
            assert exp["message_contains"] in res["error"]["message"], res
    for key in exp.get("fields", []):
        dotted(res, key)
    for key, value in exp.get("values", {}).items():
        assert dotted(res, key) == value, (key, res)
    if exp.get("tokens") is True:
        assert tokens and "".join(t["text"] for t in tokens) == res["text"]
    elif exp.get("tokens") is False:
        assert not tokens
    check_schema(res)
    for t in tokens:
        check_schema(t)


@pytest.mark.parametrize("path", VECTOR_FILES, ids=lambda p: p.stem)
def test_vectors(srv, path):
    model = model_under_test(srv)
    for line in path.read_text(encoding="utf-8").splitlines():
        case = json.loads(line)
        send_case(srv, case, model)
        tokens, res = srv.response(timeout=300)
        try:
            check_case(case, tokens, res)
        except AssertionError as e:
            raise AssertionError(f"vector {case['name']!r}: {e}") from None
    assert srv.p.poll() is None


# ---------------------------------------------------------------- start-up


def test_ready_line_and_first_result_timings():
    p = stdio()
    try:
        r = p.ready
        assert (r["event"], r["id"], r["protocol"], r["model"], r["backend"]) == (
            "ready", None, 1, None, None)
        assert r["pid"] == p.p.pid and "load" not in r["timings"]
        check_schema(r)
        tokens, res = p.request({"id": 1, "op": "generate", "prompt": "Hi", "max_tokens": 2,
                                 "stream": True})
        t = res["timings"]
        assert res["ok"] and t["load"] > 0 and t["process_start_to_first_token"] > t["load"]
        assert t["process_start_to_first_token"] < t["total"] + t["process_start_to_first_token"]
        # the same request again: a replay of the first pass (graphs.ForwardGraphs), which on
        # the CPU must be that pass's very calls ("Hi" gave "-and", then "-squared" from a
        # graph padded to 8 rows, which x86 runs in tiles that sum in another order)
        _, res2 = p.request({"id": 2, "op": "generate", "prompt": "Hi", "max_tokens": 2})
        assert "process_start_to_first_token" not in res2["timings"]
        assert "load" not in res2["timings"] and res2["text"] == res["text"]
    finally:
        p.close()


def test_model_loaded_before_ready(srv):
    r = srv.ready
    assert r["model"] and r["backend"] and r["timings"]["load"] > 0
    assert r["timings"]["process_start_to_ready"] >= r["timings"]["load"]


def test_bad_model_at_startup_exits_2_without_ready():
    p = stdio("--model", "/nonexistent/m.gguf", ready=False)
    try:
        assert p.wait(60) == 2  # model_not_found: an input error (README, exit codes)
        assert p.p.stdout.read() == b""
        assert "model_not_found" in p.err()
    finally:
        p.close()


def test_not_a_gguf_is_gguf_error(srv, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(100))
    _, res = srv.request({"id": 1, "op": "load", "model": str(bad)})
    assert res["error"]["kind"] == "gguf_error"
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    _, res = srv.request({"id": 2, "op": "tokenize", "text": "x", "model": str(empty)})
    assert res["error"]["kind"] == "gguf_error"
    assert srv.request({"id": 3, "op": "ping"})[1]["ok"]


# ---------------------------------------------------------------- hostile input


def send_in_thread(p, data: bytes) -> threading.Thread:
    """Write while the caller reads: big inputs with many results would
    otherwise fill both pipes."""
    def feed():
        p.p.stdin.write(data)
        p.p.stdin.flush()
    t = threading.Thread(target=feed, daemon=True)
    t.start()
    return t


def exactly_one_result(p, raw: bytes, tag):
    """Send `raw` + newline, then a ping; the results before the ping's."""
    send_in_thread(p, raw + b"\n" + json.dumps({"id": tag, "op": "ping"}).encode() + b"\n")
    results = []
    while True:
        tokens, res = p.response(timeout=120)
        if res["id"] == tag and res["op"] == "ping":
            return results
        results.append(res)


small_values = st.sampled_from(
    [None, True, False, 0, 1, 2, -1, 1.5, 0.5, 131073, 2**63, "", "x", "Hello", "smollm2",
     "cpu", "mean", "tpu", [], ["a"], ["a", ""], [1, 2], [-1], {"a": 1}, "\u0000", "é😀"])
keys = st.sampled_from(
    ["id", "op", "prompt", "max_tokens", "temperature", "top_k", "top_p", "min_p", "seed",
     "repeat_penalty", "repeat_last_n", "stop", "stream", "candidates", "input", "pooling",
     "normalize", "text", "add_bos", "parse_special", "token_ids", "special", "model", "device", "protocol", "x"])
ops = st.sampled_from(["hello", "load", "generate", "system1", "embed", "tokenize",
                       "detokenize", "ping", "nope", 5, None])
# generate always gets a max_tokens from the pool (valid ones are 1 and 2), so
# no generated request runs long.
json_lines = st.builds(
    lambda op, d, n: json.dumps({"op": op, **d, **({"max_tokens": n} if op == "generate" else {})}
                                ).encode(),
    ops, st.dictionaries(keys, small_values, max_size=5), small_values)


def is_blank(raw):
    return not raw.strip(b" \t\r")


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(json_lines, st.binary(max_size=200), st.text(max_size=100).map(str.encode)))
def test_generated_lines_get_exactly_one_result(srv, raw):
    raw = raw.replace(b"\n", b" ")
    results = exactly_one_result(srv, raw, "probe")
    assert len(results) == (0 if is_blank(raw) else 1), results
    for r in results:
        check_schema(r)
        assert r["ok"] or r["error"]["kind"] != "internal", r
    assert srv.p.poll() is None


def test_half_written_lines(srv):
    line = json.dumps({"id": "half", "op": "tokenize", "text": "Hello world"}).encode()
    for cut in (1, len(line) // 2, len(line) - 1):
        srv.p.stdin.write(line[:cut])
        srv.p.stdin.flush()
        time.sleep(0.2)
        srv.p.stdin.write(line[cut:] + b"\n")
        srv.p.stdin.flush()
        _, res = srv.response()
        assert res["id"] == "half" and res["token_ids"] == [19556, 905]


def vm_hwm_kib(pid):
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_100mb_line_skipped_in_bounded_memory(srv):
    assert srv.request({"id": 0, "op": "tokenize", "text": "warm"})[1]["ok"]
    before = vm_hwm_kib(srv.p.pid)
    chunk = b"x" * (1 << 20)

    def feed():
        srv.p.stdin.write(b'{"id": 1, "op": "tokenize", "text": "')
        for _ in range(100):
            srv.p.stdin.write(chunk)
        srv.p.stdin.write(b'"}\n' + lines_of({"id": 2, "op": "ping"}))
        srv.p.stdin.flush()

    t = threading.Thread(target=feed)
    t.start()
    _, res = srv.response(timeout=120)
    t.join()
    assert res["id"] is None and res["error"]["kind"] == "line_too_long"
    _, res = srv.response()
    assert res["id"] == 2 and res["ok"]
    grown_mib = (vm_hwm_kib(srv.p.pid) - before) / 1024
    assert grown_mib < 48, grown_mib  # 16 MiB limit + a chunk, never 100 MB


def test_binary_garbage_then_valid_requests(srv):
    rng = random.Random(1234)
    blob = bytes(rng.getrandbits(8) for _ in range(1 << 20))
    lines = blob.split(b"\n")
    expected = sum(1 for x in lines if not is_blank(x.rstrip(b"\r")))
    results = exactly_one_result(srv, blob, "after-garbage")
    assert len(results) == expected
    assert all(r["error"]["kind"] in ("parse_error", "invalid_request") for r in results)


def test_valid_requests_between_bad_ones(srv):
    reqs = []
    for i in range(20):
        reqs += [b"{bad", {"id": i, "op": "tokenize", "text": "Hello world"}, b"\xff",
                 {"id": f"u{i}", "op": "nope"}]
    send_in_thread(srv, lines_of(*reqs))
    got = [srv.response()[1] for _ in reqs]
    assert [r["ok"] for r in got] == [False, True, False, False] * 20
    assert [r["id"] for r in got[1::4]] == list(range(20))
    assert all(r["token_ids"] == [19556, 905] for r in got[1::4])


# ---------------------------------------------------------------- signals and vanishing clients


@pytest.fixture
def fresh():
    procs = []

    def start(*args):
        p = stdio("--model", "smollm2", *args)
        procs.append(p)
        return p
    yield start
    for p in procs:
        p.close()


def counting(rid, n=1000, stream=True):
    return {"id": rid, "op": "generate", "prompt": COUNTING, "max_tokens": n, "stream": stream}


def test_sigint_cancels_and_serving_goes_on(fresh):
    p = fresh()
    p.send(counting(1))
    assert p.read()["event"] == "token"
    p.p.send_signal(signal.SIGINT)
    tokens, res = p.response()
    assert res["id"] == 1 and res["error"]["kind"] == "cancelled"
    assert len(tokens) < 999
    _, res = p.request({"id": 2, "op": "generate", "prompt": "Hi", "max_tokens": 2})
    assert res["ok"] and res["completion_tokens"] == 2


def test_sigterm_finishes_current_then_exits_0(fresh):
    p = fresh()
    p.send(counting(1, n=12), {"id": 2, "op": "ping"})
    assert p.read()["event"] == "token"
    p.p.send_signal(signal.SIGTERM)
    _, res = p.response()
    assert res["ok"] and res["completion_tokens"] == 12
    assert p.read() is None and p.wait() == 0


def test_eof_finishes_current_then_exits_0(fresh):
    p = fresh()
    p.send(counting(1, n=8, stream=False))
    p.p.stdin.close()
    _, res = p.response()
    assert res["ok"] and res["completion_tokens"] == 8
    assert p.wait() == 0


def test_client_vanishes_mid_stream(fresh):
    p = fresh()
    p.send(counting(1, n=100000 // 100))
    assert p.read()["event"] == "token"
    t = time.monotonic()
    p.p.stdout.close()
    p.p.stdin.close()
    assert p.wait(60) == 0
    assert time.monotonic() - t < 30
    assert "Traceback" not in p.err()


def test_uds_real_engine(tmp_path):
    path = tmp_path / "r.sock"
    proc = subprocess.Popen(["reflex", "uds", str(path), "--model", "smollm2", "--device", "cpu"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env())
    try:
        a = UdsClient(path)
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
        assert a.ready["model"] and a.ready["backend"]
        tokens, res = a.request({"id": 1, "op": "generate", "prompt": "The capital of France is",
                                 "max_tokens": 8, "stop": ["."], "stream": True})
        assert res["text"] == " Paris" and "".join(t["text"] for t in tokens) == " Paris"
        a.send(counting(2))
        assert a.read()["event"] == "token"
        a.close()  # vanishes mid-generation: cancelled, next connection served
        t = time.monotonic()
        b = UdsClient(path, timeout=60)
        assert time.monotonic() - t < 30
        assert b.request({"id": 3, "op": "tokenize", "text": "Hello world"})[1]["token_ids"] == [
            19556, 905]
        model = b.request({"op": "load"})[1]["path"]
        for vf in VECTOR_FILES:  # every vector over the socket too
            for line in vf.read_text(encoding="utf-8").splitlines():
                case = json.loads(line)
                b.s.sendall(case_line(case, model))
                tokens, res = b.response(timeout=300)
                check_case(case, tokens, res)
        b.close()
    finally:
        rc, out = stop(proc)
    assert rc == 0 and out == b"" and not path.exists()


def test_max_line_bytes_option():
    p = stdio("--max-line-bytes", "100")
    try:
        ok = {"id": 1, "op": "tokenize", "text": "x" * 40}
        long = {"id": 2, "op": "tokenize", "text": "x" * 100}
        p.send(ok, long, ok)
        got = [p.response()[1] for _ in range(3)]
        assert [r.get("error", {}).get("kind") for r in got] == [None, "line_too_long", None]
        assert got[1]["id"] is None
    finally:
        p.close()
