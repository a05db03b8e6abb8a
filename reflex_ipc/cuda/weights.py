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
"""
import ctypes
import os
import threading
import time

from .. import settings

HOST_REGISTER_READ_ONLY = 0x08

CHUNK = 32 << 20  # bytes per staging buffer
N_STAGING = 2
RESIDENT_ENOUGH = 0.9  # auto: the sampled fraction of cached pages from which register is used
READ_THREADS = 8  # read: default threads (REFLEX_CUDA_UPLOAD_THREADS), each with two buffers
# read: MiB per pread and per copy: REFLEX_CUDA_UPLOAD_CHUNK_MB (settings.py, default 16)


class WeightArena:
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
            if mode == "read" and src.size:
                try:
                    self._upload_read(src)
                    return
                except Exception as e:  # noqa: BLE001 - a shrunk file is final; else the mapping's way
                    from .fileread import TruncatedError

                    if isinstance(e, TruncatedError):
                        from ..gguffile import GGUFError

                        raise GGUFError(str(e), path=self.f.path) from None
                    self.stats["read_error"] = f"{type(e).__name__}: {e}"
                    mode = "register"
            if mode == "register" and src.size:
                try:
                    self._upload_registered(src)
                    return
                except OSError as e:  # registration refused: fall back to staging
                    self.stats["register_error"] = str(e)
            self._upload_staging(src)
        except BaseException as e:
            self.error = e
        finally:
            self.stats = {**self.stats, **extra}
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
    `chunk` bytes (halves of one allocation) and an event per buffer for its last copy."""

    def __init__(self, arena, chunk):
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
            self.host = self.drv.pagelocked_empty(2 * chunk, np.uint8)  # one allocation, two halves
            self.bufs = [self.host[:chunk], self.host[chunk:]]
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
