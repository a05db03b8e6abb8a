"""A lazy, bounds-checked GGUF reader over mmap.

Opening a file parses the header, every metadata key/value and the tensor
directory, and nothing else: tensor data stays in the mapping until asked for.
Every length, count and offset is checked against the file before it is used,
so a truncated, corrupt or hostile file raises one GGUFError naming the field
and byte offset, never an IndexError, a hang or a huge allocation.

String arrays (a vocabulary, a merge list) are the slow part of GGUF: each
element carries its own length, so finding where the array ends means walking
it. Long arrays are walked in bulk (with numpy when it is already imported,
else with bytes.split) wherever the walk can be proved right, and string by
string elsewhere; the elements are decoded only when asked for.
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
import sys
from itertools import accumulate, repeat
from operator import add, itemgetter

from .ggml_types import BY_ID, type_name

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4

# metadata value types
T_UINT8, T_INT8, T_UINT16, T_INT16, T_UINT32, T_INT32, T_FLOAT32, T_BOOL = range(8)
T_STRING, T_ARRAY, T_UINT64, T_INT64, T_FLOAT64 = 8, 9, 10, 11, 12

_SCALAR = {
    T_UINT8: struct.Struct("<B"),
    T_INT8: struct.Struct("<b"),
    T_UINT16: struct.Struct("<H"),
    T_INT16: struct.Struct("<h"),
    T_UINT32: struct.Struct("<I"),
    T_INT32: struct.Struct("<i"),
    T_FLOAT32: struct.Struct("<f"),
    T_BOOL: struct.Struct("<?"),
    T_UINT64: struct.Struct("<Q"),
    T_INT64: struct.Struct("<q"),
    T_FLOAT64: struct.Struct("<d"),
}
_NP_DTYPE = {
    T_UINT8: "<u1", T_INT8: "<i1", T_UINT16: "<u2", T_INT16: "<i2", T_UINT32: "<u4",
    T_INT32: "<i4", T_FLOAT32: "<f4", T_BOOL: "<u1", T_UINT64: "<u8", T_INT64: "<i8",
    T_FLOAT64: "<f8",
}
VALUE_TYPE_NAMES = {
    T_UINT8: "uint8", T_INT8: "int8", T_UINT16: "uint16", T_INT16: "int16",
    T_UINT32: "uint32", T_INT32: "int32", T_FLOAT32: "float32", T_BOOL: "bool",
    T_STRING: "string", T_ARRAY: "array", T_UINT64: "uint64", T_INT64: "int64",
    T_FLOAT64: "float64",
}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_FAST_WALK_MIN = 2048  # string arrays shorter than this are walked in Python


class GGUFError(Exception):
    """A GGUF file that cannot be read. `field` and `offset` say where."""

    kind = "gguf_error"

    def __init__(self, message: str, field: str | None = None, offset: int | None = None,
                 path: str | None = None):
        self.field = field
        self.offset = offset
        self.path = path
        where = []
        if field is not None:
            where.append(f"field {field!r}")
        if offset is not None:
            where.append(f"byte offset {offset}")
        text = message + (f" ({', '.join(where)})" if where else "")
        if path:
            text = f"{path}: {text}"
        super().__init__(text)


class ArrayValue:
    """A metadata array, decoded on demand.

    `elem_type` is the GGUF value type of the elements, `count` their number,
    `offset` the byte offset of the first element. For string arrays `starts`
    and `lengths` locate each element's bytes in the file.
    """

    __slots__ = ("_f", "elem_type", "count", "offset", "nbytes", "_starts", "lengths", "_items")

    def __init__(self, f, elem_type, count, offset, nbytes, starts=None, lengths=None, items=None):
        self._f = f
        self.elem_type = elem_type
        self.count = count
        self.offset = offset
        self.nbytes = nbytes
        self._starts = starts
        self.lengths = lengths
        self._items = items  # nested arrays: list of ArrayValue, parsed eagerly

    @property
    def starts(self):
        """String arrays: the file offset of each element's bytes (computed on first use)."""
        if self._starts is None and self.lengths is not None:
            if self.count:
                self._starts = list(accumulate(map(add, self.lengths[:-1], repeat(8)),
                                               initial=self.offset + 8))
            else:
                self._starts = []
        return self._starts

    def __len__(self):
        return self.count

    def numpy(self):
        """Numeric arrays as a read-only numpy view of the file (no copy)."""
        import numpy as np

        if self.elem_type not in _NP_DTYPE:
            raise TypeError(f"array of {VALUE_TYPE_NAMES.get(self.elem_type)} has no numpy form")
        arr = np.frombuffer(self._f._mm, dtype=_NP_DTYPE[self.elem_type], count=self.count,
                            offset=self.offset)
        return arr.astype(bool) if self.elem_type == T_BOOL else arr

    def raw_strings(self) -> list[bytes]:
        """String arrays as a list of bytes objects."""
        if self.elem_type != T_STRING:
            raise TypeError("not a string array")
        mm = self._f._mm
        starts = self.starts.tolist() if hasattr(self.starts, "tolist") else self.starts
        lengths = self.lengths.tolist() if hasattr(self.lengths, "tolist") else self.lengths
        return [mm[a:a + n] for a, n in zip(starts, lengths)]

    def strings(self, errors: str = "replace") -> list[str]:
        return [b.decode("utf-8", errors) for b in self.raw_strings()]

    def tolist(self):
        if self.elem_type == T_STRING:
            return self.strings()
        if self.elem_type == T_ARRAY:
            return [a.tolist() for a in self._items]
        st = _SCALAR[self.elem_type]
        return [v[0] for v in st.iter_unpack(self._f._mm[self.offset:self.offset + self.nbytes])]

    def __repr__(self):
        return f"<ArrayValue {VALUE_TYPE_NAMES.get(self.elem_type)}[{self.count}] @ {self.offset}>"


class TensorInfo:
    __slots__ = ("name", "shape", "ggml_type", "offset", "nbytes", "n_elements")

    def __init__(self, name, shape, ggml_type, offset, nbytes, n_elements):
        self.name = name
        self.shape = shape  # ggml order: shape[0] is the contiguous (row) dimension
        self.ggml_type = ggml_type
        self.offset = offset  # absolute byte offset in the file
        self.nbytes = nbytes
        self.n_elements = n_elements

    @property
    def type_name(self) -> str:
        return type_name(self.ggml_type)

    def __repr__(self):
        return f"<Tensor {self.name} {self.type_name} {list(self.shape)} @ {self.offset}>"


class GGUFFile:
    """An open GGUF file. Use as a context manager, or call close()."""

    prefault = None  # prefault.Prefault populating the mapping's pages, when one was started

    def __init__(self, path: str):
        self.path = os.fspath(path)
        try:
            # O_NONBLOCK: opening a FIFO must not wait for a writer
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except (OSError, ValueError) as e:
            raise GGUFError(f"cannot open: {getattr(e, 'strerror', None) or e}",
                            path=self.path) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise GGUFError("not a regular file", path=self.path)
            self.size = st.st_size
            self.file_id = (st.st_dev, st.st_ino)  # what a reader that opens the path again checks
            if self.size < 24:
                raise GGUFError(f"file is {self.size} bytes, too short for a GGUF header",
                                field="header", offset=0, path=self.path)
            from . import prefault

            pre = prefault.take(self.path, st) if prefault._premapped else None
            if pre is not None:  # mapped (and being populated) by the CLI before numpy's import
                self._mm, self.prefault = pre
            else:
                try:
                    self._mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
                except (OSError, ValueError) as e:  # sysfs and the like cannot be mapped
                    raise GGUFError(f"cannot map: {getattr(e, 'strerror', None) or e}",
                                    path=self.path) from None
        finally:
            os.close(fd)
        try:
            self._parse()
        except GGUFError as e:
            if e.path is None:
                e.path = self.path
                e.args = (f"{self.path}: {e.args[0]}",)
            self.close()
            raise
        except Exception:
            self.close()
            raise

    def release_metadata(self):
        """Drop this process's pages of the metadata (keys and the tokenizer's arrays, before
        the tensor data) from its resident set, once they are parsed: they stay in the page
        cache, and a later read (the lazy tokenizer's) maps them back. For Gemma-3's 262144
        tokens that is 6.5 MB of a cold process's peak."""
        import mmap

        end = (getattr(self, "data_offset", 0) or 0) // mmap.PAGESIZE * mmap.PAGESIZE
        if self._mm is not None and end > 0 and hasattr(self._mm, "madvise"):
            try:
                self._mm.madvise(mmap.MADV_DONTNEED, 0, end)
            except (OSError, ValueError, AttributeError):
                pass  # advice only

    # -- bounds-checked primitives -------------------------------------------------
    def _need(self, off, n, field):
        if n < 0 or off + n > self.size:
            raise GGUFError(f"needs {n} bytes but the file ends at {self.size}", field, off)

    def _u32(self, off, field):
        self._need(off, 4, field)
        return _U32.unpack_from(self._mm, off)[0]

    def _u64(self, off, field):
        self._need(off, 8, field)
        return _U64.unpack_from(self._mm, off)[0]

    def _string(self, off, field):
        n = self._u64(off, field)
        self._need(off + 8, n, field)
        raw = self._mm[off + 8:off + 8 + n]
        try:
            return raw.decode("utf-8"), off + 8 + n
        except UnicodeDecodeError:
            raise GGUFError("string is not valid UTF-8", field, off) from None

    # -- parsing -----------------------------------------------------------------
    def _parse(self):
        mm = self._mm
        if mm[:4] != GGUF_MAGIC:
            raise GGUFError(f"bad magic {bytes(mm[:4])!r}, not a GGUF file", "magic", 0)
        version = _U32.unpack_from(mm, 4)[0]
        if version not in (2, 3):
            if version & 0xFFFF == 0 and version != 0:
                raise GGUFError("big-endian GGUF files are not supported", "version", 4)
            raise GGUFError(f"unsupported GGUF version {version} (2 and 3 are)", "version", 4)
        self.version = version
        n_tensors = self._u64(8, "tensor_count")
        n_kv = self._u64(16, "kv_count")
        off = 24
        # each key/value needs at least 8 (key length) + 4 (type) + 1 bytes; each tensor 24
        if n_kv * 13 > self.size - off:
            raise GGUFError(f"kv_count {n_kv} cannot fit in the file", "kv_count", 16)
        if n_tensors * 24 > self.size - off:
            raise GGUFError(f"tensor_count {n_tensors} cannot fit in the file", "tensor_count", 8)

        meta: dict = {}
        self.value_types: dict = {}
        for i in range(n_kv):
            key, off2 = self._string(off, f"kv[{i}].key")
            if key in meta:
                raise GGUFError(f"duplicate metadata key {key!r}", key, off)
            vtype = self._u32(off2, key)
            value, off = self._value(vtype, off2 + 4, key, depth=0)
            meta[key] = value
            self.value_types[key] = vtype
        self.metadata = meta

        align = meta.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(align, int) or isinstance(align, bool) or align <= 0 or align & (align - 1):
            raise GGUFError(f"alignment {align!r} is not a positive power of two", "general.alignment")
        self.alignment = align

        infos = []
        names = set()
        for i in range(n_tensors):
            field = f"tensor[{i}]"
            name, off = self._string(off, field + ".name")
            if name in names:
                raise GGUFError(f"duplicate tensor name {name!r}", field, off)
            names.add(name)
            n_dims = self._u32(off, name + ".n_dims")
            if n_dims > MAX_DIMS:
                raise GGUFError(f"{n_dims} dimensions (at most {MAX_DIMS})", name + ".n_dims", off)
            off += 4
            self._need(off, 8 * n_dims + 12, name)
            dims = struct.unpack_from(f"<{n_dims}Q", self._mm, off)
            off += 8 * n_dims
            ttype = _U32.unpack_from(self._mm, off)[0]
            rel = _U64.unpack_from(self._mm, off + 4)[0]
            off += 12
            n_el = 1
            for d in dims:
                n_el *= d
            if n_el > self.size * 8 + 1:  # no tensor type packs more than 8 elements a byte
                raise GGUFError(f"shape {list(dims)} is larger than the file", name + ".shape", off)
            entry = BY_ID.get(ttype)
            if entry is None:
                raise GGUFError(f"unknown tensor type {ttype}", name + ".type", off - 12)
            _, blk, bsize = entry
            if (dims[0] if dims else n_el) % blk:
                raise GGUFError(f"row of {dims[0] if dims else n_el} elements is not a multiple "
                                f"of the {type_name(ttype)} block of {blk}", name + ".shape", off)
            if rel % align:
                raise GGUFError(f"data offset {rel} is not aligned to {align}", name + ".offset", off - 8)
            infos.append((name, tuple(dims), ttype, rel, n_el // blk * bsize, n_el))
        self.tensor_info_end = off
        self.data_offset = (off + align - 1) // align * align
        tensors = {}
        for name, dims, ttype, rel, nbytes, n_el in infos:
            start = self.data_offset + rel
            if start + nbytes > self.size:
                raise GGUFError(f"data [{start}, {start + nbytes}) runs past the end of the file "
                                f"({self.size} bytes): truncated?", name + ".data", start)
            tensors[name] = TensorInfo(name, dims, ttype, start, nbytes, n_el)
        self.tensors = tensors

    def _value(self, vtype, off, field, depth):
        st = _SCALAR.get(vtype)
        if st is not None:
            self._need(off, st.size, field)
            return st.unpack_from(self._mm, off)[0], off + st.size
        if vtype == T_STRING:
            return self._string(off, field)
        if vtype == T_ARRAY:
            return self._array(off, field, depth)
        raise GGUFError(f"unknown metadata value type {vtype}", field, off - 4)

    def _array(self, off, field, depth):
        if depth > 8:
            raise GGUFError("arrays nested more than 8 deep", field, off)
        etype = self._u32(off, field + ".type")
        count = self._u64(off + 4, field + ".count")
        start = off + 12
        st = _SCALAR.get(etype)
        if st is not None:
            nbytes = count * st.size
            self._need(start, nbytes, field)
            return ArrayValue(self, etype, count, start, nbytes), start + nbytes
        if etype == T_STRING:
            if count * 8 > self.size - start:
                raise GGUFError(f"{count} strings cannot fit in the file", field + ".count", off + 4)
            starts, lengths, end = self._walk_strings(start, count, field)
            return ArrayValue(self, etype, count, start, end - start, starts, lengths), end
        if etype == T_ARRAY:
            if count * 12 > self.size - start:
                raise GGUFError(f"{count} arrays cannot fit in the file", field + ".count", off + 4)
            items = []
            pos = start
            for i in range(count):
                item, pos = self._array(pos, f"{field}[{i}]", depth + 1)
                items.append(item)
            return ArrayValue(self, etype, count, start, pos - start, items=items), pos
        raise GGUFError(f"unknown array element type {etype}", field + ".type", off)

    def _walk_strings(self, start, count, field):
        """(starts or None, lengths, end) of `count` length-prefixed strings from `start`."""
        if count >= _FAST_WALK_MIN:
            return _bulk_walk()(self._mm, start, count, self.size, field)
        starts = [0] * count
        lengths = [0] * count
        end = _walk_strings_slow(self._mm, start, 0, count, count, self.size, field, starts, lengths)
        return starts, lengths, end

    # -- access ------------------------------------------------------------------
    @property
    def architecture(self) -> str | None:
        return self.metadata.get("general.architecture")

    def get(self, key, default=None):
        """A metadata value; arrays come back as Python lists."""
        v = self.metadata.get(key, default)
        return v.tolist() if isinstance(v, ArrayValue) else v

    def arch_get(self, suffix, default=None):
        """`{architecture}.{suffix}`, e.g. arch_get('block_count')."""
        return self.get(f"{self.architecture}.{suffix}", default)

    def tensor_data(self, name_or_info):
        """The tensor's raw bytes as a read-only numpy uint8 view of the mapping."""
        import numpy as np

        t = name_or_info if isinstance(name_or_info, TensorInfo) else self.tensors[name_or_info]
        return np.frombuffer(self._mm, dtype=np.uint8, count=t.nbytes, offset=t.offset)

    def identity(self) -> str:
        """The model's identity: a digest (BLAKE2b, 128 bits, hex) of everything before the
        tensor data — the header, every metadata key and value, the tensor directory (names,
        shapes, types, offsets). Two files with the same identity hold the same model
        description; the weights' bytes are not read (cheap: a few ms for a large vocabulary)."""
        import hashlib

        ident = getattr(self, "_identity", None)
        if ident is None:
            ident = self._identity = hashlib.blake2b(self._mm[:self.data_offset], digest_size=16).hexdigest()
        return ident

    def bytes_view(self, start, nbytes):
        """Bytes start..start+nbytes of the file (clipped to its end) as a read-only numpy
        uint8 view of the mapping (e.g. a run of tensors to upload in one copy)."""
        import numpy as np

        start = max(0, min(int(start), self.size))
        return np.frombuffer(self._mm, dtype=np.uint8, count=max(0, min(int(nbytes), self.size - start)),
                             offset=start)

    def close(self):
        pf = getattr(self, "prefault", None)
        if pf is not None:  # its thread reads the mapping: let it stop first
            pf.stop()
            self.prefault = None
        mm = getattr(self, "_mm", None)
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # numpy views still reference it; the mapping goes with them
            self._mm = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _walk_strings_slow(mm, pos, i, stop, count, size, field, starts, lengths):
    """Walk strings i..stop-1 one by one from pos, filling starts (unless None) and lengths.

    Returns the end."""
    up = _U64.unpack_from
    for i in range(i, stop):
        if pos + 8 > size:
            raise GGUFError(f"string {i} of {count}: length runs past the end of the file",
                            field, pos)
        n = up(mm, pos)[0]
        if n > size - pos - 8:
            raise GGUFError(f"string {i} of {count}: length {n} runs past the end of the file",
                            field, pos)
        if starts is not None:
            starts[i] = pos + 8
        lengths[i] = n
        pos += 8 + n
    return pos


# The fast walks (below) speculate that a run of strings has lengths 1..255 and
# no zero bytes, so that each length field is a byte 1..255 followed by seven
# zero bytes, and then prove it: if a position known to be a length field is
# followed, string after string, by the next such pattern exactly where the
# string ends, each of those positions is a length field (by induction: each
# length read is the true one, so each next position is the true one). Where
# the chain breaks (an empty string, one of 256 bytes or more, zero bytes
# inside a string) the walk goes on string by string from the last proven
# position, in bursts that grow while the fast steps keep failing, so no input
# costs much more than the plain loop. Each step looks at a bounded window of
# the file, whatever the counts say.
_WALK_WINDOW = 1 << 18
_WALK_BURST_MAX = 1 << 12
_Z7 = bytes(7)
_PLUS_ONE = bytes((b + 1) & 255 for b in range(256))


def _bulk_walk():
    """numpy's walk is the fastest, but importing numpy costs more than it saves when
    nothing else needs it (reflex inspect): use it only when it is already loaded.
    A process that will load a model can import numpy first."""
    return _walk_strings_numpy if "numpy" in sys.modules else _walk_strings_split


def _walk_in_bursts(mm, start, count, size, field, starts, lengths, fast):
    """The loop both fast walks share. fast(pos, i, window) proves k >= 0 strings starting
    at pos, fills starts/lengths[i:i + k] and returns (k, the position after them). Where
    it proves fewer than 64, a burst of strings goes string by string, the bursts doubling
    while the fast steps keep failing. Returns the position after the last string."""
    pos, i, burst = start, 0, 16
    while i < count:
        window = min(size - pos, _WALK_WINDOW, (count - i) * 64 + 64)
        k = 0
        if window >= 9:
            k, pos = fast(pos, i, window)
            i += k
        if i < count and k < 64:
            stop = min(count, i + burst)
            pos = _walk_strings_slow(mm, pos, i, stop, count, size, field, starts, lengths)
            i = stop
            burst = min(2 * burst, _WALK_BURST_MAX)
        elif k >= 64:
            burst = 16
    return pos


def _walk_strings_numpy(mm, start, count, size, field):
    """The fast walk in numpy: candidates are where a u64 read at any byte is 1..255."""
    import numpy as np

    # int32 where every offset fits (half the memory: Gemma-3's 262144 tokens take 2 MB instead
    # of 4 in a cold process's peak)
    itype = np.int32 if size < 2**31 else np.int64
    starts = np.empty(count, itype)
    lengths = np.empty(count, itype)

    def fast(pos, i, window):
        b = np.frombuffer(mm, dtype=np.uint8, count=window, offset=pos)
        # a u64 read at every byte offset: an overlapping unaligned view, no copy
        v64 = np.ndarray(shape=(window - 7,), dtype="<u8", buffer=b, strides=(1,))
        # 1..255 as two compares into booleans (no 8-byte-per-position temporary: the walk's
        # transients stay a few hundred KB, which a cold process's heap then keeps)
        cand = np.flatnonzero((v64 < 256) & (b[:window - 7] != 0))
        if not len(cand) or cand[0] != 0:
            return 0, pos
        ends = cand + 8 + b[cand]
        brk = np.flatnonzero(ends[:-1] != cand[1:])
        k = min(int(brk[0]) + 1 if len(brk) else len(cand), count - i)
        end = pos + int(ends[k - 1])
        if end > size:  # only the last string can reach past the window
            raise GGUFError(f"string {i + k - 1} of {count}: length {int(b[cand[k - 1]])} "
                            f"runs past the end of the file", field, pos + int(cand[k - 1]))
        starts[i:i + k] = cand[:k] + (pos + 8)
        lengths[i:i + k] = b[cand[:k]]
        return k, end

    pos = _walk_in_bursts(mm, start, count, size, field, starts, lengths, fast)
    return starts, lengths, pos


def _walk_strings_split(mm, start, count, size, field):
    """The fast walk without numpy: bytes.split on seven zero bytes, checked in bulk.

    Splitting a window on b"\\0" * 7 gives piece 0 = the low byte of the first
    length, then piece k = string k-1 followed by the low byte of length k. The
    chain holds while each piece is one byte longer than the length byte that
    ends the piece before it. Returns (None, lengths, end): ArrayValue computes
    the starts from the lengths when they are wanted.
    """
    lengths = [0] * count

    def fast(pos, i, window):
        data = mm[pos:pos + window]
        pieces = data.split(_Z7, count - i)
        n = len(pieces) - 1  # separators found: at most count - i
        if not n or len(pieces[0]) != 1 or not data[0]:
            return 0, pos
        lens = list(map(len, pieces))
        # where the length bytes are if the chain holds: p[0] = 0, p[j] = p[j-1] + 7 + lens[j]
        p = list(accumulate(map(add, lens[1:n], repeat(7)), initial=0))
        low = bytes(itemgetter(*p)(data)) if n > 1 else data[:1]
        got, want = lens[1:n], list(low.translate(_PLUS_ONE)[:n - 1])
        if got == want:
            k = n
        else:  # the first j with got[j] != want[j], by bisection
            lo, hi = 0, n - 1
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if got[lo:mid] == want[lo:mid]:
                    lo = mid
                else:
                    hi = mid
            k = lo + 1
        k = min(k, n)
        zero = low.find(0, 0, k)
        if zero >= 0:
            k = zero
        if not k:
            return 0, pos
        end = pos + p[k - 1] + 8 + low[k - 1]
        if end > size:  # only the last string can reach past the window
            raise GGUFError(f"string {i + k - 1} of {count}: length {low[k - 1]} runs "
                            f"past the end of the file", field, pos + p[k - 1])
        lengths[i:i + k] = low[:k]
        return k, end

    pos = _walk_in_bursts(mm, start, count, size, field, None, lengths, fast)
    return None, lengths, pos
