"""Runs protocol/vectors/*.jsonl cases through the client (see vectors/README.md).

A case whose request is an object with a string op and a valid id goes
through the public API (`request`, or `stream` for a streamed generate): the
client replaces the id with its own, and every line must carry that one.
Every other case (no id or a null one, whose lines must carry null; lines a
well-behaved client never writes: not JSON, not an object, no op, an id of
another type, invalid UTF-8) goes through the client's private exchange,
verbatim."""
import base64
import glob
import json
import os

from conftest import VECTORS

from reflex_client import ReflexError


def vector_files():
    return sorted(glob.glob(os.path.join(VECTORS, "*.jsonl")))


def load_cases(path, model):
    """The cases of a file, a request's "model": "$MODEL" replaced with `model`: the model
    under test (model_under_test)."""
    with open(path, encoding="utf-8") as f:
        cases = [json.loads(line) for line in f if line.strip()]
    for case in cases:
        req = case.get("request")
        if isinstance(req, dict) and req.get("model") == "$MODEL":
            req["model"] = model
    return cases


def model_under_test(client):
    """The path of the server's default model: what "$MODEL" stands for in a case."""
    return client.load()["path"]


def _valid_id(v):
    """An id the server echoes: a string or an integer in [-2^63, 2^63)."""
    return isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool) and -2**63 <= v < 2**63)


def json_equal(a, b):
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


_MISSING = object()


def dotted(obj, key):
    for part in key.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return _MISSING
        obj = obj[part]
    return obj


def run_case(client, case):
    """Send the case, check the response; returns a list of problems (empty: pass)."""
    req, exp = case.get("request"), case["expect"]
    events = []
    if isinstance(req, dict) and isinstance(req.get("op"), str) and _valid_id(req.get("id")):
        params = {k: v for k, v in req.items() if k not in ("id", "op")}
        if req["op"] == "generate" and params.get("stream") is True:
            it = client.stream(**params)
        else:
            it = client._events(req["op"], params, None)
        try:
            events.extend(it)
        except ReflexError as e:
            if e.response is None:
                raise
            events.append(e.response)
        want_id = client._ids.n if json_equal(exp.get("id", req["id"]), req["id"]) else exp["id"]
    else:
        if "request_base64" in case:
            line = base64.b64decode(case["request_base64"])
        elif isinstance(req, str):
            line = req.encode("utf-8")
        else:
            line = json.dumps(req, ensure_ascii=False).encode("utf-8")
        own = req.get("id") if isinstance(req, dict) and _valid_id(req.get("id")) else None
        want_id = exp["id"] if "id" in exp else own
        try:
            events.extend(client._exchange(lambda rid: (line + b"\n", want_id), "raw", None))
        except ReflexError as e:
            if e.response is None:
                raise
            events.append(e.response)
    return check(events, exp, want_id)


def check(events, exp, want_id):
    bad = []
    result, tokens = events[-1], events[:-1]
    for ev in events:
        if not json_equal(ev.get("id"), want_id):
            bad.append(f"line with id {ev.get('id')!r}, want {want_id!r}: {ev}")
    for ev in tokens:
        if ev.get("event") != "token" or type(ev.get("token_id")) is not int or not isinstance(ev.get("text"), str):
            bad.append(f"not a token line before the result: {ev}")
    if result.get("event") != "result":
        bad.append(f"last line is not a result: {result}")
    if result.get("ok") is not exp["ok"]:
        bad.append(f"ok is {result.get('ok')!r}, want {exp['ok']!r}: {result}")
    if "error_kind" in exp and (result.get("error") or {}).get("kind") != exp["error_kind"]:
        bad.append(f"error kind {(result.get('error') or {}).get('kind')!r}, want {exp['error_kind']!r}")
    if "message_contains" in exp and exp["message_contains"] not in (result.get("error") or {}).get("message", ""):
        bad.append(f"error message {(result.get('error') or {}).get('message')!r} lacks {exp['message_contains']!r}")
    for key in exp.get("fields", []):
        if dotted(result, key) is _MISSING:
            bad.append(f"result lacks {key!r}")
    for key, value in exp.get("values", {}).items():
        got = dotted(result, key)
        if got is _MISSING or not json_equal(got, value):
            bad.append(f"{key} is {got!r}, want {value!r}")
    if "tokens" in exp:
        if exp["tokens"] and (not tokens or "".join(t.get("text", "") for t in tokens) != result.get("text")):
            bad.append(f"token lines {[t.get('text') for t in tokens]!r} do not spell the text {result.get('text')!r}")
        if not exp["tokens"] and tokens:
            bad.append(f"{len(tokens)} token lines, want none")
    for key in ("timings.total", "timings.parse"):
        v = dotted(result, key)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            bad.append(f"{key} is not a number: {v!r}")
    if "op" not in result or not (result["op"] is None or isinstance(result["op"], str)):
        bad.append(f"op is not a string or null: {result.get('op', '<missing>')!r}")
    return bad
