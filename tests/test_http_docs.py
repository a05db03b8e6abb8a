"""README's HTTP and MCP examples, run as written: every ```python and ```sh block of the
"## HTTP" and "## MCP" sections against a real `reflex http` on SmolLM2 (CPU), the port
of the examples (8080) replaced by the test front's. `reflex` on PATH is this checkout's
(a wrapper in a temporary folder: the MCP client passes its servers a minimal
environment, PATH but not PYTHONPATH)."""

import json
import os
import re
import stat
import subprocess
import sys

import pytest

from test_http import Front, _env  # noqa: E402  (tests/ is on sys.path)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def blocks(section):
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        text = f.read()
    lo = text.index("\n" + section + "\n")
    hi = text.find("\n## ", lo + 1)
    body = text[lo:hi if hi >= 0 else len(text)]
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(python|sh|json)\n(.*?)^```", body, re.S | re.M)]


# the first block starts the server (the fixture runs it); the others are clients
HTTP = [b for b in blocks("## HTTP (OpenAI- and Anthropic-compatible)") if not b[1].startswith("reflex http")]
MCP = blocks("## MCP")


def test_the_sections_have_examples():
    assert [k for k, _ in HTTP] == ["python", "python", "sh"]
    assert [k for k, _ in MCP] == ["json", "python"]
    config = json.loads(MCP[0][1])
    assert config["mcpServers"]["reflex"]["args"][0] == "mcp"


@pytest.fixture(scope="module")
def reflex_bin(tmp_path_factory):
    d = tmp_path_factory.mktemp("bin")
    path = d / "reflex"
    path.write_text(f"#!/bin/sh\nPYTHONPATH={REPO}${{PYTHONPATH:+:$PYTHONPATH}} exec {sys.executable} -m reflex_ipc \"$@\"\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(d)


@pytest.fixture(scope="module")
def front(smollm2):
    f = Front(["--device", "cpu"])
    yield f
    f.close()


def _run(kind, code, tmp_path, env):
    if kind == "python":
        (tmp_path / "example.py").write_text(code)
        cmd = [sys.executable, "example.py"]
    else:
        (tmp_path / "example.sh").write_text("set -e\n" + code)
        cmd = ["bash", "example.sh"]
    p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 0, f"{kind} example failed:\n{code}\n{p.stdout}\n{p.stderr}"
    return p.stdout


@pytest.mark.parametrize("i", range(len(HTTP)))
def test_http_examples(front, reflex_bin, tmp_path, i):
    kind, code = HTTP[i]
    env = _env(PATH=reflex_bin + os.pathsep + os.environ["PATH"])
    out = _run(kind, code.replace("8080", str(front.port)), tmp_path, env)
    assert out.strip()
    if kind == "sh":  # curl: each answer is a JSON object
        answers, dec, at = [], json.JSONDecoder(), 0
        while out[at:].strip():
            obj, at = dec.raw_decode(out, len(out) - len(out[at:].lstrip()))
            answers.append(obj)
        assert len(answers) == 2 and answers[0]["best"] in (" positive", " negative")
        assert [r["question"] for r in answers[1]["results"]] == ["Did sales fall?", "Did costs fall?"]


def test_mcp_example(reflex_bin, tmp_path, smollm2):
    env = _env(PATH=reflex_bin + os.pathsep + os.environ["PATH"])
    out = _run("python", MCP[1][1], tmp_path, env).splitlines()
    assert out[0] == "['generate', 'decide', 'embed', 'infill']" and out[1] in (" yes", " no")
