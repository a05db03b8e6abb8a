"""The start rule (reflex_ipc/startrule.py): where a request runs while the GPU comes up."""

import os

import pytest

from reflex_ipc import startrule as sr

G = 1e9
H200 = {"cores": 16, "isa": "avx512vnni"}


@pytest.fixture
def host16(monkeypatch):
    monkeypatch.setattr(sr, "_host", dict(H200))


def decide(W, E, P, T, one=False, now=180.0, start=25.0):
    return sr.decide(W, sr.Request("x", P, T, one_pass=one), elems=E, now_ms=now,
                     progress={"cuda_thread_start_at": start})


def test_small_model_short_requests_go_to_the_cpu(host16):
    for P, T, one in ((6, 1, False), (12, 0, True), (6, 4, False)):
        d = decide(0.633 * G, 0.596 * G, P, T, one)
        assert d["choice"] == "cpu", d
        assert d["est_ms"]["cpu"] < d["est_ms"]["gpu"]


def test_long_prompts_long_generations_and_big_models_go_to_the_gpu(host16):
    assert decide(0.633 * G, 0.596 * G, 500, 1)["choice"] == "gpu"  # a long prompt
    assert decide(0.633 * G, 0.596 * G, 6, 128)["choice"] == "gpu"  # a long generation
    assert decide(5.44 * G, 8.2 * G, 6, 32)["choice"] == "gpu"  # an 8B shape, 32 tokens
    assert decide(19.9 * G, 30.5 * G, 6, 32)["choice"] == "gpu"


def test_estimates_are_monotonic(host16):
    """More prompt, more tokens or more weights never make an estimate smaller."""
    base = decide(0.633 * G, 0.596 * G, 6, 8)["est_ms"]
    for P, T, W in ((60, 8, 0.633), (6, 64, 0.633), (6, 8, 2.7)):
        e = decide(W * G, W * G / 0.633 * 0.596, P, T)["est_ms"]
        assert all(e[k] >= base[k] for k in ("cpu", "gpu"))


def test_the_gpu_milestones_move_its_estimate(host16):
    """The closer the CUDA start-up is to done, the sooner the GPU estimate."""
    now = 200.0
    py = {"pycuda_start_at": 31.0, "pycuda_imported_at": 180.0}  # start_init: both sides from the start
    started = sr.gpu_in_ms(now, {"cuda_thread_start_at": 30.0, "pycuda_start_at": 31.0})
    cuinit = sr.gpu_in_ms(now, {"cuda_thread_start_at": 30.0, "cuinit_at": 150.0, **py})
    ctx = sr.gpu_in_ms(now, {"cuda_thread_start_at": 30.0, "cuinit_at": 150.0, "context_at": 190.0, **py})
    done = sr.gpu_in_ms(now, {"init_thread_end_at": 199.0})
    assert started == 30 + sr.GPU_INIT_MS - now
    assert cuinit == 150 + sr.GPU_AFTER_CUINIT_MS - now and ctx == 190 + sr.GPU_AFTER_CONTEXT_MS - now
    assert done == 0.0
    assert sr.gpu_in_ms(now, {}) == sr.GPU_INIT_MS  # not started: as if it started now
    # auto: only the driver's thread started; the pycuda side starts when the GPU is wanted, so
    # its import and the fatbin come after now however far the driver is (measured on the H200)
    drv_only = {"cuda_thread_start_at": 30.0, "cuinit_at": 150.0, "context_at": 190.0}
    assert sr.gpu_in_ms(now, drv_only) == sr.GPU_PYCUDA_MS > ctx
    assert sr.gpu_in_ms(now, {**drv_only, "pycuda_start_at": 180.0}) == 180 + sr.GPU_PYCUDA_MS - now


def test_forced_modes_and_one_pass_races(host16):
    r = sr.Request("generate", 6, 32)
    for mode in ("cpu", "gpu", "race"):
        d = sr.decide(0.633 * G, r, elems=0.596 * G, mode=mode, now_ms=100.0)
        assert d["choice"] == mode and d["mode"] == mode
        assert set(d["est_ms"]) == {"cpu", "gpu", "race"}
    one = sr.Request("system1", 20, 0, one_pass=True)
    assert sr.decide(0.633 * G, one, mode="race", now_ms=100.0)["choice"] == "cpu"
    # a race must beat the GPU by the margin
    assert sr.pick({"cpu": 100.0, "gpu": 50.0, "race": 46.0}) == "gpu"
    assert sr.pick({"cpu": 100.0, "gpu": 50.0, "race": 40.0}) == "race"
    assert sr.pick({"cpu": 50.2, "gpu": 50.0, "race": 80.0}) == "gpu"  # a tie goes to the GPU


def test_the_isa_and_the_cores_scale_the_cpu_side(monkeypatch):
    monkeypatch.setattr(sr, "_host", {"cores": 16, "isa": "avx512vnni"})
    fast = decide(0.633 * G, 0.596 * G, 64, 1)["est_ms"]["cpu"]
    monkeypatch.setattr(sr, "_host", {"cores": 16, "isa": "generic"})
    slow = decide(0.633 * G, 0.596 * G, 64, 1)["est_ms"]["cpu"]
    monkeypatch.setattr(sr, "_host", {"cores": 2, "isa": "avx512vnni"})
    few = decide(0.633 * G, 0.596 * G, 64, 1)["est_ms"]["cpu"]
    assert slow > 2 * fast and few > 2 * fast


def test_early_bounds_tokens_from_above(tmp_path, host16):
    """Before the GGUF is parsed: the file's size and the prompt's bytes (never fewer tokens
    than it can have) decide whether CUDA is brought up at all."""
    m = tmp_path / "model.gguf"
    with open(m, "wb") as fh:
        fh.truncate(int(0.633 * G))  # sparse: only the size counts
    short = sr.early(str(m), "generate", prompt_bytes=24, gen_tokens=1, now_ms=40.0,
                     progress={"cuda_thread_start_at": 25.0})
    assert short["choice"] == "cpu" and short["inputs"]["prompt_tokens"] >= 24 // 4
    long = sr.early(str(m), "generate", prompt_bytes=4000, gen_tokens=1, now_ms=40.0)
    assert long["choice"] == "gpu" and long["inputs"]["prompt_tokens"] > 1000
    s1 = sr.early(str(m), "system1", prompt_bytes=30, candidate_bytes=20, now_ms=40.0)
    assert s1["choice"] == "cpu" and s1["inputs"]["gen_tokens"] == 0
    assert sr.early(str(tmp_path / "missing"), "generate", prompt_bytes=10, gen_tokens=1)["inputs"]["weight_bytes"] == 0


def test_host_reads_cores_and_isa():
    h = sr.host()
    assert h["cores"] >= 1 and h["cores"] <= (os.cpu_count() or 1)
    assert h["isa"] in sr.CPU_ISA_FACTOR


def test_the_setting(monkeypatch):
    from reflex_ipc import settings
    from reflex_ipc.errors import ReflexError

    assert settings.get().start == "auto"
    monkeypatch.setenv("REFLEX_START", "race")
    assert settings.get().start == "race"
    monkeypatch.setenv("REFLEX_START", "fastest")
    with pytest.raises(ReflexError) as e:
        settings.get()
    assert "REFLEX_START" in e.value.message
