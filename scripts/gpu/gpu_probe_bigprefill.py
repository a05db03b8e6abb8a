#!/usr/bin/env python3
"""Issue 27: where a big MoE model's warm prefill and decode time goes, in one process.

    REFLEX_PROFILE=1 PYTHONPATH=CHECKOUT python3 scripts/gpu/gpu_probe_bigprefill.py MODEL.gguf OUT.json [--runs 8]

1. load (the CUDA backend, weights streamed as in a cold start), then 512-token prefills
   (prompt_logits, a new prompt each time) right away: what a warm-up sees while the rest of
   the file still uploads behind it;
2. ops.wait_uploads(), then --runs prefills: the steady state (what llama-bench's pp512
   measures, after its load), wall per run, then one profiled per kernel (CUDA events);
3. system1 with 3 candidates on a ~500-token prompt (a new one each run), warm, per phase;
4. decode: 64 tokens (best of 3, ms/token); with REFLEX_CUDA_GRAPH=0 (eager launches) also
   16 tokens profiled per kernel (run the probe twice for both).
Writes OUT.json and prints a short table.
"""

import argparse
import json
import os
import statistics
import sys
import time

from reflex_ipc.engine import load_runner
from reflex_ipc.testing.breakdown import prefill_ids


def timed_prefill(r, ids):
    t0 = time.perf_counter()
    r.prompt_logits(ids)
    getattr(r.ops, "synchronize", lambda: None)()
    return round((time.perf_counter() - t0) * 1e3, 2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--device", default="cuda", help="cpu/numpy: a dry run off the GPU")
    a = ap.parse_args()
    rep = {"model": os.path.basename(a.model), "tokens": a.tokens,
           "env": {k: v for k, v in os.environ.items() if k.startswith("REFLEX_")}}
    t0 = time.perf_counter()
    r = load_runner(a.model, device=a.device)
    rep["load_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
    nv = r.model.hp.n_vocab
    prof = getattr(getattr(r.ops, "rt", None), "profiler", None)
    rep["while_streaming_ms"] = [timed_prefill(r, prefill_ids(nv, a.tokens, 100 + j)) for j in range(2)]
    t1 = time.perf_counter()
    getattr(r.ops, "wait_uploads", lambda: None)()
    rep["wait_uploads_ms"] = round((time.perf_counter() - t1) * 1e3, 1)
    rep["steady_ms"] = [timed_prefill(r, prefill_ids(nv, a.tokens, j)) for j in range(a.runs)]
    med = statistics.median(rep["steady_ms"])
    rep["steady_p50_ms"] = med
    rep["steady_tok_s"] = round(a.tokens / (med / 1e3), 1)
    if prof is not None:
        prof.window()
        r.prompt_logits(prefill_ids(nv, a.tokens, 999))
        rep["prefill_profile"] = prof.report(top=30)
    # issue 27 target 5: warm system1 x3 with a ~500-token prompt, a new prompt each time
    # (cache_prompt off: the whole prompt evaluated), per phase from its timings
    from reflex_ipc.commands.bench import prefill_prompt

    rows = []
    for j in range(a.runs + 1):
        t0 = time.perf_counter()
        res = r.system1(prefill_prompt(500, 50 + j), [" Paris", " London", " Berlin"], cache_prompt=False)
        wall = (time.perf_counter() - t0) * 1e3
        if j:  # the first is a warm-up
            rows.append({"wall_ms": round(wall, 2), "prompt_tokens": res["prompt_tokens"],
                         **{k: v for k, v in res["timings"].items() if isinstance(v, (int, float))}})
    rep["system1_500"] = {"runs": rows, "wall_p50_ms": statistics.median(x["wall_ms"] for x in rows),
                          "phase_p50_ms": {k: statistics.median(x[k] for x in rows if k in x)
                                           for k in ("tokenize", "prompt_eval", "candidates_eval", "total")}}
    best = None
    r.generate("The capital of France is", max_tokens=8, stop=[], temperature=0)
    for _ in range(3):
        res = r.generate("The capital of France is", max_tokens=65, stop=[], temperature=0)
        n = len(res["token_ids"]) - 1
        ms = res["timings"]["decode"] / max(1, n)
        best = ms if best is None else min(best, ms)
    rep["decode_ms_per_token"] = round(best, 4)
    rep["decode_tok_s"] = round(1e3 / best, 1)
    rep["graphs"] = bool(getattr(r.ops, "graphs", False))
    if prof is not None and not rep["graphs"]:  # per kernel only when launches are eager
        prof.window()
        res = r.generate("The capital of France is", max_tokens=17, stop=[], temperature=0)
        d = prof.report(top=30)
        n = max(1, len(res["token_ids"]) - 1)
        rep["decode_profile_per_token"] = {"kernels": round(d["kernels"] / n, 1),
                                           **{k: round(d[k] / n, 4) for k in ("gpu_ms", "span_ms", "idle_ms",
                                                                               "launch_host_ms")},
                                           "by_kernel": {k: [v[0] / n, round(v[1] / n, 4)]
                                                         for k, v in d["by_kernel"].items()}}
    with open(a.out, "w") as fh:
        json.dump(rep, fh, indent=1)
    print(f"{rep['model']}: load {rep['load_ms']} ms; prefill {a.tokens} while streaming "
          f"{rep['while_streaming_ms']} ms; wait_uploads {rep['wait_uploads_ms']} ms; steady {rep['steady_ms']} "
          f"(p50 {med} ms = {rep['steady_tok_s']} tok/s); decode {rep['decode_tok_s']} tok/s")
    s1 = rep["system1_500"]
    print(f"system1 x3, {s1['runs'][0]['prompt_tokens']}-token prompt, warm: p50 {s1['wall_p50_ms']:.1f} ms; "
          f"phases p50 {s1['phase_p50_ms']}")
    p = rep.get("prefill_profile")
    if p:
        print(f"profiled prefill: {p['kernels']} kernels, GPU {p['gpu_ms']:.1f} ms, span {p['span_ms']:.1f}, "
              f"idle {p['idle_ms']:.1f}, host in launches {p['launch_host_ms']:.1f}")
        for k, (n, ms) in list(p["by_kernel"].items())[:14]:
            print(f"  {k:<36} {n:>5} {ms:>9.3f} ms")
    d = rep.get("decode_profile_per_token")
    if d:
        print(f"eager decode per token: {d['kernels']} kernels, GPU {d['gpu_ms']:.3f} ms, span {d['span_ms']:.3f}")
        for k, (n, ms) in list(d["by_kernel"].items())[:12]:
            print(f"  {k:<36} {n:>7.1f} {ms:>9.4f} ms")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
