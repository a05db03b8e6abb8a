"""Where the time goes on the GPU host: warm requests, a 512-token prefill and a decode token,
per phase and per kernel (issue 19's breakdowns). Driven by scripts/gpu/gpu-breakdown.

    scripts/gpu/gpu-breakdown OUT [--models q8_0 q4k qwen35-2b] [--runs 30] [--variant ENV=V ...]

Per model (Qwen3-0.6B-shaped Q8_0 / Q4_K mix from synthetic.qwen3_shaped, or a shaped.py name),
each part a fresh child process with $REFLEX_PROFILE=1 (reflex_ipc/cuda/profile.py: CUDA
events around every launch, only inside a window, so unprofiled runs pay one None check):

- warm, in process (no JSON, no pipe): generate 1 token and system1 x3 with the same prompt
  and with a new prompt length each time: wall p50/min over --runs, then one profiled run of
  each: kernels launched, GPU busy, GPU span, idle (span - busy: the GPU waiting for the
  host), host time inside launch calls; a cProfile of the same-prompt generate (top functions);
- the same four requests through `reflex stdio` (the real path: parse, JSON, pipe): client ms
  and the server's own timings, so protocol + pipe = client - server total;
- prefill: prompt_logits of 512 tokens (a new prompt, empty state): wall p50 and per kernel;
- decode: 64 tokens with the captured graph (ms/token, GPU time per replay) and 16 eager
  tokens per kernel (REFLEX_CUDA_GRAPH=0, REFLEX_CPU_GRAPH=0): kernels per token and the GPU budget per token;
- llama-bench -p 512 -n 128 (pp512, tg128) on the same file, when $LLAMA_BENCH is set;
- each --variant (e.g. REFLEX_FLASH=0) reruns the in-process warm part, prefill and decode with it.

Writes OUT/NAME.json per model and prints a table last.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from reflex_ipc import settings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPT = "The capital of France is"
CANDS = [" Paris", " London", " Berlin"]
WORDS = "one two three four five six seven eight nine ten eleven twelve".split()


def _p50(xs):
    return round(statistics.median(xs), 4) if xs else None


def _stats(xs):
    return {"p50": _p50(xs), "min": round(min(xs), 4) if xs else None, "n": len(xs)}


def varied_prompt(i):
    return " ".join(WORDS[:i % len(WORDS) + 1]) + " " + PROMPT


# -- child parts (run inside the GPU process) ----------------------------------------------
class _NoProfiler:
    """Stands in off the GPU (the parts run on cpu in tests): no per-kernel figures."""

    def window(self):
        pass

    def report(self, top=0):
        return {"kernels": 0, "gpu_ms": 0.0, "span_ms": 0.0, "idle_ms": 0.0, "launch_host_ms": 0.0,
                "by_kernel": {}}


def _runner(path):
    from reflex_ipc.engine import load_runner

    device = settings.get().breakdown_device
    r = load_runner(path, device=device)
    # the figures are of resident weights (a streamed MoE file would still be uploading)
    getattr(r.ops, "wait_uploads", lambda: None)()
    prof = getattr(getattr(r.ops, "rt", None), "profiler", None)
    if prof is None:
        if device == "cuda":
            raise SystemExit("no profiler: run with REFLEX_PROFILE=1 on the cuda backend")
        prof = _NoProfiler()
    return r, prof


def _requests(r):
    return {
        "generate1_same": lambda i: r.generate(PROMPT, max_tokens=1),
        "generate1_new_length": lambda i: r.generate(varied_prompt(i), max_tokens=1),
        "system1x3_same": lambda i: r.system1(PROMPT, CANDS),
        "system1x3_new_length": lambda i: r.system1(varied_prompt(i), CANDS),
    }


def part_warm(path, runs):
    import cProfile
    import io
    import pstats

    r, prof = _runner(path)
    out = {}
    for name, fn in _requests(r).items():
        fn(0)
        fn(1)  # warm: kernels loaded, pools filled, graphs captured where they are
        walls = []
        for i in range(runs):
            t0 = time.perf_counter()
            fn(i + 2)
            walls.append((time.perf_counter() - t0) * 1e3)
        prof.window()
        t0 = time.perf_counter()
        res = fn(runs + 2)
        wall_prof = (time.perf_counter() - t0) * 1e3
        rep = prof.report(top=12)
        out[name] = {"wall_ms": _stats(walls), "profiled_wall_ms": round(wall_prof, 3),
                     "engine_timings": res.get("timings"), "gpu": rep}
    fn = _requests(r)["generate1_same"]
    pr = cProfile.Profile()
    pr.enable()
    for i in range(runs):
        fn(i)
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
    out["cprofile_generate1_same"] = {"runs": runs, "top_tottime": s.getvalue().splitlines()[:60]}
    return out


def prefill_ids(n_vocab, n_tokens, salt):
    """A synthetic prompt of n_tokens ids, a different one for each salt."""
    return [(17 * i + 100 + 31 * salt) % n_vocab for i in range(n_tokens)]


def part_prefill(path, runs, n_tokens=512):
    r, prof = _runner(path)
    n_vocab = r.model.hp.n_vocab
    walls = []
    for j in range(runs + 1):
        ids = prefill_ids(n_vocab, n_tokens, j)
        t0 = time.perf_counter()
        r.prompt_logits(ids)
        if j:
            walls.append((time.perf_counter() - t0) * 1e3)
    prof.window()
    ids = [(13 * i + 7) % n_vocab for i in range(n_tokens)]
    r.prompt_logits(ids)
    rep = prof.report(top=25)
    med = _p50(walls)
    return {"tokens": n_tokens, "wall_ms": _stats(walls), "tok_s": round(n_tokens / (med / 1e3), 1),
            "gpu": rep}


def part_decode(path, n_graph=64, n_eager=16):
    r, prof = _runner(path)
    r.generate(PROMPT, max_tokens=8, stop=[], temperature=0)
    best = None
    for _ in range(3):
        res = r.generate(PROMPT, max_tokens=n_graph + 1, stop=[], temperature=0)
        n = len(res["token_ids"]) - 1
        ms = res["timings"]["decode"] / max(1, n)
        best = ms if best is None else min(best, ms)
    prof.window()
    res = r.generate(PROMPT, max_tokens=n_eager + 1, stop=[], temperature=0)
    rep = prof.report(top=30)
    n = max(1, len(res["token_ids"]) - 1)
    return {"ms_per_token": round(best, 4), "tokens_per_s": round(1e3 / best, 1),
            "graph": bool(getattr(r.ops, "graphs", False)),
            "profiled_tokens": n, "per_token": {k: round(rep[k] / n, 4) for k in ("gpu_ms", "span_ms", "idle_ms",
                                                                                    "launch_host_ms")},
            "kernels_per_token": round(rep["kernels"] / n, 1), "gpu": rep}


def child_main(part, path, runs):
    fn = {"warm": lambda: part_warm(path, runs), "prefill": lambda: part_prefill(path, 5),
          "decode": lambda: part_decode(path)}[part]
    print("RESULT " + json.dumps(fn()), flush=True)


# -- parent ---------------------------------------------------------------------------------
def run_child(part, path, runs, env_extra=None, timeout=240):
    env = {**os.environ, "REFLEX_PROFILE": "1", **(env_extra or {})}
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "reflex_ipc.testing.breakdown", "--child", part, path,
                        "--runs", str(runs)], capture_output=True, text=True, env=env, timeout=timeout)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[7:])
            r["seconds"] = round(time.monotonic() - t0, 2)
            return r
    return {"error": f"rc {p.returncode}", "stderr": p.stderr[-3000:]}


def stdio_requests(path, runs):
    """The four warm requests through `reflex stdio`: client ms and the server's timings."""
    argv = [sys.executable, "-m", "reflex_ipc", "stdio", "--device", settings.get().breakdown_device,
            "--model", path]
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=dict(os.environ))
    ready = json.loads(p.stdout.readline())
    n = [0]

    def req(op, **params):
        n[0] += 1
        line = json.dumps({"id": n[0], "op": op, **params}).encode() + b"\n"
        t0 = time.perf_counter()
        p.stdin.write(line)
        p.stdin.flush()
        while True:
            msg = json.loads(p.stdout.readline())
            if msg.get("event") == "result":
                return (time.perf_counter() - t0) * 1e3, msg

    kinds = {
        "generate1_same": lambda i: req("generate", prompt=PROMPT, max_tokens=1),
        "generate1_new_length": lambda i: req("generate", prompt=varied_prompt(i), max_tokens=1),
        "system1x3_same": lambda i: req("system1", prompt=PROMPT, candidates=CANDS),
        "system1x3_new_length": lambda i: req("system1", prompt=varied_prompt(i), candidates=CANDS),
    }
    out = {"ready": ready.get("timings") or ready}
    try:
        for name, fn in kinds.items():
            fn(0)
            fn(1)
            client, server = [], {}
            for i in range(runs):
                ms, msg = fn(i + 2)
                if not msg.get("ok"):
                    out[name] = {"error": msg.get("error")}
                    break
                client.append(ms)
                for k, v in (msg.get("timings") or {}).items():
                    if isinstance(v, (int, float)):
                        server.setdefault(k, []).append(v)
            else:
                tot = server.get("total") or []
                out[name] = {"client_ms": _stats(client), "server_ms": {k: _p50(v) for k, v in server.items()},
                             "protocol_and_pipe_ms": _p50([c - t for c, t in zip(client, tot)])}
    finally:
        p.stdin.close()
        p.wait(timeout=60)
    return out


def make_model(name, models_dir):
    if name.endswith(".gguf") and os.path.exists(name):
        return name
    os.makedirs(models_dir, exist_ok=True)
    path = os.path.join(models_dir, f"bd-{name}.gguf")
    if os.path.exists(path):
        return path
    if name in ("q8_0", "q4k"):
        from reflex_ipc.testing.synthetic import qwen3_shaped

        qwen3_shaped(path, kind=name, vocab=os.path.join(ROOT, "scripts/fixtures/data/qwen2-vocab.npz"))
    else:
        from reflex_ipc.testing.shaped import write_model

        write_model(name, path)
    return path


def llama_bench(path, timeout=180):
    lb = os.environ.get("LLAMA_BENCH")
    if not lb:
        return {"error": "no $LLAMA_BENCH"}
    from reflex_ipc.testing.benchrun import llama_bench_figures, parse_llama_bench

    argv = [lb, "-m", path, "-p", "512", "-n", "128", "-ngl", "99", "-r", "3", "-o", "json"]
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": "timeout"}
    return {"argv": argv, "rc": p.returncode, "figures": llama_bench_figures(parse_llama_bench(p.stdout))}


def machine_info():
    import platform

    from reflex_ipc.commands.bench import GPU

    return {"gpu": GPU().info(), "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def table(results):
    rows = [("model", "gen1 same", "gen1 new", "sys1 same", "sys1 new", "kern/gen1", "idle/gen1",
             "pp512 ms", "pp tok/s", "l-pp", "dec ms/t", "l-tg", "idle/tok")]
    for name, r in results.items():
        w = r.get("warm") or {}
        s = r.get("stdio") or {}

        def c(k):
            v = (s.get(k) or {}).get("client_ms") or {}
            return v.get("p50")

        g = (w.get("generate1_same") or {}).get("gpu") or {}
        pf = r.get("prefill") or {}
        de = r.get("decode_eager") or {}
        dg = r.get("decode") or {}
        lb = ((r.get("llama_bench") or {}).get("figures") or {})
        rows.append((name, c("generate1_same"), c("generate1_new_length"), c("system1x3_same"),
                     c("system1x3_new_length"), g.get("kernels"), g.get("idle_ms"),
                     (pf.get("wall_ms") or {}).get("p50"), pf.get("tok_s"),
                     round((lb.get("pp") or {}).get("avg_ts") or 0, 1), dg.get("ms_per_token"),
                     round((lb.get("tg") or {}).get("avg_ts") or 0, 1),
                     (de.get("per_token") or {}).get("idle_ms")))
        for var, vr in (r.get("variants") or {}).items():
            vw = vr.get("warm") or {}

            def wv(k):
                return ((vw.get(k) or {}).get("wall_ms") or {}).get("p50")

            rows.append((f"  {var} (in process)", wv("generate1_same"), wv("generate1_new_length"), wv("system1x3_same"),
                         wv("system1x3_new_length"), "", "", ((vr.get("prefill") or {}).get("wall_ms") or {}).get("p50"),
                         (vr.get("prefill") or {}).get("tok_s"), "", (vr.get("decode") or {}).get("ms_per_token"),
                         "", ""))
    return "\n".join(" | ".join(str(x) for x in row) for row in rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?")
    ap.add_argument("--models", nargs="+", default=["q8_0", "q4k", "qwen35-2b"])
    ap.add_argument("--models-dir", default="/tmp/models")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--variant", action="append", default=[], help="ENV=VALUE: rerun prefill and decode with it")
    ap.add_argument("--child", nargs=2, metavar=("PART", "MODEL"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        return child_main(a.child[0], a.child[1], a.runs)
    if not a.out:
        ap.error("OUT is needed")
    os.makedirs(a.out, exist_ok=True)
    results = {}
    machine = machine_info()
    for model in a.models:
        name = os.path.basename(model)[:-5] if model.endswith(".gguf") else model
        t0 = time.monotonic()
        path = make_model(model, a.models_dir)
        rec = {"model": name, "path": path, "bytes": os.path.getsize(path),
               "commit": settings.get().commit, "runs": a.runs, "machine": machine}
        results[name] = rec
        steps = [("warm", lambda: run_child("warm", path, a.runs)),
                 ("stdio", lambda: stdio_requests(path, a.runs)),
                 ("prefill", lambda: run_child("prefill", path, a.runs)),
                 ("decode", lambda: run_child("decode", path, a.runs)),
                 ("decode_eager", lambda: run_child("decode", path, a.runs, {"REFLEX_CUDA_GRAPH": "0",
                                                                                  "REFLEX_CPU_GRAPH": "0"})),
                 ("llama_bench", lambda: llama_bench(path))]
        for step, fn in steps:
            try:
                rec[step] = fn()
            except Exception as e:  # noqa: BLE001  (one failing step is recorded; the rest goes on)
                rec[step] = {"error": repr(e)}
            print(f"[{time.monotonic() - t0:6.1f} s] {name} {step}", file=sys.stderr, flush=True)
            with open(os.path.join(a.out, f"{name}.json"), "w") as fh:
                json.dump(rec, fh, indent=1)
        rec["variants"] = {}
        for var in a.variant:
            k, _, v = var.partition("=")
            rec["variants"][var] = {part: run_child(part, path, a.runs, {k: v})
                                    for part in ("warm", "prefill", "decode")}
        with open(os.path.join(a.out, f"{name}.json"), "w") as fh:
            json.dump(rec, fh, indent=1)
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
