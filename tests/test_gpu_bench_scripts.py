"""The GPU host's benchmark code (reflex_ipc.testing.shaped and .benchrun, behind
scripts/gpu/make_shaped.py and gpu-bench-*), here on tiny shapes: the shaped GGUFs (the
shaped GGUFs load and evaluate in reflex's numpy backend and in llama.cpp, with finite,
spread logits), the drivers' parsing of llama-simple's stderr (real captured samples) and of
llama-bench's JSON, one cold run through `reflex bench cold` against a fake llama-simple, and
the ratios, table and plot of a results directory."""

import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from reflex_ipc.commands.bench import parse_llama_simple, prefill_prompt, spread
from reflex_ipc.testing import benchrun
from reflex_ipc.testing import shaped as make_shaped

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FAKE = os.path.join(ROOT, "tests", "data", "fake-peers")
IDS = [785, 6722, 315, 9625, 374, 12095, 13, 576]
# one of each layout: tied / untied dense, MoE, MLA + shared experts + dense first layer, hybrid
TINY_MODELS = ["qwen3-0.6b", "qwen3-8b", "qwen3-30b-a3b", "deepseek-v2-lite", "qwen35-2b", "gpt-oss-20b-q8_0"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("shaped")
    return {m: make_shaped.write_model(m, str(d / f"{m}.gguf"), tiny=True) for m in TINY_MODELS}


def _reflex_logits(path):
    from reflex_ipc.backends.numpy_ops import NumpyOps
    from reflex_ipc.gguffile import GGUFFile
    from reflex_ipc.models import load_model
    from reflex_ipc.runtime.batch import Batch

    ops = NumpyOps()
    with GGUFFile(path) as f:
        model = load_model(ops, f)
        if hasattr(model, "configure"):
            model.configure(64)
        state = model.new_state(ops, 64)
        return np.asarray(model.forward(state, Batch(ops, IDS, range(len(IDS)))), dtype=np.float64)


@pytest.mark.parametrize("name", TINY_MODELS)
def test_shaped_models_evaluate_in_reflex_and_llama_cpp(tiny, name, llama_cpp):
    path = tiny[name]["path"]
    ours = _reflex_logits(path)
    llm = llama_cpp.Llama(path, logits_all=True, n_ctx=64, n_batch=64, type_k=0, type_v=0, verbose=False)
    try:
        llm.eval(IDS)
        ref = np.array(llm.scores[:len(IDS)], dtype=np.float64)
    finally:
        llm.close()
    assert ours.shape == ref.shape == (len(IDS), 201088 if name.startswith("gpt-oss") else 151936)
    for z in (ours, ref):
        assert np.isfinite(z).all()
        assert z.std(axis=-1).min() > 1.0  # spread logits, of a realistic magnitude
        assert np.abs(z).max() < 100.0
    # the same model: llama.cpp rounds activations to 8 bits for the quantized matmuls
    assert np.abs(ours - ref).max() / np.abs(ref).max() < 0.15
    assert (ours.argmax(-1) == ref.argmax(-1)).mean() >= 0.75


def test_shaped_file_layout(tiny):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from reflex_ipc.gguffile import GGUFFile

    info = tiny["deepseek-v2-lite"]
    with GGUFFile(info["path"]) as f:
        types = {n: t.type_name for n, t in f.tensors.items()}
        assert types["output.weight"] == "Q6_K" and types["token_embd.weight"] == "Q4_K"
        assert types["blk.1.ffn_down_exps.weight"] == "Q8_0"  # rows of 160 values: not Q6_K's 256
        assert types["blk.1.ffn_gate_inp.weight"] == "F32"
        assert types["blk.0.ffn_down.weight"] == "Q8_0"  # 352, as the real 10944
        assert f.arch_get("rope.scaling.type") == "yarn" and f.arch_get("expert_shared_count") == 2
        assert len(f.get("tokenizer.ggml.tokens")) == 151936
        # the pools' blocks are well formed: finite, zero-mean-ish values of about the planned std
        t = f.tensors["blk.0.attn_q.weight"]
        w = dequantize(np.array(f.tensor_data(t)).reshape(t.shape[1], -1), GGMLQuantizationType[t.type_name])
    assert os.path.getsize(info["path"]) == info["bytes"]
    assert np.isfinite(w).all() and abs(w.mean()) < 0.01 and 0.5 < w.std() * np.sqrt(256) < 2.0


def test_full_size_plans():
    want = {"qwen3-0.6b": 0.60, "qwen3-4b": 4.02, "qwen3-8b": 8.19, "qwen3-14b": 14.77, "qwen3-32b": 32.76,
            "qwen3-30b-a3b": 30.5, "deepseek-v2-lite": 15.9, "qwen35-2b": 2.0}
    for name, b in want.items():
        plan = make_shaped.tensor_plan(make_shaped.config(name), 151936)
        assert abs(make_shaped.n_params(plan) / 1e9 - b) < 0.05, name
        fmts = {n: f for n, _, f, _, _ in plan}
        assert set(fmts.values()) <= {"F32", "Q4_K", "Q6_K", "Q8_0"}
    moe = {n: (s, f) for n, s, f, _, _ in make_shaped.tensor_plan(make_shaped.config("qwen3-30b-a3b"), 151936)}
    assert moe["blk.47.ffn_gate_exps.weight"] == ((128, 768, 2048), "Q4_K")
    assert moe["blk.0.ffn_down_exps.weight"] == ((128, 2048, 768), "Q6_K")
    oss = make_shaped.tensor_plan(make_shaped.config("gpt-oss-20b"), 201088)
    assert abs(make_shaped.n_params(oss) / 1e9 - 20.91) < 0.05  # openai/gpt-oss-20b: 20.9 B
    fmts = {n: f for n, _, f, _, _ in oss}
    assert fmts["blk.23.ffn_gate_exps.weight"] == fmts["blk.0.ffn_down_exps.weight"] == "MXFP4"
    assert fmts["blk.0.ffn_gate_exps.bias"] == fmts["blk.0.attn_sinks.weight"] == "F32"
    assert fmts["blk.0.attn_q.weight"] == "Q8_0"  # 2880 columns: not whole Q4_K blocks
    assert sum(make_shaped.nbytes(s, f) for _, s, f, _, _ in oss) / 1e9 < 12.5  # 12.8 GB as released
    meta = make_shaped.metadata(make_shaped.config("qwen35-2b"), 151936)
    assert meta["full_attention_interval"] == 4 and sum(meta["rope.dimension_sections"]) * 2 == meta[
        "rope.dimension_count"]


def test_pools_repeat_blocks_from_any_offset(tmp_path):
    pools = make_shaped.Pools(0, blocks=7)
    with open(tmp_path / "x", "wb") as fh:
        fh.truncate(100 + 20 * 34)
        for at, mv in pools.slices("Q8_0", 0.05, 20, offset=5, at=100):
            make_shaped._pwrite_all(fh.fileno(), mv, at)
    data = (tmp_path / "x").read_bytes()
    assert data[:100] == bytes(100)
    pool = bytes(pools.get("Q8_0", 0.05))[:7 * 34]
    blocks = [data[100 + i * 34:100 + (i + 1) * 34] for i in range(20)]
    assert blocks == [pool[((5 + i) % 7) * 34:((5 + i) % 7 + 1) * 34] for i in range(20)]


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "bench/results/llama-simple-decode-h200-*.txt"))))
def test_parse_llama_simple_captured(path):
    with open(path) as fh:
        got = parse_llama_simple(fh.read())
    assert got["decoded"] == 128 and got["speed_tps"] > 100
    assert got["prompt_eval_n"] == 5 and got["eval_n"] == 127 and 100 < got["eval_ms"] < 300


def test_parse_llama_simple_full_stderr():
    err = subprocess.run([os.path.join(FAKE, "llama-simple"), "-m", "m", "-n", "1", "hi"], capture_output=True,
                         text=True).stderr
    assert parse_llama_simple(err)["load_ms"] == 810.12
    assert parse_llama_simple("llama_model_load: error") == {}


def test_parse_llama_bench():
    out = subprocess.run([os.path.join(FAKE, "llama-bench"), "-m", "m", "-p", "512", "-n", "128", "-r", "3", "-o",
                          "json"], capture_output=True, text=True, check=True).stdout
    fig = benchrun.llama_bench_figures(benchrun.parse_llama_bench(out))
    assert fig["tg"]["n_gen"] == 128 and fig["tg"]["avg_ts"] == 701.0 and len(fig["tg"]["samples_ts"]) == 3
    assert fig["pp"]["n_prompt"] == 512 and fig["pp"]["avg_ts"] == 20000.0
    # a run cut short after its first test (the array never closed), and jsonl
    cut = out[:out.index("},") + 1]
    assert [r["n_prompt"] for r in benchrun.parse_llama_bench(cut)] == [512]
    rows = json.loads(out)
    assert len(benchrun.parse_llama_bench("\n".join(json.dumps(r) for r in rows))) == 2
    assert benchrun.parse_llama_bench("") == [] and benchrun.parse_llama_bench("garbage") == []


def test_spread_and_prompt():
    assert spread([1.0]) is None
    s = spread([1.0, 1.2, 0.8, None])
    assert s["n"] == 3 and abs(s["cv"] - 0.2) < 1e-9
    a, b = prefill_prompt(500, 0), prefill_prompt(500, 1)
    assert len(a.split()) == 500 and a.split()[0] != b.split()[0]


def test_cold_run_against_a_fake_llama_simple(tmp_path, monkeypatch):
    """One `reflex bench cold` pair through the driver: reflex on numpy, the fake peer."""
    monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    model = os.path.join(ROOT, "tests", "data", "synthetic-qwen3.gguf")
    ns = type("A", (), dict(out=str(tmp_path), budget_s=60, device="numpy", suite="scale", python=sys.executable,
                            python_isolated=False, llama_simple=os.path.join(FAKE, "llama-simple"), llama_bench=None,
                            drop_caches=False))
    r = benchrun.Runner(ns)
    r.idle_w = None
    res = r.cold(model, 1, 120)
    assert "error" not in res, res
    assert res["failures"] == 0 and res["per_run"][0]["first_byte_ms"] <= res["per_run"][0]["wall_ms"]
    peer = res["vs"]["per_run"][0]
    assert peer["rc"] == 0 and peer["llama_simple"]["load_ms"] == 810.12
    assert res["vs"]["speedup_pairwise"]["n"] == 1
    lb = r.llama_bench(model, 30)
    assert lb["error"].startswith("no llama-bench")


def test_ratios_table_and_plot(tmp_path):
    def cold(ms, peer_ms):
        return {"wall_ms": {"p50": ms, "p95": ms * 1.1}, "first_byte_ms": {"p50": ms - 5},
                "upload_GB_per_s": {"p50": 9.5}, "energy_net_j_mean": 30.0,
                "vs": {"wall_ms": {"p50": peer_ms, "p95": peer_ms}, "speedup_pairwise": {"p50": peer_ms / ms},
                       "energy_net_j_mean": 90.0}}

    summary = {"suite": "scale", "machine": {"gpu": {"name": "NVIDIA H200"}, "commit": "abcdef0"}, "models": {}}
    for name, gb, ms in (("qwen3-0.6b", 0.43, 300.0), ("qwen3-4b", 2.7, 700.0)):
        rec = {"model": name, "file_bytes": gb * 1e9, "steps": {
            "cold": cold(ms, 4 * ms), "page_cache": {"GB_per_s": 12.0},
            "llama_bench": {"figures": {"tg": {"avg_ts": 500.0}, "pp": {"avg_ts": 20000.0}}},
            "decode": {"best_of_3": {"tokens_per_s": 450.0}, "vram_process_mib": 1200.0},
            "prefill": {"tokens_per_s": {"p50": 18000.0}},
            "warm": {"system1_3_candidates_ms": {"p50": 4.0}, "generate_1_token_ms": {"p50": 3.0}}}}
        rec["steps"]["cold"]["upload_modes"] = {"register": 3}
        rec["steps"]["cold_dropped_cache"] = {**cold(ms * 3, ms * 5), "upload_GB_per_s": {"p50": 5.2},
                                              "upload_modes": {"read": 2}}
        rec["ratios"] = benchrun.ratios(rec)
        summary["models"][name] = rec
        (tmp_path / f"{name}.json").write_text(json.dumps(rec))
    r = summary["models"]["qwen3-4b"]["ratios"]
    assert r["cold_speedup_pairwise_p50"] == 4.0 and r["decode_ratio"] == 0.9 and r["prefill_ratio"] == 0.9
    assert r["vram_reflex_mib"] == 1200.0 and r["upload_GB_per_s_p50"] == 9.5
    assert r["upload_modes"] == {"register": 3}
    assert r["cold_dropped_upload_GB_per_s_p50"] == 5.2 and r["cold_dropped_upload_modes"] == {"read": 2}
    summary["models"]["qwen3-8b"] = {"model": "qwen3-8b", "error": "RuntimeError: boom"}
    text = benchrun.table(summary)
    assert "qwen3-4b" in text and "boom" in text
    assert "cold_dropped_upload_GB_per_s_p50 5.2" in text and "cold_dropped_upload_modes {'read': 2}" in text
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    _, points = benchrun.load_points(str(tmp_path))
    assert [p[0] for p in points] == ["qwen3-0.6b", "qwen3-4b"]
    assert points[1][2]["llama-simple"] == (2800.0, 2800.0)


def test_energy_batches_until_the_spread_is_small(tmp_path):
    """cold19's energy loop (NVML is on the GPU host only): batches of pairs are added until
    both engines' spread is under 20%, and it stops, target not met, when the time is spent."""
    ns = type("A", (), dict(out=str(tmp_path), budget_s=600, device="numpy", suite="cold19", python=sys.executable,
                            python_isolated=False, llama_simple="peer", llama_bench=None, drop_caches=False))
    r = benchrun.Runner(ns)
    r.idle_w = 70.0

    def batch(values):
        runs = [{"rc": 0, "energy_net_j": v, "energy_first_net_j": v / 2} for v in values]
        return {"per_run": runs, "vs": {"per_run": [dict(x, energy_net_j=3 * x["energy_net_j"]) for x in runs]}}

    noisy = batch([10.0, 30.0, 5.0, 40.0])
    calls = []

    def cold(path, n, timeout, **kw):
        calls.append(n)
        return batch([20.0 + (i % 2) for i in range(n)])

    r.cold = cold
    rec = {"model": "m", "steps": {"cold": noisy}}
    e = r.energy(rec, "m.gguf", 1.0, lambda: 1000.0)
    assert e["target_met"] and e["extra_batches"] >= 1 and calls[0] == 10
    assert e["spread"]["peer"]["cv"] < 0.2 and len(rec["steps"]["energy_batches"]) == e["extra_batches"]
    calls.clear()
    e = r.energy({"model": "m", "steps": {"cold": noisy}}, "m.gguf", 1.0, lambda: 10.0)
    assert not e["target_met"] and calls == [] and e["spread"]["reflex"]["n"] == 4


def test_upload_mode_of_cold_runs():
    from reflex_ipc.commands.bench import mode_counts, upload_gbps, upload_modes

    t = {"cuda": {"upload": [{"mode": "read", "bytes": 5_000_000_000, "upload_ms": 1000.0, "resident": 0.0}]}}
    assert upload_modes(t) == "read" and upload_gbps(t) == 5.0
    t2 = {"cuda": {"upload": [{"mode": "register", "bytes": 1, "upload_ms": 1}, {"mode": "staging", "bytes": 1,
                                                                                 "upload_ms": 1}]}}
    assert upload_modes(t2) == "register+staging"
    assert upload_modes({"phases": {}}) is None and upload_modes(None) is None
    assert mode_counts([{"upload_mode": "read"}, {"upload_mode": "read"}, {"upload_mode": None},
                        {"upload_mode": "register"}]) == {"read": 2, "register": 1}


def test_bigmodel_misses_and_table():
    """gpu-bigmodel's miss list (what gets a per-kernel breakdown) and its last table."""
    from reflex_ipc.testing import bigmodel

    r = {"prefill_ratio": 1.2, "decode_ratio": 1.05, "cold_dropped_reflex_p50_ms": 8000.0,
         "cold_dropped_llama_simple_p50_ms": 15000.0}
    assert benchrun.bigmodel_misses("qwen3-30b-a3b", r) == ["decode_ratio", "cold_dropped"]
    assert benchrun.bigmodel_misses("deepseek-v2-lite", dict(r, decode_ratio=1.2)) == []
    assert benchrun.bigmodel_misses("qwen35-2b", {}) == ["prefill_ratio", "decode_ratio"]
    rec = {"model": "deepseek-v2-lite", "steps": {"prefill_ab_REFLEX_MLA_FLASH": {"mma_speedup_p50": 3.5}}}
    assert benchrun.ratios(rec)["prefill_ab_REFLEX_MLA_FLASH_speedup_p50"] == 3.5
    report = {"ok": True, "path": "x.json",
              "checks": {"n": 2, "failed": [], "rows": [{"op": "moe_grouped", "rel_err": 1e-3, "ok": True},
                                                        {"op": "mla_prefill", "rel_err": 2e-3, "ok": True}],
                         "bench_moe": {"qwen3-30b-a3b": {"pairs_N8_us": 90.0, "grouped_N8_us": 300.0,
                                                         "device_N1_graph_us": 40.0}}},
              "engine": {"runs": [{"model": "qwen3moe-e32-k4", "ok": True, "new_moe_mma_launches": 2}]},
              "bench": {"summary": {"models": {"qwen3-30b-a3b": {"model": "qwen3-30b-a3b", "ratios": r}},
                                    "drop_caches": {"allowed": True}}}}
    text = bigmodel.table(report)
    assert "checks: 2/2 passed" in text and "N=8: 300.0 vs 90.0 us" in text and "new_moe_mma_launches" in text
    assert text.splitlines()[-1].startswith("ALL CHECKS OK: True")


def test_cpufirst_dry_run(tmp_path, monkeypatch, capsys):
    """scripts/gpu/gpu-bench-cpufirst on a tiny 0.6B-layout model, the cpu backend and the fake
    llama-simple: both variants and the peer alternate, the JSON has every run, the table ends."""
    from reflex_ipc.testing import cpufirst

    monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = tmp_path / "out"
    rc = cpufirst.main([str(out), "--device", "cpu", "--python", sys.executable, "--tiny", "--runs", "2",
                        "--cases", "q8_0:gen1", "q8_0:system1", "--models-dir", str(tmp_path / "m"),
                        "--llama-simple", os.path.join(FAKE, "llama-simple"), "--budget-s", "120",
                        "--variants", "gpu", "auto", "cpu"])
    assert rc == 0
    res = json.loads((out / "cpufirst.json").read_text())
    g1 = res["cases"]["q8_0:gen1"]
    assert [len(g1["runs"][v]) for v in ("gpu", "auto", "cpu", "llama-simple")] == [2, 2, 2, 2]
    assert all(r["rc"] == 0 and r["backend"] == "cpu" and r["phases"]["first_token"] for r in g1["runs"]["auto"])
    assert g1["summary"]["auto"]["wall_ms"]["n"] == 2 and g1["auto_over_gpu"]["n"] == 2
    assert g1["peer_over_variant"]["auto"] > 0
    s1 = res["cases"]["q8_0:system1"]
    assert not s1["runs"]["llama-simple"] and s1["summary"]["gpu"]["failures"] == 0
    table = capsys.readouterr().out.strip().splitlines()
    assert table[0].startswith("model") and "target: <= 200 ms" in "\n".join(table)
    assert any(x.startswith("phase marks") for x in table)
    assert any(x.split()[:2] == ["q8_0:gen1", "cpu"] for x in table)
    assert table[-1].startswith("idle power")


@pytest.mark.parametrize("device", ["cpu", "numpy"])
def test_moe_first_token_imports_no_numpy_ma(tiny, device):
    """A cold MoE process's path to its first token takes the routed experts' distinct ids
    from backends.base.unique_ids: numpy 2.x's np.unique imports numpy.ma on first use (~6 ms
    here, more beside the CUDA backend's streaming upload)."""
    code = ("import sys\nfrom reflex_ipc import cli\n"
            f"rc = cli.main(['generate', '--device', {device!r}, '--model', {tiny['qwen3-30b-a3b']['path']!r}, "
            "'--max-tokens', '2', 'The capital of France is'])\n"
            "print('numpy.ma' in sys.modules, 'numpy' in sys.modules, rc, file=sys.stderr)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=ROOT, REFLEX_DETACH="0", REFLEX_PREFIX_CACHE="0"))
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip().splitlines()[-1] == "False True 0", r.stderr
