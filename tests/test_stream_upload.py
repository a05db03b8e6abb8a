"""The streaming read upload (a cold file: reads in the forward pass's order, what a kernel
needs first) without a GPU: fileread.JobQueue / run_jobs on a fake device, weights.stream_plan
on MoE GGUFs, core.guarded_launch, and CudaOps' side (a kernel launched only after the tensors
its pointers fall in are ensured; a MoE layer asking for exactly its routed experts' rows and
then launching its expert kernels unguarded) on reflex_ipc.testing.moe_runtime's interpreting runtime."""

import struct
import threading
import time

import numpy as np
import pytest

from reflex_ipc.cuda import fileread
from reflex_ipc.cuda.fileread import JobQueue, TruncatedError, run_jobs

from reflex_ipc.testing.upload_fakes import FakeLane, FakeRt, fake_arena, random_file, tensor_model


def _jobs(n, sizes):
    out, off = [], 0
    for s in sizes:
        out.append((off, s, off))
        off += s
    assert off <= n
    return out


def test_jobs_upload_every_byte(tmp_path):
    path = str(tmp_path / "w.bin")
    n = 8 << 20
    data = random_file(path, n, seed=1)
    rng = np.random.default_rng(0)
    sizes = [int(v) for v in rng.integers(1, 150_000, 40)]
    sizes.append(n - sum(sizes))
    q = JobQueue(_jobs(n, sizes))
    dev = bytearray(n)
    log = []
    import os

    fd = os.open(path, os.O_RDONLY)
    try:
        st = run_jobs(fd, q, lambda i: FakeLane(dev, max(sizes), log), 4)
    finally:
        os.close(fd)
    assert bytes(dev) == data and q.complete() and q.bytes_done == n
    assert sum(s["jobs"] for s in st) == len(sizes)


def test_wanted_jobs_jump_the_queue_and_wait_returns(tmp_path):
    """One thread, a slow disk: the job holding a wanted range is read right after the one in
    progress, and wait() returns once it is on the device, long before the rest."""
    import os

    path = str(tmp_path / "w.bin")
    n = 64 * 1000
    data = random_file(path, n, seed=2)
    q = JobQueue(_jobs(n, [1000] * 64))
    dev = bytearray(n)
    order = []

    def slow(fd, view, off):
        time.sleep(0.01)
        order.append(off)
        return fileread._pread(fd, view, off)

    fd = os.open(path, os.O_RDONLY)
    t = threading.Thread(target=run_jobs, args=(fd, q, lambda i: FakeLane(dev, 1000, []), 1, slow))
    t.start()
    time.sleep(0.03)
    ids = q.want([(60_500, 60_600), (62_999, 63_001)])  # jobs 60, 62 and 63
    assert ids == [60, 62, 63]
    q.wait(ids)
    assert dev[60_000:61_000] == data[60_000:61_000] and dev[62_000:64_000] == data[62_000:64_000]
    assert q.n_done < 20  # the rest is still to come
    assert set(order[-3:]) == {60_000, 62_000, 63_000} or order.index(60_000) < 10
    t.join()
    os.close(fd)
    assert bytes(dev) == data


def test_hold_lets_later_jobs_wait_but_not_wanted_ones(tmp_path):
    """hold(limit): the planned jobs before limit run, those after wait (the workers block,
    they do not end) until release(); a job someone wants still runs while held; stop()
    ends held workers too."""
    import os

    path = str(tmp_path / "w.bin")
    n = 40 * 1000
    data = random_file(path, n, seed=4)
    q = JobQueue(_jobs(n, [1000] * 40))
    q.hold(10)
    dev = bytearray(n)
    fd = os.open(path, os.O_RDONLY)
    t = threading.Thread(target=run_jobs, args=(fd, q, lambda i: FakeLane(dev, 1000, []), 3))
    t.start()
    q.wait(list(range(10)))
    time.sleep(0.1)
    assert q.n_done == 10 and t.is_alive()  # held, not finished
    ids = q.want([(30_000, 31_000)])
    q.wait(ids)
    time.sleep(0.05)
    assert ids == [30] and q.n_done == 11 and dev[30_000:31_000] == data[30_000:31_000]
    q.release()
    t.join(10)
    assert not t.is_alive() and q.complete() and bytes(dev) == data
    q2 = JobQueue(_jobs(n, [1000] * 40))
    q2.hold(0)
    t2 = threading.Thread(target=run_jobs, args=(fd, q2, lambda i: FakeLane(bytearray(n), 1000, []), 2))
    t2.start()
    time.sleep(0.05)
    q2.stop()
    t2.join(10)
    os.close(fd)
    assert not t2.is_alive() and q2.n_done == 0


def test_covering_finds_the_jobs_of_a_range():
    q = JobQueue([(0, 10, 100), (10, 5, 0), (15, 30, 20), (45, 1, 60)])  # dst: [100,110) [0,5) [20,50) [60,61)
    assert sorted(q.covering(0, 200)) == [0, 1, 2, 3]
    assert q.covering(5, 20) == []  # the gap
    assert sorted(q.covering(4, 21)) == [1, 2]
    assert q.covering(49, 50) == [2] and q.covering(60, 61) == [3] and q.covering(109, 110) == [0]


def test_a_failed_read_wakes_the_waiters(tmp_path):
    import os

    path = str(tmp_path / "w.bin")
    random_file(path, 5000, seed=3)
    q = JobQueue([(0, 4000, 0), (4000, 4000, 4000)])  # the second runs past the end of the file
    fd = os.open(path, os.O_RDONLY)
    errors = []

    def waiter():
        try:
            q.wait(q.want([(4000, 8000)]))
        except TruncatedError as e:
            errors.append(e)

    w = threading.Thread(target=waiter)
    w.start()
    with pytest.raises(TruncatedError):
        run_jobs(fd, q, lambda i: FakeLane(bytearray(8000), 4000, []), 2)
    w.join(5)
    os.close(fd)
    assert errors and not w.is_alive()


def test_stream_plan_orders_layers_and_cuts_experts(tmp_path):
    from reflex_ipc.cuda.weights import stream_plan
    from reflex_ipc.gguffile import GGUFFile
    from reflex_ipc.testing.synthetic import example_gguf

    import os

    tok = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "synthetic-llama.gguf")
    path = example_gguf("qwen3moe", str(tmp_path / "m.gguf"), tokenizer=tok, keys={"block_count": 3},
                        qtype="Q8_0")
    with GGUFFile(path) as f:
        start = f.data_offset
        jobs, n_eager = stream_plan(f, start, 4096)
        covered = np.zeros(max(t.offset + t.nbytes for t in f.tensors.values()) - start, np.int32)
        for off, n, dst in jobs:
            assert dst == off - start and 0 < n <= 4096
            covered[dst:dst + n] += 1
        for t in f.tensors.values():  # every tensor byte once
            assert (covered[t.offset - start:t.offset - start + t.nbytes] == 1).all(), t.name
        exps = [t for t in f.tensors.values() if "_exps." in t.name]
        n_exp_jobs = sum(t.shape[2] for t in exps)  # one job per expert (each under 4096 bytes here)
        assert len(jobs) - n_eager == n_exp_jobs
        assert all(t.nbytes // t.shape[2] <= 4096 for t in exps)

        def layer_of(off):
            t = next(t for t in f.tensors.values() if t.offset <= off < t.offset + t.nbytes)
            return int(t.name.split(".")[1]) if t.name.startswith("blk.") else None, t.name

        eager_layers = [layer_of(off)[0] for off, _, _ in jobs[:n_eager]]
        blk = [x for x in eager_layers if x is not None]
        assert blk == sorted(blk) and blk[0] == 0
        assert not any("_exps." in layer_of(off)[1] for off, _, _ in jobs[:n_eager])
        exp_layers = [layer_of(off)[0] for off, _, _ in jobs[n_eager:]]
        assert exp_layers == sorted(exp_layers)


def test_guarded_launch_hands_the_pointer_arguments():
    from reflex_ipc.cuda.core import KERNELS, guarded_launch

    fmt = KERNELS["mma_q4_k"][0]  # W, X, Y, K, M, N, rb, acc, P
    seen, launched = [], []
    launch = guarded_launch("mma_q4_k", lambda *a: launched.append(a), seen.append)
    args = struct.pack(fmt, 11, 22, 33, 4, 5, 6, 7, 0, 44)
    launch((1, 1, 1), (256, 1, 1), args, 0, None)
    assert seen == [[11, 22, 33, 44]] and len(launched) == 1


# -- CudaOps on a streaming arena ----------------------------------------------------------
class StreamingArena:
    """What CudaOps asks of a streaming WeightArena, recorded."""

    def __init__(self, base, nbytes, tensors):
        self.base, self.nbytes, self.queue = base, nbytes, object()
        self.tensors = tensors  # [(ptr, nbytes)]
        self.ensured, self.ensured_ptrs = [], []
        self.live = True

    def streaming(self):
        return self.live

    def ensure(self, ranges):
        self.ensured.append(sorted(ranges))

    def ensure_ptr(self, p):
        self.ensured_ptrs.append(next(t for t in self.tensors if t[0] <= p < t[0] + t[1]))

    def wait(self):
        self.live = False


def test_moe_on_a_streaming_arena_asks_for_its_routed_experts(monkeypatch):
    """ops.moe on a streaming arena: the router matmul's launch ensures the router tensor; the
    routed experts' rows of gate, up and down (and nothing else of them) are ensured before
    the expert kernels, which launch unguarded; the result equals numpy. Grouped (prefill) and
    per-pair forms; after the stream ends lookups go direct."""
    from reflex_ipc.backends import cuda_ops
    from reflex_ipc.backends.numpy_ops import NumpyOps
    from reflex_ipc.cuda.arrays import DeviceWeight
    from reflex_ipc.cuda.core import KERNELS, make_kernel
    from reflex_ipc.testing.moe_runtime import MemRuntime

    monkeypatch.setattr(cuda_ops, "WeightArena", StreamingArena)
    rt = MemRuntime()
    guarded = []

    def guarded_kernel(name, guard):
        base = rt.kernel(name)  # the recording, interpreting launcher
        fmt = KERNELS[name][0]
        where = [i for i, c in enumerate(fmt) if c == "Q"]

        def launch(grid, block, args, shared, stream):
            guard([args[i] for i in where])
            rt.launches.append((name, grid, block, args, shared))
            rt.run(name, grid, block, args, shared)
        guarded.append(name)
        return make_kernel(None, name, None, pack=lambda *a: a, launch=launch)

    rt.guarded_kernel = guarded_kernel

    def dtoh(out, ptr, stream):  # (this runtime copies nothing back otherwise: moe waits here only)
        out.view(np.uint8).reshape(-1)[:] = rt.mem[ptr:ptr + out.nbytes]

    from types import SimpleNamespace

    rt.drv.memcpy_dtoh_async = dtoh
    rt.stream = SimpleNamespace(synchronize=lambda: None)
    ops = cuda_ops.CudaOps.__new__(cuda_ops.CudaOps)
    ops.rt, ops.pool = rt, rt.pool
    ops._extra_weights, ops._graph, ops._seq_memo = [], None, None
    ops.mma = False
    rng = np.random.default_rng(4)
    E, k, K, F, D = 8, 2, 16, 8, 12
    mats = {"router": (rng.standard_normal((E, K)) * 0.5).astype(np.float32),
            "gate": (rng.standard_normal((E * F, K)) * 0.3).astype(np.float16).astype(np.float32),
            "up": (rng.standard_normal((E * F, K)) * 0.3).astype(np.float16).astype(np.float32),
            "down": (rng.standard_normal((E * D, F)) * 0.3).astype(np.float16).astype(np.float32)}
    devw = {}
    for name, a in mats.items():
        t = 0 if name == "router" else 1
        devw[name] = rt.weight(a, t)
    lo = min(w.ptr for w in devw.values())
    hi = max(w.ptr + w.shape[0] * w.row_bytes for w in devw.values())
    arena = StreamingArena(lo, hi - lo, [(w.ptr, w.shape[0] * w.row_bytes) for w in devw.values()])
    for name, w in devw.items():
        devw[name] = DeviceWeight(w.ptr, w.shape, w.ggml_type, w.type_name, w.row_bytes, name, arena)
    ops._arenas = {1: arena}
    ops.k = ops._k_after_upload
    for N, grouped in ((3, False), (40, True)):
        ops.moe_mma, ops.moe_mma_min_n, ops.moe_mma_launches, ops._sms = grouped, 32, 0, 132
        arena.ensured.clear()
        arena.ensured_ptrs.clear()
        rt.launches.clear()
        x = rng.standard_normal((N, K)).astype(np.float32)
        want = NumpyOps().moe(x.astype(np.float16).astype(np.float32) if grouped else x, mats["router"],
                              mats["gate"], mats["up"], mats["down"], k)
        got = ops.moe(ops.asarray(x), devw["router"], devw["gate"], devw["up"], devw["down"], k)
        np.testing.assert_allclose(rt.f32(got.ptr, N * D).reshape(N, D), want, rtol=2e-3, atol=2e-3)
        assert arena.ensured_ptrs == [(devw["router"].ptr, E * K * 4)]  # the router's matmul, guarded
        logits = x @ mats["router"].T
        routed = np.unique(np.argsort(-logits, 1, kind="stable")[:, :k])
        want_ranges = sorted((w.ptr + e * rows * w.row_bytes, w.ptr + (e + 1) * rows * w.row_bytes)
                             for w, rows in ((devw["gate"], F), (devw["down"], D), (devw["up"], F)) for e in routed)
        assert arena.ensured == [want_ranges]
        names = [launch[0] for launch in rt.launches]
        assert ("moe_group_i32" in names) == grouped and ops.moe_mma_launches == int(grouped)
    arena.live = False  # the stream has ended: the next lookup waits and goes direct
    assert ops.k("mm4_f32") is not None and ops.k == rt.kernel


@pytest.mark.parametrize("stream", ["1", "0"])
def test_arena_streams_a_cold_file(tmp_path, monkeypatch, stream):
    """WeightArena's read way on reflex_ipc.testing.upload_fakes' fake driver: streaming (the default) has a
    queue, answers ensure() / ensure_ptr() with the bytes on the device, reports progress, and
    ends with every byte uploaded and streaming() false; REFLEX_CUDA_STREAM=0 reads in file order
    without a queue (ensure waits for everything)."""
    path = tensor_model(tmp_path / "m.gguf", seed=5)
    f, rt, a = fake_arena(path, "read", monkeypatch, REFLEX_CUDA_UPLOAD_CHUNK_MB="1", REFLEX_CUDA_UPLOAD_THREADS="2",
                      REFLEX_CUDA_STREAM=stream)
    want = f.bytes_view(a.start, a.nbytes).tobytes()
    t = f.tensors["t3"]
    lo = a.ptr(t)
    a.ensure([(lo, lo + t.nbytes)])
    got = bytes(rt.drv.dev[lo - rt.drv.BASE:lo - rt.drv.BASE + t.nbytes])
    assert got == want[t.offset - a.start:t.offset - a.start + t.nbytes]
    a.ensure_ptr(a.ptr(f.tensors["t4"]) + 100)
    rep = a.report()
    assert rep["mode"] == "read" if stream == "1" else True
    a.wait()
    assert bytes(rt.drv.dev[:len(want)]) == want
    assert not a.streaming()
    assert (a.queue is not None) == (stream == "1")
    if stream == "1":
        assert a.stats["streaming"] and a.stats["jobs"] >= 5 and a.stats["bytes_read"] <= a.stats["bytes"]
    assert all(h.freed for h in rt.drv.pinned) and not any(rt.ctx.depth.values())
    f.close()


def test_stop_ends_the_reads_without_an_error(tmp_path):
    import os

    path = str(tmp_path / "w.bin")
    n = 100 * 1000
    random_file(path, n, seed=7)
    q = JobQueue(_jobs(n, [1000] * 100))
    calls = []

    def slow(fd, view, off):
        calls.append(off)
        if len(calls) == 5:
            q.stop()
        return fileread._pread(fd, view, off)

    fd = os.open(path, os.O_RDONLY)
    run_jobs(fd, q, lambda i: FakeLane(bytearray(n), 1000, []), 1, slow)  # returns, no error
    os.close(fd)
    assert q.n_done == 5 and not q.complete() and q.take() is None


def test_auto_streams_moe_files_from_the_page_cache(tmp_path, monkeypatch):
    """auto on a cached file: register for a dense file (here: no libcuda, so staging), the
    streaming read for a file mostly of expert tensors (unless REFLEX_CUDA_STREAM=0)."""
    import os

    from reflex_ipc.cuda import weights
    from reflex_ipc.gguffile import GGUFFile
    from reflex_ipc.testing.synthetic import example_gguf

    tok = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "synthetic-llama.gguf")
    moe = example_gguf("qwen3moe", str(tmp_path / "moe.gguf"), tokenizer=tok,
                       keys={"block_count": 4, "expert_count": 128, "expert_feed_forward_length": 128})
    dense = example_gguf("phi3_split_short", str(tmp_path / "dense.gguf"), tokenizer=tok)
    for path, stream, want in ((moe, "1", "read"), (moe, "0", "staging"), (dense, "1", "staging")):
        monkeypatch.setenv("REFLEX_CUDA_STREAM", stream)
        monkeypatch.setenv("REFLEX_CUDA_UPLOAD", "auto")
        with open(path, "rb") as fh:
            fh.read()
        with GGUFFile(path) as f:
            assert (weights.expert_share(f) >= weights.EXPERT_SHARE_STREAM) == (path == moe)
            a = weights.WeightArena(FakeRt(), f)
            a.wait()
            assert a.stats["resident"] >= 0.9 and a.stats["mode"] == want, a.stats
            assert bool(a.stats.get("streaming")) == (want == "read")


def test_hold_experts_on_a_streaming_arena(tmp_path, monkeypatch):
    """WeightArena.hold_experts (a prefix-store import's hold, CudaOps.hold_uploads): the
    tensors before the experts and an expert someone ensures still arrive; the other experts
    wait until release_experts(), then the upload completes."""
    import os

    from reflex_ipc.cuda import weights
    from reflex_ipc.gguffile import GGUFFile
    from reflex_ipc.testing.synthetic import example_gguf

    tok = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "synthetic-llama.gguf")
    path = example_gguf("qwen3moe", str(tmp_path / "moe.gguf"), tokenizer=tok,
                        keys={"block_count": 2, "expert_count": 16, "expert_feed_forward_length": 64})
    gate = threading.Event()
    lane = weights._PinnedLane

    def gated(*a, **k):
        gate.wait(10)  # the workers start once the hold is in place
        return lane(*a, **k)
    monkeypatch.setattr(weights, "_PinnedLane", gated)
    monkeypatch.setenv("REFLEX_CUDA_STREAM", "1")
    monkeypatch.setenv("REFLEX_CUDA_UPLOAD", "read")
    monkeypatch.setenv("REFLEX_CUDA_UPLOAD_THREADS", "2")
    with GGUFFile(path) as f:
        rt = FakeRt()
        a = weights.WeightArena(rt, f)
        assert a.hold_experts()
        gate.set()
        q = a.queue
        q.wait(list(range(a.n_eager)))
        time.sleep(0.1)
        assert q.n_done == a.n_eager and a.streaming() and len(q.jobs) > a.n_eager
        t = next(t for t in f.tensors.values() if weights._is_expert(t))
        per = t.nbytes // t.shape[2]
        lo = a.ptr(t) + 5 * per  # expert 5 of the first expert tensor
        a.ensure([(lo, lo + per)])
        want = f.bytes_view(t.offset + 5 * per, per).tobytes()
        assert bytes(rt.drv.dev[lo - rt.drv.BASE:lo - rt.drv.BASE + per]) == want
        assert q.n_done == a.n_eager + 1
        a.release_experts()
        a.wait()
        assert q.complete() and not a.streaming()
        assert bytes(rt.drv.dev[:a.nbytes]) == f.bytes_view(a.start, a.nbytes).tobytes()
        assert not a.hold_experts()  # nothing streams any more
