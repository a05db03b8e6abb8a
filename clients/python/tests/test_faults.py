"""Fault injection against the fake server (testdata/fake_server.py)."""
import asyncio
import os
import threading
import time

import pytest
from conftest import FAKE

from reflex_client import AsyncClient, Client, ReflexConnectionError, ReflexError, ReflexTimeout


def fake(mode="", delay="0.05", **kw):
    env = {**os.environ, "FAKE_MODE": mode, "FAKE_TOKEN_DELAY": delay}
    return Client.spawn(FAKE[0], FAKE[1:], env=env, **kw)


def test_ready_timeout_kills_the_child():
    t0 = time.monotonic()
    with pytest.raises(ReflexConnectionError, match="no ready line"):
        fake("no_ready", ready_timeout=0.5)
    assert time.monotonic() - t0 < 5


def test_first_line_must_be_ready():
    with pytest.raises(ReflexConnectionError, match="not the ready event"):
        fake("bad_ready", ready_timeout=5)


def test_child_that_exits_before_ready_reports_status_and_stderr():
    with pytest.raises(ReflexConnectionError) as ei:
        fake("exit_early")
    assert ei.value.kind == "connection"
    assert "status 3" in str(ei.value) and "cannot start" in str(ei.value)


def test_missing_command():
    with pytest.raises(ReflexConnectionError, match="cannot start"):
        Client.spawn("/nonexistent/reflex", ["stdio"])


def test_dead_child_is_reported_then_restarted():
    with fake() as c:
        pid = c.ready["pid"]
        with pytest.raises(ReflexConnectionError, match="status 7"):
            c.request("die")
        assert c.ping()["ok"] is True
        assert c.ready["pid"] != pid


def test_timeout_cancels_with_sigint_and_the_child_keeps_serving():
    with fake(delay="0.2") as c:
        pid = c.ready["pid"]
        with pytest.raises(ReflexTimeout) as ei:
            c.generate("abcdefghijklmnopqrstuvwxyz", max_tokens=20, timeout=0.3)
        assert ei.value.kind == "cancelled" and isinstance(ei.value, TimeoutError)
        assert c.generate("ok")["text"] == "ok"
        assert c.ready["pid"] == pid


def test_concurrent_callers_are_served_in_fifo_order():
    with fake(delay="0.01") as c:
        out, threads = [], []
        for i in range(8):
            t = threading.Thread(target=lambda i=i: out.append((i, c.generate(f"p{i}")["text"])))
            threads.append(t)
            t.start()
            time.sleep(0.02)  # a definite arrival order
        for t in threads:
            t.join()
        assert out == [(i, f"p{i}") for i in range(8)]


def test_timeout_covers_the_wait_in_the_queue():
    with fake(delay="0.1") as c:
        first = []
        t = threading.Thread(target=lambda: first.append(c.generate("abcdefgh")))
        t.start()
        time.sleep(0.1)
        with pytest.raises(ReflexTimeout, match="while waiting"):
            c.generate("x", timeout=0.1)
        t.join()
        assert first[0]["text"] == "abcdefgh" and c.generate("ok")["text"] == "ok"


def test_closed_client_refuses():
    c = fake()
    c.close()
    with pytest.raises(ReflexError, match="closed"):
        c.ping()


def test_close_kills_a_child_that_ignores_stdin_eof():
    c = Client.spawn("sh", ["-c", 'echo \'{"event":"ready","id":null,"protocol":1}\'; trap "" INT; exec sleep 60'],
                     close_timeout=0.5)
    t0 = time.monotonic()
    c.close()
    assert time.monotonic() - t0 < 5


def test_async_faults():
    async def main():
        env = {**os.environ, "FAKE_TOKEN_DELAY": "0.1"}
        c = await AsyncClient.spawn(FAKE[0], FAKE[1:], env=env)
        async with c:
            pid = c.ready["pid"]
            with pytest.raises(ReflexConnectionError, match="status 7"):
                await c.request("die")
            assert (await c.ping())["ok"] and c.ready["pid"] != pid
            with pytest.raises(ReflexTimeout):
                await c.generate("abcdefghijklmnop", timeout=0.25)
            results = await asyncio.gather(*(c.generate(f"q{i}") for i in range(5)))
            assert [r["text"] for r in results] == [f"q{i}" for i in range(5)]
            # task cancellation: SIGINT, drain, the child keeps serving
            task = asyncio.ensure_future(c.generate("abcdefghijklmnop"))
            await asyncio.sleep(0.25)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert (await c.generate("ok"))["text"] == "ok" and c.ready["pid"] != pid
        with pytest.raises(ReflexConnectionError, match="no ready line"):
            await AsyncClient.spawn(FAKE[0], FAKE[1:], env={**os.environ, "FAKE_MODE": "no_ready"}, ready_timeout=0.5)

    asyncio.run(main())


def test_import_is_light():
    """The package must not pull in asyncio (AsyncClient is lazy) nor numpy."""
    import subprocess
    import sys

    from conftest import CLIENTS

    code = "import sys, reflex_client; print(sorted(m for m in ('asyncio', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=os.path.join(CLIENTS, "python"),
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
