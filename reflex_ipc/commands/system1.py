"""reflex system1: score candidate continuations of a prompt in one forward pass."""

import sys

SKIP = ("prompt", "cache_prompt")  # one request per process: nothing to reuse
FLAGS = {"candidates": ["--candidate"], "kv_import": ["--import-kv"], "kv_export": ["--export-kv"]}


def add_arguments(p):
    from ..ops.system1 import Request
    from ._args import PROMPT_HELP
    from ._model import add_common

    add_common(p, Request, skip=SKIP, flags=FLAGS,
               helps={"candidates": "a continuation (repeatable; at least one)"})
    p.add_argument("prompt", nargs="?", metavar="PROMPT", help=PROMPT_HELP)


def run(args):
    from ..ops import system1
    from ._args import read_text, request
    from ._model import finish, load, run_op

    req = request(system1.Request, args, {"prompt": read_text(args.prompt)}, skip=SKIP,
                  flags=FLAGS)
    runner = load(args, req)
    out = run_op(runner, lambda: system1.execute(runner, req))
    if finish(runner, out, args.json):
        return 0
    for i, c in enumerate(out["candidates"]):
        mark = "*" if i == out["best_idx"] else " "
        sys.stdout.write(f"{mark} {c['probability']:.4f}  logprob {c['logprob']:9.4f}  "
                         f"({len(c['token_ids'])} tokens)  {c['text']!r}\n")
    t = out["timings"]
    sys.stderr.write(f"[entropy {out['entropy']:.4f} bits; load {t['load']:.0f} ms, prompt "
                     f"{t['prompt_eval']:.0f} ms, candidates {t['candidates_eval']:.0f} ms, "
                     f"backend {runner.ops.name}]\n")
    return 0
