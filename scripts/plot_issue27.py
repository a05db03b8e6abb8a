#!/usr/bin/env python3
"""Issue 27's ratios against llama.cpp from one results folder (bench/results/issue27-h200-*):
prefill and decode of each shaped model (gpu_probe_bigprefill.py's probe-MODEL*.json against
llama-bench-MODEL*.json from the same call), bars with the targets as lines, into a PNG.

    python3 scripts/plot_issue27.py RESULTS_DIR [--out PNG]      (needs matplotlib)
"""

import argparse
import glob
import json
import os
import statistics

MODELS = [("qwen3-30b-a3b", "Qwen3-30B-A3B"), ("deepseek-v2-lite", "DeepSeek-V2-Lite"), ("qwen35-2b", "Qwen3.5-2B")]
TARGETS = {"prefill": 1.0, "decode": 1.1}


def ratios(folder):
    """{model: {"prefill": [ratio, ...], "decode": [...]}}: each probe file against the
    llama-bench file of the same suffix (both written in one device call)."""
    out = {}
    for key, _ in MODELS:
        r = {"prefill": [], "decode": []}
        for probe in sorted(glob.glob(os.path.join(folder, f"probe-{key}*.json"))):
            suffix = os.path.basename(probe)[len(f"probe-{key}"):-len(".json")]
            lb = os.path.join(folder, f"llama-bench-{key}{suffix}.json")
            if not os.path.exists(lb):
                continue
            p = json.load(open(probe))
            rows = json.load(open(lb))
            pp = next((x["avg_ts"] for x in rows if x["n_prompt"] and not x["n_gen"]), None)
            tg = next((x["avg_ts"] for x in rows if x["n_gen"] and not x["n_prompt"]), None)
            if pp and p.get("steady_tok_s"):
                r["prefill"].append(p["steady_tok_s"] / pp)
            if tg and p.get("decode_tok_s"):
                r["decode"].append(p["decode_tok_s"] / tg)
        out[key] = r
    return out


def plot(folder, out=None):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rs = ratios(folder)
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    width = 0.36
    for j, part in enumerate(("prefill", "decode")):
        xs, ys, lo, hi = [], [], [], []
        for i, (key, _) in enumerate(MODELS):
            v = rs[key][part]
            if not v:
                continue
            m = statistics.median(v)
            xs.append(i + (j - 0.5) * width)
            ys.append(m)
            lo.append(m - min(v))
            hi.append(max(v) - m)
        bars = ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3,
                      label=f"{part} (target {TARGETS[part]:.1f}x)", color=("#4477aa", "#ee7733")[j])
        for b, y in zip(bars, ys):
            ax.text(b.get_x() + b.get_width() / 2, y + 0.03, f"{y:.2f}x", ha="center", fontsize=8)
        ax.axhline(TARGETS[part], color=("#4477aa", "#ee7733")[j], lw=1, ls="--")
    ax.set_xticks(range(len(MODELS)))
    ax.set_xticklabels([name for _, name in MODELS])
    ax.set_ylabel("reflex / llama.cpp (llama-bench, same call)")
    ax.set_title(f"H200, shaped models, weights resident ({os.path.basename(os.path.abspath(folder))})", fontsize=9)
    ax.legend(fontsize=8, loc="upper right")
    ax.set_ylim(0, 1.6)
    fig.tight_layout()
    out = out or os.path.join(folder, "ratios.png")
    fig.savefig(out, dpi=110)
    return out, rs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder")
    ap.add_argument("--out")
    a = ap.parse_args()
    out, rs = plot(a.folder, a.out)
    for key, r in rs.items():
        print(key, {k: [round(x, 3) for x in v] for k, v in r.items()})
    print(out)


if __name__ == "__main__":
    main()
