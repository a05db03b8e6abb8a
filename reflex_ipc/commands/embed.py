"""reflex embed: pooled final hidden states of texts."""

import sys


def add_arguments(p):
    p.add_argument("--model", help="GGUF path or alias (default: $REFLEX_MODEL, else smollm2)")
    p.add_argument("--device", default="auto", choices=["cpu", "cuda", "auto", "numpy"])
    p.add_argument("--n-ctx", type=int, default=None, help="context size (default: min(train, 4096))")
    p.add_argument("--pooling", default="mean", choices=["mean", "last", "cls"])
    p.add_argument("--normalize", action="store_true", help="L2-normalize each embedding")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("texts", nargs="+")


def run(args):
    from ._model import finish, load

    runner = load(args)
    out = runner.embed(args.texts, pooling=args.pooling, normalize=args.normalize)
    if finish(runner, out, args.json):
        return 0
    for v in out["embeddings"]:
        sys.stdout.write(" ".join(f"{x:.6g}" for x in v) + "\n")
    sys.stderr.write(f"[{len(out['embeddings'])} x {out['dim']}, load {out['timings']['load']:.0f} ms, "
                     f"embed {out['timings']['total']:.0f} ms, backend {runner.ops.name}]\n")
    return 0
