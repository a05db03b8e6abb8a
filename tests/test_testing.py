"""The test infrastructure itself: the synthetic-GGUF writer reproduces the committed
fixtures byte for byte, and the layout rules hold (the runtime never imports
reflex_ipc.testing; tests, bench and scripts share code only through it)."""

import ast
import filecmp
import pathlib

import pytest

from reflex_ipc.testing import synthetic

ROOT = pathlib.Path(__file__).resolve().parent.parent
PKG = ROOT / "reflex_ipc"


def _imports(path):
    """Every module name imported by the Python file at path (relative ones resolved)."""
    tree = ast.parse(path.read_text(), str(path))
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = parts[:len(parts) - node.level]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out += [mod] + [f"{mod}.{a.name}" for a in node.names]
    return out


def _edits_sys_path(path):
    """Whether the file calls sys.path.insert/append/extend."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        f = getattr(node, "func", None)
        if (isinstance(node, ast.Call) and isinstance(f, ast.Attribute) and f.attr in ("insert", "append", "extend")
                and isinstance(f.value, ast.Attribute) and f.value.attr == "path"
                and isinstance(f.value.value, ast.Name) and f.value.value.id == "sys"):
            return True
    return False


def test_parity_fixtures_regenerate_byte_identical(tmp_path, smollm2):
    """make_gguf.py parity writes tests/data/synthetic-*.gguf exactly as committed."""
    vocab = synthetic.default_vocab_paths()
    assert vocab["gpt2"] == smollm2
    for arch in sorted(synthetic.PARITY_MODELS):
        out = synthetic.parity_model(arch, str(tmp_path / f"synthetic-{arch}.gguf"), vocab_paths=vocab)
        assert filecmp.cmp(out, ROOT / "tests" / "data" / f"synthetic-{arch}.gguf", shallow=False), arch


def test_runtime_never_imports_the_testing_package():
    offenders = [str(p.relative_to(ROOT)) for p in PKG.rglob("*.py")
                 if "testing" not in p.relative_to(PKG).parts[:1]
                 and any(m.startswith("reflex_ipc.testing") for m in _imports(p))]
    assert offenders == []


@pytest.mark.parametrize("folder", ["tests", "bench", "scripts"])
def test_no_path_hacks_or_cross_imports(folder):
    """Tests import neither each other (nor a conftest: tests/ and tests/arch/ each have one,
    both imported as `conftest`, so which one answers depends on collection order) nor
    scripts/, bench/ does not import tests/; tests
    and the fixture/GPU scripts do not edit sys.path (reflex_ipc is imported as installed or
    from PYTHONPATH; only the GPU harness gpu-check, not a .py file, puts its checkout first)."""
    tests = {p.stem for p in (ROOT / "tests").glob("*.py")}
    scripts = {p.stem for p in (ROOT / "scripts").rglob("*.py")}
    bad = []
    for p in (ROOT / folder).rglob("*.py"):
        if folder != "bench" and _edits_sys_path(p):
            bad.append(f"{p.relative_to(ROOT)}: edits sys.path")
        for m in _imports(p):
            top = m.split(".")[0]
            if top in tests | {"sdist"}:
                bad.append(f"{p.relative_to(ROOT)}: imports {m}")
            if folder != "scripts" and top in scripts:
                bad.append(f"{p.relative_to(ROOT)}: imports {m} from scripts/")
    assert bad == []
