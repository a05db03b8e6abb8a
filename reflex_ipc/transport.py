"""The transports of `reflex stdio` and `reflex uds`: bounded line framing, the
connection types and the socket's binding.

Lines come from a bounded reader over a raw fd/socket (LineReader), so an over-long
line is skipped in bounded memory. Writes never block without a bound: they wait in
slices for the peer to read, give up after `write_timeout` seconds without progress
(the client is dropped) and within STOP_GRACE seconds of SIGTERM. A uds client that
stalls mid-line (`read_timeout`) or sits idle while another waits (`idle_timeout`) is
dropped. `ctl` (the Server) holds those settings and the stop flags.
"""

import os
import select
import sys
import time

TOO_LONG = object()  # LineReader.readline(): the line was over the limit
CHUNK = 1 << 16
PIPE_CHUNK = 4096  # PIPE_BUF: a write this small never blocks once poll says POLLOUT
STOP_GRACE = 2.0  # seconds a write may still wait for its reader after SIGTERM
SLICE = 0.25  # seconds between looks at the stop flag while a write waits


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


class StartupError(Exception):
    """The server cannot start; message for stderr (one line), exit 1."""


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
