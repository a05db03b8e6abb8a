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


def _cold(failures=0, peer_failures=None):
    r = {"mode": "cold", "op": "generate", "runs": 2, "failures": failures,
         "wall_ms": stats([300.0, 320.0]), "first_byte_ms": stats([290.0, 300.0]),
         "phases_ms": {"runner_loaded": stats([200.0, 210.0])}, "energy_net_j_mean": None}
    if peer_failures is not None:
        per = [{"rc": 127, "stderr_tail": "sh: 1: llama-simple: not found\n"}] * peer_failures
        per += [{"rc": 0, "wall_ms": 900.0}] * (2 - peer_failures)
        r["vs"] = {"name": "llama.cpp", "command": "llama-simple -m M", "failures": peer_failures,
                   "wall_ms": stats([p.get("wall_ms") for p in per if p["rc"] == 0]),
                   "speedup_pairwise": stats([3.0] * (2 - peer_failures)), "per_run": per}
    return r


def test_summary_is_a_clean_table():
    """One row per measurement with p50/p95/runs columns: no dict reprs, no None, no
    `VRAM None MiB` where there is no GPU, whole numbers without `.0`."""
    from reflex_ipc.commands.bench import summary_table

    out = {"runs": [_cold(peer_failures=0),
                    {"mode": "warm", "ready_ms": 60.5, "first_request_ms": 300.2,
                     "generate_1_token_ms": stats([40.0, 44.0]), "system1_3_candidates_ms": stats([50.0]),
                     "system1_3_candidates_new_prompt_each_ms": None, "vram_process_mib": None},
                    {"mode": "prefill", "prompt_tokens": stats([256.0, 256.0]),
                     "prompt_eval_ms": stats([1000.0]), "tokens_per_s": stats([256.0])},
                    {"mode": "decode", "best_of_3": {"tokens_per_s": 120.5, "tokens": 64, "decode_ms": 525.0},
                     "vram_process_mib": None}]}
    text = summary_table(out)
    assert "{" not in text and "None" not in text and "VRAM" not in text and "256.0" not in text
    lines = text.splitlines()
    assert lines[0].split()[:4] == ["measurement", "p50", "p95", "runs"] and set(lines[1]) == {"-"}
    assert any(ln.startswith("prefill 256-token prompt") for ln in lines)
    assert any(ln.startswith("  llama.cpp / reflex") and "3.00x" in ln for ln in lines)


def test_a_failing_peer_is_reported_and_fails_the_run():
    from reflex_ipc.commands.bench import failures, summary_table

    out = {"runs": [_cold(peer_failures=2)]}
    bad = failures(out)
    assert len(bad) == 1 and "2 of 2 runs of the peer 'llama.cpp' failed (exit status 127)" in bad[0]
    assert "llama-simple: not found" in bad[0]
    assert "2 of 2 FAILED" in summary_table(out) and "no pair where both ran" in summary_table(out)
    assert failures({"runs": [_cold(failures=1)]}) == ["1 of 2 cold reflex runs failed"]
    assert failures({"runs": [_cold(peer_failures=0)]}) == []
