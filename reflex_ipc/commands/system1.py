"""reflex system1: score candidate continuations of a prompt (or, with --chat, of the
assistant's turn) in one forward pass; the protocol's system1."""

import sys

SKIP = ("prompt", "cache_prompt", "messages", "chat_template", "chat_template_kwargs",
        "add_generation_prompt")  # one request per process: nothing to reuse
FLAGS = {"candidates": ["--candidate"], "kv_import": ["--import-kv"], "kv_export": ["--export-kv"]}
NAMES = {"prompt": "PROMPT", "messages": "PROMPT", "chat_template": "--chat-template"}


EXAMPLES = """\
  reflex system1 --chat "What is the capital of France?" --candidate Paris --candidate London
  reflex system1 "The sky on a clear day is" --candidate " blue" --candidate " green"
  reflex system1 --json --candidate " yes" --candidate " no" "Is the sun a star? Answer:"
Output: one line per candidate, the best marked *: its probability among the candidates,
the model's log-probability of its tokens (summed; natural log), its token count, its text."""


def add_arguments(p):
    from ..ops.system1 import Request
    from ._args import PROMPT_HELP, Layout
    from ._model import add_common
    from .generate import add_chat_arguments

    layout = Layout(p)
    layout.add("input", "prompt", nargs="?", metavar="PROMPT", help=PROMPT_HELP)
    add_common(layout, Request, skip=SKIP, flags=FLAGS,
               helps={"candidates": "a continuation to score (repeatable; at least one)"})
    add_chat_arguments(layout)
    layout.done()


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
    sys.stdout.write(table(out))
    t = out["timings"]
    sys.stderr.write(f"[entropy {out['entropy']:.4f} bits; load {t['load']:.0f} ms, prompt "
                     f"{t['prompt_eval']:.0f} ms, candidates {t['candidates_eval']:.0f} ms, "
                     f"backend {model.runner.ops.name}]\n")
    return 0


def table(out) -> str:
    """The candidates as a table: the best marked *; prob is the share among the
    candidates (they sum to 1), logprob the model's log-probability of the candidate's
    tokens after the prompt (natural log, summed over them), tokens their count."""
    rows = [("", "prob", "logprob", "tokens", "candidate")]
    for i, c in enumerate(out["candidates"]):
        rows.append(("*" if i == out["best_idx"] else "", f"{c['probability']:.4f}",
                     f"{c['logprob']:.4f}", str(len(c["token_ids"])), repr(c["text"])))
    w = [max(len(r[i]) for r in rows) for i in range(4)]
    return "".join(f"{r[0]:<{w[0]}} {r[1]:>{w[1]}}  {r[2]:>{w[2]}}  {r[3]:>{w[3]}}  {r[4]}".rstrip() + "\n"
                   for r in rows)
