"""Saved state files: a model's state after some tokens, written to disk and read back.

The format is described in protocol/STATE.md (version 1). In short, all integers
little-endian:

    fixed header (60 bytes)
      0   8  magic b"RFLXSTAT"
      8   4  u32 format version (1)
     12   4  u32 header size H: bytes from 0 to the end of the header CRC
     16  16  model identity: GGUFFile.identity() (BLAKE2b-128 of everything before the
             tensor data: header, metadata, tensor directory), as bytes
     32  16  adapter digest: 16 zero bytes without LoRA adapters (`adapter_digest`)
     48   4  u32 n_tokens
     52   4  u32 n_layers
     56   2  u16 A, the architecture name's length
     58   2  u16 reserved (0)
    then     A bytes architecture (UTF-8)
    then per layer: u8 kind (0 slot, 1 seq), u8 n_arrays, and per array:
             u8 name length, name (ASCII), u8 dtype (0 float32, 1 float16),
             u8 ndim, u8 slot axis (255 for seq arrays), u32 x ndim shape,
             u64 offset (from the file's start, a multiple of 64), u64 nbytes
    then     u32 CRC-32 of the token ids' bytes, u32 CRC-32 of header bytes [0, H - 4)
    token ids: int32 x n_tokens at align64(H)
    arrays: each at its offset, C order, in the dtype given

`write_state` writes atomically (a temporary file in the target's directory,
fsync, rename over the target, fsync of the directory). `StateFile` maps a file,
checks its structure (anything malformed raises ReflexError("state_error")) and
`restore`s it into a runtime.state.State through `ops.write` on views of the
mapping (converting float16 <-> float32 as the state needs).
"""

from __future__ import annotations

import os
import struct

from ..errors import ReflexError

MAGIC = b"RFLXSTAT"
VERSION = 1
ALIGN = 64
FIXED = struct.Struct("<8sII16s16sIIHH")  # 60 bytes
MAX_HEADER = 16 << 20
MAX_NDIM = 8
DTYPES = {0: "float32", 1: "float16"}
DTYPE_CODES = {v: k for k, v in DTYPES.items()}
KINDS = {0: "slot", 1: "seq"}
KIND_CODES = {v: k for k, v in KINDS.items()}
NO_AXIS = 255
ZERO_DIGEST = bytes(16)


def _align(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _bad(path, msg):
    return ReflexError("state_error", f"{path}: {msg}")


def model_digest(f) -> bytes:
    """A GGUFFile's identity (GGUFFile.identity(): BLAKE2b-128 of its bytes before the tensor
    data: header, metadata, tensor directory) as 16 bytes. Two files with equal digests
    describe the same tensors with the same metadata; the tensor data is not read."""
    return bytes.fromhex(f.identity())


def adapter_digest(adapters) -> bytes:
    """For [(adapter model digest, scale)] in load order: BLAKE2b-128 over each digest and
    its scale (float64, little-endian); 16 zero bytes for none."""
    if not adapters:
        return ZERO_DIGEST
    import hashlib

    h = hashlib.blake2b(digest_size=16)
    for digest, scale in adapters:
        h.update(digest)
        h.update(struct.pack("<d", float(scale)))
    return h.digest()


def resolve_path(path) -> str:
    """A state path as given by a client: ~ expanded, made absolute (like model paths)."""
    if not isinstance(path, str) or not path:
        raise ReflexError("invalid_request", "a state path must be a non-empty string")
    return os.path.abspath(os.path.expanduser(path))


# -- writing -----------------------------------------------------------------------------
def encode_header(*, digest, adapters_digest, arch, tokens, layers):
    """(header bytes, [(offset, array)] to write, total file size). layers: [(kind,
    [(name, numpy array, slot axis or None)])]."""
    import zlib

    import numpy as np

    arch_b = arch.encode("utf-8")
    n = len(tokens)
    body = bytearray(arch_b)
    entries = []  # (position of the offset field in body, array)
    for kind, arrays in layers:
        body += struct.pack("<BB", KIND_CODES[kind], len(arrays))
        for name, a, axis in arrays:
            nb = name.encode("ascii")
            if a.dtype.name not in DTYPE_CODES:
                raise ValueError(f"{name}: dtype {a.dtype} cannot be saved")
            body += struct.pack("<B", len(nb)) + nb
            body += struct.pack("<BBB", DTYPE_CODES[a.dtype.name], a.ndim, NO_AXIS if axis is None else axis)
            body += struct.pack(f"<{a.ndim}I", *a.shape)
            entries.append((len(body), a))
            body += struct.pack("<QQ", 0, a.nbytes)
    H = FIXED.size + len(body) + 8
    tok = np.asarray(tokens, dtype="<i4")
    pos = _align(H) + tok.nbytes
    out = []
    for field, a in entries:
        pos = _align(pos)
        struct.pack_into("<Q", body, field, pos)
        out.append((pos, a))
        pos += a.nbytes
    head = FIXED.pack(MAGIC, VERSION, H, digest, adapters_digest, n, len(layers), len(arch_b), 0) + bytes(body)
    head += struct.pack("<I", zlib.crc32(tok.tobytes()))
    head += struct.pack("<I", zlib.crc32(head))
    assert len(head) == H
    return head, tok, out, pos


def write_state(path, *, digest, adapters_digest, arch, tokens, layers) -> int:
    """Write a state file atomically; returns its size in bytes. path must be absolute."""
    import tempfile

    head, tok, arrays, size = encode_header(digest=digest, adapters_digest=adapters_digest, arch=arch,
                                            tokens=tokens, layers=layers)
    d, base = os.path.split(path)
    if os.path.isdir(path):
        raise ReflexError("state_error", f"{path} is a directory")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=".tmp", dir=d)
    except OSError as e:
        raise ReflexError("state_error", f"cannot write in {d}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(head)
            fh.write(bytes(_align(len(head)) - len(head)))
            fh.write(tok.tobytes())
            at = _align(len(head)) + tok.nbytes
            for off, a in arrays:
                fh.write(bytes(off - at))
                fh.write(memoryview(a.reshape(-1)).cast("B"))
                at = off + a.nbytes
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise ReflexError("state_error", f"cannot write {path}: {e.strerror or e}") from None
        raise
    try:
        dfd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass  # the rename is done; a directory that cannot be fsynced is not an error
    return size


# -- reading -----------------------------------------------------------------------------
class ArrayEntry:
    __slots__ = ("name", "dtype", "shape", "slot_axis", "offset", "nbytes")

    def __init__(self, name, dtype, shape, slot_axis, offset, nbytes):
        self.name, self.dtype, self.shape = name, dtype, shape
        self.slot_axis, self.offset, self.nbytes = slot_axis, offset, nbytes


class StateFile:
    """A mapped, structurally checked state file. Attributes: path, version, digest,
    adapters_digest, arch, n_tokens, tokens (list of int), layers ([(kind, [ArrayEntry])]),
    size. Use as a context manager or close()."""

    def __init__(self, path):
        import mmap

        self.path = path
        self._mm = None
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise ReflexError("state_error", f"no such state file: {path}") from None
        except OSError as e:
            raise ReflexError("state_error", f"cannot open {path}: {e.strerror or e}") from None
        try:
            import stat

            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise _bad(path, "not a regular file")
            self.size = st.st_size
            if self.size < FIXED.size:
                raise _bad(path, f"{self.size} bytes: too short for a state file header (truncated?)")
            self._mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        try:
            self._parse()
        except BaseException:
            self.close()
            raise

    def _parse(self):
        import zlib

        import numpy as np

        mm, path = self._mm, self.path
        magic, ver, H, digest, adig, n, n_layers, alen, _ = FIXED.unpack_from(mm, 0)
        if magic != MAGIC:
            raise _bad(path, "not a reflex state file (bad magic)")
        if ver != VERSION:
            raise _bad(path, f"state format version {ver} is not supported (this reflex reads {VERSION})")
        if not FIXED.size + 8 <= H <= min(self.size, MAX_HEADER):
            raise _bad(path, f"header size {H} is impossible for a file of {self.size} bytes (truncated?)")
        (crc,) = struct.unpack_from("<I", mm, H - 4)
        if zlib.crc32(mm[:H - 4]) != crc:
            raise _bad(path, "header checksum mismatch (corrupt file)")
        self.version, self.digest, self.adapters_digest = ver, digest, adig
        self.n_tokens = n
        pos = FIXED.size
        try:
            self.arch = bytes(mm[pos:pos + alen]).decode("utf-8")
            pos += alen
            layers = []
            for _ in range(n_layers):
                kind, n_arr = struct.unpack_from("<BB", mm, pos)
                pos += 2
                if kind not in KINDS:
                    raise _bad(path, f"unknown layer state kind {kind}")
                arrays = []
                for _ in range(n_arr):
                    (ln,) = struct.unpack_from("<B", mm, pos)
                    name = bytes(mm[pos + 1:pos + 1 + ln]).decode("ascii")
                    pos += 1 + ln
                    dt, ndim, axis = struct.unpack_from("<BBB", mm, pos)
                    pos += 3
                    if dt not in DTYPES:
                        raise _bad(path, f"array {name!r}: unknown dtype code {dt}")
                    if not 1 <= ndim <= MAX_NDIM:
                        raise _bad(path, f"array {name!r}: {ndim} dimensions")
                    shape = struct.unpack_from(f"<{ndim}I", mm, pos)
                    pos += 4 * ndim
                    off, nbytes = struct.unpack_from("<QQ", mm, pos)
                    pos += 16
                    arrays.append(ArrayEntry(name, DTYPES[dt], tuple(shape),
                                             None if axis == NO_AXIS else axis, off, nbytes))
                layers.append((KINDS[kind], arrays))
        except (struct.error, UnicodeDecodeError) as e:
            raise _bad(path, f"malformed header ({e})") from None
        if pos != H - 8:
            raise _bad(path, f"header size {H} does not match its contents ({pos + 8} bytes)")
        # token ids
        t0 = _align(H)
        if t0 + 4 * n > self.size:
            raise _bad(path, f"{self.size} bytes cannot hold {n} token ids (truncated)")
        tok = np.frombuffer(mm, dtype="<i4", count=n, offset=t0)
        (tcrc,) = struct.unpack_from("<I", mm, H - 8)
        if zlib.crc32(tok.tobytes()) != tcrc:
            raise _bad(path, "token ids checksum mismatch (corrupt file)")
        if n and int(tok.min()) < 0:
            raise _bad(path, f"negative token id {int(tok.min())}")
        self.tokens = tok.tolist()
        del tok
        # arrays: well-formed, in bounds, not overlapping the ids or each other
        end = t0 + 4 * n
        for kind, arrays in layers:
            for e in arrays:
                what = f"array {e.name!r}"
                if kind == "slot":
                    if e.slot_axis is None or e.slot_axis >= len(e.shape):
                        raise _bad(path, f"{what}: a slot array without a slot axis")
                    if e.shape[e.slot_axis] != n:
                        raise _bad(path, f"{what}: {e.shape[e.slot_axis]} slots for {n} tokens")
                elif e.slot_axis is not None:
                    raise _bad(path, f"{what}: a per-sequence array with a slot axis")
                item = 4 if e.dtype == "float32" else 2
                want = item
                for s in e.shape:
                    want *= s
                if e.nbytes != want:
                    raise _bad(path, f"{what}: {e.nbytes} bytes for shape {e.shape} {e.dtype}")
                if e.offset % ALIGN or e.offset < end:
                    raise _bad(path, f"{what}: bad offset {e.offset}")
                if e.offset + e.nbytes > self.size:
                    raise _bad(path, f"{what} ends at {e.offset + e.nbytes}, past the end of the file "
                               f"({self.size} bytes: truncated)")
                end = e.offset + e.nbytes
        self.layers = layers

    def array(self, e):
        """A read-only numpy view of an entry's data in the mapping."""
        return _view(self._mm, e, 0)

    def data_span(self):
        """(first byte, end) of the array data."""
        offs = [(e.offset, e.offset + e.nbytes) for _, arrays in self.layers for e in arrays]
        return (min(o for o, _ in offs), max(e for _, e in offs)) if offs else (0, 0)

    def restore(self, state, *, pinned=None):
        """Write the saved arrays into `state` (a runtime.state.State with at least n_tokens
        slots and the same layer layout: checked by the caller) and set its tokens. On a
        backend with page-locked host memory (CUDA) the data goes through one page-locked
        buffer when `pinned` (default: $REFLEX_STATE_PINNED, off unless "1": on the H200 the
        copy into that buffer cost more than the asynchronous upload saved, bench/README.md)."""
        from .state import _write_slots

        ops, n = state.ops, self.n_tokens
        src = self._mm
        base = 0
        buf = None
        if pinned is None:
            from .. import settings

            pinned = settings.get().state_pinned
        drv = getattr(getattr(ops, "rt", None), "drv", None)
        if pinned and drv is not None and hasattr(drv, "pagelocked_empty"):
            import numpy as np

            lo, hi = self.data_span()
            if hi > lo:
                buf = drv.pagelocked_empty(hi - lo, np.uint8)
                np.copyto(buf, np.frombuffer(self._mm, np.uint8, hi - lo, lo))
                src, base = buf, lo
        try:
            for layer, (kind, arrays) in zip(state.layers, self.layers):
                for e in arrays:
                    a = _view(src, e, base)
                    dst = layer.arrays[e.name]
                    if kind == "seq":
                        ops.write(dst[0], a)
                    elif n:
                        _write_slots(ops, dst, a, e.slot_axis, n)
                    del a
            if buf is not None:
                ops.synchronize()  # the copies read buf until they are done
        finally:
            buf = None
        state.tokens = list(self.tokens)

    def close(self):
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:
                pass  # a view is still alive; the mapping goes with it
            self._mm = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _view(src, e, base):
    import numpy as np

    count = e.nbytes // (4 if e.dtype == "float32" else 2)
    return np.frombuffer(src, dtype=np.dtype(e.dtype).newbyteorder("<"), count=count,
                         offset=e.offset - base).reshape(e.shape)
