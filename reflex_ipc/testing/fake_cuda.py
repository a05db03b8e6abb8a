"""The CUDA backend's host side on a recording runtime, and the kernels of a decode step per layer.

`recording_ops()` builds a CudaOps whose runtime records every launch (name, grid, block,
arguments: each launch's arguments packed with its kernel's layout, so a wrong one fails)
instead of running it, with weights in a fake arena: what a model launches can be listed
without a GPU. `decode_layer_kernels(ops, model)` runs one decode step (one token) through
a model on any CudaOps, the real one included (scripts/gpu/gpu-families), and returns the
kernels each layer launched, plus those of the head.
"""

import struct

import numpy as np


class _Drv:
    """Memory and copies of the recording runtime (addresses from a bump allocator)."""

    class MemoryError(Exception):
        pass

    class device_attribute:
        MULTIPROCESSOR_COUNT = "sms"

    def __init__(self, rt):
        self.rt = rt
        self.next = 1 << 20

    def mem_alloc(self, n):
        p = self.next
        self.next += n
        return p

    def memcpy_htod_async(self, ptr, a, stream):
        self.rt.copies.append((ptr, np.array(a), stream))

    def memcpy_dtoh_async(self, out, ptr, stream):
        out[...] = 0

    def memcpy_dtod_async(self, dst, src, n, stream):
        self.rt.copies.append((dst, src, stream))

    def memset_d32(self, ptr, value, count):
        self.rt.memsets.append((ptr, value, count))

    def memset_d8_async(self, ptr, value, count, stream):
        self.rt.memsets.append((ptr, value, count))


class _Stream:
    handle = 0

    def synchronize(self):
        pass


class RecordingRuntime:
    """Stands in for reflex_ipc.cuda.core.Runtime: kernels record (name, grid, block, args)."""

    cc = (9, 0)

    def __init__(self):
        from ..cuda.core import Pool

        self.launches, self.copies, self.memsets = [], [], []
        self.drv = _Drv(self)
        self.pool = Pool(self.drv)
        self.stream = _Stream()

        class Device:
            @staticmethod
            def get_attribute(attr):
                return {"sms": 132}[attr]  # an H100 / H200

        self.device = Device()

    def kernel(self, name):
        """The kernel's real launcher (keyword arguments: cuda/launch.py, generated from the
        sources) over a launch that records (name, grid, block, the arguments in order)."""
        from ..cuda.core import KERNELS, make_kernel

        fmt = KERNELS[name][0]  # a KeyError here means a launch of an unknown kernel
        rt = self

        def pack(*args):
            struct.pack(fmt, *args)  # the arguments must fit the kernel's layout
            return args

        def launch(grid, block, args, shared, stream):
            rt.launches.append((name, grid, block, args))

        return make_kernel(None, name, rt.stream, pack=pack, launch=launch)


class FakeArena:
    """The weight arena without a device: pointers into a fake range, nothing to wait for."""

    def __init__(self, rt, f):
        self.base = 1 << 30
        self.start = f.data_offset
        self.nbytes = 0

    def ptr(self, info):
        return self.base + (info.offset - self.start)

    def wait(self):
        pass

    queue = None  # (never streaming: cuda/weights.py)

    def streaming(self):
        return False


def recording_ops():
    """A CudaOps on a RecordingRuntime (sm_90-like: tensor-core and flash paths on, the
    bandwidth matvecs as by default). Its launches are `ops.rt.launches`."""
    from ..backends import cuda_ops

    ops = cuda_ops.CudaOps.__new__(cuda_ops.CudaOps)
    rt = RecordingRuntime()
    ops.rt, ops.pool, ops.k = rt, rt.pool, rt.kernel
    ops._arenas, ops._extra_weights, ops._graph = {}, [], None
    ops._att_count = None
    ops._seq_memo = None
    ops.mma = ops.mmnt = ops.flash = True
    ops.flash_min_n = cuda_ops.FLASH_MIN_N
    ops.chunked = True
    ops.matvec = True
    ops.mv_variant = None
    ops.graphs = True
    ops._arena = lambda f: ops._arenas.setdefault(f.path, FakeArena(rt, f))
    return ops


def decode_layer_kernels(ops, model, pos=7):
    """(per-layer kernel names, head kernel names) of one decode step (token 5 at position
    `pos`, a zeroed state) through `model` on CudaOps `ops`, counted at the kernel lookups
    (each launch looks its kernel up once). Layers are split where forward calls `check`
    (before each layer); the last layer's end is where a step with output="hidden" (which
    ends in one rms_norm launch) stops, the head is the rest of the logits step."""
    from ..runtime.batch import Batch

    def step(output):
        names, starts, lookup = [], [], ops.k

        def k(name):
            names.append(name)
            return lookup(name)

        ops.k = k
        try:
            model.forward(model.new_state(ops, 512), Batch(ops, [5], [pos]), output=output,
                          check=lambda: starts.append(len(names)))
        finally:
            ops.k = lookup
        return names, starts

    hidden, starts = step("hidden")
    logits, _ = step("logits")
    end = len(hidden) - 1  # the output norm
    bounds = starts + [end]
    return [hidden[a:b] for a, b in zip(bounds, bounds[1:])], logits[end:]
