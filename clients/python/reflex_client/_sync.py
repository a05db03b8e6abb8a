"""The blocking client: one request in flight per connection, callers served in
FIFO order, a reader thread per connection feeding a queue."""
import collections
import os
import queue
import signal
import socket
import subprocess
import threading
import time

from ._common import (Ids, ReflexConnectionError, ReflexError, ReflexTimeout, belongs,
                      check_ready, decode_line, encode_request, ends_request, given, result_or_raise, RESIGNAL_S)

_EOF = object()


class _FifoLock:
    """A lock handed to its waiters in arrival order; acquire can time out."""

    def __init__(self):
        self._mu = threading.Lock()
        self._held = False
        self._waiters = collections.deque()

    def acquire(self, timeout=None):
        with self._mu:
            if not self._held and not self._waiters:
                self._held = True
                return True
            turn = threading.Event()
            self._waiters.append(turn)
        if turn.wait(timeout):
            return True
        with self._mu:
            if turn.is_set():  # handed over just as the wait timed out
                return True
            self._waiters.remove(turn)
            return False

    def release(self):
        with self._mu:
            if self._waiters:
                self._waiters.popleft().set()  # handed over: still held
            else:
                self._held = False


class _Conn:
    """One transport: a spawned child (stdin/stdout) or a UDS connection."""

    def __init__(self, wfile, rfile, proc=None, sock=None, where=""):
        self.wfile, self.proc, self.sock, self.where = wfile, proc, sock, where
        self.lines = queue.Queue()
        self.dead = False
        self.stderr_tail = collections.deque(maxlen=40)
        self.ready = None
        threading.Thread(target=self._read, args=(rfile,), daemon=True).start()
        if proc is not None and proc.stderr is not None:
            threading.Thread(target=self._drain_stderr, daemon=True).start()

    def _read(self, rfile):
        try:
            for line in rfile:
                self.lines.put(line)
        except (OSError, ValueError):
            pass
        self.lines.put(_EOF)
        self.dead = True  # a server that died while idle is replaced on the next call
        rfile.close()
        if self.sock is not None:
            self.sock.close()

    def _drain_stderr(self):
        try:
            for line in self.proc.stderr:
                self.stderr_tail.append(line.decode("utf-8", "replace").rstrip("\n"))
        except (OSError, ValueError):
            pass
        self.proc.stderr.close()

    def next_event(self, deadline):
        """The next server event; None when `deadline` (monotonic) passes first."""
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            return None
        if line is _EOF:
            self.lines.put(_EOF)
            self.dead = True
            raise ReflexConnectionError(self.death())
        return decode_line(line)

    def death(self):
        if self.proc is None:
            return f"{self.where}: connection closed by the server"
        try:
            code = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            code = None
        self._close_stdin()
        what = "closed its stdout" if code is None else (
            f"was killed by signal {-code}" if code < 0 else f"exited with status {code}")
        time.sleep(0.05)  # let the stderr thread catch the last lines
        tail = "\n".join(self.stderr_tail)
        return f"{self.where}: the server {what}" + (f"; stderr:\n{tail}" if tail else "")

    def send(self, data):
        try:
            if self.sock is not None:
                self.sock.sendall(data)
            else:
                self.wfile.write(data)
                self.wfile.flush()
        except (OSError, ValueError):
            self.dead = True
            raise ReflexConnectionError(self.death()) from None

    def interrupt(self):
        """Cancel the request in flight: SIGINT to a child (it keeps serving);
        a UDS connection is closed (the server cancels when its client leaves)."""
        if self.proc is not None:
            try:
                self.proc.send_signal(signal.SIGINT)
            except OSError:
                pass
        else:
            self.abandon()

    def abandon(self):
        self.dead = True
        if self.sock is not None:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.sock.close()
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self._close_stdin()

    def _close_stdin(self):
        try:
            self.wfile.close()
        except OSError:
            pass

    def close(self, grace):
        self.dead = True
        if self.sock is not None:
            self.abandon()
            return
        self._close_stdin()  # stdin EOF: the server finishes and exits 0
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Client:
    """A reflex server, spawned (`Client.spawn`) or reached over a Unix socket
    (`Client.connect`). Thread-safe: concurrent calls are served one at a time,
    in arrival order. A dead server is reported (ReflexConnectionError) and
    replaced on the next call."""

    def __init__(self, opener, *, close_timeout=5.0, cancel_timeout=10.0):
        self._opener = opener
        self._close_timeout = close_timeout
        self._cancel_timeout = cancel_timeout
        self._lock = _FifoLock()
        self._ids = Ids()
        self._conn = None
        self._closed = False
        self._conn = opener()

    @classmethod
    def spawn(cls, command="reflex", args=("stdio",), *, env=None, cwd=None, stderr=subprocess.PIPE,
              ready_timeout=60.0, close_timeout=5.0, cancel_timeout=10.0):
        """Start `command *args` (a server speaking the protocol on stdio) and
        wait up to `ready_timeout` s for its ready line. `stderr`: PIPE keeps
        the last lines for error messages; None inherits; or a file."""
        argv = [command, *args]

        def opener():
            try:
                proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                                        env=env, cwd=cwd, bufsize=0)
            except OSError as e:
                raise ReflexConnectionError(f"cannot start {argv!r}: {e}") from None
            conn = _Conn(proc.stdin, proc.stdout, proc=proc, where=f"{command} (pid {proc.pid})")
            return _wait_ready(conn, ready_timeout)

        return cls(opener, close_timeout=close_timeout, cancel_timeout=cancel_timeout)

    @classmethod
    def connect(cls, path, *, ready_timeout=60.0, cancel_timeout=10.0):
        """Connect to `reflex uds PATH` and wait for the connection's ready line."""

        def opener():
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(os.fspath(path))
            except OSError as e:
                sock.close()
                raise ReflexConnectionError(f"cannot connect to {path}: {e}") from None
            conn = _Conn(None, sock.makefile("rb"), sock=sock, where=f"uds {path}")
            return _wait_ready(conn, ready_timeout)

        return cls(opener, cancel_timeout=cancel_timeout)

    @property
    def ready(self):
        """The ready event of the current connection (protocol, version, pid, backend, model)."""
        return self._conn.ready if self._conn else None

    # -- the ops ----------------------------------------------------------
    def request(self, op, params=None, *, timeout=None, **kw):
        """Send one request; return its result dict (ok: true) or raise ReflexError."""
        result = None
        for ev in self._events(op, {**(params or {}), **kw}, timeout):
            result = ev
        return result

    def stream(self, prompt=None, *, timeout=None, **params):
        """generate with stream: true; yields the token events, then the result.
        Closing the iterator early cancels the generation."""
        return self._events("generate", {**given(prompt=prompt), **params, "stream": True}, timeout)

    def generate(self, prompt=None, *, timeout=None, **params):
        return self.request("generate", {**given(prompt=prompt), **params}, timeout=timeout)

    def chat(self, messages, *, tools=None, json_schema=None, logprobs=None, timeout=None, **params):
        """generate on a conversation: `messages` ([{"role", "content"}, ...]) rendered
        with the model's chat template. `tools` (OpenAI function tools): a result
        whose output calls one has `tool_calls` and `content`. `json_schema`
        constrains the output; `logprobs` (0-20) adds per-token log-probabilities."""
        return self.request("generate", {**given(messages=messages, tools=tools, json_schema=json_schema,
                                                         logprobs=logprobs), **params}, timeout=timeout)

    def stream_chat(self, messages, *, timeout=None, **params):
        """chat with stream: true (token events, then the result)."""
        return self._events("generate", {**given(messages=messages), **params, "stream": True}, timeout)

    def infill(self, prefix, suffix="", *, input_extra=None, timeout=None, **params):
        """Fill in the middle between `prefix` and `suffix` (models with FIM tokens);
        input_extra: [{"filename", "text"}, ...] of other files as context."""
        return self.request("infill", {"prefix": prefix, "suffix": suffix,
                                            **given(input_extra=input_extra), **params}, timeout=timeout)

    def stream_infill(self, prefix, suffix="", *, input_extra=None, timeout=None, **params):
        return self._events("infill", {"prefix": prefix, "suffix": suffix, **given(input_extra=input_extra),
                                        **params, "stream": True}, timeout)

    def system1(self, prompt=None, candidates=None, *, timeout=None, **params):
        return self.request("system1", {**given(prompt=prompt, candidates=candidates), **params}, timeout=timeout)

    def classify(self, labels=None, input=None, *, messages=None, questions=None, timeout=None, **params):
        """The classify op: which of `labels` continues `input` (a string), or begins the
        reply to `messages`; each label's probability and logprob, `best`, `entropy`, and a
        `warning` when the labels tokenize to different lengths. `questions`: a batch over
        the shared input, one decision per question in `results`."""
        return self.request("classify", {**given(labels=labels, input=input, messages=messages,
                                                 questions=questions), **params}, timeout=timeout)

    def embed(self, input=None, *, timeout=None, **params):
        """input: a string or a list of strings; the result's embeddings is always a list."""
        return self.request("embed", {**given(input=input), **params}, timeout=timeout)

    def tokenize(self, text=None, *, timeout=None, **params):
        return self.request("tokenize", {**given(text=text), **params}, timeout=timeout)

    def detokenize(self, token_ids=None, *, timeout=None, **params):
        """token_ids: as tokenize returns them; special=True renders control tokens
        (e.g. <|im_end|>) as their text instead of dropping them."""
        return self.request("detokenize", {**given(token_ids=token_ids), **params}, timeout=timeout)

    def state_save(self, path=None, *, timeout=None, **params):
        """Save the loop's current state (the tokens it holds) to path (protocol/STATE.md)."""
        return self.request("state_save", {**given(path=path), **params}, timeout=timeout)

    def state_load(self, path=None, *, timeout=None, **params):
        """Load a saved state: a later request whose tokens start with its tokens evaluates only the rest."""
        return self.request("state_load", {**given(path=path), **params}, timeout=timeout)

    def hello(self, *, timeout=None, **params):
        return self.request("hello", params, timeout=timeout)

    def load(self, model=None, *, timeout=None, **params):
        return self.request("load", {**given(model=model), **params}, timeout=timeout)

    def ping(self, *, timeout=None):
        return self.request("ping", timeout=timeout)

    # -- lifecycle --------------------------------------------------------
    def close(self):
        """stdin EOF, wait up to close_timeout for the server to exit, then kill it."""
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close(self._close_timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        conn = getattr(self, "_conn", None)
        if conn is not None and conn.proc is not None and conn.proc.poll() is None:
            conn.abandon()

    # -- the exchange -----------------------------------------------------
    def _events(self, op, params, timeout):
        return self._exchange(lambda rid: (encode_request(rid, op, params), rid), op, timeout)

    def _exchange(self, line_for, what, timeout):
        """Send line_for(rid) -> (bytes, id the response carries); yield this
        request's events, the result last (an error result raises)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._lock.acquire(timeout):
            raise ReflexTimeout(f"{what} timed out after {timeout} s while waiting for the connection")
        try:
            if self._closed:
                raise ReflexError("connection", "the client is closed")
            if self._conn is None or self._conn.dead:
                self._conn = self._opener()
            conn = self._conn
            line, rid = line_for(self._ids.next())
            conn.send(line)
            done = False
            try:
                while True:
                    ev = conn.next_event(deadline)
                    if ev is None:
                        raise ReflexTimeout(f"{what} timed out after {timeout} s")
                    if ends_request(ev, rid):
                        done = True
                        yield result_or_raise(ev)
                        return
                    if belongs(ev, rid):
                        yield ev
            finally:
                if not done:
                    self._cancel(conn, rid)
        finally:
            self._lock.release()

    def _cancel(self, conn, rid):
        """Cancel the request in flight and drain up to its result, so the
        connection can serve the next one; kill a server that does not answer."""
        deadline = time.monotonic() + self._cancel_timeout
        try:
            while not conn.dead:
                if time.monotonic() > deadline:
                    conn.abandon()
                    return
                conn.interrupt()
                ev = conn.next_event(min(deadline, time.monotonic() + RESIGNAL_S))
                if ev is not None and ends_request(ev, rid):
                    return
        except ReflexError:
            conn.abandon()


def _wait_ready(conn, timeout):
    deadline = time.monotonic() + timeout
    try:
        ev = conn.next_event(deadline)
        if ev is None:
            raise ReflexConnectionError(f"{conn.where}: no ready line within {timeout} s")
        conn.ready = check_ready(ev, conn.where)
    except BaseException:
        conn.abandon()
        raise
    return conn
