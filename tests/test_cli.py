"""The model commands' command line (issue 13): the protocol's structs check every
option before a model loads, the prompt from stdin, --json errors, exit codes, doctor
and smoke on a machine without CUDA.

A nonexistent --model proves the order: a value checked after loading would fail
with model_not_found instead of invalid_request. The runs that load a model use the
synthetic GGUF in tests/data (a few MB, loads in well under a second)."""

import json
import os
import subprocess
import sys

import pytest

from reflex_ipc.cli import exit_code
from reflex_ipc.errors import KINDS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "tests", "data", "synthetic-llama.gguf")
NOWHERE = "/nonexistent/reflex/model.gguf"


def reflex(*args, stdin=b"", env=None):
    e = dict(os.environ, PYTHONPATH=ROOT, REFLEX_DETACH="0", **(env or {}))
    p = subprocess.run([sys.executable, "-m", "reflex_ipc", *args], input=stdin,
                       capture_output=True, env=e, cwd=ROOT, timeout=120)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


@pytest.mark.parametrize("args,option", [
    (["generate", "--max-tokens", "0", "hi"], "--max-tokens"),
    (["generate", "--max-tokens", "-1", "hi"], "--max-tokens"),
    (["generate", "--max-tokens", "131073", "hi"], "--max-tokens"),
    (["generate", "--temperature", "-1", "hi"], "--temperature"),
    (["generate", "--top-p", "2", "hi"], "--top-p"),
    (["generate", "--top-p", "0", "hi"], "--top-p"),
    (["generate", "--min-p", "1.5", "hi"], "--min-p"),
    (["generate", "--seed", "-3", "hi"], "--seed"),
    (["generate", "--repeat-penalty", "0", "hi"], "--repeat-penalty"),
    (["generate", "--stop", "", "hi"], "--stop"),
    (["generate", ""], "PROMPT"),
    (["system1", "hi"], "--candidate"),
    (["system1", "--candidate", "", "hi"], "--candidate"),
    (["system1", "--candidate", "a", "--temperature", "0", "hi"], "--temperature"),
    (["system1", "--candidate", "a", ""], "PROMPT"),
    (["embed", ""], "TEXT"),
])
def test_checked_before_the_model_loads(args, option):
    rc, out, err = reflex(*args, "--model", NOWHERE, "--device", "cpu")
    assert rc == 2, err
    assert f"invalid_request: {option}" in err and "model_not_found" not in err
    assert out == ""


def test_json_errors_are_one_object():
    rc, out, err = reflex("generate", "--json", "--max-tokens", "0", "--model", NOWHERE, "hi")
    assert rc == 2
    assert json.loads(out) == {"error": {"kind": "invalid_request",
                                         "message": "--max-tokens: Expected `int` >= 1"}}
    rc, out, _ = reflex("generate", "--json", "--bogus", "hi")  # argparse's own errors too
    assert rc == 2 and json.loads(out)["error"]["kind"] == "invalid_request"
    rc, out, _ = reflex("embed", "--json", "--model", NOWHERE, "x")
    assert rc == 2 and json.loads(out)["error"]["kind"] == "model_not_found"
    rc, out, _ = reflex("generate", "--json", "--model", TINY, "--device", "cpu",
                        "--n-ctx", "8", "--max-tokens", "20", "Hello")
    e = json.loads(out)["error"]
    assert rc == 2 and e["kind"] == "context_overflow" and "--n-ctx" in e["message"]


def test_a_directory_as_model(tmp_path):
    (tmp_path / "m.gguf").write_bytes(b"")
    rc, _, err = reflex("generate", "--model", str(tmp_path), "hi")
    assert rc == 2 and "is a directory" in err and "m.gguf" in err


def test_prompt_from_stdin():
    base = ["generate", "--json", "--model", TINY, "--device", "cpu", "--max-tokens", "2"]
    rc, arg_out, err = reflex(*base, "Hello there")
    assert rc == 0, err
    for args, stdin in ((["-"], b"Hello there\n"), ([], b"Hello there")):
        rc, out, err = reflex(*base, *args, stdin=stdin)
        assert rc == 0, err
        assert json.loads(out)["token_ids"] == json.loads(arg_out)["token_ids"]
        assert json.loads(out)["prompt_tokens"] == json.loads(arg_out)["prompt_tokens"]


def test_prompt_over_the_argv_limit():
    """A prompt too long for argv (128 KiB per argument) goes through stdin."""
    prompt = ("word " * 40000).encode()
    rc, out, err = reflex("tokenize", "--json", "--model", TINY, stdin=prompt)
    assert rc == 0, err
    assert json.loads(out)["text"] == prompt.decode()


def test_n_ctx_above_the_trained_context_warns():
    rc, out, err = reflex("generate", "--json", "--model", TINY, "--device", "cpu",
                          "--max-tokens", "1", "--n-ctx", "1000000", "Hello")
    assert rc == 0 and "warning: --n-ctx 1000000 is above the model's trained context" in err
    assert json.loads(out)["completion_tokens"] == 1


def test_tokenize_json_is_compact_and_named_like_the_protocol():
    rc, out, _ = reflex("tokenize", "--json", "--model", TINY, "ab")
    assert rc == 0 and out.startswith('{"text":"ab","token_ids":[') and " " not in out.strip()


def test_help_shows_defaults():
    rc, out, _ = reflex("generate", "--help")
    assert rc == 0
    for text in ("default: 64", "default: 0.0", "default: 1.0", "default: auto",
                 "default: none", "1 <= n <= 131072"):
        assert text in " ".join(out.split()), text


def test_exit_codes():
    assert [k for k in KINDS if exit_code(k) == 2] == [
        "invalid_request", "model_not_found", "gguf_error", "state_error", "unsupported_architecture",
        "context_overflow"]
    assert exit_code("cancelled") == 130 and exit_code("internal") == 1


def test_doctor_reports_the_cpu_path():
    """Exit 0 when a model can run here, CUDA or not; 1 when none can. The backend it says
    --device auto picks is the one a model command then runs; the C kernels' ISA path and
    threads are reported apart from CUDA's fatbin."""
    rc, out, err = reflex("doctor", env={"REFLEX_MODEL": TINY})
    assert rc == 0, out + err
    assert "numpy " in out and TINY in out and "--device auto runs the" in out
    rc, out, _ = reflex("doctor", "--json", env={"REFLEX_MODEL": TINY})
    rep = json.loads(out)
    assert rc == 0 and rep["ok"] and rep["cpu"]["ok"] and rep["auto_reason"]
    rc, gen, err = reflex("generate", "--json", "--max-tokens", "1", "--model", TINY, "hi")
    assert rc == 0, err
    assert rep["auto_backend"] == json.loads(gen)["backend"]
    lib = rep["cpu"]["library"]
    if lib["ok"]:
        assert lib["isa"] in ("generic", "avx2", "avx512vnni") and lib["threads"] >= 1
        rc, out, _ = reflex("doctor", "--json", env={"REFLEX_MODEL": TINY, "REFLEX_CPU_ISA": "generic",
                                                     "REFLEX_CPU_THREADS": "1"})
        forced = json.loads(out)["cpu"]["library"]
        assert forced["isa"] == "generic" and forced["threads"] == 1
    rc, out, _ = reflex("doctor", "--json", env={"REFLEX_MODEL": NOWHERE})
    assert rc == 1 and not json.loads(out)["ok"]


def test_smoke_without_cuda_is_not_a_failure():
    rc, out, err = reflex("smoke", "--json")
    rep = json.loads(out)
    if rep.get("cuda_available") is False:  # this machine (and CI) have no GPU
        assert rc == 3 and not rep["ok"]
        rc, out, err = reflex("smoke")
        assert rc == 3 and "FAILED" not in out + err and "CUDA is not available" in out
    else:
        assert rc == (0 if rep["ok"] else 1), out + err


# -- issue 33: the command line as a newcomer meets it -----------------------------------------
def _commands():
    from reflex_ipc.cli import COMMANDS

    return sorted(COMMANDS)


@pytest.mark.parametrize("name", _commands())
def test_every_help_has_examples_and_plain_metavars(name):
    """Each command's --help ends with examples; option values are named for what they
    are (FILE, TEXT, N), not after internal field names (KV_IMPORT, CANDIDATES); no help
    points at a repository file, which an installed wheel does not have."""
    import re

    rc, out, err = reflex(name, "--help")
    assert rc == 0, err
    assert "\nexamples:\n  " in out and f"reflex {name}" in out[out.index("\nexamples:"):]
    assert not re.search(r"--[a-z-]+ [A-Z]+_[A-Z_]+", out), out
    assert not re.search(r"\b[\w.-]+/[\w./-]+\.(md|py|json|sh|cu|c)\b|\b(kernels|scripts|tests)/", out), out


def test_model_command_help_sections_in_order():
    rc, out, _ = reflex("generate", "--help")
    heads = [h for h in ("input:", "model:", "sampling:", "constraints:", "saved state:", "output:")]
    pos = [out.index("\n" + h + "\n") for h in heads]
    assert pos == sorted(pos)
    usage = out[:out.index("\n\n")]
    assert usage.index("--chat") < usage.index("--model") < usage.index("--max-tokens") \
        < usage.index("--regex") < usage.index("--import-kv FILE") < usage.index("[--json]")


def test_closed_stdout_exits_quietly():
    """`reflex tokenize ... | head -1`: no traceback, no `internal`; the exit status a
    process killed by SIGPIPE would have (141)."""
    text = "word " * 30000  # ~1 MB of output: more than a pipe holds
    e = dict(os.environ, PYTHONPATH=ROOT, REFLEX_DETACH="0")
    p = subprocess.run(["bash", "-o", "pipefail", "-c",
                        f"{sys.executable} -m reflex_ipc tokenize --model {TINY} | head -1 >/dev/null"],
                       input=text.encode(), capture_output=True, env=e, cwd=ROOT, timeout=120)
    assert p.stderr == b"" and p.returncode == 141


def test_inspect_takes_the_file_as_argument():
    rc, out, err = reflex("inspect", "--json", TINY)
    assert rc == 0, err and json.loads(out)["path"] == TINY
    rc, out2, _ = reflex("inspect", "--json", "--model", TINY)
    assert json.loads(out2) == json.loads(out)
    rc, _, err = reflex("inspect", TINY, "--model", NOWHERE)
    assert rc == 2 and "FILE or --model" in err


def test_detokenize_inverts_tokenize():
    rc, out, _ = reflex("tokenize", "--json", "--model", TINY, "Hello world, again")
    ids = json.loads(out)["token_ids"]
    rc, out, err = reflex("detokenize", "--model", TINY, *map(str, ids))
    assert rc == 0 and out == "Hello world, again\n", err
    rc, out, _ = reflex("detokenize", "--json", "--model", TINY, stdin=json.dumps(ids).encode())
    assert json.loads(out)["text"] == "Hello world, again"
    rc, _, err = reflex("detokenize", "--model", TINY, "12x")
    assert rc == 2 and "invalid_request: ID: '12x'" in err
    rc, _, err = reflex("detokenize", "--model", TINY, "99999999")
    assert rc == 2 and "out of range" in err


def test_logprobs_without_json_is_a_table_on_stderr():
    rc, out, err = reflex("generate", "--model", TINY, "--device", "cpu", "--max-tokens", "3",
                          "--logprobs", "2", "Hello")
    assert rc == 0, err
    assert "logprobs (natural log" in err and len([ln for ln in err.splitlines() if " | " in ln]) == 3
    assert "logprobs" not in out


def test_system1_table_says_what_its_columns_are():
    rc, out, err = reflex("system1", "--model", TINY, "--device", "cpu", "--candidate", " a",
                          "--candidate", " b", "Hello")
    assert rc == 0, err
    head, *rows = out.splitlines()
    assert head.split() == ["prob", "logprob", "tokens", "candidate"] and len(rows) == 2
    assert sum(r.startswith("*") for r in rows) == 1


def test_demo_files_for_infill_and_lora(tmp_path, smollm2):
    """README's way to try infill and LoRA without a FIM model or an adapter at hand."""
    fim, lora = str(tmp_path / "fim.gguf"), str(tmp_path / "lora.gguf")
    for args in (["fim", fim], ["lora", lora]):
        p = subprocess.run([sys.executable, "-m", "reflex_ipc.testing.demo", *args], capture_output=True,
                           env=dict(os.environ, PYTHONPATH=ROOT), timeout=300)
        assert p.returncode == 0, p.stderr
    rc, out, err = reflex("infill", "--json", "--device", "cpu", "--model", fim, "--max-tokens", "4",
                          "--prefix", "def add(a, b):\n    return ", "--suffix", "\n")
    assert rc == 0 and json.loads(out)["completion_tokens"] >= 1, err
    base = ["generate", "--json", "--device", "cpu", "--max-tokens", "8", "Once upon a time"]
    rc, plain, err = reflex(*base)
    rc2, adapted, err2 = reflex(*base, "--lora", lora + ":0.5")
    assert rc == rc2 == 0, err + err2
    assert json.loads(adapted)["token_ids"] != json.loads(plain)["token_ids"]


def test_published_names():
    """README, "Names": the distribution reflex-ipc installs `reflex` and `reflex-ipc` (the
    same program; PyPI's unrelated `reflex` package owns a `reflex` command too); the Python
    client is reflex-ipc-client (PyPI's `reflex-client` is another project)."""
    import re

    text = open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8").read()
    assert re.search(r'(?m)^name = "reflex-ipc"$', text)
    scripts = dict(re.findall(r'(?m)^([\w-]+) = "([\w.:]+)"$', text.split("[project.scripts]")[1].split("\n[")[0]))
    assert scripts == {"reflex": "reflex_ipc.cli:main", "reflex-ipc": "reflex_ipc.cli:main"}
    client = open(os.path.join(ROOT, "clients", "python", "pyproject.toml"), encoding="utf-8").read()
    assert re.search(r'(?m)^name = "reflex-ipc-client"', client)
