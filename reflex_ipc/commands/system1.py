"""reflex system1: score candidate continuations of a prompt (or, with --chat, of the
assistant's turn) in one forward pass; the protocol's system1."""

import sys

SKIP = ("prompt", "cache_prompt", "messages", "chat_template", "chat_template_kwargs",
        "add_generation_prompt")  # one request per process: nothing to reuse
FLAGS = {"candidates": ["--candidate"], "kv_import": ["--import-kv"], "kv_export": ["--export-kv"]}
NAMES = {"prompt": "PROMPT", "messages": "PROMPT", "chat_template": "--chat-template"}


def add_arguments(p):
    from ..ops.system1 import Request
    from ._args import PROMPT_HELP
    from ._model import add_common
    from .generate import add_chat_arguments

    add_common(p, Request, skip=SKIP, flags=FLAGS,
               helps={"candidates": "a continuation (repeatable; at least one)"})
    add_chat_arguments(p)
    p.add_argument("prompt", nargs="?", metavar="PROMPT", help=PROMPT_HELP)


def run(args):
    from ..ops import system1
    from ._args import read_text, request
    from ._model import finish, load, run_op
    from .generate import chat_fields

    req = request(system1.Request, args, chat_fields(args, read_text(args.prompt)), skip=SKIP,
                  flags=FLAGS, names=NAMES)
    model, req = load(args, req)
    out = run_op(model, lambda: model.decide(req))
    if finish(model, out, args.json):
        return 0
    for i, c in enumerate(out["candidates"]):
        mark = "*" if i == out["best_idx"] else " "
        sys.stdout.write(f"{mark} {c['probability']:.4f}  logprob {c['logprob']:9.4f}  "
                         f"({len(c['token_ids'])} tokens)  {c['text']!r}\n")
    t = out["timings"]
    sys.stderr.write(f"[entropy {out['entropy']:.4f} bits; load {t['load']:.0f} ms, prompt "
                     f"{t['prompt_eval']:.0f} ms, candidates {t['candidates_eval']:.0f} ms, "
                     f"backend {model.runner.ops.name}]\n")
    return 0
