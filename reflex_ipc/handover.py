"""A backend that comes up late, and moving a runner onto it while it works.

`LateBackend` is a backend being made ready elsewhere: `LateBackend.thread(build, name)` runs
`build() -> (ops, model)` on a daemon thread (the CUDA backend: init thread joined, weights
uploaded); `LateBackend.manual(ops, model, event)` is ready when `event` is set (tests inject
one at a chosen token). `ready()` never blocks; `wait()` does; `take()` returns (ops, model) in
the calling thread (running the backend's `prepare`, e.g. making the CUDA context current
there) or raises the error the build failed with.

The move itself (`Executor.move_to`, called by `Runner.adopt`) is backend-generic: the
model-owned State is snapshotted to host arrays (`State.snapshot`: slot arrays cut to the held
tokens, sequence 0's per-sequence arrays), restored into a new State on the new backend
(casting float16 <-> float32 as its KV dtype needs), captured graphs are dropped (they hold
the old addresses) and the executor's ops and model are the new ones. Between two decode steps
the state holds exactly the evaluated tokens; the token chosen last is evaluated by the next
step, on the new backend, so no token is repeated or lost. Everything of the sampling lives on
the host (generation/: processors and their history, the seeded sampler's RNG, the grammar's
state, the stop matcher, the thinking budget) and carries on unchanged.
"""

from __future__ import annotations

import threading
import time


class LateBackend:
    def __init__(self, name, event, *, prepare=None):
        self.name = name
        self.event = event
        self.prepare = prepare
        self.result = None  # (ops, model)
        self.error = None
        self.taken = False
        self.started_at = time.perf_counter()
        self.ready_at = None
        self.cancelled = False

    @classmethod
    def thread(cls, build, name, *, prepare=None):
        """build() -> (ops, model) run on a daemon thread, started now."""
        lb = cls(name, threading.Event(), prepare=prepare)

        def run():
            try:
                lb.result = build()
            except BaseException as e:  # reported to whoever takes it
                lb.error = e
            lb.ready_at = time.perf_counter()
            lb.event.set()

        lb._thread = threading.Thread(target=run, name=f"reflex-late-{name}", daemon=True)
        lb._thread.start()
        return lb

    @classmethod
    def manual(cls, ops, model, event=None, name=None):
        """(ops, model) made already, ready once `event` is set (a threading.Event, or any
        object with is_set() and wait())."""
        lb = cls(name or ops.name, event if event is not None else threading.Event())
        lb.result = (ops, model)
        return lb

    def ready(self) -> bool:
        return self.event.is_set()

    def wait(self, timeout=None) -> bool:
        return self.event.wait(timeout)

    def failed(self) -> bool:
        return self.ready() and self.error is not None

    def take(self):
        """(ops, model), once ready; the build's error otherwise."""
        self.wait()
        if self.error is not None:
            raise self.error
        if self.prepare is not None:
            self.prepare()
        self.taken = True
        return self.result


def state_nbytes(state) -> int:
    """Bytes of the filled part of a State (what a move copies)."""
    if state is None or not state.tokens:
        return 0
    import math

    n = len(state.tokens)
    total = 0
    for layer in state.layers:
        for name, a in layer.arrays.items():
            item = 2 if str(getattr(a, "dtype", "float32")) == "float16" else 4
            if layer.spec.kind == "seq":
                total += math.prod(a.shape[1:]) * 4
            else:
                shape = list(a.shape)
                shape[layer.spec.slot_axis(name)] = n
                total += math.prod(shape) * item
    return total
