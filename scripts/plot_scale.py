#!/usr/bin/env python3
"""Cold process -> first token against model file size, reflex and llama-simple, from the
results of scripts/gpu/gpu-bench-scale (a directory with summary.json and one JSON per
model, or its summary.json). Draws p50 with the p95 above it as an error bar (and the
dropped-page-cache figures where the run has them) into a PNG beside the summary.

    PYTHONPATH=. python3 scripts/plot_scale.py RESULTS_DIR [--out PNG]      (needs matplotlib)
"""

import argparse
import os
import sys

from reflex_ipc.testing.benchrun import load_points


def plot(path, out=None):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary, points = load_points(path)
    if not points:
        raise SystemExit(f"plot_scale: no cold figures under {path}")
    names = sorted({s for _, _, ser in points for s in ser}, key=lambda s: (", " in s, s != "reflex", s))
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for s in names:
        xs = [(gb, ser[s]) for _, gb, ser in points if s in ser]
        x = [gb for gb, _ in xs]
        y = [v[0] / 1e3 for _, v in xs]
        up = [(v[1] - v[0]) / 1e3 for _, v in xs]
        ax.errorbar(x, y, yerr=[[0] * len(up), up], marker="o" if s.startswith("reflex") else "s",
                    color="#3b7dd8" if s.startswith("reflex") else "#e07b39",
                    linestyle="--" if ", " in s else "-", capsize=3, label=s)
    for name, gb, ser in points:
        top = max(v[0] for v in ser.values()) / 1e3
        ax.annotate(name.replace("qwen3-", ""), (gb, top), textcoords="offset points", xytext=(0, 6),
                    ha="center", fontsize=8)
    sizes = [gb for _, gb, _ in points]
    if max(sizes) > 8 * min(sizes):
        ax.set_xscale("log")
    ax.set_xlabel("GGUF file size (GB, Q4_K mix)")
    ax.set_ylabel("cold process -> first token, spawn to exit (s)")
    m = summary.get("machine") or {}
    gpu = (m.get("gpu") or {}).get("name") or summary.get("device")
    ax.set_title(f"Cold start vs model size on {gpu} (p50, bar to p95), commit {m.get('commit', '?')[:7]}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    d = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    out = out or os.path.join(d, "cold-vs-size.png")
    fig.savefig(out, dpi=110)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="gpu-bench-scale's OUT directory (or its summary.json)")
    ap.add_argument("--out", help="PNG path (default: RESULTS/cold-vs-size.png)")
    a = ap.parse_args(argv)
    print(plot(a.results, a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
