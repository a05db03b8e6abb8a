"""Benchmark: what `reflex http` adds in front of the engine's socket.

1. Added latency per request. One `reflex uds` engine (SmolLM2, CPU). The same request, a
   greedy 1-token generate of a short prompt, is sent (a) directly over the socket (one
   JSON line, read up to the result line) and (b) through `reflex http --connect` as
   POST /v1/completions on a kept-alive HTTP/1.1 connection (stdlib http.client). Each
   sample's overhead is its wall time minus the engine's own `timings.total` (which the
   front passes on), so the engine's run-to-run noise cancels; the figure is
   p50(front overhead) - p50(direct overhead). Phases alternate (direct, front, direct,
   front) after warm-ups.
2. Cold process -> first token: from spawning `reflex http --device cpu` (spawn mode) to the
   first SSE token of a streamed completion sent as soon as the port accepts; the peer in the
   same run is `reflex stdio --device cpu` spawned and sent the same streamed generate
   (ready line, then first token event). Alternating, --cold-runs each.

    python bench/http_front.py [--samples N] [--cold-runs N] [--out DIR]
        [--endpoints completions,classify,messages,responses] [--base TREE] [--rounds R]
        [--no-cold]

   --endpoints measures 1. for each endpoint given, paired with the engine op it maps to
   (/v1/classify: classify; /v1/messages and /v1/responses: generate with messages).
   --base TREE adds that source tree's front as a third phase on the same engine
   (direct, front, base; the order of the fronts flips every round): before/after.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

PROMPT = "Hi"


def env(tree=None):
    e = dict(os.environ)
    e.pop("PYTHONDONTWRITEBYTECODE", None)
    if tree is not None:  # another source tree's front (--base)
        e["PYTHONPATH"] = os.pathsep.join([tree, os.path.join(tree, "clients", "python")])
        return e
    e["PYTHONPATH"] = ROOT + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    return e


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def uptime():
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def summary(xs):
    return {"p50": round(statistics.median(xs), 3), "p10": round(pct(xs, 0.1), 3),
            "p90": round(pct(xs, 0.9), 3), "min": round(min(xs), 3), "n": len(xs)}


# endpoint: (HTTP path, HTTP body, the engine op and params the front sends for it)
ENDPOINTS = {
    "completions": ("/v1/completions", {"model": "m", "prompt": PROMPT, "max_tokens": 1, "temperature": 0},
                    ("generate", {"prompt": PROMPT, "max_tokens": 1})),
    "classify": ("/v1/classify", {"input": "Is the sky blue? Answer:", "labels": [" yes", " no"]},
                 ("classify", {"input": "Is the sky blue? Answer:", "labels": [" yes", " no"]})),
    "messages": ("/v1/messages", {"model": "m", "max_tokens": 1, "temperature": 0,
                                  "messages": [{"role": "user", "content": PROMPT}]},
                 ("generate", {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 1,
                               "temperature": 0.0})),
    "responses": ("/v1/responses", {"model": "m", "input": PROMPT, "max_output_tokens": 1, "temperature": 0},
                  ("generate", {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 1,
                                "temperature": 0.0})),
}


class Direct:
    def __init__(self, path, endpoint="completions"):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(path)
        self.f = self.sock.makefile("rb")
        assert json.loads(self.f.readline())["event"] == "ready"
        self.n = 0
        self.op, self.params = ENDPOINTS[endpoint][2]

    def once(self):
        self.n += 1
        line = json.dumps({"id": self.n, "op": self.op, **self.params}).encode() + b"\n"
        t0 = time.perf_counter()
        self.sock.sendall(line)
        while True:
            ev = json.loads(self.f.readline())
            if ev["event"] == "result":
                break
        wall = (time.perf_counter() - t0) * 1e3
        assert ev["ok"], ev
        return wall, ev["timings"]["total"]

    def close(self):
        self.f.close()
        self.sock.close()


class Front:
    def __init__(self, sock_path, endpoint="completions", tree=None):
        self.port = free_port()
        self.proc = subprocess.Popen([sys.executable, "-m", "reflex_ipc", "http", "--connect", sock_path,
                                      "--port", str(self.port)], env=env(tree), stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while True:
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            assert time.time() < deadline and self.proc.poll() is None
            time.sleep(0.05)
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        self.path, body, _ = ENDPOINTS[endpoint]
        self.body = json.dumps(body).encode()

    def once(self):
        t0 = time.perf_counter()
        self.conn.request("POST", self.path, body=self.body, headers={"Content-Type": "application/json"})
        r = self.conn.getresponse()
        data = r.read()
        wall = (time.perf_counter() - t0) * 1e3
        assert r.status == 200, data
        return wall, json.loads(data)["timings"]["total"]

    def cpu_ms(self):
        """CPU time the front process has used (all threads, /proc/PID/task/*/schedstat), ms."""
        total = 0
        for t in os.listdir(f"/proc/{self.proc.pid}/task"):
            with open(f"/proc/{self.proc.pid}/task/{t}/schedstat") as f:
                total += int(f.read().split()[0])
        return total / 1e6

    def close(self):
        self.conn.close()
        self.proc.terminate()
        self.proc.wait(20)


def latency(samples, warmup, endpoint="completions", base=None, rounds=2):
    """Direct vs front (and, with `base`, that tree's front on the same engine), phases
    alternated (direct, front[, base]) for `rounds` rounds."""
    d = tempfile.mkdtemp(prefix="reflex-bench-")
    path = os.path.join(d, "engine.sock")
    eng = subprocess.Popen([sys.executable, "-m", "reflex_ipc", "uds", path, "--device", "cpu",
                            "--model", "smollm2"], env=env(), stderr=subprocess.DEVNULL)
    names = ("direct", "front") + (("base",) if base else ())
    out = {n: [] for n in names}
    cpu = {n: [] for n in names if n != "direct"}
    try:
        while not os.path.exists(path):
            time.sleep(0.02)
        for rnd in range(rounds):
            for name in (names if rnd % 2 == 0 else names[:1] + names[1:][::-1]):
                c = Direct(path, endpoint) if name == "direct" else \
                    Front(path, endpoint, tree=base if name == "base" else None)
                for _ in range(warmup):
                    c.once()
                cpu0 = c.cpu_ms() if name != "direct" else None
                for _ in range(samples):
                    wall, total = c.once()
                    out[name].append({"wall_ms": round(wall, 3), "engine_total_ms": total,
                                      "overhead_ms": round(wall - total, 3), "round": rnd})
                if cpu0 is not None:
                    cpu[name].append(round((c.cpu_ms() - cpu0) / samples, 3))
                c.close()
    finally:
        eng.terminate()
        eng.wait(20)
    res = {k: {"wall_ms": summary([s["wall_ms"] for s in v]),
               "overhead_ms": summary([s["overhead_ms"] for s in v])} for k, v in out.items()}
    res["front_cpu_ms_per_request"] = cpu["front"]  # one figure per front phase
    res["added_p50_ms"] = round(res["front"]["overhead_ms"]["p50"] - res["direct"]["overhead_ms"]["p50"], 3)
    if base:
        res["base_cpu_ms_per_request"] = cpu["base"]
        res["base_added_p50_ms"] = round(res["base"]["overhead_ms"]["p50"] - res["direct"]["overhead_ms"]["p50"], 3)
    res["samples"] = out
    return res


def cold_front():
    port = free_port()
    body = json.dumps({"model": "m", "prompt": PROMPT, "max_tokens": 1, "temperature": 0, "stream": True}).encode()
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "reflex_ipc", "http", "--port", str(port), "--device", "cpu"],
                            env=env(), stderr=subprocess.DEVNULL)
    try:
        while True:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
                c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
                break
            except ConnectionRefusedError:
                assert proc.poll() is None
                time.sleep(0.002)
        t_connect = (time.perf_counter() - t0) * 1e3
        r = c.getresponse()
        assert r.status == 200, r.read()
        while True:
            line = r.fp.readline()
            if line.startswith(b"data: ") and b'"text":"' in line:
                break
        t_first = (time.perf_counter() - t0) * 1e3
        c.close()
        return {"port_open_ms": round(t_connect, 1), "first_token_ms": round(t_first, 1)}
    finally:
        proc.terminate()
        proc.wait(20)


def cold_stdio():
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "reflex_ipc", "stdio", "--device", "cpu"], env=env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        proc.stdin.write(json.dumps({"op": "generate", "prompt": PROMPT, "max_tokens": 1,
                                     "stream": True}).encode() + b"\n")
        proc.stdin.flush()
        while True:
            ev = json.loads(proc.stdout.readline())
            if ev["event"] == "token":
                break
        return {"first_token_ms": round((time.perf_counter() - t0) * 1e3, 1)}
    finally:
        proc.stdin.close()
        proc.wait(20)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--cold-runs", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--endpoints", default="completions",
                    help="comma-separated, of: " + ", ".join(ENDPOINTS) + " (the first is the headline figure)")
    ap.add_argument("--base", default=None, help="another source tree whose front is measured beside this "
                                                 "one's, on the same engine, alternated")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-cold", action="store_true", help="skip the cold-start part")
    a = ap.parse_args()
    base = os.path.abspath(a.base) if a.base else None
    from reflex_ipc.commands.bench import cpu_model

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    res = {"machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "python": sys.version.split()[0],
                       "commit": commit, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "loadavg_before": os.getloadavg(), "uptime_before": uptime()},
           "request": {"op": "generate", "prompt": PROMPT, "max_tokens": 1, "model": "smollm2", "device": "cpu"}}
    endpoints = a.endpoints.split(",")
    res["base"] = base
    res["latency"] = latency(a.samples, a.warmup, endpoints[0], base, a.rounds)
    res["endpoints"] = {e: latency(a.samples, a.warmup, e, base, a.rounds) for e in endpoints[1:]}
    for e, r in [(endpoints[0], res["latency"]), *res["endpoints"].items()]:
        print(f"{e}: added p50 {r['added_p50_ms']} ms (p10 front {r['front']['overhead_ms']['p10']} vs direct "
              f"{r['direct']['overhead_ms']['p10']}), front CPU per request {r['front_cpu_ms_per_request']} ms" +
              (f"; base: added p50 {r['base_added_p50_ms']} ms (p10 {r['base']['overhead_ms']['p10']}), CPU "
               f"{r['base_cpu_ms_per_request']} ms" if base else ""), flush=True)
    if a.no_cold:
        res["machine"]["loadavg_after"] = os.getloadavg()
        res["machine"]["uptime_after"] = uptime()
        return _write(a, res, commit)
    cold = {"front": [], "stdio": []}
    cold_front()  # warm the page cache and bytecode once for both
    for _ in range(a.cold_runs):
        cold["front"].append(cold_front())
        cold["stdio"].append(cold_stdio())
    res["cold"] = {"runs": cold,
                   "front_first_token_ms": summary([r["first_token_ms"] for r in cold["front"]]),
                   "front_port_open_ms": summary([r["port_open_ms"] for r in cold["front"]]),
                   "stdio_first_token_ms": summary([r["first_token_ms"] for r in cold["stdio"]])}
    res["cold"]["front_vs_stdio_p50"] = round(res["cold"]["front_first_token_ms"]["p50"]
                                              / res["cold"]["stdio_first_token_ms"]["p50"], 3)
    res["machine"]["loadavg_after"] = os.getloadavg()
    res["machine"]["uptime_after"] = uptime()
    path = _write(a, res, commit)
    lat = res["latency"]
    print(f"added latency p50 {lat['added_p50_ms']} ms (front overhead {lat['front']['overhead_ms']['p50']} ms, "
          f"direct {lat['direct']['overhead_ms']['p50']} ms; wall p50 {lat['front']['wall_ms']['p50']} vs "
          f"{lat['direct']['wall_ms']['p50']} ms); front CPU per request {lat['front_cpu_ms_per_request']} ms")
    print(f"cold -> first token: front {res['cold']['front_first_token_ms']['p50']} ms, stdio "
          f"{res['cold']['stdio_first_token_ms']['p50']} ms ({res['cold']['front_vs_stdio_p50']}x); "
          f"load {res['machine']['loadavg_before']} -> {res['machine']['loadavg_after']}")
    print(path)


def _write(a, res, commit):
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, f"http_front-{time.strftime('%Y-%m-%d')}-{commit or 'nocommit'}.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print(path)
    return path


if __name__ == "__main__":
    main()
