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


def add_arguments(p, name):
    from ..ops import DEVICES, MAX_LINE_BYTES

    if name == "uds":
        p.add_argument("path", metavar="PATH", help="the socket file to listen on")
        p.add_argument("--mode", type=_mode, default=0o600,
                       help="permissions of the socket file, octal (default 600)")
    p.add_argument("--model", help="load this GGUF path or alias before the ready line")
    p.add_argument("--device", choices=DEVICES, default="auto",
                   help="auto: CUDA when usable, else CPU (default: %(default)s)")
    p.add_argument("--lora", action="append", default=[], metavar="FILE[:SCALE]",
                   help="with --model: " + "apply a LoRA adapter (llama.cpp's GGUF adapter format) at load, its "
                   "product scaled by SCALE (default 1); repeatable")
    p.add_argument("--max-line-bytes", type=_size, default=MAX_LINE_BYTES,
                   help="longest request line, in bytes (default: %(default)s = 16 MiB)")


def run(args) -> int:
    from .. import server

    if args.lora and args.model is None:
        sys.stderr.write(f"reflex {args.command}: --lora needs --model\n")
        return 2
    srv = server.Server(model=args.model, device=args.device,
                        max_line_bytes=args.max_line_bytes, lora=args.lora)
    preload = args.model is not None
    if args.command == "stdio":
        return server.serve_stdio(srv, preload)
    try:
        return server.serve_uds(srv, args.path, args.mode, preload)
    except server.StartupError as e:
        sys.stderr.write(f"reflex uds: {e}\n")
        return 1
