"""The strictly sequential request loop of `reflex stdio` and `reflex uds`.

One request at a time, fully processed (result written) before the next line
is read; no threads. Lines come from a bounded reader over a raw fd/socket, so
an over-long line is skipped in bounded memory. The ready line is written
before msgspec (protocol.py) is imported: it is on the cold path.

Signals: SIGINT cancels the request in progress (the runner polls
`should_cancel`); SIGTERM lets it finish, then the loop ends. While the loop
is blocked waiting for input (`busy` false), SIGTERM ends it at once.
"""

import os
import select
import signal
import sys
import time

from . import __version__, phases
from .errors import ReflexError, error_kind
from .ops import MAX_LINE_BYTES, PROTOCOL
TOO_LONG = object()  # LineReader.readline(): the line was over the limit
CHUNK = 1 << 16


def log(msg: str) -> None:
    try:
        sys.stderr.write(f"reflex[{os.getpid()}]: {msg}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


# ---------------------------------------------------------------- framing


class LineReader:
    """Lines from `read(n) -> bytes` (b"" at EOF), each at most `limit` bytes.

    readline() -> bytes (without "\\n"; a trailing "\\r" is dropped), TOO_LONG
    (the line was skipped: at most limit + CHUNK bytes are ever buffered), or
    None at EOF. A last line without "\\n" is returned as a line.
    """

    def __init__(self, read, limit: int):
        self.read = read
        self.limit = limit
        self.buf = bytearray()
        self.scan = 0  # bytes of buf known to hold no newline
        self.eof = False

    def _fill(self) -> bool:
        if self.eof:
            return False
        data = self.read(CHUNK)
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    def readline(self):
        while True:
            i = self.buf.find(b"\n", self.scan)
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[: i + 1]
                self.scan = 0
                if len(line) > self.limit:
                    return TOO_LONG
                return line[:-1] if line.endswith(b"\r") else line
            self.scan = len(self.buf)
            if len(self.buf) > self.limit:
                self._skip_rest()
                return TOO_LONG
            if not self._fill():
                if not self.buf:
                    return None
                line = bytes(self.buf)
                self.buf.clear()
                self.scan = 0
                return line[:-1] if line.endswith(b"\r") else line

    def _skip_rest(self):
        """Drop bytes up to and including the next newline (or to EOF)."""
        self.buf.clear()
        self.scan = 0
        while self._fill():
            i = self.buf.find(b"\n")
            if i >= 0:
                del self.buf[: i + 1]
                return
            self.buf.clear()


# ---------------------------------------------------------------- transports


class ClientGone(Exception):
    """The other end of the transport went away."""


class FdConn:
    """stdio: requests from `in_fd`, responses to `out_fd`."""

    def __init__(self, in_fd: int, out_fd: int, limit: int):
        self.in_fd, self.out_fd = in_fd, out_fd
        self.reader = LineReader(self._read, limit)
        self.gone = False
        self._poll = select.poll()
        self._poll.register(out_fd, 0)  # POLLERR/POLLHUP are always reported

    def _read(self, n):
        try:
            return os.read(self.in_fd, n)
        except (ConnectionResetError, BrokenPipeError):
            return b""

    def write(self, data: bytes) -> None:
        if self.gone:
            raise ClientGone()
        view = memoryview(data)
        try:
            while view:
                try:
                    n = os.write(self.out_fd, view)
                except BlockingIOError:  # an inherited O_NONBLOCK stdout
                    select.select([], [self.out_fd], [])
                    continue
                view = view[n:]
        except (BrokenPipeError, ConnectionResetError):
            self.gone = True
            raise ClientGone() from None

    def hung_up(self) -> bool:
        if not self.gone and self._poll.poll(0):
            self.gone = True  # the reading end of stdout is closed
        return self.gone

    def close(self):
        pass


class SockConn:
    """One accepted uds connection."""

    def __init__(self, sock, limit: int):
        self.sock = sock
        self.reader = LineReader(self._read, limit)
        self.gone = False
        self._poll = select.poll()
        # POLLHUP only when the peer closed both directions: a client that
        # shut down its write side still waits for its results.
        self._poll.register(sock.fileno(), 0)

    def _read(self, n):
        try:
            return self.sock.recv(n)
        except (ConnectionResetError, BrokenPipeError):
            return b""

    def write(self, data: bytes) -> None:
        if self.gone:
            raise ClientGone()
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            self.gone = True
            raise ClientGone() from None

    def hung_up(self) -> bool:
        if not self.gone and self._poll.poll(0):
            self.gone = True
        return self.gone

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


# ---------------------------------------------------------------- the server


class _Stop(BaseException):
    """SIGTERM while idle."""


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


_BACKEND_DEVICE = {"numpy": "cpu", "cpu": "cpu", "cuda": "cuda"}


def _ms(t0: float, t1: float) -> float:
    return round((t1 - t0) * 1e3, 3)


class Server:
    """Model cache, dispatch and the per-connection loop.

    `loader(path, device) -> Runner` (default: engine.load_runner);
    `resolve(name) -> path` (default: modelpath.resolve_model).
    """

    def __init__(self, *, model=None, device="auto", max_line_bytes=MAX_LINE_BYTES,
                 loader=None, resolve=None, lora=None):
        self.default_model = model
        self.default_lora = lora or []  # --lora FILE[:SCALE] for the preloaded model
        self.default_device = device or "auto"
        self.max_line_bytes = max_line_bytes
        self._loader = loader
        self._resolve = resolve
        self.runners = {}  # (path, device) -> runner
        self.infos = {}  # (path, device) -> runner.info()
        self.paths = {}  # model name -> path
        self.active = None  # key of the active runner
        self.auto_device = None  # the device "auto" resolved to, once known
        self.busy = False
        self.cancel = False
        self.stopping = False
        self.first_result_done = False
        self.first_token_ms = None
        self.proto = None  # protocol module, imported after the first ready line
        self.ops = None  # the op registry (reflex_ipc/ops), with it
        self.startup_timings = {}

    # -- signals

    def install_signals(self):
        signal.signal(signal.SIGINT, self._on_sigint)
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigint(self, signum, frame):
        if self.busy:
            self.cancel = True

    def _on_sigterm(self, signum, frame):
        self.stopping = True
        if not self.busy:
            raise _Stop()

    # -- models

    def _path(self, name):
        path = self.paths.get(name)
        if path is None:
            if self._resolve is None:
                from .modelpath import resolve_model

                self._resolve = resolve_model
            path = self.paths[name] = self._resolve(name)
        return path

    def runner_for(self, model, device, timings, use_active=True, lora=None):
        """The runner for (model, device), loading it when not cached. Either
        left out means the active model's (with use_active, and one is
        active), else the server's default (--model / --device). lora: a
        tuple of (adapter path, scale) (load only): the same model with other
        adapters is another runner, cached under (path, device, lora)."""
        active = self.active if use_active else None
        if model is None and device is None and active is not None and not lora:
            key = active
        else:
            if model is None:
                path = active[0] if active else self._path(self.default_model)
            else:
                path = self._path(model)
            if device is None:
                device = active[1] if active else self.default_device
            if device == "auto" and self.auto_device:
                device = self.auto_device
            key = (path, device) + ((lora,) if lora else ())
        runner = self.runners.get(key)
        if runner is None:
            t0 = time.perf_counter()
            if self._loader is None:
                from .engine import load_runner

                self._loader = lambda p, d, lora=None: load_runner(p, device=d, lora=lora)
            runner = self._loader(key[0], key[1], lora=list(lora)) if lora else self._loader(key[0], key[1])
            timings["load"] = _ms(t0, time.perf_counter())
            info = dict(runner.info())
            self.runners[key] = runner
            self.infos[key] = info
            # "auto" (or "cuda") resolved to a concrete device: cache it under
            # that name too, so naming it later finds this runner.
            real = info.get("device") or _BACKEND_DEVICE.get(info.get("backend"))
            if real and real != key[1]:
                self.runners.setdefault((key[0], real) + key[2:], runner)
                self.infos.setdefault((key[0], real) + key[2:], info)
                if key[1] == "auto":
                    self.auto_device = real  # what "auto" means on this machine
        if self.active is None:
            self.active = key
        return key, runner

    def preload(self):
        """--model: load it (and make it active) before the ready line."""
        timings = {}
        lora = None
        if self.default_lora:
            from .lora import normalize
            from .modelpath import resolve_model

            lora = tuple((resolve_model(p), s) for p, s in normalize(self.default_lora))
        self.runner_for(self.default_model, self.default_device, timings, lora=lora)
        self.startup_timings.update(timings)

    def _active_info(self):
        return self.infos[self.active] if self.active else {}

    # -- lines

    def ready_line(self) -> bytes:
        info = self._active_info()
        timings = dict(self.startup_timings)
        timings["process_start_to_ready"] = phases.mark("ready")
        ready = {"event": "ready", "id": None, "protocol": PROTOCOL, "version": __version__,
                 "pid": os.getpid(), "backend": info.get("backend"), "model": info.get("model"),
                 "timings": timings}
        return (_tiny_json(ready) + "\n").encode("utf-8")

    def serve_conn(self, conn) -> None:
        """Ready line, then requests until EOF, a vanished client, or stop."""
        try:
            conn.write(self.ready_line())
            if self.proto is None:
                from . import protocol
                from .ops import registry

                self.proto = protocol
                self.ops = registry()
            while not self.stopping:
                line = conn.reader.readline()
                if line is None:
                    return
                self.busy = True
                try:
                    self.handle(line, conn)
                finally:
                    self.busy = False
                    self.cancel = False
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
        conn.write(data)


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
        key, runner = srv.runner_for(req.model, req.device, self.timings, use_active=use_active,
                                     lora=lora)
        if self.should_cancel():
            raise ReflexError("cancelled", "cancelled before the request ran")
        return key, srv.infos[key], runner

    def first_token(self) -> None:
        srv = self.server
        if not srv.first_result_done and srv.first_token_ms is None:
            srv.first_token_ms = phases.mark("first_token")

    def emit_token(self, token_id: int, text: str, logprobs=None) -> None:
        try:
            self.conn.write(self.server.proto.token_event(self.rid, token_id, text, logprobs))
        except ClientGone:
            pass  # should_cancel() now says so


# ---------------------------------------------------------------- entry points


def serve_stdio(server: Server, preload: bool) -> int:
    server.install_signals()
    # Protocol lines go to a private dup of stdout; fd 1 becomes stderr, so a
    # stray print (ours, a library's, C code's) can never corrupt the stream.
    out_fd = os.dup(1)
    os.dup2(2, 1)
    conn = FdConn(0, out_fd, server.max_line_bytes)
    try:
        if preload:
            server.preload()
        server.serve_conn(conn)
    except _Stop:
        pass
    return 0


class StartupError(Exception):
    """uds: the socket path cannot be used; message for stderr, exit 1."""


def bind_uds(path: str, mode: int):
    import socket
    import stat

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISSOCK(st.st_mode):
            raise StartupError(f"{path} exists and is not a socket; refusing to replace it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            try:
                os.unlink(path)  # stale: nobody listens on it
            except FileNotFoundError:
                pass
        else:
            raise StartupError(f"a server is already listening on {path}")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    except OSError as e:
        sock.close()
        raise StartupError(f"cannot bind {path}: {e.strerror or e}") from None
    finally:
        os.umask(old)
    os.chmod(path, mode)
    sock.listen(16)
    return sock


def serve_uds(server: Server, path: str, mode: int, preload: bool) -> int:
    sock = bind_uds(path, mode)
    ident = os.stat(path)
    server.install_signals()
    log(f"listening on {path}")
    try:
        if preload:
            server.preload()
        while not server.stopping:
            try:
                client, _ = sock.accept()
            except (ConnectionAbortedError, InterruptedError):
                continue
            conn = SockConn(client, server.max_line_bytes)
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
