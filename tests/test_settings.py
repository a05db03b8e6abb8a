"""reflex_ipc/settings.py: every REFLEX_* variable declared once, read at one moment, typed and
checked; README's table written from it; each backend's graph switch scoped to that backend."""

import os
import re
import subprocess
import sys

import pytest

from reflex_ipc import settings
from reflex_ipc.errors import ReflexError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMES = {row[0] for row in settings.TABLE}


def test_readme_table_is_current():
    text = open(os.path.join(ROOT, "README.md")).read()
    m = re.search(r"<!-- settings table: [^\n]*-->\n(.*?)<!-- end of settings table -->", text, re.S)
    assert m, "README.md lost its settings table markers"
    assert m.group(1) == settings.markdown(), "README's table is stale: python -m reflex_ipc.settings --markdown"


def _code_files():
    for top in ("reflex_ipc", "kernels", "scripts", "bench", "tests", "clients"):
        for d, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [x for x in dirs if x not in ("node_modules", "__pycache__", "results", "data", "goldens")]
            for f in files:
                path = os.path.join(d, f)
                if f.endswith((".py", ".c", ".h", ".cu", ".cuh", ".sh", ".js", ".go")) or \
                        os.path.basename(d) == "gpu" and "." not in f:
                    yield path


def test_every_variable_the_code_names_is_declared():
    seen = {}
    for path in _code_files():
        for name in re.findall(r"\bREFLEX_[A-Z0-9_]*[A-Z0-9]\b", open(path, errors="replace").read()):
            seen.setdefault(name, path)
    seen.pop("REFLEX_X", None)  # scripts/gpu/gpu-ab's usage placeholder
    unknown = {n: p for n, p in seen.items() if n not in NAMES and n not in settings.RETIRED}
    assert not unknown, f"REFLEX_ variables missing from settings.TABLE: {unknown}"


def test_only_settings_reads_the_environment():
    """Runtime code reads REFLEX_ variables through settings.get(); only the kernel builds (run
    before the package exists, and harnesses handing a build variable to a build they start)
    and the clients' own test suites read them themselves."""
    build = "|".join(n[len("REFLEX_"):] for n, _, _, scope, _ in settings.TABLE if scope == "build")
    read = re.compile(rf"(environ\.get\(\s*[\"']REFLEX_(?!({build})\b)|environ\[\s*[\"']REFLEX_[A-Z0-9_]+[\"']\s*\]"
                      rf"(?!\s*=)|getenv\(\s*\"REFLEX_|Getenv\(\"REFLEX_|process\.env\.REFLEX_)")
    allowed = {os.path.join("kernels", "build.py"), os.path.join("kernels", "cpu", "build.py"),
               os.path.join("reflex_ipc", "settings.py")}
    bad = []
    for path in _code_files():
        rel = os.path.relpath(path, ROOT)
        if rel in allowed or rel.startswith("clients" + os.sep):
            continue
        for n, line in enumerate(open(path, errors="replace"), 1):
            if read.search(line):
                bad.append(f"{rel}:{n}: {line.strip()}")
    assert not bad, "read REFLEX_ variables through reflex_ipc.settings:\n" + "\n".join(bad)


def test_build_variables_are_the_builds():
    build = {n for n, _, _, scope, _ in settings.TABLE if scope == "build"}
    text = open(os.path.join(ROOT, "kernels", "build.py")).read() + open(
        os.path.join(ROOT, "kernels", "cpu", "build.py")).read()
    assert build == set(re.findall(r"REFLEX_[A-Z_]+", text)) & NAMES


@pytest.mark.parametrize("name, raw, want", [
    ("REFLEX_FUSE", "0", False), ("REFLEX_FUSE", "1", True), ("REFLEX_FUSE", "", True),
    ("REFLEX_CPU_THREADS", " 3 ", 3), ("REFLEX_CPU_THREADS", "", None),
    ("REFLEX_CUDA_UPLOAD", "read", "read"), ("REFLEX_FUZZ_SEED", "-4", -4),
    ("REFLEX_CACHE", "~/x", os.path.expanduser("~/x")), ("REFLEX_MODEL", "a b.gguf", "a b.gguf"),
    ("REFLEX_CPU_GRAPH", "0", False),
])
def test_values_are_typed(name, raw, want):
    s = settings.read({name: raw})
    assert getattr(s, name[len("REFLEX_"):].lower()) == want


@pytest.mark.parametrize("name, raw, allowed", [
    ("REFLEX_FUSE", "yes", "0, 1"), ("REFLEX_CUDA_GRAPH", "2", "0, 1"),
    ("REFLEX_CPU_THREADS", "0", ">= 1"), ("REFLEX_CPU_THREADS", "many", ">= 1"),
    ("REFLEX_CUDA_UPLOAD", "fast", "auto, register, read, staging"), ("REFLEX_LORA", "both", "merge, runtime"),
    ("REFLEX_CPU_ISA", "native", "auto, generic, avx2"), ("REFLEX_T_LAUNCH", "now", "whole number"),
])
def test_a_bad_value_is_one_clear_error(name, raw, allowed):
    with pytest.raises(ReflexError) as e:
        settings.read({name: raw})
    assert e.value.kind == "invalid_request"
    assert f"${name}={raw!r}" in e.value.message and allowed in e.value.message


def test_defaults_and_attributes():
    s = settings.read({})
    for name, kind, default, scope, purpose in settings.TABLE:
        assert purpose.endswith(".") and scope in ("engine", "cli", "http", "cpu", "cpu, numpy", "cuda", "build",
                                                   "harness"), name
        if scope != "build":
            assert getattr(s, name[len("REFLEX_"):].lower()) == default
            if default is not None and kind not in ("text", "path"):
                assert settings.parse(name, kind, "1" if default is True else "0" if default is False
                                      else str(default)) == default
    assert not set(settings.RETIRED) & NAMES


def test_get_reads_once_and_override_restores(monkeypatch):
    monkeypatch.setenv("REFLEX_FUSE", "0")
    s = settings.get()
    assert s.fuse is False and settings.get() is s
    os.environ["REFLEX_FUSE"] = "1"  # unseen until the next reload: read once
    assert settings.get().fuse is False
    with settings.override(fuse=True, cpu_threads=2) as o:
        assert settings.get() is o and o.fuse is True and o.cpu_threads == 2
    assert settings.get() is s
    with pytest.raises(AttributeError):
        with settings.override(no_such_switch=1):
            pass
    assert settings.get() is s
    assert settings.reload().fuse is True


def test_retired_switches_warn_once():
    code = "from reflex_ipc import settings; settings.get(); settings.reload(); print('ok')"
    env = dict(os.environ, REFLEX_MMNT="0", REFLEX_CHUNKED="0", PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    assert r.stderr.count("warning") == 2 and "REFLEX_MMNT" in r.stderr and "REFLEX_CHUNKED" in r.stderr


def test_cli_reports_a_bad_value_before_anything_else():
    env = dict(os.environ, REFLEX_CPU_GRAPH="maybe", PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-m", "reflex_ipc", "generate", "--device", "cpu", "--max-tokens", "1",
                        "--model", "/nonexistent.gguf", "hi"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stderr.strip() == ("reflex generate: invalid_request: $REFLEX_CPU_GRAPH='maybe' is not valid: "
                                "expected 0, 1")
    r = subprocess.run([sys.executable, "-m", "reflex_ipc", "generate", "--json", "--model", "/nonexistent.gguf",
                        "hi"], capture_output=True, text=True, env=dict(env, REFLEX_CPU_GRAPH="1",
                                                                        REFLEX_T_LAUNCH="soon"), timeout=60)
    assert r.returncode == 2 and '"kind":"invalid_request"' in r.stdout and "REFLEX_T_LAUNCH" in r.stdout


class _Model:
    capturable = True

    @staticmethod
    def state_spec():
        return []


def test_each_backend_has_its_own_graph_switch(monkeypatch):
    """REFLEX_CUDA_GRAPH=0 no longer turns off the cpu backend's replays; REFLEX_CPU_GRAPH does."""
    from reflex_ipc.backends.cpu_ops import CpuOps
    from reflex_ipc.runtime.executor import Executor

    monkeypatch.setenv("REFLEX_CUDA_GRAPH", "0")
    ops = CpuOps(threads=1)
    assert ops.graphs is True and Executor(ops, _Model(), 64).use_graphs
    monkeypatch.setenv("REFLEX_CPU_GRAPH", "0")
    ops = CpuOps(threads=1)
    assert ops.graphs is False and not Executor(ops, _Model(), 64).use_graphs


def test_cuda_graph_switch_is_the_cuda_backends(monkeypatch):
    from reflex_ipc.backends import cuda_ops

    class Rt:
        cc = (9, 0)
        pool = kernel = None

    monkeypatch.setattr(cuda_ops, "_cuda_runtime", lambda: Rt())
    monkeypatch.setenv("REFLEX_CPU_GRAPH", "0")
    assert cuda_ops.CudaOps().graphs is True
    monkeypatch.setenv("REFLEX_CUDA_GRAPH", "0")
    assert cuda_ops.CudaOps().graphs is False


def test_cpu_isa_reaches_the_library():
    code = "from reflex_ipc.backends.cpu_ops import CpuOps; print(CpuOps(threads=1).isa)"
    env = dict(os.environ, REFLEX_CPU_ISA="generic", PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "generic", r.stderr


def test_phases_import_reads_the_settings():
    """The one moment: the CLI's first import (phases) reads every variable."""
    code = ("import reflex_ipc.settings as s; assert s._current is None; import reflex_ipc.phases as p; "
            "assert s._current is not None and p.HAVE_LAUNCH; print(s._current.t_launch)")
    env = dict(os.environ, REFLEX_T_LAUNCH="1700000000000000000", PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "1700000000000000000", r.stderr
