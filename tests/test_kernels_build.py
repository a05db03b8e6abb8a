"""The CUDA kernels compile with nvcc, build.py behaves, the fatbin holds the expected
images, and the CUDA backend's host-side code (argument packing, arrays, the fatbin
reader) is right. Everything here runs without a GPU; the kernels' numerics are
checked on a GPU host by scripts/gpu/gpu-check."""

import importlib.util
import json
import os
import re
import struct
import subprocess
import sys

import pytest

from reflex_ipc import settings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KDIR = os.path.join(ROOT, "kernels")


def load_build():
    spec = importlib.util.spec_from_file_location("reflex_kernel_build_test", os.path.join(KDIR, "build.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


build = load_build()
NVCC = build.find_nvcc()
needs_nvcc = pytest.mark.skipif(NVCC is None and not settings.get().require_nvcc,
                                reason="nvcc not installed (set REFLEX_REQUIRE_NVCC=1 to make this fail)")

from reflex_ipc.cuda import fatbin  # noqa: E402
from reflex_ipc.cuda.arrays import DeviceArray  # noqa: E402
from reflex_ipc.cuda.core import IQ_TYPES, MM_TYPES, SIGNATURES, Pool, make_kernel  # noqa: E402
from reflex_ipc.cuda.launch import MODULE_OF  # noqa: E402
from reflex_ipc.testing.fake_cuda import FakeArena, RecordingRuntime  # noqa: E402


# -- build.py ---------------------------------------------------------------------------
# The real units take minutes of nvcc a target on 2 cores (~85 CPU-s for sm_90 alone), so the
# tests split what the old two-target build of them proved: build.py's two-target build
# (SASS for each listed arch, PTX of the highest, one fatbin per unit, build.json, the
# up-to-date rule) on two tiny test-only units, tests/cuda/*.cu (seconds); the real units
# through nvcc's front end for the lowest and the highest base target, unoptimized
# (-Xcicc -O0: every kernel parses, instantiates and lowers to PTX for both sides of any
# __CUDA_ARCH__ branch, with the PTX parameter lists the signature test reads, identical
# to the optimized ones), ~25 CPU-s. The optimized build of the real units for every target
# (ptxas included) is `make wheel`'s in CI (REFLEX_BUILD_CUDA=1 where nvcc is present) and
# any `python kernels/build.py`.
TINY = tuple((os.path.join(ROOT, "tests", "cuda", unit), unit[:-3] + ".fatbin")
             for unit in ("tiny_main.cu", "tiny_other.cu"))
TINY_KERNELS = {"tiny_main.fatbin": "tiny_add_f32", "tiny_other.fatbin": "tiny_scale_f32"}
PTX_ARCHS = (build.BASE_ARCHS[0], build.BASE_ARCHS[-1])  # 75, 90


@pytest.fixture(scope="session")
def real_units_ptx(shared_dir):
    """The PTX of each real unit (kernels/all.cu, iq_all.cu) for sm_75 and sm_90, unoptimized:
    <unit>.compute_<arch>.ptx, as build.py's keep_dir names it (once per session, shared by
    the xdist workers; the two units of a target compile at once)."""
    def fill(d):
        build.check_abi()  # build.py's own first step
        for arch in PTX_ARCHS:
            procs = [(unit, subprocess.Popen(
                [NVCC, "--ptx", *build.FLAGS, f"-arch=compute_{arch}", "-Xcicc", "-O0",
                 "-o", str(d / f"{unit[:-3]}.compute_{arch}.ptx"), os.path.join(KDIR, unit)],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)) for unit, _ in build.UNITS]
            for unit, p in procs:
                out = p.communicate()[0]
                assert p.returncode == 0, f"nvcc {unit} for compute_{arch}:\n{out[-6000:]}"

    return shared_dir("cuda-real-ptx", fill)


@needs_nvcc
def test_build_two_archs_has_sass_and_ptx(tmp_path, monkeypatch):
    """build.build for sm_90 and sm_75 (+ PTX 90), on the two tiny units: each fatbin holds
    exactly those images and only its own unit's kernel; build.json says what was built; a
    second build finds it up to date; the keep folder has each unit's PTX."""
    import shutil

    d = tmp_path / "out"
    units = []
    for src, fat in TINY:  # copies: the test touches their times
        shutil.copy(src, tmp_path)
        units.append((str(tmp_path / os.path.basename(src)), fat))
    monkeypatch.setenv("REFLEX_CUDA_ARCHS", "90,75")
    out = build.build(str(d), keep_dir=str(d / "keep"), units=units)
    assert out == str(d / "tiny_main.fatbin") and os.path.exists(out)
    info = json.load(open(d / "build.json"))
    assert info["built"] is True and info["archs"] == [75, 90] and info["ptx"] == 90
    assert info["fatbins"] == [fat for _, fat in TINY]
    for _, fat in TINY:
        imgs = fatbin.read_images(str(d / fat))
        assert sorted((i["kind"], i["arch"]) for i in imgs) == [("ptx", 90), ("sm", 75), ("sm", 90)]
        data = open(d / fat, "rb").read()
        for home, name in TINY_KERNELS.items():
            assert (name.encode() + b"\0" in data) == (fat == home), (name, fat)
    for unit, _ in TINY:
        assert (d / "keep" / (os.path.basename(unit)[:-3] + ".compute_90.ptx")).exists()
    # up to date: a second build does not run nvcc
    monkeypatch.setattr(build.subprocess, "run", lambda *a, **k: (_ for _ in ()).throw(AssertionError("ran")))
    assert build.build(str(d), units=units) == out
    # a changed unit (newer than the fatbins) is built again
    t = os.path.getmtime(out) + 10
    os.utime(units[1][0], (t, t))
    with pytest.raises(AssertionError, match="ran"):
        build.build(str(d), units=units)


@needs_nvcc
def test_real_units_compile_with_the_signatures(real_units_ptx):
    """Each packing format in SIGNATURES has the kernel's parameter types in order: the
    PTX of the translation units lists them (.u64 pointers, .u32/.s32 ints, .f32), for the
    lowest and the highest base target alike. Each kernel is in the unit launch.MODULE_OF says,
    and in one unit only."""
    code = {"u64": "Q", "b64": "Q", "s64": "q", "u32": "i", "s32": "i", "b32": "i", "f32": "f"}
    for arch in PTX_ARCHS:
        entries = {}
        for unit, fat in build.UNITS:
            text = (real_units_ptx / f"{unit[:-3]}.compute_{arch}.ptx").read_text()
            found = dict(re.findall(r"\.visible \.entry (\w+)\(([^)]*)\)", text))
            assert not set(found) & set(entries), "a kernel in two fatbins"
            assert all(MODULE_OF.get(k, build.FATBIN) == fat for k in found), unit
            entries.update(found)
        assert set(entries) == set(SIGNATURES), (arch, set(entries) ^ set(SIGNATURES))
        for name, params in entries.items():
            kinds = re.findall(r"\.param \.(\w+)", params)
            got = "".join(code[k] for k in kinds)
            want = SIGNATURES[name].replace("q", "Q")  # both are 8-byte integers
            assert got.replace("q", "Q") == want, (arch, name, got, SIGNATURES[name])


def test_default_archs_cover_the_issue_list():
    archs = build.supported_archs(NVCC) if NVCC else build.BASE_ARCHS
    for a in (75, 80, 86, 89, 90):
        assert a in archs
    cmd = build.nvcc_command("nvcc", archs, "x.fatbin")
    for a in archs:
        assert f"-gencode=arch=compute_{a},code=sm_{a}" in cmd
    assert f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}" in cmd
    assert "--use_fast_math" not in cmd  # parity with the CPU backend over speed


def test_archs_env(monkeypatch):
    monkeypatch.setenv("REFLEX_CUDA_ARCHS", "sm_86; 80 ,90")
    assert build.wanted_archs("nvcc") == [80, 86, 90]
    monkeypatch.setenv("REFLEX_CUDA_ARCHS", "ninety")
    with pytest.raises(SystemExit):
        build.wanted_archs("nvcc")


def test_no_nvcc_installs_without_kernels(tmp_path, monkeypatch, capsys):
    for _, fat in build.UNITS:
        (tmp_path / fat).write_bytes(b"stale")
    monkeypatch.setattr(build, "find_nvcc", lambda: None)
    assert build.build(str(tmp_path)) is None
    assert "nvcc not found" in capsys.readouterr().err
    assert not any((tmp_path / fat).exists() for _, fat in build.UNITS)
    info = json.load(open(tmp_path / "build.json"))
    assert info["built"] is False and "nvcc" in info["reason"]


# -- setup.py's rule: build the kernels only when something will use them ----------------
def _fake_build(calls):
    def fake(out_dir, force=False, why=""):
        calls.append(why)
        path = os.path.join(out_dir, build.FATBIN)
        open(path, "wb").write(b"fatbin")
        open(os.path.join(out_dir, build.BUILD_JSON), "w").write(json.dumps({"built": True}))
        return path
    return fake


def test_rule_builds_when_asked_or_when_a_driver_is_present(tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(build, "build", _fake_build(calls))
    monkeypatch.setattr(build, "find_nvcc", lambda: "/usr/bin/nvcc")
    monkeypatch.setattr(build, "driver_present", lambda: False)
    monkeypatch.delenv("REFLEX_BUILD_CUDA", raising=False)
    assert build.build_if_wanted(str(tmp_path / "a")) is None  # nvcc, no driver: not built
    info = json.load(open(tmp_path / "a" / "build.json"))
    assert info["built"] is False and "REFLEX_BUILD_CUDA=1" in info["reason"]
    assert "not building the CUDA fatbin (no NVIDIA driver" in capsys.readouterr().err
    monkeypatch.setattr(build, "driver_present", lambda: True)
    assert build.build_if_wanted(str(tmp_path / "b"))  # nvcc and a driver
    monkeypatch.setattr(build, "driver_present", lambda: False)
    monkeypatch.setenv("REFLEX_BUILD_CUDA", "1")
    assert build.build_if_wanted(str(tmp_path / "c"))  # asked (a wheel for other machines)
    assert calls == ["nvcc and an NVIDIA driver are present", "REFLEX_BUILD_CUDA=1"]
    monkeypatch.setattr(build, "find_nvcc", lambda: None)
    with pytest.raises(SystemExit, match="nvcc was not found"):  # asked, but no nvcc
        build.build_if_wanted(str(tmp_path / "d"))
    monkeypatch.setenv("REFLEX_BUILD_CUDA", "maybe")
    with pytest.raises(SystemExit, match="expected 1 or 0"):
        build.build_if_wanted(str(tmp_path / "e"))


def test_rule_keeps_a_current_fatbin_and_drops_a_stale_one(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("REFLEX_BUILD_CUDA", "0")
    fats = [tmp_path / f for _, f in build.UNITS]
    fat, iq = fats
    (tmp_path / "build.json").write_text(json.dumps({"built": True}))
    newest = max(os.path.getmtime(os.path.join(KDIR, s)) for s in build.sources())
    for f in fats:
        f.write_bytes(b"fatbin")
        os.utime(f, (newest + 10, newest + 10))
    assert build.build_if_wanted(str(tmp_path)) == str(fat)  # built earlier, still current
    assert "keeping the current one" in capsys.readouterr().err
    os.utime(iq, (newest - 10, newest - 10))  # a kernel source changed since the IQ fatbin was built
    assert build.build_if_wanted(str(tmp_path)) is None and not any(f.exists() for f in fats)
    assert json.load(open(tmp_path / "build.json"))["built"] is False


def test_backend_reports_missing_kernels(tmp_path, monkeypatch):
    import reflex_ipc.cuda as cuda

    monkeypatch.setattr(cuda, "BUILD_JSON", str(tmp_path / "build.json"))
    monkeypatch.setattr(cuda, "FATBIN_PATH", str(tmp_path / "none.fatbin"))
    (tmp_path / "build.json").write_text(json.dumps({"built": False, "reason": "nvcc was not found"}))
    msg = cuda.kernels_missing_reason()
    assert msg.startswith("CUDA kernels were not built") and "nvcc was not found" in msg


# -- the fatbin reader ---------------------------------------------------------------------
def _fake_fatbin(entries):
    body = b""
    for kind, arch, payload in entries:
        hdr = struct.pack("<HHIQ", kind, 0x101, 64, len(payload)) + b"\0" * 12
        hdr += struct.pack("<I", arch) + b"\0" * 8 + struct.pack("<Q", 0x11) + b"\0" * 16
        assert len(hdr) == 64
        body += hdr + payload
    return struct.pack("<IHHQ", fatbin.MAGIC, 1, 16, len(body)) + body


def test_fatbin_images_and_choice():
    data = _fake_fatbin([(2, 80, b"a" * 8), (2, 90, b"b" * 16), (1, 90, b"p" * 4)])
    imgs = fatbin.images(data)
    assert [(i["kind"], i["arch"], i["bytes"]) for i in imgs] == [("sm", 80, 8), ("sm", 90, 16), ("ptx", 90, 4)]
    assert fatbin.chosen_image(imgs, (9, 0)) == "sm_90"
    assert fatbin.chosen_image(imgs, (8, 6)) == "sm_80"  # same major, lower minor runs
    assert fatbin.chosen_image(imgs, (10, 0)).startswith("compute_90")  # only PTX fits: JIT
    assert fatbin.chosen_image(imgs, (7, 5)).startswith("none")
    with pytest.raises(fatbin.FatbinError):
        fatbin.images(b"\0" * 32)
    with pytest.raises(fatbin.FatbinError):
        fatbin.images(data[:-3])


def test_package_fatbin_matches_build_json():
    import reflex_ipc.cuda as cuda

    info = cuda.build_info()
    if not info.get("built"):
        # installed without kernels (setup.py's rule, e.g. no NVIDIA driver): then there is
        # no fatbin, and build.json says why (the CUDA backend quotes it)
        assert not os.path.exists(cuda.FATBIN_PATH)
        assert info.get("reason") and cuda.kernels_missing_reason().endswith(")")
        return
    imgs = fatbin.read_images(cuda.FATBIN_PATH)
    assert sorted(i["arch"] for i in imgs if i["kind"] == "sm") == sorted(info["archs"])
    assert [i["arch"] for i in imgs if i["kind"] == "ptx"] == [info["ptx"]]


# -- host-side backend code --------------------------------------------------------------
class FakeFunc:
    def __init__(self):
        self.calls = []

    def _launch_kernel(self, grid, block, buf, shared, stream):
        self.calls.append((grid, block, bytes(buf), shared, stream))


def test_kernel_packs_arguments_in_c_layout():
    f = FakeFunc()
    k = make_kernel(f, "mm1_q8_0", "stream")
    k((3, 2, 1), (128, 1, 1), W=0x1000, X=0x2000, Y=0x3000, K=512, M=203, N=7, rb=34 * 16, acc=1)
    grid, block, buf, shared, stream = f.calls[0]
    assert (grid, block, shared, stream) == ((3, 2, 1), (128, 1, 1), 0, "stream")
    # C layout: three pointers, three ints, pad to 8, a long long, an int (then tail padding)
    assert struct.unpack_from("<QQQiii", buf, 0) == (0x1000, 0x2000, 0x3000, 512, 203, 7)
    assert struct.unpack_from("<q", buf, 40)[0] == 34 * 16
    assert struct.unpack_from("<i", buf, 48)[0] == 1
    k2 = make_kernel(f, "scale_f32", None)
    k2((1, 1, 1), (256, 1, 1), a=0xA0, s=0.5, y=0xB0, n=1 << 40)
    buf = f.calls[1][2]
    assert struct.unpack_from("<Qf", buf, 0) == (0xA0, 0.5)
    assert struct.unpack_from("<Qq", buf, 16) == (0xB0, 1 << 40)  # pointer realigned to 16


def test_build_units_are_the_abi_units():
    from reflex_ipc.cuda import abi

    assert build.UNITS == abi.UNITS


def test_every_matmul_type_has_kernels():
    for t in MM_TYPES + IQ_TYPES:
        for nt in (1, 4, 8):
            assert f"mm{nt}_{t}" in SIGNATURES
        assert f"get_rows_{t}" in SIGNATURES


class FakeDrv:
    class MemoryError(Exception):
        pass

    def __init__(self):
        self.next = 1 << 20
        self.allocs = 0

    def mem_alloc(self, n):
        self.allocs += 1
        p = self.next
        self.next += n
        return p


def test_pool_reuses_freed_blocks_and_arrays_view():
    drv = FakeDrv()
    pool = Pool(drv)
    assert [Pool.size_class(n) for n in (1, 256, 300, 700, 1025, 5000)] == [256, 256, 512, 768, 1536, 6144]
    a = DeviceArray.empty(pool, (4, 10))
    p = a.ptr
    assert a.nbytes == 160 and a.size == 40 and a.ndim == 2
    v = a.reshape(2, -1)
    assert v.shape == (2, 20) and v.ptr == p
    row = a[2]
    assert row.shape == (10,) and row.ptr == p + 2 * 40
    sl = a[1:3]
    assert sl.shape == (2, 10) and sl.ptr == p + 40
    with pytest.raises(ValueError):
        a.reshape(3, 3)
    with pytest.raises(IndexError):
        a[::2]
    del a, v, row, sl  # last view gone: the block returns to the pool
    b = DeviceArray.empty(pool, (40,))
    assert b.ptr == p and drv.allocs == 1
    c = DeviceArray.empty(pool, (3,), "int32")
    assert c.ptr != p and drv.allocs == 2


def test_smoke_and_doctor_report_without_cuda():
    env = dict(os.environ, PYTHONPATH=ROOT)
    for cmd in (["smoke", "--json"], ["doctor", "--json"]):
        p = subprocess.run([sys.executable, "-m", "reflex_ipc", *cmd], capture_output=True, text=True,
                           env=env, cwd=ROOT, timeout=120)
        rep = json.loads(p.stdout.strip().splitlines()[-1])
        if importlib.util.find_spec("pycuda") is not None:
            continue  # a GPU machine: scripts/gpu/gpu-check covers it
        text = json.dumps(rep)
        assert "CUDA" in text or "pycuda" in text
        if cmd[0] == "smoke":  # nothing to test without CUDA: exit 3, not a failure
            assert p.returncode == 3 and rep["ok"] is False and rep["cuda_available"] is False
        else:  # doctor: the CPU path decides (numpy, the default model)
            from reflex_ipc.backends import cpu_ops

            assert rep["cuda"]["ok"] is False
            assert rep["auto_backend"] == ("cpu" if cpu_ops.available()[0] else "numpy")
            assert p.returncode == (0 if rep["cpu"]["ok"] else 1) and rep["ok"] is rep["cpu"]["ok"]


# -- cuda_ops launch logic with a recording fake runtime (no GPU: testing/fake_cuda.py) --------
@pytest.fixture
def fake_ops(monkeypatch):
    from reflex_ipc.backends import cuda_ops

    monkeypatch.setattr(cuda_ops, "WeightArena", FakeArena)
    ops = cuda_ops.CudaOps.__new__(cuda_ops.CudaOps)
    rt = RecordingRuntime()
    ops.rt, ops.pool, ops.k = rt, rt.pool, rt.kernel
    ops._arenas, ops._extra_weights, ops._graph = {}, [], None
    ops._att_count = None
    ops.mma = True  # as on sm_80+ with REFLEX_MMA unset
    ops.mmnt = False  # the warp-per-row mm4 / mm8 kernels for 2..63 tokens (test_cuda_ops_mmt_*: on)
    ops.flash = True  # as on sm_80+ with REFLEX_FLASH unset
    # the plain kernels (REFLEX_FUSE=0: the path before the fused decode ops); the fused
    # launches are the *_fused tests'
    monkeypatch.setenv("REFLEX_FUSE", "0")
    return ops


def test_cuda_ops_matmul_and_embed_launches(fake_ops):
    from reflex_ipc.cuda.arrays import DeviceArray, DeviceWeight

    ops = fake_ops
    w = DeviceWeight(0x5000, (203, 512), 8, "Q8_0", 16 * 34, "w")
    for n, kern, gy in ((1, "mm1_q8_0", 1), (3, "mm4_q8_0", 1), (4, "mm4_q8_0", 1), (13, "mm8_q8_0", 2)):
        x = DeviceArray.empty(ops.pool, (n, 512))
        y = ops.matmul(x, w)
        name, grid, block, args = ops.rt.launches[-1]
        assert (name, grid, block) == (kern, (51, gy, 1), (128, 1, 1))
        assert y.shape == (n, 203) and args[:3] == (0x5000, x.ptr, y.ptr) and args[3:] == (512, 203, n, 544, 0)
    with pytest.raises(ValueError):
        ops.matmul(DeviceArray.empty(ops.pool, (1, 256)), w)
    with pytest.raises(ValueError):
        ops.matmul(DeviceArray.empty(ops.pool, (1, 512)), w, accumulate=True)
    ids = DeviceArray.empty(ops.pool, (5,), "int32")
    e = ops.embed(w, ids, scale=2.0)
    name, grid, block, args = ops.rt.launches[-1]
    assert name == "get_rows_q8_0" and grid == (1, 5, 1) and e.shape == (5, 512) and args[-1] == 2.0


def test_cuda_ops_attention_paths(fake_ops):
    ops = fake_ops
    kc, vc = ops.zeros((2, 4096, 128), "float16"), ops.zeros((2, 4096, 128), "float16")
    assert ops.rt.memsets[-1] == (vc.ptr, 0, vc.nbytes)
    pos = ops.positions([1000])
    assert ops.rt.copies[-1][0] == pos.ptr and ops.rt.copies[-1][1].tolist() == [1000]
    assert ops.rt.copies[-1][1].dtype.name == "int32" and pos.dtype == "int32"
    q = ops.empty((1, 8, 128))
    # decode over a long cache: split-K blocks and a combine; causal calls pass n_slots (graph-safe)
    ops.attention(q, kc, vc, pos, 1001, scale=0.1)
    (n1, g1, b1, a1), (n2, g2, _, a2) = ops.rt.launches[-2:]
    assert n1 == "attention_split_f16kv" and n2 == "attention_combine"
    S = g1[2]
    chunk = a1[-2]  # then span (chunked attention's chunk: 0)
    assert S * chunk >= 4096 and a1[11] == 4096 and g2 == (8, 1, 1) and a2[-1] == S and a1[-1] == 0
    assert a1[1] == kc.ptr and a1[2] == vc.ptr
    # prefill: the tensor-core kernel, a block per kv head and 64 rows of its 4 query heads
    qq = ops.empty((64, 8, 128))
    n0 = ops.flash_launches
    out = ops.attention(qq, kc, vc, ops.positions(range(64)), 64, scale=0.1, window=7)
    name, grid, block, args = ops.rt.launches[-1]
    assert name == "flash_attention_f16kv_128" and grid == (2, 4, 1) and block == (128, 1, 1)
    assert args[:6] == (qq.ptr, kc.ptr, vc.ptr, out.ptr, 0, 0) and args[7] == 0 and args[8] == 0  # mask, sinks
    assert args[9:14] == (64, 8, 2, 4096, 4096) and args[15:18] == (0.0, 1, 7) and ops.flash_launches == n0 + 1
    # odd sizes round the row tiles up: 17 queries x 4 heads = 68 rows -> 2 tiles
    ops.attention(ops.empty((17, 8, 128)), kc, vc, ops.positions(range(17)), 17, scale=0.1)
    assert ops.rt.launches[-1][:2] == ("flash_attention_f16kv_128", (2, 2, 1))
    # an explicit mask keeps the true n_kv (the mask's row length)
    m = ops.empty((64, 64))
    ops.attention(qq, kc, vc, ops.positions(range(64)), 64, scale=0.1, causal=False, mask=m)
    name, _, _, args = ops.rt.launches[-1]
    assert name == "flash_attention_f16kv_128" and args[7] == m.ptr and args[13] == 64 and args[16] == 0
    # few row tiles over many keys: the keys split over grid z (shares of a multiple of 64),
    # attention_combine merges the partials
    q20 = ops.empty((20, 8, 128))
    out = ops.attention(q20, kc, vc, ops.positions(range(3000, 3020)), 3020, scale=0.1)
    (n1, g1, _, a1), (n2, g2, b2, a2) = ops.rt.launches[-2:]
    S, chunk = g1[2], a1[-2]
    assert n1 == "flash_attention_f16kv_128" and g1[:2] == (2, 2) and S > 1 and ops.flash_last_splits == S
    assert chunk % 64 == 0 and (S - 1) * chunk < 3020 <= S * chunk and a1[4] and a1[5] and a1[13] == 4096
    assert n2 == "attention_combine" and g2 == (8, 20, 1) and b2 == (128, 1, 1)
    assert a2 == (a1[4], a1[5], out.ptr, 0, 8, 128, S)  # no sinks
    assert a1[-1] == 0  # span: no chunked attention (the keys' cover is not the chunk)
    ops.attention(q20, kc, vc, ops.positions(range(3000, 3020)), 3020, scale=0.1, chunk=512)
    assert ops.rt.launches[-2][0] == "flash_attention_f16kv_128" and ops.rt.launches[-2][3][-1] == 512
    # while capturing a graph, the split covers every slot (replays see later positions)
    ops._graph = type("G", (), {"pool": ops.pool})()
    try:
        ops.attention(q20, kc, vc, ops.positions(range(3000, 3020)), 3020, scale=0.1)
    finally:
        ops._graph = None
    g1, a1 = ops.rt.launches[-2][1], ops.rt.launches[-2][3]
    assert (g1[2] - 1) * a1[-2] < 4096 <= g1[2] * a1[-2]
    # many row tiles, or few keys: one pass
    ops.attention(q20, kc, vc, ops.positions(range(20)), 20, scale=0.1)
    assert ops.rt.launches[-1][0] == "flash_attention_f16kv_128" and ops.rt.launches[-1][1][2] == 1
    # below FLASH_MIN_N queries, at other head widths, or with REFLEX_FLASH=0 (ops.flash off):
    # a block per (head, query)
    q15 = ops.empty((ops.flash_min_n - 1, 16, 128))
    ops.attention(q15, kc, vc, ops.positions(range(q15.shape[0])), q15.shape[0], scale=0.1)
    assert ops.rt.launches[-1][:2] == ("attention_f16kv", (16, q15.shape[0], 1))
    kc96, vc96 = ops.zeros((2, 512, 96), "float16"), ops.zeros((2, 512, 96), "float16")
    ops.attention(ops.empty((64, 8, 96)), kc96, vc96, ops.positions(range(64)), 64, scale=0.1)
    assert ops.rt.launches[-1][0] == "attention_f16kv"
    ops.flash = False
    ops.attention(qq, kc, vc, ops.positions(range(64)), 64, scale=0.1)
    name, grid, block, args = ops.rt.launches[-1]
    assert name == "attention_f16kv" and grid == (8, 64, 1) and block == (512, 1, 1)
    ops.attention(qq, kc, vc, ops.positions(range(64)), 64, scale=0.1, causal=False, mask=m)
    args = ops.rt.launches[-1][3]
    assert args[5] == m.ptr and args[6] == 0 and args[11] == 64 and args[14] == 0


def test_cuda_ops_load_weight_keeps_blocks(fake_ops, smollm2):
    from reflex_ipc.cuda.arrays import DeviceArray, DeviceWeight
    from reflex_ipc.gguffile import GGUFFile

    ops = fake_ops
    with GGUFFile(smollm2) as f:
        t = f.tensors["blk.0.attn_q.weight"]
        w = ops.load_weight(f, t.name)
        assert isinstance(w, DeviceWeight) and w.shape == (t.shape[1], t.shape[0])
        assert w.type_name == t.type_name and w.row_bytes * w.shape[0] == t.nbytes
        assert w.ptr == (1 << 30) + t.offset - f.data_offset  # inside the one arena: no copy
        norm = ops.load_weight(f, "blk.0.attn_norm.weight")
        assert isinstance(norm, DeviceArray) and norm.shape == (t.shape[0],) and norm.dtype == "float32"
        assert len(ops._arenas) == 1


def test_cuda_ops_matmul_n_launches(fake_ops):
    from reflex_ipc.cuda.arrays import DeviceArray, DeviceWeight

    ops = fake_ops
    wq = DeviceWeight(0x10000, (2048, 1024), 8, "Q8_0", 32 * 34, "q")
    wk = DeviceWeight(0x20000, (1024, 1024), 8, "Q8_0", 32 * 34, "k")
    wv = DeviceWeight(0x30000, (1024, 1024), 8, "Q8_0", 32 * 34, "v")
    for n, kern, gy in ((1, "mmn1_q8_0", 1), (4, "mmn4_q8_0", 1), (13, "mmn8_q8_0", 2)):
        x = DeviceArray.empty(ops.pool, (n, 1024))
        before = len(ops.rt.launches)
        q, k, v = ops.matmul_n(x, [wq, wk, wv])
        assert len(ops.rt.launches) == before + 1  # one kernel for all three
        name, grid, block, args = ops.rt.launches[-1]
        assert (name, grid, block) == (kern, ((2048 + 2048) // 4, gy, 1), (128, 1, 1))
        assert args == (wq.ptr, wk.ptr, wv.ptr, x.ptr, q.ptr, k.ptr, v.ptr, 1024, 2048, 1024, 1024, n, 32 * 34)
        assert (q.shape, k.shape, v.shape) == ((n, 2048), (n, 1024), (n, 1024))
        assert len({q.ptr, k.ptr, v.ptr}) == 3
    # two weights: the third slot is empty
    x = DeviceArray.empty(ops.pool, (1, 1024))
    q, k = ops.matmul_n(x, [wq, wk])
    name, grid, _, args = ops.rt.launches[-1]
    assert name == "mmn1_q8_0" and grid[0] == 3072 // 4 and args[2] == 0 and args[6] == 0 and args[10] == 0
    # a v of another format: q and k in one launch, v a plain matmul
    wv6 = DeviceWeight(0x40000, (1024, 1024), 14, "Q6_K", 4 * 210, "v6")
    before = len(ops.rt.launches)
    q, k, v = ops.matmul_n(x, [wq, wk, wv6])
    names = [launch[0] for launch in ops.rt.launches[before:]]
    assert names == ["mmn1_q8_0", "mm1_q6_k"]
    assert ops.rt.launches[-1][3][2] == v.ptr and ops.rt.launches[-2][3][4:6] == (q.ptr, k.ptr)
    # all formats different: separate matmuls
    wk4 = DeviceWeight(0x50000, (1024, 1024), 12, "Q4_K", 4 * 144, "k4")
    before = len(ops.rt.launches)
    ops.matmul_n(x, [wq, wk4, wv6])
    assert [launch[0] for launch in ops.rt.launches[before:]] == ["mm1_q8_0", "mm1_q4_k", "mm1_q6_k"]
    with pytest.raises(ValueError):
        ops.matmul_n(x, [wq, DeviceWeight(0x60000, (8, 512), 8, "Q8_0", 16 * 34, "narrow")])
    with pytest.raises(ValueError):
        ops.matmul_n(x, [wq] * 4)


def test_cuda_ops_matmul_glu_launches(fake_ops):
    from reflex_ipc.cuda.arrays import DeviceArray, DeviceWeight

    ops = fake_ops
    wg = DeviceWeight(0x10000, (3072, 1024), 12, "Q4_K", 4 * 144, "gate")
    wu = DeviceWeight(0x20000, (3072, 1024), 12, "Q4_K", 4 * 144, "up")
    for n, kern, gy in ((1, "mmglu1_q4_k", 1), (5, "mmglu8_q4_k", 1), (13, "mmglu8_q4_k", 2)):
        for act, code in (("silu", 0), ("gelu", 1)):
            x = DeviceArray.empty(ops.pool, (n, 1024))
            before = len(ops.rt.launches)
            y = ops.matmul_glu(x, wg, wu, act=act)
            assert len(ops.rt.launches) == before + 1
            name, grid, block, args = ops.rt.launches[-1]
            assert (name, grid, block) == (kern, (768, gy, 1), (128, 1, 1))
            assert args == (wg.ptr, wu.ptr, x.ptr, y.ptr, 1024, 3072, n, 4 * 144, code) and y.shape == (n, 3072)
    # gate and up of different formats: two matmuls and the element-wise unit
    wu8 = DeviceWeight(0x30000, (3072, 1024), 8, "Q8_0", 32 * 34, "up8")
    x = DeviceArray.empty(ops.pool, (1, 1024))
    for act, glu in (("silu", "swiglu_f32"), ("gelu", "geglu_f32")):
        before = len(ops.rt.launches)
        y = ops.matmul_glu(x, wg, wu8, act=act)
        assert [launch[0] for launch in ops.rt.launches[before:]] == ["mm1_q4_k", "mm1_q8_0", glu]
        assert ops.rt.launches[-1][3][2] == y.ptr
    with pytest.raises(ValueError):
        ops.matmul_glu(x, wg, wu, act="relu")
    with pytest.raises(ValueError):
        ops.matmul_glu(x, wg, DeviceWeight(0x40000, (1024, 1024), 12, "Q4_K", 4 * 144, "small"))


def test_cuda_ops_prefill_takes_the_tensor_core_kernels(fake_ops):
    """From MMA_MIN_N rows on, matmul / matmul_glu / matmul_n convert x to f16 once
    (mma_x_f16) and launch the mma kernels over (rows / 64, tokens / 64, K splits) blocks;
    K is split while the grid fits 3 blocks per SM on the device's
    132 SMs (the gated unit too), and split launches end with mma_reduce over a scratch of the partial sums;
    f32 weights and ops.mma off keep the per-row kernels."""
    from reflex_ipc.backends.cuda_ops import MMA_MIN_N
    from reflex_ipc.cuda.arrays import DeviceArray, DeviceWeight

    ops = fake_ops
    wq = DeviceWeight(0x10000, (4097, 1024), 12, "Q4_K", 4 * 144, "q")
    # 65 row tiles; 16 slices of 64 columns: S = min(396 // tiles, 16), trimmed so that
    # ceil(16 / S) slices per split leave none empty (6 -> 3 a split -> 6; 3 -> 6 -> 3)
    for n, gy, S in ((MMA_MIN_N, 1, 6), (64, 1, 6), (65, 2, 3), (500, 8, 1), (512, 8, 1)):
        x = DeviceArray.empty(ops.pool, (n, 1024))
        for acc in (0, 1):
            before = len(ops.rt.launches)
            y = ops.matmul(x, wq) if not acc else ops.matmul(x, wq, out=y, accumulate=True)
            launches = ops.rt.launches[before:]
            assert [launch[0] for launch in launches] == ["mma_x_f16", "mma_q4_k"] + ["mma_reduce"] * (S > 1)
            conv, mma = launches[0], launches[1]
            xh = conv[3][1]
            assert conv[3] == (x.ptr, xh, n * 1024) and conv[2] == (256, 1, 1)
            assert conv[1][0] * 256 * 4 >= n * 1024  # every float4 of x has a thread
            assert mma[1:3] == ((65, gy, S), (256, 1, 1))
            P = mma[3][-1]
            # acc | MMA_WIDE (4): a Q4_K tensor 16-byte aligned is read with DeqWide's wide loads
            assert mma[3][:-1] == (wq.ptr, xh, y.ptr, 1024, 4097, n, 4 * 144, acc | 4) and y.shape == (n, 4097)
            assert xh not in (x.ptr, y.ptr)
            if S > 1:
                red = launches[2]
                assert red[3] == (P, y.ptr, S, 1, n * 4097, acc) and P not in (0, xh, x.ptr, y.ptr)
                assert red[1][0] * 256 >= min(n * 4097, 8 * 132 * 256)
            else:
                assert P == 0
    ops.mma_wide = False  # REFLEX_MMA_WIDE=0: deq8's loads, the mode as it was
    ops.matmul(DeviceArray.empty(ops.pool, (512, 1024)), wq)
    assert ops.rt.launches[-1][0] == "mma_q4_k" and ops.rt.launches[-1][3][7] == 0
    ops.mma_wide = True
    wq2 = DeviceWeight(0x10008, (4097, 1024), 12, "Q4_K", 4 * 144, "q2")  # 8-byte aligned only: no wide loads
    ops.matmul(DeviceArray.empty(ops.pool, (512, 1024)), wq2)
    assert ops.rt.launches[-1][3][7] == 0
    x = DeviceArray.empty(ops.pool, (MMA_MIN_N - 1, 1024))
    ops.matmul(x, wq)
    assert ops.rt.launches[-1][0] == "mm8_q4_k"
    # gated unit: one fused launch; 48 x 2 tiles, 32 slices of 32 columns: 396 // 96 = 4 splits
    wg = DeviceWeight(0x20000, (3072, 1024), 8, "Q8_0", 32 * 34, "gate")
    wu = DeviceWeight(0x30000, (3072, 1024), 8, "Q8_0", 32 * 34, "up")
    x = DeviceArray.empty(ops.pool, (100, 1024))
    before = len(ops.rt.launches)
    y = ops.matmul_glu(x, wg, wu, act="gelu")
    launches = ops.rt.launches[before:]
    assert [launch[0] for launch in launches] == ["mma_x_f16", "mmaglu_q8_0", "mma_reduce"]
    name, grid, block, args = launches[1]
    xh, P = launches[0][3][1], args[-1]
    assert (grid, block) == ((48, 2, 4), (256, 1, 1))
    assert args[:-1] == (wg.ptr, wu.ptr, xh, y.ptr, 1024, 3072, 100, 32 * 34, 1) and y.shape == (100, 3072)
    assert launches[2][3] == (P, y.ptr, 4, 2, 100 * 3072, 1)
    # 512 tokens: 384 tiles fill the SMs, no split
    x = DeviceArray.empty(ops.pool, (512, 1024))
    before = len(ops.rt.launches)
    ops.matmul_glu(x, wg, wu)
    launches = ops.rt.launches[before:]
    assert [launch[0] for launch in launches] == ["mma_x_f16", "mmaglu_q8_0"]
    assert launches[1][1] == (48, 8, 1) and launches[1][3][-1] == 0 and launches[1][3][-2] == 0
    # q/k/v of one format: x converted once, one tensor-core launch per weight
    wk = DeviceWeight(0x40000, (1024, 1024), 8, "Q8_0", 32 * 34, "k")
    x = DeviceArray.empty(ops.pool, (100, 1024))
    before = len(ops.rt.launches)
    q, k, v = ops.matmul_n(x, [wg, wk, wk])
    launches = ops.rt.launches[before:]
    # q: 96 tiles -> 4 splits of 4 slices; k, v: 32 tiles -> 12 -> 2 slices a split -> 8
    assert [launch[0] for launch in launches] == ["mma_x_f16"] + ["mma_q8_0", "mma_reduce"] * 3
    xh = launches[0][3][1]
    mmas = launches[1::2]
    assert [launch[3][1] for launch in mmas] == [xh] * 3
    assert [launch[3][2] for launch in mmas] == [q.ptr, k.ptr, v.ptr] and len({q.ptr, k.ptr, v.ptr}) == 3
    assert [launch[1] for launch in mmas] == [(48, 2, 4), (16, 2, 8), (16, 2, 8)]
    assert [launch[3][1] for launch in launches[2::2]] == [q.ptr, k.ptr, v.ptr]
    # float32 weights are not rounded to f16: the per-row kernels
    w32 = DeviceWeight(0x50000, (64, 1024), 0, "F32", 4096, "w32")
    ops.matmul(x, w32)
    assert ops.rt.launches[-1][0] == "mm8_f32"
    # REFLEX_MMA=0 (ops.mma False): the per-row kernels for every N
    ops.mma = False
    ops.matmul(x, wq)
    ops.matmul_glu(x, wg, wu)
    assert [launch[0] for launch in ops.rt.launches[-2:]] == ["mm8_q4_k", "mmglu8_q8_0"]


def test_cuda_ops_mmt_launches(fake_ops):
    """REFLEX_MMNT on: 2 <= N < MMA_MIN_N tokens take matvec_nt.cuh's kernels (8 tokens a block,
    grid y the token groups) with the arguments of mm / mmn / mmglu; N = 1 and
    the tensor-core range do not; with ops.mma off, 64+ tokens keep mm8."""
    from reflex_ipc.backends.cuda_ops import MMA_MIN_N
    from reflex_ipc.cuda.arrays import DeviceArray, DeviceWeight

    ops = fake_ops
    ops.mmnt = True
    w = DeviceWeight(0x5000, (203, 512), 8, "Q8_0", 16 * 34, "w")
    for n, kern, gy in ((1, "mm1_q8_0", 1), (2, "mmt8_q8_0", 1), (8, "mmt8_q8_0", 1), (9, "mmt8_q8_0", 2),
                        (13, "mmt8_q8_0", 2), (MMA_MIN_N - 1, "mmt8_q8_0", 8)):
        x = DeviceArray.empty(ops.pool, (n, 512))
        for acc in (0, 1):
            y = ops.matmul(x, w) if not acc else ops.matmul(x, w, out=y, accumulate=True)
            name, grid, block, args = ops.rt.launches[-1]
            assert (name, grid, block) == (kern, (51, gy, 1), (128, 1, 1))
            assert args == (0x5000, x.ptr, y.ptr, 512, 203, n, 544, acc)
    x = DeviceArray.empty(ops.pool, (MMA_MIN_N, 512))
    before = len(ops.rt.launches)
    ops.matmul(x, w)
    assert "mma_q8_0" in [launch[0] for launch in ops.rt.launches[before:]]
    ops.mma = False
    ops.matmul(x, w)
    assert ops.rt.launches[-1][0] == "mm8_q8_0"
    ops.mma = True
    wq = DeviceWeight(0x10000, (2048, 1024), 8, "Q8_0", 32 * 34, "q")
    wk = DeviceWeight(0x20000, (1023, 1024), 8, "Q8_0", 32 * 34, "k")
    for n, kern, gy in ((3, "mmtn8_q8_0", 1), (9, "mmtn8_q8_0", 2)):
        x = DeviceArray.empty(ops.pool, (n, 1024))
        before = len(ops.rt.launches)
        q, k, v = ops.matmul_n(x, [wq, wk, wk])
        assert len(ops.rt.launches) == before + 1
        name, grid, block, args = ops.rt.launches[-1]
        assert (name, grid, block) == (kern, (-(-(2048 + 2 * 1023) // 4), gy, 1), (128, 1, 1))
        assert args == (wq.ptr, wk.ptr, wk.ptr, x.ptr, q.ptr, k.ptr, v.ptr, 1024, 2048, 1023, 1023, n, 32 * 34)
    wg = DeviceWeight(0x30000, (3071, 1024), 12, "Q4_K", 4 * 144, "gate")
    wu = DeviceWeight(0x40000, (3071, 1024), 12, "Q4_K", 4 * 144, "up")
    for n, kern, gy in ((2, "mmtglu8_q4_k", 1), (17, "mmtglu8_q4_k", 3)):
        x = DeviceArray.empty(ops.pool, (n, 1024))
        y = ops.matmul_glu(x, wg, wu, act="gelu")
        name, grid, block, args = ops.rt.launches[-1]
        assert (name, grid, block) == (kern, (1536, gy, 1), (128, 1, 1))  # 2 rows of gate and up a block
        assert args == (wg.ptr, wu.ptr, x.ptr, y.ptr, 1024, 3071, n, 4 * 144, 1) and y.shape == (n, 3071)


def test_cuda_ops_mmnt_and_chunked_are_always_on(monkeypatch):
    """matvec_nt.cuh and the chunked recurrent prefill are on whatever the retired REFLEX_MMNT
    and REFLEX_CHUNKED say (settings.RETIRED)."""
    from reflex_ipc.backends import cuda_ops

    for env in ("", "0", "1"):
        rt = RecordingRuntime()
        rt.cc = (9, 0)
        monkeypatch.setattr(cuda_ops, "_cuda_runtime", lambda rt=rt: rt)
        for name in ("REFLEX_MMNT", "REFLEX_CHUNKED"):
            monkeypatch.setenv(name, env) if env else monkeypatch.delenv(name, raising=False)
        ops = cuda_ops.CudaOps()
        assert ops.mmnt is True and ops.chunked is True and ops.mv_variant is None


def test_cuda_ops_mma_switch(monkeypatch):
    """REFLEX_MMA=0 or a device before sm_80 turns the tensor-core kernels off."""
    from reflex_ipc.backends import cuda_ops

    for env, cc, want in (("", (9, 0), True), ("0", (9, 0), False), ("1", (8, 0), True), ("", (7, 5), False)):
        rt = RecordingRuntime()
        rt.cc = cc
        monkeypatch.setattr(cuda_ops, "_cuda_runtime", lambda rt=rt: rt)
        monkeypatch.setenv("REFLEX_MMA", env) if env else monkeypatch.delenv("REFLEX_MMA", raising=False)
        assert cuda_ops.CudaOps().mma is want


def test_cuda_ops_flash_switch(monkeypatch):
    """REFLEX_FLASH=0 or a device before sm_80 keeps prefill attention on attention_f16kv."""
    from reflex_ipc.backends import cuda_ops

    for env, cc, want in (("", (9, 0), True), ("0", (9, 0), False), ("1", (8, 0), True), ("", (7, 5), False)):
        rt = RecordingRuntime()
        rt.cc = cc
        monkeypatch.setattr(cuda_ops, "_cuda_runtime", lambda rt=rt: rt)
        monkeypatch.setenv("REFLEX_FLASH", env) if env else monkeypatch.delenv("REFLEX_FLASH", raising=False)
        ops = cuda_ops.CudaOps()
        assert ops.flash is want and ops.flash_takes(64, 16, 8, 128) is want


def test_cuda_ops_rms_norm_rope_launch(fake_ops):
    ops = fake_ops
    x = ops.empty((3, 16, 128))
    w, ff = ops.empty((128,)), ops.empty((32,))
    pos = ops.positions([4, 5, 6])
    y = ops.rms_norm_rope(x, w, 1e-6, pos, n_rot=64, base=5e5, freq_scale=0.5, freq_factors=ff, neox=True,
                          mscale=1.25)
    assert y is x
    name, grid, block, args = ops.rt.launches[-1]
    assert (name, grid, block) == ("rmsnorm_rope_f32", (12, 1, 1), (128, 1, 1))  # 48 head rows, 4 a block
    assert args == (x.ptr, w.ptr, pos.ptr, 48, 16, 128, 1e-6, 64, 5e5, 0.5, ff.ptr, 1, 1.25)
    ops.rms_norm_rope(ops.empty((1, 8, 64)), None, 1e-5, pos[:1])
    args = ops.rt.launches[-1][3]
    assert ops.rt.launches[-1][1] == (2, 1, 1) and args[1] == 0 and args[7] == 64 and args[10] == 0
    with pytest.raises(ValueError):
        ops.rms_norm_rope(x, w, 1e-6, pos, n_rot=130)


def test_cuda_ops_residual_add_launch(fake_ops):
    """residual_add_f32: one block per row, x written in place, the norm's weight only with the
    norm; the plain ops with REFLEX_FUSE=0 (base.residual_add)."""
    from reflex_ipc.backends.base import residual_add

    ops = fake_ops
    x, y, w = ops.empty((3, 1024)), ops.empty((3, 1024)), ops.empty((1024,))
    assert ops.residual_add(x, y, w, 1e-6, scale=0.5, out_scale=2.0) is x
    name, grid, block, args = ops.rt.launches[-1]
    assert (name, grid, block) == ("residual_add_f32", (3, 1, 1), (256, 1, 1))
    assert args == (x.ptr, y.ptr, w.ptr, 1024, 1, 1e-6, 0.5, 2.0)
    ops.residual_add(x[:1], y[:1], w, 1e-5, norm=False, scale=0.22)
    assert ops.rt.launches[-1][3] == (x.ptr, y.ptr, 0, 1024, 0, 1e-5, 0.22, 1.0)
    with pytest.raises(ValueError):
        ops.residual_add(x, y[:2], w, 1e-6)
    n = len(ops.rt.launches)
    residual_add(ops, x, y, w, 1e-6)  # REFLEX_FUSE=0 (the fixture): rmsnorm_f32 then add_f32
    assert [launch[0] for launch in ops.rt.launches[n:]] == ["rmsnorm_f32", "add_f32"]


def _layer_kernels(ops, path):
    """Kernel names of each layer of one decode step (one token at position 7) of the model
    at path, launched through the recording runtime."""
    from reflex_ipc.gguffile import GGUFFile
    from reflex_ipc.models import load_model
    from reflex_ipc.runtime.batch import Batch

    with GGUFFile(path) as f:
        model = load_model(ops, f)
        hp = model.hp
        state = model.new_state(ops, 512)
        batch = Batch(ops, [5], [7])
        starts = []
        model.forward(state, batch, check=lambda: starts.append(len(ops.rt.launches)))
        names = [launch[0] for launch in ops.rt.launches]
    # output norm, LM head (+ final softcap); one launch for both with the fused ops
    head = (1 if settings.get().fuse else 2) + (hp.arch == "gemma3")
    bounds = starts + [len(names) - head]
    return [names[a:b] for a, b in zip(bounds, bounds[1:])]


def _expected_layer(arch, t):
    """The kernels a decode layer should launch, from its matrices' formats t (name -> type)."""
    mm = {"F16": "f16", "Q4_0": "q4_0", "Q8_0": "q8_0", "Q4_K": "q4_k", "F32": "f32"}
    out = ["rmsnorm_f32"]
    groups = {}  # q/k/v: one launch per format, in order of first appearance
    for name in ("attn_q", "attn_k", "attn_v"):
        groups.setdefault(t[name], []).append(name)
    out += [("mmn1_" if len(g) > 1 else "mm1_") + mm[f] for f, g in groups.items()]
    out += ["add_row_f32"] * 3 if arch == "qwen2" else []  # q/k/v biases
    out += ["rmsnorm_rope_f32"] * 2 if arch in ("qwen3", "gemma3") else ["rope_f32"] * 2
    out += ["kv_store", "attention_split_f16kv", "attention_combine", "mm1_" + mm[t["attn_output"]]]
    post = ["rmsnorm_f32", "add_f32"] if arch == "gemma3" else []  # sandwich norm, then the residual
    out += post + ["rmsnorm_f32"]
    if t["ffn_gate"] == t["ffn_up"]:
        out.append("mmglu1_" + mm[t["ffn_gate"]])
    else:
        out += ["mm1_" + mm[t["ffn_gate"]], "mm1_" + mm[t["ffn_up"]],
                "geglu_f32" if arch == "gemma3" else "swiglu_f32"]
    return out + ["mm1_" + mm[t["ffn_down"]]] + post


# Kernels per decode layer when q/k/v share a format and gate/up share one (e.g. a Q8_0
# Qwen3-0.6B): llama/qwen3 were 17/19 before the fused ops, qwen2 20, gemma3 21.
UNIFORM_LAYER_KERNELS = {"llama": 11, "qwen2": 14, "qwen3": 11, "gemma3": 15}


def _expected_layer_fused(arch, t):
    """_expected_layer with fusion on (REFLEX_FUSE unset): every model's layer blocks
    (models/blocks.py) fold the norm into the q/k/v and gate/up matvecs and run q/k norm +
    rope + K/V store in one kernel; the split attention in one launch and one-token matvecs of
    few rows a block per row (mmsk1); gemma3's post-norm and residual add in one kernel."""
    mm = {"F16": "f16", "Q4_0": "q4_0", "Q8_0": "q8_0", "Q4_K": "q4_k", "F32": "f32"}
    groups = {}
    for name in ("attn_q", "attn_k", "attn_v"):
        groups.setdefault(t[name], []).append(name)
    post = ["residual_add_f32"] if arch == "gemma3" else []  # the post-norm and the residual add
    out = ["mmnorm1_" + mm[f] for f in groups]
    out += ["add_row_f32"] * 3 if arch == "qwen2" else []
    out += ["qk_rope_kv_store_f32", "attention_split_last_f16kv", "mmsk1_" + mm[t["attn_output"]]] + post
    if t["ffn_gate"] == t["ffn_up"]:
        out.append("mmgnorm1_" + mm[t["ffn_gate"]])
    else:
        out += ["rmsnorm_f32", "mmsk1_" + mm[t["ffn_gate"]], "mmsk1_" + mm[t["ffn_up"]],
                "geglu_f32" if arch == "gemma3" else "swiglu_f32"]
    return out + ["mmsk1_" + mm[t["ffn_down"]]] + post


UNIFORM_LAYER_KERNELS_FUSED = {"llama": 6, "qwen2": 9, "qwen3": 6, "gemma3": 8}  # gemma3 was 14


@pytest.mark.parametrize("arch", sorted(UNIFORM_LAYER_KERNELS_FUSED))
def test_models_decode_kernels_per_layer_fused(fake_ops, monkeypatch, arch):
    """The decode layers' kernels with the fused ops (the default), on the same mixed fixtures."""
    from reflex_ipc.gguffile import GGUFFile

    monkeypatch.setenv("REFLEX_FUSE", "1")
    path = os.path.join(ROOT, "tests", "data", f"synthetic-{arch}.gguf")
    layers = _layer_kernels(fake_ops, path)
    with GGUFFile(path) as f:
        types = [{n.split(".")[2]: ti.type_name for n, ti in f.tensors.items()
                  if n.startswith(f"blk.{i}.") and len(ti.shape) == 2} for i in range(len(layers))]
    assert len(layers) >= 2
    for names, t in zip(layers, types):
        assert names == _expected_layer_fused(arch, t), t
        if t["attn_q"] == t["attn_k"] == t["attn_v"] and t["ffn_gate"] == t["ffn_up"]:
            assert len(names) == UNIFORM_LAYER_KERNELS_FUSED[arch]
    # output norm + LM head: one launch (gemma3: then its final softcap)
    assert fake_ops.rt.launches[-1 - (arch == "gemma3")][0].startswith("mmnorm1_")


@pytest.mark.parametrize("arch", sorted(UNIFORM_LAYER_KERNELS))
def test_models_decode_kernels_per_layer(fake_ops, arch):
    """The fixtures mix formats across and inside layers, so both the one-launch paths and
    the per-format fallbacks of matmul_n / matmul_glu occur."""
    from reflex_ipc.gguffile import GGUFFile

    path = os.path.join(ROOT, "tests", "data", f"synthetic-{arch}.gguf")
    layers = _layer_kernels(fake_ops, path)
    with GGUFFile(path) as f:
        types = [{n.split(".")[2]: ti.type_name for n, ti in f.tensors.items()
                  if n.startswith(f"blk.{i}.") and len(ti.shape) == 2} for i in range(len(layers))]
    assert len(layers) >= 2
    uniform = 0
    for names, t in zip(layers, types):
        assert names == _expected_layer(arch, t), t
        if t["attn_q"] == t["attn_k"] == t["attn_v"] and t["ffn_gate"] == t["ffn_up"]:
            uniform += 1
            assert len(names) == UNIFORM_LAYER_KERNELS[arch]
    assert arch == "qwen3" or uniform  # every fixture but qwen3 has such a layer


def test_cuda_ops_recurrent_paths(fake_ops, monkeypatch):
    """delta_net / ssm_scan: the sequential kernel for decode and calls under chunk_min tokens
    per group, the two chunked kernels (grids over chunks / state-row tiles, heads, groups;
    workspaces of the batch's N tokens) from chunk_min on, and none with REFLEX_CHUNKED=0."""
    import numpy as np

    from reflex_ipc.backends import cuda_ops
    from reflex_ipc.cuda.arrays import DeviceArray

    ops = fake_ops
    ops._seq_memo = None
    rt = ops.rt
    arr = lambda *shape: DeviceArray.empty(ops.pool, shape)  # noqa: E731
    Hk, Hv, D = 2, 6, 128
    st = arr(4, Hv, D, D)
    for N, seqs, T, chunked in ((1, None, 1, False), (127, None, 127, False), (128, None, 128, True),
                                (200, None, 200, True), (203, np.repeat([1, 3, 2], [140, 1, 62]), 140, True),
                                (40, np.repeat([1, 2], [20, 20]), 20, False)):
        q, k, v, g, b = arr(N, Hk, D), arr(N, Hk, D), arr(N, Hv, D), arr(N, Hv), arr(N, Hv)
        n0 = len(rt.launches)
        out = ops.delta_net(q, k, v, g, b, st, seqs, scale=0.5)
        new = rt.launches[n0:]
        G = 1 if seqs is None else len(set(seqs.tolist()))
        if not chunked:
            assert [x[0] for x in new] == ["delta_net_f32"] and new[0][1] == (Hv * D // 4, G, 1)
            continue
        (p, pg, pb, pa), (s, sgr, sb, sa) = new
        assert (p, s) == ("delta_chunk_prep_f32", "delta_chunk_scan_f32") and pb == sb == (256, 1, 1)
        assert pg == (-(-T // 64), Hv, G) and sgr == (D // 16, Hv, G)
        aqk, gc, wv, wk = pa[5:9]
        assert pa[:5] == (q.ptr, k.ptr, v.ptr, g.ptr, b.ptr) and pa[10:] == (G, N, Hk, Hv, D)
        assert sa[:8] == (q.ptr, k.ptr, wv, wk, aqk, gc, st.ptr, out.ptr) and sa[9:] == (G, N, Hk, Hv, D, 0.5)
        assert pa[9] == sa[8] == (0 if seqs is None else ops._seq_memo[2].ptr)  # the group table
        assert len({aqk, gc, wv, wk, out.ptr}) == 5
    H, P, Gq, Ns = 8, 64, 2, 128
    sst = arr(2, H, P, Ns)
    x, dt, A, B, C, Dk = arr(130, H, P), arr(130, H), arr(H), arr(130, Gq, Ns), arr(130, Gq, Ns), arr(H)
    n0 = len(rt.launches)
    y = ops.ssm_scan(x, dt, A, B, C, sst, None, D=Dk)
    (p, pg, _, pa), (s, sgr, _, sa) = rt.launches[n0:]
    assert (p, pg, s, sgr) == ("ssm_chunk_prep_f32", (3, H, 1), "ssm_chunk_scan_f32", (P // 16, H, 1))
    assert pa[:4] == (C.ptr, B.ptr, dt.ptr, A.ptr) and pa[6:] == (0, 1, 130, H, Gq, Ns)
    assert sa[:4] == (C.ptr, B.ptr, x.ptr, dt.ptr) and sa[4:6] == pa[4:6]
    assert sa[6:10] == (Dk.ptr, sst.ptr, y.ptr, 0) and sa[10:] == (1, 130, H, P, Gq, Ns)
    calls = dict(ops.recur_calls)
    ops.chunked = False  # gpu-check's other form
    n0 = len(rt.launches)
    ops.ssm_scan(x, dt, A, B, C, sst, None)
    assert [x[0] for x in rt.launches[n0:]] == ["ssm_scan_f32"]
    assert ops.recur_calls == {"chunked": calls["chunked"], "sequential": calls["sequential"] + 1}
    assert cuda_ops.CHUNK_MIN == ops.chunk_min == 128


def test_cuda_ops_hybrid_fused_launches(fake_ops):
    """base.py's fused ops of the hybrid layers on CudaOps: kernel, grid, pointers, sizes; and
    delta_qkv_f32's row indexing emulated in numpy (a warp per head row) against the plain ops."""
    import math

    import numpy as np

    from reflex_ipc.backends.base import delta_qkv
    from reflex_ipc.backends.numpy_ops import NumpyOps
    from reflex_ipc.cuda.arrays import DeviceArray

    ops, rt = fake_ops, fake_ops.rt
    ops._seq_memo = None
    arr = lambda *shape: DeviceArray.empty(ops.pool, shape)  # noqa: E731
    N, nk, nv, d = 130, 2, 6, 37
    alpha, b, bias, a = arr(N, nv), arr(N, nv), arr(nv), arr(nv)
    g, beta = ops.delta_gates(alpha, bias, a, b)
    name, grid, block, args = rt.launches[-1]
    assert (name, grid, block) == ("delta_gates_f32", (4, 1, 1), (256, 1, 1))
    assert args == (alpha.ptr, bias.ptr, a.ptr, b.ptr, g.ptr, beta.ptr, N * nv, nv) and g.ptr != beta.ptr
    c = arr(N, (2 * nk + nv) * d)
    q, k, v = ops.delta_qkv(c, nk, nv, d, 1e-6)
    name, grid, block, args = rt.launches[-1]
    assert (name, grid, block) == ("delta_qkv_f32", (325, 1, 1), (128, 1, 1))  # 130 x 10 rows, 4 a block
    assert args[:8] == (c.ptr, q.ptr, k.ptr, v.ptr, N, nk, nv, d)
    assert args[8] == pytest.approx(1e-6 / d) and args[9] == pytest.approx(1 / math.sqrt(d))
    assert (q.shape, k.shape, v.shape) == ((N, nk, d), (N, nk, d), (N, nv, d))
    with pytest.raises(ValueError):
        ops.delta_qkv(arr(N, 11 * d), nk, nv, d, 1e-6)
    o, z, w = arr(N, nv, d), arr(N, nv, d), arr(d)
    y = ops.rms_norm_gate(o, w, 1e-6, z)
    assert rt.launches[-1] == ("rms_norm_gate_f32", (-(-N * nv // 4), 1, 1), (128, 1, 1),
                               (o.ptr, w.ptr, z.ptr, y.ptr, N * nv, d, 1e-6))
    att, qg = arr(N, nv * d), arr(N, nv, 2 * d)
    y = ops.sigmoid_gate(att, qg, d, d)
    assert rt.launches[-1] == ("sigmoid_gate_f32", (-(-N * nv * d // 256), 1, 1), (256, 1, 1),
                               (att.ptr, qg.ptr, y.ptr, N * nv * d, d, 2 * d, d))
    with pytest.raises(ValueError):
        ops.sigmoid_gate(att, qg, d + 1, d)
    x, st, cw = arr(7, 50), arr(2, 3, 50), arr(50, 4)
    ops.ssm_conv(x, st, cw)
    assert rt.launches[-2][0] == "ssm_conv_f32" and rt.launches[-2][3][-1] == 0
    assert rt.launches[-1][0] == "ssm_conv_state_f32"  # 7 tokens over 7 blocks: the state after
    out = ops.ssm_conv_silu(x[:1], st, cw)
    assert rt.launches[-1] == ("ssm_conv_f32", (1, 1, 1), (256, 1, 1),
                               (x.ptr, st.ptr, cw.ptr, out.ptr, 0, 1, 1, 50, 4, 1))

    # delta_qkv_f32's indexing, one warp (row) at a time, vectorized over its lanes
    rng = np.random.default_rng(0)
    N, nk, nv, d = 3, 2, 3, 45
    ch = rng.standard_normal((N, (2 * nk + nv) * d)).astype(np.float32)
    cf = ch.reshape(-1)
    qe, ke, ve = (np.full(n * d * N, np.nan, np.float32) for n in (nk, nk, nv))
    rpt, eps, scale = 2 * nk + nv, np.float32(1e-6 / d), np.float32(1 / math.sqrt(d))
    for r in range(N * rpt):
        n, h = divmod(r, rpt)
        src = cf[r * d:(r + 1) * d]
        if h >= 2 * nk:
            ve[(n * nv + h - 2 * nk) * d:][:d] = src
            continue
        rr = np.float32(1) / np.sqrt((src * src).sum() / np.float32(d) + eps)
        dst, hh = (qe, h) if h < nk else (ke, h - nk)
        dst[(n * nk + hh) * d:][:d] = src * rr * scale
    want = delta_qkv(NumpyOps(), ch, nk, nv, d, 1e-6)
    for got, ref in zip((qe, ke, ve), want):
        np.testing.assert_allclose(got.reshape(ref.shape), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fuse", ["1", "0"])
def test_qwen35_decode_kernels_per_layer(fake_ops, monkeypatch, tmp_path, fuse):
    """A qwen35 decode step's element-wise kernels: with the fused ops, a Gated DeltaNet layer's
    chain (gates, conv + silu, q/k/v split and L2 norms, gated norm) is four launches and the
    gated attention's sigmoid gate one; REFLEX_FUSE=0 keeps the plain ops' launches."""
    from reflex_ipc.testing.synthetic import example_gguf

    monkeypatch.setenv("REFLEX_FUSE", fuse)
    fake_ops._seq_memo = None
    path = example_gguf("qwen35", str(tmp_path / "q35.gguf"))
    layers = _layer_kernels(fake_ops, path)
    plain = {"add_row_f32", "softplus_f32", "mul_row_f32", "silu_f32", "columns_f32", "scale_f32", "sigmoid_f32",
             "mul_f32"}
    fused = ["delta_gates_f32", "ssm_conv_f32", "delta_qkv_f32", "delta_net_f32", "rms_norm_gate_f32"]
    kinds = []
    for names in layers:
        if "delta_net_f32" in names:
            kinds.append("delta")
            ew = [n for n in names if n in plain or n in fused]
            if fuse == "1":
                assert ew == fused, names
            else:
                assert ew.count("columns_f32") == 3 and ew.count("scale_f32") == 2 and "delta_gates_f32" not in ew
        else:
            kinds.append("attention")
            assert ("sigmoid_gate_f32" in names) == (fuse == "1") and ("sigmoid_f32" in names) == (fuse == "0")
    assert "delta" in kinds and "attention" in kinds


def test_cuda_ops_matvec_switch_launches(fake_ops, monkeypatch):
    """REFLEX_MATVEC=new (ops.matvec): one-token matmuls of Q4_K / Q5_K / Q6_K / Q8_0 go to
    matvec.cuh's kernels with the grid of the variant mv_pick (or ops.mv_variant)
    chooses; other formats, several tokens, a misaligned weight, or the switch off keep the
    old kernels."""
    from reflex_ipc.backends import cuda_ops
    from reflex_ipc.cuda.arrays import DeviceArray, DeviceWeight

    monkeypatch.setenv("REFLEX_FUSE", "1")
    ops = fake_ops
    K = 3072  # 12 blocks a row: K split over warps (variants a / b)
    rb4, rb6 = 12 * 144, 12 * 210
    q4 = [DeviceWeight(0x100000 * (i + 1), (M, K), 12, "Q4_K", rb4, f"q{i}") for i, M in enumerate((201, 70, 57))]
    q6 = DeviceWeight(0x900002, (57, K), 14, "Q6_K", rb6, "v")  # 2-byte aligned is enough
    x = DeviceArray.empty(ops.pool, (1, K))
    nw = DeviceArray.empty(ops.pool, (K,))
    last = lambda: ops.rt.launches[-1]
    def pick(kind, t, Kw, rows):  # the variant mv_pick gives (the H200 sweep's choice)
        return cuda_ops.mv_pick(t, Kw, rows, kind)

    assert not ops.matvec
    ops.matmul(x, q4[0])
    assert last()[0] == "mmsk1_q4_k"
    ops.matvec = True
    y = ops.matmul(x, q4[0])
    v = pick("mv", 12, K, 201)
    assert last() == (f"mv{v}_q4_k", *cuda_ops.mv_grid(v, 201), (q4[0].ptr, x.ptr, y.ptr, K, 201, rb4, 0))
    ops.matmul(x, q4[0], out=y, accumulate=True)
    assert last()[3][-1] == 1
    M = 40003
    ops.matmul(x, DeviceWeight(0x1000000, (M, K), 12, "Q4_K", rb4, "head"))
    v = pick("mv", 12, K, M)
    assert last()[:3] == (f"mv{v}_q4_k", *cuda_ops.mv_grid(v, M))
    ops.matmul(DeviceArray.empty(ops.pool, (1, 12288)), DeviceWeight(0x100000, (M, 12288), 12, "Q4_K", 48 * 144, "s"))
    v = pick("mv", 12, 12288, M)
    assert last()[:3] == (f"mv{v}_q4_k", *cuda_ops.mv_grid(v, M))
    # short Q8_0 rows: mv_pick keeps the older split-K kernel
    ops.matmul(DeviceArray.empty(ops.pool, (1, 1024)), DeviceWeight(0x100000, (300, 1024), 8, "Q8_0", 32 * 34, "q8"))
    assert pick("mv", 8, 1024, 300) is None and last()[0] == "mmsk1_q8_0"
    # not taken: misaligned Q4_K, another format, several tokens
    ops.matmul(x, DeviceWeight(0x100008, (201, K), 12, "Q4_K", rb4, "odd"))
    assert last()[0] == "mmsk1_q4_k"
    ops.matmul(x, DeviceWeight(0x100000, (201, K), 2, "Q4_0", K // 32 * 18, "q40"))
    assert last()[0] == "mmsk1_q4_0"
    ops.matmul(DeviceArray.empty(ops.pool, (3, K)), q4[0])
    assert last()[0] == "mm4_q4_k"
    # q/k/v: one mvn launch per format (no norm), the lone Q6_K through matmul
    n0 = len(ops.rt.launches)
    ys = ops.matmul_n(x, [q4[0], q4[1], q6])
    (a, b) = ops.rt.launches[n0:]
    v = pick("mvn", 12, K, 271)
    assert a == (f"mvn{v}_q4_k", *cuda_ops.mv_grid(v, 271),
                 (q4[0].ptr, q4[1].ptr, 0, x.ptr, 0, 0.0, ys[0].ptr, ys[1].ptr, 0, K, 201, 70, 0, rb4, 0))
    assert b[0] == f"mv{pick('mv', 14, K, 57)}_q6_k" and b[3][:3] == (q6.ptr, x.ptr, ys[2].ptr)
    # the RMSNorm folded in
    n0 = len(ops.rt.launches)
    ys = cuda_ops.CudaOps.rms_norm_matmul_n(ops, x, nw, 1e-6, q4)
    (a,) = ops.rt.launches[n0:]
    v = pick("mvn", 12, K, 328)
    assert a[:3] == (f"mvn{v}_q4_k", *cuda_ops.mv_grid(v, 328))
    assert a[3] == (*[w.ptr for w in q4], x.ptr, nw.ptr, 1e-6, *[y.ptr for y in ys], K, 201, 70, 57, rb4, 1)
    ops.rms_norm_matmul_n(x, None, 1e-6, [q6])
    assert last()[0] == f"mvn{pick('mvn', 14, K, 57)}_q6_k" and last()[3][4] == 0 and last()[3][-6:] == (K, 57, 0, 0, rb6, 1)
    # gated units
    g = ops.matmul_glu(x, q4[0], q4[0], act="gelu")
    v = pick("mvglu", 12, K, 201)
    assert last() == (f"mvglu{v}_q4_k", *cuda_ops.mv_grid(v, 201),
                      (q4[0].ptr, q4[0].ptr, x.ptr, 0, 0.0, g.ptr, K, 201, rb4, 1, 0))
    g = ops.rms_norm_matmul_glu(x, nw, 1e-5, q4[0], q4[0])
    assert last()[0] == f"mvglu{v}_q4_k" and last()[3][3:5] == (nw.ptr, 1e-5) and last()[3][-2:] == (0, 1)
    # a forced variant
    ops.mv_variant = "c"
    ops.rms_norm_matmul_glu(x, nw, 1e-5, q4[0], q4[0])
    assert last()[:3] == ("mvgluc_q4_k", (51, 1, 1), (64, 1, 1))
    ops.matvec = False
    ops.rms_norm_matmul_glu(x, nw, 1e-5, q4[0], q4[0])
    assert last()[0] == "mmgnorm1_q4_k"


def test_gpu_matvec_script_launches_fit_the_kernels(fake_ops):
    """scripts/gpu/gpu-matvec's launches (old kernels and every variant, each matrix kind):
    known kernels, arguments that pack into their layouts, grids covering the rows."""
    import importlib.machinery
    import importlib.util

    from reflex_ipc.backends import cuda_ops
    from reflex_ipc.cuda.arrays import DeviceArray, DeviceWeight
    from reflex_ipc.ggml_types import TYPES

    path = os.path.join(ROOT, "scripts", "gpu", "gpu-matvec")
    loader = importlib.machinery.SourceFileLoader("gpu_matvec", path)
    spec = importlib.util.spec_from_loader("gpu_matvec", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    b = mod.Bench.__new__(mod.Bench)
    b.ops, b.co, b.TYPES = fake_ops, cuda_ops, TYPES
    ops = fake_ops
    for model in mod.MODELS.values():
        for mat, kind, mks in mod.shapes(model):
            for tname in ("Q4_K", "Q6_K", "Q8_0"):
                tid, blk, bsize = TYPES[tname]
                K = mks[0][1]
                ws = [DeviceWeight(0x100000 * (i + 1), (M, K), tid, tname, K // blk * bsize, "w")
                      for i, (M, _) in enumerate(mks)]
                x, nw = DeviceArray.empty(ops.pool, (K,)), DeviceArray.empty(ops.pool, (K,))
                ys = [DeviceArray.empty(ops.pool, (M,)) for M, _ in mks[:3 if kind == "qkv" else 1]]
                for kern in ["old", *cuda_ops.MV_VARIANTS]:
                    b.launcher(kern, kind, tid, x, nw, ys)(ws)
                    name, grid, block, args = ops.rt.launches[-1]
                    rows = sum(M for M, _ in mks) if kind == "qkv" else mks[0][0]
                    if kern == "old":
                        assert name.startswith({"mv": "mm", "qkv": "mmnorm1_", "glu": "mmgnorm1_"}[kind])
                    else:
                        R, W, G, _ = cuda_ops.MV_VARIANTS[kern]
                        assert name.startswith({"mv": "mv", "qkv": "mvn", "glu": "mvglu"}[kind] + kern)
                        assert grid[0] * R * G >= rows > (grid[0] - 1) * R * G and block == (32 * W * G, 1, 1)


@pytest.mark.parametrize("arch", sorted(UNIFORM_LAYER_KERNELS_FUSED))
def test_models_decode_kernels_per_layer_matvec(fake_ops, monkeypatch, arch):
    """REFLEX_MATVEC=new changes which kernels a decode layer launches, never how many: each
    one-token matvec of a matvec.cuh format takes its counterpart there, or stays on the older
    kernel where mv_pick says so."""
    from reflex_ipc.backends import cuda_ops
    from reflex_ipc.gguffile import GGUFFile

    monkeypatch.setenv("REFLEX_FUSE", "1")
    fake_ops.matvec = True
    path = os.path.join(ROOT, "tests", "data", f"synthetic-{arch}.gguf")
    layers = _layer_kernels(fake_ops, path)
    with GGUFFile(path) as f:
        types = [{n.split(".")[2]: ti.type_name for n, ti in f.tensors.items()
                  if n.startswith(f"blk.{i}.") and len(ti.shape) == 2} for i in range(len(layers))]
    new = {"mmnorm1_": "mvn", "mmn1_": "mvn", "mmsk1_": "mv", "mmgnorm1_": "mvglu", "mmglu1_": "mvglu"}

    def moved(n):
        for old, to in new.items():
            if n.startswith(old) and n[len(old):] in cuda_ops.MV_KERNEL.values():
                return to + "?_" + n[len(old):]
        return n

    def variant_free(names):  # the variant depends on the fixture's widths (mv_pick), which may
        out = []  # also keep the older kernel (None): either counts as the same launch
        for n in names:
            m = re.fullmatch(r"(mv|mvn|mvglu)([a-z])_(\w+)", n)
            assert m is None or m.group(2) in cuda_ops.MV_VARIANTS, n
            out.append(f"{m.group(1)}?_{m.group(3)}" if m else moved(n))
        return out

    taken = 0
    for names, t in zip(layers, types):
        want = [moved(n) for n in _expected_layer_fused(arch, t)]
        assert variant_free(names) == want, t
        taken += sum(n.startswith("mv") for n in names)
    assert taken  # the fixtures have Q8_0 / Q4_K matrices


def test_cuda_ops_iq_weights_stay_blocks_and_take_their_kernels(fake_ops, tmp_path):
    """An IQ / TQ / MXFP4 weight stays its blocks in the arena (no dequantized copy), its loading
    asks for a kernel of its fatbin (the real runtime loads that fatbin then, outside any graph
    capture), and every matmul path launches that format's kernel of the same family."""
    import numpy as np

    from reflex_ipc.cuda.arrays import DeviceArray, DeviceWeight
    from reflex_ipc.gguffile import GGUFFile
    from reflex_ipc.testing.synthetic import tensors_gguf
    from reflex_ipc.testing.opchecks import IQ_TYPES, random_weight
    from reflex_ipc.ggml_types import TYPES

    ops = fake_ops
    rng = np.random.default_rng(0)
    specs = {t: (random_weight(t, 64, 512, rng, ref=False)[0], TYPES[t][0], (64, 512)) for t in IQ_TYPES}
    path = tensors_gguf(str(tmp_path / "iq.gguf"), specs)
    with GGUFFile(path) as f:
        for t in IQ_TYPES:
            ops.rt.launches.clear()
            info = f.tensors[t]
            w = ops.load_weight(f, t)
            low = t.lower()
            assert isinstance(w, DeviceWeight) and w.type_name == t and w.row_bytes * 64 == info.nbytes
            assert w.ptr == (1 << 30) + info.offset - f.data_offset  # inside the arena: no copy
            assert MODULE_OF[f"get_rows_{low}"] == "reflex_kernels_iq.fatbin"
            for n, kern in ((1, f"mm1_{low}"), (5, f"mm8_{low}"), (100, f"mma_{low}")):
                x = DeviceArray.empty(ops.pool, (n, 512))
                ops.matmul(x, w)
                assert any(name == kern for name, *_ in ops.rt.launches), (t, n, [k for k, *_ in ops.rt.launches])
            ops.matmul_glu(DeviceArray.empty(ops.pool, (1, 512)), w, w)
            ops.embed(w, DeviceArray.empty(ops.pool, (3,), "int32"))
            names = [name for name, *_ in ops.rt.launches]
            assert f"mmglu1_{low}" in names and f"get_rows_{low}" in names
            assert all(n in MODULE_OF for n in names if n.endswith("_" + low))
