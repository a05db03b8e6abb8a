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


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_the_gpu_check_runs(backend):
    """opchecks.check_iq (scripts/gpu/gpu-check's iq section) passes on the numpy and cpu backends
    (where it checks their paths, the cpu one with its int8 activation bound): the code the GPU
    host runs is exercised here first."""
    from reflex_ipc.testing import opchecks

    if backend == "numpy":
        from reflex_ipc.backends.numpy_ops import NumpyOps as Ops
    else:
        from reflex_ipc.backends.cpu_ops import CpuOps as Ops
    rows = opchecks.check_iq(Ops(), np.random.default_rng(0))
    assert {r["op"] for r in rows} >= {"iq_matmul", "iq_matmul_n", "iq_matmul_glu", "iq_get_rows", "iq_moe",
                                       "iq_rms_norm_matmul_n", "iq_rms_norm_matmul_glu", "iq_head_matmul"}
    assert {r["case"].split()[0] for r in rows} == set(FORMATS)
    bad = [r for r in rows if not r["ok"]]
    assert not bad, bad[:3]
