"""The prefix store's pipelined import (reflex_ipc/runtime/stateimport.py) on CUDA's side
without a GPU: cuda/staging.StagingLane over the fake pycuda driver of
reflex_ipc/testing/upload_fakes (copies land in a bytearray only when an event or the
stream is waited for, reading the host buffer then, so a staging buffer refilled too early
shows as wrong bytes), several threads and small jobs: every slot row lands where the
state's layout puts it, a corrupt segment ends the chain, page-locked buffers are freed."""

import os

import numpy as np
import pytest

from reflex_ipc.cuda.staging import StagingLane
from reflex_ipc.runtime import stateimport
from reflex_ipc.runtime.statefile import StateFile, write_state
from reflex_ipc.testing.upload_fakes import FakeRt

H, D, SLOTS = 3, 5, 64


class Dev:
    """A device array of the fake driver: ptr, shape, dtype (a DeviceArray's attributes)."""

    def __init__(self, ptr, shape, dtype):
        self.ptr, self.shape, self.dtype = ptr, tuple(shape), dtype


class Layer:
    def __init__(self, arrays):
        self.arrays = arrays


class FakeCudaOps:
    name = "cuda"

    def __init__(self, rt):
        self.rt = rt

    def staging_lane(self, nbytes, pinned):
        return StagingLane(self.rt, nbytes, pinned)

    def synchronize(self):
        pass


def _chain(tmp_path, n_layers=4, sizes=(16, 16, 16, 9), seed=0):
    """Segment files of a K/V [H, n, D] float16 state (slot axis 1), and the full arrays."""
    rng = np.random.default_rng(seed)
    n = sum(sizes)
    full = [{k: rng.standard_normal((H, n, D)).astype(np.float16) for k in ("k", "v")} for _ in range(n_layers)]
    paths, a = [], 0
    for i, m in enumerate(sizes):
        p = str(tmp_path / f"seg{i}.rxs")
        layers = [("slot", [(k, np.ascontiguousarray(lay[k][:, a:a + m]), 1) for k in ("k", "v")]) for lay in full]
        write_state(p, digest=bytes(16), adapters_digest=bytes(16), arch="llama", tokens=list(range(a, a + m)),
                    layers=layers, start=a, durable=False)
        paths.append(p)
        a += m
    return paths, full, n


def _state(rt, n_layers):
    per = H * SLOTS * D * 2
    rt.drv.mem_alloc(2 * n_layers * per)
    base = rt.drv.BASE
    layers = []
    for i in range(n_layers):
        layers.append(Layer({k: Dev(base + (2 * i + j) * per, (H, SLOTS, D), "float16")
                             for j, k in enumerate(("k", "v"))}))
    return layers


def _device(rt, n_layers):
    dev = np.frombuffer(bytes(rt.drv.dev), np.float16).reshape(n_layers, 2, H, SLOTS, D)
    return dev


def _import(paths, threads, pinned, cut=None):
    """stateimport.run of the chain `paths` into a fresh fake-CUDA state of 4 layers (with
    cut(): called once the files are parsed, before they are read). Returns (rt, whole, stats)."""
    rt = FakeRt()

    class State:
        layers = _state(rt, 4)
    files = [StateFile(p) for p in paths]
    try:
        if cut is not None:
            cut()
        whole, stats = stateimport.run(FakeCudaOps(rt), State, files, lambda j: False, threads=threads,
                                       pinned=pinned)
    finally:
        for f in files:
            f.close()
    return rt, whole, stats


@pytest.mark.parametrize("pinned", [True, False])
def test_rows_land_in_the_state_layout(tmp_path, monkeypatch, pinned):
    monkeypatch.setattr(stateimport, "CHUNK", 700)  # a job is one or two arrays
    paths, full, n = _chain(tmp_path)
    rt, whole, stats = _import(paths, 3, pinned)
    assert whole == 4 and stats["threads"] == 3 and stats["jobs"] > 8 and "refused" not in stats
    assert stats["pinned"] is pinned
    dev = _device(rt, 4)
    for i in range(4):
        for j, k in enumerate(("k", "v")):
            assert np.array_equal(dev[i, j, :, :n], full[i][k])
            assert not dev[i, j, :, n:].any()  # nothing past the chain
    assert all(h.freed for h in rt.drv.pinned) and len(rt.drv.pinned) == (3 if pinned else 0)
    assert all(d == 0 for d in rt.ctx.depth.values())  # every lane popped the context it pushed


def test_a_corrupt_segment_ends_the_chain(tmp_path, monkeypatch):
    monkeypatch.setattr(stateimport, "CHUNK", 700)
    paths, full, n = _chain(tmp_path, seed=1)
    with StateFile(paths[2]) as sf:
        e = sf.layers[3][1][1]  # the last layer's v
    data = bytearray(open(paths[2], "rb").read())
    data[e.offset + 3] ^= 0x40
    open(paths[2], "wb").write(data)
    rt, whole, stats = _import(paths, 2, True)
    assert whole == 2 and list(stats["refused"]) == [paths[2]]
    assert "checksum" in stats["refused"][paths[2]]
    dev = _device(rt, 4)
    for i in range(4):
        for j, k in enumerate(("k", "v")):
            assert np.array_equal(dev[i, j, :, :32], full[i][k][:, :32])
    # what was copied of the later segments is their checked rows, never the flipped array
    assert not np.array_equal(dev[3, 1, :, 32:48], np.frombuffer(bytes(data[e.offset:e.offset + e.nbytes]),
                                                                  np.float16).reshape(H, 16, D))


def test_a_truncated_file_ends_the_chain_and_threads_finish(tmp_path):
    paths, full, n = _chain(tmp_path, seed=2)
    rt, whole, stats = _import(paths, 4, False,  # parsed whole, then cut
                               cut=lambda: os.truncate(paths[1], os.path.getsize(paths[1]) - 100))
    assert whole == 1 and "truncated" in stats["refused"][paths[1]]
    assert np.array_equal(_device(rt, 4)[0, 0, :, :16], full[0]["k"][:, :16])
