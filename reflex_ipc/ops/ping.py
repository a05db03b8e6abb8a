"""ping: an empty result; loads no model."""

from ._base import Request as _Request, Result as _Result


class PingRequest(_Request, kw_only=True):
    pass


class PingResult(_Result, kw_only=True):
    pass


Request, Result = PingRequest, PingResult


def run(call, req) -> dict:
    return {}
