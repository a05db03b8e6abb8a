"""What the model commands (generate, system1, embed, infill) share: the common options,
load (an api.Model: the commands run its methods, as the server's ops do), the context
hints, then report."""

import sys

MODEL_HELP = {"model": "GGUF path or alias; default: $REFLEX_MODEL, else smollm2",
              "device": "auto: CUDA when usable, else the C kernels (cpu); numpy: the float32 "
                        "oracle; default: auto",
              # the protocol's descriptions name repository files; an installed wheel has none
              "kv_import": "a state file written by --export-kv to start from; PROMPT is then "
                           "the text that follows its tokens",
              "kv_export": "save the model's state after the prompt to FILE (replaced atomically)",
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


def add_common(layout, cls, **kw):
    """The op's options (from its Request struct), --n-ctx, --lora and --json, into the
    sections of `layout` (a _args.Layout; the command adds its own, then calls done())."""
    from ._args import add_options

    add_options(layout, cls, helps={**MODEL_HELP, **kw.pop("helps", {})}, **kw)
    layout.add("model", "--n-ctx", type=_positive, default=None, metavar="N",
               help="context size in tokens; default: the model's trained context, "
                    "at most 4096 (above the trained context: a warning)")
    layout.add("model", "--lora", action="append", default=[], metavar="FILE[:SCALE]",
               help="apply a LoRA adapter (llama.cpp's GGUF adapter format) at load, its "
               "product scaled by SCALE (default 1); repeatable")
    layout.add("output", "--json", action="store_true", help="one JSON object on stdout "
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
    device = device or "auto"
    start = early_start(args.command, model, req) if device == "auto" and req is not None else {}
    if device in ("cpu", "numpy") or (device == "auto" and start.get("start") != "gpu"):
        premap(model)
    m = Model.load(model, device=device, n_ctx=args.n_ctx, lora=getattr(args, "lora", None), **start)
    phases.mark("runner_loaded")
    train = m.info().get("n_ctx_train")
    if args.n_ctx and train and args.n_ctx > train:
        sys.stderr.write(f"reflex {args.command}: warning: --n-ctx {args.n_ctx} is above the "
                         f"model's trained context ({train}); output past {train} tokens "
                         "may degrade\n")
    if req is not None:
        req = msgspec.structs.replace(req, model=None, device=None)
    return m, req


def early_start(command, model, req) -> dict:
    """One request per process with --device auto: whether CUDA is worth bringing up at all,
    from the request and the file's size before anything is parsed (startrule.early: the
    prompt's bytes bound its tokens). Returns Model.load's start arguments: {"start": "gpu"}
    (CUDA only, as before), {"gpu_now": False} (the cpu backend; CUDA only if the request,
    once tokenized, asks for it) or {} (the cpu backend now, CUDA coming up beside it)."""
    from .. import phases, settings, startrule
    from ..cuda import progress, pycuda_installed
    from ..errors import ReflexError
    from ..modelpath import resolve_model

    mode = settings.get().start
    if not pycuda_installed():
        return {}  # "auto" is the cpu backend here
    if mode == "gpu":
        return {"start": "gpu"}
    try:
        path = resolve_model(model)
    except ReflexError:
        return {}  # the load reports it
    text = 0
    for name in ("prompt", "prefix", "suffix"):
        v = getattr(req, name, None)
        text += len(v.encode()) if isinstance(v, str) else 0
    inp = getattr(req, "input", None)
    if inp is not None:
        text += sum(len(x.encode()) for x in ([inp] if isinstance(inp, str) else inp))
    msgs = getattr(req, "messages", None)
    for m in msgs or ():
        c = getattr(m, "content", None)
        text += len(c.encode()) if isinstance(c, str) else 256
    cands = getattr(req, "candidates", None) or ()
    d = startrule.early(path, "system1" if command == "system1" else "embed" if command == "embed" else "generate",
                        prompt_bytes=text, gen_tokens=getattr(req, "max_tokens", 0) or 0,
                        candidate_bytes=sum(len(c.encode()) for c in cands), chat=msgs is not None,
                        n=getattr(req, "n", 1) or 1, mode=mode, now_ms=phases.since_launch_ms(),
                        progress=progress())
    phases.mark("start_rule")
    EARLY.update(d)
    if d["choice"] == "gpu":
        return {"start": "gpu"}
    return {"gpu_now": d["choice"] != "cpu"}


EARLY = {}  # the CLI's early start decision (finish() reports it)


def premap(model):
    """The cpu backend will read every weight page on its first pass: map the file now and
    populate its pages on a thread while numpy imports and the GGUF is parsed (prefault.py)."""
    from .. import prefault
    from ..errors import ReflexError
    from ..modelpath import resolve_model

    try:
        prefault.premap(resolve_model(model))
    except ReflexError:
        pass  # the load reports it


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
    if EARLY:
        out["timings"]["start_early"] = dict(EARLY)
    if runner.ops.name == "cuda":
        from .. import cuda

        out["timings"]["cuda"] = {**{k: round(v, 2) for k, v in cuda.init_timings().items()},
                                  "upload": runner.ops.upload_stats()}
    if as_json:
        write_json(out)
    return as_json
