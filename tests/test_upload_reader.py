"""The read upload's host side (reflex_ipc/cuda/fileread.py) and WeightArena's choice of
way, on the CPU: a fake device (a bytearray written when a stream's copies are waited
for, so a buffer reused too early shows as wrong bytes) stands in for CUDA."""

import mmap
import os
import threading

import numpy as np
import pytest

from reflex_ipc.cuda import fileread
from reflex_ipc.cuda.fileread import TruncatedError, parallel_read, plan, read_chunk
from reflex_ipc.testing.upload_fakes import FakeLane, FakeRt, fake_arena, random_file, tensor_model


def _run(path, start, nbytes, chunk, threads, direct=False, pread=fileread._pread, **lane_kw):
    dev = bytearray(nbytes)
    log, lanes = [], []

    def make_lane(i):
        lane = FakeLane(dev, chunk, log, aligned=direct, **lane_kw)
        lanes.append(lane)
        return lane

    fd = os.open(path, os.O_RDONLY)
    fdd = os.open(path, os.O_RDONLY | os.O_DIRECT) if direct else None
    try:
        stats = parallel_read(fd, plan(start, nbytes, chunk, direct=direct), make_lane, threads,
                              pread=pread, fd_direct=fdd)
    finally:
        os.close(fd)
        if fdd is not None:
            os.close(fdd)
    return dev, log, lanes, stats


def test_plan_covers_the_range_once():
    for start, nbytes, chunk in [(0, 1, 4096), (17, 4096, 4096), (4096 * 3 + 5, 5 * 8192 + 123, 8192),
                                 (100, 8192 * 4 - 100, 8192), (4095, 2, 4096)]:
        for direct in (False, True):
            covered = bytearray(nbytes)
            for file_off, read_len, skip, dst, n in plan(start, nbytes, chunk, direct=direct):
                assert file_off % 4096 == 0 and 0 < read_len <= chunk and n > 0
                assert file_off + skip == start + dst  # the copied bytes are the file's
                assert skip + n <= read_len
                if direct:
                    assert read_len % 4096 == 0
                for i in range(dst, dst + n):
                    covered[i] += 1
            assert set(covered) == {1}, (start, nbytes, chunk, direct)
    with pytest.raises(ValueError):
        plan(0, 10, 1000)


@pytest.mark.parametrize("threads", [1, 3, 8])
def test_assembles_the_file(tmp_path, threads):
    path = tmp_path / "w.bin"
    data = random_file(path, 4096 * 37 + 1234, seed=threads)
    chunk = 8192
    for start, nbytes in [(0, len(data)), (32, len(data) - 32), (4096 * 5 + 1, 1), (12345, 8192 * 3),
                          (999, len(data) - 999 - 7), (7, chunk - 1), (7, chunk + 1)]:
        dev, log, lanes, stats = _run(path, start, nbytes, chunk, threads)
        assert dev == data[start:start + nbytes], (start, nbytes)
        assert len(lanes) == threads and all(lane.closed for lane in lanes)
        assert sum(s["bytes"] for s in stats) == nbytes
        # every thread took its chunks in file order
        for tid in {t for t, _ in log}:
            offs = [o for t, o in log if t == tid]
            assert offs == sorted(offs)


def test_short_reads_and_eintr(tmp_path):
    path = tmp_path / "w.bin"
    data = random_file(path, 4096 * 20 + 77, seed=5)
    calls = [0]

    def flaky(fd, view, off):
        calls[0] += 1
        if calls[0] % 3 == 0:
            raise InterruptedError
        return os.preadv(fd, [view[:1000]], off)  # at most 1000 bytes per call

    dev, *_ = _run(path, 50, len(data) - 50, 16384, 4, pread=flaky)
    assert dev == data[50:]


def test_read_chunk_needs_its_bytes(tmp_path):
    path = tmp_path / "w.bin"
    random_file(path, 5000)
    fd = os.open(path, os.O_RDONLY)
    try:
        buf = bytearray(8192)
        assert read_chunk(fd, buf, 4096, 8192, 904) == 904  # the end of the file: enough
        with pytest.raises(TruncatedError, match="ends at byte 5000"):
            read_chunk(fd, buf, 4096, 8192, 905)
    finally:
        os.close(fd)


def _no_hang(fn):
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "the reader hung"
    return out


def test_file_shrinking_is_an_error_not_a_hang(tmp_path):
    path = tmp_path / "w.bin"
    data = random_file(path, 4096 * 64, seed=2)
    os.truncate(path, 4096 * 40 + 3)  # after the header said there were 64 pages
    for threads in (1, 4, 8):
        out = _no_hang(lambda: _run(path, 0, len(data), 8192, threads))
        assert isinstance(out.get("error"), TruncatedError), out


def test_lane_errors_stop_every_thread(tmp_path):
    path = tmp_path / "w.bin"
    data = random_file(path, 4096 * 64, seed=3)
    out = _no_hang(lambda: _run(path, 0, len(data), 4096, 4, fail_copy_at=3))
    assert isinstance(out.get("error"), RuntimeError), out

    lanes = []

    def make_lane(i):
        if i == 2:
            raise MemoryError("no pinned memory")
        lane = FakeLane(bytearray(len(data)), 4096, [])
        lanes.append(lane)
        return lane

    fd = os.open(path, os.O_RDONLY)
    try:
        out = _no_hang(lambda: parallel_read(fd, plan(0, len(data), 4096), make_lane, 4))
    finally:
        os.close(fd)
    assert isinstance(out.get("error"), MemoryError)
    assert len(lanes) == 3 and all(lane.closed for lane in lanes)


def test_o_direct(tmp_path):
    """O_DIRECT reads (aligned buffers, offsets and lengths; the last read past the end of
    the file stops short), and an EINVAL from the direct descriptor retries buffered."""
    path = tmp_path / "w.bin"
    data = random_file(path, 4096 * 30 + 555, seed=4)
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
    except OSError as e:
        pytest.fail(f"O_DIRECT refused on {tmp_path}: {e}")  # ext4/xfs take it
    for start, nbytes in [(0, len(data)), (33, len(data) - 33), (5000, 9000)]:
        dev, *_ = _run(path, start, nbytes, 16384, 3, direct=True)
        assert dev == data[start:start + nbytes]

    def refuse_direct(fd, view, off):
        if fd == direct_fd[0]:
            raise OSError(22, "Invalid argument")
        return os.preadv(fd, [view], off)

    direct_fd = [None]
    fd = os.open(path, os.O_RDONLY)
    direct_fd[0] = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        dev = bytearray(len(data) - 10)
        parallel_read(fd, plan(10, len(data) - 10, 8192, direct=True),
                      lambda i: FakeLane(dev, 8192, []), 2, pread=refuse_direct, fd_direct=direct_fd[0])
        assert dev == data[10:]
    finally:
        os.close(fd)
        os.close(direct_fd[0])


# ---------------------------------------------------------------------------------------
# residency
def _mapped(path):
    fd = os.open(path, os.O_RDONLY)
    mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    os.close(fd)
    view = np.frombuffer(mm, np.uint8)
    return mm, view


def test_residency_resident_then_evicted(tmp_path):
    path = str(tmp_path / "w.bin")
    n = 8 << 20
    random_file(path, n, seed=6)
    with open(path, "rb") as fh:
        fh.read()
    mm, view = _mapped(path)
    addr = view.ctypes.data
    r = fileread.residency(path, 4096, n - 4096, addr + 4096)
    assert r["probe"] == "mincore" and r["resident"] == 1.0, r
    assert fileread.residency(path, 4096, n - 4096)["resident"] == 1.0  # the preadv2(RWF_NOWAIT) probe

    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # written and fsync'd: evicted
    os.close(fd)
    r = fileread.residency(path, 4096, n - 4096, addr + 4096)
    assert r["probe"] == "mincore" and r["resident"] < 0.1, r
    r = fileread.residency(path, 4096, n - 4096)  # (this one starts a readahead where it misses)
    assert r["probe"] == "nowait" and r["resident"] < 0.5, r
    del view
    mm.close()


def test_residency_cost_on_a_20gb_mapping(tmp_path):
    path = str(tmp_path / "sparse.bin")
    with open(path, "wb") as fh:
        fh.truncate(20 << 30)  # a hole: no page of it is cached
    mm, view = _mapped(path)
    best = min(fileread.residency(path, 0, 20 << 30, view.ctypes.data)["probe_ms"] for _ in range(5))
    r = fileread.residency(path, 0, 20 << 30, view.ctypes.data)
    assert r["resident"] == 0.0 and r["probe"] == "mincore"
    assert best < 5.0, best  # ~0.5 ms on a loaded 2-core box; well under 1 ms on the GPU hosts
    del view
    mm.close()


def test_residency_failure_reads_as_resident(tmp_path):
    r = fileread.residency(str(tmp_path / "missing"), 0, 100, 0)
    assert r["resident"] == 1.0 and r["probe"].startswith("failed")
    st = os.stat(tmp_path)
    assert fileread.mincore_trusted(st)  # ours
    if os.geteuid() != 0:
        assert not fileread.mincore_trusted(os.stat_result((0o100644, 0, 0, 1, os.geteuid() + 1, 0, 0, 0, 0, 0)))


# ---------------------------------------------------------------------------------------
# WeightArena's choice and its read way, on a fake driver

@pytest.mark.parametrize("mode,threads", [("read", "1"), ("read", "3"), ("staging", "1")])
def test_arena_uploads_the_section(tmp_path, monkeypatch, mode, threads):
    """~3.8 MB of tensor data in 1 MiB chunks: one lane reuses each of its buffers."""
    path = tensor_model(tmp_path / "m.gguf")
    f, rt, a = fake_arena(path, mode, monkeypatch, REFLEX_CUDA_UPLOAD_CHUNK_MB="1", REFLEX_CUDA_UPLOAD_THREADS=threads)
    a.wait()
    want = f.bytes_view(a.start, a.nbytes).tobytes()
    assert bytes(rt.drv.dev[:len(want)]) == want
    assert a.stats["mode"] == mode and a.stats["bytes"] == len(want) and a.stats["requested"] == mode
    assert a.stats["upload_ms"] > 0 and "GB_per_s" in a.stats
    if mode == "read":
        assert a.stats["threads"] == int(threads) and a.stats["chunk_mb"] == 1 and a.stats["lane_setup_ms_max"] >= 0
    assert all(h.freed for h in rt.drv.pinned)
    assert not any(rt.ctx.depth.values())  # every push popped
    f.close()


def test_arena_auto_picks_by_residency(tmp_path, monkeypatch):
    path = tensor_model(tmp_path / "m.gguf", seed=1)
    with open(path, "rb") as fh:
        fh.read()
    f, rt, a = fake_arena(path, None, monkeypatch, REFLEX_CUDA_UPLOAD="auto")
    a.wait()  # resident: register, which has no libcuda here and falls back to staging
    assert a.stats["requested"] == "auto" and a.stats["resident"] == 1.0 and a.stats["probe"] == "mincore"
    assert "register_error" in a.stats and a.stats["mode"] == "staging"
    f.close()

    f, rt, a = fake_arena(path, None, monkeypatch, evicted=True, REFLEX_CUDA_UPLOAD="auto")
    a.wait()
    assert a.stats["resident"] < 0.9 and a.stats["mode"] == "read", a.stats
    want = f.bytes_view(a.start, a.nbytes).tobytes()
    assert bytes(rt.drv.dev[:len(want)]) == want
    f.close()


def test_arena_read_of_a_shrunk_file_is_a_gguf_error(tmp_path, monkeypatch):
    from reflex_ipc.errors import ReflexError
    from reflex_ipc.gguffile import GGUFFile

    path = tensor_model(tmp_path / "m.gguf", seed=2)
    f = GGUFFile(path)
    end = f.size
    f.close()
    from reflex_ipc.cuda.weights import WeightArena

    f = GGUFFile(path)
    os.truncate(path, end - 100)  # after it was parsed (the mapping is not touched: read mode)
    a = WeightArena(FakeRt(), f, mode="read")
    with pytest.raises(ReflexError) as e:
        a.wait()
    assert e.value.kind == "gguf_error" and "tensor data" in e.value.message
    f.close()


def test_arena_read_of_a_replaced_file_falls_back(tmp_path, monkeypatch):
    from reflex_ipc.cuda.weights import WeightArena
    from reflex_ipc.gguffile import GGUFFile

    path = tensor_model(tmp_path / "m.gguf", seed=3)
    f = GGUFFile(path)
    os.rename(path, str(tmp_path / "old.gguf"))
    tensor_model(tmp_path / "m.gguf", seed=4)  # another file at the path
    rt = FakeRt()
    a = WeightArena(rt, f, mode="read")
    a.wait()
    assert "another file" in a.stats["read_error"] and a.stats["mode"] == "staging"
    want = f.bytes_view(a.start, a.nbytes).tobytes()
    assert bytes(rt.drv.dev[:len(want)]) == want  # the parsed file's bytes
    f.close()


def test_mincore_probe_makes_few_calls(monkeypatch):
    """The probe runs beside a busy main thread: every foreign call waits for the GIL, so a
    probe of one call per page cost 18 ms on the H200 host. It makes at most WINDOWS calls."""
    import ctypes

    from reflex_ipc.cuda import fileread

    calls = []

    def fake(addr, length, vec):
        calls.append((addr, length))
        for i in range(len(vec)):
            vec[i] = 1 if i % 2 == 0 else 0  # every other page cached
        return 0

    monkeypatch.setattr(fileread, "_mincore", (fake, ctypes))
    page = os.sysconf("SC_PAGE_SIZE")
    frac = fileread.mincore_fraction(1 << 30, 20 << 30, samples=256)
    assert len(calls) <= fileread.WINDOWS
    assert sum(n for _, n in calls) == 256 * page
    assert frac == pytest.approx(0.5)
