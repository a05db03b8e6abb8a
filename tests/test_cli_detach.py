"""The console script's detached mode (cli._detach): a one-shot command runs in a forked
child; the parent, which the caller waits for, exits with the child's status as soon as
the child has written its output. On by default only when a CUDA context will exist;
REFLEX_DETACH=1 forces it here, on the CPU backend."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "tests", "data", "synthetic-llama.gguf")


def _children(pid):
    kids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as fh:
                    stat = fh.read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(d))
    return kids


def _spawn(*args, detach="1"):
    env = dict(os.environ, REFLEX_DETACH=detach, PYTHONPATH=ROOT)
    return subprocess.Popen([sys.executable, "-m", "reflex_ipc", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=ROOT)


@pytest.mark.parametrize("detach", ["1", "0"])
def test_output_and_status_are_the_childs(detach):
    p = _spawn("generate", "--device", "cpu", "--model", TINY, "--max-tokens", "3", "--json",
               "Hello", detach=detach)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err.decode()
    res = json.loads(out)
    assert res["completion_tokens"] == 3 and res["finish_reason"] == "length"


def test_error_status_passes_through():
    p = _spawn("system1", "--device", "cpu", "--model", "/nonexistent.gguf", "Hi",
               "--candidate", " a")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2  # model_not_found: an input error (README, exit codes)
    assert b"model_not_found" in err and out == b""


def test_usage_error_status_passes_through():
    p = _spawn("embed", "--pooling", "nope", "x")
    _, err = p.communicate(timeout=60)
    assert p.returncode == 2 and b"invalid choice" in err


def test_signal_to_the_parent_reaches_the_child():
    # a long generation, SIGTERM to the process we spawned: it must be forwarded, the
    # child must die of it, and the parent must exit 128 + SIGTERM
    p = _spawn("generate", "--device", "cpu", "--model", TINY, "--max-tokens", "4000",
               "--n-ctx", "4096", "Once upon a time")
    child = None
    deadline = time.time() + 60
    while child is None and time.time() < deadline:
        kids = _children(p.pid)
        child = kids[0] if kids else None
        time.sleep(0.05)
    assert child is not None, "the work did not run in a child process"
    time.sleep(1.0)
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM
    for _ in range(100):
        if not os.path.exists(f"/proc/{child}") or open(f"/proc/{child}/stat").read().split()[2] == "Z":
            break
        time.sleep(0.05)
    else:
        pytest.fail("the child outlived the signal")
