"""protocol/schema.json, derived from the op registry's structs.

    python -m reflex_ipc.ops.schema            rewrite protocol/schema.json
    python -m reflex_ipc.ops.schema --check    exit 1 when the file differs
    python -m reflex_ipc.ops.schema --out -    print it

Every op's request and result come from its module's `Request` and `Result`
structs (msgspec.json.schema_components); this module adds only the envelope
(`id`, `op`, `event`, `ok`, `timings`, errors). tests/test_protocol.py fails
when the committed file differs from `build()`.
"""

import json
import pathlib
import sys

import msgspec

from . import registry
from ..errors import KINDS

DEFAULT_PATH = pathlib.Path(__file__).resolve().parents[2] / "protocol" / "schema.json"

_ID = {"anyOf": [{"type": "string"},
                 {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1},
                 {"type": "null"}]}
_TIMINGS = {"type": "object",
            "properties": {k: {"type": "number"} for k in
                           ("parse", "load", "prompt_eval", "decode", "total",
                            "process_start_to_first_token")},
            "required": ["parse", "total"],
            "additionalProperties": {"type": "number"}}


def _ref(name):
    return {"$ref": f"#/$defs/{name}"}


def _first_line(doc):
    return (doc or "").strip().splitlines()[0] if doc else ""


def build() -> dict:
    from .generate import Token
    from .hello import Ready

    reg = registry()
    types = [Ready, Token]
    for mod in reg.values():
        types += [mod.Request, mod.Result]
    _, comps = msgspec.json.schema_components(types, ref_template="#/$defs/{name}")

    def take(cls):
        sch = comps.pop(cls.__name__)
        sch.pop("title", None)
        return sch

    defs = {"id": _ID, "error_kind": {"enum": list(KINDS)}, "timings": _TIMINGS}
    requests, results = {}, {}
    for op, mod in reg.items():
        req = take(mod.Request)
        requests[op] = {
            "description": _first_line(mod.__doc__),
            "type": "object",
            "properties": {"id": _ref("id"), "op": {"const": op}, **req["properties"]},
            "required": ["op", *req.get("required", [])],
            "additionalProperties": False}
        pair = getattr(mod, "EXACTLY_ONE", None)
        if pair:
            a, b = pair
            requests[op]["oneOf"] = [
                {"required": [a], "properties": {a: {"type": "string"}, b: {"type": "null"}}},
                {"required": [b], "properties": {b: {"type": "array"}, a: {"type": "null"}}}]
        res = take(mod.Result)
        results[op] = {
            "type": "object",
            "properties": {"event": {"const": "result"}, "id": _ref("id"), "op": {"const": op},
                           "ok": {"const": True}, "timings": _ref("timings"),
                           **res["properties"]},
            "required": ["event", "id", "op", "ok", "timings", *res.get("required", [])]}
    ready = take(Ready)
    ready["properties"]["id"] = {"type": "null"}
    ready["description"] = _first_line(Ready.__doc__)
    token = take(Token)
    token["properties"]["id"] = _ref("id")
    token["description"] = _first_line(Token.__doc__)
    defs["ready"] = ready
    defs["token"] = token
    defs["result_error"] = {
        "type": "object",
        "properties": {
            "event": {"const": "result"}, "id": _ref("id"), "op": {"type": ["string", "null"]},
            "ok": {"const": False},
            "error": {"type": "object",
                      "properties": {"kind": _ref("error_kind"), "message": {"type": "string"}},
                      "required": ["kind", "message"], "additionalProperties": False},
            "timings": _ref("timings")},
        "required": ["event", "id", "op", "ok", "error", "timings"]}
    defs["request"] = {"oneOf": [_ref(f"request_{op}") for op in reg]}
    defs["result_ok"] = {"oneOf": [_ref(f"result_{op}") for op in reg]}
    defs["response"] = {"oneOf": [_ref("ready"), _ref("token"), _ref("result_ok"),
                                  _ref("result_error")]}
    for op in reg:
        defs[f"request_{op}"] = requests[op]
    for op in reg:
        defs[f"result_{op}"] = results[op]
    for name, sch in comps.items():  # nested structs (Candidate, Limits, ...)
        sch.pop("title", None)
        defs[name] = sch
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "reflex-ipc/protocol/1/schema.json",
        "title": "reflex wire protocol, version 1",
        "description": (
            "Generated from reflex_ipc/ops/ by `python -m reflex_ipc.ops.schema`; do not edit. "
            "protocol/PROTOCOL.md is normative. A request line validates against "
            "#/$defs/request; every line the server writes validates against "
            "#/$defs/response. Servers may add result keys; requests may not. Integers are "
            "written without a fraction or exponent: the server rejects 1.0 where an integer "
            "is expected, although JSON Schema's integer type matches it."),
        "$defs": defs,
    }


def text() -> str:
    return json.dumps(build(), indent=1, ensure_ascii=False) + "\n"


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m reflex_ipc.ops.schema",
                                description="write protocol/schema.json from the op registry")
    p.add_argument("--out", default=str(DEFAULT_PATH), help="file to write, - for stdout "
                                                            "(default: %(default)s)")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 when the file differs from the registry")
    args = p.parse_args(argv)
    new = text()
    if args.out == "-":
        sys.stdout.write(new)
        return 0
    path = pathlib.Path(args.out)
    if args.check:
        old = path.read_text(encoding="utf-8") if path.exists() else ""
        if old != new:
            sys.stderr.write(f"{path} differs from the op registry: "
                             "run python -m reflex_ipc.ops.schema\n")
            return 1
        return 0
    path.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
