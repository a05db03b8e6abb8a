"""The GPU breakdown driver (reflex_ipc/testing/breakdown.py) end to end on the cpu backend,
and the kernel profiler's bookkeeping (reflex_ipc/cuda/profile.py) with stand-in events."""

import json
import os

import pytest

from reflex_ipc.testing import breakdown

DATA = os.path.join(os.path.dirname(__file__), "data")


def test_breakdown_runs_every_part_on_cpu(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("REFLEX_BREAKDOWN_DEVICE", "cpu")
    monkeypatch.delenv("LLAMA_BENCH", raising=False)
    model = os.path.join(DATA, "synthetic-qwen3.gguf")
    assert breakdown.main([str(tmp_path), "--models", model, "--runs", "2", "--variant", "REFLEX_FUSE=0"]) == 0
    (out,) = tmp_path.iterdir()
    rec = json.loads(out.read_text())
    for k in ("generate1_same", "generate1_new_length", "system1x3_same", "system1x3_new_length"):
        assert rec["warm"][k]["wall_ms"]["n"] == 2
        assert rec["stdio"][k]["client_ms"]["p50"] > 0
        assert rec["stdio"][k]["protocol_and_pipe_ms"] is not None
    assert rec["prefill"]["tokens"] == 512 and rec["prefill"]["tok_s"] > 0
    assert rec["decode"]["ms_per_token"] > 0 and rec["decode_eager"]["graph"] is False
    assert any("tottime" in line for line in rec["warm"]["cprofile_generate1_same"]["top_tottime"])
    assert rec["llama_bench"] == {"error": "no $LLAMA_BENCH"}
    assert rec["variants"]["REFLEX_FUSE=0"]["prefill"]["tok_s"] > 0
    assert out.name == "synthetic-qwen3.json"
    assert "synthetic-qwen3" in capsys.readouterr().out


class _Event:
    clock = [0.0]

    def __init__(self):
        self.t = None

    def record(self, stream):
        _Event.clock[0] += 1.0
        self.t = _Event.clock[0]

    def synchronize(self):
        pass

    def time_since(self, other):
        return self.t - other.t


class _Drv:
    Event = _Event


def test_profiler_sums_kernels_and_skips_captures():
    from reflex_ipc.cuda import profile

    p = profile.Profiler(_Drv, stream=None)
    calls = []
    def kernel(name):  # copy_f32's launcher (a, y, n) over a recording launch, timed
        from reflex_ipc.cuda.core import make_kernel

        launch = profile.timed_launch(name, lambda grid, block, args, shared, stream: calls.append(
            (grid, block, *args)))
        return make_kernel(None, "copy_f32", None, pack=lambda a, y, n: (n,), launch=launch)

    k1, k2 = kernel("a"), kernel("b")
    k1((1, 1, 1), (32, 1, 1), a=0, y=0, n=5)  # no window: launched, not recorded
    p.window()
    k1((1, 1, 1), (32, 1, 1), a=0, y=0, n=1)
    k2((1, 1, 1), (32, 1, 1), a=0, y=0, n=2)
    profile.CAPTURING[0] = True
    try:
        k2((1, 1, 1), (32, 1, 1), a=0, y=0, n=3)  # captured: launched, not recorded
    finally:
        profile.CAPTURING[0] = False
    k1((1, 1, 1), (32, 1, 1), a=0, y=0, n=4)
    rep = p.report()
    assert [c[2] for c in calls] == [5, 1, 2, 3, 4]
    assert rep["kernels"] == 3
    # each kernel's events are 1 apart; consecutive kernels' 1 apart: span 5, busy 3
    assert rep["gpu_ms"] == pytest.approx(3.0) and rep["span_ms"] == pytest.approx(5.0)
    assert rep["idle_ms"] == pytest.approx(2.0)
    assert rep["by_kernel"] == {"a": [2, 2.0], "b": [1, 1.0]}
    assert profile.ACTIVE is None

