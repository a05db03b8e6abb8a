"""The strictly sequential request loop of `reflex stdio` and `reflex uds`.

One request at a time, fully processed (result written) before the next line
is read; no threads. The loop is built from three parts: the transports
(transport.py: bounded line framing, bounded writes, the uds socket), the model
cache (modelcache.py: runners keyed by file identity, leases) and this module's
dispatch: a line is parsed into its op's request struct (protocol.py), the op's
`run(call, req)` (reflex_ipc/ops) computes the result's fields, and one result line
is written. The ready line is written before msgspec (protocol.py) is imported: it
is on the cold path.

Signals: SIGINT cancels the request in progress (the runner polls
`should_cancel`); SIGTERM (and SIGHUP) lets it finish, then the loop ends.
While the loop is blocked waiting for the next client or request line
(`waiting`), SIGTERM ends it at once: the handler raises `_Stop` there and
nowhere else. Anywhere else (a request, the `--model` load, the imports after
the first ready line) it only sets `stopping`, which the loop reads before it
waits again: an exception raised by a signal handler lands at an arbitrary
bytecode, and one that lands in a C extension's module init can be swallowed
there and leave the module half set up (msgspec 0.23 ignores a failed
`PyDateTime_IMPORT`: its next Decoder of a Struct read a NULL pointer, a
SIGSEGV on SIGTERM right after a client closed). SIGIO (a writer opened a
leased model file) cancels the request in progress and drops the model once it
ends.
"""

import math
import os
import signal
import sys
import time

from . import __version__, phases
from .errors import ReflexError, error_kind
from .modelcache import ModelCache, file_identity  # noqa: F401  (file_identity: tests)
from .ops import MAX_LINE_BYTES, PROTOCOL
from .transport import (CHUNK, STOP_GRACE, TOO_LONG, ClientGone, FdConn, LineReader,  # noqa: F401
                        SockConn, StartupError, bind_uds, log)

DEFAULT_WRITE_TIMEOUT = 60.0
DEFAULT_READ_TIMEOUT = 10.0
DEFAULT_IDLE_TIMEOUT = 10.0
MAX_RESULT_BYTES = 64 << 20  # one result line, newline included


class _Stop(BaseException):
    """SIGTERM while the loop waits for a client or a request line."""


def _json_str(s: str) -> str:
    out = ['"']
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch < " ":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _tiny_json(v) -> str:
    """JSON for the ready line (str/int/float/None/dict), without msgspec."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return _json_str(v)
    if isinstance(v, dict):
        return "{" + ",".join(f"{_json_str(k)}:{_tiny_json(x)}" for k, x in v.items()) + "}"
    raise TypeError(type(v).__name__)


def _finite(v) -> bool:
    """No NaN or infinity anywhere in a result (JSON has no such numbers: msgspec would
    write null where the schema promises a number)."""
    t = type(v)
    if t is float:
        return v - v == 0.0
    if t is dict:
        return all(_finite(x) for x in v.values())
    if t is list or t is tuple:
        if v and type(v[0]) is float:  # a vector: one C-speed pass
            try:
                return all(map(math.isfinite, v))
            except TypeError:  # not all numbers: look at each
                pass
        return all(_finite(x) for x in v)
    if hasattr(v, "dtype"):  # numpy
        import numpy as np

        return bool(np.isfinite(v).all()) if v.dtype.kind in "fc" else True
    return True


def _ms(t0: float, t1: float) -> float:
    return round((t1 - t0) * 1e3, 3)


class Server:
    """Dispatch and the per-connection loop over a ModelCache (`models`): the keyword
    arguments the cache takes (model, device, lora, loader, resolve, identify,
    model_dirs, max_models, max_model_bytes, leases) go to it."""

    def __init__(self, *, max_line_bytes=MAX_LINE_BYTES, write_timeout=DEFAULT_WRITE_TIMEOUT,
                 read_timeout=DEFAULT_READ_TIMEOUT, idle_timeout=DEFAULT_IDLE_TIMEOUT,
                 max_result_bytes=MAX_RESULT_BYTES, **cache):
        self.models = ModelCache(**cache)
        self.max_line_bytes = max_line_bytes
        self.max_result_bytes = max_result_bytes
        self.write_timeout = write_timeout
        self.read_timeout = read_timeout
        self.idle_timeout = idle_timeout
        self.busy = False
        self.waiting = False  # blocked on the next client or request line: SIGTERM raises _Stop
        self.cancel = False
        self.stopping = False
        self.stop_time = None
        self.file_changing = False
        self.first_result_done = False
        self.first_token_ms = None
        self.proto = None  # protocol module, imported after the first ready line
        self.ops = None  # the op registry (reflex_ipc/ops), with it
        self.startup_timings = {}

    # -- signals

    def install_signals(self):
        signal.signal(signal.SIGINT, self._on_sigint)
        signal.signal(signal.SIGTERM, self._on_sigterm)
        signal.signal(signal.SIGHUP, self._on_sigterm)
        if self.models.leases and hasattr(signal, "SIGIO"):
            signal.signal(signal.SIGIO, self._on_sigio)
            self.models.sigio = True

    def _on_sigint(self, signum, frame):
        if self.busy:
            self.cancel = True

    def _on_sigterm(self, signum, frame):
        if not self.stopping:
            self.stop_time = time.monotonic()
        self.stopping = True
        if self.waiting:
            raise _Stop()

    def _on_sigio(self, signum, frame):
        """A writer opened or truncated a leased model file: cancel the request in
        progress (it may read the mapping) and let go of the file once it ends."""
        self.file_changing = True
        if self.busy:
            self.cancel = True
        else:
            self.release_changed()

    def release_changed(self):
        self.file_changing = False
        self.models.release_changed()

    def preload(self):
        """--model: load it (and make it active) before the ready line."""
        self.models.preload(self.startup_timings)

    # -- lines

    def ready_line(self) -> bytes:
        info = self.models.active_info()
        timings = dict(self.startup_timings)
        timings["process_start_to_ready"] = phases.mark("ready")
        ready = {"event": "ready", "id": None, "protocol": PROTOCOL, "version": __version__,
                 "pid": os.getpid(), "backend": info.get("backend"), "model": info.get("model"),
                 "timings": timings}
        if info.get("next_backend"):  # serving on the cpu backend while the GPU comes up
            ready["next_backend"] = info["next_backend"]
        return (_tiny_json(ready) + "\n").encode("utf-8")

    def serve_conn(self, conn) -> None:
        """Ready line, then requests until EOF, a vanished client, or stop."""
        try:
            if self.stopping:  # SIGTERM during the --model load
                return
            conn.write(self.ready_line())
            if self.proto is None:
                from . import protocol
                from .ops import registry

                self.proto = protocol
                self.ops = registry()
            while True:
                self.waiting = True
                try:
                    if self.stopping:
                        return
                    line = conn.reader.readline()
                finally:
                    self.waiting = False
                if line is None:
                    return
                self.busy = True
                try:
                    self.handle(line, conn)
                    _after_answer()
                finally:
                    self.busy = False
                    self.cancel = False
                    if self.file_changing:
                        self.release_changed()
        except ClientGone:
            return

    def handle(self, line, conn) -> None:
        P = self.proto
        t0 = time.perf_counter()
        timings = {}
        rid = op = None
        first = not self.first_result_done
        if line is TOO_LONG:
            resp = P.error_result(None, None, "line_too_long",
                                  f"request line longer than {self.max_line_bytes} bytes",
                                  {"parse": 0.0})
        elif not line.strip(b" \t\r"):
            return  # blank lines are ignored
        else:
            try:
                rid, op, params = P.parse_request(line)
                timings["parse"] = _ms(t0, time.perf_counter())
                fields = self.ops[op].run(Call(self, conn, rid, timings), params)
                if not _finite(fields):
                    raise ReflexError("gguf_error", "the model computed a non-finite number "
                                      "(NaN or infinity): its weights are broken")
                resp = P.result(rid, op, fields, timings)
            except ClientGone:
                raise
            except P.RequestError as e:
                timings.setdefault("parse", _ms(t0, time.perf_counter()))
                resp = P.error_result(e.rid, e.op, e.kind, e.message, timings)
            except Exception as e:  # noqa: BLE001  (every failure becomes a result)
                kind = error_kind(e)
                if kind == "internal":
                    import traceback

                    traceback.print_exc(file=sys.stderr)
                msg = getattr(e, "message", None) or str(e) or type(e).__name__
                resp = P.error_result(rid, op, kind, msg, timings)
        timings = resp["timings"]
        timings.setdefault("parse", _ms(t0, time.perf_counter()))
        timings["total"] = _ms(t0, time.perf_counter())
        if first:
            self.first_result_done = True
            timings["process_start_to_first_token"] = (
                self.first_token_ms if self.first_token_ms is not None
                else round(phases.since_launch_ms(), 3))
        try:
            data = P.encode(resp)
        except Exception as e:  # noqa: BLE001  (a runner result JSON cannot hold)
            import traceback

            traceback.print_exc(file=sys.stderr)
            data = P.encode(P.error_result(rid, op, "internal",
                                           f"the result could not be encoded: {e}", timings))
        if len(data) > self.max_result_bytes:
            data = P.encode(P.error_result(
                rid, op, "too_large", f"the result is {len(data)} bytes; the limit is "
                f"{self.max_result_bytes}", timings))
        conn.write(data)


def _after_answer():
    """Work that waits until the result is written: the prefix cache's writes
    (runtime/prefixstore.py), when a request queued some."""
    store = sys.modules.get("reflex_ipc.runtime.prefixstore")
    if store is not None and store.PENDING:
        store.flush()


class Call:
    """What an op's `run(call, req)` (reflex_ipc/ops) gets from the loop: the server,
    this request's timings, cancellation, the model lookup, token lines."""

    def __init__(self, server, conn, rid, timings):
        self.server, self.conn, self.rid, self.timings = server, conn, rid, timings

    def should_cancel(self) -> bool:
        return self.server.cancel or self.conn.hung_up()

    def runner(self, req, use_active=True, lora=None):
        """(key, info, runner) for the request's model and device (Server.runner_for;
        lora: load's adapters); raises `cancelled` when the request was cancelled while it
        loaded."""
        srv = self.server
        key, runner = srv.models.runner_for(req.model, req.device, self.timings, use_active=use_active,
                                     lora=lora)
        if self.should_cancel():
            raise ReflexError("cancelled", "cancelled before the request ran")
        return key, srv.models.infos[key], runner

    def model(self, req, use_active=True):
        """The api.Model of the request's model (Call.runner): the ops run its methods."""
        key, _, runner = self.runner(req, use_active=use_active)
        return self.server.models.api_model(key, runner)

    def fields(self, result: dict) -> dict:
        """A Model method's result as the op's result fields: its timings go into this
        request's (beside parse and load; the loop writes the total)."""
        t = result.pop("timings", None) or {}
        t.pop("total", None)
        self.timings.update(t)
        return result

    def first_token(self) -> None:
        srv = self.server
        if not srv.first_result_done and srv.first_token_ms is None:
            srv.first_token_ms = phases.mark("first_token")

    def emit_token(self, token_id: int, text: str, logprobs=None, **extra) -> None:
        """A token line; extra: the event's other fields (reasoning_content, index)."""
        try:
            self.conn.write(self.server.proto.token_event(self.rid, token_id, text, logprobs,
                                                          **extra))
        except ClientGone:
            pass  # should_cancel() now says so


# ---------------------------------------------------------------- entry points
#
# Exit codes (protocol/PROTOCOL.md, "Lifecycle and signals"): 0 after EOF, SIGTERM,
# SIGHUP, `shutdown` or a vanished client; 1 when the server cannot start (stdout not
# usable, the socket path unusable or taken, --model failed to load); 2 usage errors.


def serve_stdio(server: Server, preload: bool) -> int:
    # Protocol lines go to a private dup of stdout; fd 1 becomes stderr, so a
    # stray print (ours, a library's, C code's) can never corrupt the stream.
    try:
        mode = os.fstat(1).st_mode
        out_fd = os.dup(1)
    except OSError:
        raise StartupError("stdout is closed: there is nowhere to write results") from None
    import stat

    if stat.S_ISDIR(mode):
        raise StartupError("stdout is a directory: there is nowhere to write results")
    server.install_signals()
    try:
        os.dup2(2, 1)
    except OSError:  # no stderr either: fd 1 points at /dev/null instead
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    conn = FdConn(0, out_fd, server.max_line_bytes, ctl=server)
    try:
        if preload:
            server.preload()
        server.serve_conn(conn)
    except _Stop:
        pass
    finally:
        conn.close()
    return 0


def serve_uds(server: Server, path: str, mode: int, preload: bool) -> int:
    sock = bind_uds(path, mode)
    ident = os.stat(path)
    server.install_signals()
    log(f"listening on {path}")
    try:
        if preload:
            server.preload()
        while True:
            server.waiting = True
            try:
                if server.stopping:
                    break
                client, _ = sock.accept()
            except (ConnectionAbortedError, InterruptedError):
                continue
            finally:
                server.waiting = False
            conn = SockConn(client, server.max_line_bytes, ctl=server, listen=sock)
            try:
                server.serve_conn(conn)
            finally:
                conn.close()
    except _Stop:
        pass
    finally:
        sock.close()
        try:  # remove it only if it is still ours
            st = os.lstat(path)
            if (st.st_ino, st.st_dev) == (ident.st_ino, ident.st_dev):
                os.unlink(path)
        except OSError:
            pass
    return 0
