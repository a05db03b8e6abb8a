"""Tokenizer cold-path benchmark: construction and first-prompt encoding in fresh processes.

For each vocabulary, runs N fresh Python processes; each one measures, in
process with perf_counter:
  imports_ms     numpy + reflex_ipc.gguffile + reflex_ipc.tokenizer (all submodules)
  construct_ms   GGUFFile(path) + load_tokenizer(f)  (the budget: <= 50 ms for Qwen2),
                 with the tokenizer's disk cache of sorted string hashes warm
  construct_nocache_ms   the same with REFLEX_TOKENIZER_CACHE=0 (hash and sort in process)
  open_ms        the GGUFFile(path) part of construct_ms
  encode1_ms     encoding a ~100-token English prompt, first call (cold caches)
  encode2_ms     the same prompt again (warm caches)
and reports the median of each. Interpreter start-up is excluded.

usage: python bench/tokenizer.py [--runs 7] [--out bench/results/tokenizer-DATE.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

PROMPT = ("The quick brown fox jumps over the lazy dog. In 2024, researchers measured "
          "how long it takes to start a language model process and print its first token; "
          "they found that loading the vocabulary, not the weights, often dominated. "
          "This prompt has about one hundred tokens, numbers like 3.14159 and 42, "
          "some punctuation (yes!), and a newline.\nDone.")

CHILD = r"""
import json, sys, time
T = time.perf_counter
t0 = T()
import numpy
import reflex_ipc.gguffile
import reflex_ipc.tokenizer, reflex_ipc.tokenizer.bpe, reflex_ipc.tokenizer.spm
import reflex_ipc.tokenizer.pretok, reflex_ipc.tokenizer.vocab
t1 = T()
from reflex_ipc.gguffile import GGUFFile
from reflex_ipc.tokenizer import load_tokenizer
f = GGUFFile(sys.argv[1])
t2 = T()
tok = load_tokenizer(f)
t3 = T()
ids = tok.encode(sys.argv[2])
t4 = T()
tok.encode(sys.argv[2])
t5 = T()
print(json.dumps({"imports_ms": (t1 - t0) * 1e3, "open_ms": (t2 - t1) * 1e3,
                  "construct_ms": (t3 - t1) * 1e3, "encode1_ms": (t4 - t3) * 1e3,
                  "encode2_ms": (t5 - t4) * 1e3, "n_tokens": len(ids), "n_vocab": tok.n_vocab}))
"""


def vocabularies():
    from reflex_ipc.testing.sdist import vocab_models_dir

    d = vocab_models_dir()
    out = {n: os.path.join(d, f"ggml-vocab-{n}.gguf")
           for n in ("qwen2", "llama-bpe", "gpt-2", "command-r", "gemma-4", "llama-spm")}
    try:
        from reflex_ipc.modelpath import resolve_model

        out["smollm2"] = resolve_model("smollm2")
    except Exception as e:  # the default model is optional for this benchmark
        print(f"skipping smollm2: {e}", file=sys.stderr)
    return out


def _child(path: str, cache: bool) -> dict:
    env = dict(os.environ, REFLEX_TOKENIZER_CACHE="1" if cache else "0")
    p = subprocess.run([sys.executable, "-c", CHILD, path, PROMPT], capture_output=True,
                       text=True, check=True, cwd=ROOT, env=env)
    return json.loads(p.stdout.strip().splitlines()[-1])


def run_one(path: str, runs: int) -> dict:
    _child(path, True)  # fills the disk cache
    rows, nocache = [], []
    for _ in range(runs):
        rows.append(_child(path, True))
        nocache.append(_child(path, False))
    med = {k: round(statistics.median(r[k] for r in rows), 2)
           for k in ("imports_ms", "open_ms", "construct_ms", "encode1_ms", "encode2_ms")}
    med["construct_nocache_ms"] = round(statistics.median(r["construct_ms"] for r in nocache), 2)
    med["construct_ms_all"] = [round(r["construct_ms"], 2) for r in rows]
    med["construct_nocache_ms_all"] = [round(r["construct_ms"], 2) for r in nocache]
    med["n_tokens"] = rows[0]["n_tokens"]
    med["n_vocab"] = rows[0]["n_vocab"]
    return med


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    results = {}
    load_before = os.getloadavg()
    for name, path in vocabularies().items():
        results[name] = run_one(path, args.runs)
        r = results[name]
        print(f"{name:10} vocab {r['n_vocab']:>6}  imports {r['imports_ms']:6.1f} ms  "
              f"construct {r['construct_ms']:6.1f} ms (open {r['open_ms']:5.1f}; "
              f"no cache {r['construct_nocache_ms']:6.1f})  "
              f"encode {r['n_tokens']} tok: first {r['encode1_ms']:5.2f} ms, "
              f"again {r['encode2_ms']:5.2f} ms")
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=ROOT).stdout.strip()
    except OSError:
        commit = None
    doc = {
        "benchmark": "tokenizer",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "processor": platform.processor() or platform.machine(),
                    "cpus": os.cpu_count(),
                    # a shared machine: 1-minute load averages around the run
                    "loadavg_before": round(load_before[0], 2),
                    "loadavg_after": round(os.getloadavg()[0], 2)},
        "runs": args.runs,
        "budget": {"qwen2_construct_ms": 50},
        "results": results,
    }
    out = args.out or os.path.join(
        HERE, "results", f"tokenizer-{datetime.date.today().isoformat()}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as fh:
        json.dump(doc, fh, indent=1)
        fh.write("\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
