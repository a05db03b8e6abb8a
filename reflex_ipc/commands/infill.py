"""reflex infill: fill in the middle between --prefix and --suffix (models with FIM tokens)."""

import sys


def add_arguments(p):
    from .generate import add_sampling

    p.add_argument("--model", help="GGUF path or alias (default: $REFLEX_MODEL, else smollm2)")
    p.add_argument("--device", default="auto", choices=["cpu", "cuda", "auto"])
    p.add_argument("--n-ctx", type=int, default=None, help="context size (default: min(train, 4096))")
    p.add_argument("--max-tokens", type=int, default=64)
    add_sampling(p)
    p.add_argument("--prefix", required=True, help="text before the cursor (@FILE reads a file)")
    p.add_argument("--suffix", default="", help="text after the cursor (@FILE reads a file)")
    p.add_argument("--extra", action="append", default=[], metavar="FILE",
                   help="another file of the project as context (repeatable)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")


def run(args):
    from ._model import finish, load
    from .generate import read_arg, sampling_kwargs

    extra = []
    for path in args.extra:
        with open(path, encoding="utf-8") as fh:
            extra.append({"filename": path, "text": fh.read()})
    runner = load(args)

    def on_token(token_id, text, **kw):
        if not args.json and text:
            sys.stdout.write(text)
            sys.stdout.flush()

    from ..prepare import infill_ids

    ids = infill_ids(runner, read_arg(args.prefix), read_arg(args.suffix), input_extra=extra,
                     max_tokens=args.max_tokens)
    out = runner.generate(ids, max_tokens=args.max_tokens, on_token=on_token,
                          **sampling_kwargs(args))
    if not finish(runner, out, args.json):
        sys.stdout.write("\n")
        sys.stderr.write(f"[{out['prompt_tokens']} prompt tokens, {out['completion_tokens']} "
                         f"generated, finish {out['finish_reason']}]\n")
    return 0
