"""What the model commands (generate, system1, embed, infill) share: the common options,
load (an api.Model: the commands run its methods, as the server's ops do), the context
hints, then report."""

import sys

MODEL_HELP = {"model": "GGUF path or alias; default: $REFLEX_MODEL, else smollm2",
              "device": "auto: CUDA when usable, else CPU; default: auto",
              "prefix_cache": "neither read nor write the prefix cache (the saved states of "
                              "prompts' leading tokens that the machine's reflex processes share, "
                              "written after the answer; see `reflex cache --help`)"}


def _positive(text):
    import argparse

    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"not a positive integer: {text!r}")
    return n


def add_common(p, cls, **kw):
    """The op's options (from its Request struct), --n-ctx and --json."""
    from ._args import add_options

    add_options(p, cls, helps={**MODEL_HELP, **kw.pop("helps", {})}, **kw)
    p.add_argument("--n-ctx", type=_positive, default=None, metavar="N",
                   help="context size in tokens; default: the model's trained context, "
                        "at most 4096 (above the trained context: a warning)")
    p.add_argument("--lora", action="append", default=[], metavar="FILE[:SCALE]",
                   help="apply a LoRA adapter (llama.cpp's GGUF adapter format) at load, its "
                   "product scaled by SCALE (default 1); repeatable")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout "
                   "(errors too: {\"error\": {\"kind\", \"message\"}})")


def load(args, req=None):
    """The api.Model of the request's model/device (default: args.model/args.device) and
    --n-ctx, with its phase mark; warns when --n-ctx is above the model's trained context.
    The request's model/device are the command line's: the Model's calls get the request
    without them."""
    import msgspec

    from .. import phases
    from ..api import Model

    model, device = (req.model, req.device) if req is not None else (args.model, args.device)
    m = Model.load(model, device=device or "auto", n_ctx=args.n_ctx, lora=getattr(args, "lora", None))
    phases.mark("runner_loaded")
    train = m.info().get("n_ctx_train")
    if args.n_ctx and train and args.n_ctx > train:
        sys.stderr.write(f"reflex {args.command}: warning: --n-ctx {args.n_ctx} is above the "
                         f"model's trained context ({train}); output past {train} tokens "
                         "may degrade\n")
    if req is not None:
        req = msgspec.structs.replace(req, model=None, device=None)
    return m, req


def run_op(model, fn):
    """fn(); a context_overflow error names --n-ctx."""
    from ..errors import ReflexError

    try:
        return fn()
    except ReflexError as e:
        if e.kind != "context_overflow":
            raise
        runner = model.runner
        train = runner.info().get("n_ctx_train")
        hint = f"--n-ctx is {runner.n_ctx}"
        if train and train > runner.n_ctx:
            hint += f"; the model was trained on {train}: a larger --n-ctx (up to {train}) fits more"
        raise ReflexError("context_overflow", f"{e.message} ({hint})") from None


def _enc_hook(obj):
    tolist = getattr(obj, "tolist", None)  # numpy arrays and scalars
    if tolist is not None:
        return tolist()
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def write_json(obj) -> None:
    import msgspec

    sys.stdout.buffer.write(msgspec.json.encode(obj, enc_hook=_enc_hook) + b"\n")


def finish(model, out, as_json) -> bool:
    """Add load time, phases and backend to `out`; with as_json write it as one line.
    Returns whether it was written."""
    from .. import phases

    runner = model.runner
    phases.mark("done")
    out["timings"]["load"] = runner.load_ms
    out["timings"]["phases"] = phases.snapshot()
    out["backend"] = runner.ops.name
    if runner.ops.name == "cuda":
        from .. import cuda

        out["timings"]["cuda"] = {**{k: round(v, 2) for k, v in cuda.init_timings().items()},
                                  "upload": runner.ops.upload_stats()}
    if as_json:
        write_json(out)
    return as_json
