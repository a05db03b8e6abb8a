"""Thin, stdlib-only client for the reflex protocol (protocol/PROTOCOL.md)."""
from ._common import PROTOCOL, ReflexConnectionError, ReflexError, ReflexTimeout
from ._sync import Client


def __getattr__(name):  # asyncio costs ~100 ms to import: only for those who use it
    if name == "AsyncClient":
        from ._async import AsyncClient
        return AsyncClient
    raise AttributeError(f"module 'reflex_client' has no attribute {name!r}")

__all__ = ["Client", "AsyncClient", "ReflexError", "ReflexTimeout", "ReflexConnectionError", "PROTOCOL"]
