"""Fakes of the CUDA upload path, for the CPU tests of the read upload
(reflex_ipc/cuda/fileread.py) and of WeightArena (tests/test_upload_reader.py,
tests/test_stream_upload.py): a lane and a pycuda.driver whose copies land in a bytearray
only when waited for (so a buffer reused too early shows as wrong bytes), a file of random
bytes, a small GGUF of raw tensors, and a WeightArena over the fake driver."""

import mmap
import os
import threading

import numpy as np


def random_file(path, n, seed=0):
    data = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    return data


def aligned_buffer(n):
    """A page-aligned writable buffer (O_DIRECT needs one), as pinned allocations are."""
    return mmap.mmap(-1, max(n, 1))


class FakeLane:
    """A lane whose copies happen only when waited for (as an asynchronous copy may)."""

    def __init__(self, dev, chunk, log, aligned=False, fail_copy_at=None):
        self.dev = dev
        self.bufs = [aligned_buffer(chunk) if aligned else bytearray(chunk) for _ in range(2)]
        self.pending = [None, None]
        self.log = log
        self.fail_copy_at = fail_copy_at
        self.closed = False
        self.copies = 0

    def wait(self, k):
        if self.pending[k] is not None:
            skip, n, dst = self.pending[k]
            self.dev[dst:dst + n] = bytes(self.bufs[k][skip:skip + n])
            self.pending[k] = None

    def copy(self, k, skip, n, dst_off):
        self.copies += 1
        if self.fail_copy_at is not None and self.copies == self.fail_copy_at:
            raise RuntimeError("copy failed")
        self.pending[k] = (skip, n, dst_off)
        self.log.append((threading.get_ident(), dst_off))

    def finish(self):
        self.wait(0)
        self.wait(1)

    def close(self):
        self.closed = True



class FakeDrv:
    """Enough of pycuda.driver for WeightArena's read and staging ways: device memory is a
    bytearray; a stream's copies run when an event recorded after them, or the stream, is
    waited for, reading the host buffer then."""

    BASE = 1 << 40

    def __init__(self):
        self.dev = None
        self.pinned = []
        drv = self

        class Alloc:
            def __init__(self, n):
                drv.dev = bytearray(n)

            def __int__(self):
                return drv.BASE

        class Host(bytearray):
            freed = False

            def free(self):
                self.freed = True

        class Stream:
            def __init__(self):
                self.ops = []  # (sequence number, copy) not yet run
                self.seq = 0
                self.handle = 0

            def run_before(self, seq):
                while self.ops and self.ops[0][0] < seq:
                    self.ops.pop(0)[1]()

            def synchronize(self):
                self.run_before(self.seq)

        class Event:
            def record(self, stream):
                self.stream, self.seq = stream, stream.seq

            def synchronize(self):
                self.stream.run_before(self.seq)

        self.mem_alloc = Alloc
        self.Stream = Stream
        self.Event = Event
        self.Host = Host

    def pagelocked_empty(self, n, dtype):
        h = self.Host(n)
        self.pinned.append(h)
        a = np.ndarray(n, np.uint8, buffer=h)
        assert a.base is h  # pycuda's: .base is the allocation, with .free()
        return a

    def memcpy_htod_async(self, dst, src, stream):
        off = int(dst) - self.BASE

        def op():
            self.dev[off:off + src.size] = src.tobytes()
        stream.ops.append((stream.seq, op))
        stream.seq += 1


class FakeCtx:
    def __init__(self):
        self.depth = {}
        self.lock = threading.Lock()

    def push(self):
        with self.lock:
            t = threading.get_ident()
            self.depth[t] = self.depth.get(t, 0) + 1

    def pop(self):
        with self.lock:
            t = threading.get_ident()
            assert self.depth.get(t, 0) > 0
            self.depth[t] -= 1


class FakeRt:
    def __init__(self):
        self.drv = FakeDrv()
        self.ctx = FakeCtx()
        self.upload_stream = self.drv.Stream()


def tensor_model(path, seed=0):
    from reflex_ipc.testing.synthetic import tensors_gguf

    rng = np.random.default_rng(seed)
    tensors = {f"t{i}": (rng.integers(0, 256, rows * cols * 4, dtype=np.uint8), 0, (rows, cols))
               for i, (rows, cols) in enumerate([(3, 1000), (17, 333), (1, 5), (257, 129), (1000, 901)])}
    tensors_gguf(path, tensors)
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)  # clean pages: DONTNEED can drop them
    os.close(fd)
    return str(path)


def evict(path):
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # fsync'd by tensor_model: evicted
    os.close(fd)


def fake_arena(path, mode, monkeypatch, evicted=False, **env):
    from reflex_ipc.cuda.weights import WeightArena
    from reflex_ipc.gguffile import GGUFFile

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    f = GGUFFile(path)
    if evicted:  # after the header was parsed
        evict(path)
    rt = FakeRt()
    a = WeightArena(rt, f, mode=mode)
    return f, rt, a
