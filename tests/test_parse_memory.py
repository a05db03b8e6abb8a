"""Request parsing decodes a line once, into the op's struct (issue 12, item 8).

parse_request must answer exactly what the generic path (_parse_generic: a dict
first, then msgspec.convert into the struct) answers, for every line: the same
params, or the same error kind, message, id and op. And the transient memory of
parsing a worst-case 16 MiB line must stay near the size of what the parse returns.
"""

import base64
import json
import pathlib
import random

import pytest

from reflex_ipc import protocol
from reflex_ipc.ops import MAX_LINE_BYTES
from reflex_ipc.testing.fuzz import gen_request
from reflex_ipc.testing.parse_memory import measure, worst_lines

VECTORS = pathlib.Path(__file__).resolve().parent.parent / "protocol" / "vectors"

EDGE_LINES = [
    b'{"op": "ping", "op": "hello"}',  # duplicate keys: the last one counts
    b'{"op": "generate", "prompt": 5, "prompt": "x"}',
    b'{"op": "generate", "prompt": "x", "prompt": 5}',
    b'{"id": 1, "id": "a", "op": "ping"}',
    b'{"id": 1, "op": "generate", "prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    b'{"id": 1, "op": "generate", "prompt": "x", "tools": [' + b"[" * 5000 + b"]" * 5000 + b"]}",
    b'{"id": 1, "op": "generate", "prompt": "x", "zzz": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    b'{"id": 1, "op": "detokenize", "ids": [1]}',
    b'{"id": 1, "op": "detokenize", "token_ids": [1, 9223372036854775808]}',
    b'{"id": 1, "op": "detokenize", "token_ids": [1e999]}',
    b'{"id": 1, "op": "generate", "prompt": "x", "temperature": 1e999}',
    b'{"id": 1, "op": "generate", "prompt": "x", "max_tokens": 8.0}',
    b'{"id": "\xc3\xa9", "op": "tokenize", "text": "\xe4\xbd\xa0"}',
    b'{"id": 1, "op": "tokenize", "text": "\xff"}',
    b'{"id": 1, "op": "tokenize", "text": "\\ud800"}',
    b'{"id": 1, "op": "tokenize"}',
    b'{"id": 1, "op": "tokenize", "text": "a", "messages": [{"role": "u"}]}',
    b'{"id": 1, "op": "system1", "prompt": "x", "candidates": []}',
    b'{"id": 1, "op": "embed", "input": ["a", ""]}',
    b'{"id": 1, "op": "load", "model": null, "device": "gpu"}',
    b'{"id": [1], "op": "ping"}',
    b'{"id": 1, "op": ["ping"]}',
    b'{"id": 1, "op": "ping"} x',
    b' \t{"op" : "ping" } ',
    b'{"op": "ping", "id": 1, }',
    b"{}",
    b"[]",
]


def outcome(fn, line):
    try:
        rid, op, params = fn(line)
    except protocol.RequestError as e:
        return ("error", e.kind, e.message, e.rid, e.op)
    cls = protocol.OPS[op]
    assert isinstance(params, cls)
    return ("ok", rid, op, {f: getattr(params, f) for f in cls.__struct_fields__})


def lines():
    for path in sorted(VECTORS.glob("*.jsonl")):
        for row in path.read_text(encoding="utf-8").splitlines():
            case = json.loads(row)
            yield (base64.b64decode(case["request_base64"]) if "request_base64" in case
                   else json.dumps(case["request"]).encode())
    yield from EDGE_LINES
    rng = random.Random(7)
    for _ in range(3000):
        yield gen_request(rng, ["m.gguf", "/dev/zero", ""])[0]


def test_same_answers_as_generic_parse():
    n = 0
    for line in lines():
        assert outcome(protocol.parse_request, line) == outcome(protocol._parse_generic, line), line[:200]
        n += 1
    assert n > 3000


# The bound: what the parse returns, plus half of it. [1,1,...] of 16 MiB is 8.4 M ids:
# the token_ids list alone is 64 MiB of pointers (small ints are shared), so a parse
# that builds it once peaks near 64 MiB; a generic decode then convert built the list
# twice (+144 MiB measured). The messages line is ~650 k Message structs (~128 MiB,
# +264 MiB before). Memory, unlike time, does not depend on how busy the machine is.
BOUNDS_MIB = {"detokenize token_ids [1,1,...]": 96, "tokenize messages [{role,content},...]": 192}


@pytest.mark.parametrize("name", sorted(BOUNDS_MIB))
def test_transient_parse_memory(name):
    line = worst_lines(MAX_LINE_BYTES)[name]
    r = measure(line)
    assert r["kind"] == "ok"
    assert r["delta_kib"] / 1024 <= BOUNDS_MIB[name], r
