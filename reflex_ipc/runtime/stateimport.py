"""The prefix store's import of a chain of segment files, pipelined.

A 2,330-token prompt of a Qwen3-30B-A3B-shaped model is 9 segment files, 229 MB of
float16 K/V rows. Read file after file (StateFile.restore: one buffer per file, the
reads, then the CRCs, then the copies, then a wait) the import took 0.65-0.75 s on the
H200 while the weight upload streamed beside it (bench/results/prefix-h200). Here every
file's arrays are cut into jobs of whole arrays (about CHUNK bytes each, in file order)
that several threads take in turn; a thread preads its job into its own staging buffer,
checks each array's CRC-32 (zlib releases the GIL), and queues the array's copies straight
into the state's rows: reads, checks and copies of different jobs overlap, and the only
host memory is one buffer per thread. A backend may offer `staging_lane(nbytes, pinned)`
(CUDA: a page-locked or pageable buffer with its own stream, cuda/staging.py) and
`hold_uploads()` (CUDA: a streaming weight upload lets the experts nobody asked for yet
wait while the import runs); elsewhere a lane is a numpy buffer written with `ops.write`.

Unlike `StateFile.restore`, the state is written before every file is checked whole, but
never an array before its own CRC passed: a segment with an array whose check fails (or a
file that cannot be read) ends the chain there, and the caller evaluates its tokens and
those after it again. Rows of it or of later segments that were copied already hold checked
values of positions past the chain's end (evaluated again before anything reads them
unmasked). The segments before it are imported whole, as before.
"""

from __future__ import annotations

import os
import threading
import time

CHUNK = 4 << 20  # bytes per job (whole arrays: an array larger than this is a job alone)
MAX_THREADS = 8


def _item(dtype):
    return 4 if dtype == "float32" else 2


def plan(files, seq_of):
    """[(file index, [entries], first offset, nbytes)] jobs: each file's slot arrays (and its
    per-sequence ones when seq_of(file index)) in file order, packed into runs of about CHUNK
    bytes (an entry is never split)."""
    jobs = []
    for j, sf in enumerate(files):
        ents = sorted((e for kind, arrays in sf.layers for e in arrays if kind == "slot" or seq_of(j)),
                      key=lambda e: e.offset)
        cur = []
        for e in ents:
            if cur and e.offset + e.nbytes - cur[0].offset > CHUNK:
                jobs.append((j, cur, cur[0].offset, cur[-1].offset + cur[-1].nbytes - cur[0].offset))
                cur = []
            cur.append(e)
        if cur:
            jobs.append((j, cur, cur[0].offset, cur[-1].offset + cur[-1].nbytes - cur[0].offset))
    return jobs


def compatible(state, files):
    """Whether every array of files goes byte for byte into state (same dtype: a segment of
    another backend may differ, and then takes StateFile.restore's casting way)."""
    for sf in files:
        for layer, (kind, arrays) in zip(state.layers, sf.layers):
            for e in arrays:
                dst = layer.arrays.get(e.name)
                if dst is None or str(dst.dtype) != e.dtype:
                    return False
    return True


class _HostLane:
    """A lane for backends without staging_lane: a numpy buffer, copies with ops.write."""

    def __init__(self, ops, nbytes):
        import numpy as np

        self.ops = ops
        self.buf = np.empty(max(int(nbytes), 1), np.uint8)

    def wait(self):
        self.ops.synchronize()  # (a no-op where write is synchronous)

    def fence(self):
        pass

    def close(self):
        self.buf = None


def _put(ops, lane, at, e, dst, start, n):
    """Copy entry e, at lane.buf[at:], into dst: slot rows start..start+n-1 (slot arrays) or
    sequence 0 (per-sequence arrays, start None)."""
    if hasattr(lane, "put_runs"):
        if start is None:  # sequence 0 of [n_seq, ...]: the array's first e.nbytes bytes
            lane.put_runs(at, int(dst.ptr), e.nbytes)
            return
        ax = e.slot_axis
        lead = 1
        for s in e.shape[:ax]:
            lead *= s
        row = _item(e.dtype)
        for s in e.shape[ax + 1:]:
            row *= s
        n_slots = dst.shape[ax]
        lane.put_runs(at, int(dst.ptr) + start * row, n * row, count=lead, src_step=n * row,
                      dst_step=n_slots * row)
        return
    import numpy as np

    from .state import _write_slots

    a = np.frombuffer(lane.buf, dtype=np.dtype(e.dtype).newbyteorder("<"), count=e.nbytes // _item(e.dtype),
                      offset=at).reshape(e.shape)
    if start is None:
        ops.write(dst[0], a)
    else:
        _write_slots(ops, dst, a, e.slot_axis, n, start)


def run(ops, state, files, seq_of, *, threads=None, pinned=False):
    """Import the arrays of `files` (checked StateFiles of one chain, in order) into state, on
    up to `threads` threads. Returns (how many leading files were imported whole, stats)."""
    import zlib

    from ..errors import ReflexError
    from .statefile import _pread_into

    jobs = plan(files, seq_of)
    total = sum(n for _, _, _, n in jobs)
    if threads is None:
        threads = min(MAX_THREADS, os.cpu_count() or 1)
    threads = max(1, min(threads, len(jobs)))
    size = max((n for _, _, _, n in jobs), default=1)
    dst_of = {}  # id(entry) -> (dst array, start or None, n)
    for sf in files:
        for layer, (kind, arrays) in zip(state.layers, sf.layers):
            for e in arrays:
                dst_of[id(e)] = (layer.arrays[e.name], sf.start if kind == "slot" else None, sf.n_tokens)
    lock = threading.Lock()
    nxt = [0]
    bad = [len(files)]  # the first file that failed
    why = {}
    errors = []
    make = getattr(ops, "staging_lane", None)

    def worker():
        lane = None
        try:
            lane = make(size, pinned) if make is not None else _HostLane(ops, size)
            mv = memoryview(lane.buf).cast("B")
            while True:
                with lock:
                    k = nxt[0]
                    nxt[0] += 1
                if k >= len(jobs):
                    break
                j, ents, off, n = jobs[k]
                if j >= bad[0]:
                    continue  # past a failed file: not used
                sf = files[j]
                lane.wait()
                try:
                    _pread_into(sf._fd, mv[:n], off, sf.path)
                except ReflexError as e:
                    with lock:
                        if j < bad[0]:
                            bad[0] = j
                        why[j] = e.message
                    continue
                crcs = [zlib.crc32(mv[e.offset - off:e.offset - off + e.nbytes]) for e in ents]
                wrong = next((e for e, c in zip(ents, crcs) if c != e.crc), None)
                if wrong is not None:
                    with lock:
                        if j < bad[0]:
                            bad[0] = j
                        why[j] = (f"{sf.path}: array {wrong.name!r}: data checksum mismatch (corrupt, "
                                  "or changed while it was read)")
                    continue
                for e in ents:
                    dst, start, cnt = dst_of[id(e)]
                    _put(ops, lane, e.offset - off, e, dst, start, cnt)
                lane.fence()
        except BaseException as e:  # noqa: BLE001 - raised by the calling thread
            errors.append(e)
            with lock:
                bad[0] = -1  # nothing is trusted
        finally:
            if lane is not None:
                try:
                    lane.close()
                except BaseException as e:  # noqa: BLE001
                    errors.append(e)
                    with lock:
                        bad[0] = -1

    t0 = time.perf_counter()
    # every lane on a thread of its own, also the only one: a CUDA lane pushes the context
    # on its thread and pops it when done, which the calling thread (holding it current
    # already) must not do to itself
    ts = [threading.Thread(target=worker, name=f"reflex-import-{w}", daemon=True) for w in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    whole = max(bad[0], 0)
    stats = {"files": len(files), "jobs": len(jobs), "bytes": total, "threads": threads,
             "pinned": bool(pinned and make is not None), "ms": round((time.perf_counter() - t0) * 1e3, 2),
             "whole": whole}
    if why:
        stats["refused"] = {files[j].path: why[j] for j in sorted(why)}
    if errors:
        raise errors[0]
    return whole, stats

