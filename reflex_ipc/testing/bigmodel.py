"""Issue 27 on the GPU host in one command: big models (MoE, MLA, hybrid) against llama.cpp.

    scripts/gpu/gpu-bigmodel OUT [--budget-s 470] [--device cuda|numpy] [--tiny] [--python PY]
                             [--models qwen3-30b-a3b deepseek-v2-lite qwen35-2b]
                             [--llama-simple P] [--llama-bench P] [--skip checks engine bench]

In order, each part's result written to OUT/bigmodel.json as it ends (a failing part is
recorded and the rest goes on), a table last:

1. checks: the kernels of the prefill forms against float64 numpy on random inputs
   (opchecks.check_moe_grouped: the grouped tensor-core MoE GEMMs; check_mla_prefill: the
   decompressed latent attention; check_flash_attention: flash.cuh with the 192/128 heads
   beside the others; check_moe, check_moe_mv, check_mla: the decode forms), and bench_moe's crossover
   sweep (grouped vs one matvec per pair at 8-512 tokens, Qwen3-30B-A3B and DeepSeek-V2-Lite
   layer shapes), on the backend of --device;
2. engine: small qwen3moe, deepseek2, gpt-oss and llama4 GGUFs (synthetic.example_gguf, Q8_0;
   DeepSeek with its real head widths 128 + 64 / 128 so that the flash form runs; gpt-oss's MoE
   form, sinks and window, Llama 4's weighted expert inputs, on the grouped GEMMs) through load_runner on
   --device against the numpy backend: the last logits of a 200-token prompt (the grouped
   MoE and the MLA flash forms) within 1e-2 x max|logit|, and the same with REFLEX_MOE_MMA=0
   / REFLEX_MLA_FLASH=0 (the per-pair and absorbed forms) and with the weights streamed
   (REFLEX_CUDA_UPLOAD=read: guarded launches, routed experts first), 16 greedy tokens after
   the long prompt identical (or diverging only at a near-tie; the streamed run's graph capture
   waits for the whole file), the new paths' launch counts;
3. bench: benchrun.py's `bigmodel` suite (its docstring): per model generate, cold starts
   alternating with llama-simple (page cache warm, and dropped where root may), llama-bench
   -p 512 -n 128, reflex decode / prefill 512 / warm, the prefill switch's A/B, and a
   per-kernel breakdown of each missed target.

--device numpy --tiny with the fake peers (tests/data/fake-peers) is the dry run
(scripts/gpu/README-bench.md).
"""

import argparse
import json
import os
import sys
import time
import traceback

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LONG = 200  # prompt tokens of the engine check: above CudaOps' MOE_MMA_MIN_N and MLA_FLASH_MIN_N
N_GEN = 16
ENGINE_MODELS = {  # name: (synthetic example, its changed metadata keys, quantization)
    "qwen3moe-e32-k4": ("qwen3moe", {"embedding_length": 128, "attention.key_length": 32,
                                     "attention.value_length": 32, "expert_count": 32, "expert_used_count": 4,
                                     "expert_feed_forward_length": 64}, "Q8_0"),
    # DeepSeek-V2-Lite's head widths: keys 128 + 64 (rope) and values 128 per head (the flash form's
    # 192 / 128), a latent of 64 (attention.key_length = latent + rope, value_length = latent)
    "deepseek2-v2-heads": ("deepseek2_v2", {"embedding_length": 128, "feed_forward_length": 256,
                                            "attention.kv_lora_rank": 64, "rope.dimension_count": 64,
                                            "attention.key_length": 128, "attention.value_length": 64,
                                            "attention.key_length_mla": 192, "attention.value_length_mla": 128,
                                            "expert_count": 16, "expert_used_count": 4,
                                            "expert_feed_forward_length": 64}, "Q8_0"),
    # gpt-oss (issue 31): router bias, softmax over the chosen, expert biases and the clamped SwiGLU in
    # the grouped GEMMs' epilogue; attention sinks and a 32-key window in the flash prefill (head 64)
    "gpt-oss-e32-k4": ("gpt-oss", {"embedding_length": 128, "attention.key_length": 64,
                                   "attention.value_length": 64, "expert_count": 32, "expert_used_count": 4,
                                   "expert_feed_forward_length": 64, "attention.sliding_window": 32}, "Q8_0"),
    # Llama 4: each pair's input weighted before its expert (x rows per pair in the grouped GEMMs)
    "llama4-e16-k1": ("llama4", {"embedding_length": 128, "attention.key_length": 64, "attention.value_length": 64,
                                 "feed_forward_length": 128, "expert_count": 16, "expert_used_count": 1,
                                 "expert_feed_forward_length": 64}, "Q8_0"),
}


def _ops(device):
    if device == "cuda":
        from reflex_ipc.backends.cuda_ops import CudaOps

        return CudaOps()
    from reflex_ipc.backends.numpy_ops import NumpyOps

    return NumpyOps(blas_threads=None)


def part_checks(device):
    from reflex_ipc.testing import opchecks

    ops = _ops(device)
    rows = []
    for fn in (opchecks.check_moe_grouped, opchecks.check_mla_prefill, opchecks.check_flash_attention,
               opchecks.check_moe, opchecks.check_moe_mv, opchecks.check_mla):
        try:
            rows += fn(ops, np.random.default_rng(27))
        except Exception as e:  # a crash is a failed check
            rows.append({"op": fn.__name__, "case": "crashed", "ok": False,
                         "error": "".join(traceback.format_exception(e))[-2000:]})
    out = {"ok": all(r["ok"] for r in rows), "n": len(rows), "failed": [r for r in rows if not r["ok"]],
           "rows": rows}
    if device == "cuda":
        try:
            out["bench_moe"] = opchecks.bench_moe(ops, np.random.default_rng(3),
                                                  shapes=tuple(opchecks.MOE_BENCH))
        except Exception as e:
            out["bench_moe"] = {"error": "".join(traceback.format_exception(e))[-2000:]}
    return out


def engine_models(folder, tokenizer=None):
    from reflex_ipc.testing.synthetic import example_gguf

    tok = tokenizer or os.path.join(ROOT, "tests", "data", "synthetic-llama.gguf")
    os.makedirs(folder, exist_ok=True)
    return {name: example_gguf(ex, os.path.join(folder, f"bigmodel-{name}.gguf"), tokenizer=tok, keys=keys, qtype=q)
            for name, (ex, keys, q) in ENGINE_MODELS.items()}


def _near_tie(lg):
    s = np.sort(np.asarray(lg, np.float64))
    return bool(s[-1] - s[-2] <= 5e-3 * max(1.0, float(np.max(np.abs(s)))))


def compare_engine(path, device):
    """One model through load_runner on `device` and on numpy (see the module docstring)."""
    from reflex_ipc import settings
    from reflex_ipc.engine import load_runner

    ref = load_runner(path, device="numpy")
    n_vocab = ref.model.hp.n_vocab
    ids = [1] + [(7 * i + 3) % n_vocab for i in range(LONG - 1)]
    want = np.asarray(ref.prompt_logits(ids), np.float64)
    peak = float(np.max(np.abs(want)))
    res = {"file": os.path.basename(path), "prompt_tokens": len(ids), "max_abs_logit": peak}
    # new: the prefill forms of issue 27; old: the per-pair and absorbed ones; stream: the new forms
    # with the weights streamed (the read way forced on a cached file: guarded launches, routed
    # experts first) and a greedy continuation, whose graph capture waits for the whole file
    for tag, over in (("new", {}), ("old", {"moe_mma": False, "mla_flash": False}),
                      ("stream", {"cuda_upload": "read", "cuda_stream": True})):
        with settings.override(**over):
            run = load_runner(path, device=device)
            ops = run.ops
            m0, f0 = getattr(ops, "moe_mma_launches", 0), getattr(ops, "mla_flash_launches", 0)
            a0 = getattr(ops, "flash_launches", 0)
            got = np.asarray(run.prompt_logits(ids), np.float64)
            err = float(np.max(np.abs(got - want)))
            res[f"{tag}_logits_max_abs_diff"] = err
            res[f"{tag}_logits_ok"] = bool(np.all(np.isfinite(got)) and err <= 1e-2 * peak)
            res[f"{tag}_moe_mma_launches"] = getattr(ops, "moe_mma_launches", 0) - m0
            res[f"{tag}_mla_flash_launches"] = getattr(ops, "mla_flash_launches", 0) - f0
            res[f"{tag}_flash_launches"] = getattr(ops, "flash_launches", 0) - a0
            if tag == "stream":
                up = (ops.upload_stats() or [{}])[0] if hasattr(ops, "upload_stats") else {}
                res["stream_upload"] = {k: up.get(k) for k in ("mode", "streaming", "bytes", "bytes_done",
                                                                "bytes_asked_first", "in_progress")}
            if tag in ("new", "stream"):
                g = run.generate(ids, max_tokens=N_GEN, temperature=0.0)
                if tag == "new":
                    r = ref.generate(ids, max_tokens=N_GEN, temperature=0.0)
                    want_ids = r["token_ids"]
                key = f"{tag}_greedy"
                res[f"{key}_identical"] = g["token_ids"] == want_ids
                if not res[f"{key}_identical"]:
                    a, b = want_ids, g["token_ids"]
                    k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                    res[f"{key}_diverges_at"] = k
                    res[f"{key}_near_tie"] = _near_tie(ref.prompt_logits(ids + a[:k]))
                res[f"{tag}_timings"] = g.get("timings")
    greedy_ok = all(res[f"{t}_greedy_identical"] or res.get(f"{t}_greedy_near_tie", False) for t in ("new", "stream"))
    took = True
    if device == "cuda":  # the new forms ran where they exist, not with the switches off
        arch = "deepseek2" if "deepseek2" in res["file"] else "qwen3moe"
        took = res["new_moe_mma_launches"] > 0 and res["old_moe_mma_launches"] == 0
        if arch == "deepseek2":
            took = took and res["new_mla_flash_launches"] > 0 and res["old_mla_flash_launches"] == 0
        res["new_paths_taken"] = took
    if device == "cuda":  # the stream variant streamed
        took = took and bool((res.get("stream_upload") or {}).get("streaming"))
    res["ok"] = bool(res["new_logits_ok"] and res["old_logits_ok"] and res["stream_logits_ok"] and greedy_ok
                     and took)
    return res


def part_engine(device, folder):
    paths = engine_models(folder)
    runs = []
    for name, p in paths.items():
        try:
            runs.append({"model": name, **compare_engine(p, device)})
        except Exception as e:
            runs.append({"model": name, "ok": False, "error": "".join(traceback.format_exception(e))[-2500:]})
    return {"ok": all(r["ok"] for r in runs), "runs": runs}


def part_bench(a):
    from reflex_ipc.testing import benchrun

    argv = ["bigmodel", os.path.join(a.out, "bench"), "--budget-s", str(a.budget_s), "--device", a.device]
    peers = [os.path.abspath(p) if p and os.path.exists(p) else p for p in (a.llama_simple, a.llama_bench)]
    for flag, v in (("--models", a.models), ("--python", a.python), ("--llama-simple", peers[0]),
                    ("--llama-bench", peers[1])):
        if v:
            argv += [flag, *v] if isinstance(v, list) else [flag, v]
    if a.tiny:
        argv.append("--tiny")
    if not a.drop_caches:
        argv.append("--no-drop-caches")
    rc = benchrun.main(argv)
    with open(os.path.join(a.out, "bench", "summary.json")) as fh:
        summary = json.load(fh)
    return {"ok": rc == 0, "summary": summary}


def table(report):
    lines = ["", "=== gpu-bigmodel (issue 27) ==="]
    c = report.get("checks") or {}
    if "n" in c:
        worst = {}
        for r in c["rows"]:
            if r.get("rel_err") is not None:
                worst[r["op"]] = max(worst.get(r["op"], 0.0), r["rel_err"])
        lines.append(f"checks: {c['n'] - len(c['failed'])}/{c['n']} passed; worst rel err: "
                     + ", ".join(f"{k} {v:.1e}" for k, v in worst.items()))
        for r in c["failed"][:12]:
            lines.append("  FAIL " + json.dumps({k: v for k, v in r.items() if k != "error"})[:300]
                         + " " + str(r.get("error", ""))[-400:])
        for shape, b in (c.get("bench_moe") or {}).items():
            if isinstance(b, dict):
                ns = sorted({int(k.split("_N")[1][:-3]) for k in b if k.startswith(("pairs_N", "grouped_N"))})
                cells = [f"N={n}: {b.get(f'grouped_N{n}_us')} vs {b.get(f'pairs_N{n}_us')} us" for n in ns]
                lines.append(f"moe layer {shape} grouped vs per-pair: " + "; ".join(cells)
                             + f"; decode {b.get('device_N1_graph_us')} us (graph), down split "
                             f"{b.get('device_N1_graph_split_us')} us (same bits: {b.get('down_split_same_bits')})")
    elif c:
        lines.append("checks: ERROR " + str(c.get("error", ""))[-800:])
    e = report.get("engine") or {}
    for r in e.get("runs", []):
        lines.append("engine: " + json.dumps({k: v for k, v in r.items() if k in (
            "model", "ok", "new_logits_max_abs_diff", "old_logits_max_abs_diff", "stream_logits_max_abs_diff",
            "max_abs_logit", "new_greedy_identical", "new_greedy_near_tie", "stream_greedy_identical",
            "new_moe_mma_launches", "new_mla_flash_launches", "new_flash_launches", "stream_upload",
            "error")})[:700])
    if e.get("error"):
        lines.append("engine: ERROR " + e["error"][-800:])
    b = report.get("bench") or {}
    if b.get("summary"):
        from reflex_ipc.testing.benchrun import table as bench_table

        lines.append(bench_table(b["summary"]))
        for name, m in b["summary"].get("models", {}).items():
            r = m.get("ratios") or {}
            got = {k: r.get(k) for k in ("prefill_ratio", "decode_ratio", "cold_speedup_pairwise_p50",
                                         "cold_dropped_reflex_p50_ms", "cold_dropped_llama_simple_p50_ms")}
            lines.append(f"  {name}: {got}")
    elif b.get("error"):
        lines.append("bench: ERROR " + b["error"][-800:])
    lines.append(f"ALL CHECKS OK: {report.get('ok')}  (report: {report.get('path')})")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--budget-s", type=float, default=360.0, help="the bench part's budget (benchrun bigmodel)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "numpy"])
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--python", help="run reflex's bench processes with this interpreter (default: the user venv)")
    ap.add_argument("--models", nargs="*")
    ap.add_argument("--llama-simple")
    ap.add_argument("--llama-bench")
    ap.add_argument("--no-drop-caches", dest="drop_caches", action="store_false", default=True)
    ap.add_argument("--skip", nargs="*", default=[], choices=["checks", "engine", "bench"])
    a = ap.parse_args(argv)
    a.out = os.path.abspath(a.out)
    os.makedirs(a.out, exist_ok=True)
    from reflex_ipc import settings

    path = os.path.join(a.out, "bigmodel.json")
    report = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "device": a.device,
              "commit": settings.get().commit, "path": path}
    parts = [("checks", lambda: part_checks(a.device)),
             ("engine", lambda: part_engine(a.device, os.path.join(settings.get().synth_dir, "bigmodel"))),
             ("bench", lambda: part_bench(a))]
    for name, fn in parts:
        if name in a.skip:
            continue
        t0 = time.perf_counter()
        try:
            report[name] = fn()
        except Exception as e:
            report[name] = {"ok": False, "error": "".join(traceback.format_exception(e))[-3000:]}
        report[name]["seconds"] = round(time.perf_counter() - t0, 1)
        print(f"[gpu-bigmodel] {name}: {report[name].get('ok')} ({report[name]['seconds']} s)", file=sys.stderr,
              flush=True)
        with open(path, "w") as fh:
            json.dump(report, fh, indent=1, default=str)
    report["ok"] = all((report.get(n) or {}).get("ok", False) for n in ("checks", "engine") if n not in a.skip)
    with open(path, "w") as fh:
        json.dump(report, fh, indent=1, default=str)
    print(table(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
