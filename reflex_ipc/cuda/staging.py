"""A host staging buffer with its own stream, for one thread that copies host bytes into
device arrays (runtime/stateimport.py: the prefix store's pipelined import).

Made and closed on the thread that uses it: the constructor pushes the runtime's context
there, close() waits for the lane's copies, frees the buffer and the stream and pops it.
`buf` is page-locked when asked (every copy is then queued at once, also while a weight
upload keeps the copy engine busy), else pageable (the driver stages it; no page-locked
allocation to pay for). `wait()` before refilling `buf`: its last copies are done."""

import numpy as np


class StagingLane:
    def __init__(self, rt, nbytes, pinned):
        self.rt, self.drv = rt, rt.drv
        rt.ctx.push()
        self.stream = self.host = self.ev = None
        self.pinned = bool(pinned)
        try:
            self.stream = self.drv.Stream()
            n = max(int(nbytes), 1)
            self.host = self.drv.pagelocked_empty(n, np.uint8) if self.pinned else np.empty(n, np.uint8)
            self.buf = self.host
        except BaseException:
            self.close()
            raise

    def put_runs(self, src_off, dst_ptr, nbytes, count=1, src_step=0, dst_step=0):
        """Queue `count` copies of nbytes: buf[src_off + i*src_step:...] -> dst_ptr + i*dst_step."""
        for i in range(count):
            a = src_off + i * src_step
            self.drv.memcpy_htod_async(dst_ptr + i * dst_step, self.host[a:a + nbytes], self.stream)

    def fence(self):
        """Mark the end of the copies from the current contents of buf."""
        ev = self.drv.Event()
        ev.record(self.stream)
        self.ev = ev

    def wait(self):
        if self.ev is not None:
            self.ev.synchronize()
            self.ev = None

    def close(self):
        try:
            if self.stream is not None:
                self.stream.synchronize()  # no copy may still read the buffer freed below
            if self.host is not None and self.pinned:
                self.host.base.free()
        finally:
            self.host = self.buf = self.ev = self.stream = None
            self.rt.ctx.pop()
