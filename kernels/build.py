"""Compile the CUDA kernels into their fatbins with nvcc (run by setup.py, or by hand).

    python kernels/build.py [OUT_DIR] [--force]   # build now (needs nvcc)
    python kernels/build.py [OUT_DIR] --auto      # what setup.py does: build only if wanted

kernels/all.cu is the main translation unit (it includes the *.cuh files) -> reflex_kernels.fatbin,
loaded at every start; kernels/iq_all.cu holds the IQ / TQ / MXFP4 formats' kernels ->
reflex_kernels_iq.fatbin, loaded only for a model with such weights (UNITS). Targets:
machine code for sm_75, sm_80, sm_86, sm_89, sm_90 and every newer one the installed
nvcc knows, plus PTX of the newest for forward compatibility. REFLEX_CUDA_ARCHS
(e.g. "90" or "80,90") narrows the list. The fatbin and build.json (what was built,
or why nothing was) go to OUT_DIR (reflex_ipc/kernels/), shipped as package data.

When the package is built (setup.py, --auto) the kernels are built only when something
will use them: REFLEX_BUILD_CUDA=1 builds them (a wheel for distribution: nvcc must then
be there), REFLEX_BUILD_CUDA=0 never does, and unset they are built when nvcc is found
and this machine has an NVIDIA driver (/proc/driver/nvidia or a loadable libcuda.so.1).
Otherwise build.json says why nothing was built and the CUDA backend reports exactly
that; the numpy backend needs no kernels. A kernel that does not compile fails the build.
Every decision and the build's duration are printed on stderr.

Before nvcc runs, the kernels' launchers (reflex_ipc/cuda/launch.py, generated from these
sources by reflex_ipc/cuda/abi.py: each kernel's parameters by name and type) are checked
against the sources: a kernel added or changed without `python -m reflex_ipc.cuda.abi`
fails the build here.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BASE_ARCHS = [75, 80, 86, 89, 90]
NEWER = [100, 103, 110, 120, 121]
FATBIN = "reflex_kernels.fatbin"
BUILD_JSON = "build.json"
MAIN = "all.cu"
# (translation unit, fatbin): the main one first (reflex_ipc/cuda/abi.py's UNITS, checked by
# tests/test_kernels_build.py)
UNITS = ((MAIN, FATBIN), ("iq_all.cu", "reflex_kernels_iq.fatbin"))
FLAGS = ["-O3", "-std=c++17", "--threads", "0"]


def find_nvcc():
    nvcc = os.environ.get("NVCC") or shutil.which("nvcc")
    if not nvcc and os.path.exists("/usr/local/cuda/bin/nvcc"):
        nvcc = "/usr/local/cuda/bin/nvcc"
    return nvcc


def supported_archs(nvcc):
    """BASE_ARCHS and the NEWER ones that this nvcc can generate code for."""
    try:
        out = subprocess.run([nvcc, "--list-gpu-code"], capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return list(BASE_ARCHS)
    have = {int(x[3:]) for x in out.split() if x.startswith("sm_") and x[3:].isdigit()}
    return [a for a in BASE_ARCHS if a in have] + [a for a in NEWER if a in have]


def wanted_archs(nvcc):
    env = os.environ.get("REFLEX_CUDA_ARCHS", "").strip()
    if env:
        try:
            archs = sorted({int(a.strip().replace("sm_", "")) for a in env.replace(";", ",").split(",")
                            if a.strip()})
        except ValueError:
            raise SystemExit(f"REFLEX_CUDA_ARCHS={env!r}: expected numbers like '80,90'") from None
        if archs:
            return archs
    return supported_archs(nvcc)


def nvcc_command(nvcc, archs, out, keep_dir=None, unit=MAIN):
    """keep_dir: nvcc keeps its intermediate files there (the PTX of each target:
    <unit>.compute_<arch>.ptx, e.g. all.compute_90.ptx; the tests read it instead of compiling
    the PTX again)."""
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    gencode.append(f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}")
    keep = ["--keep", "--keep-dir", keep_dir] if keep_dir else []
    return [nvcc, "--fatbin", *FLAGS, *gencode, *keep, "-o", out, os.path.join(HERE, unit)]


def sources():
    return sorted(f for f in os.listdir(HERE) if f.endswith((".cu", ".cuh")) or f == "quant_tables.h")


def _write_json(out_dir, info):
    with open(os.path.join(out_dir, BUILD_JSON), "w") as fh:
        json.dump(info, fh, indent=1, sort_keys=True)


def _up_to_date(out_dir, archs, units=UNITS):
    """True when the fatbins exist, are newer than every source, and were built for `archs`."""
    try:
        with open(os.path.join(out_dir, BUILD_JSON)) as fh:
            info = json.load(fh)
        t = min(os.path.getmtime(os.path.join(out_dir, fat)) for _, fat in units)
    except (OSError, ValueError):
        return False
    newest = max(os.path.getmtime(os.path.join(HERE, s)) for s in sources() + [u for u, _ in units])
    return info.get("built") and info.get("archs") == archs and t >= newest


def _say(msg):
    sys.stderr.write("kernels: " + msg + "\n")
    sys.stderr.flush()


def driver_present():
    """True when this machine has an NVIDIA driver (so the CUDA backend can run here)."""
    if os.path.exists("/proc/driver/nvidia/version"):
        return True
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def wanted():
    """(build?, why): the rule of setup.py's kernel step (see the module docstring)."""
    env = os.environ.get("REFLEX_BUILD_CUDA", "").strip().lower()
    if env in ("1", "yes", "true", "on"):
        return True, "REFLEX_BUILD_CUDA=1"
    if env in ("0", "no", "false", "off"):
        return False, "REFLEX_BUILD_CUDA=0"
    if env:
        raise SystemExit(f"REFLEX_BUILD_CUDA={env!r}: expected 1 or 0")
    if not find_nvcc():
        return False, "nvcc not found"
    if not driver_present():
        return False, "no NVIDIA driver on this machine"
    return True, "nvcc and an NVIDIA driver are present"


def _sources_newer_than(path):
    newest = max(os.path.getmtime(os.path.join(HERE, s)) for s in sources())
    return os.path.getmtime(path) < newest


def _not_built(out_dir, reason):
    for _, fat in UNITS:
        stale = os.path.join(out_dir, fat)
        if os.path.exists(stale):
            os.remove(stale)
    _write_json(out_dir, {"built": False, "reason": reason})


def build_if_wanted(out_dir):
    """setup.py's kernel step: build when wanted(); otherwise keep a current fatbin built
    earlier (by hand or with REFLEX_BUILD_CUDA=1) and say so, or record why there is none."""
    os.makedirs(out_dir, exist_ok=True)
    ok, why = wanted()
    if ok:
        if not find_nvcc():
            raise SystemExit("kernels: REFLEX_BUILD_CUDA=1 but nvcc was not found "
                             "(put it on PATH or set NVCC)")
        return build(out_dir, why=why)
    fat = os.path.join(out_dir, FATBIN)
    try:
        with open(os.path.join(out_dir, BUILD_JSON)) as fh:
            built = json.load(fh).get("built")
    except (OSError, ValueError):
        built = False
    fats = [os.path.join(out_dir, f) for _, f in UNITS]
    if built and all(os.path.exists(f) and not _sources_newer_than(f) for f in fats):
        _say(f"not building the CUDA fatbin ({why}); keeping the current one in {out_dir}")
        return fat
    _say(f"not building the CUDA fatbin ({why}): the package installs without GPU kernels "
         "(the numpy backend needs none); REFLEX_BUILD_CUDA=1 builds them")
    _not_built(out_dir, f"not built when the package was built: {why} "
                        "(REFLEX_BUILD_CUDA=1 builds the kernels)")
    return None


def check_abi():
    """Fail (SystemExit) when reflex_ipc/cuda/launch.py is not what the kernel sources give."""
    import importlib.util

    path = os.path.join(os.path.dirname(HERE), "reflex_ipc", "cuda", "abi.py")
    spec = importlib.util.spec_from_file_location("reflex_cuda_abi_check", path)
    abi = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(abi)
    try:
        abi.check(kernels_dir=HERE, root=os.path.dirname(HERE))
    except abi.AbiError as e:
        raise SystemExit(f"kernels: {e}") from None


def build(out_dir, force=False, why="asked", keep_dir=None, units=UNITS):
    """Build the fatbin into out_dir; returns its path, or None when nvcc is missing.
    keep_dir: keep nvcc's intermediate files there (see nvcc_command). units: (translation
    unit, fatbin) pairs, UNITS unless a test builds units of its own (absolute paths; the
    first one's fatbin is the path returned)."""
    os.makedirs(out_dir, exist_ok=True)
    nvcc = find_nvcc()
    if not nvcc:
        _say("warning: nvcc not found; reflex-ipc installs without CUDA kernels "
             "(the numpy backend still works; --device cuda will say so)")
        _not_built(out_dir, "nvcc was not found when the package was built")
        return None
    archs = wanted_archs(nvcc)
    out = os.path.join(out_dir, units[0][1])
    if not force and _up_to_date(out_dir, archs, units):
        _say(f"CUDA fatbin up to date for sm_{', sm_'.join(map(str, archs))} ({out})")
        return out
    _say(f"building the CUDA fatbin ({why}) with {nvcc} for sm_{', sm_'.join(map(str, archs))} "
         f"+ PTX {archs[-1]}: 15-30 s per target on 2 cores "
         f"(~{(15 * len(archs) + 59) // 60}-{(30 * len(archs) + 59) // 60} min; REFLEX_CUDA_ARCHS=90 builds one target)")
    t0 = time.monotonic()
    check_abi()
    with tempfile.TemporaryDirectory() as tmp:
        if keep_dir:
            os.makedirs(keep_dir, exist_ok=True)
        for unit, fat in units:
            cmd = nvcc_command(nvcc, archs, os.path.join(tmp, fat), keep_dir, unit)
            _say(" ".join(cmd))
            subprocess.run(cmd, check=True)
        for _, fat in units:  # all or nothing
            shutil.move(os.path.join(tmp, fat), os.path.join(out_dir, fat))
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    _write_json(out_dir, {"built": True, "archs": archs, "ptx": archs[-1], "sources": sources(),
                          "fatbins": [fat for _, fat in units],
                          "nvcc": version.strip().splitlines()[-1] if version.strip() else "unknown"})
    sizes = ", ".join(f"{fat} {os.path.getsize(os.path.join(out_dir, fat)) / 1e6:.1f} MB" for _, fat in units)
    _say(f"built {out_dir}: {sizes} in {time.monotonic() - t0:.0f} s")
    return out


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a not in ("--force", "--auto")]
    dest = args[0] if args else os.path.join(HERE, "..", "reflex_ipc", "kernels")
    if "--auto" in sys.argv:
        print(build_if_wanted(dest))
    else:
        print(build(dest, force="--force" in sys.argv))
