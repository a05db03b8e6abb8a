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
    "http": ("http", "OpenAI-compatible HTTP front over a `reflex uds` engine (extra: http)"),
    "mcp": ("mcp", "Model Context Protocol server over stdio: generate, decide, embed, infill (extra: mcp)"),
    "generate": ("generate", "generate a continuation of a prompt"),
    "infill": ("infill", "fill in the middle between a prefix and a suffix (FIM models)"),
    "system1": ("system1", "score candidate continuations in one forward pass"),
    "embed": ("embed", "pooled hidden-state embeddings"),
    "tokenize": ("tokenize", "tokenize text with the model's tokenizer"),
    "detokenize": ("detokenize", "the text of token ids (the inverse of tokenize)"),
    "inspect": ("inspect", "show a GGUF file's architecture, hyperparameters and tensors"),
    "check": ("check", "greedy generation checked against a reference file (for CI)"),
    "smoke": ("smoke", "load the CUDA kernels, launch one, report timings"),
    "doctor": ("doctor", "report the backend --device auto picks and why, the C kernels, and "
                         "CUDA (GPU, driver, pycuda, kernel images)"),
    "bench": ("bench", "cold-start, warm and decode benchmarks"),
    "cache": ("cache", "the prefix cache of saved prompt states: ls, clear"),
}


# commands that load a model: CUDA init starts on a thread before anything else (cuda/__init__.py)
_MODEL_COMMANDS = ("stdio", "uds", "generate", "infill", "system1", "embed", "check")


def _device_arg(args):
    dev = "auto"
    for i, a in enumerate(args):
        if a == "--device" and i + 1 < len(args):
            dev = args[i + 1]
        elif a.startswith("--device="):
            dev = a.split("=", 1)[1]
    return dev


def _start_cuda_init(args):
    """Begin cuInit + context now, overlapping the imports and the model load, unless --device
    cpu. With --device cuda (and auto with REFLEX_START=gpu) the pycuda side (import, kernel
    load) starts now too; with auto it starts once the engine knows it wants the GPU (after
    numpy, which it imports too): a request the cpu backend answers first never waits for it
    (reflex_ipc/startrule.py)."""
    dev = _device_arg(args)
    if dev in ("cpu", "numpy"):
        return
    from . import settings
    from .cuda import device_index, start_driver, start_init

    try:
        index = device_index(dev)
    except ValueError:
        return  # a bad --device value: argparse reports it
    if dev == "auto" and settings.get().start != "gpu":
        start_driver(index)
    else:
        start_init(index)


def _usage(out):
    out.write("usage: reflex COMMAND [options]\n\ncommands:\n")
    for name, (_, text) in COMMANDS.items():
        out.write(f"  {name:<10} {text}\n")
    out.write("\n'reflex COMMAND --help' for a command's options.\n")


# one-shot commands whose process may hand its exit to a detached child (see _detach)
_ONE_SHOT = ("generate", "infill", "system1", "embed")


def _detach_wanted(args) -> bool:
    """Whether to run this one-shot command in a detached child: by default only when a
    CUDA context will exist (its teardown at exit takes ~0.1 s); REFLEX_DETACH=1/0 forces."""
    from . import settings
    from .errors import ReflexError

    try:
        env = settings.get().detach
    except ReflexError:  # a bad setting: _main reports it
        return False
    if env is not None:
        return env and bool(args) and args[0] in _ONE_SHOT
    if not args or args[0] not in _ONE_SHOT or _device_arg(args[1:]) in ("cpu", "numpy"):
        return False
    from .cuda import pycuda_installed

    return pycuda_installed()


def _detach():
    """Fork before any thread exists. The child does the work and writes the output; the
    parent, which the caller waits for, exits with the child's status as soon as the child
    says it is done. The child then closes its standard streams (so readers see EOF) and
    exits, and the CUDA driver's context teardown happens after the caller has its answer.
    Returns, in the child, the function that reports the status; the parent never returns."""
    import signal

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)

        def done(rc):
            os.write(w, bytes([rc & 0xFF]))
            os.close(w)
            for fd in (0, 1, 2):
                try:
                    os.close(fd)
                except OSError:
                    pass

        return done
    os.close(w)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: os.kill(pid, signum))
    status = os.read(r, 1)
    if status:
        os._exit(status[0])
    _, wstatus = os.waitpid(pid, 0)  # the child ended without reporting: killed
    code = os.waitstatus_to_exitcode(wstatus)
    os._exit(128 - code if code < 0 else code or 1)


def _fork_off():
    """Return in a child that the caller no longer waits for: the parent exits (its status
    was decided: the caller's answer is out), the child lets go of the standard streams."""
    try:
        pid = os.fork()
    except OSError:
        return  # no child: the work happens here, before the exit
    if pid:
        os._exit(_EXIT_STATUS[0])
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        try:
            os.dup2(null, fd)
        except OSError:
            pass


_EXIT_STATUS = [0]


def main(argv=None) -> int:
    """Entry point. As the console script (argv None) it ends with os._exit once its
    output is flushed, so interpreter teardown stays off the caller's wall clock; a one-shot
    command that will hold a CUDA context also runs in a detached child (_detach), which
    keeps the driver's teardown off it too. The prefix cache's writes happen after the
    answer: in that child, or else in a child forked once the output is flushed (only when
    something is to be written; REFLEX_DETACH=0: before this process exits)."""
    if argv is not None:
        return _main(list(argv))
    args = sys.argv[1:]
    done = _detach() if _detach_wanted(args) else None
    try:
        rc = _main(args)
    except BrokenPipeError:
        rc = _closed_stdout()
    except SystemExit as e:  # argparse's --help and usage errors
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
        if not isinstance(e.code, (int, type(None))):
            sys.stderr.write(f"{e.code}\n")
    except BaseException:
        import traceback

        traceback.print_exc()
        rc = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:  # None: the fd was closed when we started
                stream.flush()
        except BrokenPipeError:
            rc = rc or _closed_stdout()
        except (OSError, ValueError):
            pass  # a vanished reader: nothing left to tell it
    _EXIT_STATUS[0] = rc or 0
    if done is not None:
        done(rc or 0)
        w = sys.modules.get("reflex_ipc.cuda.weights")
        if w is not None:  # a weight upload still streaming from disk: the answer is out, stop it
            w.stop_streams()
    store = sys.modules.get("reflex_ipc.runtime.prefixstore")
    if store is not None and store.PENDING:
        # the prompt's state into the prefix cache, after the answer: in the detached child,
        # else in a child forked now (only when there is something to write), so that the
        # caller has its exit status at once
        from . import settings

        if done is None and settings.get().detach is not False:
            _fork_off()
        store.flush()
    if done is not None and "reflex_ipc.cuda" in sys.modules:
        from .cuda import teardown_when_no_init

        teardown_when_no_init()
    os._exit(rc or 0)


# the exit status of a command whose reader went away (`reflex inspect | head`): the one a
# process killed by SIGPIPE reports to the shell (128 + 13), with nothing printed
EXIT_CLOSED_STDOUT = 141


def _closed_stdout() -> int:
    """The reader of stdout has gone: say nothing more (Python would print a
    BrokenPipeError when it flushes stdout at exit: stdout now points at /dev/null)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
    return EXIT_CLOSED_STDOUT


def _main(argv) -> int:
    try:
        return _run(argv)
    except BrokenPipeError:
        return _closed_stdout()


def _run(argv) -> int:
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
    as_json = "--json" in argv[1:argv.index("--") if "--" in argv else len(argv)]
    from . import settings
    from .errors import ReflexError

    try:
        settings.get()  # every REFLEX_* variable, checked once (read at phases' import)
    except ReflexError as e:
        return _fail(name, e.kind, e.message, as_json)
    if name in _MODEL_COMMANDS:
        _start_cuda_init(argv[1:])
    import argparse
    import importlib

    class Parser(argparse.ArgumentParser):
        def error(self, message):  # a usage error: exit 2, as JSON with --json
            raise UsageError(self, message)

    mod = importlib.import_module(f"reflex_ipc.commands.{COMMANDS[name][0]}")
    parser = Parser(prog=f"reflex {name}", description=COMMANDS[name][1], epilog=examples(mod, name),
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    if getattr(mod, "MULTI", False):
        mod.add_arguments(parser, name)
    else:
        mod.add_arguments(parser)
    try:
        args = parser.parse_args(argv[1:])
        args.command = name
        phases.mark("main_args_parsed")
        return mod.run(args) or 0
    except UsageError as e:
        if not as_json:
            e.parser.print_usage(sys.stderr)
        return _fail(name, "invalid_request", e.message, as_json)
    except KeyboardInterrupt:
        return _fail(name, "cancelled", "interrupted", as_json)
    except BrokenPipeError:
        raise  # stdout's reader left: _main exits quietly
    except Exception as e:  # noqa: BLE001  (every failure: one message, one exit code)
        from .errors import error_kind

        kind = error_kind(e)
        if kind == "internal":
            import traceback

            traceback.print_exc()
        msg = getattr(e, "message", None) or str(e) or type(e).__name__
        return _fail(name, kind, msg, as_json)


def examples(mod, name):
    """The command's examples for the end of its --help: the module's EXAMPLES (a text, or
    {command: text} for a module with several commands)."""
    ex = getattr(mod, "EXAMPLES", None)
    if isinstance(ex, dict):
        ex = ex.get(name)
    return f"examples:\n{ex}" if ex else None


class UsageError(Exception):
    def __init__(self, parser, message):
        super().__init__(message)
        self.parser, self.message = parser, message


# Exit codes (README, "Exit codes"): 0 ok; 2 the command line or its input (the model
# file included) is wrong; 130 interrupted; 1 any other failure.
INPUT_KINDS = ("invalid_request", "model_not_found", "gguf_error", "state_error", "unsupported_architecture",
               "context_overflow")


def exit_code(kind: str) -> int:
    if kind in INPUT_KINDS:
        return 2
    return 130 if kind == "cancelled" else 1


def _fail(name, kind, message, as_json) -> int:
    """Report an error: with --json one object on stdout, else a line on stderr."""
    if as_json:
        import json

        sys.stdout.write(json.dumps({"error": {"kind": kind, "message": message}},
                                    ensure_ascii=False, separators=(",", ":")) + "\n")
    else:
        sys.stderr.write(f"reflex {name}: {kind}: {message}\n")
    return exit_code(kind)
