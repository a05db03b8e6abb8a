"""Host cost of one CUDA kernel launch's Python layer (issue 26: the kernel ABI), no GPU needed.

The driver call is replaced by a no-op, so what is timed is argument handling and packing:
"positional" is the launcher before the ABI table (cuda/core.Kernel: `k(grid, block, *args)`,
a method packing with a precompiled struct), "keyword" the generated one (cuda/launch.py via
core.make_kernel: keyword-only parameters named as in the kernel source, the same struct; a
kernel of more than 14 parameters takes its leading pointers through `k.head(...)`).
ns per launch, best of --repeats rounds of --n launches, the two alternated.

    python bench/cuda_launch.py

Times are the thread's CPU time (time.thread_time), so that other processes on a busy machine
count less than with wall time.
"""

import argparse
import json
import os
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from reflex_ipc.cuda.core import KERNELS, make_kernel  # noqa: E402


class PositionalKernel:
    """The launcher as it was before the ABI table (cuda/core.py's Kernel), for comparison."""

    __slots__ = ("name", "pack", "_launch", "stream")

    def __init__(self, func, name, fmt, stream):
        self.name = name
        self.pack = struct.Struct(fmt).pack
        self._launch = func._launch_kernel
        self.stream = stream

    def __call__(self, grid, block, *args, shared=0):
        self._launch(grid, block, self.pack(*args), shared, self.stream)


class NoOp:
    def _launch_kernel(self, grid, block, buf, shared, stream):
        pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100000)
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    g, b = (51, 1, 1), (128, 1, 1)
    mm = (0x1000, 0x2000, 0x3000, 512, 203, 1, 544, 0)
    att = (1, 2, 3, 4, 5, 6, 7, 8, 0, 16, 8, 128, 4096, 4096, 0.088, 0.0, 1, 0, 256)
    cases = {}
    pk = PositionalKernel(NoOp(), "mm1_q8_0", KERNELS["mm1_q8_0"][0], None)
    kk = make_kernel(NoOp(), "mm1_q8_0", None)
    cases["mm1_q8_0 (8 args)"] = (lambda: pk(g, b, *mm),
                                  lambda: kk(g, b, W=0x1000, X=0x2000, Y=0x3000, K=512, M=203, N=1, rb=544, acc=0))
    pa = PositionalKernel(NoOp(), "attention_split_last_f16kv", KERNELS["attention_split_last_f16kv"][0], None)
    ka = make_kernel(NoOp(), "attention_split_last_f16kv", None)
    cases["attention_split_last_f16kv (19 args)"] = (
        lambda: pa(g, b, *att),
        lambda: ka(g, b, ka.head(q=1, kc=2, vc=3, part_ml=4, part_acc=5, out=6, count=7, pos=8, mask=0),
                   Hq=16, Hkv=8, hd=128, ctx=4096, n_kv=4096, scale=0.088, softcap=0.0, causal=1, window=0, chunk=256))
    res = {}
    for name, (old, new) in cases.items():
        best = {"positional": float("inf"), "keyword": float("inf")}
        for _ in range(a.repeats):
            for label, fn in (("positional", old), ("keyword", new)):
                t = time.thread_time()
                for _ in range(a.n):
                    fn()
                best[label] = min(best[label], (time.thread_time() - t) / a.n)
        res[name] = {k: round(v * 1e9) for k, v in best.items()}
    print(json.dumps({"ns_per_launch": res, "load": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
