#!/usr/bin/env python3
"""Issue 28 on the GPU host: cold starts with REFLEX_START=gpu (the CUDA-only start, as before)
against the default (the start rule: the cpu backend answers while CUDA comes up, or moves
to it mid-generation, or waits for it), alternating run by run, under a time budget.

    scripts/gpu/gpu-bench-cpufirst OUT [--budget-s 330] [--runs 6] [--llama-simple P]

Cases (each a fresh `reflex ... --json --device auto` process per run; the two variants and
llama-simple alternate, who goes first alternating too):

  q8_0 / q4k (the Qwen3-0.6B shapes of make_gguf.py qwen3-shaped):
    gen1     generate --max-tokens 1                       (target: <= 200 ms p50, >= 4.5x llama-simple)
    system1  system1, 3 candidates                         (target: <= 200 ms p50)
    gen32    generate --max-tokens 32                      (target: never slower than gpu)
  8b (make_shaped.py qwen3-8b, Q4_K):
    gen32    the rule must pick the GPU                    (target: within noise of gpu)
    gen1     where the crossover lies (the rule's pick against both variants measured)

Per run: spawn->exit, spawn->first byte on stdout, NVML energy above idle to exit and to the
first byte (reflex_ipc/commands/bench.py's timed_process: the counter read at its steps, idle
power subtracted; a 0.25 s tail so a detached teardown counts), the result's phase marks, its
`start` (where it ran: the rule's choice and estimates, each step's backend, the hand-over)
and the CLI's early decision (`timings.start_early`). Writes OUT/cpufirst.json (rewritten
after every case), prints a table last. --device numpy|cpu, --python python3, --tiny and the
fake peers (tests/data/fake-peers) make a dry run anywhere (scripts/gpu/README-bench.md).
"""

import argparse
import json
import os
import shlex
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPT = "The capital of France is"
CANDIDATES = (" Paris", " London", " Berlin")
VARIANTS = ("gpu", "auto")  # REFLEX_START
CASES = [("q8_0", "gen1"), ("q8_0", "system1"), ("q8_0", "gen32"),
         ("q4k", "gen1"), ("q4k", "system1"), ("q4k", "gen32"),
         ("8b", "gen32"), ("8b", "gen1")]
TARGETS = {"gen1": "<= 200 ms, >= 4.5x llama-simple", "system1": "<= 200 ms",
           "gen32": "auto <= gpu", "8b gen32": "auto within noise of gpu", "8b gen1": "(crossover)"}


def reflex_argv(a, model, case):
    base = [a.python, "-m", "reflex_ipc"]
    if case == "system1":
        cands = [x for c in CANDIDATES for x in ("--candidate", c)]
        return base + ["system1", "--json", "--device", a.device, "--model", model, PROMPT, *cands]
    n = "32" if case == "gen32" else "1"
    return base + ["generate", "--json", "--max-tokens", n, "--device", a.device, "--model", model, PROMPT]


def peer_cmd(a, model, case):
    if not a.llama_simple or case == "system1":
        return None
    n = 32 if case == "gen32" else 1
    return f"{shlex.quote(a.llama_simple)} -m {shlex.quote(model)} -n {n} -ngl 99 {shlex.quote(PROMPT)}"


def one_run(argv, env, gpu, idle_w, shell=False):
    from reflex_ipc.commands.bench import timed_process

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        r, out, err = timed_process(argv, shell=shell, gpu=gpu if gpu.nv else None, idle_w=idle_w, tail_s=0.25)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if not shell:
        try:
            res = json.loads(out.decode().strip().splitlines()[-1])
        except (ValueError, IndexError):
            res = {}
        t = res.get("timings") or {}
        r["backend"] = res.get("backend")
        r["phases"] = t.get("phases")
        r["start_early"] = t.get("start_early")
        r["start"] = res.get("start")
        r["prompt_eval"] = t.get("prompt_eval")
        r["decode"] = t.get("decode")
        r["tokens"] = res.get("completion_tokens")
        r["choice"] = (res.get("start") or {}).get("choice") or (t.get("start_early") or {}).get("choice")
        if r["rc"] != 0:
            r["stderr_tail"] = err[-1500:]
    else:
        from reflex_ipc.commands.bench import parse_llama_simple

        r["llama_simple"] = parse_llama_simple(err) or None
    return r


def summarize(runs, idle_w):
    from reflex_ipc.commands.bench import mean_net_energy, spread, stats

    ok = [r for r in runs if r.get("rc") == 0]
    choices = {}
    for r in ok:
        c = r.get("choice") or "-"
        choices[c] = choices.get(c, 0) + 1
    phases = {}
    for r in ok:
        for k, v in (r.get("phases") or {}).items():
            phases.setdefault(k, []).append(v)
    est = {}
    for r in ok:
        e = (r.get("start") or {}).get("est_ms") or (r.get("start_early") or {}).get("est_ms") or {}
        for k, v in e.items():
            est.setdefault(k, []).append(v)
    return {"n": len(runs), "failures": len(runs) - len(ok),
            "wall_ms": stats([r["wall_ms"] for r in ok]), "first_byte_ms": stats([r.get("first_byte_ms") for r in ok]),
            "energy_net_j_mean": mean_net_energy(ok, idle_w),
            "energy_net_j": spread([r.get("energy_net_j") for r in ok]),
            "energy_first_net_j": spread([r.get("energy_first_net_j") for r in ok]),
            "choices": choices, "backends": sorted({r.get("backend") or "-" for r in ok}),
            "phases_p50": {k: (stats(v) or {}).get("p50") for k, v in phases.items()},
            "est_ms_p50": {k: (stats(v) or {}).get("p50") for k, v in est.items()}}


def paired(a_runs, b_runs):
    """p50 of b/a over the rounds where both ran."""
    from reflex_ipc.commands.bench import stats

    r = [b["wall_ms"] / a["wall_ms"] for a, b in zip(a_runs, b_runs) if a.get("rc") == 0 and b.get("rc") == 0]
    return stats(r)


def make_model(a, name, path):
    if os.path.exists(path) and a.keep_models:
        return {"path": path, "bytes": os.path.getsize(path), "reused": True}
    t0 = time.perf_counter()
    if name == "8b":
        from reflex_ipc.testing.shaped import write_model

        return write_model("qwen3-8b", path, tiny=a.tiny)
    if a.tiny:
        from reflex_ipc.testing.shaped import write_model

        return write_model("qwen3-0.6b", path, tiny=True)
    from reflex_ipc.testing.synthetic import qwen3_shaped

    qwen3_shaped(path, kind=name, vocab=os.path.join(ROOT, "scripts/fixtures/data/qwen2-vocab.npz"))
    return {"path": path, "bytes": os.path.getsize(path), "seconds": round(time.perf_counter() - t0, 2)}


def ensure_cpu_library():
    """The cpu backend's C library (an ignored build output: carried to the device, or built
    here when missing; the user venv copies it with reflex_ipc)."""
    import subprocess

    lib = os.path.join(ROOT, "reflex_ipc", "kernels", "libreflex_cpu.so")
    if os.path.exists(lib):
        return "present"
    subprocess.run([sys.executable, os.path.join(ROOT, "kernels", "cpu", "build.py")], cwd=ROOT, check=False,
                   env=dict(os.environ, REFLEX_CPU_BUILD="strict"))
    return "built" if os.path.exists(lib) else None


def table(res):
    lines = [f"{'model':6} {'case':8} {'variant':17} {'p50 ms':>8} {'1st B':>8} {'J/start':>8} {'auto/gpu':>8} "
             f"{'x peer':>7}  choices / est p50 (cpu, gpu, race ms)"]
    for key, c in res["cases"].items():
        model, case = key.split(":")
        for v in (*res.get("variants", VARIANTS), "llama-simple"):
            s = (c.get("summary") or {}).get(v)  # a case cut by the budget has none
            if not s:
                continue
            w = (s.get("wall_ms") or {}).get("p50")
            fb = (s.get("first_byte_ms") or {}).get("p50")
            e = s.get("energy_net_j_mean")
            ratio = (c.get("auto_over_gpu") or {}).get("p50") if v == "auto" else None
            xp = (c.get("peer_over_variant") or {}).get(v)
            est = s.get("est_ms_p50") or {}
            note = "" if v == "llama-simple" else \
                f" {s.get('choices')} ({est.get('cpu')}, {est.get('gpu')}, {est.get('race')})"

            def f(x, nd=1):
                return f"{x:8.{nd}f}" if isinstance(x, (int, float)) else f"{'-':>8}"
            lines.append(f"{model:6} {case:8} {('REFLEX_START=' + v) if v != 'llama-simple' else v:17} {f(w)} "
                         f"{f(fb)} {f(e, 2)} {f(ratio, 3)} {(f'{xp:7.2f}' if xp else '      -')}{note}")
        t = TARGETS.get(f"{model} {case}" if model == "8b" else case)
        if t:
            lines.append(f"{'':6} {'':8} target: {t}")
    marks = ("main_args_parsed", "numpy_imported", "gguf_open", "tokenizer", "backend_ready", "first_token")
    lines.append("phase marks, p50 ms after launch: " + ", ".join(marks))
    for key, c in res["cases"].items():
        for v, runs in c.get("runs", {}).items():
            ph = [r["phases"] for r in runs if r.get("phases")]
            if ph:
                med = [sorted(x.get(m) or 0 for x in ph)[len(ph) // 2] for m in marks]
                lines.append(f"  {key:14} {v:12} " + " ".join(f"{x:7.1f}" for x in med))
    lines.append(f"idle power {res.get('idle_power_w')} W; budget used {res.get('budget_used_s')} s of "
                 f"{res.get('budget_s')}; load avg {res.get('load_avg')}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--budget-s", type=float, default=330.0)
    ap.add_argument("--runs", type=int, default=6, help="runs per variant and case (fewer when the budget is short)")
    ap.add_argument("--cases", nargs="*", help="model:case, e.g. q8_0:gen1 8b:gen32 (default: all)")
    ap.add_argument("--device", default="auto", help="auto (the measurement); numpy or cpu for dry runs")
    ap.add_argument("--python", help="run reflex with this interpreter; default: the user venv")
    ap.add_argument("--venv", default="/tmp/reflex-venv")
    ap.add_argument("--models-dir", default="/tmp/models")
    ap.add_argument("--keep-models", action="store_true")
    ap.add_argument("--variants", nargs="*", choices=("gpu", "auto", "cpu", "race"),
                    help="REFLEX_START values to alternate (default: gpu auto)")
    ap.add_argument("--tiny", action="store_true", help="tiny models of the same layouts (dry runs)")
    ap.add_argument("--llama-simple", default=os.environ.get("LLAMA_SIMPLE") or None)
    a = ap.parse_args(argv)
    variants = tuple(a.variants or VARIANTS)
    from reflex_ipc.commands.bench import GPU, machine_info
    from reflex_ipc.testing.benchrun import Budget, ensure_venv, read_file

    t0 = time.monotonic()
    if ensure_cpu_library() == "built" and not a.python:
        try:  # a user venv made before the library existed lacks it (its stamp skips .so files)
            os.unlink(os.path.join(a.venv, "reflex-src.sha1"))
        except OSError:
            pass
    ensure_venv(a)
    budget = Budget(a.budget_s - (time.monotonic() - t0))
    out = os.path.abspath(a.out)
    os.makedirs(out, exist_ok=True)
    os.makedirs(a.models_dir, exist_ok=True)
    gpu = GPU()
    res = {"benchmark": "cpufirst", "variants": list(variants), "machine": machine_info(gpu),
           "budget_s": a.budget_s, "device": a.device,
           "python": a.python, "llama_simple": a.llama_simple, "prompt": PROMPT, "candidates": list(CANDIDATES),
           "setup_s": round(time.monotonic() - t0, 1), "cases": {}, "models": {},
           "cpu_library": os.path.exists(os.path.join(ROOT, "reflex_ipc", "kernels", "libreflex_cpu.so"))}
    res["idle_power_w"] = idle_w = gpu.idle_power_w(2.0) if gpu.nv else None
    path_json = os.path.join(out, "cpufirst.json")

    def save():
        res["budget_used_s"] = round(a.budget_s - budget.left(), 1)
        res["load_avg"] = [round(x, 2) for x in os.getloadavg()]
        with open(path_json + ".tmp", "w") as fh:
            json.dump(res, fh, indent=1)
        os.replace(path_json + ".tmp", path_json)

    cases = [tuple(c.split(":")) for c in a.cases] if a.cases else CASES
    models = {}
    for mi, (model, case) in enumerate(cases):
        key = f"{model}:{case}"
        rec = res["cases"][key] = {"runs": {v: [] for v in (*variants, "llama-simple")}}
        try:
            if model not in models:
                if budget.left() < (60 if model == "8b" else 20):
                    rec["skipped"] = "budget spent"
                    save()
                    continue
                for old in list(models):  # one model on disk at a time (the 8B is 5.4 GB)
                    if not a.keep_models and os.path.exists(models[old]):
                        os.unlink(models[old])
                    del models[old]
                p = os.path.join(a.models_dir, f"cpufirst-{model}{'-tiny' if a.tiny else ''}.gguf")
                info = make_model(a, model, p)
                info["page_cache_read"] = read_file(p)
                res["models"][model] = {k: v for k, v in info.items() if k != "path"}
                models[model] = p
                print(f"[{a.budget_s - budget.left():6.1f} s] model {model}: {info.get('bytes')} bytes",
                      file=sys.stderr, flush=True)
            path = models[model]
            argv_r = reflex_argv(a, path, case)
            peer = peer_cmd(a, path, case)
            rec["argv"], rec["peer"] = argv_r, peer
            env_base = {"PYTHONPATH": os.environ.get("PYTHONPATH", "")} if not getattr(a, "python_isolated", False) \
                else {}
            # the cases left share what the budget has left; a round is every variant once
            left_cases = len(cases) - mi
            t_case = time.monotonic()
            rnd = 0
            while rnd < a.runs:
                order = variants if rnd % 2 == 0 else variants[::-1]
                for v in order:
                    env = dict(env_base, REFLEX_START=v)
                    rec["runs"][v].append(one_run(argv_r, env, gpu, idle_w))
                if peer:
                    rec["runs"]["llama-simple"].append(one_run(peer, {}, gpu, idle_w, shell=True))
                rnd += 1
                per_round = (time.monotonic() - t_case) / rnd
                if rnd >= 3 and per_round * (a.runs - rnd) > (budget.left() - 5) / max(1, left_cases) - per_round:
                    rec["cut_at_rounds"] = rnd
                    break
                if budget.left() < per_round + 5:
                    rec["cut_at_rounds"] = rnd
                    break
            rec["summary"] = {v: summarize(r, idle_w) for v, r in rec["runs"].items() if r}
            if "gpu" in rec["runs"] and "auto" in rec["runs"]:
                rec["auto_over_gpu"] = paired(rec["runs"]["gpu"], rec["runs"]["auto"])
            if rec["runs"]["llama-simple"]:
                rec["peer_over_variant"] = {
                    v: (paired(rec["runs"][v], rec["runs"]["llama-simple"]) or {}).get("p50") for v in variants}
        except Exception as e:  # one case's failure must not lose the others
            rec["error"] = f"{type(e).__name__}: {e}"
        save()
        s = rec.get("summary") or {}
        print(f"[{a.budget_s - budget.left():6.1f} s] {key}: " + ", ".join(
            f"{v} {((s.get(v) or {}).get('wall_ms') or {}).get('p50')} ms" for v in s) +
              (f" ERROR {rec['error']}" if rec.get("error") else ""), file=sys.stderr, flush=True)
    for p in models.values():
        if not a.keep_models and os.path.exists(p):
            os.unlink(p)
    save()
    print(table(res))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    sys.exit(main())
