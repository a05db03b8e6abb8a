"""Starting on one backend and finishing on another (reflex_ipc/handover.py, Runner.adopt,
Executor.move_to): the state moved mid-generation gives the continuation a run on the target
backend gives with the same first tokens, no token repeated or lost, and the sampling state
(seed and RNG position, penalties' history, DRY, logit bias, logprobs, the stop matcher)
carries over. The "late" backend is a second backend made beforehand and declared ready by
an injected event at a chosen token (LateBackend.manual): the code path a CUDA backend takes
on a GPU host when its init thread and upload finish (engine._late_cuda)."""

import threading

import numpy as np
import pytest

from reflex_ipc.backends.cpu_ops import CpuOps, available
from reflex_ipc.backends.numpy_ops import NumpyOps
from reflex_ipc.engine import load_runner
from reflex_ipc.handover import LateBackend
from reflex_ipc.models import load_model

pytestmark = pytest.mark.usefixtures("smollm2")

PROMPT = "The capital of France is"
N = 14


def _cpu_ok():
    ok, why = available()
    if not ok:
        pytest.skip(f"the cpu backend's library is not built: {why}")


def backend(name):
    if name == "cpu":
        _cpu_ok()
        return CpuOps()
    return NumpyOps()


def runner_on(path, name):
    return load_runner(path, device=name, n_ctx=256)


class CountingEvent:
    """Ready from its n-th query on (the mover asks once between two steps or chunks)."""

    def __init__(self, n):
        self.n, self.asked = n, 0
        self._ev = threading.Event()

    def is_set(self):
        self.asked += 1
        if self.asked >= self.n:
            self._ev.set()
        return self._ev.is_set()

    def wait(self, timeout=None):
        self._ev.set()
        return True


def with_late(r, target, event, mode="race"):
    """Give runner r a pending backend `target` (a fresh ops and model on the same GGUF)."""
    ops = backend(target)
    r.pending = LateBackend.manual(ops, load_model(ops, r.f), event)
    r.start_mode = mode
    return r


def gen(r, prompt=PROMPT, on_token=None, **kw):
    kw.setdefault("max_tokens", N)
    kw.setdefault("cache_prompt", False)
    return r.generate(prompt, on_token=on_token, **kw)


def at_token(k, event):
    """on_token that sets `event` once k tokens were output."""
    seen = [0]

    def on_token(tid, text, **extra):
        seen[0] += 1
        if seen[0] == k:
            event.set()

    return on_token


SAMPLED = dict(temperature=0.9, top_k=40, top_p=0.95, min_p=0.02, seed=7, repeat_penalty=1.3,
               frequency_penalty=0.2, presence_penalty=0.1, dry_multiplier=0.8, logit_bias={"13": -2.0},
               logprobs=2, stop=["zzzz-never"])


@pytest.mark.parametrize("name", ["numpy", "cpu"])
@pytest.mark.parametrize("params", [{}, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("k", [1, 5])
def test_move_to_the_same_kind_is_exact(smollm2, name, params, k):
    """A move between two instances of one backend changes nothing: the same tokens, text,
    logprobs and finish as a run that never moved (the sampler's RNG, the penalties' and DRY's
    history and the stop matcher live on the host and carry on). SmolLM2: a real model, whose
    next token depends on the whole context (a move that lost the state would show)."""
    path = smollm2
    ref = gen(runner_on(path, name), **params)
    ev = threading.Event()
    r = with_late(runner_on(path, name), name, ev)
    out = gen(r, on_token=at_token(k, ev), **params)
    assert out["token_ids"] == ref["token_ids"]
    assert out["text"] == ref["text"]
    assert out.get("logprobs") == ref.get("logprobs")
    assert out["finish_reason"] == ref["finish_reason"]
    assert r.pending is None and len(r.handovers) == 1
    # the state held the prompt and the first k - 1 tokens; the k-th is evaluated after the move
    assert r.handovers[0]["tokens"] == ref["prompt_tokens"] + k - 1
    steps = out["start"]["steps"]  # logits rows a token was chosen from (an end token too)
    chosen = out["completion_tokens"] + (out["finish_reason"] == "stop")
    assert [s["tokens"] for s in steps] == [k, chosen - k]  # no token repeated or lost
    assert out["start"]["choice"] == "race" and out["timings"]["handover"] >= 0


@pytest.mark.parametrize("src,dst", [("cpu", "numpy"), ("numpy", "cpu")])
@pytest.mark.parametrize("model", ["smollm2", "qwen3", "llama_q8_0"])
def test_move_across_backends_continues_as_the_target(tiny_models, smollm2, src, dst, model):
    """src -> dst after k tokens: the tokens after the move are what the target backend
    generates from the prompt and the same first k tokens (greedy), and its logits are the
    target's within the two backends' own distance (SmolLM2, and two tiny architectures)."""
    path = smollm2 if model == "smollm2" else tiny_models[model][0]
    k = 4
    ev = threading.Event()
    r = with_late(runner_on(path, src), dst, ev)
    rows = []
    out = gen(r, on_token=at_token(k, ev), on_logits=lambda i, row: rows.append((r.ops.name, row.copy())))
    assert [s["backend"] for s in out["start"]["steps"]] == [src, dst]
    assert [s["tokens"] for s in out["start"]["steps"]] == [k, N - k]
    assert [b for b, _ in rows] == [src] * k + [dst] * (N - k)
    first, rest = out["token_ids"][:k], out["token_ids"][k:]
    t = runner_on(path, dst)
    ids = t.tokenize(PROMPT, add_bos=None) + first
    ref_rows = []
    ref = t.generate(ids, max_tokens=N - k, cache_prompt=False,
                     on_logits=lambda i, row: ref_rows.append(row.copy()))
    # the cpu backend's distance from the numpy oracle (8-bit activations, float16 K/V):
    # within 5% of max|logit| (tests/test_cpu_ops.py's bound for whole models)
    scale = max(float(np.abs(row).max()) for _, row in rows)
    for i, a in enumerate(rest):
        row, rr = rows[k + i][1], ref_rows[i]
        if ref["token_ids"][i:i + 1] != [a]:  # greedy: identical, except after a near tie
            top = np.sort(rr)[::-1]
            assert top[0] - top[1] < 0.05 * scale, f"token {k + i}: {a} vs {ref['token_ids'][i:i + 1]}"
            break
        assert np.abs(row - rr).max() <= 0.05 * scale


def test_hybrid_state_moves(tiny_models, tmp_path, smollm2):
    """A recurrent hybrid (qwen35: conv and delta-rule state per sequence) moves its
    per-sequence state too: numpy -> numpy' is exact, cpu -> numpy continues as numpy does."""
    from reflex_ipc.testing.synthetic import example_gguf

    path = example_gguf("qwen35", tmp_path / "qwen35.gguf", tokenizer=smollm2)
    ref = gen(runner_on(path, "numpy"))
    ev = threading.Event()
    out = gen(with_late(runner_on(path, "numpy"), "numpy", ev), on_token=at_token(3, ev))
    assert out["token_ids"] == ref["token_ids"]
    ev = threading.Event()
    r = with_late(runner_on(path, "cpu"), "numpy", ev)
    out = gen(r, on_token=at_token(3, ev))
    first = out["token_ids"][:3]
    t = runner_on(path, "numpy")
    cont = t.generate(t.tokenize(PROMPT, add_bos=None) + first, max_tokens=N - 3, cache_prompt=False)
    assert out["token_ids"][3:6] == cont["token_ids"][:3]


def test_move_between_prefill_chunks(smollm2):
    """A backend that becomes ready during a long prompt's prefill takes over between two
    chunks: the logits and every token equal a run without the move."""
    path = smollm2
    long = " ".join(["one two three four five"] * 8)
    ref = gen(runner_on(path, "numpy"), prompt=long, max_tokens=4)
    r = with_late(runner_on(path, "numpy"), "numpy", CountingEvent(2))
    r.exec.chunk = 8
    out = gen(r, prompt=long, max_tokens=4)
    assert out["token_ids"] == ref["token_ids"]
    assert len(r.handovers) == 1 and 0 < r.handovers[0]["tokens"] < ref["prompt_tokens"]
    assert r.exec.chunk == r.ops.prefill_chunk  # the new backend's


def test_prefix_reuse_after_the_move(tiny_models):
    """The moved state is the runner's: the next request reuses its prefix on the new backend."""
    path = tiny_models["llama"][0]
    ev = threading.Event()
    r = with_late(runner_on(path, "numpy"), "numpy", ev)
    gen(r, on_token=at_token(2, ev), cache_prompt=True)
    out = gen(r, cache_prompt=True)
    assert out["cached_tokens"] == out["prompt_tokens"] - 1


def test_decisions_gpu_waits_and_cpu_stays(tiny_models):
    """REFLEX_START's forced choices: gpu waits for the pending backend and runs everything
    there; cpu runs the request where it is (the pending one is taken at the next request)."""
    path = tiny_models["llama"][0]
    r = with_late(runner_on(path, "numpy"), "numpy", threading.Event(), mode="gpu")
    r.pending.event.set()  # ready before the request: taken at once
    out = gen(r)
    assert out["start"]["choice"] == "gpu" and out["start"]["steps"][0]["tokens"] == N
    ev = threading.Event()
    r = with_late(runner_on(path, "numpy"), "numpy", ev, mode="cpu")
    before = r.ops
    out = gen(r, on_token=at_token(2, ev))
    assert out["start"]["choice"] == "cpu" and r.ops is before and r.pending is not None
    assert set(out["start"]["est_ms"]) == {"cpu", "gpu", "race"}
    assert all(f"start_est_{k}" in out["timings"] for k in ("cpu", "gpu", "race"))
    out = gen(r)  # the pending backend is ready now: this request moves first
    assert r.pending is None and r.ops is not before and out["start"]["ready"]


def test_system1_and_embed_record_the_start(tiny_models):
    path = tiny_models["llama"][0]
    r = with_late(runner_on(path, "numpy"), "numpy", threading.Event(), mode="race")
    ref = runner_on(path, "numpy").system1(PROMPT, [" Paris", " London"])
    out = r.system1(PROMPT, [" Paris", " London"])
    assert out["start"]["choice"] == "cpu"  # one pass: a race is the CPU doing it all
    assert [c["logprob"] for c in out["candidates"]] == [c["logprob"] for c in ref["candidates"]]
    e = r.embed(["hello", "world"])
    assert e["start"]["choice"] == "cpu" and e["start"]["steps"][0]["backend"] == "numpy"


def test_a_backend_that_fails_leaves_the_runner_where_it_is(tiny_models):
    path = tiny_models["llama"][0]
    r = runner_on(path, "numpy")

    def build():
        raise RuntimeError("no GPU after all")

    r.pending = LateBackend.thread(build, "cuda")
    r.start_mode = "race"
    r.pending.wait()
    out = gen(r)
    assert out["completion_tokens"] == N and r.pending is None
    assert "no GPU after all" in r.gpu_error and r.ops.name == "numpy"


def _serve(srv, *reqs):
    import json
    import tempfile

    from reflex_ipc import server
    from reflex_ipc.testing.fake_server import lines_of

    with tempfile.TemporaryFile() as fin, tempfile.TemporaryFile() as fout:
        fin.write(lines_of(*reqs))
        fin.seek(0)
        srv.serve_conn(server.FdConn(fin.fileno(), fout.fileno(), 1 << 20))
        fout.seek(0)
        return [json.loads(x) for x in fout.read().split(b"\n")[:-1]]


def test_server_serves_at_once_then_moves(tiny_models):
    """`reflex stdio`/`uds`: ready as soon as the first backend can serve (ready names the one
    coming: next_backend); requests before it is ready run where they are, the first request
    after it moves the runner (its state with it), and hello reports the new backend."""
    from reflex_ipc import server
    from reflex_ipc.testing.fake_server import check_schema

    path = tiny_models["llama"][0]
    ev = threading.Event()
    made = []

    def loader(p, d, lora=None):
        made.append(with_late(runner_on(p, "numpy"), "cpu", ev, mode="cpu"))
        return made[-1]

    srv = server.Server(loader=loader, model=path)
    srv.preload()
    out = _serve(srv, {"id": 1, "op": "generate", "prompt": PROMPT, "max_tokens": 3},
                 {"id": 2, "op": "hello"})
    for line in out:
        check_schema(line)
    assert out[0]["event"] == "ready" and out[0]["backend"] == "numpy" and out[0]["next_backend"] == "cpu"
    assert out[1]["start"]["choice"] == "cpu" and out[1]["start"]["steps"] == [{"backend": "numpy", "tokens": 3}]
    assert "start_est_gpu" in out[1]["timings"]
    assert out[2]["backend"] == "numpy" and out[2]["next_backend"] == "cpu"
    ev.set()
    out2 = _serve(srv, {"id": 3, "op": "generate", "prompt": PROMPT, "max_tokens": 3},
                  {"id": 4, "op": "hello"})
    for line in out2:
        check_schema(line)
    assert out2[1]["start"]["ready"] and out2[1]["start"]["steps"][0]["backend"] == "cpu"
    assert out2[1]["cached_tokens"] > 0  # the state moved with the runner
    assert out2[1]["token_ids"] == out[1]["token_ids"]
    assert out2[2]["backend"] == "cpu" and "next_backend" not in out2[2]
    assert len(made) == 1


def test_auto_on_a_host_whose_gpu_never_comes(tiny_models, monkeypatch):
    """Device auto where pycuda is found but CUDA cannot start: the runner serves on the cpu
    backend from the start, the late backend's failure is recorded, nothing waits for it."""
    from reflex_ipc import cuda

    monkeypatch.setattr(cuda, "pycuda_installed", lambda: True)
    monkeypatch.setattr(cuda, "start_init", lambda *a, **k: True)
    monkeypatch.setattr(cuda, "runtime", lambda: (_ for _ in ()).throw(RuntimeError("no driver here")))
    for mode in ("auto", "race", "cpu"):
        r = load_runner(tiny_models["llama"][0], device="auto", n_ctx=256, start=mode)
        assert r.ops.name in ("cpu", "numpy") and r.start_mode == mode
        r.pending.wait(30)
        out = gen(r, max_tokens=4)
        assert out["completion_tokens"] == 4 and r.pending is None
        assert r.gpu_error and "ModuleNotFoundError" in r.gpu_error or "no driver" in r.gpu_error
    # a request that asks for the GPU the load did not bring up (gpu_now=False) brings it up
    r = load_runner(tiny_models["llama"][0], device="auto", n_ctx=256, start="gpu", gpu_now=False)
    assert r.pending is None  # start "gpu" is the CUDA-only load: here, auto's cpu fallback
    r = load_runner(tiny_models["llama"][0], device="auto", n_ctx=256, start="race", gpu_now=False)
    assert r.pending is None and r.want_gpu is not None
    out = gen(r, max_tokens=4)
    assert out["start"]["choice"] == "race" and r.want_gpu is None


def test_the_cli_early_decision(tiny_models, monkeypatch):
    """commands/_model.early_start: a short request on a small file runs on the cpu backend
    without bringing CUDA up; a long prompt brings it up; REFLEX_START=gpu is the CUDA load."""
    from reflex_ipc import cuda, protocol
    from reflex_ipc.commands import _model

    monkeypatch.setattr(cuda, "pycuda_installed", lambda: True)
    path = tiny_models["llama"][0]

    def req(**f):
        import json

        return protocol.parse_request(json.dumps({"op": "generate", **f}).encode())[2]

    assert _model.early_start("generate", path, req(prompt=PROMPT, max_tokens=1)) == {"gpu_now": False}
    assert _model.EARLY["choice"] == "cpu" and set(_model.EARLY["est_ms"]) == {"cpu", "gpu", "race"}
    long = req(prompt="word " * 20000, max_tokens=1)
    assert _model.early_start("generate", path, long) == {"start": "gpu"}
    monkeypatch.setenv("REFLEX_START", "gpu")
    assert _model.early_start("generate", path, req(prompt=PROMPT, max_tokens=1)) == {"start": "gpu"}


def test_premapped_file_is_taken_by_the_gguf_parse(tiny_models, tmp_path):
    """prefault.premap maps and populates a model file before numpy and the GGUF parse;
    GGUFFile takes that mapping when the file is still the same one, else maps it anew."""
    import os
    import shutil

    from reflex_ipc import prefault
    from reflex_ipc.gguffile import GGUFFile

    path = str(tmp_path / "m.gguf")
    shutil.copy(tiny_models["llama"][0], path)
    pf = prefault.premap(path)
    assert pf is not None and pf.done.wait(30) and pf.how in ("populate", "willneed")
    mm = prefault._premapped[os.path.abspath(path)][1]
    f = GGUFFile(path)
    assert f._mm is mm and f.prefault is pf and not prefault._premapped
    r = load_runner(path, device="numpy", n_ctx=64)
    assert r.generate(PROMPT, max_tokens=2)["completion_tokens"] == 2
    r.close()
    f.close()
    assert f.prefault is None
    prefault.premap(path)
    os.utime(path, ns=(1, 1))  # another file now: the premapped one is dropped
    f = GGUFFile(path)
    assert f.prefault is None and not prefault._premapped
    f.close()
    addr, n = prefault.address(b"abc")
    assert addr and n == 3


def test_auto_loads_on_the_cpu_and_moves_when_the_late_backend_is_built(smollm2, monkeypatch):
    """load_runner(device="auto") on a host where pycuda is found: the cpu backend serves at
    once and engine._late_cuda's thread builds the other backend (here a numpy one, released at
    the 3rd token); a race moves there mid-generation with the same tokens as a run that never
    moved (cpu -> numpy within the near-tie rule: compared greedy, token by token)."""
    from reflex_ipc import cuda, engine

    monkeypatch.setattr(cuda, "pycuda_installed", lambda: True)
    monkeypatch.setattr(cuda, "start_init", lambda *a, **k: True)
    gate = threading.Event()

    ops = NumpyOps()
    model = load_model(ops, runner_on(smollm2, "numpy").f)  # made beforehand: only the gate waits

    def late(f, adapters):
        def build():
            gate.wait(60)  # "uploaded" at the 3rd token
            return ops, model
        return LateBackend.thread(build, "numpy")

    monkeypatch.setattr(engine, "_late_cuda", late)
    r = load_runner(smollm2, device="auto", n_ctx=256, start="race")
    assert r.ops.name == "cpu" and r.pending is not None and r.info()["next_backend"] == "numpy"
    out = gen(r, on_token=at_token(3, gate))
    assert [s["backend"] for s in out["start"]["steps"]] == ["cpu", "numpy"]
    # the build thread wakes after the 3rd token: the move comes at the next step or soon after
    assert 3 <= out["start"]["steps"][0]["tokens"] < N and r.info()["next_backend"] is None
    assert sum(x["tokens"] for x in out["start"]["steps"]) == out["completion_tokens"] + (out["finish_reason"] == "stop")
    ref = gen(runner_on(smollm2, "cpu"))
    assert out["token_ids"][:3] == ref["token_ids"][:3]


def test_server_request_naming_the_coming_device_waits_for_it(tiny_models):
    """A request that names the device the active model is moving to (device "cuda" while it
    serves on the CPU; here "cpu" while it serves on numpy) waits for that move instead of
    loading the file there a second time."""
    from reflex_ipc import server

    path = tiny_models["llama"][0]
    ev = threading.Event()
    made = []

    def loader(p, d, lora=None):
        if d == "cpu":
            raise AssertionError("loaded a second time")
        made.append(with_late(runner_on(p, "numpy"), "cpu", ev, mode="cpu"))
        return made[-1]

    srv = server.Server(loader=loader, model=path)
    srv.preload()
    threading.Timer(0.5, ev.set).start()
    out = _serve(srv, {"id": 1, "op": "generate", "prompt": PROMPT, "max_tokens": 2, "device": "cpu"},
                 {"id": 2, "op": "hello"})
    assert out[1]["ok"], out[1]
    assert out[2]["backend"] == "cpu" and len(made) == 1


def test_late_cuda_thread_lets_go_of_the_context(monkeypatch):
    """pycuda aborts the whole process when a thread ends with a context on its stack (seen on
    the H200: REFLEX_START=auto starts that answered on the cpu died with status 134 once the
    upload thread ended). engine._late_cuda's thread pops what runtime() pushed there; the
    taking thread pushes its own."""
    import sys
    import types

    from reflex_ipc import cuda, engine, models

    stacks = {}

    class Ctx:
        def push(self):
            stacks.setdefault(threading.get_ident(), []).append(self)

        def pop(self):
            stacks[threading.get_ident()].pop()

        def synchronize(self):
            pass

    ctx = Ctx()
    monkeypatch.setattr(cuda, "_result", {"runtime": types.SimpleNamespace(ctx=ctx)})
    monkeypatch.setattr(cuda, "_pushed", threading.local())
    monkeypatch.setattr(cuda, "start_init", lambda *a, **k: True)
    monkeypatch.setattr(cuda, "_thread", types.SimpleNamespace(ident=None))
    builder = []

    class FakeOps:
        def __init__(self):
            cuda.runtime()  # as CudaOps does
            builder.append(threading.get_ident())

        def wait_uploads(self):
            pass

    monkeypatch.setitem(sys.modules, "reflex_ipc.backends.cuda_ops", types.SimpleNamespace(CudaOps=FakeOps))
    monkeypatch.setattr(models, "load_model", lambda ops, f, lora: "net")
    lb = engine._late_cuda(None, None)
    assert lb.wait(10)
    lb._thread.join(10)
    assert lb.error is None and builder and stacks[builder[0]] == []
    got = []
    taker = threading.Thread(target=lambda: (got.append(lb.take()), got.append(list(stacks[threading.get_ident()])),
                                             cuda.release_thread()))
    taker.start()
    taker.join(10)
    assert got[0][1] == "net" and got[1] == [ctx]
