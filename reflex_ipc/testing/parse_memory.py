"""Transient memory of parsing one request line (issue 12, item 8).

`worst_lines(limit)` builds request lines of just under `limit` bytes whose parse
allocates the most: long arrays of small numbers, of strings and of objects, one
huge string. `measure(line)` parses one such line in a fresh Python process and
returns the growth of its peak RSS (VmHWM) over the peak it had with the line
already read, the parse time and the outcome (ok or the error kind). Used by
bench/parse_memory.py (the figures) and tests/test_parse_memory.py (the bound).
"""

import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _fill(head: bytes, item: bytes, tail: bytes, limit: int) -> bytes:
    """head + item,item,...,item + tail, as long as fits in limit bytes."""
    n = max(1, (limit - len(head) - len(tail)) // (len(item) + 1))
    return head + b",".join([item] * n) + tail


def worst_lines(limit: int) -> dict:
    """{name: line} (no newline), each at most `limit` bytes."""
    return {
        # valid requests
        "detokenize token_ids [1,1,...]": _fill(b'{"id":1,"op":"detokenize","token_ids":[', b"1", b"]}", limit),
        "detokenize token_ids [123456,...]": _fill(b'{"id":1,"op":"detokenize","token_ids":[', b"123456", b"]}", limit),
        "tokenize messages [{role,content},...]": _fill(
            b'{"id":1,"op":"tokenize","messages":[', b'{"role":"u","content":"x"}', b"]}", limit),
        "tokenize messages content parts": _fill(
            b'{"id":1,"op":"tokenize","messages":[{"role":"u","content":[', b'{"type":"text","text":""}', b"]}]}", limit),
        "generate tools [{},...]": _fill(b'{"id":1,"op":"generate","prompt":"x","tools":[', b"{}", b"]}", limit),
        "generate chat_template_kwargs floats": _fill(
            b'{"id":1,"op":"generate","prompt":"x","chat_template_kwargs":{"a":[', b"1.5", b"]}}", limit),
        "generate json_schema enum strings": _fill(
            b'{"id":1,"op":"generate","prompt":"x","json_schema":{"enum":[', b'"a"', b"]}}", limit),
        "tokenize text one word": b'{"id":1,"op":"tokenize","text":"' + b"a" * (limit - 40) + b'"}',
        "tokenize text 4-byte chars": (b'{"id":1,"op":"tokenize","text":"'
                                       + "\U0001F600".encode() * ((limit - 40) // 4) + b'"}'),
        "embed input 1024 strings": _fill(b'{"id":1,"op":"embed","input":[',
                                          b'"' + b"b" * (limit // 1024 - 4) + b'"', b"]}", limit),
        # invalid requests (the error path)
        "system1 candidates [\"a\",...] (over 1024)": _fill(
            b'{"id":1,"op":"system1","prompt":"x","candidates":[', b'"a"', b"]}", limit),
        "detokenize token_ids, last one negative": _fill(
            b'{"id":1,"op":"detokenize","token_ids":[', b"1", b",-1]}", limit),
        "unknown op with a long array": _fill(b'{"id":1,"op":"nope","x":[', b"1", b"]}", limit),
        "not an object: long array": _fill(b"[", b"1", b"]", limit),
    }


_CHILD = r"""
import gc, json, resource, sys, time
sys.path.insert(0, sys.argv[2])


def peak_kib():
    # VmHWM: this process's own peak. ru_maxrss would do, but Linux carries a parent's
    # maxrss over fork + exec into the child, hiding the child's smaller peak.
    try:
        with open("/proc/self/status") as f:
            for row in f:
                if row.startswith("VmHWM:"):
                    return int(row.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

from reflex_ipc import protocol
line = open(sys.argv[1], "rb").read()
protocol.parse_request(b'{"op": "ping"}')
gc.collect()
before = peak_kib()
t = time.perf_counter()
try:
    out = getattr(protocol, sys.argv[3])(line)
    kind = "ok"
except protocol.RequestError as e:
    out, kind = None, e.kind
dt = time.perf_counter() - t
after = peak_kib()
print(json.dumps({"delta_kib": after - before, "before_kib": before, "parse_s": dt, "kind": kind}))
"""


def measure(line: bytes, root: str = ROOT, fn: str = "parse_request") -> dict:
    """Parse `line` with protocol.`fn` in a fresh process: {delta_kib, before_kib,
    parse_s, kind}."""
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as f:
        f.write(line)
        f.flush()
        out = subprocess.run([sys.executable, "-c", _CHILD, f.name, root, fn],
                             capture_output=True, text=True, check=True)
    return json.loads(out.stdout)
