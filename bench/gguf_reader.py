"""Benchmark: opening a GGUF with a big vocabulary, reflex vs gguf.GGUFReader.

Measures, as whole fresh processes (external wall clock, median of --runs):
  * `reflex inspect --model FILE --json`
  * a Python process that does gguf.GGUFReader(FILE) and reads the vocabulary
  * `python -c pass` (the interpreter's own start, for scale)
and in-process: GGUFFile(FILE) open time, and open + reading the vocabulary,
with each of the two bulk string walks (numpy's, used when numpy is loaded, and
the bytes.split one that `reflex inspect` uses).

The default file is llama.cpp's ggml-vocab-qwen2.gguf (a real Qwen2 vocabulary:
151,936 tokens, 151,387 merges), taken from the llama-cpp-python 0.3.36 sdist,
downloaded once with pip into ~/.cache/reflex-ipc/ by reflex_ipc.testing.sdist. The
SmolLM2 model (real tensors) is measured too. Target: reflex inspect <= 5% of
GGUFReader's process.

    python bench/gguf_reader.py [--file PATH ...] [--runs N] [--out DIR]
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
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TARGET_RATIO = 0.05

READER_SCRIPT = """
import sys
import gguf
r = gguf.GGUFReader(sys.argv[1])
vocab = r.fields["tokenizer.ggml.tokens"].contents()
assert len(vocab) > 0
"""


def qwen2_vocab_gguf() -> str:
    """ggml-vocab-qwen2.gguf from the llama-cpp-python sdist, fetched and cached by
    reflex_ipc.testing.sdist."""
    from reflex_ipc.testing.sdist import vocab_models_dir

    return os.path.join(vocab_models_dir(), "ggml-vocab-qwen2.gguf")


def reflex_command() -> list[str]:
    """The installed `reflex` console script of this interpreter (not a pyenv shim)."""
    script = os.path.join(os.path.dirname(sys.executable), "reflex")
    if os.path.exists(script):
        return [script]
    return [sys.executable, "-m", "reflex_ipc"]


def child_env(**extra) -> dict:
    """The environment of the measured processes: bytecode caching on, as on a user's machine
    (a sandbox may set PYTHONDONTWRITEBYTECODE, which makes every start recompile)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(extra)
    return env


def time_process(cmd, runs, env=None) -> dict:
    env = env or child_env()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, check=True, env=env)  # warm caches, write .pyc
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, check=True, env=env)
        times.append(time.perf_counter() - t)
    return {"median_s": round(statistics.median(times), 4), "min_s": round(min(times), 4),
            "runs_s": [round(x, 4) for x in times]}


def time_in_process(path, runs) -> dict:
    """GGUFFile open (and open + decoding the vocabulary) with each bulk string walk."""
    import numpy  # noqa: F401  (imported first so that it is not counted in the open)

    from reflex_ipc import gguffile

    out = {}
    saved = gguffile._bulk_walk
    try:
        for label, walk in (("numpy_walk", gguffile._walk_strings_numpy),
                            ("split_walk", gguffile._walk_strings_split)):
            gguffile._bulk_walk = lambda walk=walk: walk
            opens, vocab = [], []
            for _ in range(runs + 1):  # the first run warms the page cache and is dropped
                t = time.perf_counter()
                with gguffile.GGUFFile(path) as f:
                    t1 = time.perf_counter()
                    tokens = f.metadata.get("tokenizer.ggml.tokens")
                    if isinstance(tokens, gguffile.ArrayValue):
                        tokens.strings()
                    t2 = time.perf_counter()
                opens.append(t1 - t)
                vocab.append(t2 - t)
            out[f"open_{label}_median_ms"] = round(statistics.median(opens[1:]) * 1e3, 3)
            out[f"open_and_vocab_strings_{label}_median_ms"] = round(
                statistics.median(vocab[1:]) * 1e3, 3)
    finally:
        gguffile._bulk_walk = saved
    return out


def machine() -> dict:
    from reflex_ipc.commands.bench import cpu_model

    cpu = cpu_model()
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    import gguf
    import numpy

    return {"cpu": cpu, "cores": cores, "load_avg_1m_at_start": round(os.getloadavg()[0], 2),
            "python": platform.python_version(),
            "platform": platform.platform(), "numpy": numpy.__version__,
            "gguf": getattr(gguf, "__version__", None) or _dist_version("gguf")}


def _dist_version(name):
    from importlib.metadata import version

    return version(name)


def git_commit() -> str:
    try:
        rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=True).stdout.strip()
        # dirty: uncommitted changes in the code this benchmark runs
        paths = ["reflex_ipc/" + p for p in ("__init__.py", "__main__.py", "cli.py", "phases.py",
                                             "errors.py", "modelpath.py", "ggml_types.py",
                                             "gguffile.py", "commands/inspect.py")]
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--", *paths],
                               capture_output=True, text=True).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def bench_file(path, runs) -> dict:
    from reflex_ipc.gguffile import GGUFFile

    with GGUFFile(path) as f:
        tokens = f.metadata.get("tokenizer.ggml.tokens")
        merges = f.metadata.get("tokenizer.ggml.merges")
        info = {"file": os.path.basename(path), "bytes": f.size, "tensors": len(f.tensors),
                "tokens": getattr(tokens, "count", 0), "merges": getattr(merges, "count", 0)}
    reflex = time_process(reflex_command() + ["inspect", "--model", path, "--json"], runs)
    reader = time_process([sys.executable, "-c", READER_SCRIPT, path], runs)
    ratio = reflex["median_s"] / reader["median_s"]
    return {**info, "reflex_inspect_process": reflex, "gguf_reader_process": reader,
            "ratio": round(ratio, 4), "target_ratio": TARGET_RATIO,
            "meets_target": ratio <= TARGET_RATIO, "in_process": time_in_process(path, runs)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--file", action="append", help="GGUF file(s) to measure (default: the "
                   "Qwen2 vocabulary GGUF and the SmolLM2 model)")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    args = p.parse_args(argv)
    files = args.file
    if not files:
        from reflex_ipc.modelpath import resolve_model

        files = [qwen2_vocab_gguf(), resolve_model("smollm2")]
    result = {
        "benchmark": "gguf_reader",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "machine": machine(),
        "reflex_command": reflex_command(),
        "notes": "external wall clock around subprocess.run, median of runs after one warm-up run; "
                 "children run without PYTHONDONTWRITEBYTECODE (bytecode caches on)",
        "python_start_process": time_process([sys.executable, "-c", "pass"], args.runs),
        "files": [],
    }
    for path in files:
        r = bench_file(path, args.runs)
        result["files"].append(r)
        print(f"{r['file']}: reflex inspect {r['reflex_inspect_process']['median_s'] * 1e3:.0f} ms, "
              f"GGUFReader {r['gguf_reader_process']['median_s'] * 1e3:.0f} ms, ratio "
              f"{r['ratio'] * 100:.2f}% (target <= {TARGET_RATIO * 100:.0f}%), GGUFFile open "
              f"{r['in_process']['open_numpy_walk_median_ms']:.1f} ms (numpy walk), "
              f"{r['in_process']['open_split_walk_median_ms']:.1f} ms (split walk)", flush=True)
    result["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    os.makedirs(args.out, exist_ok=True)
    out = os.path.join(args.out, f"gguf_reader-{result['date'][:10]}.json")
    with open(out, "w") as fh:
        json.dump(result, fh, indent=1)
        fh.write("\n")
    print(f"python -c pass {result['python_start_process']['median_s'] * 1e3:.0f} ms; wrote {out}")
    return 0 if all(r["meets_target"] for r in result["files"]) else 1


if __name__ == "__main__":
    sys.exit(main())
