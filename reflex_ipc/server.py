"""The strictly sequential request loop of `reflex stdio` and `reflex uds`.

One request at a time, fully processed (result written) before the next line
is read; no threads. Lines come from a bounded reader over a raw fd/socket, so
an over-long line is skipped in bounded memory. The ready line is written
before msgspec (protocol.py) is imported: it is on the cold path.

Signals: SIGINT cancels the request in progress (the runner polls
`should_cancel`); SIGTERM (and SIGHUP) lets it finish, then the loop ends.
While the loop is blocked waiting for input (`busy` false), SIGTERM ends it at
once. Writes never block without a bound: they wait in slices for the peer to
read, give up after `write_timeout` seconds without progress (the client is
dropped) and within STOP_GRACE seconds of SIGTERM.

Models are cached by the file's identity (device, inode, size, mtime), at most
`max_models` of them and `max_model_bytes` of files; each cached file carries
a read lease where the kernel grants one, so a writer that opens or truncates
it waits until the server has let go of its mapping (see Server.runner_for).
"""

import math
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
PIPE_CHUNK = 4096  # PIPE_BUF: a write this small never blocks once poll says POLLOUT
STOP_GRACE = 2.0  # seconds a write may still wait for its reader after SIGTERM
SLICE = 0.25  # seconds between looks at the stop flag while a write waits
DEFAULT_WRITE_TIMEOUT = 60.0
DEFAULT_READ_TIMEOUT = 10.0
DEFAULT_IDLE_TIMEOUT = 10.0
MAX_RESULT_BYTES = 64 << 20  # one result line, newline included


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
    None at EOF. A last line without "\\n" is returned as a line. Neither the
    "\\n" nor a "\\r" before it counts toward the limit.
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
                if line.endswith(b"\r"):
                    line = line[:-1]
                if len(line) > self.limit:
                    return TOO_LONG
                return line
            self.scan = len(self.buf)
            if len(self.buf) > self.limit + 1:  # + 1: a "\r" may end it
                self._skip_rest()
                return TOO_LONG
            if not self._fill():
                if not self.buf:
                    return None
                line = bytes(self.buf)
                self.buf.clear()
                self.scan = 0
                line = line[:-1] if line.endswith(b"\r") else line
                return TOO_LONG if len(line) > self.limit else line

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
    """The other end of the transport went away (or was dropped)."""


class _Writer:
    """Bounded writes: wait for the peer in slices of SLICE seconds, so that the stop
    flag is seen; ClientGone after `ctl.write_timeout` seconds without progress
    (None: no limit) and STOP_GRACE seconds after `ctl.stopping` was set. `ctl` is
    the Server (or None: plain blocking writes, for tests that drive a conn alone)."""

    ctl = None
    gone = False

    def _send(self, view) -> int:  # bytes written, or raises BlockingIOError
        raise NotImplementedError

    def _out_fd(self) -> int:
        raise NotImplementedError

    def write(self, data: bytes) -> None:
        if self.gone:
            raise ClientGone()
        view = memoryview(data)
        ctl = self.ctl
        last = time.monotonic()
        poller = None
        try:
            while view:
                try:
                    n = self._send(view)
                except (BlockingIOError, InterruptedError):
                    n = 0
                if n:
                    view = view[n:]
                    last = time.monotonic()
                    continue
                if poller is None:
                    poller = select.poll()
                    poller.register(self._out_fd(), select.POLLOUT)
                while True:
                    wait = None
                    if ctl is not None:
                        now = time.monotonic()
                        limit = float("inf")
                        if ctl.write_timeout:
                            limit = last + ctl.write_timeout
                        if ctl.stopping:
                            if ctl.stop_time is None:  # `shutdown`: the grace starts now
                                ctl.stop_time = now
                            limit = min(limit, ctl.stop_time + STOP_GRACE)
                        if now >= limit:
                            self.gone = True
                            why = "stopping" if ctl.stopping else \
                                f"no progress writing for {ctl.write_timeout:g} s"
                            log(f"dropping the client: it does not read ({why})")
                            raise ClientGone()
                        wait = int(min(limit - now, SLICE) * 1000) + 1
                    ev = poller.poll(wait)
                    if ev:
                        if ev[0][1] & select.POLLNVAL:
                            raise BrokenPipeError()
                        break
        except (BrokenPipeError, ConnectionResetError):
            self.gone = True
            raise ClientGone() from None
        except OSError as e:  # EBADF, EIO, ...: nowhere to write
            self.gone = True
            log(f"cannot write results: {e.strerror or e}")
            raise ClientGone() from None


class FdConn(_Writer):
    """stdio: requests from `in_fd`, responses to `out_fd`."""

    def __init__(self, in_fd: int, out_fd: int, limit: int, ctl=None):
        import stat

        self.in_fd, self.out_fd = in_fd, out_fd
        self.ctl = ctl
        self.reader = LineReader(self._read, limit)
        self.gone = False
        self._poll = select.poll()
        self._poll.register(out_fd, 0)  # POLLERR/POLLHUP are always reported
        self._sock = None
        self._chunk = CHUNK
        try:
            mode = os.fstat(out_fd).st_mode
        except OSError:
            mode = 0
        if stat.S_ISSOCK(mode):  # a socketpair parent: MSG_DONTWAIT sends
            import socket

            self._sock = socket.socket(fileno=os.dup(out_fd))
        elif stat.S_ISFIFO(mode):
            self._chunk = PIPE_CHUNK
        self._nb = ctl is not None

    def _read(self, n):
        try:
            return os.read(self.in_fd, n)
        except (ConnectionResetError, BrokenPipeError):
            return b""

    def _out_fd(self):
        return self.out_fd

    def _send(self, view):
        if self._sock is not None:
            import socket

            return self._sock.send(view[:CHUNK], socket.MSG_DONTWAIT if self._nb else 0)
        if self._nb and self._chunk == PIPE_CHUNK and not self._writable():
            return 0
        return os.write(self.out_fd, view[:self._chunk] if self._nb else view)

    def _writable(self) -> bool:
        p = select.poll()
        p.register(self.out_fd, select.POLLOUT)
        ev = p.poll(0)
        if ev and ev[0][1] & (select.POLLERR | select.POLLNVAL):
            raise BrokenPipeError()
        return bool(ev)

    def hung_up(self) -> bool:
        if not self.gone and self._poll.poll(0):
            self.gone = True  # the reading end of stdout is closed
        return self.gone

    def close(self):
        if self._sock is not None:
            self._sock.close()


class SockConn(_Writer):
    """One accepted uds connection. With `listen` (the listening socket) and a ctl,
    a client that starts a line and then stalls for `ctl.read_timeout` seconds is
    dropped, and so is one that sits idle for `ctl.idle_timeout` seconds while
    another client waits to connect."""

    def __init__(self, sock, limit: int, ctl=None, listen=None):
        self.sock = sock
        self.ctl = ctl
        self.listen = listen
        self.reader = LineReader(self._read, limit)
        self.gone = False
        self._poll = select.poll()
        # POLLHUP only when the peer closed both directions: a client that
        # shut down its write side still waits for its results.
        self._poll.register(sock.fileno(), 0)
        self.last_activity = time.monotonic()

    def _read(self, n):
        ctl = self.ctl
        if ctl is not None:
            self._wait_readable(ctl)
        try:
            data = self.sock.recv(n)
        except (ConnectionResetError, BrokenPipeError):
            return b""
        self.last_activity = time.monotonic()
        return data

    def _wait_readable(self, ctl):
        fd = self.sock.fileno()
        p = select.poll()
        p.register(fd, select.POLLIN)
        lp = None
        if self.listen is not None and ctl.idle_timeout:
            lp = select.poll()
            lp.register(self.listen.fileno(), select.POLLIN)
        while True:
            now = time.monotonic()
            partial = bool(self.reader.buf)
            if partial and ctl.read_timeout:
                left = self.last_activity + ctl.read_timeout - now
                why = f"half a request line and nothing more for {ctl.read_timeout:g} s"
            elif not partial and lp is not None and lp.poll(0):
                left = self.last_activity + ctl.idle_timeout - now
                why = f"idle for {ctl.idle_timeout:g} s while another client waits"
            else:
                left = None
                why = ""
            if left is not None and left <= 0:
                self.gone = True
                log(f"dropping the client: {why}")
                raise ClientGone()
            if left is None:  # wait for data, or (idle_timeout) for a client to queue up
                if lp is None:
                    if p.poll():
                        return
                    continue
                both = select.poll()
                both.register(fd, select.POLLIN)
                both.register(self.listen.fileno(), select.POLLIN)
                if any(f == fd for f, _ in both.poll()):
                    return
                continue
            if p.poll(int(min(left, SLICE) * 1000) + 1):
                return

    def _out_fd(self):
        return self.sock.fileno()

    def _send(self, view):
        import socket

        return self.sock.send(view[:1 << 20], socket.MSG_DONTWAIT if self.ctl else 0)

    def write(self, data: bytes) -> None:
        super().write(data)
        self.last_activity = time.monotonic()

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


class _Entry:
    """One cached runner: the file it came from (path and identity), its lease fd."""

    __slots__ = ("runner", "info", "path", "ident", "device", "nbytes", "lease_fd", "keys",
                 "lora")

    def __init__(self, runner, info, path, ident, device, nbytes, lease_fd):
        self.runner, self.info, self.path, self.ident = runner, info, path, ident
        self.device, self.nbytes, self.lease_fd = device, nbytes, lease_fd
        self.keys = []
        self.lora = None


def file_identity(path):
    """(st_dev, st_ino, st_size, st_mtime_ns) of a regular file; model_not_found if the
    path is gone or is not a regular file (stat never blocks, even on a FIFO)."""
    import stat

    try:
        st = os.stat(path)
    except OSError as e:
        raise ReflexError("model_not_found", f"{path}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ReflexError("model_not_found", f"{path} is not a regular file")
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _take_lease(path, ident):
    """A read lease on `path` (an fd holding it), or None where the kernel grants none
    (not the file's owner, a file system without leases). A lease makes a writer that
    opens or truncates the file wait (up to /proc/sys/fs/lease-break-time) while we
    are told (SIGIO) and let go. gguf_error when the file is open for writing now."""
    try:
        import fcntl
    except ImportError:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) != ident:
            raise ReflexError("gguf_error", f"{path} changed while it was being loaded")
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except ReflexError:
        os.close(fd)
        raise
    except OSError as e:
        os.close(fd)
        import errno

        if e.errno == errno.EAGAIN:
            raise ReflexError("gguf_error", f"{path} is open for writing by another "
                              "process; not loading a file that is being written") from None
        return None
    return fd


def _lease_broken(fd) -> bool:
    import fcntl

    try:
        return fcntl.fcntl(fd, fcntl.F_GETLEASE) != fcntl.F_RDLCK
    except OSError:
        return True


class Server:
    """Model cache, dispatch and the per-connection loop.

    `loader(path, device) -> Runner` (default: engine.load_runner);
    `resolve(name) -> path` (default: modelpath.resolve_model).
    """

    def __init__(self, *, model=None, device="auto", max_line_bytes=MAX_LINE_BYTES,
                 loader=None, resolve=None, lora=None, identify=None, model_dirs=None,
                 max_models=4, max_model_bytes=32 << 30, write_timeout=DEFAULT_WRITE_TIMEOUT,
                 read_timeout=DEFAULT_READ_TIMEOUT, idle_timeout=DEFAULT_IDLE_TIMEOUT,
                 leases=None, max_result_bytes=MAX_RESULT_BYTES):
        self.default_model = model
        self.default_lora = lora or []  # --lora FILE[:SCALE] for the preloaded model
        self.default_device = device or "auto"
        self.max_line_bytes = max_line_bytes
        self.max_result_bytes = max_result_bytes
        self._loader = loader
        self._resolve = resolve
        # identify(path) -> a hashable identity of the file (default: dev, inode, size,
        # mtime_ns); with a custom loader and no identify, the path string itself
        if identify is None:
            identify = file_identity if loader is None else str
        self._identify = identify
        self.leases = (identify is file_identity) if leases is None else leases
        self.model_dirs = [os.path.realpath(d) for d in (model_dirs or ())]
        self.max_models = max(1, int(max_models))
        self.max_model_bytes = max_model_bytes
        self.write_timeout = write_timeout
        self.read_timeout = read_timeout
        self.idle_timeout = idle_timeout
        self.entries = {}  # (identity, device) -> _Entry, least recently used first
        self.runners = {}  # (identity, device) -> runner
        self.infos = {}  # (identity, device) -> runner.info()
        self.paths = {}  # model name -> path (a small memo; aliases and repeated names)
        self._active = None  # key of the active runner
        self._active_src = None  # (path, device, lora) it was asked for under
        self.auto_device = None  # the device "auto" resolved to, once known
        self.busy = False
        self.cancel = False
        self.stopping = False
        self.stop_time = None
        self.file_changing = False
        self._sigio = False
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
        if self.leases and hasattr(signal, "SIGIO"):
            signal.signal(signal.SIGIO, self._on_sigio)
            self._sigio = True

    def _on_sigint(self, signum, frame):
        if self.busy:
            self.cancel = True

    def _on_sigterm(self, signum, frame):
        if not self.stopping:
            self.stop_time = time.monotonic()
        self.stopping = True
        if not self.busy:
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
        """Drop every cached model whose lease is being broken, then release the lease:
        the writer proceeds only once nothing will read the old mapping."""
        self.file_changing = False
        for e in list(self._unique_entries()):
            if e.lease_fd is not None and _lease_broken(e.lease_fd):
                log(f"{e.path} is being modified; dropping the loaded model")
                self._evict(e)

    # -- models

    @property
    def active(self):
        return self._active

    @active.setter
    def active(self, key):
        self._active = key
        e = self.entries.get(key)
        if e is not None:
            self._active_src = (e.path, e.device, e.lora)

    def _path(self, name):
        path = self.paths.get(name)
        if path is None:
            if self._resolve is None:
                from .modelpath import resolve_model

                self._resolve = resolve_model
            path = self._resolve(name)
            if len(self.paths) >= 64:
                self.paths.clear()
            if name is None or len(name) <= 4096:
                self.paths[name] = path
        return path

    def _check_dirs(self, name, path):
        """--model-dir: a model named by a request must resolve inside one of the dirs."""
        if not self.model_dirs or name is None:
            return
        from .modelpath import ALIASES

        if name in ALIASES:
            return
        real = os.path.realpath(path)
        for d in self.model_dirs:
            if real == d or real.startswith(d.rstrip(os.sep) + os.sep):
                return
        raise ReflexError("model_not_found", f"{name!r} is outside the model directories "
                          "this server may read (--model-dir)")

    def _unique_entries(self):
        seen = set()
        for e in self.entries.values():
            if id(e) not in seen:
                seen.add(id(e))
                yield e

    def _evict(self, e):
        for k in e.keys:
            self.entries.pop(k, None)
            self.runners.pop(k, None)
            self.infos.pop(k, None)
        e.keys = []
        try:
            close = getattr(e.runner, "close", None)
            if close is not None:
                close()
        except Exception as ex:  # noqa: BLE001  (a runner that cannot close is dropped anyway)
            log(f"closing {e.path}: {ex}")
        e.runner = None
        if e.lease_fd is not None:
            try:
                import fcntl

                fcntl.fcntl(e.lease_fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
            except OSError:
                pass
            os.close(e.lease_fd)
            e.lease_fd = None

    def _evict_stale(self, path, ident):
        """Entries loaded from `path` that no longer match the file there, and entries of
        the same inode whose size or mtime changed (written in place: the old mapping
        is not safe to read)."""
        for e in list(self._unique_entries()):
            same_path = e.path == path and e.ident != ident
            in_place = (isinstance(ident, tuple) and len(ident) == 4 and
                        isinstance(e.ident, tuple) and e.ident[:2] == ident[:2] and
                        e.ident != ident)
            if same_path or in_place:
                self._evict(e)

    def _make_room(self, keep):
        while True:
            uniq = list(self._unique_entries())
            total = sum(e.nbytes for e in uniq)
            if len(uniq) <= self.max_models and total <= self.max_model_bytes:
                return
            victims = [e for e in uniq if e is not keep]
            if not victims:
                return
            self._evict(victims[0])  # least recently used

    def _touch(self, e):
        for k in e.keys:  # most recently used last
            self.entries[k] = self.entries.pop(k)

    def _adapter_identity(self, path):
        try:
            return self._identify(path)
        except Exception:  # noqa: BLE001  (a missing adapter: loading it names the error)
            return None

    def runner_for(self, model, device, timings, use_active=True, lora=None):
        """The runner for (model, device), loading it when not cached. Either
        left out means the active model's (with use_active, and one is
        active), else the server's default (--model / --device). lora: a
        tuple of (adapter path, scale) (load only): the same model with other
        adapters is another runner, cached under (identity, device, lora). The file
        is looked at (stat) every time: a file changed since it was loaded is
        loaded again."""
        src = self._active_src if (use_active and self._active is not None) else None
        if model is None and device is None and src is not None and not lora:
            path, device, lora = src
        else:
            if model is None:
                path = src[0] if src else self._path(self.default_model)
            else:
                path = self._path(model)
                self._check_dirs(model, path)
            if device is None:
                device = src[1] if src else self.default_device
        if device == "auto" and self.auto_device:
            device = self.auto_device
        ident = self._identify(path)
        # adapters by path, scale and their file's identity: one rewritten in place is loaded
        # again, as a model file is (the fuzz suite found a stale adapter served; issue 32)
        key = (ident, device) + ((tuple((p, sc, self._adapter_identity(p)) for p, sc in lora),) if lora else ())
        e = self.entries.get(key)
        if e is not None and e.lease_fd is not None and _lease_broken(e.lease_fd):
            self._evict(e)
            e = None
        if e is None:
            self._evict_stale(path, ident)
            # a lease only with our SIGIO handler in place (SIGIO's default action kills)
            lease = _take_lease(path, ident) if self.leases and self._sigio else None
            try:
                t0 = time.perf_counter()
                if self._loader is None:
                    from .engine import load_runner

                    self._loader = lambda p, d, lora=None: load_runner(p, device=d, lora=lora)
                runner = (self._loader(path, device, lora=list(lora)) if lora
                          else self._loader(path, device))
                timings["load"] = _ms(t0, time.perf_counter())
                info = dict(runner.info())
            except BaseException:
                if lease is not None:
                    os.close(lease)
                raise
            nbytes = ident[2] if isinstance(ident, tuple) and len(ident) == 4 else 0
            e = _Entry(runner, info, path, ident, device, nbytes, lease)
            e.lora = lora
            self._add(e, key)
            # "auto" (or "cuda") resolved to a concrete device: cache it under
            # that name too, so naming it later finds this runner.
            real = info.get("device") or _BACKEND_DEVICE.get(info.get("backend"))
            if info.get("backend") == "numpy":
                real = "numpy"  # the oracle (asked for, or what auto gives a numpy-only model)
            if real and real != device:
                if (ident, real) + key[2:] not in self.entries:
                    self._add(e, (ident, real) + key[2:])
                if device == "auto" and real != "numpy":
                    self.auto_device = real  # what "auto" means on this machine
            self._make_room(e)
        else:
            self._touch(e)
        if self._active is None or self._active not in self.entries:
            self.active = key
        return key, e.runner

    def _add(self, e, key):
        e.keys.append(key)
        self.entries[key] = e
        self.runners[key] = e.runner
        self.infos[key] = e.info

    def close_models(self):
        for e in list(self._unique_entries()):
            self._evict(e)

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
        return self.infos.get(self.active, {}) if self.active else {}

    def _models(self) -> list:
        """hello's `models`: each loaded model once, with the path it was loaded from."""
        return [{"model": e.info.get("model"), "path": e.path, "device": e.device,
                 "backend": e.info.get("backend")} for e in self._unique_entries()]

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
#
# Exit codes (protocol/PROTOCOL.md, "Lifecycle and signals"): 0 after EOF, SIGTERM,
# SIGHUP, `shutdown` or a vanished client; 1 when the server cannot start (stdout not
# usable, the socket path unusable or taken, --model failed to load); 2 usage errors.


class StartupError(Exception):
    """The server cannot start; message for stderr (one line), exit 1."""


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


def bind_uds(path: str, mode: int):
    import errno
    import socket
    import stat

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise StartupError(f"cannot use {path}: {e.strerror or e}") from None
    if st is not None:
        if not stat.S_ISSOCK(st.st_mode):
            raise StartupError(f"{path} exists and is not a socket; refusing to replace it")
        # Probe without blocking: a live server whose backlog is full would make a
        # blocking connect wait for as long as that server stays busy.
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.setblocking(False)
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            try:
                os.unlink(path)  # stale: nobody listens on it
            except FileNotFoundError:
                pass
            except OSError as e:
                raise StartupError(f"cannot replace the stale socket {path}: "
                                   f"{e.strerror or e}") from None
        except PermissionError:
            raise StartupError(f"{path} is a socket this user may not connect to; "
                               "refusing to replace it") from None
        except (BlockingIOError, InterruptedError):
            raise StartupError(f"a server is already listening on {path} (busy)") from None
        except OSError as e:
            if e.errno == errno.EAGAIN:
                raise StartupError(f"a server is already listening on {path} (busy)") from None
            raise StartupError(f"cannot probe {path}: {e.strerror or e}") from None
        else:
            raise StartupError(f"a server is already listening on {path}")
        finally:
            probe.close()
    # The path appears only once the socket listens: bound under a temporary name in a
    # private folder beside it, then renamed into place (a client that sees the file and
    # connects at once would otherwise get ECONNREFUSED between bind and listen).
    import tempfile

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    tmpdir = None
    try:
        try:
            if len(os.fsencode(path)) > 107:  # sun_path's limit: bind() says "too long"
                raise OSError
            tmpdir = tempfile.mkdtemp(prefix=".reflex-", dir=os.path.dirname(path) or ".")
            sock.bind(os.path.join(tmpdir, "s"))
        except OSError:  # e.g. a temporary name past the length limit: bind in place
            if tmpdir:
                os.rmdir(tmpdir)
            tmpdir = None
            sock.bind(path)
    except OSError as e:
        sock.close()
        raise StartupError(f"cannot bind {path}: {e.strerror or e}") from None
    finally:
        os.umask(old)
    bound = os.path.join(tmpdir, "s") if tmpdir else path
    os.chmod(bound, mode)
    sock.listen(16)
    if tmpdir:
        try:
            os.rename(bound, path)
        except OSError as e:
            sock.close()
            raise StartupError(f"cannot bind {path}: {e.strerror or e}") from None
        finally:
            try:
                os.unlink(bound)
            except FileNotFoundError:
                pass
            os.rmdir(tmpdir)
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
