"""Energy per cold start read at the NVML counter's steps (commands/bench.py): with a counter
that moves every 100 ms, a run's energy above idle comes out exact, where plain reads at
random moments are off by up to one step.

The clock is virtual (bench's `time` replaced): on a loaded machine a poll that sees the
counter's step can run milliseconds late, and at 100 W each late millisecond is 0.1 J, so
real time made these checks depend on the machine's load. Here every clock read takes
0.1 ms and a sleep takes exactly its length; the child process is real."""

import sys
import time
from types import SimpleNamespace

import pytest

from reflex_ipc.commands import bench


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]

    def perf_counter():
        now[0] += 1e-4
        return now[0]

    def sleep(s):
        now[0] += s

    fake = SimpleNamespace(perf_counter=perf_counter, sleep=sleep, time_ns=time.time_ns, time=time.time)
    monkeypatch.setattr(bench, "time", fake)
    return fake


class StepCounter(bench.GPU):
    """A GPU whose energy counter moves in 100 ms steps at a constant power (W)."""

    def __init__(self, clock, watts=100.0, period=0.1):
        self.nv = True
        self.clock = clock
        self.watts, self.period = watts, period
        self.t0 = clock.perf_counter()

    def energy_mj(self):
        steps = int((self.clock.perf_counter() - self.t0) / self.period)
        return round(steps * self.period * self.watts * 1000.0)


def test_counter_steps_and_idle_power_from_steps(clock):
    g = StepCounter(clock)
    c = g.counter_steps(0.6)
    assert c["period_ms"] == pytest.approx(100, abs=5) and c["step_mj"] == 10000
    assert g.idle_power_w(0.35) == pytest.approx(100.0, rel=0.03)


def test_run_energy_above_idle_is_exact_at_counter_steps(clock):
    g = StepCounter(clock)
    argv = [sys.executable, "-c", "import time; print('x', flush=True); time.sleep(0.23)"]
    nets = []
    for _ in range(3):
        r, out, _ = bench.timed_process(argv, gpu=g, idle_w=100.0, tail_s=0.05)
        assert r["rc"] == 0 and out.strip() == b"x"
        assert r["energy_window_ms"] >= r["wall_ms"] + 50 - 2
        nets.append(r["energy_net_j"])
    # only idle power was drawn: above idle is 0 (a read between steps would be off by up to 10 J)
    assert max(abs(x) for x in nets) < 0.6
