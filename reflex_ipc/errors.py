"""Errors with a stable `kind`, shared by the CLI, the engine and the protocol loop.

The kinds are part of the protocol (protocol/PROTOCOL.md lists them); never
rename one.
"""

KINDS = (
    "parse_error",
    "invalid_request",
    "unknown_op",
    "line_too_long",
    "model_not_found",
    "gguf_error",
    "state_error",
    "unsupported_architecture",
    "context_overflow",
    "out_of_memory",
    "cuda_error",
    "cancelled",
    "too_large",
    "internal",
)


class ReflexError(Exception):
    """An error the caller should see as {"kind": ..., "message": ...}."""

    def __init__(self, kind: str, message: str):
        if kind not in KINDS:
            raise ValueError(f"unknown error kind {kind!r}")
        self.kind = kind
        self.message = message
        super().__init__(f"{kind}: {message}")


def error_kind(exc: BaseException) -> str:
    """The protocol kind for any exception (GGUFError has kind 'gguf_error')."""
    kind = getattr(exc, "kind", None)
    if kind in KINDS:
        return kind
    if isinstance(exc, MemoryError):
        return "out_of_memory"
    return "internal"
