"""`reflex` command line.

Only the module of the command being run is imported: the table below is all
the start-up pays for the others. Each command module defines
`add_arguments(parser)` and `run(args) -> int`.
"""

import os
import sys

# name: (module under reflex_ipc.commands, one-line help)
COMMANDS = {
    "stdio": ("serve", "serve JSON lines on stdin/stdout"),
    "uds": ("serve", "serve JSON lines on a Unix domain socket"),
    "generate": ("generate", "generate a continuation of a prompt"),
    "system1": ("system1", "score candidate continuations in one forward pass"),
    "embed": ("embed", "pooled hidden-state embeddings"),
    "tokenize": ("tokenize", "tokenize text with the model's tokenizer"),
    "inspect": ("inspect", "show a GGUF file's architecture, hyperparameters and tensors"),
    "smoke": ("smoke", "load the CUDA kernels, launch one, report timings"),
    "doctor": ("doctor", "report GPU, driver, pycuda, kernel images, NVML"),
    "bench": ("bench", "cold-start, warm and decode benchmarks"),
}


# commands that load a model: CUDA init starts on a thread before anything else (cuda/__init__.py)
_MODEL_COMMANDS = ("stdio", "uds", "generate", "system1", "embed")


def _start_cuda_init(args):
    """Begin cuInit + context + kernel load now, overlapping the imports and the model load,
    unless --device cpu."""
    dev = "auto"
    for i, a in enumerate(args):
        if a == "--device" and i + 1 < len(args):
            dev = args[i + 1]
        elif a.startswith("--device="):
            dev = a.split("=", 1)[1]
    if dev == "cpu":
        return
    from .cuda import device_index, start_init

    try:
        start_init(device_index(dev))
    except ValueError:
        pass  # a bad --device value: argparse reports it


def _usage(out):
    out.write("usage: reflex COMMAND [options]\n\ncommands:\n")
    for name, (_, text) in COMMANDS.items():
        out.write(f"  {name:<10} {text}\n")
    out.write("\n'reflex COMMAND --help' for a command's options.\n")


def main(argv=None) -> int:
    """Entry point. As the console script (argv None) it ends with os._exit once its
    output is flushed: interpreter and CUDA driver teardown (about 0.1 s with a GPU
    context) stay off the caller's wall clock."""
    if argv is not None:
        return _main(list(argv))
    try:
        rc = _main(sys.argv[1:])
    except SystemExit as e:  # argparse's --help and usage errors
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
        if not isinstance(e.code, (int, type(None))):
            sys.stderr.write(f"{e.code}\n")
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # a vanished reader: nothing left to tell it
    os._exit(rc or 0)


def _main(argv) -> int:
    from . import phases  # noqa: F401  (starts the clock: import it first)

    if not argv or argv[0] in ("-h", "--help"):
        _usage(sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        from . import __version__

        print(__version__)
        return 0
    name = argv[0]
    if name not in COMMANDS:
        sys.stderr.write(f"reflex: unknown command {name!r}\n")
        _usage(sys.stderr)
        return 2
    if name in _MODEL_COMMANDS:
        _start_cuda_init(argv[1:])
    import argparse
    import importlib

    mod = importlib.import_module(f"reflex_ipc.commands.{COMMANDS[name][0]}")
    parser = argparse.ArgumentParser(prog=f"reflex {name}", description=COMMANDS[name][1])
    if getattr(mod, "MULTI", False):
        mod.add_arguments(parser, name)
    else:
        mod.add_arguments(parser)
    args = parser.parse_args(argv[1:])
    args.command = name
    phases.mark("main_args_parsed")
    from .errors import ReflexError
    from .gguffile import GGUFError

    try:
        return mod.run(args) or 0
    except (ReflexError, GGUFError) as e:
        kind = getattr(e, "kind", "internal")
        msg = getattr(e, "message", None) or str(e)
        sys.stderr.write(f"reflex {name}: {kind}: {msg}\n")
        return 1
    except KeyboardInterrupt:
        return 130
