"""Exact string lookup in a GGUF string array without decoding the array.

A vocabulary of 150k tokens costs tens of milliseconds to turn into a Python
dict on a slow machine, and the cold path cannot afford it. `StrIndex` instead
hashes every string where it lies in the file mapping, with a handful of
vectorized numpy operations (the first 8 and last 8 bytes and the length), and
sorts the hashes once. A lookup hashes the query the same way, binary-searches
the sorted hashes, and compares the candidates' bytes with the query; results
are memoized, so the cost is paid once per distinct string asked for.

The sorted hashes of a file's arrays are kept in a small disk cache (one file
per array under $REFLEX_CACHE or ~/.cache/reflex-ipc/tokenizer, named by the
file's path, device, inode, size, mtime and the array's offset), so later
processes read them instead of hashing and sorting again. The name only finds
the entry; what makes it trusted is its header: the CRC-32 of the array's
bytes in the GGUF (so a file rewritten in place with the same size and mtime
is caught) and the CRC-32 of the cached hashes (so a corrupted or truncated
cache file is caught). Any mismatch means the index is built again and the
entry rewritten. Set REFLEX_TOKENIZER_CACHE=0 to disable it; any cache I/O
error just means no cache.
"""

from __future__ import annotations

import os
from bisect import bisect_left

import numpy as np

_M64 = (1 << 64) - 1
_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [_M64], dtype=np.uint64)
_P_HEAD = 0x9E3779B97F4A7C15
_P_LAST = 0xC2B2AE3D27D4EB4F
_P_LEN = 0x165667B19E3779F9


def _key(b: bytes) -> int:
    n = len(b)
    k = (int.from_bytes(b[:8], "little") * _P_HEAD) & _M64
    if n > 8:
        k ^= (int.from_bytes(b[-8:], "little") * _P_LAST) & _M64
    return k ^ ((n * _P_LEN) & _M64)


class StrIndex:
    """Lookup of byte strings in one GGUF string array (an `ArrayValue`).

    `first=True` answers the lowest index among equal strings, else the highest
    (llama.cpp keeps the first of duplicate merges and the last of duplicate
    tokens).
    """

    def __init__(self, mm, arr, first: bool, cache_file: str | None = None):
        self._mm = mm
        self._first = first
        self._memo: dict = {}
        # lists or numpy arrays, as the reader made them: lookups index single items
        self.starts = starts = arr.starts
        self.lengths = arr.lengths
        self._bits = max(1, (len(starts) - 1).bit_length())
        keys = None
        src_crc = None
        if cache_file is not None:
            src_crc = _source_crc(mm, arr)
            keys = _read_cache(cache_file, len(starts), src_crc)
        if keys is None:
            keys = self._build(mm)
            if cache_file is not None:
                _write_atomic(cache_file, keys, src_crc)
        self._skeys = keys
        # the CRC and the build read every string: drop those pages from the resident set
        # again (lookups map back the few they compare; the page cache keeps them all)
        _release(mm, arr.offset, arr.offset + arr.nbytes)
        # plain memoryviews: item access and bisect on them are several times
        # cheaper than numpy scalar indexing and searchsorted
        self._sk = memoryview(keys)
        self._st = _items(self.starts)
        self._ln = _items(self.lengths)

    def _build(self, mm):
        starts = np.asarray(self.starts, dtype=np.int64)
        lengths = np.asarray(self.lengths, dtype=np.int64)
        size = len(mm)
        if len(starts) == 0 or size < 8:
            return np.zeros(len(starts), dtype=np.uint64)
        # a little-endian u64 read at every byte offset (an overlapping view, no copy)
        u64 = np.ndarray(shape=(size - 7,), dtype="<u8", buffer=mm, offset=0, strides=(1,))
        if int(starts.max()) <= size - 8:
            head = u64[starts]
        else:  # strings in the file's last 8 bytes: read earlier and shift
            at = np.minimum(starts, size - 8)
            head = u64[at] >> ((starts - at) * 8).astype(np.uint64)
        keys = (head & _MASKS[np.minimum(lengths, 8)]) * np.uint64(_P_HEAD)
        keys ^= lengths.astype(np.uint64) * np.uint64(_P_LEN)
        long_ = np.flatnonzero(lengths > 8)
        if len(long_):
            keys[long_] ^= u64[starts[long_] + lengths[long_] - 8] * np.uint64(_P_LAST)
        # the array index rides in the low bits of each key, so a plain sort
        # (much faster than argsort) gives both the sorted keys and their owners
        low = np.uint64((1 << self._bits) - 1)
        keys = (keys & ~low) | np.arange(len(starts), dtype=np.uint64)
        keys.sort()
        return keys

    def find(self, b: bytes) -> int:
        """The index of `b` in the array, or -1."""
        got = self._memo.get(b)
        if got is not None:
            return got
        bits = self._bits
        hi = _key(b) >> bits
        sk, st, ln = self._sk, self._st, self._ln
        i = bisect_left(sk, hi << bits)
        best = -1
        n = len(b)
        mm = self._mm
        low = (1 << bits) - 1
        end = len(sk)
        while i < end:
            v = sk[i]
            if v >> bits != hi:
                break
            j = v & low
            s = st[j]
            if ln[j] == n and mm[s:s + n] == b:
                if best < 0 or (j < best if self._first else j > best):
                    best = j
            i += 1
        if len(self._memo) >= 1 << 17:
            self._memo.clear()
        self._memo[b] = best
        return best

    def get(self, i: int) -> bytes:
        s = self._st[i]
        return self._mm[s:s + self._ln[i]]


def _items(a):
    """Fast integer item access: a list as is, a numpy array as a memoryview (of its own
    integers: the reader's int32 offsets are not widened into a copy)."""
    if isinstance(a, list):
        return a
    a = np.asarray(a)
    if a.dtype not in (np.int32, np.int64):
        a = a.astype(np.int64)
    return memoryview(np.ascontiguousarray(a))


_MAGIC = b"RXSIDX02"
_HEADER = 32  # magic, count u64, source crc u32, keys crc u32, 8 bytes reserved


def _release(mm, start: int, end: int) -> None:
    """madvise(MADV_DONTNEED) the whole pages of mm[start:end] (a read-only file mapping: the
    pages leave this process's resident set and are read back from the page cache on use)."""
    import mmap

    a = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
    b = end // mmap.PAGESIZE * mmap.PAGESIZE
    if b > a and hasattr(mm, "madvise"):
        try:
            mm.madvise(mmap.MADV_DONTNEED, a, b - a)
        except (OSError, ValueError, AttributeError):
            pass  # advice only


def _source_crc(mm, arr) -> int:
    """CRC-32 of the array's bytes in the file (all its elements, lengths included)."""
    import zlib

    return zlib.crc32(memoryview(mm)[arr.offset:arr.offset + arr.nbytes])


def _read_cache(path: str, count: int, src_crc: int):
    """The cached sorted keys, or None when the entry is missing, of another array, or
    corrupt (any mismatch: magic, count, the source's CRC, the keys' CRC, the size)."""
    import struct
    import zlib

    import mmap

    # mapped, not read: after the check its pages leave the resident set, and a lookup's
    # bisection maps back the few it visits (Gemma-3's 262144 keys: 2 MB of a cold peak)
    try:
        with open(path, "rb") as fh:
            if os.fstat(fh.fileno()).st_size != _HEADER + 8 * count:
                return None
            data = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None
    if data[:8] != _MAGIC:
        return None
    n, scrc, kcrc = struct.unpack_from("<QII", data, 8)
    if n != count or scrc != src_crc:
        return None
    # the check reads the keys in pieces, each released after it (else all of them are
    # resident at once, on top of the mapped weights)
    crc, step, view = 0, 1 << 18, memoryview(data)
    for a in range(_HEADER, len(data), step):
        crc = zlib.crc32(view[a:a + step], crc)
        _release(data, a, a + step)
    view.release()
    if crc != kcrc:
        return None
    _release(data, 0, len(data))
    return np.frombuffer(data, dtype="<u8", offset=_HEADER, count=count)


def cache_file(f, arr, what: str) -> str | None:
    """The disk-cache file for the index of string array `arr` of GGUFFile `f`, or None."""
    from .. import settings

    if not settings.get().tokenizer_cache:
        return None
    try:
        st = os.stat(f.path)
    except OSError:
        return None
    import zlib

    path = os.path.realpath(f.path)
    ident = (f"{path}|{st.st_dev}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{arr.offset}|"
             f"{arr.count}|{what}|v2")
    from ..modelpath import cache_dir

    base = cache_dir()
    name = f"{os.path.basename(path)[:64]}.{what}.{zlib.crc32(ident.encode()):08x}.u64"
    return os.path.join(base, "tokenizer", name)


def _write_atomic(path: str, keys, src_crc: int) -> None:
    import struct
    import zlib

    body = np.ascontiguousarray(keys, dtype="<u8").tobytes()
    head = _MAGIC + struct.pack("<QII8x", len(keys), src_crc, zlib.crc32(body))
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "wb") as fh:
            fh.write(head)
            fh.write(body)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
