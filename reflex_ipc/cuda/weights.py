"""One device arena per GGUF file holding its whole tensor-data section, uploaded once.

GGUF stores all tensor data in one contiguous section, so the arena is one cuMemAlloc
of that section's size (resident VRAM = the weights' bytes in the file, plus at most
256 bytes), and a tensor's device address is arena + (its file offset - section start).
The upload runs on a background thread, so it overlaps the rest of the load; three ways
(REFLEX_CUDA_UPLOAD=auto|register|read|staging, default auto):
- register: page-lock the file mapping itself (cuMemHostRegister, read-only) and DMA from
  it in one copy: no host-side copy at all (15-17 GB/s from the page cache on the H200
  host, 0.4-21.6 GB files); but pages that are not in the page cache are faulted in one
  at a time (~1.6 GB/s from a dropped cache);
- read: threads pread the file in large chunks into page-locked buffers and copy those
  (cuda/fileread.py), at the disk's speed when the file is not cached;
- staging: copy the mapping through two page-locked staging buffers (pinned copies run at
  ~50 GB/s on the H200 host, pageable ones at ~7), the device copies on their own stream.
auto samples the section's pages (mincore, well under 1 ms) and picks register when at
least RESIDENT_ENOUGH of them are in the page cache, else read. A failed read falls back
to register, a refused registration to staging; a file that shrank is a gguf_error.
`wait()` joins the thread; CudaOps calls it before its first kernel.

Streaming (the read way, REFLEX_CUDA_STREAM on, the default): the file is not cached, so the
disk bounds the start; the reads then follow `stream_plan` (the forward pass's order: small
global tensors, token_embd, each layer's tensors, the rest, and last every expert of every
mixture-of-experts tensor, one job per expert) and anyone may ask for byte ranges first
(`ensure`, `ensure_ptr`): CudaOps launches each kernel only when the tensors it reads are on the
device (the first layers' kernels run while later layers are read) and a MoE layer asks for
the experts its tokens route to, which jump the queue, so a short prompt's first token reads
the attention weights and only the experts it uses; the rest streams in behind. `streaming()`
says whether that is under way (it waits the ~1 ms until the way is chosen).
"""
import bisect
import ctypes
import os
import re
import threading
import time

from .. import settings

HOST_REGISTER_READ_ONLY = 0x08

CHUNK = 32 << 20  # bytes per staging buffer
N_STAGING = 2
RESIDENT_ENOUGH = 0.9  # auto: the sampled fraction of cached pages from which register is used
# auto, streaming on: a file whose mixture-of-experts tensors hold at least this share of the
# bytes streams (the read way) even from the page cache: a short prompt's first token needs its
# attention weights and the experts it routes to (a third to a half of them), read at ~15 GB/s
# from the page cache, where register copies everything first (~20 GB/s)
EXPERT_SHARE_STREAM = 0.5
READ_THREADS = 8  # read: default threads (REFLEX_CUDA_UPLOAD_THREADS), each with two buffers
# read: MiB per pread and per copy: REFLEX_CUDA_UPLOAD_CHUNK_MB (settings.py, default 16)


_STREAMS = []  # the arenas that streamed (stop_streams)


def stop_streams():
    """Stop every streaming upload's reads (jobs in progress finish): a one-shot process that
    has written its answer and only lingers before exiting leaves the disk to the next one."""
    for a in _STREAMS:
        if a.queue is not None:
            a.queue.stop()


def _is_expert(t):
    return "_exps." in t.name and len(t.shape) == 3 and t.shape[2] > 1 and t.nbytes % t.shape[2] == 0


def expert_share(f):
    """The share of GGUFFile f's tensor bytes in mixture-of-experts tensors (*_exps, 3-D)."""
    total = sum(t.nbytes for t in f.tensors.values())
    return sum(t.nbytes for t in f.tensors.values() if _is_expert(t)) / total if total else 0.0


def stream_plan(f, start, chunk):
    """The streaming upload's jobs [(file_off, nbytes, dst_off)] for GGUFFile f's tensors (its
    tensor data starting at file offset `start`), in the order a forward pass needs them: tensors
    under 1 MiB outside the layers (norms, rope factors), token_embd, the tensors of blk.0, blk.1,
    ..., the other large ones (the output head), then the experts of every 3-D *_exps tensor (one
    job per expert: its rows are one contiguous slice), layer by layer. Tensors of one group that
    follow each other in the file (gaps of alignment padding only) share jobs of up to `chunk`
    bytes; larger ones are cut at `chunk`. Returns (jobs, the number of jobs before the experts)."""
    eager, lazy = [], []
    for t in f.tensors.values():
        m = re.match(r"blk\.(\d+)\.", t.name)
        layer = int(m.group(1)) if m else None
        if _is_expert(t):
            per = t.nbytes // t.shape[2]
            lazy += [((layer if layer is not None else 1 << 30, t.offset + e * per), t.offset + e * per, per)
                     for e in range(t.shape[2])]
            continue
        if layer is not None:
            key = layer
        elif t.name.startswith("token_embd"):
            key = -1
        else:
            key = -2 if t.nbytes < (1 << 20) else 1 << 30
        eager.append(((key, t.offset), t.offset, t.nbytes))
    jobs = []

    def add(off, n):
        while n > 0:
            k = min(n, chunk)
            jobs.append((off, k, off - start))
            off += k
            n -= k

    cur = None  # [key, off, end] of the group being merged
    for (key, _), off, n in sorted(eager):
        if cur is not None and cur[0] == key and 0 <= off - cur[2] <= 256 and off + n - cur[1] <= chunk:
            cur[2] = off + n
            continue
        if cur is not None:
            add(cur[1], cur[2] - cur[1])
        cur = [key, off, off + n]
    if cur is not None:
        add(cur[1], cur[2] - cur[1])
    n_eager = len(jobs)
    for _, off, n in sorted(lazy):
        add(off, n)
    return jobs, n_eager


class WeightArena:
    queue = None  # (set in __init__; class defaults for stand-ins in tests)
    n_eager = 0  # streaming: the planned jobs before the experts (stream_plan)
    _decided = None

    def __init__(self, rt, gguf_file, mode=None):
        self.rt = rt
        self.f = gguf_file
        self.start = gguf_file.data_offset
        end = max((t.offset + t.nbytes for t in gguf_file.tensors.values()), default=self.start)
        self.nbytes = max(end - self.start, 256)
        self.alloc = rt.drv.mem_alloc(self.nbytes)
        self.base = int(self.alloc)
        self.error = None
        self.stats = {}
        self.mode = mode or settings.get().cuda_upload
        self.queue = None  # the streaming upload's fileread.JobQueue (None: another way)
        self._decided = threading.Event()  # set once the way is chosen (queue set or not)
        self._t0 = time.perf_counter()
        self._starts = None  # tensors by device offset, for ensure_ptr: (starts, ends)
        self._ready = None  # per tensor: on the device already (ensure_ptr's fast path)
        self._thread = threading.Thread(target=self._upload, name="reflex-cuda-upload", daemon=True)
        self._thread.start()
        self._waited = False

    def ptr(self, info):
        """Device address of a TensorInfo's data."""
        return self.base + (info.offset - self.start)

    def _upload(self):
        self.rt.ctx.push()
        extra = {"requested": self.mode}
        try:
            src = self.f.bytes_view(self.start, self.nbytes)
            mode = self.mode
            if mode == "auto":
                mode = "register"
                if src.size:
                    from . import fileread

                    probe = fileread.residency(self.f.path, self.start, src.size, src.ctypes.data)
                    extra.update(probe)
                    if probe["resident"] < RESIDENT_ENOUGH:
                        mode = "read"
                    elif settings.get().cuda_stream and expert_share(self.f) >= EXPERT_SHARE_STREAM:
                        mode = "read"
                        extra["why"] = "experts: stream the routed ones first"
            if mode == "read" and src.size:
                try:
                    s = settings.get()
                    if s.cuda_stream and not s.cuda_upload_direct:
                        self._upload_stream(src)
                    else:
                        self._decided.set()
                        self._upload_read(src)
                    return
                except Exception as e:  # noqa: BLE001 - a shrunk file is final; else the mapping's way
                    from .fileread import TruncatedError

                    if isinstance(e, TruncatedError):
                        from ..gguffile import GGUFError

                        raise GGUFError(str(e), path=self.f.path) from None
                    self.stats["read_error"] = f"{type(e).__name__}: {e}"
                    mode = "register"
            self._decided.set()
            if mode == "register" and src.size:
                try:
                    self._upload_registered(src)
                    return
                except OSError as e:  # registration refused: fall back to staging
                    self.stats["register_error"] = str(e)
            self._upload_staging(src)
        except BaseException as e:
            self.error = e
            if self.queue is not None:
                self.queue.fail(e)
        finally:
            self.stats = {**self.stats, **extra}
            self._decided.set()
            self.rt.ctx.pop()

    def _upload_read(self, src):
        """Parallel preads of the file into page-locked buffers, each copied to the arena
        (fileread.parallel_read): the way when the file is not in the page cache."""
        from . import fileread

        t0 = time.perf_counter()
        n = src.size
        s = settings.get()
        threads = s.cuda_upload_threads or READ_THREADS
        chunk = s.cuda_upload_chunk_mb << 20
        direct = s.cuda_upload_direct
        fd = os.open(self.f.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        fd_direct = None
        try:
            st = os.fstat(fd)
            file_id = getattr(self.f, "file_id", None)
            if file_id is not None and (st.st_dev, st.st_ino) != file_id:
                raise OSError("the path now names another file than the one parsed")
            if st.st_size < self.start + n:
                raise fileread.TruncatedError(f"the file is {st.st_size} bytes now, its tensor data "
                                              f"ends at byte {self.start + n}")
            if direct:
                try:  # bypasses the page cache: the next start reads the disk again
                    fd_direct = os.open(self.f.path, os.O_RDONLY | os.O_DIRECT | getattr(os, "O_CLOEXEC", 0))
                except (OSError, AttributeError):
                    fd_direct = None
            try:
                os.posix_fadvise(fd, self.start, n, os.POSIX_FADV_SEQUENTIAL)
            except (OSError, AttributeError):
                pass
            chunks = fileread.plan(self.start, n, chunk, direct=fd_direct is not None)
            threads = min(threads, len(chunks))
            per = fileread.parallel_read(fd, chunks, lambda i: _PinnedLane(self, chunk), threads,
                                         fd_direct=fd_direct)
        finally:
            os.close(fd)
            if fd_direct is not None:
                os.close(fd_direct)
        t1 = time.perf_counter()
        from .. import phases

        end_at = phases.since_launch_ms()
        self.stats = {**self.stats, "mode": "read", "bytes": n, "threads": threads,
                      "chunk_mb": chunk >> 20, "direct": fd_direct is not None,
                      "start_at": round(end_at - (t1 - t0) * 1e3, 2), "end_at": round(end_at, 2),
                      "upload_ms": round((t1 - t0) * 1e3, 2),
                      "read_s_sum": round(sum(p["read_s"] for p in per), 3),
                      "buffer_wait_s_sum": round(sum(p["wait_s"] for p in per), 3),
                      "lane_setup_ms_max": round(max(p["setup_s"] for p in per) * 1e3, 2),
                      "GB_per_s": round(n / (t1 - t0) / 1e9, 2) if t1 > t0 else None}

    def _open_checked(self, n):
        """An fd of the file, checked to be the one parsed and still long enough."""
        from . import fileread

        fd = os.open(self.f.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            st = os.fstat(fd)
            file_id = getattr(self.f, "file_id", None)
            if file_id is not None and (st.st_dev, st.st_ino) != file_id:
                raise OSError("the path now names another file than the one parsed")
            if st.st_size < self.start + n:
                raise fileread.TruncatedError(f"the file is {st.st_size} bytes now, its tensor data "
                                              f"ends at byte {self.start + n}")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _upload_stream(self, src):
        """The read way in stream_plan's order, anyone's ensure() first (fileread.run_jobs on
        a JobQueue): see the module docstring."""
        from . import fileread

        t0 = time.perf_counter()
        n = src.size
        s = settings.get()
        threads = s.cuda_upload_threads or READ_THREADS
        chunk = s.cuda_upload_chunk_mb << 20
        try:
            fd = self._open_checked(n)
        except OSError:
            self._decided.set()  # (the caller falls back to register)
            raise
        try:
            try:
                os.posix_fadvise(fd, self.start, n, os.POSIX_FADV_RANDOM)  # no readahead past a job
            except (OSError, AttributeError):
                pass
            jobs, n_eager = stream_plan(self.f, self.start, chunk)
            self.n_eager = n_eager
            self.queue = fileread.JobQueue(jobs)
            _STREAMS.append(self)
            self._decided.set()
            threads = max(1, min(threads, len(jobs)))
            per = fileread.run_jobs(fd, self.queue, lambda i: _PinnedLane(self, chunk, 1), threads)
        finally:
            os.close(fd)
        t1 = time.perf_counter()
        from .. import phases

        end_at = phases.since_launch_ms()
        q = self.queue
        self.stats = {**self.stats, "mode": "read", "streaming": True, "bytes": n, "bytes_read": q.bytes,
                      "jobs": len(q.jobs), "jobs_before_experts": n_eager, "bytes_asked_first": q.bytes_urgent,
                      "threads": threads, "chunk_mb": chunk >> 20,
                      "start_at": round(end_at - (t1 - t0) * 1e3, 2), "end_at": round(end_at, 2),
                      "upload_ms": round((t1 - t0) * 1e3, 2),
                      "read_s_sum": round(sum(p["read_s"] for p in per), 3),
                      "copy_s_sum": round(sum(p["copy_s"] for p in per), 3),
                      "lane_setup_ms_max": round(max(p["setup_s"] for p in per) * 1e3, 2),
                      "GB_per_s": round(q.bytes / (t1 - t0) / 1e9, 2) if t1 > t0 else None}

    # -- streaming: what a kernel reads, on the device before it runs -------------------------
    def streaming(self):
        """True while the streaming upload is under way (waits until the way is chosen)."""
        if self._decided is not None:
            self._decided.wait()
        q = self.queue
        return q is not None and q.error is None and not q.complete()

    def hold_experts(self):
        """While streaming: let the experts nobody asked for wait (JobQueue.hold) until
        release_experts(); the tensors before them and what a kernel asks for still stream.
        Returns whether it held anything."""
        if not self.streaming():
            return False
        self.queue.hold(self.n_eager)
        return True

    def release_experts(self):
        if self.queue is not None:
            self.queue.release()

    def ensure(self, ranges):
        """Block until the device byte ranges [(lo, hi), ...] (absolute device addresses) of
        this arena are uploaded; they are read before anything else still pending. A failed
        upload raises as wait() does. Without streaming: wait() for the whole upload."""
        q = self.queue
        if q is None or q.error is not None:
            return self.wait()
        if q.complete():
            return
        try:
            q.wait(q.want([(lo - self.base, hi - self.base) for lo, hi in ranges]))
        except Exception:  # the streaming read failed: the upload's outcome (another way may
            self.wait()  # have uploaded it all since; else its error as a ReflexError)

    def ensure_ptr(self, ptr):
        """ensure() the whole tensor holding device address ptr (a kernel argument)."""
        if self._starts is None:
            infos = sorted(self.f.tensors.values(), key=lambda t: t.offset)
            self._starts = ([self.base + t.offset - self.start for t in infos],
                            [self.base + t.offset - self.start + t.nbytes for t in infos])
            self._ready = bytearray(len(infos))
        starts, ends = self._starts
        i = bisect.bisect_right(starts, ptr) - 1
        if i < 0 or ptr >= ends[i]:
            return  # padding between tensors (nothing reads it)
        if not self._ready[i]:
            self.ensure([(starts[i], ends[i])])
            self._ready[i] = 1

    def report(self):
        """The upload's stats; while streaming, what has arrived so far (bytes before the first
        token, when asked at the first token)."""
        q = self.queue
        if q is None or q.complete() and self.stats.get("streaming"):
            return self.stats
        dt = time.perf_counter() - self._t0
        return {**self.stats, "mode": "read", "streaming": True, "in_progress": True, "bytes": self.nbytes,
                "bytes_done": q.bytes_done, "bytes_asked_first": q.bytes_urgent, "jobs": len(q.jobs),
                "jobs_done": q.n_done, "ms_since_start": round(dt * 1e3, 2),
                "GB_per_s": round(q.bytes_done / dt / 1e9, 2) if dt > 0 else None}

    def _upload_registered(self, src):
        """Page-lock the mapping and DMA from it. The range is cut at page boundaries into
        REFLEX_CUDA_UPLOAD_THREADS pieces (default 4), each registered and copied by its own
        thread on its own stream: pinning is kernel work that runs in parallel, and a
        piece's copy starts while later pieces are still being pinned."""
        lib = ctypes.CDLL("libcuda.so.1")
        t0 = time.perf_counter()
        mm_addr = src.ctypes.data - self.start  # the mapping starts at file offset 0 (page aligned)
        data_addr = src.ctypes.data
        end = data_addr + src.size
        n = settings.get().cuda_upload_threads or 4
        page = os.sysconf("SC_PAGE_SIZE")
        cuts = [mm_addr] + sorted({(data_addr + src.size * i // n) // page * page for i in range(1, n)}) + [end]
        cuts = [c for i, c in enumerate(cuts) if i == 0 or c > cuts[i - 1]]
        pieces = list(zip(cuts[:-1], cuts[1:]))
        errors, times = [], [None] * len(pieces)

        def piece(i, lo, hi):
            self.rt.ctx.push()
            stream = None
            try:
                t = time.perf_counter()
                rc = lib.cuMemHostRegister_v2(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo),
                                              ctypes.c_uint(HOST_REGISTER_READ_ONLY))
                if rc:
                    raise OSError(f"cuMemHostRegister failed with CUDA error {rc}")
                t_reg = time.perf_counter()
                try:
                    a = max(lo, data_addr)
                    if hi > a:
                        stream = self.rt.drv.Stream()
                        rc = lib.cuMemcpyHtoDAsync_v2(ctypes.c_uint64(self.base + (a - data_addr)),
                                                      ctypes.c_void_p(a), ctypes.c_size_t(hi - a),
                                                      ctypes.c_void_p(stream.handle))
                        if rc:
                            raise RuntimeError(f"cuMemcpyHtoDAsync failed with CUDA error {rc}")
                        stream.synchronize()
                finally:
                    lib.cuMemHostUnregister(ctypes.c_void_p(lo))
                times[i] = (round((t_reg - t) * 1e3, 2), round((time.perf_counter() - t_reg) * 1e3, 2))
            except BaseException as e:
                errors.append(e)
            finally:
                del stream  # freed while the context is current
                self.rt.ctx.pop()

        workers = [threading.Thread(target=piece, args=(i, lo, hi), daemon=True)
                   for i, (lo, hi) in enumerate(pieces[1:], 1)]
        for w in workers:
            w.start()
        self.rt.ctx.pop()  # the first piece runs here, pushing the context as the others do
        try:
            piece(0, *pieces[0])
        finally:
            self.rt.ctx.push()
        for w in workers:
            w.join()
        if errors:
            err = next((e for e in errors if not isinstance(e, OSError)), errors[0])
            raise err
        t2 = time.perf_counter()
        from .. import phases

        end_at = phases.since_launch_ms()
        self.stats = {**self.stats, "mode": "register", "bytes": src.size, "threads": len(pieces),
                      "start_at": round(end_at - (t2 - t0) * 1e3, 2), "end_at": round(end_at, 2),
                      "upload_ms": round((t2 - t0) * 1e3, 2),
                      "pieces_register_copy_ms": times,
                      "GB_per_s": round(src.size / (t2 - t0) / 1e9, 2) if t2 > t0 else None}

    def _upload_staging(self, src):
        import numpy as np

        drv = self.rt.drv
        t0 = time.perf_counter()
        n = src.size
        stream = self.rt.upload_stream
        bufs = [drv.pagelocked_empty(min(CHUNK, n) or 1, np.uint8) for _ in range(N_STAGING)]
        events = [None] * N_STAGING
        t_alloc = time.perf_counter()
        off = 0
        i = 0
        ev = None
        while off < n:
            k = i % N_STAGING
            m = min(CHUNK, n - off)
            if events[k] is not None:
                events[k].synchronize()  # this staging buffer's last copy has finished
            np.copyto(bufs[k][:m], src[off:off + m])
            drv.memcpy_htod_async(self.base + off, bufs[k][:m], stream)
            ev = drv.Event()
            ev.record(stream)
            events[k] = ev
            off += m
            i += 1
        done = drv.Event()
        done.record(stream)
        done.synchronize()
        dt = time.perf_counter() - t0
        for b in bufs:
            b.base.free()
        del bufs, events, ev, done  # freed here, where the context is current
        self.stats = {**self.stats, "mode": "staging", "bytes": n, "upload_ms": round(dt * 1e3, 2),
                      "pinned_alloc_ms": round((t_alloc - t0) * 1e3, 2),
                      "GB_per_s": round(n / dt / 1e9, 2) if dt > 0 else None}

    def wait(self):
        """Block until the upload finished; raise its error as a ReflexError('cuda_error')."""
        if self._waited:
            return
        self._thread.join()
        self._waited = True
        if self.error is not None:
            from ..errors import ReflexError

            if getattr(self.error, "kind", None) == "gguf_error":
                raise ReflexError("gguf_error", f"weight upload failed: {self.error}")
            raise ReflexError("cuda_error", f"weight upload failed: {type(self.error).__name__}: "
                                            f"{self.error}")


class _PinnedLane:
    """One reader thread's side of the read upload (fileread.parallel_read's lane): the
    arena's context pushed on this thread, its own stream, two page-locked buffers of
    `chunk` bytes (halves of one allocation; one for the streaming upload, which waits for
    each copy) and an event per buffer for its last copy."""

    def __init__(self, arena, chunk, n_bufs=2):
        import numpy as np

        self.arena = arena
        self.drv = arena.rt.drv
        arena.rt.ctx.push()
        self.stream = None
        self.host = None
        self.bufs = []
        self.events = [None, None]
        try:
            self.stream = self.drv.Stream()
            self.host = self.drv.pagelocked_empty(n_bufs * chunk, np.uint8)  # one allocation, n_bufs parts
            self.bufs = [self.host[i * chunk:(i + 1) * chunk] for i in range(n_bufs)]
        except BaseException:
            self.close()
            raise

    def wait(self, k):
        if self.events[k] is not None:
            self.events[k].synchronize()

    def copy(self, k, skip, n, dst_off):
        self.drv.memcpy_htod_async(self.arena.base + dst_off, self.bufs[k][skip:skip + n], self.stream)
        ev = self.drv.Event()
        ev.record(self.stream)
        self.events[k] = ev

    def finish(self):
        self.stream.synchronize()

    def close(self):
        """Wait for this lane's copies, free its buffers and stream while the context is
        current, pop the context (also after an error)."""
        try:
            if self.stream is not None:
                self.stream.synchronize()  # no copy may still read a buffer freed below
            if self.host is not None:
                self.host.base.free()
        finally:
            self.host = None
            self.bufs = []
            self.events = [None, None]
            self.stream = None
            self.arena.rt.ctx.pop()
