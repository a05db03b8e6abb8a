"""LoRA adapters (reflex_ipc/lora.py): greedy continuations equal llama.cpp's with the same
adapters and scales (tests/goldens/lora/greedy.json, recorded by scripts/fixtures/record_lora_goldens.py
with llama-cpp-python 0.3.36 on the F32 twins) in both application modes (merged into the
weights at load, added at run time); adapter/base mismatches are clear errors; the CLI's
--lora, the protocol's load.lora, and saved states' adapter identity."""

import hashlib
import json
import os
import subprocess
import sys

import pytest

from reflex_ipc.engine import load_runner
from reflex_ipc.errors import ReflexError
from reflex_ipc.gguffile import GGUFError

from reflex_ipc.testing.lora import write_lora

HERE = os.path.dirname(os.path.abspath(__file__))

GOLDEN = json.load(open(os.path.join(HERE, "goldens", "lora", "greedy.json")))
BASE = {a: os.path.join(HERE, "data", f"synthetic-{a}.gguf") for a in GOLDEN["models"]}


def env():
    e = dict(os.environ)
    e.pop("REFLEX_MODEL", None)
    e.pop("REFLEX_LORA", None)
    return e


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """{arch: {key: path}}, rebuilt as the goldens' recorder wrote them (same sha256)."""
    d = tmp_path_factory.mktemp("lora")
    out = {}
    for arch, rec in GOLDEN["models"].items():
        out[arch] = {}
        for k, kw in GOLDEN["adapters"].items():
            kw = dict(kw)
            if "targets" in kw:
                kw["targets"] = tuple(kw["targets"])
            p = write_lora(BASE[arch], str(d / f"{arch}-{k}.gguf"), **kw)
            with open(p, "rb") as f:
                assert hashlib.sha256(f.read()).hexdigest() == rec["adapter_sha256"][k], (arch, k)
            out[arch][k] = p
    return out


CASES = [(arch, i) for arch, rec in GOLDEN["models"].items() for i in range(len(rec["cases"]))]


@pytest.mark.parametrize("mode", ["merge", "runtime"])
@pytest.mark.parametrize("arch", list(GOLDEN["models"]))
def test_greedy_equals_llama_cpp(arch, mode, adapters, monkeypatch):
    monkeypatch.setenv("REFLEX_LORA", mode)
    rec = GOLDEN["models"][arch]
    by_adapters = {}
    for case in rec["cases"]:
        by_adapters.setdefault(tuple(map(tuple, case["adapters"])), []).append(case)
    for combo, cases in by_adapters.items():
        lora = [{"path": adapters[arch][k], "scale": s} for k, s in combo]
        r = load_runner(BASE[arch], device="numpy", n_ctx=128, lora=lora)
        try:
            assert r.lora_mode == mode
            assert r.info()["lora"] == [{"path": a["path"], "scale": float(a["scale"])} for a in lora]
            for case in cases:
                out = r.generate(case["prompt_ids"], max_tokens=GOLDEN["steps"], cache_prompt=False)
                assert out["token_ids"] == case["tokens"], (combo, case["prompt_ids"])
        finally:
            r.close()


def test_adapter_changes_output_and_scale_zero_does_not(adapters):
    ids = GOLDEN["models"]["llama"]["cases"][0]["prompt_ids"]
    r = load_runner(BASE["llama"], device="numpy", n_ctx=128)
    base = r.generate(ids, max_tokens=8)["token_ids"]
    r.close()
    r = load_runner(BASE["llama"], device="numpy", n_ctx=128, lora=[adapters["llama"]["a"] + ":0"])
    assert r.generate(ids, max_tokens=8)["token_ids"] == base
    r.close()
    assert GOLDEN["models"]["llama"]["cases"][0]["tokens"][:8] != base


def _err(fn):
    with pytest.raises((ReflexError, GGUFError)) as e:
        fn()
    return getattr(e.value, "kind", "gguf_error"), str(e.value)


def test_mismatches(adapters, tmp_path):
    # another architecture
    kind, msg = _err(lambda: load_runner(BASE["llama"], device="numpy", lora=[adapters["qwen3"]["a"]]))
    assert kind == "invalid_request" and "'qwen3'" in msg and "'llama'" in msg
    # same architecture, other shapes (qwen3's tensors relabelled as llama)
    bad = write_lora(BASE["qwen3"], str(tmp_path / "shape.gguf"), arch="llama")
    kind, msg = _err(lambda: load_runner(BASE["llama"], device="numpy", lora=[bad]))
    assert kind == "invalid_request" and "do not fit" in msg
    # not an adapter
    kind, msg = _err(lambda: load_runner(BASE["llama"], device="numpy", lora=[BASE["llama"]]))
    assert kind == "invalid_request" and "not an adapter" in msg
    # missing file
    assert _err(lambda: load_runner(BASE["llama"], device="numpy", lora=[str(tmp_path / "no.gguf")]))[0] == \
        "model_not_found"
    # a tensor the base lacks, and a lone lora_a
    import gguf
    import numpy as np

    for name, tensors, want in [
        ("extra.gguf", {"blk.9.attn_q.weight.lora_a": (4, 64), "blk.9.attn_q.weight.lora_b": (128, 4)},
         ("invalid_request", "no tensor 'blk.9.attn_q.weight'")),
        ("half.gguf", {"blk.0.attn_q.weight.lora_a": (4, 64)}, ("gguf_error", "lora_b is missing")),
        ("rank.gguf", {"blk.0.attn_q.weight.lora_a": (4, 64), "blk.0.attn_q.weight.lora_b": (128, 3)},
         ("gguf_error", "rank")),
    ]:
        w = gguf.GGUFWriter(str(tmp_path / name), "llama")
        w.add_string("general.type", "adapter")
        w.add_string("adapter.type", "lora")
        w.add_float32("adapter.lora.alpha", 4.0)
        for t, shape in tensors.items():
            w.add_tensor(t, np.zeros(shape, np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        kind, msg = _err(lambda: load_runner(BASE["llama"], device="numpy", lora=[str(tmp_path / name)]))
        assert (kind, want[1] in msg) == (want[0], True), msg
    # a bad scale
    assert _err(lambda: load_runner(BASE["llama"], device="numpy",
                                    lora=[{"path": adapters["llama"]["a"], "scale": float("nan")}]))[0] == \
        "invalid_request"


def test_state_identity_includes_adapters(adapters, tmp_path):
    path = str(tmp_path / "s.state")
    r = load_runner(BASE["llama"], device="numpy", n_ctx=128, lora=[adapters["llama"]["a"]])
    try:
        r.generate("Once upon a time", max_tokens=2, kv_export=path)
        out = r.generate(" there", max_tokens=2, kv_import=path)
        assert out["cached_tokens"] == out["kv_import"]["n_tokens"]
    finally:
        r.close()
    for lora in ([], [adapters["llama"]["a"] + ":0.5"], [adapters["llama"]["b"]]):
        r = load_runner(BASE["llama"], device="numpy", n_ctx=128, lora=lora)
        try:
            kind, msg = _err(lambda: r.load_state(path))
            assert kind == "invalid_request" and "LoRA" in msg
        finally:
            r.close()


def test_cli_and_protocol(adapters):
    case = next(c for c in GOLDEN["models"]["qwen3"]["cases"] if c["adapters"] == [["a", 0.5]])
    text = "Once upon a time"
    r = load_runner(BASE["qwen3"], device="numpy", n_ctx=128)
    assert r.tok.encode(text) == case["prompt_ids"]
    r.close()
    p = subprocess.run([sys.executable, "-m", "reflex_ipc", "generate", "--device", "numpy", "--model", BASE["qwen3"],
                        "--lora", adapters["qwen3"]["a"] + ":0.5", "--max-tokens", str(GOLDEN["steps"]), "--json",
                        text], capture_output=True, text=True, env=env(), timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["token_ids"] == case["tokens"]
    reqs = [{"id": 1, "op": "load", "model": BASE["qwen3"], "device": "cpu",
             "lora": [{"path": adapters["qwen3"]["a"], "scale": 0.5}]},
            {"id": 2, "op": "generate", "prompt": text, "max_tokens": GOLDEN["steps"]},
            {"id": 3, "op": "load", "model": BASE["qwen3"], "device": "cpu",
             "lora": [{"path": adapters["llama"]["a"]}]},
            {"id": 4, "op": "load", "model": BASE["qwen3"], "device": "cpu", "lora": [{"path": "x", "scale": 1e9}]}]
    p = subprocess.run([sys.executable, "-m", "reflex_ipc", "stdio", "--device", "numpy"],
                       input="".join(json.dumps(q) + "\n" for q in reqs), capture_output=True, text=True,
                       env=env(), timeout=120)
    by = {x["id"]: x for x in map(json.loads, p.stdout.splitlines()[1:])}
    assert by[1]["ok"] and by[1]["lora"] == [{"path": adapters["qwen3"]["a"], "scale": 0.5}]
    assert by[2]["token_ids"] == case["tokens"]
    assert by[3]["error"]["kind"] == "invalid_request" and "'llama'" in by[3]["error"]["message"]
    assert by[4]["error"]["kind"] == "invalid_request"
