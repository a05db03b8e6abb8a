"""Calibrate the start rule's CPU side (reflex_ipc/startrule.py) on this machine.

For each model and thread count, in a fresh process per case (so that the first pass maps the
file's pages as a cold start does): the cpu backend's load (CpuOps + weight handles), the first
forward pass of P tokens (pages mapped on the way) and the same pass again (mapped), then warm
passes of P = 1, 2, 4, 8, 16, 32, 64 tokens (median of --reps) and decode steps (a captured
graph each). Each is timed by the wall clock and by the process's CPU time (all threads): on a
loaded machine the CPU time of a one-thread run is the figure that holds (the wall clock
counts the neighbours' time slices too).

The fit per model: pass(P) = a + b * P (least squares over the warm passes, CPU time, one
thread): a / W is the time to stream a weight byte (1 / bandwidth of one thread), b / W the
ns per weight byte and token of the int8 dot products; first_touch = first pass - mapped pass,
per byte. Then the kernel sets (REFLEX_CPU_ISA=avx2, generic) at P = 16, one thread, as ratios.

    python bench/startrule_calibrate.py --models smollm2 /tmp/q8_0.gguf /tmp/q4k.gguf \
        --threads 1 2 --out bench/results/startrule-cpu-<commit>.json
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PS = (1, 2, 4, 8, 16, 32, 64)

CHILD = r'''
import json, os, resource, statistics, sys, time
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
path, threads, reps, ps, only = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4]), sys.argv[5]
from reflex_ipc import phases
from reflex_ipc.engine import load_runner
from reflex_ipc.startrule import host
t0, c0 = time.perf_counter(), cpu()
r = load_runner(path, device="cpu", n_ctx=512)
r.ops.set_threads(threads)
ph = phases.snapshot()
from reflex_ipc.backends.cpu_ops import CpuOps
from reflex_ipc.models import load_model
t1, c1 = time.perf_counter(), cpu()
load_model(CpuOps(threads=threads), r.f)  # the backend and the weight handles (imports done)
handles = ((time.perf_counter() - t1) * 1e3, (cpu() - c1) * 1e3)
out = {"threads": r.ops.threads, "isa": r.ops.isa, "load_wall_ms": (time.perf_counter() - t0) * 1e3,
       "load_cpu_ms": (cpu() - c0) * 1e3, "host": host(),
       "backend_and_weights_wall_ms": ph["weights_loaded"] - ph["tokenizer"], "handles": handles}
ids = list(range(1000, 1000 + 64))
def timed(fn):
    t, c = time.perf_counter(), cpu()
    fn()
    return (time.perf_counter() - t) * 1e3, (cpu() - c) * 1e3
P0 = ps[0] if only == "isa" else 6
out["first_pass"] = timed(lambda: r.prompt_logits(ids[:P0]))
out["mapped_pass"] = timed(lambda: r.prompt_logits(ids[:P0]))
out["first_P"] = P0
if only != "isa":
    out["passes"] = {}
    for P in ps:
        xs = [timed(lambda: r.prompt_logits(ids[:P])) for _ in range(reps)]
        out["passes"][P] = {"wall_ms": statistics.median(x[0] for x in xs), "cpu_ms": statistics.median(x[1] for x in xs)}
    r.exec.use_graphs = True  # decode steps as the engine runs them: a captured graph replayed
    r.exec.prefill(ids[:8])
    tok = [5]
    def steps():
        for _ in range(16):
            r.exec.step(tok[0])
    r.exec.step(5)  # capture
    w, c = timed(steps)
    out["decode_step"] = {"wall_ms": w / 16, "cpu_ms": c / 16}
else:
    xs = [timed(lambda: r.prompt_logits(ids[:ps[0]])) for _ in range(reps)]
    out["isa_pass"] = {"P": ps[0], "wall_ms": statistics.median(x[0] for x in xs), "cpu_ms": statistics.median(x[1] for x in xs)}
print(json.dumps(out))
'''


def child(path, threads, reps, ps, only="", env=None):
    e = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    e.update(env or {})
    e.setdefault("REFLEX_CPU_GRAPH", "0")  # passes op by op, as a cold start's first pass runs
    p = subprocess.run([sys.executable, "-c", CHILD, path, str(threads), str(reps), json.dumps(list(ps)), only],
                       capture_output=True, text=True, env=e)
    if p.returncode:
        raise RuntimeError(p.stderr[-2000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def fit(points):
    """Least squares a + b x over (x, y) points."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - b * mx, b


def weight_bytes(path):
    sys.path.insert(0, ROOT)
    from reflex_ipc.gguffile import GGUFFile

    f = GGUFFile(path)
    untied = "output.weight" in f.tensors
    total = sum(t.nbytes for n, t in f.tensors.items() if not (untied and n == "token_embd.weight"))
    f.close()
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["smollm2"])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2, help="fresh processes per case (medians taken)")
    ap.add_argument("--out")
    a = ap.parse_args()
    sys.path.insert(0, ROOT)
    from reflex_ipc.modelpath import resolve_model

    res = {"benchmark": "startrule_calibrate", "load_avg_before": os.getloadavg(), "models": {},
           "machine": {"cpu": _cpu_name(), "nproc": os.cpu_count()}}
    for m in a.models:
        path = resolve_model(m)
        W = weight_bytes(path)
        rec = {"path": path, "weight_bytes": W, "runs": {}}
        for th in a.threads:
            runs = [child(path, th, a.reps, PS) for _ in range(a.rounds)]
            rec["runs"][th] = runs
        for isa in ("avx2", "generic"):
            rec["runs"][f"isa_{isa}"] = [child(path, 1, a.reps, [16], "isa", {"REFLEX_CPU_ISA": isa})
                                         for _ in range(a.rounds)]
        rec["fit"] = fit_model(rec, W)
        res["models"][m] = rec
        print(json.dumps({m: rec["fit"]}), flush=True)
    res["load_avg_after"] = os.getloadavg()
    res["summary"] = summary(res)
    print(json.dumps(res["summary"], indent=1))
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(res, fh, indent=1)


def _med(xs):
    return statistics.median(xs)


def fit_model(rec, W):
    out = {}
    for th, runs in rec["runs"].items():
        if str(th).startswith("isa_"):
            continue
        for clock in ("cpu_ms", "wall_ms"):
            pts = [(int(P), _med(r["passes"][P][clock] for r in runs)) for P in runs[0]["passes"]]
            a, b = fit(pts)
            i = 1 if clock == "cpu_ms" else 0  # first/mapped passes are (wall, cpu)
            key = f"t{th}_{clock[:-3]}"
            first = _med(r["first_pass"][i] for r in runs)
            mapped = _med(r["mapped_pass"][i] for r in runs)
            out[key] = {"a_ms": round(a, 3), "b_ms_per_token": round(b, 4),
                        "bw_GBps": round(W / (a / 1e3) / 1e9, 2) if a > 0 else None,
                        "ns_per_byte_token": round(b * 1e6 / W, 4),
                        "first_touch_ns_per_byte": round((first - mapped) * 1e6 / W, 4),
                        "decode_step_ms": round(_med(r["decode_step"][clock] for r in runs), 3),
                        "load_ms": round(_med(r[f"load_{clock[:-3]}_ms"] for r in runs), 2),
                        "handles_ms": round(_med(r["handles"][i] for r in runs), 2),
                        "first_load_wall_ms": round(_med(r["backend_and_weights_wall_ms"] for r in runs), 2)}
    base = _med(r["passes"]["16"]["cpu_ms"] for r in rec["runs"][1]) if 1 in rec["runs"] else None
    for isa in ("avx2", "generic"):
        runs = rec["runs"].get(f"isa_{isa}")
        if runs and base:
            out[f"isa_{isa}_over_auto_P16_cpu"] = round(_med(r["isa_pass"]["cpu_ms"] for r in runs) / base, 3)
    return out


def summary(res):
    """Across models (one thread, CPU time): the medians of the per-byte coefficients."""
    fits = [m["fit"] for m in res["models"].values()]
    t1 = [f["t1_cpu"] for f in fits if "t1_cpu" in f]
    if not t1:
        return {}
    return {"one_thread_cpu": {k: _med(x[k] for x in t1 if x[k] is not None)
                               for k in ("bw_GBps", "ns_per_byte_token", "first_touch_ns_per_byte")},
            "isa_avx2_over_auto": _med(f["isa_avx2_over_auto_P16_cpu"] for f in fits if "isa_avx2_over_auto_P16_cpu" in f),
            "isa_generic_over_auto": _med(f["isa_generic_over_auto_P16_cpu"] for f in fits
                                          if "isa_generic_over_auto_P16_cpu" in f)}


def _cpu_name():
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


if __name__ == "__main__":
    main()
