"""reflex infill: fill in the middle between --prefix and --suffix (models with FIM
tokens); the protocol's infill."""

import sys

SKIP = ("stream", "cache_prompt", "prefix", "suffix", "input_extra", "json_schema", "grammar")
NAMES = {"prefix": "--prefix", "suffix": "--suffix", "input_extra": "--extra",
         "json_schema": "--json-schema", "grammar": "--grammar"}


EXAMPLES = """\
  reflex infill --model coder.gguf --prefix $'def add(a, b):\\n    return ' --suffix $'\\n'
  reflex infill --model coder.gguf --prefix @before.py --suffix @after.py --extra utils.py
The model must have been trained to fill in the middle (FIM tokens in its vocabulary),
e.g. Qwen2.5-Coder-0.5B's GGUF from Hugging Face; the default model (SmolLM2) has none.
To try the command without one: python -m reflex_ipc.testing.demo fim /tmp/fim-demo.gguf
(a tiny untrained model with FIM tokens: it shows the mechanics, its text is noise)."""


def add_arguments(p):
    from ..ops.infill import Request
    from ._args import Layout
    from ._model import add_common
    from .generate import add_constraint_arguments

    layout = Layout(p)
    layout.add("input", "--prefix", required=True, metavar="TEXT",
               help="text before the cursor (@FILE reads a file)")
    layout.add("input", "--suffix", default="", metavar="TEXT",
               help="text after the cursor (@FILE reads a file)")
    layout.add("input", "--extra", action="append", default=[], metavar="FILE",
               help="another file of the project as context (repeatable)")
    add_common(layout, Request, skip=SKIP, helps={"stop": "stop string (repeatable)"})
    add_constraint_arguments(layout)
    layout.done()


def run(args):
    from ..ops import infill
    from ._args import request
    from ._model import finish, load, run_op
    from .generate import constraint_fields, read_arg

    extra = []
    for path in args.extra:
        with open(path, encoding="utf-8") as fh:
            extra.append({"filename": path, "text": fh.read()})
    given = {"prefix": read_arg(args.prefix), "suffix": read_arg(args.suffix),
             "input_extra": extra, **constraint_fields(args)}
    req = request(infill.Request, args, given, skip=SKIP, names=NAMES)
    model, req = load(args, req)

    def on_token(token_id, text, **_):
        if not args.json and text:
            sys.stdout.write(text)
            sys.stdout.flush()

    out = run_op(model, lambda: model.infill(req, on_token=on_token))
    if not finish(model, out, args.json):
        sys.stdout.write("\n")
        sys.stderr.write(f"[{out['prompt_tokens']} prompt tokens, {out['completion_tokens']} "
                         f"generated, finish {out['finish_reason']}]\n")
    return 0
