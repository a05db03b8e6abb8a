"""reflex generate: continue a prompt (greedy by default); the protocol's generate."""

import sys

SKIP = ("prompt", "stream", "cache_prompt")  # one request per process: nothing to reuse
FLAGS = {"kv_import": ["--import-kv"], "kv_export": ["--export-kv"]}


def add_arguments(p):
    from ..ops.generate import Request
    from ._args import PROMPT_HELP
    from ._model import add_common

    add_common(p, Request, skip=SKIP, flags=FLAGS, helps={"stop": "stop string (repeatable)"})
    p.add_argument("prompt", nargs="?", metavar="PROMPT", help=PROMPT_HELP)


def run(args):
    from .. import phases
    from ..ops import generate
    from ._args import read_text, request
    from ._model import finish, load, run_op

    req = request(generate.Request, args, {"prompt": read_text(args.prompt)}, skip=SKIP, flags=FLAGS)
    runner = load(args, req)
    first = []

    def on_token(token_id, text):
        if not first:
            first.append(phases.mark("first_token"))
        if not args.json and text:
            sys.stdout.write(text)
            sys.stdout.flush()

    out = run_op(runner, lambda: generate.execute(runner, req, on_token=on_token))
    if not finish(runner, out, args.json):
        sys.stdout.write("\n")
        t = out["timings"]
        sys.stderr.write(f"[{out['prompt_tokens']} prompt tokens, {out['completion_tokens']} generated, "
                         f"finish {out['finish_reason']}; load {t['load']:.0f} ms, prompt "
                         f"{t['prompt_eval']:.0f} ms, decode {t['decode']:.0f} ms"
                         + (f" ({t['decode_tokens_per_s']:.1f} tok/s)" if t.get("decode_tokens_per_s") else "")
                         + f", backend {runner.ops.name}]\n")
    return 0
