"""Host time of one eager CUDA decode step (no graph) with the driver stubbed out, no GPU needed.

The CUDA backend's Python side (model code, array bookkeeping, argument packing, launchers) runs
on a synthetic model with every kernel launch a no-op, so what is timed is the host cost per
token that an uncaptured decode step pays before the GPU does anything. Run against two
checkouts to compare (PYTHONPATH picks the tree), paired:

    for i in 1 2 3; do PYTHONPATH=A python bench/cuda_eager_step.py; PYTHONPATH=B python bench/cuda_eager_step.py; done

Times are the thread's CPU time (time.thread_time), so that other processes on a busy machine
count less than with wall time.
"""

import argparse
import json
import os
import time


class _Func:
    def _launch_kernel(self, grid, block, buf, shared, stream):
        pass


class _Drv:
    class MemoryError(Exception):
        pass

    def __init__(self):
        self.next = 1 << 20

    def mem_alloc(self, n):
        p = self.next
        self.next += n
        return p

    @staticmethod
    def memcpy_htod_async(ptr, a, stream):
        pass

    @staticmethod
    def memset_d8_async(ptr, value, count, stream):
        pass

    class device_attribute:
        MULTIPROCESSOR_COUNT = "sms"


class _Arena:
    def __init__(self, rt, f):
        self.start = f.data_offset

    def ptr(self, info):
        return (1 << 30) + (info.offset - self.start)

    def wait(self):
        pass


def make_ops():
    from reflex_ipc.backends import cuda_ops
    from reflex_ipc.cuda import core

    class Rt:
        stream = None
        cc = (9, 0)

        def __init__(self):
            self.drv = _Drv()
            self.pool = core.Pool(self.drv)
            self.device = type("D", (), {"get_attribute": staticmethod(lambda a: 132)})()
            self._k = {}

        def kernel(self, name):
            k = self._k.get(name)
            if k is None:
                if hasattr(core, "make_kernel"):
                    k = core.make_kernel(_Func(), name, None)
                else:  # before the ABI table
                    k = core.Kernel(_Func(), name, core.SIGNATURES[name], None)
                self._k[name] = k
            return k

    cuda_ops.WeightArena = _Arena
    ops = cuda_ops.CudaOps.__new__(cuda_ops.CudaOps)
    rt = Rt()
    ops.rt, ops.pool, ops.k = rt, rt.pool, rt.kernel
    ops._arenas, ops._extra_weights, ops._graph, ops._att_count, ops._seq_memo = {}, [], None, None, None
    ops.mma, ops.mmnt, ops.flash, ops.chunked, ops.matvec, ops.mv_variant = True, True, True, True, True, None
    ops._moe_host_mode, ops.moe_capturable = False, True
    return ops


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                    "tests", "data", "synthetic-qwen3.gguf"))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    from reflex_ipc.gguffile import GGUFFile
    from reflex_ipc.models import load_model
    from reflex_ipc.runtime.batch import Batch

    ops = make_ops()
    f = GGUFFile(a.model)
    model = load_model(ops, f)
    state = model.new_state(ops, 512)
    batch = Batch(ops, [5], [7])
    for _ in range(20):
        model.forward(state, batch)
    best = float("inf")
    for _ in range(a.repeats):
        t = time.thread_time()
        for _ in range(a.steps):
            model.forward(state, batch)
        best = min(best, (time.thread_time() - t) / a.steps)
    print(json.dumps({"tree": os.path.dirname(os.path.dirname(os.path.abspath(model.__module__ and
                                                                              __import__("reflex_ipc").__file__))),
                      "model": os.path.basename(a.model), "layers": model.hp.n_layer,
                      "us_per_step": round(best * 1e6, 1), "load": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
