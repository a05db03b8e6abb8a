"""`reflex http` in a subprocess for the HTTP tests (tests/test_http.py, test_http_apis.py,
test_http_docs.py): `Front` starts it on a free port and waits for /health; `http_env` the
environment it runs in (this checkout first on PYTHONPATH, no API key unless given);
`assert_error_shape` checks an OpenAI-style error body."""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("REFLEX_API_KEY", None)
    env.update(extra)
    return env


class Front:
    def __init__(self, args, env=None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-m", "reflex_ipc", "http", "--port", str(self.port), *args],
                                     env=env or http_env(), stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 180
        while True:
            assert self.proc.poll() is None, f"reflex http exited:\n{self.output()}"
            try:
                r = httpx.get(self.url + "/health", timeout=5)
                if r.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"reflex http not ready:\n{self.output()}"
            time.sleep(0.1)

    def output(self):
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace")

    def health(self):
        return httpx.get(self.url + "/health", timeout=10).json()

    def wait(self, pred, timeout=30):
        deadline = time.monotonic() + timeout
        while True:
            h = self.health()
            if pred(h):
                return h
            assert time.monotonic() < deadline, f"timed out; last /health: {h}"
            time.sleep(0.02)

    def close(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def assert_error_shape(r, status, code=None):
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    assert "Traceback" not in err["message"]
    assert err["type"] == ("invalid_request_error" if status < 500 else "server_error")
    if code is not None:
        assert err["code"] == code, err
    return err
