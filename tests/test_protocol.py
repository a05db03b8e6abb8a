"""protocol.py (request decoding) against protocol/schema.json and the vectors.

No model, no subprocess: the server-level behaviour is in test_server*.py.
"""

import base64
import json
import pathlib

import jsonschema
import msgspec
import msgspec.structs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reflex_ipc import protocol
from reflex_ipc.errors import KINDS

ROOT = pathlib.Path(__file__).resolve().parent.parent / "protocol"
SCHEMA = json.loads((ROOT / "schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def load_vectors():
    cases = []
    for path in sorted((ROOT / "vectors").glob("*.jsonl")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            case = json.loads(line)
            cases.append(pytest.param(case, id=f"{path.stem}:{n}:{case['name']}"))
    return cases


VECTORS = load_vectors()


def line_of(case) -> bytes:
    if "request_base64" in case:
        return base64.b64decode(case["request_base64"])
    req = case["request"]
    if isinstance(req, str):
        return req.encode("utf-8")
    return json.dumps(req, ensure_ascii=False).encode("utf-8")


def schema_errors(instance, ref):
    sub = {"$ref": f"#/$defs/{ref}", "$defs": SCHEMA["$defs"]}
    return list(jsonschema.Draft202012Validator(sub).iter_errors(instance))


def test_schema_is_valid():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$defs"]["error_kind"]["enum"] == list(KINDS)


def test_vector_files_well_formed():
    names = set()
    allowed = {"ok", "error_kind", "message_contains", "fields", "values", "tokens", "id"}
    for p in VECTORS:
        case = p.values[0]
        assert set(case) <= {"name", "request", "request_base64", "expect"}
        assert ("request" in case) != ("request_base64" in case)
        assert "\n" not in line_of(case).decode("utf-8", "replace")
        assert set(case["expect"]) <= allowed, case["name"]
        assert isinstance(case["expect"]["ok"], bool)
        if not case["expect"]["ok"]:
            assert case["expect"]["error_kind"] in KINDS
        assert case["name"] not in names
        names.add(case["name"])
        if isinstance(case.get("request"), dict):
            assert case["request"].get("op") != "shutdown"  # vectors share one server


# Kinds decided from the line alone; the rest need a model (model_not_found,
# context_overflow, ids past n_vocab).
LINE_KINDS = {"parse_error", "invalid_request", "unknown_op"}
NEEDS_MODEL = {"detokenize, id past the vocabulary",
               # chat.jsonl: checked once the model's template / vocabulary is at hand
               "message without content", "template raises",
               "template does not compile", "tools with prompt", "infill without FIM tokens",
               "regex does not compile", "json_schema not a schema",
               "json_schema unsupported feature", "grammar with errors", "two constraints",
               "generate: a named tool_choice must be in tools",
               "generate: a forced call and json_schema exclude each other"}


@pytest.mark.parametrize("case", VECTORS)
def test_vector_parse(case):
    expect = case["expect"]
    line = line_of(case)
    if expect["ok"] or expect.get("error_kind") not in LINE_KINDS or case["name"] in NEEDS_MODEL:
        rid, op, params = protocol.parse_request(line)
        assert op in protocol.OPS
        assert isinstance(params, protocol.OPS[op])
        return
    with pytest.raises(protocol.RequestError) as ei:
        protocol.parse_request(line)
    e = ei.value
    assert e.kind == expect["error_kind"]
    if "message_contains" in expect:
        assert expect["message_contains"] in e.message
    req = case.get("request")
    want_id = expect.get("id", req.get("id") if isinstance(req, dict) else None)
    assert e.rid == want_id


@pytest.mark.parametrize("case", VECTORS)
def test_vector_against_schema(case):
    """A request the server accepts validates against the schema; one it
    rejects for its shape does not."""
    req = case.get("request")
    if not isinstance(req, dict):
        return
    errors = schema_errors(req, "request")
    expect = case["expect"]
    if expect["ok"] or expect.get("error_kind") not in LINE_KINDS or case["name"] in NEEDS_MODEL:
        assert not errors, [e.message for e in errors]
    else:
        assert errors


def test_schema_matches_structs():
    """Every op's request schema names exactly the struct's fields."""
    defs = SCHEMA["$defs"]
    assert [r["$ref"].removeprefix("#/$defs/request_") for r in defs["request"]["oneOf"]] == list(protocol.OPS)
    for op, cls in protocol.OPS.items():
        sch = defs[f"request_{op}"]
        assert set(sch["properties"]) - {"id", "op"} == set(cls.__struct_fields__), op
        fields = msgspec.structs.fields(cls)
        assert set(sch["required"]) - {"op"} == {f.name for f in fields if f.required}, op
        assert sch["additionalProperties"] is False
        for f in fields:
            if not f.required and "default" in sch["properties"][f.name]:
                default = f.default_factory() if f.default is msgspec.NODEFAULT else f.default
                assert sch["properties"][f.name]["default"] == default, (op, f.name)
        assert f"result_{op}" in defs


def test_schema_json_is_the_registry():
    """protocol/schema.json is what `python -m reflex_ipc.ops.schema` writes from the op
    structs: edit the structs and regenerate, never the file."""
    from reflex_ipc.ops import schema

    assert (ROOT / "schema.json").read_text(encoding="utf-8") == schema.text(), (
        "protocol/schema.json is stale: run python -m reflex_ipc.ops.schema")
    assert schema.main(["--check", "--out", str(ROOT / "schema.json")]) == 0


def test_registry_modules():
    from reflex_ipc import ops

    reg = ops.registry()
    assert tuple(reg) == ops.NAMES == tuple(protocol.OPS)
    for name, mod in reg.items():
        assert mod.__name__ == f"reflex_ipc.ops.{name}"
        assert issubclass(mod.Request, msgspec.Struct) and issubclass(mod.Result, msgspec.Struct)
        assert callable(mod.run) and mod.__doc__
        assert protocol.OPS[name] is mod.Request
    for dead in ("VERSION", "DEFAULT_MAX_LINE_BYTES", "MODEL_OPS", "MAX_TOKENS", "PROTOCOL"):
        assert not hasattr(protocol, dead), dead


def test_constants_import_nothing():
    """The ready line and argparse read reflex_ipc.ops' constants before msgspec loads."""
    import subprocess
    import sys

    code = ("import sys; from reflex_ipc.ops import PROTOCOL, MAX_LINE_BYTES, DEVICES; "
            "from reflex_ipc import server; "
            "print(int('msgspec' in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0"


def test_detokenize_names():
    _, _, d = protocol.parse_request(b'{"op": "detokenize", "token_ids": [1, 2]}')
    assert (d.token_ids, d.special) == ([1, 2], False)
    with pytest.raises(protocol.RequestError) as ei:
        protocol.parse_request(b'{"op": "detokenize", "ids": [1]}')
    assert ei.value.kind == "invalid_request" and "renamed `token_ids`" in ei.value.message


def test_id_echo_and_ranges():
    assert protocol.parse_request(b'{"id": 9223372036854775807, "op": "ping"}')[0] == 2**63 - 1
    assert protocol.parse_request(b'{"id": "", "op": "ping"}')[0] == ""
    assert protocol.parse_request(b'{"op": "ping", "id": null}')[0] is None
    with pytest.raises(protocol.RequestError) as ei:
        protocol.parse_request(b'{"id": -9223372036854775809, "op": "ping"}')
    assert ei.value.kind == "invalid_request" and ei.value.rid is None


def test_defaults_follow_runner_api():
    _, _, g = protocol.parse_request(b'{"op": "generate", "prompt": "x"}')
    assert (g.max_tokens, g.temperature, g.top_k, g.top_p, g.min_p, g.seed, g.repeat_penalty,
            g.repeat_last_n, g.stop, g.stream, g.model, g.device) == (
        64, 0.0, 0, 1.0, 0.0, None, 1.0, 64, [], False, None, None)
    _, _, s = protocol.parse_request(b'{"op": "system1", "prompt": "x", "candidates": ["a"]}')
    assert s.temperature == 1.0
    _, _, e = protocol.parse_request(b'{"op": "embed", "input": "x"}')
    assert (e.pooling, e.normalize) == ("mean", False)
    _, _, t = protocol.parse_request(b'{"op": "tokenize", "text": "x"}')
    assert (t.add_bos, t.parse_special) == (False, True)


def test_ints_accepted_for_floats():
    _, _, g = protocol.parse_request(b'{"op": "generate", "prompt": "x", "temperature": 1, "top_p": 1}')
    assert g.temperature == 1.0 and g.top_p == 1.0


def test_encode_numpy_and_unicode():
    import numpy as np
    line = protocol.encode({"event": "result", "e": np.arange(3, dtype=np.float32),
                            "f": np.float32(0.5), "s": "é\u2028😀\x00"})
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line) == {"event": "result", "e": [0.0, 1.0, 2.0], "f": 0.5, "s": "é\u2028😀\x00"}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=12)
field_names = st.sampled_from(
    ["id", "op", "prompt", "max_tokens", "temperature", "top_k", "top_p", "min_p", "seed",
     "repeat_penalty", "repeat_last_n", "stop", "stream", "candidates", "input", "pooling",
     "normalize", "text", "add_bos", "parse_special", "token_ids", "special", "ids", "model", "device",
     "protocol", "path", "kv_import", "kv_export", "lora", "zzz"])
requests = st.dictionaries(field_names, json_values, max_size=6) | st.builds(lambda op, d: {**d, "op": op}, st.sampled_from(list(protocol.OPS)),
                              st.dictionaries(field_names, json_values, max_size=5))


@settings(max_examples=400, deadline=None)
@given(requests)
def test_random_requests_agree_with_schema(req):
    """parse_request accepts exactly the requests the schema accepts (except
    stop/candidates emptiness rules both express) and fails only with
    RequestError of a line-level kind."""
    line = json.dumps(req).encode()
    try:
        rid, op, params = protocol.parse_request(line)
    except protocol.RequestError as e:
        assert e.kind in LINE_KINDS
        ok = False
    else:
        ok = True
    errors = schema_errors(req, "request")
    assert ok == (not errors), (req, [x.message for x in errors])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_never_escape(data):
    data = data.replace(b"\n", b"")
    try:
        protocol.parse_request(data)
    except protocol.RequestError as e:
        assert e.kind in LINE_KINDS


def test_struct_decoding_forbids_unknown():
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"zzz": 1}, protocol.OPS["ping"])


edge_values = st.sampled_from(
    [None, True, False, 0, 1, 2, -1, 0.0, 1e-9, 0.5, 1.0, 1.5, 100, 100.5, 1048576, 1048577,
     131072, 131073, 2**63 - 1, 2**63, -2**63, -2**63 - 1, "", "x", "smollm2", "auto", "cpu",
     "cuda", "cuda:0", "mean", "last", "cls", "max", [], [""], ["a"], ["a", "b"], [0, 5],
     [-1], [1.5], ["s"] * 16, ["s"] * 17, ["c"] * 1024, ["c"] * 1025, {"a": 1}])


@settings(max_examples=1500, deadline=None)
@given(st.sampled_from(list(protocol.OPS)), st.dictionaries(field_names, edge_values, max_size=6))
def test_edge_values_agree_with_schema(op, params):
    """Boundary values of every range: parse_request and schema.json agree."""
    req = {**params, "op": op}
    try:
        protocol.parse_request(json.dumps(req).encode())
        ok = True
    except protocol.RequestError as e:
        assert e.kind in LINE_KINDS
        ok = False
    errors = schema_errors(req, "request")
    if any(type(v) is float and v.is_integer() for v in req.values()):
        # JSON Schema's "integer" also matches 1.0; the protocol's integers are
        # written without a fraction (schema.json's description says so).
        assert not ok or not errors, req
    else:
        assert ok == (not errors), (req, [x.message for x in errors])
