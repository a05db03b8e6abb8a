"""The aarch64 CPU kernels (kernels/cpu/neon.c) on this machine, under emulation: runs
scripts/aarch64-check, which cross-builds the library with Debian's gcc-aarch64-linux-gnu,
runs the C kernel test (tests/c/kernel_check.c: every table bit-identical to the portable
path, per format, and the table ops.c picks) on three emulated CPUs under qemu-aarch64, then
tests/test_cpu_ops.py's kernel and model tests in Debian's arm64 python3.11 under qemu.
The script installs the two Debian packages when they are missing (root or sudo); where it
cannot, the test is skipped with the reason, except in CI (the CI variable set, as
conftest's optional inputs), where it fails.
"""

import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_aarch64_kernels_and_models_under_qemu():
    r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "aarch64-check"), "all"], capture_output=True,
                       text=True, timeout=3600, cwd=ROOT)
    out = r.stdout + r.stderr
    if r.returncode == 2 and "needs gcc-aarch64-linux-gnu" in out:
        msg = f"{out.strip().splitlines()[-1]} (apt-get install gcc-aarch64-linux-gnu qemu-user)"
        if os.environ.get("CI"):
            pytest.fail(f"{msg}. CI runs this test", pytrace=False)
        pytest.skip(msg)
    assert r.returncode == 0, out[-6000:]
    # the C test on each emulated CPU, then pytest's line for the Python tests
    assert out.count(" passed, 0 failed") == 3, out[-6000:]
    for isa in ("neon", "dotprod", "i8mm"):
        assert f"ops.c picks {isa}, expected {isa}" in out
    assert " passed" in out.strip().splitlines()[-1] and "failed" not in out.strip().splitlines()[-1], out[-3000:]
