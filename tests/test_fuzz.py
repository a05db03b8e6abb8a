"""The issue-12 fuzz suite (reflex_ipc/testing/fuzz.py), short mode: a few minutes of seeded request
lines, GGUF mutations, signals, stalled clients, tokenizer-cache corruption and model files
changed under a live server, and (issue 32) the lines against the numpy backend alone, hostile chat
templates, constraints, LoRA adapters and HTTP clients that never read, with zero violations allowed. REFLEX_FUZZ=long runs the long
mode here instead (scripts/fuzz-long writes its figures to bench/results/fuzz-long-DATE.json)."""

import pytest

from reflex_ipc import settings
from reflex_ipc.testing import fuzz as fuzzlib

LONG = settings.get().fuzz == "long"
SEED = settings.get().fuzz_seed


def _run(phase, n=None):
    counts = {k: 0 for k in fuzzlib.SHORT}
    base = fuzzlib.LONG if LONG else fuzzlib.SHORT
    counts[phase] = n or base[phase]
    res = fuzzlib.run("long" if LONG else "short", SEED, counts)
    assert res["violations"] == 0, res["violation_samples"][:10]
    return res


def test_fuzz_request_lines():
    res = _run("lines")
    assert res["lines"] >= fuzzlib.SHORT["lines"]
    kinds = res["result_kinds"]
    for k in ("ok", "parse_error", "invalid_request", "unknown_op", "model_not_found",
              "line_too_long", "too_large"):
        assert kinds.get(k), (k, kinds)  # the generator reaches every class


def test_fuzz_gguf_mutations():
    res = _run("gguf")
    assert res["counts"]["gguf_loaded"] and res["counts"]["gguf_refused"]
    # validation at load: a file that loads never fails later because of what it says;
    # only what is not scanned at load shows up later, as gguf_error: weights holding
    # NaN/inf, and an SPM vocabulary without the byte token a text needs (llama.cpp also
    # finds that out only when it encodes such a byte)
    late = res["gguf_failed_after_load"]
    assert all(k == "gguf_error: its weights are broken" or "has no token for byte" in k
               for k in late), late


def test_fuzz_signals():
    _run("signals")


def test_fuzz_stalled_and_non_reading_clients():
    _run("clients")


def test_fuzz_tokenizer_cache_corruption():
    res = _run("cache")
    assert res["counts"]["cache_checks"] >= 2 * fuzzlib.SHORT["cache"]


def test_fuzz_files_changed_under_a_live_server():
    res = _run("files")
    assert res["counts"]["file_changes"] == (fuzzlib.LONG if LONG else fuzzlib.SHORT)["files"]


def test_fuzz_numpy_backend_alone():
    """The request lines against `--device numpy` (issue 32: the numpy backend was not
    covered by the fuzz)."""
    res = _run("numpy")
    assert res["counts"]["lines"] >= fuzzlib.SHORT["numpy"] and res["result_kinds"].get("ok")


def test_fuzz_chat_templates():
    """Hostile, mutated and composed chat templates (issue 32 items 4, 7): every one ends in
    its kind within the budgets, signals during a render that would not end."""
    res = _run("templates")
    kinds = res["result_kinds"]
    assert kinds.get("too_large") and kinds.get("invalid_request") and kinds.get("ok"), kinds
    assert res["counts"]["template_signals"] == 2


def test_fuzz_constraints():
    res = _run("constraints")  # issue 32 items 8, 12
    assert res["result_kinds"].get("invalid_request") and res["result_kinds"].get("ok")


def test_fuzz_lora_adapters():
    res = _run("adapters")  # issue 32 items 9, 11
    assert res["result_kinds"].get("gguf_error") and res["result_kinds"].get("ok")


def test_fuzz_http_clients_that_never_read():
    res = _run("http")  # issue 32 "Also": a streaming HTTP client that never reads
    assert res["counts"].get("http_requests") == (fuzzlib.LONG if LONG else fuzzlib.SHORT)["http"]


@pytest.mark.parametrize("arch", fuzzlib.ARCHS)
def test_tiny_seed_models_are_valid(tmp_path, arch):
    """The mutation seeds load and generate: a mutation is what makes a file bad."""
    import numpy as np

    from reflex_ipc.engine import load_runner

    p = tmp_path / f"{arch}.gguf"
    fuzzlib.write_gguf(p, *fuzzlib.tiny_model(arch, np.random.default_rng(0)))
    r = load_runner(str(p), device="cpu")
    try:
        out = r.generate("Hello world", max_tokens=3)
        assert out["completion_tokens"] >= 1
        assert r.tokenize("Hello world")
    finally:
        r.close()


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
@pytest.mark.parametrize("device", ["cpu", "numpy"])
def test_vectors_stored_with_a_trailing_1_dim(tmp_path, arch, device):
    """A norm weight or bias written as [n, 1] (ggml's trailing dim of 1, accepted like
    llama.cpp does) loads as the vector it is: the same logits as the file with [n]
    (the cpu backend once made it a matrix handle and answered `internal`)."""
    import numpy as np

    from reflex_ipc.engine import load_runner

    kvs, tensors = fuzzlib.tiny_model(arch, np.random.default_rng(0))
    padded = [(n, list(d) + [1] if len(d) == 1 else d, gt, data) for n, d, gt, data in tensors]
    assert padded != tensors
    logits = []
    for name, ts in (("plain", tensors), ("padded", padded)):
        p = tmp_path / f"{name}.gguf"
        fuzzlib.write_gguf(p, kvs, ts)
        r = load_runner(str(p), device=device)
        try:
            out = r.generate("Hello world", max_tokens=3)
            assert out["completion_tokens"] >= 1
            logits.append(np.asarray(r.prompt_logits(r.tokenize("Hello world"))))
        finally:
            r.close()
    np.testing.assert_array_equal(logits[0], logits[1])


_LAYOUT = {"llama": {}, "qwen2": {"qkv_bias": True, "untied": True}, "qwen3": {"qk_norm": True},
           "gemma3": {"qk_norm": True, "window": 4, "pattern": 2}}


@pytest.mark.parametrize("arch", fuzzlib.ARCHS)
def test_tiny_seeds_have_the_layout_of_the_shared_writer(tmp_path, arch):
    """fuzzlib serializes its seeds itself (thousands of mutated files a run, in memory,
    with a 300-token vocabulary); their tensors and keys are those of the one synthetic
    writer (reflex_ipc.testing.synthetic.tiny_gguf) for the same architecture."""
    import numpy as np

    from reflex_ipc.gguffile import GGUFFile
    from reflex_ipc.testing.synthetic import tiny_gguf

    ref = tmp_path / "ref.gguf"
    tiny_gguf(ref, arch=arch, **_LAYOUT[arch])
    ours = tmp_path / "ours.gguf"
    fuzzlib.write_gguf(ours, *fuzzlib.tiny_model(arch, np.random.default_rng(0)))
    with GGUFFile(str(ref)) as a, GGUFFile(str(ours)) as b:
        assert set(a.tensors) == set(b.tensors)
        for name, t in a.tensors.items():
            assert len(t.shape) == len(b.tensors[name].shape), name
        keys = {k for k in a.metadata if k.startswith(arch + ".")}
        assert keys <= set(b.metadata), keys - set(b.metadata)
