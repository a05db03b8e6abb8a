"""The cpu library's C ABI is declared once (reflex_ipc/backends/cpu_abi.py): the generated
header and launchers are current, the build rejects a definition that strays from the table,
and the launchers refuse a wrong argument name, count or kind."""

import ctypes
import importlib.util
import os
import subprocess

import numpy as np
import pytest

from reflex_ipc.backends import cpu_abi, cpu_launch, cpu_ops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPU_DIR = os.path.join(ROOT, "kernels", "cpu")


def _cpu_build():
    spec = importlib.util.spec_from_file_location("reflex_cpu_build_abi", os.path.join(CPU_DIR, "build.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_generated_files_are_current():
    for rel, text in cpu_abi.outputs().items():
        with open(os.path.join(ROOT, rel)) as fh:
            assert fh.read() == text, f"{rel} is stale: run python3 kernels/cpu/build.py"


def test_table_is_checked(monkeypatch):
    cpu_abi.check()
    bad = {
        "rx_twin": (1, "void", "int64_t n"),  # replay code 1 is rx_matmul's
        "rx_wide": (99, "void", ", ".join(f"int64_t a{i}" for i in range(cpu_abi.CMD_WIDTH))),
        "rx_odd": (0, "void", "size_t n"),
        "rx_status": (98, "float", "int64_t n"),
        "rx_same": (0, "void", "int64_t n, float *n"),
    }
    for name, entry in bad.items():
        monkeypatch.setitem(cpu_abi.FUNCTIONS, name, entry)
        with pytest.raises(ValueError):
            cpu_abi.check()
        monkeypatch.delitem(cpu_abi.FUNCTIONS, name)
    assert cpu_abi.params("rx_copy") == [("const void *", "src", "ptr"), ("void *", "dst", "ptr"),
                                         ("int64_t", "bytes", "int64_t")]


def test_generated_launchers_follow_the_table():
    assert cpu_launch.ABI_VERSION == cpu_abi.abi_version()
    assert set(cpu_launch.SIGNATURES) == set(cpu_abi.FUNCTIONS)
    for name, (code, _, _) in cpu_abi.FUNCTIONS.items():
        fn = getattr(cpu_launch.Launchers, name)
        names = [p[1] for p in cpu_abi.params(name)]
        assert fn.__code__.co_kwonlyargcount == len(names) and fn.__code__.co_argcount == 1
        assert list(fn.__code__.co_varnames[1:1 + len(names)]) == names
        if code:
            assert cpu_launch.OPS[code] == name
    assert set(cpu_launch.OPS) == {c for c, _, _ in cpu_abi.FUNCTIONS.values() if c}


def _compile_ops(tmp_path, edit):
    """Compile an edited copy of ops.c with the build's flags: (returncode, stderr)."""
    build = _cpu_build()
    src = open(os.path.join(CPU_DIR, "ops.c")).read()
    (tmp_path / "ops.c").write_text(edit(src))
    for h in sorted(f for f in os.listdir(CPU_DIR) if f.endswith(".h")):  # all ops.c includes
        (tmp_path / h).write_text(open(os.path.join(CPU_DIR, h)).read())
    flags = next(f for s, f, _ in build.units() if s == "ops.c")
    cc = build.find_cc()
    if cc is None:
        pytest.skip("no C compiler")
    cflags = [f for f in build.CFLAGS if f != "-O3"] + ["-O0"]
    r = subprocess.run([*cc.split(), *cflags, *flags, "-c", str(tmp_path / "ops.c"), "-o", str(tmp_path / "ops.o")],
                       capture_output=True, text=True)
    return r.returncode, r.stderr


def test_build_rejects_a_definition_off_the_table(tmp_path):
    assert _compile_ops(tmp_path, lambda s: s)[0] == 0
    # a parameter of another type than the table's
    rc, err = _compile_ops(tmp_path, lambda s: s.replace(
        "RX_EXPORT void rx_copy(const void *src, void *dst, int64_t bytes)",
        "RX_EXPORT void rx_copy(const void *src, void *dst, int bytes)"))
    assert rc != 0 and "rx_copy" in err
    # an exported function the table lacks
    rc, err = _compile_ops(tmp_path, lambda s: s + "\nRX_EXPORT int rx_extra(void) { return 0; }\n")
    assert rc != 0 and "rx_extra" in err


def test_library_reports_the_table_version():
    lib = cpu_ops.load_library()
    assert lib is not None, cpu_ops._lib_error
    assert lib.rx_abi_version() == cpu_launch.ABI_VERSION


def test_a_library_of_another_table_is_refused(monkeypatch):
    monkeypatch.setattr(cpu_ops, "_lib", None)
    monkeypatch.setattr(cpu_ops, "_lib_error", None)
    monkeypatch.setattr(cpu_ops, "ABI_VERSION", cpu_launch.ABI_VERSION ^ 1)
    assert cpu_ops.load_library() is None
    assert "rebuild the kernels" in cpu_ops._lib_error


def test_launchers_check_names_count_and_kinds():
    ops = cpu_ops.CpuOps(threads=1)
    a = np.arange(4, dtype=np.float32)
    out = np.empty(4, np.float32)
    ops.rx_binary(op=0, a=a.ctypes.data, b=a.ctypes.data, out=out.ctypes.data, n=4, nb=4)
    np.testing.assert_array_equal(out, 2 * a)
    with pytest.raises(TypeError):  # positional
        ops.rx_binary(0, a.ctypes.data, a.ctypes.data, out.ctypes.data, 4, 4)
    with pytest.raises(TypeError):  # a missing argument
        ops.rx_binary(op=0, a=a.ctypes.data, b=a.ctypes.data, out=out.ctypes.data, n=4)
    with pytest.raises(TypeError):  # an unknown one
        ops.rx_binary(op=0, a=a.ctypes.data, b=a.ctypes.data, out=out.ctypes.data, n=4, nb=4, m=1)
    with pytest.raises(ctypes.ArgumentError):  # a float for an int64_t
        ops.rx_binary(op=0, a=a.ctypes.data, b=a.ctypes.data, out=out.ctypes.data, n=4.0, nb=4)
    with pytest.raises(ctypes.ArgumentError):  # an array for a pointer
        ops.rx_binary(op=0, a=a, b=a.ctypes.data, out=out.ctypes.data, n=4, nb=4)


def test_recording_encodes_arguments_by_their_declared_type():
    ops = cpu_ops.CpuOps(threads=1)
    a = np.arange(4, dtype=np.float32) - 1.5
    graph, y = ops.capture(lambda: ops.scale(a, 2))  # p: a float parameter given an int
    assert isinstance(graph, cpu_ops.Graph) and graph.n == 1
    cmd = graph.cmds[0]
    assert cmd[0] == cpu_launch.UNARY and cpu_launch.FLOAT_ARGS[cpu_launch.UNARY] == (6,)
    assert cmd[6] == np.array([2.0]).view(np.int64)[0]
    a += 1
    graph.launch()
    np.testing.assert_array_equal(y, 2 * a)
