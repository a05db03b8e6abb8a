"""The engine behind `reflex http`: one `reflex uds` process that the front spawned (or one
reached with --connect), spoken to through reflex_client's AsyncClient, one request at a time.

Requests queue FIFO (asyncio.Lock is fair) with a bounded number of waiters; a full queue
raises QueueFull. A request whose iterator is closed early (the HTTP client went away) is
cancelled in the engine: the AsyncClient closes the socket, which is the uds transport's
cancel (protocol/PROTOCOL.md). When the engine dies, the request in flight gets
EngineUnavailable, and the next request starts a new engine (spawn mode) or connects again.
"""

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import time

from reflex_client import ReflexConnectionError, ReflexError  # noqa: F401  (re-exported)
from reflex_client._async import AsyncClient

from . import process


class QueueFull(Exception):
    pass


class EngineUnavailable(Exception):
    """The engine died, could not be started, or cannot be reached."""


def _log(msg):
    sys.stderr.write(f"reflex http: {msg}\n")
    sys.stderr.flush()


class Engine:
    def __init__(self, *, connect=None, model=None, device="auto", max_queue=16,
                 ready_timeout=600.0, sock_dir=None):
        self.connect_path = connect
        self.model = model
        self.device = device
        self.max_queue = max_queue
        self.ready_timeout = ready_timeout
        self.connect_wait = 5.0
        self._lock = asyncio.Lock()
        self.waiting = 0
        self.busy = False
        self.proc = None
        self.client = None
        self.info = None  # the `load` result of the active model
        self.ready_line = None
        self.state = "starting"  # starting | ready | dead
        self.last_error = None
        self.deaths = 0
        self.starts = 0
        self.cancelled = 0
        self._dir = sock_dir
        self.path = connect

    # -- process ---------------------------------------------------------------------------

    def spawn(self, started=None):
        """Start `reflex uds` (spawn mode); returns at once, the socket comes a little later.
        `started`: a (proc, path) that process.spawn already returned."""
        if self.connect_path is not None:
            return
        if self._dir is None:
            self._dir = process.new_dir()
        self.proc, self.path = started or process.spawn(self._dir, model=self.model, device=self.device)
        self.starts += 1
        self.state = "starting"

    def _exit_status(self):
        code = self.proc.poll() if self.proc is not None else None
        if code is None:
            return None
        return f"killed by signal {-code}" if code < 0 else f"exit status {code}"

    async def _reap(self, grace=1.0):
        """Wait a little for a dying engine to exit; kill it if it does not."""
        proc = self.proc
        if proc is None:
            return None
        deadline = time.monotonic() + grace
        while proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if proc.poll() is None:
            proc.kill()
            while proc.poll() is None:
                await asyncio.sleep(0.01)
        return self._exit_status()

    async def _connect(self):
        """Connect to the socket (retrying while a spawned engine is still binding it) and
        make the default model active (so /health says ready only once it is loaded)."""
        t0 = time.monotonic()
        deadline = t0 + self.ready_timeout
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise EngineUnavailable(f"the engine exited while starting ({self._exit_status()})")
            try:
                self.client = await AsyncClient.connect(
                    self.path, ready_timeout=max(1.0, deadline - time.monotonic()))
                break
            except ReflexConnectionError as e:
                # a spawned engine: retry until it listens; --connect: for a few seconds (a
                # sidecar engine may still be creating its socket), then the next request retries
                if time.monotonic() > (deadline if self.proc is not None else t0 + self.connect_wait):
                    raise EngineUnavailable(f"cannot reach the engine at {self.path}: {e.message}") from None
                await asyncio.sleep(0.01 if self.proc is not None else 0.1)
        self.ready_line = self.client.ready
        try:
            self.info = await self.client.load(**({"model": self.model} if self.model else {}))
        except ReflexConnectionError as e:
            raise EngineUnavailable(f"the engine went away while loading the model: {e.message}") from None
        except ReflexError as e:
            raise EngineUnavailable(f"the engine cannot load the model: {e.kind}: {e.message}") from None
        self.state = "ready"
        self.last_error = None

    async def _ensure(self):
        if self.client is not None and self.state == "ready":
            if self.proc is None or self.proc.poll() is None:
                return self.client
            await self._died(f"the engine exited ({self._exit_status()})")
        client, self.client = self.client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()
        if self.connect_path is None and (self.proc is None or self.proc.poll() is not None):
            if self.proc is not None:
                _log("starting a new engine")
            self.spawn()
        try:
            await self._connect()
        except EngineUnavailable as e:
            await self._died(str(e))
            raise
        return self.client

    async def _died(self, why):
        """Record the engine's death; a spawned one is reaped (killed if it lingers)."""
        client, self.client = self.client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()
        if self.connect_path is None and self.proc is not None:
            status = await self._reap()
            if status and status not in why:
                why = f"{why} ({status})"
        if self.state == "ready":  # an engine that never came up did not die
            self.deaths += 1
        self.state = "dead"
        self.last_error = why
        _log(f"engine unavailable: {why}; the next request starts (or reconnects) it")

    async def start(self):
        """Bring the engine up now (at the front's start-up), queued like a request."""
        try:
            async with self.turn():
                pass
        except EngineUnavailable:
            pass  # recorded; reported by /health and the next request

    # -- requests --------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def turn(self):
        """Hold the engine (FIFO, bounded); yields the ready AsyncClient."""
        if self.waiting >= self.max_queue:
            raise QueueFull()
        self.waiting += 1
        try:
            await self._lock.acquire()
        finally:
            self.waiting -= 1
        self.busy = True
        try:
            yield await self._ensure()
        finally:
            self.busy = False
            self._lock.release()

    async def events(self, op, params, prepare=None):
        """One request: its events, then its result (ReflexError for an error result).
        Close the iterator (contextlib.aclosing) to cancel it early. prepare(params, the
        model's sampling defaults) runs once the engine is up, before the request is sent.
        (turn()'s steps inline: this runs per request.)"""
        done = False
        if self.waiting >= self.max_queue:
            raise QueueFull()
        self.waiting += 1
        try:
            await self._lock.acquire()
        finally:
            self.waiting -= 1
        self.busy = True
        try:
            client = await self._ensure()
            if prepare is not None:
                params = prepare(params, (self.info or {}).get("sampling"))
            evs = client.events(op, params)
            try:
                async for ev in evs:
                    if ev.get("event") == "result":
                        done = True
                    yield ev
                done = True
            except ReflexConnectionError as e:
                done = True
                await self._died(f"the engine connection failed mid-request: {e.message}")
                raise EngineUnavailable(self.last_error) from None
            except ReflexError:
                done = True
                raise
            finally:
                await evs.aclose()
        finally:
            if not done:
                self.cancelled += 1
            self.busy = False
            self._lock.release()

    async def request(self, op, params):
        result = None
        async with contextlib.aclosing(self.events(op, params)) as evs:
            async for ev in evs:
                result = ev
        return result

    def health(self):
        if self.state == "ready" and self.proc is not None and self.proc.poll() is not None:
            self.state = "dead"  # died while idle: the next request (or probe) restarts it
            self.deaths += 1
            self.last_error = f"the engine exited ({self._exit_status()})"
            _log(f"engine unavailable: {self.last_error}; it is restarted on the next request")
        out = {
            "status": "ok" if self.state == "ready" else ("loading" if self.state == "starting" else "error"),
            "engine": {
                "state": self.state,
                "mode": "connect" if self.connect_path else "spawn",
                "pid": (self.ready_line or {}).get("pid"),
                "backend": (self.info or {}).get("backend"),
                "model": (self.info or {}).get("model"),
                "starts": self.starts,
                "deaths": self.deaths,
            },
            "queue": {"busy": self.busy, "waiting": self.waiting, "max": self.max_queue},
            "cancelled": self.cancelled,
        }
        if self.last_error:
            out["error"] = self.last_error
        return out

    async def close(self):
        client, self.client = self.client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 5
            while proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
