"""shutdown: write the result, then end the loop (exit 0)."""

from ._base import Request as _Request, Result as _Result


class ShutdownRequest(_Request, kw_only=True):
    pass


class ShutdownResult(_Result, kw_only=True):
    pass


Request, Result = ShutdownRequest, ShutdownResult


def run(call, req) -> dict:
    call.server.stopping = True
    return {}
