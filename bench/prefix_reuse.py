"""Prefix reuse between requests (the editor keystroke case): warm time of a
request whose 1,000-token prefix the previous request already evaluated, with
reuse (cache_prompt=True) and without (cache_prompt=False).

    python bench/prefix_reuse.py [--device cpu|cuda] [--model M] [--prefix-tokens 1000]
                                 [--edit-tokens 10] [--runs 10] [--out DIR]

In one process: load_runner, a warm-up, then `--runs` rounds. Each round sends
the prefix followed by a different 10-token edit (the keystroke), once with
reuse (after a request on the same prefix with another edit, so the cache
holds the prefix) and once without; each request generates one token. The
figure is the ratio of medians (without / with), plus cached_tokens and
prompt_tokens as the runner reports them. Both runs of a round give the same
token (checked). Writes bench/results/prefix_reuse-<device>-<commit>.json with
the machine, the commit and every sample.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CODE = '''def parse_config(path):
    """Read a key = value file into a dict; lines starting with # are comments."""
    out = {}
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if "=" not in line:
                raise ValueError(f"{path}:{n}: expected key = value")
            key, value = (part.strip() for part in line.split("=", 1))
            out[key] = value
    return out

'''


def git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=10).stdout.strip() or None
    except Exception:
        return None


def make_prefix(tok, n):
    """About n tokens of Python source (whole lines)."""
    text, i = "", 0
    while len(tok.encode(text, add_bos=False)) < n:
        text += CODE.replace("parse_config", f"parse_config_{i}")
        i += 1
    lines = text.splitlines(keepends=True)
    while len(tok.encode("".join(lines), add_bos=False)) > n and len(lines) > 1:
        lines.pop()
    return "".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    ap.add_argument("--model", default=None)
    ap.add_argument("--prefix-tokens", type=int, default=1000)
    ap.add_argument("--edit-tokens", type=int, default=10)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args(argv)
    sys.path.insert(0, ROOT)
    from reflex_ipc import settings
    from reflex_ipc.commands.bench import cpu_model
    from reflex_ipc.engine import load_runner

    runner = load_runner(args.model, device=args.device)
    tok = runner.tok
    prefix = make_prefix(tok, args.prefix_tokens)
    n_prefix = len(tok.encode(prefix))

    def edit(i):
        words = ["value", "total", "count", "name", "index", "items", "result", "line", "key", "path"]
        text = f"    {words[i % 10]}_{i} = parse_config_{i}(path)"
        ids = tok.encode(text, add_bos=False)
        return tok.decode(ids[: args.edit_tokens])

    def timed(prompt, reuse):
        t = time.perf_counter()
        out = runner.generate(prompt, max_tokens=1, cache_prompt=reuse)
        return (time.perf_counter() - t) * 1e3, out

    timed(prefix + edit(999), False)  # warm-up (allocations, graphs)
    timed(prefix + edit(998), True)
    with_ms, without_ms, cached, prompt_tokens = [], [], [], []
    for i in range(args.runs):
        p = prefix + edit(i)
        timed(prefix + edit(i + 1000), True)  # the previous keystroke: the cache holds the prefix
        a, out_a = timed(p, True)
        b, out_b = timed(p, False)
        if out_a["token_ids"] != out_b["token_ids"]:
            raise SystemExit(f"round {i}: reuse changed the result: {out_a['token_ids']} vs "
                             f"{out_b['token_ids']}")
        with_ms.append(round(a, 3))
        without_ms.append(round(b, 3))
        cached.append(out_a.get("cached_tokens"))
        prompt_tokens.append(out_a["prompt_tokens"])
        assert out_b.get("cached_tokens", 0) == 0
    med_with, med_without = statistics.median(with_ms), statistics.median(without_ms)
    info = runner.info()
    res = {
        "what": "warm generate (1 token) on a prefix + a short edit; reuse vs none",
        "model": info.get("model"), "path": info.get("path"), "backend": info.get("backend"),
        "device": args.device, "prefix_tokens": n_prefix, "edit_tokens": args.edit_tokens,
        "runs": args.runs, "median_ms_with_reuse": med_with, "median_ms_without_reuse": med_without,
        "speedup": round(med_without / med_with, 2), "target_speedup": 10,
        "cached_tokens": cached, "prompt_tokens": prompt_tokens,
        "samples_ms_with_reuse": with_ms, "samples_ms_without_reuse": without_ms,
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
                    "loadavg": os.getloadavg(),
                    "cpu_threads": settings.get().cpu_threads or 1},
        "commit": git_commit(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"prefix_reuse-{info.get('backend')}-{res['commit']}.json")
    with open(path, "w") as fh:
        json.dump(res, fh, indent=1)
    print(f"{path}: with reuse {med_with:.1f} ms, without {med_without:.1f} ms, "
          f"{res['speedup']}x (target >= 10x); cached {cached[0]} of {prompt_tokens[0]} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
