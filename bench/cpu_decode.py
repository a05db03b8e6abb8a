"""CPU (numpy backend) decode benchmark: load time, prompt eval, greedy tokens/s.

    python bench/cpu_decode.py [--model M] [--tokens 128] [--runs 3] [--blas-threads N] [--out DIR]

Runs in this process: load_runner(device="cpu"), one warm-up generation, then
`--runs` greedy generations of up to `--tokens` tokens (end-of-generation is
ignored so every run decodes the full count). Writes
bench/results/cpu_decode-<UTC date>.json (or --out DIR) with the median and
every run, the machine (CPU model, cores, load average before and after: other
work on the machine slows this benchmark down), the BLAS thread setting and
the git commit.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PROMPT = "Write a long story about a dragon who learns to bake bread.\n\nOnce upon a time,"


def git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except Exception:
        return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--blas-threads", type=int, default=None,
                    help="set OPENBLAS_NUM_THREADS (before numpy loads); default: leave as is")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args(argv)
    if args.blas_threads is not None:
        os.environ["OPENBLAS_NUM_THREADS"] = str(args.blas_threads)
    sys.path.insert(0, os.path.dirname(HERE))
    from reflex_ipc.commands.bench import cpu_model

    load_before = os.getloadavg()

    t0 = time.perf_counter()
    from reflex_ipc.engine import load_runner

    runner = load_runner(args.model, device="cpu")
    load_ms = (time.perf_counter() - t0) * 1e3
    runner.tok = _NoEog(runner.tok)  # decode the full count every run
    runner.generate(args.prompt, max_tokens=4)
    runs = []
    for _ in range(args.runs):
        out = runner.generate(args.prompt, max_tokens=args.tokens)
        t = out["timings"]
        runs.append({"prompt_tokens": out["prompt_tokens"], "completion_tokens": out["completion_tokens"],
                     "prompt_eval_ms": t["prompt_eval"], "decode_ms": t["decode"],
                     "decode_tokens_per_s": t["decode_tokens_per_s"]})
    load_after = os.getloadavg()
    import numpy as np

    result = {
        "benchmark": "cpu_decode",
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "model": runner.info()["model"],
        "model_path": runner.path,
        "backend": runner.ops.name,
        "tokens": args.tokens,
        "load_ms": round(load_ms, 1),
        "prompt_eval_ms_median": statistics.median(r["prompt_eval_ms"] for r in runs),
        "decode_tokens_per_s_median": statistics.median(r["decode_tokens_per_s"] for r in runs),
        "runs": runs,
        "machine": {
            "cpu": cpu_model(), "cores": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "numpy": np.__version__,
            "openblas_num_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in load_after],
        },
    }
    os.makedirs(args.out, exist_ok=True)
    name = f"cpu_decode-{datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d')}.json"
    path = os.path.join(args.out, name)
    with open(path, "w") as fh:
        json.dump(result, fh, indent=2)
        fh.write("\n")
    print(json.dumps({k: result[k] for k in ("load_ms", "prompt_eval_ms_median", "decode_tokens_per_s_median")}
                     | {"loadavg": result["machine"]["loadavg_after"], "file": path}))
    return 0


class _NoEog:
    """The runner's tokenizer with no end-of-generation tokens."""

    eog_ids = frozenset()

    def __init__(self, tok):
        self._tok = tok

    def __getattr__(self, name):
        return getattr(self._tok, name)


if __name__ == "__main__":
    sys.exit(main())
