"""Saved state files: a model's state after some tokens, written to disk and read back.

The format is described in protocol/STATE.md (version 2). In short, all integers
little-endian:

    fixed header (80 bytes)
      0   8  magic b"RFLXSTAT"
      8   4  u32 format version (2)
     12   4  u32 header size H: bytes from 0 to the end of the header CRC
     16  16  model identity: GGUFFile.identity() (BLAKE2b-128 of everything before the
             tensor data: header, metadata, tensor directory), as bytes
     32  16  adapter digest: 16 zero bytes without LoRA adapters (`adapter_digest`)
     48   4  u32 n_tokens
     52   4  u32 n_layers
     56   2  u16 A, the architecture name's length
     58   2  u16 reserved (0)
     60   4  u32 start: the position of the first token (0 but in prefix-store segments)
     64  16  base digest: the prefix store's digest of the tokens before `start` (zeros
             in a file that starts at 0 outside the store)
    then     A bytes architecture (UTF-8)
    then per layer: u8 kind (0 slot, 1 seq), u8 n_arrays, and per array:
             u8 name length, name (ASCII), u8 dtype (0 float32, 1 float16),
             u8 ndim, u8 slot axis (255 for seq arrays), u32 x ndim shape,
             u64 offset (from the file's start, a multiple of 64), u64 nbytes,
             u32 CRC-32 of the array's bytes
    then     u32 CRC-32 of the token ids' bytes, u32 CRC-32 of header bytes [0, H - 4)
    token ids: int32 x n_tokens at align64(H)
    arrays: each at its offset, C order, in the dtype given

`write_state` writes atomically (a temporary file in the target's directory, renamed
over the target; fsynced unless asked not to). `StateFile` never maps a file: it reads
the header, the ids and then the arrays it is asked for into private memory with
pread, and checks every byte it uses against the file's checksums before anything is
used, so a file that is truncated, rewritten or torn while it is read gives
ReflexError("state_error"), never other numbers and never SIGBUS. Non-regular files
(FIFOs, devices, directories) are refused before they are opened.
"""

from __future__ import annotations

import os
import struct

from ..errors import ReflexError

MAGIC = b"RFLXSTAT"
VERSION = 2
ALIGN = 64
FIXED = struct.Struct("<8sII16s16sIIHHI16s")  # 80 bytes
ENTRY_TAIL = struct.Struct("<QQI")  # offset, nbytes, CRC-32 of the data
MAX_HEADER = 16 << 20
MAX_NDIM = 8
DTYPES = {0: "float32", 1: "float16"}
DTYPE_CODES = {v: k for k, v in DTYPES.items()}
KINDS = {0: "slot", 1: "seq"}
KIND_CODES = {v: k for k, v in KINDS.items()}
NO_AXIS = 255
ZERO_DIGEST = bytes(16)
PARALLEL_CRC = 8 << 20  # checksum this many bytes or more on several threads


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
    """A state path as given by a client: ~ expanded, made absolute (like model paths).
    invalid_request for an empty path or one with a NUL byte (no file can have it)."""
    if not isinstance(path, str) or not path:
        raise ReflexError("invalid_request", "a state path must be a non-empty string")
    if "\0" in path:
        raise ReflexError("invalid_request", "a state path must not contain a NUL byte")
    try:
        return os.path.abspath(os.path.expanduser(path))
    except (ValueError, OSError) as e:  # an undecodable name, a home that cannot be found
        raise ReflexError("invalid_request", f"bad state path {path[:200]!r}: {e}") from None


def crc32_many(buffers):
    """[CRC-32 of each buffer] (zlib's; it releases the GIL), on two or more threads when
    they add up to PARALLEL_CRC bytes or more and the machine has the cores."""
    import zlib

    bufs = list(buffers)
    total = sum(memoryview(b).nbytes for b in bufs)
    n_thr = min(4, os.cpu_count() or 1, len(bufs))
    if total < PARALLEL_CRC or n_thr < 2:
        return [zlib.crc32(b) for b in bufs]
    import threading

    out = [0] * len(bufs)
    # largest first, each to the thread with the least work so far
    order = sorted(range(len(bufs)), key=lambda i: -memoryview(bufs[i]).nbytes)
    shares = [[] for _ in range(n_thr)]
    load = [0] * n_thr
    for i in order:
        t = load.index(min(load))
        shares[t].append(i)
        load[t] += memoryview(bufs[i]).nbytes

    def work(idx):
        for i in idx:
            out[i] = zlib.crc32(bufs[i])

    threads = [threading.Thread(target=work, args=(sh,), daemon=True) for sh in shares[1:]]
    for t in threads:
        t.start()
    work(shares[0])
    for t in threads:
        t.join()
    return out


# -- writing -----------------------------------------------------------------------------
def encode_header(*, digest, adapters_digest, arch, tokens, layers, start=0, base=ZERO_DIGEST):
    """(header bytes, token ids, [(offset, array)] to write, total file size). layers:
    [(kind, [(name, numpy array, slot axis or None)])]; every array's CRC-32 goes into
    the header."""
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
            entries.append((len(body), np.ascontiguousarray(a)))
            body += ENTRY_TAIL.pack(0, a.nbytes, 0)
    H = FIXED.size + len(body) + 8
    tok = np.asarray(tokens, dtype="<i4")
    crcs = crc32_many([memoryview(a.reshape(-1)).cast("B") for _, a in entries])
    pos = _align(H) + tok.nbytes
    out = []
    for (field, a), crc in zip(entries, crcs):
        pos = _align(pos)
        ENTRY_TAIL.pack_into(body, field, pos, a.nbytes, crc)
        out.append((pos, a))
        pos += a.nbytes
    head = FIXED.pack(MAGIC, VERSION, H, digest, adapters_digest, n, len(layers), len(arch_b), 0,
                      int(start), base) + bytes(body)
    head += struct.pack("<I", zlib.crc32(tok.tobytes()))
    head += struct.pack("<I", zlib.crc32(head))
    assert len(head) == H
    return head, tok, out, pos


def write_state(path, *, digest, adapters_digest, arch, tokens, layers, start=0, base=ZERO_DIGEST,
                durable=True) -> int:
    """Write a state file atomically; returns its size in bytes. path must be absolute.
    durable: fsync the file and its directory (the prefix store skips it: its files are
    checked when read, and a lost one is computed again). An existing target that is not a
    regular file (a FIFO, a device) is refused, never replaced."""
    import stat
    import tempfile

    head, tok, arrays, size = encode_header(digest=digest, adapters_digest=adapters_digest, arch=arch,
                                            tokens=tokens, layers=layers, start=start, base=base)
    d, base_name = os.path.split(path)
    try:
        st = os.stat(path)
    except OSError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise ReflexError("state_error", f"{path} is a directory")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise ReflexError("state_error", f"{path} exists and is not a regular file; not replacing it")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{base_name[:200]}.", suffix=".tmp", dir=d)
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
            if durable:
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
    if durable:
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
def pinned_default(ops) -> bool:
    """Whether a state import on ops reads into page-locked memory: $REFLEX_STATE_PINNED, and
    when it is unset, while a weight upload streams (see StateFile.load)."""
    from .. import settings

    pinned = settings.get().state_pinned
    if pinned is None:
        uploading = getattr(ops, "uploading", None)
        pinned = bool(uploading is not None and uploading())
    return bool(pinned)


class ArrayEntry:
    __slots__ = ("name", "dtype", "shape", "slot_axis", "offset", "nbytes", "crc")

    def __init__(self, name, dtype, shape, slot_axis, offset, nbytes, crc):
        self.name, self.dtype, self.shape = name, dtype, shape
        self.slot_axis, self.offset, self.nbytes, self.crc = slot_axis, offset, nbytes, crc


def open_regular(path):
    """An fd of the regular file at path, opened for reading without blocking; state_error
    for anything else (checked with stat before opening, so a FIFO never blocks the caller,
    and again on the open file)."""
    import stat

    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ReflexError("state_error", f"no such state file: {path}") from None
    except (OSError, ValueError) as e:
        raise ReflexError("state_error", f"cannot open {path}: {getattr(e, 'strerror', None) or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise _bad(path, "not a regular file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise ReflexError("state_error", f"cannot open {path}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _bad(path, "not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _pread_into(fd, buf, offset, path):
    """Fill memoryview buf from the file at offset; state_error when the file ends first
    (it shrank while being read) or cannot be read."""
    done, n = 0, len(buf)
    while done < n:
        try:
            got = os.preadv(fd, [buf[done:]], offset + done)
        except InterruptedError:
            continue
        except OSError as e:
            raise _bad(path, f"cannot be read: {e.strerror or e}") from None
        if got == 0:
            raise _bad(path, f"ends at {offset + done} bytes, before the data it describes "
                       "(truncated, or changed while it was read)")
        done += got


class StateFile:
    """A state file whose header and token ids were read and checked. Attributes: path,
    version, digest, adapters_digest, arch, n_tokens, start, base, tokens (list of int),
    layers ([(kind, [ArrayEntry])]), size. `read(entries)` reads arrays into private memory
    and checks their CRCs; `restore(state)` writes them into a State. Use as a context
    manager or close()."""

    def __init__(self, path):
        self.path = path
        self._fd = None
        fd, st = open_regular(path)
        self._fd = fd
        try:
            self.size = st.st_size
            if self.size < FIXED.size:
                raise _bad(path, f"{self.size} bytes: too short for a state file header (truncated?)")
            self._parse()
        except BaseException:
            self.close()
            raise

    def _pread(self, offset, n):
        b = bytearray(n)
        _pread_into(self._fd, memoryview(b), offset, self.path)
        return b

    def _parse(self):
        import zlib

        import numpy as np

        path = self.path
        head = self._pread(0, min(self.size, 64 << 10))
        magic, ver, H, digest, adig, n, n_layers, alen, _, start, base = FIXED.unpack_from(head, 0)
        if magic != MAGIC:
            raise _bad(path, "not a reflex state file (bad magic)")
        if ver != VERSION:
            old = " (saved by an older reflex: save it again)" if ver < VERSION else ""
            raise _bad(path, f"state format version {ver} is not supported (this reflex reads "
                       f"{VERSION}){old}")
        if not FIXED.size + 8 <= H <= min(self.size, MAX_HEADER):
            raise _bad(path, f"header size {H} is impossible for a file of {self.size} bytes (truncated?)")
        if H > len(head):
            head = self._pread(0, H)
        mm = memoryview(head)[:H]
        (crc,) = struct.unpack_from("<I", mm, H - 4)
        if zlib.crc32(mm[:H - 4]) != crc:
            raise _bad(path, "header checksum mismatch (corrupt file)")
        self.version, self.digest, self.adapters_digest = ver, digest, adig
        self.n_tokens, self.start, self.base = n, start, base
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
                    off, nbytes, acrc = ENTRY_TAIL.unpack_from(mm, pos)
                    pos += ENTRY_TAIL.size
                    arrays.append(ArrayEntry(name, DTYPES[dt], tuple(shape),
                                             None if axis == NO_AXIS else axis, off, nbytes, acrc))
                layers.append((KINDS[kind], arrays))
        except (struct.error, UnicodeDecodeError) as e:
            raise _bad(path, f"malformed header ({e})") from None
        if pos != H - 8:
            raise _bad(path, f"header size {H} does not match its contents ({pos + 8} bytes)")
        # token ids (read into private memory, checked)
        t0 = _align(H)
        if t0 + 4 * n > self.size:
            raise _bad(path, f"{self.size} bytes cannot hold {n} token ids (truncated)")
        raw = self._pread(t0, 4 * n)
        (tcrc,) = struct.unpack_from("<I", mm, H - 8)
        if zlib.crc32(raw) != tcrc:
            raise _bad(path, "token ids checksum mismatch (corrupt file)")
        tok = np.frombuffer(raw, dtype="<i4", count=n)
        if n and int(tok.min()) < 0:
            raise _bad(path, f"negative token id {int(tok.min())}")
        self.tokens = tok.tolist()
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

    def read(self, entries, alloc=None):
        """{id(entry): numpy view} of the entries' data, read into one private buffer (from
        alloc(nbytes) -> uint8 array, default numpy) and checked against their CRCs before
        anything is returned: state_error when the file changed or is corrupt."""
        import numpy as np

        entries = [e for e in entries]
        total = sum(e.nbytes for e in entries)
        buf = alloc(total) if alloc is not None else np.empty(total, np.uint8)
        mv = memoryview(buf).cast("B")
        spans, at = [], 0
        for e in sorted(entries, key=lambda e: e.offset):  # in file order
            spans.append((e, at))
            at += e.nbytes
        for e, at in spans:
            _pread_into(self._fd, mv[at:at + e.nbytes], e.offset, self.path)
        crcs = crc32_many([mv[at:at + e.nbytes] for e, at in spans])
        for (e, at), crc in zip(spans, crcs):
            if crc != e.crc:
                raise _bad(self.path, f"array {e.name!r}: data checksum mismatch (corrupt, or "
                           "changed while it was read)")
        out = {}
        for e, at in spans:
            count = e.nbytes // (4 if e.dtype == "float32" else 2)
            out[id(e)] = np.frombuffer(buf, dtype=np.dtype(e.dtype).newbyteorder("<"), count=count,
                                       offset=at).reshape(e.shape)
        return out

    def load(self, ops, *, pinned=None, seq=True):
        """Read and check (CRC) the arrays `restore` writes: slot arrays, and with seq the
        per-sequence ones. Returns what `restore(state, loaded=...)` takes. On a backend with
        page-locked host memory (CUDA) the data is read into one page-locked buffer when
        `pinned` (default: $REFLEX_STATE_PINNED; unset: while a weight upload streams).

        Why while streaming: a copy from pageable memory goes through the driver's staging
        buffers one piece at a time, each waiting for the copy engine, which the streaming
        weight upload keeps queued; on the H200 a 2,329-token 30B-A3B state took as long to
        import as the rest of the 19.9 GB upload (1.2-1.6 s, bench/results/prefix-*). From a
        page-locked buffer every copy is queued at once. With the copy engine idle (or after a
        short register upload: a 0.6B model's 1,000-token import took 412 ms from pageable
        memory, 524 ms pinned) the page-locked allocation costs more than it saves."""
        if pinned is None:
            pinned = pinned_default(ops)
        drv = getattr(getattr(ops, "rt", None), "drv", None)
        alloc = None
        if pinned and drv is not None and hasattr(drv, "pagelocked_empty"):
            import numpy as np

            def alloc(nbytes):
                return drv.pagelocked_empty(max(nbytes, 1), np.uint8)
        entries = [e for kind, arrays in self.layers for e in arrays if seq or kind == "slot"]
        return (self.read(entries, alloc=alloc), alloc is not None, seq)

    def restore(self, state, *, pinned=None, seq=True, set_tokens=True, loaded=None):
        """Write the saved arrays into `state` (a runtime.state.State with at least start +
        n_tokens slots and the same layer layout: checked by the caller): slot rows start ..
        start + n_tokens - 1 and, with seq, the per-sequence arrays of sequence 0; with
        set_tokens the state's tokens become the file's (start 0 only). Every array is read
        and checked before the state is touched (`loaded`: what `load` returned, read before
        the state was made ready)."""
        from .state import _write_slots

        ops, n = state.ops, self.n_tokens
        views, was_pinned, seq = loaded if loaded is not None else self.load(ops, pinned=pinned, seq=seq)
        try:
            for layer, (kind, arrays) in zip(state.layers, self.layers):
                for e in arrays:
                    if kind == "seq" and not seq:
                        continue
                    a = views[id(e)]
                    dst = layer.arrays[e.name]
                    if kind == "seq":
                        ops.write(dst[0], a)
                    elif n:
                        _write_slots(ops, dst, a, e.slot_axis, n, self.start)
            if was_pinned:
                ops.synchronize()  # the copies read the buffer until they are done
        finally:
            views = loaded = None
        if set_tokens:
            state.tokens = list(self.tokens)

    def close(self):
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
