"""Benchmark: `reflex stdio` start-up, to the ready line and to the first result.

Fresh processes, external wall clock from just before the spawn
($REFLEX_T_LAUNCH is set too, so the server's own timings share the origin):
  * `python -c pass` (the interpreter, for scale)
  * `reflex stdio`: ready line, then a `ping` result (no model is loaded)
  * `reflex stdio --model M --device cpu`: ready line (the model loads before
    it), then a 1-token greedy `generate` result
  * `reflex stdio` without --model: ready, then the same generate (the model
    loads on the first request)
Median and min of --runs after one warm-up run; children run without
PYTHONDONTWRITEBYTECODE (bytecode caches on, as an installed package has).

    python bench/stdio_ready.py [--runs N] [--model M] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import select
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def child_env():
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def read_line(p, deadline):
    buf = b""
    fd = p.stdout.fileno()
    while not buf.endswith(b"\n"):
        if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            raise TimeoutError("no line from the server")
        b = os.read(fd, 1)
        if not b:
            raise EOFError(p.stderr.read().decode(errors="replace")[-2000:])
        buf += b
    return json.loads(buf)


def one_run(argv, request):
    env = child_env()
    t0 = time.perf_counter()
    env["REFLEX_T_LAUNCH"] = str(time.time_ns())
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 300
    try:
        ready = read_line(p, deadline)
        t_ready = time.perf_counter()
        p.stdin.write(json.dumps(request).encode() + b"\n")
        p.stdin.flush()
        while True:
            res = read_line(p, deadline)
            if res.get("event") == "result":
                break
        t_res = time.perf_counter()
        assert res["ok"], res
        p.stdin.close()
        p.wait(60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stdout.close()
        p.stderr.close()
    return {"ready_s": t_ready - t0, "result_s": t_res - t0,
            "server_ready_ms": ready["timings"]["process_start_to_ready"],
            "server_first_token_ms": res["timings"].get("process_start_to_first_token"),
            "server_load_ms": ready["timings"].get("load", res["timings"].get("load"))}


def stats(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
            "runs": [round(v, 4) for v in values]}


def measure(argv, request, runs):
    one_run(argv, request)  # warm-up (page cache, bytecode)
    rs = [one_run(argv, request) for _ in range(runs)]
    return {k: stats([r[k] for r in rs]) for k in rs[0]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args(argv)
    reflex = shutil.which("reflex") or sys.exit("reflex is not on PATH")
    load_before = os.getloadavg()[0]

    py = []
    subprocess.run([sys.executable, "-c", "pass"], env=child_env())
    for _ in range(args.runs):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], env=child_env(), check=True)
        py.append(time.perf_counter() - t)

    gen = {"id": 1, "op": "generate", "prompt": "The capital of France is", "max_tokens": 1}
    cases = {
        "no_model_then_ping": ([reflex, "stdio"], {"id": 1, "op": "ping"}),
        "model_before_ready_then_generate": (
            [reflex, "stdio", "--model", args.model, "--device", "cpu"], gen),
        "no_model_then_generate": ([reflex, "stdio", "--device", "cpu"], gen),
    }
    out = {
        "benchmark": "stdio_ready",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                 capture_output=True, text=True).stdout.strip(),
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cores": os.cpu_count(), "load_avg_1m_at_start": round(load_before, 2)},
        "notes": "seconds from just before spawn (external wall clock) to the ready line and "
                 "to the first result; server_* are the server's own timings in ms from "
                 "$REFLEX_T_LAUNCH; median/min of runs after one warm-up",
        "python_start_s": stats(py),
        "model": args.model,
    }
    for name, (cmd, req) in cases.items():
        out[name] = measure(cmd, req, args.runs)
        print(f"{name:36s} ready {out[name]['ready_s']['median'] * 1e3:7.1f} ms   "
              f"result {out[name]['result_s']['median'] * 1e3:7.1f} ms", file=sys.stderr)
    out["machine"]["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"stdio_ready-{datetime.date.today().isoformat()}.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
