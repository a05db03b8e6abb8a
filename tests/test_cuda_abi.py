"""The CUDA kernels' ABI is declared once, in the kernel sources: reflex_ipc/cuda/launch.py (each
kernel's argument layout and keyword launcher) is what reflex_ipc/cuda/abi.py reads from them,
the build refuses a stale one, and a launch with a wrong argument name, count or kind fails.
No GPU and no nvcc needed (the C preprocessor reads the sources)."""

import importlib.util
import os
import shutil
import struct

import pytest

from reflex_ipc.cuda import abi, core, launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KDIR = os.path.join(ROOT, "kernels")

needs_cpp = pytest.mark.skipif(abi.find_cpp() is None and not os.environ.get("CI"),
                               reason="no C preprocessor (cc, gcc, clang or cpp)")


@needs_cpp
def test_launchers_are_current_with_the_kernel_sources():
    abi.check()  # AbiError: python -m reflex_ipc.cuda.abi


def _copy_kernels(tmp_path):
    dst = tmp_path / "kernels"
    shutil.copytree(KDIR, dst, ignore=shutil.ignore_patterns("cpu", "*.py", "__pycache__"))
    return dst


@needs_cpp
def test_a_changed_kernel_makes_the_launchers_stale(tmp_path):
    kdir = _copy_kernels(tmp_path)
    src = (kdir / "elementwise.cuh").read_text()
    old = "RX_EXTERN void scale_f32(const float* a, float s, float* y, long long n)"
    assert old in src
    (kdir / "elementwise.cuh").write_text(src.replace(old, old.replace("float s", "double s")))
    ks = abi.kernels(abi.preprocess(str(kdir)))
    assert ks["scale_f32"] == [("a", "Q"), ("s", "d"), ("y", "Q"), ("n", "q")]
    with pytest.raises(abi.AbiError, match="python -m reflex_ipc.cuda.abi"):
        abi.check(kernels_dir=str(kdir))
    # a kernel added by a macro family is read with its expanded name
    (kdir / "elementwise.cuh").write_text(src + "\n#define RX_TWICE(NAME) RX_EXTERN void twice_##NAME(float* y, int n) {}\n"
                                          "RX_TWICE(f32)\n")
    assert abi.kernels(abi.preprocess(str(kdir)))["twice_f32"] == [("y", "Q"), ("n", "i")]


def test_reading_rejects_what_a_launcher_cannot_take():
    ok = 'extern "C" __global__ void __launch_bounds__(32 * (4)) k1(const float* __restrict__ x, unsigned int* c, int n) {}'
    assert abi.kernels(ok) == {"k1": [("x", "Q"), ("c", "Q"), ("n", "i")]}
    for bad in ('extern "C" __global__ void k(float x, short n) {}',  # no layout for short
                'extern "C" __global__ void k(float* grid, int n) {}',  # the launcher's own name
                'extern "C" __global__ void k(float* lambda) {}',  # a Python keyword
                'extern "C" __global__ void k(int n, float* n2, int n) {}',
                "no kernels at all"):
        with pytest.raises(abi.AbiError):
            abi.kernels(bad)


def test_the_build_checks_the_launchers(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("reflex_kernel_build_abi", os.path.join(KDIR, "build.py"))
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    calls = []
    monkeypatch.setattr(build, "find_nvcc", lambda: "/usr/bin/nvcc")
    monkeypatch.setattr(build, "wanted_archs", lambda nvcc: [90])
    monkeypatch.setattr(build, "check_abi", lambda: (_ for _ in ()).throw(SystemExit("kernels: stale")))
    monkeypatch.setattr(build.subprocess, "run", lambda *a, **k: calls.append(a))
    with pytest.raises(SystemExit, match="stale"):
        build.build(str(tmp_path), force=True)
    assert calls == []  # nvcc never ran


def test_every_kernel_has_a_layout_and_launcher():
    assert len(launch.KERNELS) >= 300
    for name, (fmt, factory) in launch.KERNELS.items():
        struct.Struct(fmt)
        assert callable(factory) and name.isidentifier()
    assert core.SIGNATURES == {n: f for n, (f, _) in launch.KERNELS.items()}


class _Func:
    def __init__(self):
        self.calls = []

    def _launch_kernel(self, grid, block, buf, shared, stream):
        self.calls.append((grid, block, bytes(buf), shared, stream))


def test_launchers_check_names_count_and_kinds():
    f = _Func()
    k = core.make_kernel(f, "mm1_q8_0", "s")
    k((1, 1, 1), (128, 1, 1), W=1, X=2, Y=3, K=32, M=4, N=1, rb=34, acc=0, shared=64)
    assert f.calls[0][3:] == (64, "s") and struct.unpack_from("<QQQiii", f.calls[0][2]) == (1, 2, 3, 32, 4, 1)
    with pytest.raises(TypeError):  # positional arguments
        k((1, 1, 1), (128, 1, 1), 1, 2, 3, 32, 4, 1, 34, 0)
    with pytest.raises(TypeError):  # one missing
        k((1, 1, 1), (128, 1, 1), W=1, X=2, Y=3, K=32, M=4, N=1, rb=34)
    with pytest.raises(TypeError):  # an unknown one
        k((1, 1, 1), (128, 1, 1), W=1, X=2, Y=3, K=32, M=4, N=1, rb=34, acc=0, accumulate=1)
    with pytest.raises(struct.error):  # a float for an int
        k((1, 1, 1), (128, 1, 1), W=1, X=2, Y=3, K=32.0, M=4, N=1, rb=34, acc=0)
    with pytest.raises(struct.error):  # a negative pointer
        k((1, 1, 1), (128, 1, 1), W=-1, X=2, Y=3, K=32, M=4, N=1, rb=34, acc=0)
    with pytest.raises(struct.error):  # an object for a pointer
        k((1, 1, 1), (128, 1, 1), W=object(), X=2, Y=3, K=32, M=4, N=1, rb=34, acc=0)
    assert len(f.calls) == 1
    with pytest.raises(KeyError):
        core.make_kernel(f, "no_such_kernel", None)


def test_profiled_launches_keep_the_keyword_launchers():
    from reflex_ipc.cuda import profile

    f = _Func()
    k = core.make_kernel(f, "argmax_f32", None, launch=profile.timed_launch("argmax_f32", f._launch_kernel))
    k((1, 1, 1), (1024, 1, 1), x=8, n=3, out=16)
    assert len(f.calls) == 1
    with pytest.raises(TypeError):
        k((1, 1, 1), (1024, 1, 1), x=8, n=3)


def test_a_wide_kernel_takes_its_leading_parameters_through_head():
    f = _Func()
    k = core.make_kernel(f, "attention_split_last_f16kv", None)
    cut = abi.split_point([(p, c) for p, c in zip("x" * 21, launch.KERNELS["attention_split_last_f16kv"][0])])
    assert cut == 10
    head = k.head(q=1, kc=2, vc=3, part_ml=4, part_acc=5, out=6, count=7, pos=8, mask=0, sinks=9)
    k((16, 1, 4), (512, 1, 1), head, Hq=16, Hkv=8, hd=128, ctx=4096, n_kv=4096, scale=0.5, softcap=0.0, causal=1,
      window=0, chunk=256, span=8192)
    buf = f.calls[0][2]
    assert struct.unpack_from("<10Q5i2f4i", buf) == (1, 2, 3, 4, 5, 6, 7, 8, 0, 9, 16, 8, 128, 4096, 4096, 0.5, 0.0,
                                                       1, 0, 256, 8192)
    rest = dict(Hq=16, Hkv=8, hd=128, ctx=4096, n_kv=4096, scale=0.5, softcap=0.0, causal=1, window=0, chunk=256,
                span=8192)
    with pytest.raises(TypeError):  # the head is not optional
        k((1, 1, 1), (1, 1, 1), **rest)
    with pytest.raises(TypeError):  # nor something else in its place
        k((1, 1, 1), (1, 1, 1), (1, 2, 3), **rest)
    with pytest.raises(TypeError):  # a head parameter by name in the launch
        k((1, 1, 1), (1, 1, 1), head, q=1, **rest)
    with pytest.raises(TypeError):
        k.head(q=1, kc=2, vc=3, part_ml=4, part_acc=5, out=6, count=7, pos=8, mask=0)  # sinks missing
    assert len(f.calls) == 1


def test_backend_launches_stay_on_cpythons_fast_call_path():
    """No call in cuda_ops.py passes more arguments than CPython puts on the stack (positional
    + 2 * keyword <= 30; beyond, it builds a dict per call: abi.MAX_KW)."""
    import ast

    for rel in (os.path.join("reflex_ipc", "backends", "cuda_ops.py"),):
        tree = ast.parse(open(os.path.join(ROOT, rel)).read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and not any(isinstance(a, ast.Starred) for a in node.args) \
                    and all(kw.arg is not None for kw in node.keywords):
                assert len(node.args) + 2 * len(node.keywords) <= 30, f"{rel}:{node.lineno}"
