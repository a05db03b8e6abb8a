"""CUDA graphs through the driver API (pycuda 2026.1 has none), on pycuda's stream.

Capture records the kernels launched on a stream (no execution); the instantiated
graph then replays all of them with one cuGraphLaunch, which removes the per-kernel
launch cost from Python. Kernel arguments are baked in at capture, so whatever
changes between replays (positions, token ids) must live in device memory that the
kernels read, updated before each replay.
"""

import ctypes
import sys

_lib = None
CAPTURE_MODE_RELAXED = 2  # allocations (cuMemAlloc) stay allowed while capturing


def _cuda():
    global _lib
    if _lib is None:
        _lib = ctypes.CDLL("libcuda.so.1")
        for name in ("cuStreamBeginCapture_v2", "cuStreamEndCapture", "cuGraphInstantiateWithFlags",
                     "cuGraphLaunch", "cuGraphExecDestroy", "cuGraphDestroy", "cuGraphGetNodes"):
            getattr(_lib, name).restype = ctypes.c_int
    return _lib


def _check(rc, what):
    if rc:
        from ..errors import ReflexError

        raise ReflexError("cuda_error", f"{what} failed with CUDA error {rc}")


class Graph:
    """with Graph(stream_handle) as g: <launch kernels>; then g.launch()."""

    def __init__(self, stream_handle):
        self.stream = ctypes.c_void_p(stream_handle)
        self.graph = ctypes.c_void_p()
        self.exec = ctypes.c_void_p()
        self.pool = None  # the graph's private memory pool (CudaOps.capture), freed by close()

    def __enter__(self):
        prof = sys.modules.get("reflex_ipc.cuda.profile")
        if prof is not None:
            prof.CAPTURING[0] = True
        _check(_cuda().cuStreamBeginCapture_v2(self.stream, CAPTURE_MODE_RELAXED), "cuStreamBeginCapture")
        return self

    def __exit__(self, exc_type, exc, tb):
        prof = sys.modules.get("reflex_ipc.cuda.profile")
        if prof is not None:
            prof.CAPTURING[0] = False
        lib = _cuda()
        rc = lib.cuStreamEndCapture(self.stream, ctypes.byref(self.graph))
        if exc_type is not None:
            return False
        _check(rc, "cuStreamEndCapture")
        _check(lib.cuGraphInstantiateWithFlags(ctypes.byref(self.exec), self.graph, ctypes.c_ulonglong(0)),
               "cuGraphInstantiate")
        return False

    def node_count(self):
        """The number of nodes (kernels, copies, memsets) the capture recorded."""
        n = ctypes.c_size_t(0)
        _check(_cuda().cuGraphGetNodes(self.graph, None, ctypes.byref(n)), "cuGraphGetNodes")
        return int(n.value)

    def launch(self):
        prof = sys.modules.get("reflex_ipc.cuda.profile")
        if prof is not None and prof.ACTIVE is not None:
            rc = prof.ACTIVE.around("graph", _cuda().cuGraphLaunch, self.exec, self.stream)
        else:
            rc = _cuda().cuGraphLaunch(self.exec, self.stream)
        _check(rc, "cuGraphLaunch")

    def close(self):
        lib = _cuda()
        if self.exec:
            lib.cuGraphExecDestroy(self.exec)
            self.exec = ctypes.c_void_p()
        if self.graph:
            lib.cuGraphDestroy(self.graph)
            self.graph = ctypes.c_void_p()
        if self.pool is not None:
            self.pool.free_all()
            self.pool = None
