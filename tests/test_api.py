"""The in-process Python API (reflex_ipc.Model): README's examples run as written, the
protocol's validation and error kinds, streaming, and the cheap import."""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from reflex_ipc import Model, ReflexError, protocol

pytestmark = pytest.mark.usefixtures("smollm2")

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def model(tiny_models):
    m = Model.load(tiny_models["llama"][0], device="numpy", n_ctx=128)
    yield m
    m.close()


def readme_examples():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    lo = text.index("\n## In-process Python API\n")
    hi = text.index("\n## ", lo + 1)
    return re.findall(r"^```python\n(.*?)^```", text[lo:hi], re.S | re.M)


def test_readme_examples_run(tmp_path):
    """Each example of README's in-process section, as a program in a folder outside the
    checkout, with the default model."""
    examples = readme_examples()
    assert len(examples) >= 2
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]))
    env.pop("REFLEX_MODEL", None)
    outs = []
    for i, code in enumerate(examples):
        (tmp_path / f"ex{i}.py").write_text(code)
        p = subprocess.run([sys.executable, f"ex{i}.py"], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=600)
        assert p.returncode == 0, (code, p.stdout, p.stderr)
        outs.append(p.stdout.strip().splitlines())
    assert outs[0][-1] == "invalid_request" and outs[0][-2] == "Paris"
    assert outs[1][-1].split() == [outs[1][-1].split()[0]] * 2  # the state's tokens, saved and loaded


BAD = [
    dict(prompt=PROMPT, max_tokens=0),
    dict(prompt=PROMPT, temperature=-1),
    dict(prompt=PROMPT, top_p=0.0),
    dict(prompt=PROMPT, typical_p=1.5),
    dict(prompt=PROMPT, n=0),
    dict(prompt=PROMPT, n=129),
    dict(prompt=PROMPT, logit_bias={"-1": 1.0}),
    dict(prompt=PROMPT, logit_bias={"5": 101.0}),
    dict(prompt=PROMPT, dry_base=0.5),
    dict(prompt=PROMPT, thinking_budget=-1),
    dict(prompt=PROMPT, stop=[""]),
    dict(prompt=PROMPT, nope=1),
    dict(prompt=PROMPT, messages=[{"role": "user", "content": "x"}]),
    dict(max_tokens=3),
    dict(prompt=""),
]


@pytest.mark.parametrize("fields", BAD)
def test_validation_is_the_protocols(model, fields):
    """The same invalid_request and message as a request line with those fields."""
    with pytest.raises(protocol.RequestError) as want:
        protocol.parse_request(json.dumps({"op": "generate", **fields}).encode())
    with pytest.raises(ReflexError) as got:
        model.generate(**fields)
    assert (got.value.kind, got.value.message) == (want.value.kind, want.value.message)


def test_other_ops_validate_too(model):
    for call, kw in ((model.decide, dict(prompt=PROMPT, candidates=[])),
                     (model.decide, dict(prompt=PROMPT, candidates=["a"], temperature=0)),
                     (model.embed, dict(input=[])), (model.embed, dict(input="x", pooling="max")),
                     (model.tokenize, dict(text="x", add_bos="yes")),
                     (model.detokenize, dict(token_ids=[-1])),
                     (model.save_state, dict(path="")),
                     (model.generate, dict(prompt=PROMPT, model="other.gguf")),
                     (model.generate, dict(prompt=PROMPT, device="cuda"))):
        with pytest.raises(ReflexError) as ei:
            call(**kw)
        assert ei.value.kind == "invalid_request", (call, kw)


def test_generate_stream_and_callbacks(model):
    full = model.generate(PROMPT, max_tokens=6, stop=["zz"])
    assert set(full) >= {"text", "token_ids", "finish_reason", "model", "timings"}
    assert full["timings"]["prompt_eval"] >= 0 and full["model"]
    seen = []
    stream = model.generate(PROMPT, max_tokens=6, stop=["zz"], stream=True,
                            on_token=lambda t, text, **kw: seen.append(t))
    events = list(stream)
    assert [e["event"] for e in events] == ["token"] * len(events)
    assert "".join(e["text"] for e in events) == stream.result["text"] == full["text"]
    assert [e["token_id"] for e in events] == seen == full["token_ids"]
    # leaving the loop early stops generating; the model keeps serving
    it = model.generate(PROMPT, max_tokens=20, stream=True)
    next(iter(it))
    it.close()
    assert model.generate(PROMPT, max_tokens=6)["token_ids"] == full["token_ids"]
    with pytest.raises(ReflexError) as ei:
        model.generate(PROMPT, max_tokens=20, should_cancel=lambda: True)
    assert ei.value.kind == "cancelled"


def test_request_structs_and_keywords_agree(model):
    _, _, req = protocol.parse_request(json.dumps({"op": "generate", "prompt": PROMPT, "max_tokens": 4,
                                                   "temperature": 0.7, "seed": 3}).encode())
    a = model.generate(req)
    b = model.generate(PROMPT, max_tokens=4, temperature=0.7, seed=3)
    assert a["token_ids"] == b["token_ids"]
    with pytest.raises(TypeError):
        model.generate(req, max_tokens=2)


def test_ops(model, tmp_path):
    d = model.decide(PROMPT, candidates=[" Paris", " London"])
    assert len(d["candidates"]) == 2 and 0 <= d["best_idx"] < 2 and d["model"] == model.name
    e = model.embed(["a", "b"], normalize=True)
    assert len(e["embeddings"]) == 2 and e["dim"] == len(e["embeddings"][0])
    ids = model.tokenize("Hello world")
    assert model.detokenize(ids) == "Hello world"
    assert model.tokenize_result("Hello world")["token_ids"] == ids
    model.generate(PROMPT, max_tokens=1)
    s = model.save_state(str(tmp_path / "x.state"))
    assert model.load_state(str(tmp_path / "x.state"))["n_tokens"] == s["n_tokens"] > 0
    assert model.info()["architecture"] == "llama"


def test_import_is_cheap():
    """`import reflex_ipc` (and reaching reflex_ipc.Model) loads no dependency until a model
    is used."""
    code = ("import sys, reflex_ipc; a = sorted(m for m in sys.modules if m.startswith('reflex_ipc'));"
            "reflex_ipc.Model; b = sorted(m for m in sys.modules if m.startswith('reflex_ipc'));"
            "print(a, b, 'msgspec' in sys.modules, 'numpy' in sys.modules)")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True).stdout.split("] [")
    assert out[0] == "['reflex_ipc'"
    assert out[1].endswith("False False\n"), out
