"""Pieces of `reflex bench` that run without a GPU: percentiles and energy arithmetic."""

from reflex_ipc.commands.bench import mean_net_energy, stats


def test_stats_percentiles():
    s = stats([5, 1, None, 3, 2, 4])
    assert s["n"] == 5 and s["min"] == 1 and s["max"] == 5 and s["p50"] == 3
    assert stats([None]) is None


def test_mean_net_energy_uses_the_totals():
    runs = [{"rc": 0, "energy_j": 60.0, "wall_ms": 400.0}, {"rc": 0, "energy_j": 50.0, "wall_ms": 300.0},
            {"rc": 1, "energy_j": 999.0, "wall_ms": 10.0}, {"rc": 0, "wall_ms": 300.0}]
    # (60 + 50 - 120 W x 0.7 s) / 2: failed runs and runs without a reading are left out
    assert mean_net_energy(runs, 120.0) == 13.0
    assert mean_net_energy(runs, None) is None
    assert mean_net_energy([], 120.0) is None
