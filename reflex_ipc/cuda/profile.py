"""Per-kernel GPU time for breakdowns ($REFLEX_PROFILE=1; off otherwise, and never imported).

With the switch on, Runtime.kernel makes each launcher with `timed_launch`, which records a
CUDA event before and after each launch on the runtime's stream, and Graph.launch records one around a
whole replay (named "graph:<nodes>"). Nothing is recorded while a stream captures a graph
(an event in a capture is a dependency, not a timestamp). `Profiler.window()` opens a
window; `Profiler.report()` waits for the GPU and returns, for the window:

    kernels     launches recorded (a graph replay counts once)
    gpu_ms      sum of the kernels' own GPU times
    span_ms     first kernel's start to the last one's end, on the GPU
    idle_ms     span - gpu_ms: the GPU waiting between kernels (for the host's launches)
    launch_host_ms  host time spent inside the launch calls (argument packing + driver)
    by_kernel   {name: [launches, gpu_ms]}, largest first

The events cost ~1-2 us of host time per launch, so host-side figures from a profiled run
are upper bounds; GPU times per kernel are not affected.
"""

import time

ACTIVE = None  # the Profiler while a window is open (Graph.launch looks here)
CAPTURING = [False]  # set by cuda.graph.Graph while a capture is open


class Profiler:
    def __init__(self, drv, stream):
        self.drv = drv
        self.stream = stream
        self._free = []
        self.records = []  # (name, event before, event after)
        self.host_s = 0.0

    def _event(self):
        return self._free.pop() if self._free else self.drv.Event()

    def window(self):
        global ACTIVE
        self._free.extend(e for _, a, b in self.records for e in (a, b))
        self.records = []
        self.host_s = 0.0
        ACTIVE = self

    def around(self, name, fn, *args):
        if CAPTURING[0]:
            return fn(*args)
        a, b = self._event(), self._event()
        t0 = time.perf_counter()
        a.record(self.stream)
        r = fn(*args)
        b.record(self.stream)
        self.host_s += time.perf_counter() - t0
        self.records.append((name, a, b))
        return r

    def report(self, top=40):
        global ACTIVE
        ACTIVE = None
        if not self.records:
            return {"kernels": 0, "gpu_ms": 0.0, "span_ms": 0.0, "idle_ms": 0.0,
                    "launch_host_ms": round(self.host_s * 1e3, 3), "by_kernel": {}}
        self.records[-1][2].synchronize()
        by = {}
        busy = 0.0
        for name, a, b in self.records:
            ms = b.time_since(a)
            busy += ms
            n, t = by.get(name, (0, 0.0))
            by[name] = (n + 1, t + ms)
        span = self.records[-1][2].time_since(self.records[0][1])
        ordered = sorted(by.items(), key=lambda kv: -kv[1][1])[:top]
        return {"kernels": len(self.records), "gpu_ms": round(busy, 4), "span_ms": round(span, 4),
                "idle_ms": round(max(0.0, span - busy), 4), "launch_host_ms": round(self.host_s * 1e3, 3),
                "by_kernel": {k: [n, round(t, 4)] for k, (n, t) in ordered}}


def timed_launch(name, launch):
    """The launch function (grid, block, packed args, shared, stream) of kernel `name`, timed
    while a window is open (core.make_kernel's `launch`)."""

    def timed(grid, block, args, shared, stream):
        p = ACTIVE
        if p is None:
            return launch(grid, block, args, shared, stream)
        return p.around(name, launch, grid, block, args, shared, stream)

    return timed
