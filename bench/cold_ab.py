"""Benchmark: the CLI's cold paths, two source trees A/B alternated run by run.

For each tree (a folder put first on PYTHONPATH, so its reflex_ipc is imported by the
`reflex` console script), alternately:

  * `reflex stdio` (no model): ms from spawn to the ready line;
  * `reflex generate --max-tokens 1 --device cpu --json PROMPT` (--device, --model): wall ms of
    the process, its CPU time (user + system, all threads: what a loaded machine's time
    slices do not inflate) and its phase marks (main_args_parsed, first_token; launch =
    $REFLEX_T_LAUNCH);

and the paired ratio B/A of each, with `uptime`'s load averages around the runs. Results:
one JSON file with every sample.

    python bench/cold_ab.py --a /tmp/tree-main --b . --runs 12 --out bench/results/x.json
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from reflex_ipc.commands.bench import cpu_model  # noqa: E402

PROMPT = "The capital of France is"


def ready_ms(tree):
    env = dict(os.environ, PYTHONPATH=tree, REFLEX_T_LAUNCH=str(time.time_ns()))
    env.pop("REFLEX_MODEL", None)
    t0 = time.perf_counter()
    p = subprocess.Popen(["reflex", "stdio"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         env=env)
    line = p.stdout.readline()
    t = (time.perf_counter() - t0) * 1e3
    p.stdin.close()
    p.wait()
    assert json.loads(line)["event"] == "ready"
    return t


def generate(tree, device="cpu", model=None):
    import resource

    env = dict(os.environ, PYTHONPATH=tree, REFLEX_T_LAUNCH=str(time.time_ns()), REFLEX_DETACH="0")
    env.pop("REFLEX_MODEL", None)
    argv = ["reflex", "generate", "--max-tokens", "1", "--device", device, "--json"]
    argv += ["--model", model] if model else []
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(argv + [PROMPT], capture_output=True, env=env, check=True).stdout
    wall = (time.perf_counter() - t0) * 1e3
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    ph = json.loads(out)["timings"]["phases"]
    return {"wall": wall, "cpu": (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) * 1e3,
            "main_args_parsed": ph.get("main_args_parsed"), "first_token": ph.get("first_token")}


def http_first_token(tree):
    """A cold `reflex http --device cpu` (it spawns its engine): ms from spawn to the first
    streamed token of POST /v1/completions, sent as soon as the port accepts."""
    import http.client
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=tree)
    env.pop("REFLEX_MODEL", None)
    body = json.dumps({"prompt": PROMPT, "max_tokens": 1, "temperature": 0, "stream": True}).encode()
    t0 = time.perf_counter()
    proc = subprocess.Popen(["reflex", "http", "--port", str(port), "--device", "cpu"], env=env,
                            stderr=subprocess.DEVNULL)
    try:
        while True:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
                c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
                break
            except ConnectionRefusedError:
                assert proc.poll() is None
                time.sleep(0.002)
        r = c.getresponse()
        assert r.status == 200, r.read()
        while not r.fp.readline().startswith(b"data: {"):
            pass
        c.close()
        return {"http_first_token": (time.perf_counter() - t0) * 1e3}
    finally:
        proc.terminate()
        proc.wait(20)


def summary(a, b):
    ratios = [y / x for x, y in zip(a, b) if x and y]
    return {"a_p50": round(statistics.median(a), 3), "b_p50": round(statistics.median(b), 3),
            "ratio_b_over_a_p50": round(statistics.median(ratios), 4),
            "ratio_min": round(min(ratios), 4), "ratio_max": round(max(ratios), 4)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--a", required=True, help="tree A (the baseline)")
    p.add_argument("--b", required=True, help="tree B (the change)")
    p.add_argument("--runs", type=int, default=12, help="pairs (default: %(default)s)")
    p.add_argument("--a-commit", help="tree A's commit, when it is not a git checkout")
    p.add_argument("--b-commit", help="tree B's commit, when it is not a git checkout")
    p.add_argument("--out", help="write the results JSON here")
    p.add_argument("--http", action="store_true",
                   help="also a cold `reflex http` to its first streamed token (the http extra)")
    p.add_argument("--device", default="cpu", help="generate's --device (default: %(default)s)")
    p.add_argument("--model", help="generate's --model (default: smollm2)")
    p.add_argument("--no-ready", action="store_true", help="only the generate runs")
    args = p.parse_args()
    uptime = lambda: subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()  # noqa: E731
    uptime_before = uptime()
    uptimes = [uptime_before]
    trees = {"a": os.path.abspath(args.a), "b": os.path.abspath(args.b)}
    samples = {k: {"ready": [], "wall": [], "cpu": [], "main_args_parsed": [], "first_token": [],
                   **({"http_first_token": []} if args.http else {})} for k in trees}
    for i in range(args.runs):
        order = ("a", "b") if i % 2 == 0 else ("b", "a")
        if not args.no_ready:
            for k in order:
                samples[k]["ready"].append(ready_ms(trees[k]))
        for k in order:
            for name, v in generate(trees[k], args.device, args.model).items():
                samples[k][name].append(v)
        if args.http:
            for k in order:
                samples[k]["http_first_token"].append(http_first_token(trees[k])["http_first_token"])
    def commit(tree):
        r = subprocess.run(["git", "-C", tree, "rev-parse", "HEAD"], capture_output=True, text=True)
        return r.stdout.strip() or None
    res = {"benchmark": "cold_ab", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "machine": {"cpu": cpu_model(), "cores": os.cpu_count(),
                       "load_avg": os.getloadavg(), "uptime_before": uptime_before,
                       "uptime_after": uptime()},
           "trees": {k: {"path": v, "commit": getattr(args, f"{k}_commit") or commit(v)}
                     for k, v in trees.items()},
           "runs": args.runs, "prompt": PROMPT, "device": args.device, "model": args.model,
           "uptime_before_after": uptimes + [uptime()],
           "summary": {m: summary(samples["a"][m], samples["b"][m]) for m in samples["a"] if samples["a"][m]},
           "samples_ms": samples}
    text = json.dumps(res, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(json.dumps(res["summary"], indent=1))


if __name__ == "__main__":
    main()
