"""Mapping a model file's pages before the first forward pass needs them, off the main thread.

A cold process that runs its first pass on the cpu backend reads every weight page of the
file mapping once; each first touch of a page is a page fault (the page is in the page cache,
but this process's page tables do not map it yet). `start(addr, nbytes)` asks the kernel to
map them all at once (madvise MADV_POPULATE_READ, Linux 5.14+; else MADV_WILLNEED, which only
reads ahead) on a daemon thread: ctypes releases the GIL for the call, so it runs beside the
main thread's imports, GGUF parse and tokenizer. Nothing waits for it: a page the first pass
reaches before the thread is a fault as before.
"""

from __future__ import annotations

import threading

MADV_WILLNEED = 3
MADV_POPULATE_READ = 22
PIECE = 64 << 20  # bytes per madvise call (a close() in between stops the rest)

_libc = None


def _madvise():
    global _libc
    if _libc is None:
        import ctypes

        lib = ctypes.CDLL(None, use_errno=True)
        fn = lib.madvise
        fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        fn.restype = ctypes.c_int
        _libc = fn
    return _libc


class Prefault:
    """The populating thread of one mapping's range; `stop()` before the mapping closes."""

    def __init__(self, addr, nbytes, page=4096):
        lo = addr // page * page
        self.lo, self.hi = lo, addr + nbytes
        self.stopped = False
        self.done = threading.Event()
        self.how = None
        self._t = threading.Thread(target=self._run, name="reflex-prefault", daemon=True)
        self._t.start()

    def _run(self):
        try:
            madvise = _madvise()
            how = MADV_POPULATE_READ
            a = self.lo
            while a < self.hi and not self.stopped:
                n = min(PIECE, self.hi - a)
                if madvise(a, n, how) != 0:
                    if how == MADV_POPULATE_READ:  # an older kernel: read ahead at least
                        how = MADV_WILLNEED
                        continue
                    break
                a += n
            self.how = "populate" if how == MADV_POPULATE_READ else "willneed"
        except Exception:  # noqa: BLE001  (an optimization: never an error)
            pass
        finally:
            self.done.set()

    def stop(self, wait=True):
        self.stopped = True
        if wait:
            self.done.wait()


def start(addr, nbytes):
    """Populate [addr, addr + nbytes) of a mapping on a thread; the Prefault (or None)."""
    if nbytes <= 0:
        return None
    try:
        return Prefault(int(addr), int(nbytes))
    except Exception:  # noqa: BLE001
        return None
