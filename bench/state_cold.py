#!/usr/bin/env python3
"""Cold start from a saved prefix (issue 17's figure): cold `reflex system1` and `reflex
generate --max-tokens 1` processes whose prompt is a ~1,000-token system prompt SYS plus a
short question Q, run

  full     reflex OP "SYS+Q"                           (the whole prompt evaluated)
  import   reflex OP --import-kv SYS.state "Q"         (SYS's state loaded, Q evaluated)
  import_pinned     the same with REFLEX_STATE_PINNED=1 (through a page-locked staging buffer)
  empty    reflex OP "Q"                               (the target's base: a short prompt)
  peer     $PEER -m M -n 1 -ngl 99 "SYS+Q"             (llama-simple on the full prompt)

alternated run by run (one round = one run of each), each timed by the wall clock from just
before spawn to exit (reflex.commands.bench.timed_process). The state file is written once,
beforehand, by `reflex generate --export-kv` (its cost is reported too). Results: one JSON
with the machine, the commit, per-variant statistics and every sample, and the ratios the
issue asks for: import / empty (target <= 1.1), full / import, peer / import.

    python3 bench/state_cold.py --model M.gguf [--device cuda] [--runs 10] [--peer PATH]
                                [--reflex "CMD"] [--tokens 1000] --out RESULT.json

--reflex is the command that runs reflex (default: this Python with -m reflex_ipc; the
GPU wrapper scripts/gpu/gpu-bench-state passes a user-style venv's python).
"""

import argparse
import json
import os
import shlex
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from reflex_ipc.commands.bench import GPU, machine_info, stats, timed_process  # noqa: E402

SENTENCES = [
    "You are a careful assistant that answers questions about the weather, travel and food.",
    "Always answer in one short sentence, and say so when you do not know.",
    "Cities you know well include Paris, London, Berlin, Madrid, Rome, Vienna and Prague.",
    "Prefer metric units, and give temperatures in degrees Celsius.",
    "When a question is ambiguous, pick the most common reading and answer that.",
]
# starts with a space: after the system prompt's final "." no vocabulary here merges it (a
# leading newline merges into ".\n" in Qwen's BPE)
QUESTION = " Question: Which city is the capital of France?\nAnswer:"
CANDIDATES = (" Paris", " London", " Berlin")


def system_prompt(model, n_tokens):
    """A system prompt of at least n_tokens tokens with the model's tokenizer, such that
    tokens(SYS) + tokens(Q as a continuation) == tokens(SYS + Q) (checked)."""
    from reflex_ipc.gguffile import GGUFFile
    from reflex_ipc.modelpath import resolve_model
    from reflex_ipc.tokenizer import load_tokenizer

    with GGUFFile(resolve_model(model)) as f:
        tok = load_tokenizer(f)
        text, i = "", 0
        while len(tok.encode(text)) < n_tokens:
            text += SENTENCES[i % len(SENTENCES)] + "\n"
            i += 1
        # the end of the system prompt where the question's tokens do not merge into it
        # ("\n" + "\nQuestion" merges in some BPE vocabularies, e.g. Qwen's)
        for end in ("", "\n", " ."):
            t = text.rstrip("\n") + end
            n = len(tok.encode(t))
            joined = tok.encode(t + QUESTION)
            if joined[:n] == tok.encode(t):
                return t, n, len(joined) - n
        raise AssertionError("the question changes the system prompt's tokens")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--tokens", type=int, default=1000, help="system prompt length (tokens, at least)")
    p.add_argument("--peer", default=os.environ.get("PEER"), help="llama-simple (default: $PEER)")
    p.add_argument("--reflex", default=f"{shlex.quote(sys.executable)} -m reflex_ipc")
    p.add_argument("--ops", default="system1,generate")
    p.add_argument("--label", default="")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)

    reflex = shlex.split(a.reflex)
    sys_text, n_sys, n_q = system_prompt(a.model, a.tokens)
    full = sys_text + QUESTION
    gpu = GPU()
    idle_w = gpu.idle_power_w() if gpu.nv else None
    tmp = tempfile.mkdtemp(prefix="reflex-state-bench-")
    state = os.path.join(tmp, "sys.state")
    dev = ["--device", a.device, "--model", a.model, "--json"]
    exp, stdout, _ = timed_process(reflex + ["generate", *dev, "--max-tokens", "1", "--export-kv", state, sys_text])
    if exp["rc"] != 0:
        sys.stderr.write(exp.get("stderr_tail", "") + "\nexport failed\n")
        return 1
    exported = json.loads(stdout.decode().strip().splitlines()[-1])
    out = {"bench": "state_cold", "label": a.label, "machine": machine_info(gpu), "model": a.model,
           "device": a.device, "runs": a.runs, "system_prompt_tokens": n_sys, "question_tokens": n_q,
           "state_file_bytes": os.path.getsize(state),
           "export": {"wall_ms": exp["wall_ms"], "state_save_ms": exported["timings"].get("state_save")},
           "idle_power_w": idle_w, "ops": {}}
    for op in a.ops.split(","):
        extra = [x for c in CANDIDATES for x in ("--candidate", c)] if op == "system1" else ["--max-tokens", "1"]
        variants = {
            "full": (reflex + [op, *dev, *extra, full], None),
            "import": (reflex + [op, *dev, *extra, "--import-kv", state, QUESTION], None),
            "import_pinned": (reflex + [op, *dev, *extra, "--import-kv", state, QUESTION],
                              {"REFLEX_STATE_PINNED": "1"}),
            "empty": (reflex + [op, *dev, *extra, QUESTION], None),
        }
        if a.peer:
            variants["peer"] = (f"{shlex.quote(a.peer)} -m {shlex.quote(a.model)} -n 1 -ngl 99 "
                                f"{shlex.quote(full)}", None)
        runs = {k: [] for k in variants}
        for _ in range(a.runs):
            for k, (cmd, env) in variants.items():
                saved = {e: os.environ.get(e) for e in (env or {})}
                os.environ.update(env or {})
                try:
                    r, so, _ = timed_process(cmd, shell=isinstance(cmd, str), gpu=gpu, idle_w=idle_w)
                finally:
                    for e, v in saved.items():
                        if v is None:
                            os.environ.pop(e, None)
                        else:
                            os.environ[e] = v
                if k != "peer" and r["rc"] == 0:
                    try:
                        res = json.loads(so.decode().strip().splitlines()[-1])
                        t = res.get("timings") or {}
                        r["timings"] = {x: t.get(x) for x in ("load", "prompt_eval", "state_load", "total")}
                        r["cached_tokens"] = res.get("cached_tokens")
                        r["prompt_tokens"] = res.get("prompt_tokens")
                    except (ValueError, IndexError):
                        pass
                runs[k].append(r)
        med = {k: stats([r["wall_ms"] for r in v if r["rc"] == 0]) for k, v in runs.items()}
        m = {k: (s or {}).get("p50") for k, s in med.items()}

        def ratio(x, y):
            return round(m[x] / m[y], 3) if m.get(x) and m.get(y) else None

        out["ops"][op] = {
            "wall_ms": med,
            "failures": {k: sum(r["rc"] != 0 for r in v) for k, v in runs.items()},
            "ratios_of_medians": {"import/empty (target <= 1.1)": ratio("import", "empty"),
                                  "full/import": ratio("full", "import"),
                                  "import_pinned/import": ratio("import_pinned", "import"),
                                  "peer/import": ratio("peer", "import"),
                                  "peer/full": ratio("peer", "full")},
            "commands": {k: (c if isinstance(c, str) else shlex.join(c))[:400] for k, (c, _) in variants.items()},
            "per_run": runs,
        }
        print(f"{op}: " + ", ".join(f"{k} {v} ms" for k, v in m.items()) + f"; {out['ops'][op]['ratios_of_medians']}",
              flush=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
