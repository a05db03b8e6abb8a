"""The CUDA kernels' readers of the IQ / TQ / MXFP4 blocks (kernels/iq_deq.cuh), compiled on the
host by the C++ compiler (the file is plain C++ outside nvcc) and run chunk by chunk as the
kernels run them (deq8: elements 8c..8c+7 of a block): every value bit for bit
reflex_ipc/quants.py's (itself bit for bit gguf-py's), on random blocks with sane scales and on
fully random bytes (inf / nan / subnormal scales; a nan there matches any nan). The GPU itself runs the same source; its
matmuls are checked against numpy by reflex_ipc/testing/opchecks.py (scripts/gpu/gpu-check)."""

import os
import shutil
import subprocess

import numpy as np
import pytest

from reflex_ipc.ggml_types import TYPES
from reflex_ipc.quants import dequantize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORMATS = ["IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0",
           "MXFP4"]
F16_AT = {"IQ2_XXS": 0, "IQ2_XS": 0, "IQ2_S": 0, "IQ3_XXS": 0, "IQ3_S": 0, "IQ1_S": 0, "IQ4_NL": 0, "IQ4_XS": 0,
          "TQ1_0": 52, "TQ2_0": 64}


@pytest.fixture(scope="module")
def checker(tmp_path_factory):
    cxx = next((c for c in (os.environ.get("CXX"), "c++", "g++", "clang++") if c and shutil.which(c)), None)
    assert cxx, "no C++ compiler (c++, g++ or clang++) to build tests/c/iq_deq_check.cc"
    exe = str(tmp_path_factory.mktemp("iqdeq") / "iq_deq_check")
    r = subprocess.run([cxx, "-O2", "-std=c++17", "-Wall", "-Werror", os.path.join(ROOT, "tests", "c", "iq_deq_check.cc"),
                        "-o", exe], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return exe


def run(exe, tid, raw, n):
    data = np.array([tid, n], "<i4").tobytes() + raw.tobytes()
    r = subprocess.run([exe], input=data, capture_output=True)
    assert r.returncode == 0, r.returncode
    return np.frombuffer(r.stdout, np.float32)


def blocks(name, n, rng, sane):
    tid, blk, bsize = TYPES[name]
    b = rng.integers(0, 256, (n, bsize), dtype=np.uint8)
    if sane:
        d = (rng.standard_normal(n) * 10.0 ** rng.integers(-5, 2, n)).astype("<f2")
        if name in F16_AT:
            b[:, F16_AT[name]:F16_AT[name] + 2] = d.view(np.uint8).reshape(n, 2)
        elif name == "IQ1_M":
            h = d.view("<u2").astype(np.uint16)
            sc = np.ascontiguousarray(b[:, 48:56]).view("<u2") & np.uint16(0x0FFF)
            for k in range(4):
                sc[:, k] |= ((h >> (4 * k)) & 0xF) << 12
            b[:, 48:56] = sc.view(np.uint8)
        elif name == "MXFP4":
            b[:, 0] = rng.integers(100, 140, n)
    return b.reshape(-1)


@pytest.mark.parametrize("sane", [True, False])
@pytest.mark.parametrize("name", FORMATS)
def test_chunks_match_quants(checker, name, sane):
    rng = np.random.default_rng(hash((name, sane)) % 2**32)
    tid, blk, _ = TYPES[name]
    n = 700
    raw = blocks(name, n, rng, sane)
    got = run(checker, tid, raw, n)
    with np.errstate(all="ignore"):
        want = dequantize(raw, tid, n * blk)
    assert got.shape == want.shape
    # a nan is any nan: the compiler may turn ggml's product by -1 into a negation (the sign of a
    # nan then differs), and the GPU writes its canonical nan
    bad = np.flatnonzero((got.view(np.uint32) != want.view(np.uint32)) & ~(np.isnan(got) & np.isnan(want)))
    assert bad.size == 0, f"{name}: {bad.size} values differ, first at {bad[0]}: {got[bad[0]]!r} != {want[bad[0]]!r}"


@pytest.mark.parametrize("backend", ["numpy", "numpy-grouped", "cpu"])
def test_the_gpu_check_runs(backend):
    """opchecks.check_iq (scripts/gpu/gpu-check's iq section) passes on the numpy and cpu backends
    (where it checks their paths, the cpu one with its int8 activation bound): the code the GPU
    host runs is exercised here first. numpy-grouped: numpy dressed as a backend whose moe has a
    grouped prefill path from 32 tokens (CUDA's moe_mma): those rows appear, and a call that did
    not take the path fails them."""
    from reflex_ipc.testing import opchecks

    if backend == "cpu":
        from reflex_ipc.backends.cpu_ops import CpuOps as Ops
    else:
        from reflex_ipc.backends.numpy_ops import NumpyOps as Ops
    if backend == "numpy-grouped":
        class Grouped(Ops):
            moe_mma, moe_mma_min_n, moe_mma_launches = True, 32, 0

            def moe(self, x, *a, **kw):
                self.moe_mma_launches += x.shape[0] >= self.moe_mma_min_n
                return super().moe(x, *a, **kw)
        Ops = Grouped
    rows = opchecks.check_iq(Ops(), np.random.default_rng(0))
    assert {r["op"] for r in rows} >= {"iq_matmul", "iq_matmul_n", "iq_matmul_glu", "iq_get_rows", "iq_moe",
                                       "iq_rms_norm_matmul_n", "iq_rms_norm_matmul_glu", "iq_head_matmul",
                                       "iq_mla_prefill"}
    assert {r["case"].split()[0] for r in rows if r["op"] != "iq_mla_prefill"} == set(FORMATS)
    assert {r["case"].split()[1] for r in rows if r["op"] == "iq_mla_prefill"} == {"IQ4_NL", "MXFP4"}
    grouped = [r for r in rows if r["case"].endswith(" grouped")]
    assert len(grouped) == (2 * len(FORMATS) if backend == "numpy-grouped" else 0)
    bad = [r for r in rows if not r["ok"]]
    assert not bad, bad[:3]
    if backend == "numpy-grouped":  # a backend whose calls never take the path
        class Missed(Ops):
            def moe(self, x, *a, **kw):
                from reflex_ipc.backends.numpy_ops import NumpyOps

                return NumpyOps.moe(self, x, *a, **kw)

        rows = opchecks.check_iq(Missed(), np.random.default_rng(0))
        assert all(not r["ok"] for r in rows if r["case"].endswith(" grouped"))


def test_every_format_family_has_the_iq_kernels():
    """Each kernel family made per weight format (those named <family>_q8_0) has a kernel of
    every IQ / TQ / MXFP4 format, in the IQ fatbin, except matvec.cuh's bandwidth matvecs and the
    MoE decode kernels on their layout (mv*, moe_mv*: four formats only, cuda_ops.MV_KERNEL;
    the backend takes them only for those): a path the backend takes for Q8_0 weights (the
    grouped MoE GEMMs, attn_k_b's transpose for the MLA prefill, ...) cannot meet a missing
    kernel with IQ weights."""
    from reflex_ipc.backends.cuda_ops import IQ_KERNEL, MV_KERNEL
    from reflex_ipc.cuda.core import KERNELS
    from reflex_ipc.cuda.launch import MODULE_OF

    families = {n[:-len("_q8_0")] for n in KERNELS if n.endswith("_q8_0")}
    assert {"mma_moe", "mmaglu_moe", "mla_kb_t", "moe_glu", "mma", "get_rows"} <= families
    mv = {f for f in families if f.startswith(("mv", "moe_mv"))}
    assert mv
    assert set(MV_KERNEL.values()) == {"q4_k", "q5_k", "q6_k", "q8_0"}
    missing = [f"{f}_{s}" for f in sorted(families - mv) for s in IQ_KERNEL.values() if f"{f}_{s}" not in KERNELS]
    assert not missing, missing
    assert {MODULE_OF[f"{f}_{s}"] for f in families - mv for s in IQ_KERNEL.values()} == {"reflex_kernels_iq.fatbin"}
    assert not any(f"{f}_{s}" in KERNELS for f in mv for s in IQ_KERNEL.values())


def test_gpu_check_iq_covers_every_format():
    """scripts/gpu/gpu_check_iq.py (gpu-check's iq section) imports without a GPU, and its
    model files and opchecks.check_iq cover every format of cuda_ops.IQ_KERNEL."""
    import importlib.util

    from reflex_ipc.backends.cuda_ops import IQ_KERNEL
    from reflex_ipc.ggml_types import type_name
    from reflex_ipc.testing import opchecks

    spec = importlib.util.spec_from_file_location("gpu_check_iq", os.path.join(ROOT, "scripts", "gpu", "gpu_check_iq.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    names = {type_name(t) for t in IQ_KERNEL}
    assert set(mod.FORMATS) == set(opchecks.IQ_TYPES) == set(FORMATS) == names
    assert mod.IQ_FATBIN == "reflex_kernels_iq.fatbin"
