"""The asyncio client: the same API as Client, with coroutines and an async
iterator. asyncio.Lock is fair, so concurrent callers are served in FIFO order."""
import asyncio
import collections
import os
import signal

from ._common import (Ids, ReflexConnectionError, ReflexError, ReflexTimeout, belongs,
                      check_ready, decode_line, encode_request, ends_request, given, result_or_raise, RESIGNAL_S)

_LIMIT = 1 << 26  # longest line accepted from the server (embeddings are long)


class _AConn:
    def __init__(self, reader, writer, proc=None, where=""):
        self.reader, self.writer, self.proc, self.where = reader, writer, proc, where
        self.dead = False
        self.ready = None
        self.stderr_tail = collections.deque(maxlen=40)
        self._stderr_task = None
        if proc is not None and proc.stderr is not None:
            self._stderr_task = asyncio.ensure_future(self._drain_stderr())

    async def _drain_stderr(self):
        async for line in self.proc.stderr:
            self.stderr_tail.append(line.decode("utf-8", "replace").rstrip("\n"))

    async def next_event(self):
        try:
            line = await self.reader.readline()
        except (OSError, ValueError) as e:  # ValueError: a line over _LIMIT
            line = b""
            if isinstance(e, ValueError):
                self.abandon()
        if not line:
            self.dead = True
            raise ReflexConnectionError(await self.death())
        return decode_line(line)

    async def death(self):
        if self.proc is None:
            return f"{self.where}: connection closed by the server"
        try:
            code = await asyncio.wait_for(self.proc.wait(), 2)
        except asyncio.TimeoutError:
            code = None
        if self._stderr_task is not None:
            await asyncio.wait([self._stderr_task], timeout=0.5)
        what = "closed its stdout" if code is None else (
            f"was killed by signal {-code}" if code < 0 else f"exited with status {code}")
        tail = "\n".join(self.stderr_tail)
        return f"{self.where}: the server {what}" + (f"; stderr:\n{tail}" if tail else "")

    async def send(self, data):
        try:
            self.writer.write(data)
            await self.writer.drain()
        except OSError:
            self.dead = True
            raise ReflexConnectionError(await self.death()) from None

    def interrupt(self):
        if self.proc is not None:
            try:
                self.proc.send_signal(signal.SIGINT)
            except ProcessLookupError:
                pass
        else:
            self.abandon()

    def abandon(self):
        self.dead = True
        self.writer.close()
        if self.proc is not None:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass

    async def discard(self):
        """abandon, then wait for the child (so asyncio can release its pipes)."""
        self.abandon()
        if self.proc is not None:
            await self.proc.wait()
        if self._stderr_task is not None:
            await asyncio.wait([self._stderr_task], timeout=1)

    async def close(self, grace):
        self.dead = True
        self.writer.close()  # stdin EOF for a child; closes a socket
        if self.proc is not None:
            try:
                await asyncio.wait_for(self.proc.wait(), grace)
            except asyncio.TimeoutError:
                self.proc.kill()
                await self.proc.wait()


class AsyncClient:
    """asyncio twin of Client: `await AsyncClient.spawn(...)`,
    `await AsyncClient.connect(path)`, the same methods as coroutines,
    `stream()` an async iterator (close it, e.g. with contextlib.aclosing, to
    cancel early), `async with` for close."""

    def __init__(self, opener, *, close_timeout=5.0, cancel_timeout=10.0):
        self._opener = opener
        self._close_timeout = close_timeout
        self._cancel_timeout = cancel_timeout
        self._lock = asyncio.Lock()
        self._ids = Ids()
        self._conn = None
        self._closed = False

    @classmethod
    async def spawn(cls, command="reflex", args=("stdio",), *, env=None, cwd=None, stderr=asyncio.subprocess.PIPE,
                    ready_timeout=60.0, close_timeout=5.0, cancel_timeout=10.0):
        argv = [command, *args]

        async def opener():
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=stderr,
                    env=env, cwd=cwd, limit=_LIMIT)
            except OSError as e:
                raise ReflexConnectionError(f"cannot start {argv!r}: {e}") from None
            conn = _AConn(proc.stdout, proc.stdin, proc=proc, where=f"{command} (pid {proc.pid})")
            return await _wait_ready(conn, ready_timeout)

        client = cls(opener, close_timeout=close_timeout, cancel_timeout=cancel_timeout)
        client._conn = await opener()
        return client

    @classmethod
    async def connect(cls, path, *, ready_timeout=60.0, cancel_timeout=10.0):
        async def opener():
            try:
                reader, writer = await asyncio.open_unix_connection(os.fspath(path), limit=_LIMIT)
            except OSError as e:
                raise ReflexConnectionError(f"cannot connect to {path}: {e}") from None
            return await _wait_ready(_AConn(reader, writer, where=f"uds {path}"), ready_timeout)

        client = cls(opener, cancel_timeout=cancel_timeout)
        client._conn = await opener()
        return client

    @property
    def ready(self):
        return self._conn.ready if self._conn else None

    async def request(self, op, params=None, *, timeout=None, **kw):
        result = None
        async for ev in self._events(op, {**(params or {}), **kw}, timeout):
            result = ev
        return result

    def events(self, op, params=None, *, timeout=None):
        """Any op as an async iterator: its token events (when `params` ask to stream),
        then its result. Closing the iterator early cancels the request."""
        return self._events(op, dict(params or {}), timeout)

    def stream(self, prompt=None, *, timeout=None, **params):
        """generate with stream: true; yields the token events, then the result.
        Closing the iterator early cancels the generation."""
        return self._events("generate", {**given(prompt=prompt), **params, "stream": True}, timeout)

    async def generate(self, prompt=None, *, timeout=None, **params):
        return await self.request("generate", {**given(prompt=prompt), **params}, timeout=timeout)

    async def chat(self, messages, *, tools=None, json_schema=None, logprobs=None, timeout=None, **params):
        """generate on a conversation: `messages` ([{"role", "content"}, ...]) rendered
        with the model's chat template. `tools` (OpenAI function tools): a result
        whose output calls one has `tool_calls` and `content`. `json_schema`
        constrains the output; `logprobs` (0-20) adds per-token log-probabilities."""
        return await self.request("generate", {**given(messages=messages, tools=tools, json_schema=json_schema,
                                                         logprobs=logprobs), **params}, timeout=timeout)

    def stream_chat(self, messages, *, timeout=None, **params):
        """chat with stream: true (token events, then the result)."""
        return self._events("generate", {**given(messages=messages), **params, "stream": True}, timeout)

    async def infill(self, prefix, suffix="", *, input_extra=None, timeout=None, **params):
        """Fill in the middle between `prefix` and `suffix` (models with FIM tokens);
        input_extra: [{"filename", "text"}, ...] of other files as context."""
        return await self.request("infill", {"prefix": prefix, "suffix": suffix,
                                            **given(input_extra=input_extra), **params}, timeout=timeout)

    def stream_infill(self, prefix, suffix="", *, input_extra=None, timeout=None, **params):
        return self._events("infill", {"prefix": prefix, "suffix": suffix, **given(input_extra=input_extra),
                                        **params, "stream": True}, timeout)

    async def system1(self, prompt=None, candidates=None, *, timeout=None, **params):
        return await self.request("system1", {**given(prompt=prompt, candidates=candidates), **params}, timeout=timeout)

    async def classify(self, labels=None, input=None, *, messages=None, questions=None, timeout=None, **params):
        """The classify op (see Client.classify)."""
        return await self.request("classify", {**given(labels=labels, input=input, messages=messages,
                                                       questions=questions), **params}, timeout=timeout)

    async def embed(self, input=None, *, timeout=None, **params):
        """input: a string or a list of strings; the result's embeddings is always a list."""
        return await self.request("embed", {**given(input=input), **params}, timeout=timeout)

    async def tokenize(self, text=None, *, timeout=None, **params):
        return await self.request("tokenize", {**given(text=text), **params}, timeout=timeout)

    async def detokenize(self, token_ids=None, *, timeout=None, **params):
        """token_ids: as tokenize returns them; special=True renders control tokens
        (e.g. <|im_end|>) as their text instead of dropping them."""
        return await self.request("detokenize", {**given(token_ids=token_ids), **params}, timeout=timeout)

    async def state_save(self, path=None, *, timeout=None, **params):
        """Save the loop's current state (the tokens it holds) to path (protocol/STATE.md)."""
        return await self.request("state_save", {**given(path=path), **params}, timeout=timeout)

    async def state_load(self, path=None, *, timeout=None, **params):
        """Load a saved state: a later request whose tokens start with its tokens evaluates only the rest."""
        return await self.request("state_load", {**given(path=path), **params}, timeout=timeout)

    async def hello(self, *, timeout=None, **params):
        return await self.request("hello", params, timeout=timeout)

    async def load(self, model=None, *, timeout=None, **params):
        return await self.request("load", {**given(model=model), **params}, timeout=timeout)

    async def ping(self, *, timeout=None):
        return await self.request("ping", timeout=timeout)

    async def close(self):
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close(self._close_timeout)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    def _events(self, op, params, timeout):
        return self._exchange(lambda rid: (encode_request(rid, op, params), rid), op, timeout)

    async def _exchange(self, line_for, what, timeout):
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        try:
            await asyncio.wait_for(self._lock.acquire(), timeout)
        except asyncio.TimeoutError:
            raise ReflexTimeout(f"{what} timed out after {timeout} s while waiting for the connection") from None
        try:
            if self._closed:
                raise ReflexError("connection", "the client is closed")
            if self._conn is None or self._conn.dead:
                self._conn = await self._opener()
            conn = self._conn
            line, rid = line_for(self._ids.next())
            await conn.send(line)
            done = False
            try:
                while True:
                    if deadline is None:
                        ev = await conn.next_event()
                    else:
                        try:
                            ev = await asyncio.wait_for(conn.next_event(), max(0.0, deadline - loop.time()))
                        except asyncio.TimeoutError:
                            raise ReflexTimeout(f"{what} timed out after {timeout} s") from None
                    if ends_request(ev, rid):
                        done = True
                        yield result_or_raise(ev)
                        return
                    if belongs(ev, rid):
                        yield ev
            finally:
                if not done:
                    await self._cancel(conn, rid)
        finally:
            self._lock.release()

    async def _cancel(self, conn, rid):
        """Cancel the request in flight (SIGINT, repeated; a socket is closed)
        and drain up to its result; kill a server that does not answer."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._cancel_timeout
        try:
            while not conn.dead:
                if loop.time() > deadline:
                    await conn.discard()
                    return
                conn.interrupt()
                try:
                    ev = await asyncio.wait_for(conn.next_event(), RESIGNAL_S)
                except asyncio.TimeoutError:
                    continue
                if ends_request(ev, rid):
                    return
        except ReflexError:
            await conn.discard()


async def _wait_ready(conn, timeout):
    try:
        ev = await asyncio.wait_for(conn.next_event(), timeout)
        conn.ready = check_ready(ev, conn.where)
    except asyncio.TimeoutError:
        await conn.discard()
        raise ReflexConnectionError(f"{conn.where}: no ready line within {timeout} s") from None
    except BaseException:
        await conn.discard()
        raise
    return conn
