"""reflex stdio / reflex uds PATH: the protocol loop (protocol/PROTOCOL.md)."""

import sys

MULTI = True  # one module for two commands: add_arguments(parser, name)


def _mode(text):
    import argparse

    try:
        mode = int(text, 8)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an octal mode: {text!r}") from None
    if not 0 <= mode <= 0o777 or mode & 0o600 != 0o600:
        raise argparse.ArgumentTypeError(f"mode {text} must be within 777 and include 600")
    return mode


def _size(text):
    import argparse

    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"not a positive byte count: {text!r}")
    return n


def _seconds(text):
    import argparse
    import math

    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not (v >= 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"not a number of seconds >= 0: {text!r}")
    return v


def _dir(text):
    import argparse
    import os

    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"not a directory: {text!r}")
    return text


EXAMPLES = {
    "stdio": """\
  echo '{"id": 1, "op": "generate", "prompt": "The capital of France is", "max_tokens": 4}' | reflex stdio
  reflex stdio --model smollm2 --device cpu          (load the model before the ready line)
The protocol: one JSON request per line on stdin, the answers as JSON lines on stdout.""",
    "uds": """\
  reflex uds /tmp/reflex.sock &
  reflex http --connect /tmp/reflex.sock             (an HTTP front over it)
The same JSON lines as `reflex stdio`, one client connection at a time.""",
}


def add_arguments(p, name):
    from ..ops import DEVICES, MAX_LINE_BYTES

    if name == "uds":
        p.add_argument("path", metavar="PATH", help="the socket file to listen on")
        p.add_argument("--mode", type=_mode, default=0o600, metavar="OCTAL",
                       help="permissions of the socket file, octal (default 600)")
    p.add_argument("--model", metavar="MODEL", help="load this GGUF path or alias before the ready line")
    p.add_argument("--device", choices=DEVICES, default="auto",
                   help="auto: CUDA when usable, else CPU (default: %(default)s)")
    p.add_argument("--lora", action="append", default=[], metavar="FILE[:SCALE]",
                   help="with --model: " + "apply a LoRA adapter (llama.cpp's GGUF adapter format) at load, its "
                   "product scaled by SCALE (default 1); repeatable")
    p.add_argument("--max-line-bytes", type=_size, default=MAX_LINE_BYTES, metavar="BYTES",
                   help="longest request line, in bytes (default: %(default)s = 16 MiB)")
    p.add_argument("--model-dir", type=_dir, action="append", default=[], metavar="DIR",
                   help="a request's `model` path must lie inside DIR (repeatable; "
                   "aliases and --model are always allowed)")
    p.add_argument("--max-models", type=_size, default=4, metavar="N",
                   help="models kept loaded at once (default 4; least recently used go)")
    p.add_argument("--max-model-bytes", type=_size, default=32 << 30, metavar="BYTES",
                   help="total size of the model files kept loaded (default 32 GiB)")
    p.add_argument("--write-timeout", type=_seconds, default=60.0, metavar="SECONDS",
                   help="drop a client that reads nothing of a result for this long "
                   "(default 60; 0: never)")
    if name == "uds":
        p.add_argument("--read-timeout", type=_seconds, default=10.0, metavar="SECONDS",
                       help="drop a client that sends part of a line and then nothing for "
                       "this long (default 10; 0: never)")
        p.add_argument("--idle-timeout", type=_seconds, default=10.0, metavar="SECONDS",
                       help="drop an idle client after this long while another client "
                       "waits to connect (default 10; 0: never)")


def run(args) -> int:
    from .. import server

    if args.lora and args.model is None:
        sys.stderr.write(f"reflex {args.command}: --lora needs --model\n")
        return 2
    srv = server.Server(model=args.model, device=args.device,
                        max_line_bytes=args.max_line_bytes, lora=args.lora,
                        model_dirs=args.model_dir,
                        max_models=args.max_models, max_model_bytes=args.max_model_bytes,
                        write_timeout=args.write_timeout or None,
                        read_timeout=getattr(args, "read_timeout", 0.0) or None,
                        idle_timeout=getattr(args, "idle_timeout", 0.0) or None)
    preload = args.model is not None
    try:
        if args.command == "stdio":
            return server.serve_stdio(srv, preload)
        return server.serve_uds(srv, args.path, args.mode, preload)
    except server.StartupError as e:
        try:
            sys.stderr.write(f"reflex {args.command}: {e}\n")
        except (OSError, ValueError):
            pass
        return 1
