"""One device arena per GGUF file holding its whole tensor-data section, uploaded once.

GGUF stores all tensor data in one contiguous section, so the arena is one cuMemAlloc
of that section's size (resident VRAM = the weights' bytes in the file, plus at most
256 bytes), and a tensor's device address is arena + (its file offset - section start).
The upload runs on a background thread: it copies the mmap through two page-locked
staging buffers (pinned copies run at ~50 GB/s on the H200 host, pageable at ~7) and
issues the host-to-device copies on their own stream, so the upload overlaps the rest
of the load. `wait()` makes the compute stream wait for it (before the first kernel).
"""

import threading
import time

CHUNK = 32 << 20  # bytes per staging buffer
N_STAGING = 2


class WeightArena:
    def __init__(self, rt, gguf_file):
        self.rt = rt
        self.f = gguf_file
        self.start = gguf_file.data_offset
        end = max((t.offset + t.nbytes for t in gguf_file.tensors.values()), default=self.start)
        self.nbytes = max(end - self.start, 256)
        self.alloc = rt.drv.mem_alloc(self.nbytes)
        self.base = int(self.alloc)
        self.error = None
        self.stats = {}
        self._thread = threading.Thread(target=self._upload, name="reflex-cuda-upload", daemon=True)
        self._thread.start()
        self._waited = False

    def ptr(self, info):
        """Device address of a TensorInfo's data."""
        return self.base + (info.offset - self.start)

    def _upload(self):
        import numpy as np

        drv = self.rt.drv
        self.rt.ctx.push()
        try:
            t0 = time.perf_counter()
            src = np.frombuffer(self.f._mm, dtype=np.uint8, count=self.nbytes if
                                self.start + self.nbytes <= self.f.size else self.f.size - self.start,
                                offset=self.start)
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
            self.stats = {"bytes": n, "upload_ms": round(dt * 1e3, 2),
                          "pinned_alloc_ms": round((t_alloc - t0) * 1e3, 2),
                          "GB_per_s": round(n / dt / 1e9, 2) if dt > 0 else None}
        except BaseException as e:
            self.error = e
        finally:
            self.rt.ctx.pop()

    def wait(self):
        """Block until the upload finished; raise its error as a ReflexError('cuda_error')."""
        if self._waited:
            return
        self._thread.join()
        self._waited = True
        if self.error is not None:
            from ..errors import ReflexError

            raise ReflexError("cuda_error", f"weight upload failed: {type(self.error).__name__}: "
                                            f"{self.error}")
