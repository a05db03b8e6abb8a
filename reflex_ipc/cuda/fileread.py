"""The host side of uploading a file's bytes that are not in the page cache.

Registering a file mapping that is not resident (cuMemHostRegister) faults its pages in
one at a time (~1.6 GB/s on the H200 host for a 21.6 GB file, against > 5 GB/s that the
disk reads with large read() calls), so WeightArena first asks `residency()` and, when
the bytes are not resident, uploads with `parallel_read()` instead: several threads each
take the next chunk of the file in order, pread it into one of their two page-locked
buffers and queue its copy to the device, so disk reads and copies overlap.

Nothing here knows CUDA: a "lane" (one per thread, made by the caller) holds the
buffers and does the copies, so tests drive the same pipeline with a bytearray as the
device. Imports nothing beyond the standard library.
"""

import os
import threading
import time

ALIGN = 4096  # chunk boundaries in the file (O_DIRECT needs block-aligned offsets and lengths)


class TruncatedError(OSError):
    """The file ended before the bytes its header promised (it shrank after it was parsed)."""


# ---------------------------------------------------------------------------------------
# residency
_mincore = None


def _mincore_fn():
    global _mincore
    if _mincore is None:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).mincore
        fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        fn.restype = ctypes.c_int
        _mincore = (fn, ctypes)
    return _mincore


WINDOWS = 8  # sampled runs of pages: one call each (the probe runs in the upload thread while
# the main thread holds the GIL; every foreign call gives it up and waits to get it back, up to
# the 5 ms switch interval: 256 one-page calls measured 18 ms on the H200 host)


def _sample_windows(lo, hi, page, samples):
    """(address, pages) of up to WINDOWS runs of contiguous pages spread evenly over
    [lo, hi) (lo page aligned), `samples` pages in all."""
    npages = max(1, -(-(hi - lo) // page))
    k = min(WINDOWS, npages)
    per = max(1, min(samples // k, npages // k))
    return [(lo + (i * npages // k) * page, per) for i in range(k)]


def mincore_fraction(addr, length, samples=256):
    """Fraction of sampled pages of the mapped range [addr, addr+length) that are in the
    page cache, by mincore(2) on a few runs of pages. Raises OSError on failure."""
    fn, ctypes = _mincore_fn()
    page = os.sysconf("SC_PAGE_SIZE")
    lo = addr // page * page
    hit = n = 0
    for p, k in _sample_windows(lo, addr + length, page, samples):
        vec = (ctypes.c_ubyte * k)()
        if fn(p, k * page, vec):
            e = ctypes.get_errno()
            raise OSError(e, f"mincore: {os.strerror(e)}")
        hit += sum(v & 1 for v in vec)
        n += k
    return hit / n


def nowait_fraction(fd, start, length, samples=256):
    """The same from a file descriptor: preadv2(RWF_NOWAIT) of a run of pages stops at the
    first page that is not cached (EAGAIN when it is the first one). Raises OSError where the
    kernel or the file system does not support it (EOPNOTSUPP, EINVAL)."""
    page = os.sysconf("SC_PAGE_SIZE")
    lo = start // page * page
    end = start + length
    got = want = 0
    for p, k in _sample_windows(lo, end, page, samples):
        p = max(p, start)
        n = max(0, min(k * page, end - p))
        if not n:
            continue
        buf = bytearray(n)
        want += n
        try:
            got += os.preadv(fd, [buf], p, os.RWF_NOWAIT)
        except BlockingIOError:
            pass
    return got / want if want else 1.0


def mincore_trusted(st):
    """Whether mincore(2) reports page-cache residency for a mapping of this file (os.stat
    result): since Linux 5.0 it does only for the file's owner, a writer, or root; for
    anyone else it reports only the pages this process has mapped (none, for a fresh
    mapping), which would read as 'not resident'."""
    euid = os.geteuid()
    return euid == 0 or st.st_uid == euid


def residency(path, file_off, length, addr=None, samples=256):
    """{"resident": fraction of sampled pages in the page cache, "probe": how, "probe_ms"}
    for file bytes [file_off, file_off+length), mapped at addr (None: not mapped). mincore
    on the mapping when it can be trusted, else preadv2(RWF_NOWAIT) on the file; a failure
    reads as fully resident (the caller's default path), with the reason in "probe"."""
    t0 = time.perf_counter()
    out = {"resident": 1.0, "probe": None}
    try:
        st = os.stat(path)
        if addr is not None and (mincore_trusted(st) or os.access(path, os.W_OK)):
            out.update(resident=round(mincore_fraction(addr, length, samples), 4), probe="mincore")
        else:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            try:
                out.update(resident=round(nowait_fraction(fd, file_off, length, samples), 4), probe="nowait")
            finally:
                os.close(fd)
    except Exception as e:  # noqa: BLE001 - any failure: the default way
        out.update(resident=1.0, probe=f"failed ({type(e).__name__}: {e}); assumed resident")
    out["probe_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
    return out


# ---------------------------------------------------------------------------------------
# the chunk plan and the readers
def plan(start, nbytes, chunk, direct=False, align=ALIGN):
    """The chunks that upload file bytes [start, start+nbytes): a list of
    (file_off, read_len, skip, dst_off, n): read read_len bytes at file_off (a multiple of
    `align`) into a buffer, then its bytes skip..skip+n go to device offset dst_off.
    chunk must be a positive multiple of align; with direct, read_len is rounded up to
    align too (O_DIRECT; the read stops short at the end of the file)."""
    if chunk <= 0 or chunk % align:
        raise ValueError(f"chunk {chunk} is not a positive multiple of {align}")
    end = start + nbytes
    out = []
    off = start // align * align
    while off < end:
        hi = min(off + chunk, end)
        a = max(off, start)
        read_hi = -(-hi // align) * align if direct else hi
        out.append((off, read_hi - off, a - off, a - start, hi - a))
        off += chunk
    return out


def _pread(fd, view, off):
    return os.preadv(fd, [view], off)


def read_chunk(fd, buf, file_off, read_len, need, pread=_pread):
    """Fill buf[:read_len] from the file at file_off; at least `need` bytes must arrive
    (fewer: the file ended, TruncatedError). Short reads continue where they stopped;
    EINTR retries. Returns the bytes read."""
    view = memoryview(buf)
    got = 0
    while got < need:
        try:
            n = pread(fd, view[got:read_len], file_off + got)
        except InterruptedError:
            continue
        if n <= 0:
            raise TruncatedError(f"the file ends at byte {file_off + got}, before byte "
                                 f"{file_off + need} of the tensor data (did it change after it was opened?)")
        got += n
    return got


def parallel_read(fd, chunks, make_lane, threads, pread=_pread, fd_direct=None):
    """Run the plan `chunks` (plan()'s list) on `threads` threads. make_lane(i) -> a lane
    with .bufs (two writable buffers of at least the largest read_len), .wait(k) (buffer k's
    last copy has finished), .copy(k, skip, n, dst_off) (queue buffer k's bytes
    skip..skip+n to the device at dst_off), .finish() (every copy done) and .close()
    (always called, also after an error). Threads take chunks in file order; each reads
    into its buffers alternately, so its next read overlaps its last copy. With fd_direct
    (an O_DIRECT descriptor) reads use it, and a chunk it refuses (EINVAL) is read through
    fd. The first error stops every thread after its current chunk and is raised here
    (a TruncatedError before others); nothing waits on another thread, so no error can
    hang it. Returns per-thread stats [{"chunks", "bytes", "read_s", "wait_s", "setup_s"}]
    (setup_s: make_lane's time, e.g. allocating page-locked memory)."""
    lock = threading.Lock()
    items = iter(chunks)
    stop = threading.Event()
    errors = []
    stats = [None] * threads

    def worker(i):
        lane = None
        st = {"chunks": 0, "bytes": 0, "read_s": 0.0, "wait_s": 0.0, "setup_s": 0.0}
        try:
            t0 = time.perf_counter()
            lane = make_lane(i)
            st["setup_s"] = time.perf_counter() - t0
            k = 0
            while not stop.is_set():
                with lock:
                    item = next(items, None)
                if item is None:
                    break
                file_off, read_len, skip, dst_off, n = item
                t0 = time.perf_counter()
                lane.wait(k)
                t1 = time.perf_counter()
                if fd_direct is not None:
                    try:
                        read_chunk(fd_direct, lane.bufs[k], file_off, read_len, skip + n, pread)
                    except OSError as e:
                        if isinstance(e, TruncatedError) or e.errno != 22:  # EINVAL: alignment
                            raise
                        read_chunk(fd, lane.bufs[k], file_off, read_len, skip + n, pread)
                else:
                    read_chunk(fd, lane.bufs[k], file_off, read_len, skip + n, pread)
                t2 = time.perf_counter()
                lane.copy(k, skip, n, dst_off)
                st["chunks"] += 1
                st["bytes"] += n
                st["wait_s"] += t1 - t0
                st["read_s"] += t2 - t1
                k ^= 1
            lane.finish()
        except BaseException as e:  # noqa: BLE001 - re-raised by the caller's thread
            errors.append(e)
            stop.set()
        finally:
            if lane is not None:
                try:
                    lane.close()
                except BaseException as e:  # noqa: BLE001
                    errors.append(e)
                    stop.set()
            for k in ("read_s", "wait_s", "setup_s"):
                st[k] = round(st[k], 4)
            stats[i] = st

    workers = [threading.Thread(target=worker, args=(i,), name=f"reflex-read-{i}", daemon=True)
               for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise next((e for e in errors if isinstance(e, TruncatedError)), errors[0])
    return stats


# ---------------------------------------------------------------------------------------
# streaming: jobs in the order a forward pass needs them, the ones waited for first
class JobQueue:
    """The streaming read upload's jobs: (file_off, nbytes, dst_off) each, read in the planned
    order (the list's) except that want() moves the jobs holding given device byte ranges
    ahead of the rest, and wait() blocks until they are copied. Thread-safe; the first error
    (fail()) ends it: take() returns None from then on and every wait() raises it."""

    def __init__(self, jobs):
        import bisect
        import collections

        self._bisect = bisect.bisect_right
        self.jobs = list(jobs)
        self.state = bytearray(len(self.jobs))  # 0 pending, 1 taken, 2 done
        self.order = collections.deque(range(len(self.jobs)))
        self.urgent = collections.deque()
        self.cv = threading.Condition()
        self.error = None
        self.stopped = False  # stop(): no job is taken any more (the process is about to exit)
        self.held = None  # hold(limit): planned jobs from index limit on wait (urgent ones run)
        self.n_done = 0
        self.bytes_done = 0
        self.bytes_urgent = 0  # bytes of the jobs someone waited for
        self.bytes = sum(n for _, n, _ in self.jobs)
        by_dst = sorted(range(len(self.jobs)), key=lambda i: self.jobs[i][2])
        self._dst_starts = [self.jobs[i][2] for i in by_dst]
        self._by_dst = by_dst
        self._max_len = max((n for _, n, _ in self.jobs), default=0)

    def take(self):
        """The next job's index (urgent ones first), marked taken; None when none is left.
        While held, a planned job at or past the hold's limit waits (the caller blocks) until
        release() or an urgent job comes."""
        with self.cv:
            while True:
                if self.error is not None or self.stopped:
                    return None
                while self.urgent:
                    i = self.urgent.popleft()
                    if self.state[i] == 0:
                        self.state[i] = 1
                        return i
                order = self.order
                while order and self.state[order[0]] != 0:
                    order.popleft()
                if not order:
                    return None
                if self.held is None or order[0] < self.held:
                    i = order.popleft()
                    self.state[i] = 1
                    return i
                self.cv.wait()

    def hold(self, limit):
        """Let the planned jobs from index `limit` on wait (jobs someone wants still run): a
        state import reading its segments meanwhile gets the disk, memory and copy engine
        instead of experts nobody asked for yet. release() ends it."""
        with self.cv:
            self.held = limit

    def release(self):
        with self.cv:
            self.held = None
            self.cv.notify_all()

    def done(self, i):
        with self.cv:
            self.state[i] = 2
            self.n_done += 1
            self.bytes_done += self.jobs[i][1]
            self.cv.notify_all()

    def fail(self, e):
        with self.cv:
            if self.error is None:
                self.error = e
            self.cv.notify_all()

    def complete(self):
        return self.n_done == len(self.jobs)

    def stop(self):
        """Take no more jobs (those in progress finish): for a process whose answer is out."""
        with self.cv:
            self.stopped = True
            self.cv.notify_all()

    def covering(self, lo, hi):
        """Indices of the jobs whose device bytes [dst, dst + n) meet [lo, hi)."""
        out = []
        k = self._bisect(self._dst_starts, hi - 1)  # jobs starting at or before hi - 1
        while k > 0:
            k -= 1
            i = self._by_dst[k]
            _, n, dst = self.jobs[i]
            if dst + n > lo:
                out.append(i)
            elif dst + self._max_len <= lo:  # no earlier job can reach lo
                break
        return out

    def want(self, ranges):
        """Move the pending jobs holding any of the device byte ranges [(lo, hi), ...] to the
        front (in device order); returns every job index those ranges need."""
        need = sorted({i for lo, hi in ranges if hi > lo for i in self.covering(lo, hi)},
                      key=lambda i: self.jobs[i][2])
        with self.cv:
            for i in need:
                if self.state[i] == 0:
                    self.urgent.append(i)
                    self.bytes_urgent += self.jobs[i][1]
            if self.held is not None and need:
                self.cv.notify_all()  # a worker waiting on the hold takes them
        return need

    def wait(self, ids):
        """Block until the jobs ids are done; raise the queue's error if there is one."""
        with self.cv:
            while True:
                if self.error is not None:
                    raise self.error
                if all(self.state[i] == 2 for i in ids):
                    return
                self.cv.wait()


def run_jobs(fd, queue, make_lane, threads, pread=_pread):
    """Run a JobQueue on `threads` threads: each takes the next job, preads it into its lane's
    first buffer, queues the copy to the device (lane.copy(0, 0, n, dst_off)), waits for it
    (lane.wait(0): a job is done when its bytes are on the device) and marks it done. Lanes as
    parallel_read's. The first error fails the queue (waiters raise it), stops the threads and
    is raised here (a TruncatedError before others). Returns per-thread stats."""
    errors = []
    stats = [None] * threads

    def worker(i):
        lane = None
        st = {"jobs": 0, "bytes": 0, "read_s": 0.0, "copy_s": 0.0, "setup_s": 0.0}
        try:
            t0 = time.perf_counter()
            lane = make_lane(i)
            st["setup_s"] = time.perf_counter() - t0
            while True:
                j = queue.take()
                if j is None:
                    break
                file_off, n, dst_off = queue.jobs[j]
                t1 = time.perf_counter()
                read_chunk(fd, lane.bufs[0], file_off, n, n, pread)
                t2 = time.perf_counter()
                lane.copy(0, 0, n, dst_off)
                lane.wait(0)
                queue.done(j)
                st["jobs"] += 1
                st["bytes"] += n
                st["read_s"] += t2 - t1
                st["copy_s"] += time.perf_counter() - t2
            lane.finish()
        except BaseException as e:  # noqa: BLE001 - re-raised by the caller's thread
            errors.append(e)
            queue.fail(e)
        finally:
            if lane is not None:
                try:
                    lane.close()
                except BaseException as e:  # noqa: BLE001
                    errors.append(e)
                    queue.fail(e)
            for k in ("read_s", "copy_s", "setup_s"):
                st[k] = round(st[k], 4)
            stats[i] = st

    workers = [threading.Thread(target=worker, args=(i,), name=f"reflex-stream-{i}", daemon=True)
               for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise next((e for e in errors if isinstance(e, TruncatedError)), errors[0])
    if not queue.complete() and not queue.stopped:  # (no error, yet jobs left: never report success then)
        raise RuntimeError(f"streaming upload ended with {len(queue.jobs) - queue.n_done} jobs not done")
    return stats
