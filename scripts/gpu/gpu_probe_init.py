#!/usr/bin/env python3
"""How CUDA initialization and the imports the CUDA path needs interact in one process.

    python3 scripts/gpu/gpu_probe_init.py [RUNS]

Each variant runs RUNS times in a fresh interpreter; a heartbeat thread (1 ms sleeps)
records the longest time it could not get the GIL. Times are ms since the child started
(after its own interpreter start). Prints a table: per variant the p50 of each mark.
"""

import json
import os
import statistics
import subprocess
import sys

CHILD = r'''
import sys, threading, time
t0 = time.perf_counter()
ms = lambda: round((time.perf_counter() - t0) * 1e3, 1)
marks, gaps = {}, [0.0]
stop = False
def heartbeat():
    last = time.perf_counter()
    while not stop:
        time.sleep(0.001)
        now = time.perf_counter()
        gaps[0] = max(gaps[0], (now - last) * 1e3)
        last = now
threading.Thread(target=heartbeat, daemon=True).start()
def cuinit():
    import ctypes
    lib = ctypes.CDLL("libcuda.so.1"); marks["dlopen_libcuda"] = ms()
    assert lib.cuInit(0) == 0; marks["cuinit"] = ms()
    d, c = ctypes.c_int(), ctypes.c_void_p()
    lib.cuDeviceGet(ctypes.byref(d), 0)
    assert lib.cuDevicePrimaryCtxRetain(ctypes.byref(c), d) == 0; marks["ctx"] = ms()
def imp(name):
    __import__(name); marks["import " + name] = ms()
v = sys.argv[1]
if v == "imports_only":
    imp("numpy"); imp("pycuda._driver")
elif v == "cuinit_only":
    cuinit()
elif v == "cuinit||numpy+pycuda":
    t = threading.Thread(target=cuinit); t.start(); imp("numpy"); imp("pycuda._driver"); t.join()
elif v == "cuinit||numpy, then pycuda":
    t = threading.Thread(target=cuinit); t.start(); imp("numpy"); t.join(); imp("pycuda._driver")
elif v == "cuinit||pycuda-thread||numpy":  # the layout of session 1's init
    t = threading.Thread(target=cuinit); t.start()
    u = threading.Thread(target=imp, args=("pycuda.driver",)); u.start()
    imp("numpy"); t.join(); u.join()
elif v == "numpy, then cuinit||pycuda":
    imp("numpy"); t = threading.Thread(target=cuinit); t.start(); imp("pycuda._driver"); t.join()
marks["end"] = ms()
stop = True
marks["max_gil_gap"] = round(gaps[0], 1)
print(__import__("json").dumps(marks))
'''

VARIANTS = ["imports_only", "cuinit_only", "cuinit||numpy+pycuda", "cuinit||numpy, then pycuda",
            "cuinit||pycuda-thread||numpy", "numpy, then cuinit||pycuda"]


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    res = {v: [] for v in VARIANTS}
    for _ in range(runs):
        for v in VARIANTS:
            p = subprocess.run([sys.executable, "-c", CHILD, v], capture_output=True, text=True)
            if p.returncode:
                print(v, p.stderr[-500:])
                continue
            res[v].append(json.loads(p.stdout.strip().splitlines()[-1]))
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "probe-init.json"), "w") as fh:
            json.dump(res, fh, indent=1)
    for v, rows in res.items():
        keys = []
        for r in rows:
            keys += [k for k in r if k not in keys]
        print(f"{v:30s} " + "  ".join(f"{k}={statistics.median([r[k] for r in rows if k in r]):.0f}"
                                     for k in keys))


if __name__ == "__main__":
    main()
