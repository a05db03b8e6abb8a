"""server.py: the loop, framing, dispatch, signals and uds, with a fake runner.

The fake runner makes these tests fast and deterministic (timed tokens, forced
failures). test_server_real.py drives the real `reflex stdio` / `reflex uds`
with the CPU engine and SmolLM2. The fake runner and the `Proc`/`UdsClient`
clients live in reflex_ipc.testing.fake_server (the fake subprocesses import it).
"""

import json
import os
import pathlib
import select
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time

import pytest

from reflex_ipc import server
from reflex_ipc.testing.fake_server import (FakeRunner, Proc, UdsClient, check_schema, fake_loader,
                                            fake_resolve, lines_of, stop)


# ---------------------------------------------------------------- in-process


def serve_bytes(data: bytes, *, limit=1 << 20, loads=None, **kw):
    """Run the loop over `data` as stdin (a file); the lines it wrote."""
    srv = server.Server(loader=fake_loader(loads=loads), resolve=fake_resolve,
                        max_line_bytes=limit, **kw)
    with tempfile.TemporaryFile() as fin, tempfile.TemporaryFile() as fout:
        fin.write(data)
        fin.seek(0)
        srv.serve_conn(server.FdConn(fin.fileno(), fout.fileno(), limit))
        fout.seek(0)
        out = fout.read()
    assert out.endswith(b"\n")
    lines = [json.loads(x) for x in out.split(b"\n")[:-1]]
    return srv, lines


def test_ready_then_one_result_per_request():
    reqs = [{"id": 1, "op": "ping"}, {"id": "h", "op": "hello"}, {"op": "ping"},
            {"id": 2, "op": "tokenize", "text": "ab", "add_bos": True},
            {"id": 3, "op": "detokenize", "token_ids": [97, 98]}]
    srv, out = serve_bytes(lines_of(*reqs))
    assert out[0]["event"] == "ready" and out[0]["protocol"] == 1 and out[0]["id"] is None
    assert out[0]["model"] is None and out[0]["pid"] == os.getpid()
    results = out[1:]
    assert [r["id"] for r in results] == [1, "h", None, 2, 3]
    assert all(r["event"] == "result" and r["ok"] for r in results)
    assert results[3]["token_ids"] == [1, 97, 98]
    assert results[4]["text"] == "ab"
    for r in out:
        check_schema(r)
    # the first result (only) has process_start_to_first_token
    assert "process_start_to_first_token" in results[0]["timings"]
    assert all("process_start_to_first_token" not in r["timings"] for r in results[1:])
    assert "load" in results[3]["timings"] and "load" not in results[4]["timings"]


def test_generate_params_reach_the_runner_and_stream():
    req = {"id": 7, "op": "generate", "prompt": "abc", "max_tokens": 5, "temperature": 0.5,
           "top_k": 3, "top_p": 0.9, "min_p": 0.1, "seed": 11, "repeat_penalty": 1.2,
           "repeat_last_n": 8, "stop": "ca", "stream": True, "cache_prompt": False}
    srv, out = serve_bytes(lines_of(req))
    runner = next(iter(srv.models.runners.values()))
    assert runner.calls == [dict(prompt="abc", max_tokens=5, temperature=0.5, top_k=3, top_p=0.9,
                                 min_p=0.1, seed=11, repeat_penalty=1.2, repeat_last_n=8,
                                 stop=["ca"], cache_prompt=False)]
    tokens, res = out[1:-1], out[-1]
    assert [t["event"] for t in tokens] == ["token"] * len(tokens)
    assert all(t["id"] == 7 for t in tokens)
    assert "".join(t["text"] for t in tokens) == res["text"] == "abc"
    assert res["finish_reason"] == "stop_string" and res["model"] == "fake-default.gguf"
    t = res["timings"]
    assert t["prompt_eval"] == 0.5 and t["decode"] == 1.5 and t["load"] >= 0
    assert t["total"] >= t["parse"]
    for r in out:
        check_schema(r)


def test_no_token_lines_without_stream():
    _, out = serve_bytes(lines_of({"id": 1, "op": "generate", "prompt": "abc", "max_tokens": 3}))
    assert [o["event"] for o in out] == ["ready", "result"]
    assert out[1]["text"] == "abc"


def test_system1_embed_results():
    _, out = serve_bytes(lines_of(
        {"id": 1, "op": "system1", "prompt": "q", "candidates": ["a", "bb"]},
        {"id": 2, "op": "embed", "input": "x"},
        {"id": 3, "op": "embed", "input": ["x", "y"], "normalize": True}))
    assert out[1]["best_idx"] == 0 and len(out[1]["candidates"]) == 2
    assert out[2]["embeddings"] == [[1.0] * 4] and out[2]["dim"] == 4
    # the fake's system1 reports no candidate pass and its embed only prompt_eval
    assert out[1]["timings"]["decode"] == 0.0 and out[1]["timings"]["prompt_eval"] == 1.0
    assert out[2]["timings"]["decode"] == 0.0 and out[2]["timings"]["prompt_eval"] == 0.2
    assert out[3]["embeddings"] == [[0.5] * 4] * 2
    for r in out:
        check_schema(r)


def test_errors_do_not_stop_the_loop(capfd):
    reqs = [b"garbage", b"\xff\xfe\x00", {"id": 1, "op": "generate", "prompt": "boom"},
            {"id": 2, "op": "generate", "prompt": "oom"},
            {"id": 3, "op": "generate", "prompt": "x", "max_tokens": 9000},
            {"id": 4, "op": "tokenize", "text": "x", "model": "nope"},
            {"id": 5, "op": "tokenize", "text": "x", "model": "/models/x.bad"},
            {"id": 6, "op": "detokenize", "token_ids": [999, 1000]},
            {"id": 8, "op": "generate", "prompt": "unencodable"},
            {"id": 7, "op": "ping"}]
    _, out = serve_bytes(lines_of(*reqs))
    kinds = [(o["id"], o.get("error", {}).get("kind")) for o in out[1:]]
    assert kinds == [(None, "parse_error"), (None, "parse_error"), (1, "internal"),
                     (2, "out_of_memory"), (3, "context_overflow"), (4, "model_not_found"),
                     (5, "gguf_error"), (6, "invalid_request"), (8, "internal"), (7, None)]
    assert "token_ids[1]" in out[8]["error"]["message"]
    assert out[3]["op"] == "generate"
    err = capfd.readouterr().err
    assert "Traceback" in err and "RuntimeError: boom" in err  # internal: traceback on stderr
    assert "could not be encoded" in out[9]["error"]["message"]
    for r in out:
        check_schema(r)


def test_blank_lines_crlf_and_last_line_without_newline():
    _, out = serve_bytes(b'\n  \n\r\n{"id": 1, "op": "ping"}\r\n\t\n{"id": 2, "op": "ping"}')
    assert [o["id"] for o in out[1:]] == [1, 2]


def test_line_too_long_is_skipped_then_loop_goes_on():
    big = b'{"id": 1, "op": "tokenize", "text": "' + b"a" * 5000 + b'"}'
    _, out = serve_bytes(lines_of({"id": 0, "op": "ping"}, big, {"id": 2, "op": "ping"}, big),
                         limit=1000)
    assert [(o["id"], o.get("error", {}).get("kind")) for o in out[1:]] == [
        (0, None), (None, "line_too_long"), (2, None), (None, "line_too_long")]


def test_line_at_the_limit_is_accepted():
    line = b'{"id": 1, "op": "tokenize", "text": "' + b"a" * 100 + b'"}'
    _, out = serve_bytes(line + b"\n" + line + b"x\n", limit=len(line))
    assert out[1]["ok"] and out[2]["error"]["kind"] == "line_too_long"


def test_model_cache_active_and_switching():
    loads = []
    reqs = [{"id": 1, "op": "tokenize", "text": "a"},                           # default, loads
            {"id": 2, "op": "load", "model": "/models/b.gguf"},                 # loads, active
            {"id": 3, "op": "tokenize", "text": "a"},                           # b
            {"id": 4, "op": "tokenize", "text": "a", "model": "smollm2"},       # cached default
            {"id": 5, "op": "load", "model": "smollm2"},                        # cached
            {"id": 6, "op": "tokenize", "text": "a", "device": "cpu"},          # default on cpu
            {"id": 7, "op": "hello"},
            {"id": 8, "op": "load", "model": "/models/b.gguf"},                 # cached, active
            {"id": 9, "op": "load"},                                            # the default again
            {"id": 10, "op": "tokenize", "text": "a"}]
    _, out = serve_bytes(lines_of(*reqs), loads=loads)
    r = {o["id"]: o for o in out[1:]}
    assert loads == [("/models/default.gguf", "auto"), ("/models/b.gguf", "auto"),
                     ("/models/default.gguf", "cpu")]
    assert r[2]["cached"] is False and "load" in r[2]["timings"]
    assert r[3]["model"] == "fake-b.gguf" and r[4]["model"] == "fake-default.gguf"
    assert r[5]["cached"] is True and "load" not in r[5]["timings"]
    assert r[7]["model"] == "fake-default.gguf" and len(r[7]["models"]) == 3
    assert r[8]["model"] == "fake-b.gguf" and r[8]["cached"]
    assert r[9]["model"] == "fake-default.gguf" and r[9]["cached"]
    assert r[10]["model"] == "fake-default.gguf"


def test_auto_device_resolves_once():
    """A runner loaded with "auto" is found again under the device it chose,
    and "auto" means that device from then on: no second load."""
    loads = []

    def load(path, device):
        loads.append((path, device))
        r = FakeRunner(path, device)
        r.info = lambda: {"model": "m", "backend": "cpu", "n_vocab": 1000}
        return r

    srv = server.Server(loader=load, resolve=fake_resolve)
    with tempfile.TemporaryFile() as fin, tempfile.TemporaryFile() as fout:
        fin.write(lines_of({"id": 1, "op": "load"}, {"id": 2, "op": "load", "device": "cpu"},
                           {"id": 3, "op": "load", "model": "/models/b.gguf", "device": "auto"},
                           {"id": 4, "op": "load", "model": "/models/b.gguf", "device": "cpu"}))
        fin.seek(0)
        srv.serve_conn(server.FdConn(fin.fileno(), fout.fileno(), 1 << 20))
        fout.seek(0)
        out = [json.loads(x) for x in fout.read().splitlines()]
    assert loads == [("/models/default.gguf", "auto"), ("/models/b.gguf", "cpu")]
    assert [o["cached"] for o in out[1:]] == [False, True, False, True]


def test_shutdown_stops_reading():
    srv, out = serve_bytes(lines_of({"id": 1, "op": "shutdown"}, {"id": 2, "op": "ping"}))
    assert [o["id"] for o in out[1:]] == [1] and srv.stopping


def test_line_reader_bounded_memory_and_chunking():
    chunks = [b'{"a"', b":1}\n", b"x" * 200_000, b"y" * 300_000 + b"\nok\n", b"tail"]
    sizes = []

    def read(n):
        sizes.append(len(r.buf))
        return chunks.pop(0) if chunks else b""

    r = server.LineReader(read, 1000)
    assert r.readline() == b'{"a":1}'
    assert r.readline() is server.TOO_LONG
    assert r.readline() == b"ok"
    assert r.readline() == b"tail"
    assert r.readline() is None
    assert max(sizes) <= 1000 + 300_001  # never the whole 500 kB line


def test_tiny_json_ready_line_matches_json():
    v = {"a": 'q"\\\n\x01é😀', "b": None, "c": 1.5, "d": -3, "e": {"f": True}}
    assert json.loads(server._tiny_json(v)) == v


# ---------------------------------------------------------------- subprocess helpers


FAKE_MAIN = """
import sys
from reflex_ipc.testing.fake_server import FakeRunner, fake_resolve
from reflex_ipc import server
srv = server.Server(loader=lambda p, d: FakeRunner(p, d, delay={delay!r}), resolve=fake_resolve,
                    max_line_bytes={limit!r})
if {uds!r}:
    sys.exit(server.serve_uds(srv, {uds!r}, 0o600, False))
sys.exit(server.serve_stdio(srv, False))
"""


def fake_argv(delay=0.02, limit=16 << 20, uds=None):
    code = FAKE_MAIN.format(delay=delay, limit=limit, uds=uds)
    return [sys.executable, "-c", code]


@pytest.fixture
def fake():
    procs = []

    def start(**kw):
        p = Proc(fake_argv(**kw))
        procs.append(p)
        return p
    yield start
    for p in procs:
        p.close()


def test_fake_subprocess_sigint_cancels_and_keeps_serving(fake):
    p = fake(delay=0.02)
    p.send({"id": 1, "op": "generate", "prompt": "abcdef", "max_tokens": 200, "stream": True})
    first = p.read()
    assert first["event"] == "token"
    p.p.send_signal(signal.SIGINT)
    tokens, res = p.response()
    assert res["id"] == 1 and res["error"]["kind"] == "cancelled"
    assert len(tokens) + 1 < 200
    p.p.send_signal(signal.SIGINT)  # idle: ignored
    time.sleep(0.2)
    assert p.request({"id": 2, "op": "ping"})[1]["ok"]


def test_fake_subprocess_sigterm_finishes_the_request(fake):
    p = fake(delay=0.01)
    p.send({"id": 1, "op": "generate", "prompt": "abc", "max_tokens": 60, "stream": True},
           {"id": 2, "op": "ping"})
    assert p.read()["event"] == "token"
    p.p.send_signal(signal.SIGTERM)
    tokens, res = p.response()
    assert res["ok"] and res["completion_tokens"] == 60
    assert p.read() is None  # the queued ping is not served
    assert p.wait() == 0


def test_fake_subprocess_sigterm_idle_exits_at_once(fake):
    p = fake()
    t = time.monotonic()
    p.p.send_signal(signal.SIGTERM)
    assert p.wait(10) == 0 and time.monotonic() - t < 5


# A fake `reflex stdio` that sends itself SIGTERM from inside the first import of
# `module` (the imports that follow the ready line: msgspec, and the datetime that
# msgspec's C init imports), then says on stderr whether those imports completed.
SIGTERM_IN_IMPORT = """
import signal, sys
from reflex_ipc.testing.fake_server import FakeRunner, fake_resolve
from reflex_ipc import server

class Hook:
    fired = False
    def find_spec(self, name, path=None, target=None):
        if name == {module!r} and not Hook.fired:
            Hook.fired = True
            signal.raise_signal(signal.SIGTERM)
        return None

sys.meta_path.insert(0, Hook())
srv = server.Server(loader=lambda p, d: FakeRunner(p, d), resolve=fake_resolve)
if {uds!r}:
    rc = server.serve_uds(srv, {uds!r}, 0o600, False)
else:
    rc = server.serve_stdio(srv, False)
import typing, msgspec
class S(msgspec.Struct):
    a: typing.Any = None
msgspec.json.Decoder(S)  # msgspec's init swallowed an exception: this read NULL (SIGSEGV)
sys.stderr.write(f"fired={{Hook.fired}} protocol={{'reflex_ipc.protocol' in sys.modules}}\\n")
sys.exit(rc)
"""


@pytest.mark.parametrize("transport", ["stdio", "uds"])
@pytest.mark.parametrize("module", ["msgspec", "datetime"])
def test_fake_subprocess_sigterm_during_an_import_lets_it_finish(module, transport, sockdir):
    """SIGTERM that lands in an import (here: right after the first ready line) must not
    raise into it: a C extension's init may swallow the exception and stay half set up
    (msgspec's unchecked PyDateTime_IMPORT: `reflex uds` died of SIGSEGV when a client
    connected, closed, and SIGTERM came). The import completes, then the loop ends, exit 0."""
    uds = str(sockdir / "s") if transport == "uds" else None
    p = Proc([sys.executable, "-c", SIGTERM_IN_IMPORT.format(module=module, uds=uds)],
             ready=uds is None)
    try:
        if uds:
            c = UdsClient(uds)
            assert c.read() is None  # the server closes the connection unserved
            c.close()
        else:
            assert p.read() is None  # no request served
        assert p.wait() == 0, p.err()[-2000:]
        assert "fired=True protocol=True" in p.err(), p.err()[-2000:]
        assert not uds or not os.path.exists(uds)
    finally:
        p.close()


def test_fake_subprocess_sigterm_during_the_model_load_lets_it_finish():
    """SIGTERM during the --model load does not raise into the loader (it imports numpy,
    the engine, ctypes libraries): the load finishes, then exit 0 without a ready line."""
    code = ("import signal, sys\n"
            "from reflex_ipc.testing.fake_server import FakeRunner, fake_resolve\n"
            "from reflex_ipc import server\n"
            "def load(p, d):\n"
            "    signal.raise_signal(signal.SIGTERM)\n"
            "    sys.stderr.write('loaded\\n')\n"
            "    return FakeRunner(p, d)\n"
            "srv = server.Server(model='smollm2', loader=load, resolve=fake_resolve)\n"
            "sys.exit(server.serve_stdio(srv, True))\n")
    p = Proc([sys.executable, "-c", code], ready=False)
    try:
        assert p.read() is None  # no ready line
        assert p.wait() == 0 and "loaded" in p.err(), p.err()[-2000:]
    finally:
        p.close()


def test_fake_subprocess_eof_finishes_the_request(fake):
    p = fake(delay=0.01)
    p.send({"id": 1, "op": "generate", "prompt": "abc", "max_tokens": 30})
    p.p.stdin.close()
    _, res = p.response()
    assert res["ok"] and res["completion_tokens"] == 30
    assert p.wait() == 0


def test_fake_subprocess_stdout_closed_mid_generation(fake):
    p = fake(delay=0.02)
    p.send({"id": 1, "op": "generate", "prompt": "abc", "max_tokens": 5000, "stream": True})
    assert p.read()["event"] == "token"
    t = time.monotonic()
    p.p.stdout.close()
    assert p.wait(20) == 0
    assert time.monotonic() - t < 10  # 5000 tokens would take 100 s
    assert "Traceback" not in p.err()


def test_fake_subprocess_stdout_closed_without_stream(fake):
    """Not streaming: the hang-up is noticed by polling stdout between tokens."""
    p = fake(delay=0.02)
    p.send({"id": 1, "op": "generate", "prompt": "abc", "max_tokens": 5000})
    time.sleep(0.3)
    t = time.monotonic()
    p.p.stdout.close()
    assert p.wait(20) == 0 and time.monotonic() - t < 10


def test_fake_subprocess_stray_stdout_writes_go_to_stderr():
    code = ("import sys\n"
            "from reflex_ipc.testing.fake_server import FakeRunner, fake_resolve\n"
            "from reflex_ipc import server\n"
            "class Noisy(FakeRunner):\n"
            "    def tokenize(self, text, **kw):\n"
            "        print('stray print'); import os; os.write(1, b'stray fd1\\n')\n"
            "        return super().tokenize(text, **kw)\n"
            "srv = server.Server(loader=lambda p, d: Noisy(p, d), resolve=fake_resolve)\n"
            "sys.exit(server.serve_stdio(srv, False))\n")
    p = Proc([sys.executable, "-c", code])
    try:
        _, res = p.request({"id": 1, "op": "tokenize", "text": "a"})
        assert res["ok"]
        p.p.stdin.close()
        assert p.read() is None and p.wait() == 0
        assert "stray print" in p.err() and "stray fd1" in p.err()
    finally:
        p.close()


# ---------------------------------------------------------------- uds (fake runner)


@pytest.fixture
def sockdir():
    with tempfile.TemporaryDirectory(prefix="rx") as d:
        yield pathlib.Path(d)


def start_fake_uds(path, delay=0.02):
    p = subprocess.Popen(fake_argv(delay=delay, uds=str(path)), stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    end = time.monotonic() + 30
    while not (path.exists() and stat.S_ISSOCK(os.lstat(path).st_mode)):
        assert p.poll() is None, p.stderr.read()
        assert time.monotonic() < end
        time.sleep(0.01)
    return p


def test_uds_mode_connections_in_turn_and_cleanup(sockdir):
    path = sockdir / "s"
    p = start_fake_uds(path)
    try:
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
        a = UdsClient(path)
        assert a.request({"id": 1, "op": "ping"})[1]["ok"]
        b = socket.socket(socket.AF_UNIX)
        b.connect(str(path))  # queued until a closes
        assert not select.select([b], [], [], 0.3)[0]
        assert a.request({"id": 2, "op": "tokenize", "text": "hi"})[1]["token_ids"] == [104, 105]
        a.close()
        assert select.select([b], [], [], 10)[0]
        b.close()
        c = UdsClient(path)
        c.send({"id": 3, "op": "ping"}, {"id": 4, "op": "ping"})
        assert [c.response()[1]["id"], c.response()[1]["id"]] == [3, 4]
        c.close()
    finally:
        rc, out = stop(p)
    assert rc == 0 and out == b""  # nothing on stdout for uds
    assert not path.exists()


def test_uds_client_vanishing_mid_generation_cancels(sockdir):
    path = sockdir / "s"
    p = start_fake_uds(path, delay=0.02)
    try:
        a = UdsClient(path)
        a.send({"id": 1, "op": "generate", "prompt": "ab", "max_tokens": 5000})
        time.sleep(0.2)
        a.close()
        t = time.monotonic()
        b = UdsClient(path, timeout=30)  # ready comes only once a's request is over
        assert time.monotonic() - t < 5
        assert b.request({"id": 2, "op": "ping"})[1]["ok"]
        b.close()
    finally:
        assert stop(p)[0] == 0


def test_uds_half_closed_client_still_gets_results(sockdir):
    path = sockdir / "s"
    p = start_fake_uds(path, delay=0.01)
    try:
        a = UdsClient(path)
        a.send({"id": 1, "op": "generate", "prompt": "ab", "max_tokens": 20})
        a.s.shutdown(socket.SHUT_WR)
        _, res = a.response()
        assert res["ok"] and res["completion_tokens"] == 20
        assert a.read() is None
        a.close()
    finally:
        assert stop(p)[0] == 0


def test_uds_shutdown_op_removes_socket(sockdir):
    path = sockdir / "s"
    p = start_fake_uds(path)
    a = UdsClient(path)
    assert a.request({"id": 1, "op": "shutdown"})[1]["ok"]
    assert a.read() is None
    assert p.wait(10) == 0 and not path.exists()
    stop(p)


def test_uds_stale_socket_replaced_live_one_refused(sockdir):
    path = sockdir / "s"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens
    p = start_fake_uds(path)
    try:
        UdsClient(path).close()
        r = subprocess.run(["reflex", "uds", str(path)], capture_output=True, text=True, timeout=30)
        assert r.returncode == 1 and "already listening" in r.stderr
        assert path.exists()
    finally:
        assert stop(p)[0] == 0


def test_uds_refuses_a_path_that_is_not_a_socket(sockdir):
    path = sockdir / "notasocket"
    path.write_text("keep me")
    r = subprocess.run(["reflex", "uds", str(path)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "not a socket" in r.stderr
    assert path.read_text() == "keep me"
    r = subprocess.run(["reflex", "uds", str(sockdir / ("x" * 120))], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 1 and "too long" in r.stderr
    d = sockdir / "adir"
    d.mkdir()
    r = subprocess.run(["reflex", "uds", str(d)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and d.is_dir()


def test_uds_mode_option(sockdir):
    path = sockdir / "s"
    code = FAKE_MAIN.format(delay=0, limit=1 << 20, uds=str(path)).replace(
        "0o600", "0o660")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        UdsClient(path).close()
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o660
    finally:
        assert stop(p)[0] == 0
    r = subprocess.run(["reflex", "uds", str(path), "--mode", "644x"], capture_output=True,
                       text=True)
    assert r.returncode == 2 and "octal" in r.stderr
    r = subprocess.run(["reflex", "uds", str(path), "--mode", "044"], capture_output=True,
                       text=True)
    assert r.returncode == 2 and not path.exists()


def test_nothing_heavy_before_the_ready_line():
    """Without --model, the ready line needs neither numpy, msgspec, gguf nor the engine."""
    code = ("import sys\n"
            "from reflex_ipc import cli, phases\n"
            "from reflex_ipc.commands import serve\n"
            "from reflex_ipc import server\n"
            "server.Server().ready_line()\n"
            "heavy = ('numpy', 'msgspec', 'orjson', 'gguf', 'reflex_ipc.engine',\n"
            "         'reflex_ipc.protocol', 'reflex_ipc.gguffile', 'socket', 'traceback')\n"
            "print(' '.join(m for m in heavy if m in sys.modules))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == ""
