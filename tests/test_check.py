"""`reflex check`: references written and compared, exit codes a CI job can use."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMA = os.path.join(ROOT, "tests", "data", "synthetic-llama.gguf")
QWEN3 = os.path.join(ROOT, "tests", "data", "synthetic-qwen3.gguf")
PROMPTS = ["Hello world", "The capital of France is"]


def check(*args, model=LLAMA, stdin=None):
    p = subprocess.run([sys.executable, "-m", "reflex_ipc", "check", "--device", "cpu", "--model", model,
                        "--max-tokens", "6", *args], capture_output=True, text=True, input=stdin, timeout=300)
    return p.returncode, p.stdout, p.stderr


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    path = tmp_path_factory.mktemp("check") / "ref.json"
    rc, out, err = check("--write-reference", str(path), *PROMPTS)
    assert rc == 0, err
    return path


def _summary(out):
    return json.loads(out.strip().splitlines()[-1])


def test_reference_format(ref):
    r = json.loads(ref.read_text())
    assert r["format"] == "reflex-check" and r["version"] == 1 and r["backend"] == "cpu"  # auto, no GPU
    assert len(r["model"]["identity"]) == 32 and r["model"]["architecture"] == "llama"
    for p in r["prompts"]:
        assert len(p["steps"]) == len(p["token_ids"]) == 6
        for s in p["steps"]:
            assert s["token_id"] == s["top_ids"][0] and len(s["top_ids"]) == 8
            assert s["gap"] == pytest.approx(s["top_logits"][0] - s["top_logits"][1])
            assert s["max_abs_logit"] >= abs(s["top_logits"][0])


def test_same_backend_passes(ref):
    rc, out, err = check("--reference", str(ref), "--json", *PROMPTS)
    assert rc == 0, err
    s = _summary(out)
    assert s["ok"] and [p["status"] for p in s["prompts"]] == ["pass", "pass"]
    assert all(p["max_logit_err"] == 0.0 and p["steps_compared"] == 6 for p in s["prompts"])


def test_prompt_from_stdin(ref):
    rc, out, err = check("--reference", str(ref), "--json", stdin=PROMPTS[1])
    assert rc == 0, err
    assert _summary(out)["ok"] and _summary(out)["prompts"][0]["prompt"] == PROMPTS[1]


def _perturbed(ref, tmp_path, fn):
    r = json.loads(ref.read_text())
    fn(r)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(r))
    return path


def _choose_runner_up(p, k, gap):
    """Prompt p's reference now chose its runner-up at step k, `gap` ahead (consistently: the
    ids swapped, token_ids and the top logits agreeing)."""
    s = p["steps"][k]
    s["top_ids"][0], s["top_ids"][1] = s["top_ids"][1], s["top_ids"][0]
    s["top_logits"][1] = s["top_logits"][0] - gap
    s["top_logits"][2:] = [min(x, s["top_logits"][1]) for x in s["top_logits"][2:]]
    s["token_id"], s["gap"] = s["top_ids"][0], gap
    s["max_abs_logit"] = max([s["max_abs_logit"]] + [abs(x) for x in s["top_logits"]])
    p["token_ids"][k] = s["token_id"]


def test_token_mismatch_fails_with_a_report(ref, tmp_path):
    def swap(r):  # the reference now says the runner-up, far from a tie
        _choose_runner_up(r["prompts"][1], 2, 5.0)
    rc, out, _ = check("--reference", str(_perturbed(ref, tmp_path, swap)), "--json", *PROMPTS)
    assert rc == 1
    s = _summary(out)
    bad = s["prompts"][1]
    assert not s["ok"] and bad["status"] == "token_mismatch" and bad["step"] == 2 and bad["ref_gap"] == 5.0
    assert s["prompts"][0]["status"] == "pass"


def test_near_tie_passes_and_is_reported(ref, tmp_path):
    def tie(r):
        _choose_runner_up(r["prompts"][0], 1, 1e-6)
    rc, out, _ = check("--reference", str(_perturbed(ref, tmp_path, tie)), "--json", *PROMPTS)
    assert rc == 0
    p = _summary(out)["prompts"][0]
    assert p["status"] == "near_tie" and p["step"] == 1 and p["ref_gap"] == 1e-6


def test_logit_drift_fails(ref, tmp_path):
    def drift(r):  # every top logit moved by 5% of max|logit| (the reference stays consistent)
        s = r["prompts"][0]["steps"][3]
        d = 0.05 * s["max_abs_logit"]
        s["top_logits"] = [x + d for x in s["top_logits"]]
        s["max_abs_logit"] = max(s["max_abs_logit"], abs(s["top_logits"][0]), abs(s["top_logits"][-1]))
    path = _perturbed(ref, tmp_path, drift)
    rc, out, _ = check("--reference", str(path), "--json", *PROMPTS)
    assert rc == 1 and _summary(out)["prompts"][0]["status"] == "logit_mismatch"
    assert _summary(out)["prompts"][0]["step"] == 3
    rc, out, _ = check("--reference", str(path), "--json", "--tolerance", "0.1", *PROMPTS)
    assert rc == 0  # within a looser tolerance


@pytest.mark.parametrize("how", ["token_ids", "step_token", "gap", "steps_count"])
def test_reference_that_disagrees_with_itself_fails(ref, tmp_path, how):
    """Issue 32 item 14: a reference whose recorded token_ids were changed passed (only the
    steps were compared); any disagreement within the reference is now refused (exit 2)."""
    def edit(r):
        p = r["prompts"][1]
        if how == "token_ids":
            p["token_ids"][3] = (p["token_ids"][3] + 1) % 1000
        elif how == "step_token":
            p["steps"][3]["token_id"] = p["steps"][3]["top_ids"][1]
        elif how == "gap":
            p["steps"][0]["gap"] += 1.0
        else:
            p["steps"] = p["steps"][:4]
    rc, out, err = check("--reference", str(_perturbed(ref, tmp_path, edit)), "--json", *PROMPTS)
    assert rc == 2 and "prompt 1" in _summary(out)["error"]["message"], (out, err)


def test_reference_ids_compared_with_this_run(ref, tmp_path):
    """A consistent reference whose ids differ from this run's (its steps' tokens too) fails."""
    def edit(r):
        _choose_runner_up(r["prompts"][0], 4, 3.0)
    rc, out, _ = check("--reference", str(_perturbed(ref, tmp_path, edit)), "--json", *PROMPTS)
    assert rc == 1 and _summary(out)["prompts"][0]["status"] == "token_mismatch"


def test_another_models_reference_is_refused(ref):
    rc, out, err = check("--reference", str(ref), *PROMPTS, model=QWEN3)
    assert rc == 2 and "another model" in err


def test_bad_reference_files(ref, tmp_path):
    junk = tmp_path / "junk.json"
    junk.write_text("{not json")
    assert check("--reference", str(junk), *PROMPTS)[0] == 2
    junk.write_text(json.dumps({"format": "something else"}))
    assert check("--reference", str(junk), *PROMPTS)[0] == 2
    assert check("--reference", str(tmp_path / "missing.json"), *PROMPTS)[0] == 2
    rc, _, err = check("--reference", str(ref), "A prompt not in the reference")
    assert rc == 2 and "not in the reference" in err
    rc, out, _ = check("--max-tokens", "0", "--json", *PROMPTS)
    assert rc == 2 and _summary(out)["error"]["kind"] == "invalid_request"


def test_llama_cpp_reference_is_accepted(tmp_path, llama_cpp):
    path = tmp_path / "llama.json"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "fixtures", "llama_cpp_reference.py"), "--model", LLAMA,
                        "--max-tokens", "6", "--out", str(path), *PROMPTS], capture_output=True, text=True,
                       timeout=300, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    assert p.returncode == 0, p.stderr
    r = json.loads(path.read_text())
    assert r["backend"] == "llama.cpp"
    # a quantized model: llama.cpp rounds activations to 8 bits (2-4% of max|logit|)
    rc, out, _ = check("--reference", str(path), "--tolerance", "0.04", "--json", *PROMPTS)
    s = _summary(out)
    assert rc == 0 and s["ok"], s
    assert all(p["status"] in ("pass", "near_tie") for p in s["prompts"])
