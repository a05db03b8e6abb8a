"""Issue 12: the server under hostile input and faults (transports, signals, exit codes,
the model cache, files changed under a live server, model paths).

Fake-runner servers keep these fast; the file-change tests run the real engine on the
small synthetic GGUFs in tests/data.
"""

import json
import os
import pathlib
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time

import pytest

from reflex_ipc import server
from reflex_ipc.errors import ReflexError

TESTS = pathlib.Path(__file__).resolve().parent
from reflex_ipc.testing.fake_server import FakeRunner, Proc, UdsClient, fake_resolve, lines_of

DATA = TESTS / "data"
ENV = dict(os.environ, REFLEX_TOKENIZER_CACHE="0")


def _serve_bytes(data: bytes, *, limit=1 << 20, **kw):
    """The loop over `data` as stdin (a file), with the fake runner; the lines it wrote."""
    from reflex_ipc.testing.fake_server import fake_loader

    srv = server.Server(loader=fake_loader(), resolve=fake_resolve, max_line_bytes=limit, **kw)
    with tempfile.TemporaryFile() as fin, tempfile.TemporaryFile() as fout:
        fin.write(data)
        fin.seek(0)
        srv.serve_conn(server.FdConn(fin.fileno(), fout.fileno(), limit))
        fout.seek(0)
        out = fout.read()
    return srv, [json.loads(x) for x in out.split(b"\n")[:-1]]


# ---------------------------------------------------------------- framing (item 9)


def _reader(data, limit):
    chunks = [data[i:i + 7] for i in range(0, len(data), 7)]

    def read(n):
        return chunks.pop(0) if chunks else b""
    return server.LineReader(read, limit)


def test_crlf_does_not_count_toward_the_limit():
    limit = 40
    line = b"x" * limit
    r = _reader(line + b"\r\n" + line + b"x\r\n" + line + b"\r", limit)
    assert r.readline() == line
    assert r.readline() is server.TOO_LONG
    assert r.readline() == line  # last line, no "\n": its "\r" is dropped too
    assert r.readline() is None


def test_crlf_line_of_exactly_the_limit_through_the_loop():
    req = json.dumps({"id": 1, "op": "tokenize", "text": ""}).encode()
    limit = 200
    pad = req[:-1] + b" " * (limit - len(req)) + b"}"
    assert len(pad) == limit
    _, lines = _serve_bytes(pad + b"\r\n" + pad + b" \r\n", limit=limit)
    assert lines[1]["ok"] and lines[1]["id"] == 1
    assert lines[2]["error"]["kind"] == "line_too_long"


# ---------------------------------------------------------------- fake servers

FAKE = """
import sys, time
from reflex_ipc.testing.fake_server import FakeRunner, fake_resolve
from reflex_ipc import server

class Big(FakeRunner):
    def tokenize(self, text, **kw):
        if text == "huge":
            return list(range(300)) * 20000  # a result of several MiB
        return super().tokenize(text, **kw)

srv = server.Server(loader=lambda p, d: Big(p, d, delay={delay!r}), resolve=fake_resolve,
                    **{kw!r})
if {uds!r}:
    sys.exit(server.serve_uds(srv, {uds!r}, 0o600, False))
sys.exit(server.serve_stdio(srv, False))
"""


def fake_argv(delay=0.02, uds=None, **kw):
    return [sys.executable, "-c", FAKE.format(delay=delay, uds=uds, kw=kw)]


@pytest.fixture
def sockdir():
    with tempfile.TemporaryDirectory(prefix="rx") as d:
        yield pathlib.Path(d)


def start_uds(path, **kw):
    p = subprocess.Popen(fake_argv(uds=str(path), **kw), stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    end = time.monotonic() + 30
    while not (path.exists() and stat.S_ISSOCK(os.lstat(path).st_mode)):
        assert p.poll() is None, p.stderr.read()
        assert time.monotonic() < end
        time.sleep(0.01)
    return p


def finish(p, sig=signal.SIGTERM, timeout=20):
    if p.poll() is None:
        p.send_signal(sig)
    rc = p.wait(timeout)
    err = p.stderr.read().decode()
    p.stdout.close()
    p.stderr.close()
    return rc, err


# ---------------------------------------------------------------- signals and exit codes (12)


def test_sighup_has_sigterm_semantics():
    p = Proc(fake_argv(delay=0.05))
    try:
        p.send({"id": 1, "op": "generate", "prompt": "abc", "max_tokens": 20})
        time.sleep(0.3)
        p.p.send_signal(signal.SIGHUP)
        _, res = p.response(timeout=20)
        assert res["ok"] and res["completion_tokens"] == 20  # finished, not cancelled
        assert p.wait(20) == 0
        assert "Traceback" not in p.err()
    finally:
        p.close()


def test_stdio_with_stdout_closed_is_one_line_and_exit_1():
    code = ("import os, subprocess, sys\n"
            "r = subprocess.run([sys.executable, '-m', 'reflex_ipc', 'stdio'],"
            " stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,"
            " pass_fds=(), close_fds=True, preexec_fn=lambda: os.close(1), timeout=30)\n"
            "sys.stdout.write(str(r.returncode) + '\\n' + r.stderr.decode())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60).stdout
    rc, _, err = out.partition("\n")
    assert rc == "1"
    assert err.strip().count("\n") == 0 and "stdout is closed" in err
    assert "Traceback" not in err


def test_uds_busy_socket_probe_does_not_hang(sockdir):
    path = sockdir / "s"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.listen(0)  # never accepts: its backlog fills
    fill = []
    for _ in range(8):
        c = socket.socket(socket.AF_UNIX)
        c.setblocking(False)
        try:
            c.connect(str(path))
        except BlockingIOError:
            c.close()
            break
        fill.append(c)
    try:
        t = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "reflex_ipc", "uds", str(path)],
                           capture_output=True, text=True, timeout=30)
        assert time.monotonic() - t < 20
        assert r.returncode == 1
        assert "already listening" in r.stderr and r.stderr.count("\n") == 1
    finally:
        for c in fill:
            c.close()
        s.close()


def test_uds_socket_it_may_not_connect_to(sockdir):
    path = sockdir / "s"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    argv = [sys.executable, "-m", "reflex_ipc", "uds", str(path)]
    if os.geteuid() == 0:  # root passes permission checks: run as nobody
        os.chmod(sockdir, 0o755)
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] + argv
    else:
        os.chmod(path, 0)
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30,
                           env=dict(os.environ, PYTHONPATH=str(TESTS.parent)))
        assert r.returncode == 1, r.stderr
        assert "may not connect" in r.stderr and r.stderr.count("\n") == 1
        assert stat.S_ISSOCK(os.lstat(path).st_mode)  # left alone
    finally:
        s.close()


# ---------------------------------------------------------------- blocked writes (10)


def test_sigterm_while_blocked_writing_to_a_stdout_nobody_reads():
    p = subprocess.Popen(fake_argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        assert json.loads(p.stdout.readline())["event"] == "ready"
        p.stdin.write(lines_of({"id": 1, "op": "tokenize", "text": "huge"}))
        p.stdin.flush()
        time.sleep(1.0)  # the result fills the pipe; nobody reads it
        t = time.monotonic()
        p.send_signal(signal.SIGTERM)
        rc = p.wait(15)
        assert time.monotonic() - t < server.STOP_GRACE + 8  # a loaded CI machine
        assert rc == 0
        err = p.stderr.read().decode()
        assert "Traceback" not in err and "does not read" in err
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()
        for f in (p.stdin, p.stdout, p.stderr):
            f.close()


def test_uds_client_that_never_reads_is_dropped_and_the_next_served(sockdir):
    path = sockdir / "s"
    p = start_uds(path, write_timeout=1.0)
    try:
        bad = socket.socket(socket.AF_UNIX)
        bad.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        bad.connect(str(path))
        bad.sendall(lines_of({"id": 1, "op": "tokenize", "text": "huge"}))
        time.sleep(0.2)
        t = time.monotonic()
        good = UdsClient(path, timeout=30)  # ready once the bad client is dropped
        assert time.monotonic() - t < 10
        _, res = good.request({"id": 2, "op": "ping"})
        assert res["ok"]
        good.close()
        bad.close()
    finally:
        rc, err = finish(p)
    assert rc == 0 and "Traceback" not in err and "does not read" in err


def test_sigterm_while_blocked_writing_to_a_uds_client(sockdir):
    path = sockdir / "s"
    p = start_uds(path, write_timeout=None)
    try:
        bad = socket.socket(socket.AF_UNIX)
        bad.connect(str(path))
        bad.sendall(lines_of({"id": 1, "op": "tokenize", "text": "huge"}))
        time.sleep(1.0)
        t = time.monotonic()
        p.send_signal(signal.SIGTERM)
        assert p.wait(15) == 0
        assert time.monotonic() - t < server.STOP_GRACE + 8  # a loaded CI machine
        bad.close()
    finally:
        rc, err = finish(p)
    assert "Traceback" not in err
    assert not path.exists()


# ---------------------------------------------------------------- stalled clients (11)


def test_uds_half_line_then_stall_is_dropped(sockdir):
    path = sockdir / "s"
    p = start_uds(path, read_timeout=0.5)
    try:
        bad = socket.socket(socket.AF_UNIX)
        bad.connect(str(path))
        bad.sendall(b'{"id": 1, "op": "pi')
        t = time.monotonic()
        good = UdsClient(path, timeout=30)
        waited = time.monotonic() - t
        assert 0.3 < waited < 5
        assert good.request({"id": 2, "op": "ping"})[1]["ok"]
        assert bad.recv(65536).startswith(b'{"event":"ready"')
        assert bad.recv(65536) == b""  # closed, nothing else written
        good.close()
        bad.close()
    finally:
        rc, err = finish(p)
    assert rc == 0 and "half a request line" in err


def test_uds_idle_client_yields_only_when_another_waits(sockdir):
    path = sockdir / "s"
    p = start_uds(path, idle_timeout=0.5)
    try:
        a = UdsClient(path)
        time.sleep(1.0)  # idle, but nobody waits: kept
        assert a.request({"id": 1, "op": "ping"})[1]["ok"]
        b = UdsClient(path, timeout=30)  # a yields after 0.5 s of idling
        assert b.request({"id": 2, "op": "ping"})[1]["ok"]
        assert a.read(timeout=5) is None
        a.close()
        b.close()
    finally:
        rc, err = finish(p)
    assert rc == 0 and "another client waits" in err


# ---------------------------------------------------------------- model cache (7)


def _srv(**kw):
    loads = []

    def load(path, device):
        loads.append(path)
        return FakeRunner(path, device)
    return server.Server(loader=load, identify=server.file_identity, leases=False, **kw), loads


def test_cache_keyed_by_file_identity_not_the_string(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"x" * 100)
    os.symlink(f, tmp_path / "alias.gguf")
    os.link(f, tmp_path / "hard.gguf")
    srv, loads = _srv()
    names = [str(f), str(tmp_path / "alias.gguf"), str(tmp_path / "hard.gguf"),
             str(tmp_path / "." / "m.gguf"), str(tmp_path / "sub" / ".." / "m.gguf")]
    (tmp_path / "sub").mkdir()
    for n in names * 3:
        srv.models.runner_for(n, "cpu", {})
    assert len(loads) == 1
    assert len(srv.models.listing()) == 1


def test_cache_bounded_by_count_and_bytes(tmp_path):
    srv, loads = _srv(max_models=2, max_model_bytes=250)
    paths = []
    for i in range(4):
        p = tmp_path / f"m{i}.gguf"
        p.write_bytes(b"x" * 100)
        paths.append(str(p))
    for p in paths:
        srv.models.runner_for(p, "cpu", {})
    assert [m["path"] for m in srv.models.listing()] == paths[2:]
    big = tmp_path / "big.gguf"
    big.write_bytes(b"x" * 200)
    srv.models.runner_for(str(big), "cpu", {})  # 100 + 200 > 250: only the newest stays
    assert [m["path"] for m in srv.models.listing()] == [str(big)]
    srv.models.runner_for(paths[3], "cpu", {})
    assert len(loads) == 6


def test_many_long_model_names_do_not_grow_the_server(tmp_path):
    srv, loads = _srv()
    f = tmp_path / "m.gguf"
    f.write_bytes(b"x")
    for i in range(200):
        name = str(tmp_path) + "/" + "./" * (1000 + i) + "m.gguf"
        srv.models.runner_for(name, "cpu", {})
    assert len(loads) == 1
    assert sum(len(k or "") for k in srv.models.paths) < 64 * 4096


def test_file_changed_in_place_is_loaded_again(tmp_path):
    srv, loads = _srv()
    f = tmp_path / "m.gguf"
    f.write_bytes(b"x" * 100)
    _, r1 = srv.models.runner_for(str(f), "cpu", {})
    st = f.stat()
    f.write_bytes(b"y" * 100)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    _, r2 = srv.models.runner_for(None, None, {})  # the active model: looked at again
    assert r2 is not r1 and len(loads) == 2
    assert len(srv.models.listing()) == 1  # the stale one went


# ---------------------------------------------------------------- model paths (5)


def test_paths_that_are_not_regular_files_are_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo.gguf"
    os.mkfifo(fifo)
    argv = [sys.executable, "-m", "reflex_ipc", "stdio"]
    p = Proc(argv, env=dict(ENV, PYTHONPATH=str(TESTS.parent)))
    try:
        sysfs = "/sys/kernel/mm/transparent_hugepage/enabled"
        for i, m in enumerate([str(fifo), "/dev/zero", str(tmp_path), sysfs, "/proc/self/maps",
                               "/dev/stdin"]):
            _, res = p.request({"id": i, "op": "load", "model": m}, timeout=20)
            assert not res["ok"]
            assert res["error"]["kind"] in ("model_not_found", "gguf_error"), res
        assert "Traceback" not in p.err()
    finally:
        p.close()


def test_gguffile_refuses_a_fifo_without_blocking(tmp_path):
    from reflex_ipc.gguffile import GGUFError, GGUFFile

    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    with pytest.raises(GGUFError, match="not a regular file"):
        GGUFFile(str(fifo))


def test_model_dir_restricts_request_paths(tmp_path):
    allowed = tmp_path / "models"
    allowed.mkdir()
    shutil.copy(DATA / "synthetic-llama.gguf", allowed / "a.gguf")
    outside = tmp_path / "b.gguf"
    shutil.copy(DATA / "synthetic-llama.gguf", outside)
    os.symlink(outside, allowed / "escape.gguf")
    argv = [sys.executable, "-m", "reflex_ipc", "stdio", "--device", "cpu",
            "--model-dir", str(allowed)]
    p = Proc(argv, env=dict(ENV, PYTHONPATH=str(TESTS.parent)))
    try:
        _, ok = p.request({"id": 1, "op": "load", "model": str(allowed / "a.gguf")})
        assert ok["ok"], ok
        for i, m in enumerate([str(outside), str(allowed / "escape.gguf"),
                               str(allowed / ".." / "b.gguf"), "/etc/passwd"]):
            _, res = p.request({"id": 10 + i, "op": "tokenize", "model": m, "text": "hi"})
            assert res["error"]["kind"] == "model_not_found", res
            assert "outside" in res["error"]["message"]
    finally:
        p.close()


# ---------------------------------------------------------------- files changed under a live server (6)


def _tok(p, i, text="Hello world, this is a test."):
    _, res = p.request({"id": i, "op": "tokenize", "text": text}, timeout=60)
    return res


def _live(model, *extra):
    argv = [sys.executable, "-m", "reflex_ipc", "stdio", "--device", "cpu", "--model",
            str(model), *extra]
    return Proc(argv, env=dict(ENV, PYTHONPATH=str(TESTS.parent)))


def _expected(src, text="Hello world, this is a test."):
    from reflex_ipc.gguffile import GGUFFile
    from reflex_ipc.tokenizer import load_tokenizer

    with GGUFFile(str(src)) as f:
        return load_tokenizer(f).encode(text, add_bos=False)


@pytest.mark.parametrize("how", ["truncate", "rewrite", "rename"])
def test_model_file_changed_under_a_live_server(tmp_path, how):
    model = tmp_path / "m.gguf"
    shutil.copy(DATA / "synthetic-llama.gguf", model)
    other = DATA / "synthetic-gemma3.gguf"  # another vocabulary (SPM)
    want_old, want_new = _expected(model), _expected(other)
    assert want_old != want_new
    p = _live(model)
    try:
        assert _tok(p, 1)["token_ids"] == want_old
        if how == "truncate":  # what `cp` does first; then the server must not read the map
            with open(model, "r+b") as f:
                f.truncate(1000)
            res = _tok(p, 2)
            assert not res["ok"] and res["error"]["kind"] == "gguf_error", res
            shutil.copyfile(other, model)
        elif how == "rewrite":  # in place, same size and mtime as before
            st = model.stat()
            data = other.read_bytes()
            with open(model, "r+b") as f:
                f.truncate(0)
                f.write(data)
            os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))
        else:
            tmp = tmp_path / "new.gguf"
            shutil.copy(other, tmp)
            os.replace(tmp, model)
        res = _tok(p, 3)
        assert res["ok"] and res["token_ids"] == want_new, res
        _, gen = p.request({"id": 4, "op": "generate", "prompt": "Hi", "max_tokens": 2})
        assert gen["ok"], gen
        assert p.p.poll() is None
        assert "Traceback" not in p.err()
    finally:
        p.close()


def _leases_work(path) -> bool:
    import fcntl

    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def test_model_truncated_during_a_request_cancels_it_without_sigbus(tmp_path):
    model = tmp_path / "m.gguf"
    shutil.copy(DATA / "synthetic-llama.gguf", model)
    if not _leases_work(model):
        # no leases on this file system: the documented fallback is the look before each
        # request, and replacing by rename (the other tests here) -- check the fallback
        srv = server.Server(leases=False)
        srv.models.runner_for(str(model), "cpu", {})
        with open(model, "r+b") as f:
            f.truncate(100)
        with pytest.raises(Exception) as e:
            srv.models.runner_for(None, None, {})
        assert getattr(e.value, "kind", None) == "gguf_error"
        assert not srv.models.entries  # the old model (and its mapping) went first
        return
    p = _live(model)
    try:
        p.send({"id": 1, "op": "generate", "prompt": "Once upon a time", "max_tokens": 4000})
        time.sleep(1.0)
        with open(model, "r+b") as f:  # waits (lease) until the server let go of the map
            f.truncate(100)
        _, res = p.response(timeout=120)
        assert p.p.poll() is None, "the server died"
        assert res["ok"] or res["error"]["kind"] == "cancelled", res
        res = _tok(p, 2)
        assert res["error"]["kind"] == "gguf_error"
        assert "Traceback" not in p.err()
    finally:
        p.close()


# ---------------------------------------------------------------- non-finite results (13, the server's guard)


def test_non_finite_results_are_an_error_not_null():
    class NaNRunner(FakeRunner):
        def embed(self, texts, **kw):
            return {"embeddings": [[0.5, float("nan")]], "dim": 2, "timings": {}}

    srv = server.Server(loader=lambda p, d: NaNRunner(p, d), resolve=fake_resolve,
                        max_line_bytes=1 << 20)
    with tempfile.TemporaryFile() as fin, tempfile.TemporaryFile() as fout:
        fin.write(lines_of({"id": 1, "op": "embed", "input": "x"}, {"id": 2, "op": "ping"}))
        fin.seek(0)
        srv.serve_conn(server.FdConn(fin.fileno(), fout.fileno(), 1 << 20))
        fout.seek(0)
        lines = [json.loads(x) for x in fout.read().splitlines()]
    assert lines[1]["error"]["kind"] == "gguf_error" and "non-finite" in lines[1]["error"]["message"]
    assert lines[2]["ok"]
    assert server._finite({"a": [1.0, 2.0], "b": [{"p": 1e308}], "c": None})
    assert not server._finite({"b": {"c": [[0.5, float("inf")]]}})


def test_model_name_that_is_not_a_string():
    from reflex_ipc.engine import _name_of

    assert _name_of([1, 2], "/x/m.gguf") == "m.gguf"
    assert _name_of(float("nan"), "/x/m.gguf") == "m.gguf"
    assert _name_of("", "/x/m.gguf") == "m.gguf"
    assert _name_of("Tiny", "/x/m.gguf") == "Tiny"


# ---------------------------------------------------------------- framing, property-based


def test_line_reader_matches_a_reference_under_any_chunking():
    from hypothesis import given, settings, strategies as st

    limit = 16
    piece = st.binary(max_size=24).map(lambda b: b.replace(b"\n", b""))

    @settings(max_examples=200, deadline=None)
    @given(st.lists(st.tuples(piece, st.sampled_from([b"\n", b"\r\n"])), max_size=8),
           st.one_of(st.none(), piece), st.lists(st.integers(1, 40), min_size=1, max_size=20))
    def check(lines, last, cuts):
        data = b"".join(a + b for a, b in lines) + (last or b"")
        want = []
        for a, eol in lines:
            raw = a + eol[:-1]
            body = raw[:-1] if raw.endswith(b"\r") else raw
            want.append(server.TOO_LONG if len(body) > limit else body)
        if last:
            body = last[:-1] if last.endswith(b"\r") else last
            want.append(server.TOO_LONG if len(body) > limit else body)
        chunks, i, k = [], 0, 0
        while i < len(data):
            n = cuts[k % len(cuts)]
            chunks.append(data[i:i + n])
            i += n
            k += 1

        def read(n):
            return chunks.pop(0) if chunks else b""
        r = server.LineReader(read, limit)
        got = []
        while (x := r.readline()) is not None:
            got.append(x)
        assert got == want

    from reflex_ipc import transport

    old = transport.CHUNK
    transport.CHUNK = 4  # small reads: the over-limit skipping path runs too
    try:
        check()
    finally:
        transport.CHUNK = old
