"""What the sync and asyncio clients share: errors, request lines, result checks."""
import json

PROTOCOL = 1


class ReflexError(Exception):
    """An error result of the protocol: `.kind` is the protocol's error kind,
    `.message` its message, `.response` the whole result line (a dict) or None."""

    def __init__(self, kind, message, response=None):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
        self.response = response


class ReflexTimeout(ReflexError, TimeoutError):
    """The caller's timeout ran out; the request was cancelled (kind "cancelled")."""

    def __init__(self, message):
        super().__init__("cancelled", message)


class ReflexConnectionError(ReflexError, ConnectionError):
    """The server could not be started or reached, or went away mid-request
    (kind "connection"; not a server error kind: no server sent it). The next
    call starts (or connects to) a fresh server."""

    def __init__(self, message):
        super().__init__("connection", message)


def encode_request(rid, op, params):
    req = {"id": rid, "op": op}
    req.update((k, v) for k, v in params.items() if k not in ("id", "op"))
    return (json.dumps(req, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


def decode_line(line):
    """One server line -> dict; raises ReflexConnectionError on garbage."""
    try:
        obj = json.loads(line)
    except ValueError:
        raise ReflexConnectionError(f"server wrote a line that is not JSON: {line[:200]!r}") from None
    if not isinstance(obj, dict) or "event" not in obj:
        raise ReflexConnectionError(f"server wrote a line that is not an event: {line[:200]!r}")
    return obj


def check_ready(obj, where):
    if obj.get("event") != "ready":
        raise ReflexConnectionError(f"{where}: first line is not the ready event: {json.dumps(obj)[:200]}")
    if obj.get("protocol") != PROTOCOL:
        raise ReflexConnectionError(
            f"{where}: server speaks protocol {obj.get('protocol')!r}, this client speaks {PROTOCOL}")
    return obj


def ends_request(obj, rid):
    """True for the result line that ends request `rid` (a result whose id is
    null answers the one request in flight: e.g. line_too_long cannot echo it)."""
    return obj.get("event") == "result" and (obj.get("id") == rid or obj.get("id") is None)


def belongs(obj, rid):
    return obj.get("id") == rid


def result_or_raise(obj):
    if obj.get("ok"):
        return obj
    err = obj.get("error") or {}
    raise ReflexError(err.get("kind", "internal"), err.get("message", ""), obj)


def given(**params):
    """The parameters the caller gave (None: leave it to the server's default)."""
    return {k: v for k, v in params.items() if v is not None}


# While a cancelled request drains, SIGINT is sent again this often (and on each
# token line): a SIGINT that reached the server before it read the request line
# was ignored (idle), and a repeat can only hit the request being cancelled.
RESIGNAL_S = 0.25


class Ids:
    def __init__(self):
        self.n = 0

    def next(self):
        self.n += 1
        return self.n
