"""The prefix store (reflex_ipc/runtime/prefixstore.py, issue 29): a fresh runner (a fresh
process) whose prompt starts like an earlier one's reads the saved segments instead of
evaluating those tokens, with the same answer; every state kind (attention, latent-free
synthetic llama and qwen3, deepseek2's latent cache, gemma4's shared K/V, the recurrent
hybrids qwen35 and granitehybrid); the switches; the size
cap; `reflex cache`; and a fuzz of the store's folder (truncated, bit-flipped, swapped
files, racing writers, a full disk): never a wrong answer, never a crash.

Blocks are 16 tokens here (REFLEX_PREFIX_CACHE_BLOCK) so that the tiny models' short
prompts span several segments; every test has its own store folder."""

import json
import os
import random
import subprocess
import sys

import pytest

from reflex_ipc.engine import load_runner
from reflex_ipc.runtime import prefixstore
from reflex_ipc.testing.synthetic import example_gguf

pytestmark = pytest.mark.usefixtures("smollm2")  # the hybrid models borrow its tokenizer

DATA = os.path.join(os.path.dirname(__file__), "data")
LLAMA = os.path.join(DATA, "synthetic-llama.gguf")
QWEN3 = os.path.join(DATA, "synthetic-qwen3.gguf")
N_CTX = 256
BLOCK = 16
P = "The quick brown fox jumps over the lazy dog. " * 4 + "Then it ran away into the"
CANDS = [" woods", " city", " river"]


@pytest.fixture(autouse=True)
def store(tmp_path, monkeypatch):
    d = tmp_path / "store"
    monkeypatch.setenv("REFLEX_PREFIX_CACHE_DIR", str(d))
    monkeypatch.setenv("REFLEX_PREFIX_CACHE_BLOCK", str(BLOCK))
    monkeypatch.delenv("REFLEX_PREFIX_CACHE", raising=False)
    monkeypatch.delenv("REFLEX_PREFIX_CACHE_MAX", raising=False)
    prefixstore.PENDING.clear()
    yield d
    prefixstore.PENDING.clear()


@pytest.fixture(scope="module")
def hybrids(tmp_path_factory, smollm2):
    d = tmp_path_factory.mktemp("hybrids")
    out = {}
    for name in ("qwen35", "granitehybrid"):  # recurrent hybrids (F32 examples)
        out[name] = example_gguf(name, str(d / f"{name}.gguf"), tokenizer=smollm2)
    for name in ("deepseek2", "gemma4"):  # a latent (MLA) cache; layers sharing K/V (quantized examples)
        out[name] = example_gguf(f"{name}@q", str(d / f"{name}.gguf"), tokenizer=smollm2)
    return out


def files(d):
    return sorted(str(p) for p in d.rglob("*.rxs"))


def run_generate(model, prompt=P, device="cpu", **kw):
    """generate in a fresh runner (as a fresh process would), then the write after the answer."""
    r = load_runner(model, device=device, n_ctx=N_CTX)
    try:
        out = r.generate(prompt, max_tokens=kw.pop("max_tokens", 8), **kw)
        prefixstore.flush()
        return out, r.tok.encode(prompt)
    finally:
        r.close()


def run_system1(model, prompt=P, device="cpu", **kw):
    r = load_runner(model, device=device, n_ctx=N_CTX)
    try:
        out = r.system1(prompt, CANDS, **kw)
        prefixstore.flush()
        return out
    finally:
        r.close()


def test_bounds_and_chain():
    assert prefixstore.bounds_of(40, 16) == [16, 32, 39]
    assert prefixstore.bounds_of(33, 16) == [16, 32]
    assert prefixstore.bounds_of(2, 16) == [1]
    ns = prefixstore.namespace(b"a" * 16, bytes(16), "cpu")
    ids = list(range(100, 140))
    segs = prefixstore.chain(ns, ids, [16, 32, 39])
    assert [(a, b) for a, b, _, _ in segs] == [(0, 16), (16, 32), (32, 39)]
    assert segs[0][2] == ns and segs[1][2] == segs[0][3] and segs[2][2] == segs[1][3]
    # a prompt that shares the first 20 tokens shares the first block's key only
    other = ids[:20] + [7] * 20
    o = prefixstore.chain(ns, other, [16, 32])
    assert o[0][3] == segs[0][3] and o[1][3] != segs[1][3]
    # another backend, another chain
    assert prefixstore.chain(prefixstore.namespace(b"a" * 16, bytes(16), "numpy"), ids, [16])[0][3] != segs[0][3]
    assert prefixstore.parse_size("4G") == 4 << 30 and prefixstore.parse_size("1000") == 1000


@pytest.mark.parametrize("model", ["llama", "qwen3", "qwen35", "granitehybrid", "deepseek2", "gemma4"])
def test_second_process_reads_the_store(model, store, hybrids):
    path = {"llama": LLAMA, "qwen3": QWEN3, **hybrids}[model]
    ref, ids = run_generate(path, prefix_cache=False)
    assert files(store) == [] and ref["timings"].get("prefix_cache_tokens") is None
    first, _ = run_generate(path)
    assert first["token_ids"] == ref["token_ids"] and first["cached_tokens"] == 0
    assert first["timings"]["prefix_cache_tokens"] == 0
    n_seg = len(prefixstore.bounds_of(len(ids), BLOCK))
    assert len(files(store)) == n_seg
    second, _ = run_generate(path)
    assert second["token_ids"] == ref["token_ids"]
    assert second["cached_tokens"] == len(ids) - 1
    assert second["timings"]["prefix_cache_tokens"] == len(ids) - 1
    assert second["timings"]["prefix_cache_import"] > 0
    t = second["timings"]  # the pipelined import (stateimport.py)
    assert t["prefix_cache_import_files"] == n_seg and t["prefix_cache_import_bytes"] > 0
    assert t["prefix_cache_import_threads"] >= 1 and t["prefix_cache_import_pinned"] == 0
    # system1 from the store scores as system1 from scratch
    a = run_system1(path, prefix_cache=False)
    b = run_system1(path)
    assert b["cached_tokens"] == len(ids) - 1
    for x, y in zip(a["candidates"], b["candidates"]):
        assert x["token_ids"] == y["token_ids"]
        assert x["logprob"] == pytest.approx(y["logprob"], rel=1e-4, abs=1e-4)


def test_longer_prompt_finds_the_saved_blocks(store):
    _, ids = run_generate(LLAMA)
    longer = P + " forest, where it slept until the morning came."
    ref, lids = run_generate(LLAMA, longer, prefix_cache=False)
    got, _ = run_generate(LLAMA, longer)
    assert got["token_ids"] == ref["token_ids"]
    common = 0
    while common < len(ids) and lids[common] == ids[common]:
        common += 1
    # every full block of the shared start came from the store (ids' last token is not saved)
    assert got["cached_tokens"] == (min(common, len(ids) - 1) // BLOCK) * BLOCK > 0
    # and the longer prompt's own segments were saved: a third run reads them all
    third, _ = run_generate(LLAMA, longer)
    assert third["cached_tokens"] == len(lids) - 1 and third["token_ids"] == ref["token_ids"]


def test_model_digest_memo(store):
    """The model digest (a hash of the GGUF's metadata) is memoized in digests/ under the
    file's identity, so a cold process's lookup does not hash the metadata; the memo says
    what identity() computes, and a file changed since is hashed again."""
    r = load_runner(LLAMA, device="cpu", n_ctx=N_CTX)
    try:
        want = r.identity()
        r._identity = None
        assert prefixstore.runner_identity(r, str(store)) == want  # computed, memo written
        r._identity = None
        assert prefixstore.runner_identity(r, str(store)) == want  # from the memo
        assert len(list((store / "digests").iterdir())) == 1
    finally:
        r.close()
    assert prefixstore.scan(str(store)) == {}  # the memo folder is not a model's


def test_warm_runner_and_numpy(store):
    """A runner that already holds more of the prompt does not read the store; numpy's chain
    is its own (a float32 state never comes from a float16 backend)."""
    r = load_runner(LLAMA, device="cpu", n_ctx=N_CTX)
    try:
        r.generate(P, max_tokens=2)
        prefixstore.flush()
        out = r.generate(P, max_tokens=2)
        assert out["cached_tokens"] == len(r.tok.encode(P)) - 1
        assert out["timings"]["prefix_cache_tokens"] == 0
    finally:
        r.close()
    out, _ = run_generate(LLAMA, device="numpy")
    assert out["timings"]["prefix_cache_tokens"] == 0
    assert len({os.path.dirname(f) for f in files(store)}) == 2


def test_share_across_backends(store, monkeypatch):
    """REFLEX_PREFIX_CACHE_SHARE=1: the numpy backend reads the cpu backend's float16
    segments (converted to its float32 state) when it has none of its own."""
    ref, ids = run_generate(LLAMA, device="numpy", prefix_cache=False)
    run_generate(LLAMA)  # cpu writes
    out, _ = run_generate(LLAMA, device="numpy")  # not shared: numpy evaluates (and writes its own)
    assert out["timings"]["prefix_cache_tokens"] == 0
    import shutil

    for d in {os.path.dirname(f) for f in files(store)}:
        if json.load(open(os.path.join(d, "model.json")))["backend"] == "numpy":
            shutil.rmtree(d)
    monkeypatch.setenv("REFLEX_PREFIX_CACHE_SHARE", "1")
    out, _ = run_generate(LLAMA, device="numpy")
    assert out["timings"]["prefix_cache_tokens"] == len(ids) - 1
    assert out["token_ids"] == ref["token_ids"]  # within float16 rounding: the same greedy tokens here


def test_switches(store, monkeypatch):
    run_generate(LLAMA, prefix_cache=False)
    assert files(store) == []
    monkeypatch.setenv("REFLEX_PREFIX_CACHE", "0")
    out, _ = run_generate(LLAMA)
    assert files(store) == [] and "prefix_cache_tokens" not in out["timings"]
    monkeypatch.delenv("REFLEX_PREFIX_CACHE")
    run_generate(LLAMA)
    assert files(store)
    out, _ = run_generate(LLAMA, prefix_cache=False)
    assert out["cached_tokens"] == 0


def test_embed_last_pooling(store):
    r = load_runner(LLAMA, device="cpu", n_ctx=N_CTX)
    try:
        ref = r.embed([P], pooling="last", prefix_cache=False)["embeddings"][0]
        mean = r.embed([P], pooling="mean")
        assert "prefix_cache_tokens" not in mean["timings"]
        r.embed([P], pooling="last")
        prefixstore.flush()
    finally:
        r.close()
    assert files(store)
    r = load_runner(LLAMA, device="cpu", n_ctx=N_CTX)
    try:
        out = r.embed([P], pooling="last")
        assert out["timings"]["prefix_cache_tokens"] == len(r.tok.encode(P)) - 1
        assert out["embeddings"][0] == pytest.approx(ref, rel=1e-5, abs=1e-6)
    finally:
        r.close()


def test_size_cap_evicts_least_recently_used(store, monkeypatch):
    run_generate(LLAMA)
    first = files(store)
    size = sum(os.path.getsize(f) for f in first)
    os.utime(first[0], (1, 1))  # the oldest
    monkeypatch.setenv("REFLEX_PREFIX_CACHE_MAX", str(size + 100))
    run_generate(LLAMA, "Another prompt that is long enough to be saved in several blocks of sixteen.")
    left = files(store)
    assert first[0] not in left
    assert sum(os.path.getsize(f) for f in left) <= size + 100


# -- the store's folder under attack --------------------------------------------------------------
def _reference(path, prompt=P):
    out, _ = run_generate(path, prompt, prefix_cache=False)
    return out["token_ids"]


@pytest.mark.parametrize("model", ["llama", "qwen35"])
def test_fuzz_corrupt_truncated_swapped(model, store, hybrids):
    """Saved segments truncated, bit-flipped, swapped for one another or for garbage: every
    answer is the answer from scratch, the bad file is deleted (and written again)."""
    path = {"llama": LLAMA, **hybrids}[model]
    prompts = [P, P.replace("fox", "cat"), "One two three four five six seven eight nine ten " * 3]
    refs = {p: _reference(path, p) for p in prompts}
    rnd = random.Random(5)
    for p in prompts:
        run_generate(path, p)
    for trial in range(24):
        fs = files(store)
        victim = rnd.choice(fs)
        data = bytearray(open(victim, "rb").read())
        how = trial % 4
        if how == 0:
            data = data[:rnd.randrange(0, len(data))]
        elif how == 1:
            i = rnd.randrange(0, len(data))
            data[i] ^= 1 << rnd.randrange(8)
        elif how == 2:
            data = bytearray(open(rnd.choice([f for f in fs if f != victim]), "rb").read())
        else:
            data = bytearray(rnd.randbytes(rnd.randrange(0, 300)))
        with open(victim, "wb") as fh:
            fh.write(data)
        p = rnd.choice(prompts)
        out, _ = run_generate(path, p)
        assert out["token_ids"] == refs[p], (trial, how)
    # the store heals: after one more run each (which rewrites what was deleted), every
    # prompt reads its whole saved prefix again
    for p in prompts:
        out, ids = run_generate(path, p)
        assert out["token_ids"] == refs[p]
    for p in prompts:
        out, ids = run_generate(path, p)
        assert out["token_ids"] == refs[p] and out["cached_tokens"] == len(ids) - 1


@pytest.mark.parametrize("model", ["llama", "qwen35"])
def test_pipelined_import_stops_at_a_segment_whose_data_fails(model, store, hybrids, monkeypatch):
    """One array's bytes flipped inside the third of four or more segments (header intact): the
    pipelined import, several threads and jobs of a few arrays, keeps the two before it,
    deletes it, evaluates the rest; the recurrent model takes its per-sequence state from the
    second segment. The answer is the answer from scratch."""
    from reflex_ipc.runtime import stateimport
    from reflex_ipc.runtime.statefile import StateFile

    monkeypatch.setattr(stateimport, "CHUNK", 1 << 10)  # jobs of one or two arrays
    monkeypatch.setattr(stateimport, "MAX_THREADS", 3)
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    path = {"llama": LLAMA, **hybrids}[model]
    prompt = P.replace("lazy dog.", "lazy dog by the old mill.") + " dark woods"
    ref, ids = run_generate(path, prompt, prefix_cache=False)
    run_generate(path, prompt)
    bounds = prefixstore.bounds_of(len(ids), BLOCK)
    assert len(bounds) >= 4
    by_start = {}
    for f in files(store):
        with StateFile(f) as sf:
            by_start[sf.start] = (f, [e for kind, arrays in sf.layers for e in arrays if kind == "slot"])
    victim, entries = by_start[bounds[1]]
    e = entries[len(entries) // 2]
    data = bytearray(open(victim, "rb").read())
    data[e.offset + e.nbytes // 2] ^= 0x10
    open(victim, "wb").write(data)
    out, _ = run_generate(path, prompt)
    assert out["token_ids"] == ref["token_ids"]
    assert out["cached_tokens"] == bounds[1]
    assert open(victim, "rb").read() != data  # deleted, then written again after the answer
    t = out["timings"]
    assert t["prefix_cache_import_threads"] == 3 and t["prefix_cache_import_files"] == len(bounds)
    again, _ = run_generate(path, prompt)  # rewritten after that answer: whole again
    assert again["token_ids"] == ref["token_ids"] and again["cached_tokens"] == len(ids) - 1


def test_an_empty_store_costs_no_digest_before_the_answer(store):
    """The machine's first request (no segments in the folder): nothing is looked up, so the
    model digest (hashing the GGUF's metadata) waits until the write after the answer."""
    r = load_runner(LLAMA, device="cpu", n_ctx=N_CTX)
    try:
        out = r.generate(P, max_tokens=4)
        assert out["timings"]["prefix_cache_tokens"] == 0 and r._identity is None
        prefixstore.flush()
        assert r._identity is not None and files(store)
    finally:
        r.close()
    second, _ = run_generate(LLAMA)
    assert second["cached_tokens"] > 0 and second["token_ids"][:4] == out["token_ids"]


def test_pipelined_import_jobs_cover_every_array_once():
    """stateimport.plan: each file's arrays in file order, whole, in jobs of about CHUNK bytes;
    per-sequence arrays only where asked."""
    from reflex_ipc.runtime import stateimport
    from reflex_ipc.runtime.statefile import ArrayEntry

    class F:
        def __init__(self, sizes, seq):
            off, self.layers = 4096, []
            for i, n in enumerate(sizes):
                e = ArrayEntry(f"a{i}", "float16", (n // 2,), None if seq[i] else 0, off, n, 0)
                self.layers.append(("seq" if seq[i] else "slot", [e]))
                off += (n + 63) // 64 * 64
    a = F([3 << 20, 2 << 20, 9 << 20, 100], [False, False, False, True])
    b = F([1 << 20] * 6, [False] * 6)
    jobs = stateimport.plan([a, b], lambda j: j == 0)
    seen = [(j, e.name) for j, ents, _, _ in jobs for e in ents]
    assert seen == [(0, "a0"), (0, "a1"), (0, "a2"), (0, "a3")] + [(1, f"a{i}") for i in range(6)]
    assert [len(ents) for _, ents, _, _ in jobs] == [1, 1, 1, 1, 4, 2]
    for j, ents, off, n in jobs:
        assert off == ents[0].offset and off + n == ents[-1].offset + ents[-1].nbytes
    assert [e.name for j, ents, _, _ in stateimport.plan([a], lambda j: False) for e in ents] == ["a0", "a1", "a2"]


WRITER = r"""
import os, sys
from reflex_ipc.engine import load_runner
from reflex_ipc.runtime import prefixstore
model, prompt, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
for i in range(n):
    r = load_runner(model, device="cpu", n_ctx=256)
    out = r.generate(prompt, max_tokens=8)
    prefixstore.flush()
    r.close()
    print(out["token_ids"], flush=True)
"""


def test_fuzz_racing_writers_and_clearing(store):
    """Four processes write and read the same prompts' segments at once while another clears
    the store: every answer is the answer from scratch; no temporary file is left."""
    refs = {p: _reference(LLAMA, p) for p in (P, P + " again and again")}
    env = dict(os.environ)
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, LLAMA, p, "6"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env)
             for p in (P, P, P + " again and again", P + " again and again")]
    for _ in range(20):
        prefixstore.clear(str(store))
    outs = [p.communicate(timeout=300) for p in procs]
    for (out, err), prompt in zip(outs, (P, P, P + " again and again", P + " again and again")):
        assert "Traceback" not in err, err
        lines = out.strip().splitlines()
        assert len(lines) == 6
        assert [json.loads(x) for x in lines] == [refs[prompt]] * 6, err
    assert not [f for f in store.rglob("*.tmp")]


FULL_DISK = r"""
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), int(sys.argv[2])))
from reflex_ipc.engine import load_runner
from reflex_ipc.runtime import prefixstore
r = load_runner(sys.argv[1], device="cpu", n_ctx=256)
out = r.generate(sys.argv[3], max_tokens=8)
prefixstore.flush()
out2 = r.generate(sys.argv[3], max_tokens=8)
print(out["token_ids"], out2["token_ids"])
"""


@pytest.mark.parametrize("limit", [0, 5000])
def test_fuzz_full_disk(store, limit):
    """Writes that fail (the file size limit stands in for a full disk) save nothing and fail
    nothing."""
    ref = _reference(LLAMA)
    p = subprocess.run([sys.executable, "-c", FULL_DISK, LLAMA, str(limit), P], capture_output=True,
                       text=True, env=dict(os.environ), timeout=120)
    assert p.returncode == 0, p.stderr
    a, b = p.stdout.strip().split("] [")
    assert json.loads(a + "]") == ref and json.loads("[" + b) == ref
    assert not [f for f in store.rglob("*.tmp")]
    for f in files(store):  # what was written is whole
        from reflex_ipc.runtime.statefile import StateFile

        with StateFile(f) as sf:
            sf.read([e for _, arr in sf.layers for e in arr])


# -- CLI, server, `reflex cache` ---------------------------------------------------------------------
def _cli(*args, env_extra=None):
    env = dict(os.environ, REFLEX_DETACH="0", **(env_extra or {}))
    env.pop("REFLEX_MODEL", None)
    p = subprocess.run([sys.executable, "-m", "reflex_ipc", *args], capture_output=True, text=True,
                       env=env, timeout=120)
    return p.returncode, p.stdout, p.stderr


def test_cli_and_cache_command(store):
    args = ("generate", "--device", "cpu", "--model", LLAMA, "--n-ctx", str(N_CTX), "--json",
            "--max-tokens", "6", P)
    rc, out, err = _cli(*args, "--no-prefix-cache")
    assert rc == 0, err
    ref = json.loads(out)
    assert files(store) == []
    rc, out, err = _cli(*args)
    assert rc == 0, err
    assert json.loads(out)["token_ids"] == ref["token_ids"] and files(store)
    rc, out, err = _cli(*args)
    got = json.loads(out)
    assert got["token_ids"] == ref["token_ids"] and got["timings"]["prefix_cache_tokens"] > 0
    rc, out, err = _cli("system1", "--device", "cpu", "--model", LLAMA, "--n-ctx", str(N_CTX), "--json",
                        "--candidate", " a", "--candidate", " b", P)
    assert rc == 0 and json.loads(out)["timings"]["prefix_cache_tokens"] > 0, err
    rc, out, err = _cli("cache", "ls", "--json")
    assert rc == 0, err
    ls = json.loads(out)
    assert ls["folder"] == str(store) and ls["files"] == len(files(store)) and ls["bytes"] > 0
    assert ls["models"][0]["architecture"] == "llama" and ls["models"][0]["backend"] == "cpu"
    rc, out, err = _cli("cache", "ls")
    assert rc == 0 and "llama" in out
    rc, out, err = _cli("cache", "clear")
    assert rc == 0 and files(store) == []
    rc, out, err = _cli("generate", "--help")
    assert "--no-prefix-cache" in out


def test_detached_cli_writes_after_the_answer(store):
    """The console script's detached child writes the segments after its parent exited with
    the answer (REFLEX_DETACH unset: on by default while the store is on)."""
    import time

    env = dict(os.environ)
    env.pop("REFLEX_DETACH", None)
    p = subprocess.run([sys.executable, "-m", "reflex_ipc", "generate", "--device", "cpu", "--model", LLAMA,
                        "--n-ctx", str(N_CTX), "--max-tokens", "3", P], capture_output=True, text=True,
                       env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    for _ in range(100):
        if files(store):
            break
        time.sleep(0.1)
    assert files(store)


def test_server_writes_after_the_result_and_another_server_reads(store):
    reqs = [{"id": 1, "op": "generate", "prompt": P, "max_tokens": 4},
            {"id": 2, "op": "generate", "prompt": P, "max_tokens": 4, "prefix_cache": False}]
    outs = []
    for _ in range(2):
        p = subprocess.run([sys.executable, "-m", "reflex_ipc", "stdio", "--device", "cpu", "--model", LLAMA],
                           input="".join(json.dumps(q) + "\n" for q in reqs), capture_output=True, text=True,
                           env=dict(os.environ), timeout=120)
        outs.append({x["id"]: x for x in map(json.loads, p.stdout.splitlines()[1:])})
    a, b = outs
    assert a[1]["ok"] and a[1]["timings"]["prefix_cache_tokens"] == 0 and files(store)
    assert b[1]["timings"]["prefix_cache_tokens"] > 0 and b[1]["token_ids"] == a[1]["token_ids"]
    assert "prefix_cache_tokens" not in b[2]["timings"] and b[2]["token_ids"] == a[1]["token_ids"]
