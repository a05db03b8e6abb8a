"""What the model commands (generate, system1, embed) share: load, then report."""

import sys


def load(args):
    """The runner for --model/--device/--n-ctx, with its phase mark."""
    from .. import phases
    from ..engine import load_runner

    runner = load_runner(args.model, device=args.device, n_ctx=args.n_ctx, lora=getattr(args, "lora", None))
    phases.mark("runner_loaded")
    return runner


def finish(runner, out, as_json) -> bool:
    """Add load time, phases and backend to `out`; with as_json write it as one line.
    Returns whether it was written."""
    from .. import phases

    phases.mark("done")
    out["timings"]["load"] = runner.load_ms
    out["timings"]["phases"] = phases.snapshot()
    out["backend"] = runner.ops.name
    if runner.ops.name == "cuda":
        from .. import cuda

        out["timings"]["cuda"] = {**{k: round(v, 2) for k, v in cuda.init_timings().items()},
                                  "upload": runner.ops.upload_stats()}
    if as_json:
        import orjson

        sys.stdout.buffer.write(orjson.dumps(out) + b"\n")
    return as_json
