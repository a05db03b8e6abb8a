"""Per-call host cost of the cpu backend's ctypes launches (issue 26: the ABI table).

Tiny eager ops (a few values, so the C work is negligible) through CpuOps, in ns per call,
the best of --repeats rounds of --n calls each: what the Python layer in front of one C
call costs. Run it against two checkouts to compare (PYTHONPATH picks the tree), paired:

    for i in 1 2 3; do PYTHONPATH=A python bench/cpu_launch.py; PYTHONPATH=B python bench/cpu_launch.py; done

Times are the thread's CPU time (time.thread_time), so that other processes on a busy machine
count less than with wall time.
"""

import argparse
import json
import os
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    from reflex_ipc.backends import cpu_ops
    from reflex_ipc.testing.opchecks import weights_gguf

    ops = cpu_ops.CpuOps(threads=1)
    rng = np.random.default_rng(0)
    a = rng.standard_normal(8).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    out = np.empty(8, np.float32)
    x = rng.standard_normal((1, 32)).astype(np.float32)
    w = ops.load_weight(weights_gguf({"w": (rng.standard_normal((4, 32)).astype(np.float32).view(np.uint8)
                                             .reshape(-1), 0, (4, 32))}), "w")
    y = np.empty((1, 4), np.float32)
    nw = rng.standard_normal(32).astype(np.float32)
    cases = {
        "add (rx_binary, 6 args)": lambda: ops.add(a, b, out=out),
        "silu (rx_unary, 6 args)": lambda: ops.silu(a),
        "rms_norm (rx_rms_norm, 6 args)": lambda: ops.rms_norm(x, nw, 1e-5),
        "matmul (rx_matmul, 13 args)": lambda: ops.matmul(x, w, out=y),
    }
    kc, vc = ops.zeros((1, 8, 32), ops.kv_dtype), ops.zeros((1, 8, 32), ops.kv_dtype)
    q = rng.standard_normal((1, 1, 32)).astype(np.float32)
    pos = ops.positions([3])
    cases["attention (rx_attention, 18 args)"] = lambda: ops.attention(q, kc, vc, pos, 4, scale=0.2)
    pa, pb, po = a.ctypes.data, b.ctypes.data, out.ctypes.data
    if hasattr(ops, "_c"):  # before the ABI table: positional arguments through _c
        cases["launch only: rx_binary"] = lambda: ops._c(7, 0, pa, pb, po, 8, 8)
        cases["launch only: rx_matmul"] = lambda: ops._c(1, 1, 32, x.ctypes.data, 32, 1, w.ptr, None, None,
                                                         y.ctypes.data, None, None, 0, 0)
    else:
        cases["launch only: rx_binary"] = lambda: ops.rx_binary(op=0, a=pa, b=pb, out=po, n=8, nb=8)
        cases["launch only: rx_matmul"] = lambda: ops.rx_matmul(
            N=1, K=32, x=x.ctypes.data, ldx=32, nw=1, w0=w.ptr, w1=None, w2=None, y0=y.ctypes.data, y1=None,
            y2=None, mode=0, accumulate=0)
    res = {}
    for name, fn in cases.items():
        for _ in range(200):
            fn()
        best = float("inf")
        for _ in range(args.repeats):
            t = time.thread_time()
            for _ in range(args.n):
                fn()
            best = min(best, (time.thread_time() - t) / args.n)
        res[name] = round(best * 1e9)
    print(json.dumps({"tree": os.path.dirname(os.path.dirname(os.path.abspath(cpu_ops.__file__))),
                      "ns_per_call": res, "load": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
