"""Mapping a model file's pages before the first forward pass needs them, off the main thread.

A cold process that runs its first pass on the cpu backend reads every weight page of the
file mapping once; each first touch of a page is a page fault (the page is in the page cache,
but this process's page tables do not map it yet). `start(addr, nbytes)` asks the kernel to
map them all at once (madvise MADV_POPULATE_READ, Linux 5.14+; else MADV_WILLNEED, which only
reads ahead) on a daemon thread: ctypes releases the GIL for the call, so it runs beside the
main thread's imports, GGUF parse and tokenizer. Nothing waits for it: a page the first pass
reaches before the thread is a fault as before. `premap(path)` starts it before numpy is even
imported (the CLI): GGUFFile takes that mapping (`take`) instead of making its own.
"""

from __future__ import annotations

import os
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


def address(obj):
    """The address of a buffer object's memory (e.g. a read-only mmap) without numpy: the
    buffer protocol through ctypes.pythonapi, the buffer released at once (the object keeps
    the memory; the caller keeps the object)."""
    import ctypes

    class Buf(ctypes.Structure):  # Py_buffer
        _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p), ("len", ctypes.c_ssize_t),
                    ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                    ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                    ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]

    api = ctypes.pythonapi
    get, release = api.PyObject_GetBuffer, api.PyBuffer_Release
    get.argtypes, get.restype = (ctypes.py_object, ctypes.POINTER(Buf), ctypes.c_int), ctypes.c_int
    release.argtypes, release.restype = (ctypes.POINTER(Buf),), None
    b = Buf()
    if get(obj, ctypes.byref(b), 0) != 0:
        raise BufferError("no buffer")
    try:
        return b.buf, b.len
    finally:
        release(ctypes.byref(b))


_premapped = {}  # path -> (identity, mmap, Prefault): premap()'s, until GGUFFile takes one


def _identity(st):
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def premap(path):
    """Map a model file and start populating all of it now, before numpy is imported and the
    GGUF parsed (the CLI, once it knows the cpu backend will run): GGUFFile(path) then takes
    this mapping (take()) instead of making its own. Never an error: a file that cannot be
    mapped is left to GGUFFile to report."""
    import mmap
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError):
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size < 24:
            return None
        mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    try:
        addr, n = address(mm)
    except Exception:  # noqa: BLE001
        mm.close()
        return None
    pf = start(addr, n)
    _premapped[os.path.abspath(path)] = (_identity(st), mm, pf)
    return pf


def take(path, st):
    """(mmap, Prefault) premapped for `path` when the file is still the one mapped (same
    device, inode, size and mtime as `st`), else None (a stale one is closed)."""
    e = _premapped.pop(os.path.abspath(path), None)
    if e is None:
        return None
    ident, mm, pf = e
    if ident != _identity(st):
        if pf is not None:
            pf.stop()
        mm.close()
        return None
    return mm, pf


def start(addr, nbytes):
    """Populate [addr, addr + nbytes) of a mapping on a thread; the Prefault (or None)."""
    if nbytes <= 0:
        return None
    try:
        return Prefault(int(addr), int(nbytes))
    except Exception:  # noqa: BLE001
        return None
