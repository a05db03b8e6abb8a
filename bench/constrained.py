"""Per-token overhead of constrained decoding (llguidance, json_schema).

    python bench/constrained.py [--device cpu|cuda] [--model M] [--runs 5] [--out DIR]

In one process: load_runner, a warm-up, then `--runs` rounds of
- constrained: generate under a JSON Schema (an object with an array of 24
  records: a long output), greedy;
- unconstrained: generate the same number of tokens from the same prompt,
  greedy, end-of-generation ignored (so both decode the same count);
- mask only: the constrained output's tokens replayed through a fresh
  constraint, timing allowed() + commit() alone (the host-side part of a step).
The figures: decode ms/token of each, the difference as a share of the
unconstrained step, and the mask-only time per token as a share of it. Every
constrained output is checked to parse and validate. Writes
bench/results/constrained-<backend>-<commit>.json with every sample.
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

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "records": {"type": "array", "minItems": 24, "maxItems": 24, "items": {
            "type": "object",
            "properties": {"day": {"type": "integer", "minimum": 1, "maximum": 31},
                           "weather": {"enum": ["sunny", "cloudy", "rain", "snow"]},
                           "high": {"type": "integer", "minimum": -40, "maximum": 50}},
            "required": ["day", "weather", "high"], "additionalProperties": False}},
    },
    "required": ["city", "records"], "additionalProperties": False,
}
PROMPT = ("<|im_start|>user\nGive the weather of Paris for 24 days as JSON.<|im_end|>\n"
          "<|im_start|>assistant\n")


def git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=10).stdout.strip() or None
    except Exception:
        return None


class _NoEog:
    """The tokenizer with an empty end-of-generation set (decode the full count)."""

    def __init__(self, tok):
        self._tok = tok
        self.eog_ids = frozenset()

    def __getattr__(self, name):
        return getattr(self._tok, name)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    ap.add_argument("--model", default=None)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args(argv)
    sys.path.insert(0, ROOT)
    import jsonschema

    from reflex_ipc.commands.bench import cpu_model
    from reflex_ipc.constrain import make_constraint, lltokenizer
    from reflex_ipc.engine import load_runner

    runner = load_runner(args.model, device=args.device)
    tok = runner.tok
    t = time.perf_counter()
    lltokenizer(tok)
    lltok_ms = (time.perf_counter() - t) * 1e3
    t = time.perf_counter()
    make_constraint(tok, json_schema=SCHEMA)
    compile_ms = (time.perf_counter() - t) * 1e3

    def constrained():
        c = make_constraint(tok, json_schema=SCHEMA)
        out = runner.generate(PROMPT, max_tokens=args.max_tokens, constraint=c, cache_prompt=False)
        jsonschema.validate(json.loads(out["text"]), SCHEMA)
        return out

    def plain(n):
        real = runner.tok
        runner.tok = _NoEog(real)
        try:
            return runner.generate(PROMPT, max_tokens=n, cache_prompt=False)
        finally:
            runner.tok = real

    def per_tok(out):
        n = out["completion_tokens"]
        return out["timings"]["decode"] / max(n - 1, 1)

    first = constrained()  # warm-up
    n = first["completion_tokens"]
    plain(n)
    c_ms, p_ms, mask_ms = [], [], []
    for _ in range(args.runs):
        out = constrained()
        c_ms.append(round(per_tok(out), 4))
        p_ms.append(round(per_tok(plain(out["completion_tokens"])), 4))
        c = make_constraint(tok, json_schema=SCHEMA)
        t = time.perf_counter()
        for tid in out["token_ids"]:
            c.allowed()
            c.commit(tid)
        mask_ms.append(round((time.perf_counter() - t) * 1e3 / len(out["token_ids"]), 4))
    mc, mp, mm = statistics.median(c_ms), statistics.median(p_ms), statistics.median(mask_ms)
    info = runner.info()
    res = {
        "what": "per-token overhead of json_schema-constrained greedy decoding",
        "model": info.get("model"), "backend": info.get("backend"), "device": args.device,
        "completion_tokens": n, "schema": SCHEMA,
        "median_decode_ms_per_token_constrained": mc, "median_decode_ms_per_token_plain": mp,
        "overhead_share_of_step": round((mc - mp) / mp, 4),
        "median_mask_ms_per_token": mm, "mask_share_of_step": round(mm / mp, 4),
        "lltokenizer_build_ms": round(lltok_ms, 1), "schema_compile_ms": round(compile_ms, 1),
        "samples_constrained": c_ms, "samples_plain": p_ms, "samples_mask": mask_ms,
        "example_output": first["text"][:300],
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
                    "loadavg": os.getloadavg()},
        "commit": git_commit(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"constrained-{info.get('backend')}-{res['commit']}.json")
    with open(path, "w") as fh:
        json.dump(res, fh, indent=1)
    print(f"{path}: {n} tokens; decode {mc:.2f} ms/token constrained vs {mp:.2f} plain "
          f"({res['overhead_share_of_step'] * 100:+.1f}%); mask alone {mm:.3f} ms/token "
          f"({res['mask_share_of_step'] * 100:.1f}% of a step)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
