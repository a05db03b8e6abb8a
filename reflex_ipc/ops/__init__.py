"""The protocol's op registry: one module per op (protocol/PROTOCOL.md).

Each op module holds `Request` (a msgspec Struct: the op's parameters with every
limit as a constraint, so a request is checked once, when it is decoded, before
any model is loaded), `Result` (a Struct naming the result's fields, for
protocol/schema.json) and `run(call, req) -> dict` (the result's fields; it
calls the engine.Runner). The server loop (server.py), the request decoder
(protocol.py), the CLI commands and protocol/schema.json (ops/schema.py) all
read `registry()`.

This module imports nothing but the backends' names (reflex_ipc/backends/__init__.py,
itself empty of imports): the constants below are read on the cold path (the ready
line, argparse) before msgspec is imported. Adding an op = a module
here, its name in NAMES, a section in PROTOCOL.md, the clients.
"""

PROTOCOL = 1  # the protocol version (ready, hello)
MAX_LINE_BYTES = 16 * 1024 * 1024  # default --max-line-bytes
MAX_TOKENS = 131072  # the largest max_tokens of generate
# `device` of a request and --device of every command; what ready/hello/load report as `backend`
from ..backends import BACKENDS, DEVICES  # noqa: E402,F401

NAMES = ("hello", "load", "generate", "infill", "system1", "classify", "embed", "tokenize", "detokenize",
         "state_save", "state_load", "ping", "shutdown")

_registry = None


def registry() -> dict:
    """{op name: its module}, in NAMES order (imports msgspec)."""
    global _registry
    if _registry is None:
        import importlib

        _registry = {n: importlib.import_module(f"{__name__}.{n}") for n in NAMES}
    return _registry
