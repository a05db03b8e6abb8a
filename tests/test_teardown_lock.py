"""An exiting process waits while a start-up holds the init lock (the default; REFLEX_TEARDOWN=now: off)."""
import os
import time

import reflex_ipc.cuda as cuda


def test_teardown_waits_for_init_then_goes(monkeypatch, tmp_path):
    monkeypatch.delenv("REFLEX_TEARDOWN", raising=False)  # the default
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    fd = cuda._hold_init_lock()
    assert fd is not None
    t = time.monotonic()
    cuda.teardown_when_no_init(linger_s=0.0, wait_s=0.3)
    assert time.monotonic() - t >= 0.28  # held by a start-up: waits up to wait_s
    os.close(fd)
    t = time.monotonic()
    cuda.teardown_when_no_init(linger_s=0.0, wait_s=5.0)
    assert time.monotonic() - t < 1.0  # free: goes at once


def test_now_turns_it_off(monkeypatch, tmp_path):
    monkeypatch.setenv("REFLEX_TEARDOWN", "now")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert cuda._hold_init_lock() is None
    t = time.monotonic()
    cuda.teardown_when_no_init(linger_s=0.5, wait_s=1.0)
    assert time.monotonic() - t < 0.1
    assert not os.listdir(tmp_path)
