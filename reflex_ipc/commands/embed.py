"""reflex embed: pooled final hidden states of texts; the protocol's embed."""

import sys

SKIP = ("input",)


EXAMPLES = """\
  reflex embed "hello" "world"                   (one line of numbers per TEXT)
  reflex embed --json --normalize "hello" "world"
  reflex embed --pooling last < document.txt"""


def add_arguments(p):
    from ..ops.embed import Request
    from ._args import Layout
    from ._model import add_common

    layout = Layout(p)
    layout.add("input", "texts", nargs="*", metavar="TEXT",
               help="the texts; '-' or none: one text read from stdin")
    add_common(layout, Request, skip=SKIP, sections={"pooling": "output", "normalize": "output"})
    layout.done()


def run(args):
    from ..ops import embed
    from ._args import read_text, request
    from ._model import finish, load, run_op

    texts = [read_text(t, "TEXT") if t == "-" else t for t in args.texts] or [read_text(None, "TEXT")]
    req = request(embed.Request, args, {"input": texts}, skip=SKIP, names={"input": "TEXT"})
    model, req = load(args, req)
    out = run_op(model, lambda: model.embed(req))
    if finish(model, out, args.json):
        return 0
    for v in out["embeddings"]:
        sys.stdout.write(" ".join(f"{x:.6g}" for x in v) + "\n")
    sys.stderr.write(f"[{len(out['embeddings'])} x {out['dim']}, load {out['timings']['load']:.0f} ms, "
                     f"embed {out['timings']['total']:.0f} ms, backend {model.runner.ops.name}]\n")
    return 0
