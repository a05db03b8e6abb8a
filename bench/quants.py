"""Benchmark: dequantizing every tensor of a GGUF to float32 (reflex_ipc.quants).

In-process, median of --runs passes over all tensors (the first pass, which
pays for page faults on the mapping, is reported apart). Default model: SmolLM2
(66 MB Q4_1 + 30 MB Q8_0). Target: the whole model in under a second.

    python bench/quants.py [--model PATH] [--runs N] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
TARGET_S = 1.0

from gguf_reader import git_commit, machine  # noqa: E402


def one_pass(f, quants) -> tuple[float, dict]:
    per_type: dict = {}
    t0 = time.perf_counter()
    for t in f.tensors.values():
        t1 = time.perf_counter()
        quants.dequantize_tensor(f, t.name)
        e = per_type.setdefault(t.type_name, {"tensors": 0, "bytes": 0, "s": 0.0})
        e["tensors"] += 1
        e["bytes"] += t.nbytes
        e["s"] += time.perf_counter() - t1
    return time.perf_counter() - t0, per_type


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="GGUF path or alias (default smollm2)")
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    args = p.parse_args(argv)

    from reflex_ipc import quants
    from reflex_ipc.gguffile import GGUFFile
    from reflex_ipc.modelpath import resolve_model

    path = resolve_model(args.model)
    host = machine()
    with GGUFFile(path) as f:
        first, _ = one_pass(f, quants)
        passes = [one_pass(f, quants) for _ in range(args.runs)]
        n_elements = sum(t.n_elements for t in f.tensors.values())
    totals = [s for s, _ in passes]
    median = statistics.median(totals)
    per_type = {name: {**e, "s": round(statistics.median(p[1][name]["s"] for p in passes), 4)}
                for name, e in passes[0][1].items()}
    result = {
        "benchmark": "quants",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "machine": host,
        "model": os.path.basename(path),
        "n_elements": n_elements,
        "first_pass_s": round(first, 4),
        "median_s": round(median, 4),
        "min_s": round(min(totals), 4),
        "runs_s": [round(x, 4) for x in totals],
        "ns_per_element": round(median / n_elements * 1e9, 3),
        "per_type": per_type,
        "target_s": TARGET_S,
        "meets_target": median <= TARGET_S,
        "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
    }
    os.makedirs(args.out, exist_ok=True)
    out = os.path.join(args.out, f"quants-{result['date'][:10]}.json")
    with open(out, "w") as fh:
        json.dump(result, fh, indent=1)
        fh.write("\n")
    print(f"{result['model']}: {n_elements:,} elements, median {median * 1e3:.0f} ms "
          f"(first pass {first * 1e3:.0f} ms), {result['ns_per_element']} ns/element; "
          + ", ".join(f"{k} {v['s'] * 1e3:.0f} ms" for k, v in per_type.items()) + f"; wrote {out}")
    return 0 if result["meets_target"] else 1


if __name__ == "__main__":
    sys.exit(main())
