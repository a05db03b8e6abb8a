"""Request-line parsing: transient memory of worst-case 16 MiB lines, time of small lines.

Three measurements, each one of protocol.parse_request (one typed decode) against
protocol._parse_generic (the former path: a generic decode, then msgspec.convert),
alternating:
  memory     every line of reflex_ipc.testing.parse_memory.worst_lines(16 MiB), parsed
             in a fresh process: peak RSS growth (VmHWM) and parse time
  small      per-line parse time of ordinary small request lines, in process
             (timeit, best of repeats, ns per line)
  first      the first parse in a fresh process (decoders built then), us
  stdio      wall time of `python -m reflex_ipc stdio --device numpy` on a tiny synthetic
             llama answering a few small requests (launch to the last result), this tree
             against REF_TREE (the former code) when given

usage: python bench/parse_memory.py [--rounds 3] [--ref-tree /work/main] [--out FILE]
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import timeit

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

SMALL = [
    b'{"id": 1, "op": "ping"}',
    b'{"id": 2, "op": "generate", "prompt": "The capital of France is", "max_tokens": 8}',
    b'{"id": 3, "op": "system1", "prompt": "Is the sky blue?", "candidates": [" yes", " no"]}',
    b'{"id": "t", "op": "tokenize", "text": "Hello, world!"}',
    b'{"id": 5, "op": "generate", "messages": [{"role": "system", "content": "Be brief."}, '
    b'{"role": "user", "content": "Hi"}], "max_tokens": 16, "temperature": 0.7, "seed": 3}',
    b'{"id": 6, "op": "detokenize", "token_ids": [1, 2, 3, 4, 5, 6, 7, 8]}',
]


def small(rounds):
    from reflex_ipc import protocol

    out = {}
    for line in SMALL:
        op = json.loads(line)["op"]
        samples = {"parse_request": [], "_parse_generic": []}
        for _ in range(rounds * 3):
            for fn in samples:
                f = getattr(protocol, fn)
                n = 20000
                t = min(timeit.repeat(lambda: f(line), number=n, repeat=3)) / n
                samples[fn].append(round(t * 1e9, 1))
        out[op + ("" if op not in out else "_2")] = {
            "bytes": len(line), "ns": samples,
            "median_ns": {k: statistics.median(v) for k, v in samples.items()}}
    return out


def memory(rounds):
    from reflex_ipc.ops import MAX_LINE_BYTES
    from reflex_ipc.testing.parse_memory import measure, worst_lines

    out = {}
    for name, line in worst_lines(MAX_LINE_BYTES).items():
        runs = {"parse_request": [], "_parse_generic": []}
        for _ in range(rounds):
            for fn in runs:
                runs[fn].append(measure(line, fn=fn))
        out[name] = {"bytes": len(line), "kind": runs["parse_request"][0]["kind"], "runs": runs,
                     "delta_mib_max": {k: round(max(r["delta_kib"] for r in v) / 1024, 1)
                                       for k, v in runs.items()},
                     "parse_ms_median": {k: round(statistics.median(r["parse_s"] for r in v) * 1e3, 1)
                                         for k, v in runs.items()}}
        print(f"{name:45s} {out[name]['delta_mib_max']} {out[name]['parse_ms_median']}", flush=True)
    return out


_FIRST = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
from reflex_ipc import protocol
t = time.perf_counter()
getattr(protocol, sys.argv[2])(sys.argv[3].encode())
print((time.perf_counter() - t) * 1e6)
"""


def first(rounds):
    """The first parse of a generate line in a fresh process (builds the decoders), us."""
    samples = {"parse_request": [], "_parse_generic": []}
    for _ in range(rounds * 4):
        for fn in samples:
            out = subprocess.run([sys.executable, "-c", _FIRST, ROOT, fn, SMALL[1].decode()],
                                 capture_output=True, text=True, check=True).stdout
            samples[fn].append(round(float(out), 1))
    return {"line": SMALL[1].decode(), "us": samples,
            "median_us": {k: statistics.median(v) for k, v in samples.items()}}


def stdio(rounds, ref_tree):
    import numpy as np

    from reflex_ipc.testing.fuzz import tiny_model, write_gguf

    tmp = tempfile.mkdtemp()
    model = os.path.join(tmp, "tiny.gguf")
    write_gguf(model, *tiny_model("llama", np.random.default_rng(1)))
    reqs = [b'{"id": 1, "op": "load", "model": "%s"}' % model.encode(),
            b'{"id": 2, "op": "tokenize", "text": "hello world"}',
            b'{"id": 3, "op": "generate", "prompt": "hello", "max_tokens": 2}',
            b'{"id": 4, "op": "system1", "prompt": "hello", "candidates": ["a", "b"]}',
            b'{"id": 5, "op": "ping"}']
    stdin = b"\n".join(reqs) + b"\n"
    trees = {"this": ROOT} | ({"ref": ref_tree} if ref_tree else {})
    env = dict(os.environ, REFLEX_CACHE=os.path.join(tmp, "cache"))
    samples = {k: [] for k in trees}
    for _ in range(rounds * 3):
        for k, tree in trees.items():
            t = time.perf_counter()
            p = subprocess.run([sys.executable, "-m", "reflex_ipc", "stdio", "--device", "numpy"],
                               input=stdin, capture_output=True, cwd=tree,
                               env=dict(env, PYTHONPATH=tree))
            wall = time.perf_counter() - t
            res = [json.loads(x) for x in p.stdout.splitlines() if b'"result"' in x]
            assert [r["id"] for r in res] == [1, 2, 3, 4, 5] and all(r["ok"] for r in res), p.stdout
            samples[k].append({"wall_ms": round(wall * 1e3, 1),
                               "parse_ms": [r["timings"].get("parse") for r in res]})
    return {"requests": [r.decode() for r in reqs], "trees": trees, "samples": samples,
            "median_wall_ms": {k: statistics.median(s["wall_ms"] for s in v) for k, v in samples.items()}}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ref-tree", help="a checkout of the former code, for the stdio A/B")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    res = {"benchmark": "parse_memory", "commit": commit,
           "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                       "python": platform.python_version(), "loadavg_before": os.getloadavg()}}
    res["memory"] = memory(a.rounds)
    res["small"] = small(a.rounds)
    print(json.dumps({k: v["median_ns"] for k, v in res["small"].items()}), flush=True)
    res["first"] = first(a.rounds)
    print(json.dumps(res["first"]["median_us"]), flush=True)
    res["stdio"] = stdio(a.rounds, a.ref_tree)
    print(json.dumps(res["stdio"]["median_wall_ms"]), flush=True)
    res["machine"]["loadavg_after"] = os.getloadavg()
    out = a.out or os.path.join(HERE, "results", f"parse-memory-{commit}.json")
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print(out)


if __name__ == "__main__":
    main()
