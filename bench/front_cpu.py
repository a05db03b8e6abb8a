"""Benchmark: the HTTP front's own CPU time per request, endpoint by endpoint, with the
engine's time taken out, optionally A/B between two source trees.

A real `reflex uds` engine (SmolLM2, CPU) answers each endpoint's engine request once; its
lines (ready, load, the results) are recorded, and a replay engine answers every later
request with the recorded line at once (its id swapped in). Two measures, each on N
requests per endpoint over a kept-alive HTTP/1.1 connection (stdlib http.client):

* process: a `reflex http --connect REPLAY` process; its CPU time (all threads, user +
  system, /proc/PID/task/*/schedstat) per request. What the front costs on this machine,
  context switches and cold caches included (inflated by a loaded machine).
* inproc: one process runs the front's uvicorn server on its main thread, the replay
  engine and the HTTP client on two other threads; the main thread's CPU time per
  request (schedstat of that thread). The same code path (uvicorn, Starlette, the
  mapping, reflex_client, the socket calls) with the two peers in the same process, so
  far fewer cold-cache switches: the figure an idle machine approaches.

Rounds alternate the trees (A B A B ...) and, within a round, the endpoints.

    python bench/front_cpu.py [--samples N] [--rounds R] [--endpoints a,b,...]
        [--trees A,B]          # source trees to compare (default: this checkout)
        [--modes process,inproc]
        [--calls]              # also Python calls per request (cProfile, load-independent)
        [--profile]            # one process run of the first tree under cProfile: its top functions
        [--out DIR]            # write DIR/front_cpu-DATE-COMMIT.json
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import http_front as H  # noqa: E402  (bench/http_front.py: endpoints, env, helpers)

ROOT = H.ROOT
# http_front put this checkout first on sys.path; the code measured is the PYTHONPATH's
# (a worker runs with the tree under test there)
if sys.path[0] == ROOT:
    del sys.path[0]


def tree_env(tree):
    e = dict(os.environ)
    e.pop("PYTHONDONTWRITEBYTECODE", None)
    e["PYTHONPATH"] = os.pathsep.join([tree, os.path.join(tree, "clients", "python")])
    return e


def record(endpoints):
    """{"ready": line, "results": {op: result line}} from a real engine (this checkout)."""
    d = tempfile.mkdtemp(prefix="reflex-frontcpu-")
    path = os.path.join(d, "engine.sock")
    eng = subprocess.Popen([sys.executable, "-m", "reflex_ipc", "uds", path, "--device", "cpu",
                            "--model", "smollm2"], env=H.env(), stderr=subprocess.DEVNULL)
    try:
        while not os.path.exists(path):
            time.sleep(0.02)
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        f = s.makefile("rb")
        ready = json.loads(f.readline())
        out = {}
        for e in ["load", *endpoints]:
            op, params = ("load", {}) if e == "load" else H.ENDPOINTS[e][2]
            s.sendall(json.dumps({"id": 1, "op": op, **params}).encode() + b"\n")
            while True:
                ev = json.loads(f.readline())
                if ev["event"] == "result":
                    break
            assert ev["ok"], ev
            out.setdefault(op, ev)
        s.close()
        return {"ready": ready, "results": out}
    finally:
        eng.terminate()
        eng.wait(20)


class Replay:
    """A uds engine that answers every request line with the recorded result of its op."""

    def __init__(self, path, rec):
        self.ready = json.dumps(rec["ready"]).encode() + b"\n"
        self.by_op = rec["results"]
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(path)
        self.sock.listen(4)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            conn, _ = self.sock.accept()
            threading.Thread(target=self._conn, args=(conn,), daemon=True).start()

    def _conn(self, conn):
        conn.sendall(self.ready)
        f = conn.makefile("rb")
        for line in f:
            req = json.loads(line)
            ev = dict(self.by_op.get(req.get("op")) or {"event": "result", "ok": False, "error": {
                "kind": "invalid_request", "message": "not recorded"}})
            ev["id"] = req.get("id")
            conn.sendall(json.dumps(ev).encode() + b"\n")


def task_cpu_ms(pid, tid=None):
    tids = [tid] if tid is not None else os.listdir(f"/proc/{pid}/task")
    total = 0
    for t in tids:
        with open(f"/proc/{pid}/task/{t}/schedstat") as f:
            total += int(f.read().split()[0])
    return total / 1e6


class Sender:
    def __init__(self, port, endpoints):
        deadline = time.time() + 120
        while True:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            assert time.time() < deadline, "the front did not come up"
            time.sleep(0.05)
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.bodies = {e: (H.ENDPOINTS[e][0], json.dumps(H.ENDPOINTS[e][1]).encode()) for e in endpoints}

    def send(self, e):
        path, body = self.bodies[e]
        self.conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        r = self.conn.getresponse()
        data = r.read()
        assert r.status == 200, data

    def run(self, endpoints, samples, warmup, cpu):
        """{endpoint: (cpu ms per request, wall p50 ms)}; cpu() reads the measured CPU time."""
        out = {}
        for e in endpoints:
            for _ in range(warmup):
                self.send(e)
            walls = []
            c0 = cpu()
            for _ in range(samples):
                t0 = time.perf_counter()
                self.send(e)
                walls.append((time.perf_counter() - t0) * 1e3)
            out[e] = (round((cpu() - c0) / samples, 4), round(statistics.median(walls), 3))
        return out


def run_process(tree, rec_path, endpoints, samples, warmup, profile=None):
    """The process measure for one tree: a `reflex http --connect` on a replay engine."""
    with open(rec_path) as f:
        rec = json.load(f)
    d = tempfile.mkdtemp(prefix="reflex-frontcpu-")
    replay = os.path.join(d, "replay.sock")
    Replay(replay, rec)
    port = H.free_port()
    argv = ["http", "--connect", replay, "--port", str(port)]
    if profile:
        code = ("import cProfile, sys\nfrom reflex_ipc.cli import main\npr = cProfile.Profile()\npr.enable()\n"
                f"try:\n    main({argv!r})\nfinally:\n    pr.disable()\n    pr.dump_stats({profile!r})\n")
        cmd = [sys.executable, "-c", code]
    else:
        cmd = [sys.executable, "-m", "reflex_ipc", *argv]
    front = subprocess.Popen(cmd, env=tree_env(tree), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        s = Sender(port, endpoints)
        res = s.run(endpoints, samples, warmup, lambda: task_cpu_ms(front.pid))
        s.conn.close()
        front.send_signal(signal.SIGINT)
        front.wait(30)
        return res
    finally:
        if front.poll() is None:
            front.kill()


def worker(rec_path, endpoints, samples, warmup):
    """The inproc measure (run in a subprocess whose sys.path is the tree): uvicorn on the
    main thread, the replay engine and the client on others; prints the JSON result."""
    import asyncio

    with open(rec_path) as f:
        rec = json.load(f)
    d = tempfile.mkdtemp(prefix="reflex-frontcpu-")
    replay = os.path.join(d, "replay.sock")
    Replay(replay, rec)
    import uvicorn

    from reflex_ipc.front import app as A
    assert os.path.abspath(A.__file__).startswith(os.path.abspath(os.environ["PYTHONPATH"].split(os.pathsep)[0]))
    from reflex_ipc.front import engine as E

    front = A.Front(E.Engine(connect=replay))
    app = A.build_app(front)
    port = H.free_port()
    if hasattr(A, "uvicorn_config"):
        config = A.uvicorn_config(app, port=port)
    else:  # a tree from before the helper
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False,
                                lifespan="on", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    main_tid = threading.get_native_id()
    result = {}

    def client():
        try:
            s = Sender(port, endpoints)
            result.update(s.run(endpoints, samples, warmup, lambda: task_cpu_ms(os.getpid(), main_tid)))
            s.conn.close()
        finally:
            server.should_exit = True

    threading.Thread(target=client, daemon=True).start()
    server.run()
    print(json.dumps(result))
    del asyncio


def calls_worker(rec_path, endpoint, samples):
    """Python function calls (cProfile: calls of Python functions and of builtins) on the
    server thread over `samples` requests after the start-up; prints the JSON counts."""
    import cProfile
    import pstats

    pr = cProfile.Profile()
    pr.enable()
    worker(rec_path, [endpoint], samples, 0)
    pr.disable()
    py = builtin = 0
    for (fn, _, _), (_, nc, _, _, _) in pstats.Stats(pr).stats.items():
        if fn == "~":
            builtin += nc
        else:
            py += nc
    print(json.dumps({"python": py, "builtin": builtin}))


def count_calls(tree, rec_path, endpoint, low=200, high=1200):
    """Calls per request: the difference of two runs (high - low requests) / (high - low),
    so start-up and warm-up cancel. Load does not change it."""
    def run(n):
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--calls-worker", rec_path,
                            "--endpoints", endpoint, "--samples", str(n)],
                           env=tree_env(tree), capture_output=True, text=True, timeout=900, cwd="/")
        if p.returncode != 0:
            raise RuntimeError(p.stderr[-3000:])
        return json.loads(p.stdout.strip().splitlines()[-1])

    a, b = run(low), run(high)
    return {k: round((b[k] - a[k]) / (high - low), 1) for k in a}


def run_inproc(tree, rec_path, endpoints, samples, warmup):
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", rec_path, "--endpoints",
                        ",".join(endpoints), "--samples", str(samples), "--warmup", str(warmup)],
                       env=tree_env(tree), capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-3000:])
    return {k: tuple(v) for k, v in json.loads(p.stdout.strip().splitlines()[-1]).items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=300, help="requests per endpoint per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--endpoints", default="completions,classify,messages,responses")
    ap.add_argument("--trees", default=ROOT, help="comma-separated source trees, alternated")
    ap.add_argument("--modes", default="process,inproc")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--calls", action="store_true", help="also count Python calls per request (cProfile)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--calls-worker", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    endpoints = a.endpoints.split(",")
    if a.worker:
        return worker(a.worker, endpoints, a.samples, a.warmup)
    if a.calls_worker:
        return calls_worker(a.calls_worker, endpoints[0], a.samples)
    trees = [os.path.abspath(t) for t in a.trees.split(",")]
    modes = a.modes.split(",")
    d = tempfile.mkdtemp(prefix="reflex-frontcpu-")
    rec_path = os.path.join(d, "recorded.json")
    with open(rec_path, "w") as f:
        json.dump(record(endpoints), f)

    def commit_of(tree):
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True,
                              text=True).stdout.strip() or None

    res = {"machine": {"cores": os.cpu_count(), "python": sys.version.split()[0], "commit": commit_of(ROOT),
                       "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "uptime_before": H.uptime()},
           "trees": trees, "samples_per_round": a.samples, "rounds": a.rounds,
           "runs": {m: {t: {e: [] for e in endpoints} for t in trees} for m in modes}}
    try:
        from reflex_ipc.commands.bench import cpu_model

        res["machine"]["cpu"] = cpu_model()
    except Exception:  # noqa: BLE001
        pass
    if a.profile:
        prof = os.path.join(d, "front.prof")
        run_process(trees[0], rec_path, endpoints, a.samples, a.warmup, profile=prof)
        import pstats

        pstats.Stats(prof).sort_stats("tottime").print_stats(40)
        return
    for rnd in range(a.rounds):
        order = trees if rnd % 2 == 0 else trees[::-1]
        for mode in modes:
            for t in order:
                eps = endpoints if rnd % 2 == 0 else endpoints[::-1]
                out = (run_process if mode == "process" else run_inproc)(t, rec_path, eps, a.samples, a.warmup)
                for e, (cpu, wall) in out.items():
                    res["runs"][mode][t][e].append({"cpu_ms": cpu, "wall_p50_ms": wall})
                print(f"round {rnd} {mode:8s} {os.path.basename(t) or t}: " +
                      ", ".join(f"{e} {out[e][0]:.3f}" for e in endpoints), flush=True)
    if a.calls:
        res["calls_per_request"] = {t: {e: count_calls(t, rec_path, e) for e in endpoints} for t in trees}
        for t, per in res["calls_per_request"].items():
            print(f"calls    {t}: " + ", ".join(f"{e} {c['python']:.0f} Python + {c['builtin']:.0f} builtin"
                                             for e, c in per.items()))
    res["machine"]["uptime_after"] = H.uptime()
    res["summary"] = {m: {t: {e: {"cpu_ms_median": round(statistics.median(x["cpu_ms"] for x in v), 4),
                                  "cpu_ms_min": min(x["cpu_ms"] for x in v)}
                              for e, v in per.items()} for t, per in by.items()} for m, by in res["runs"].items()}
    for m, by in res["summary"].items():
        for t, per in by.items():
            print(f"{m:8s} {t}: " + ", ".join(f"{e} median {s['cpu_ms_median']:.3f} (min {s['cpu_ms_min']:.3f})"
                                               for e, s in per.items()))
    print(res["machine"]["uptime_before"], "->", res["machine"]["uptime_after"])
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        path = os.path.join(a.out, f"front_cpu-{time.strftime('%Y-%m-%d')}-{res['machine']['commit']}.json")
        with open(path, "w") as f:
            json.dump(res, f, indent=1)
        print(path)


if __name__ == "__main__":
    main()
