"""Compile the CUDA kernels into one fatbin with nvcc (run by setup.py, or by hand).

    python kernels/build.py [OUT_DIR]

kernels/all.cu is the one translation unit (it includes the *.cuh files). Targets:
machine code for sm_75, sm_80, sm_86, sm_89, sm_90 and every newer one the installed
nvcc knows, plus PTX of the newest for forward compatibility. REFLEX_CUDA_ARCHS
(e.g. "90" or "80,90") narrows the list. The fatbin and build.json (what was built,
or why nothing was) go to OUT_DIR (reflex_ipc/kernels/), shipped as package data.

Without nvcc the build succeeds with a warning and build.json says the kernels were
not built; the CUDA backend then reports exactly that. A kernel that does not compile
fails the build.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
BASE_ARCHS = [75, 80, 86, 89, 90]
NEWER = [100, 103, 110, 120, 121]
FATBIN = "reflex_kernels.fatbin"
BUILD_JSON = "build.json"
MAIN = "all.cu"
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


def nvcc_command(nvcc, archs, out):
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    gencode.append(f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}")
    return [nvcc, "--fatbin", *FLAGS, *gencode, "-o", out, os.path.join(HERE, MAIN)]


def sources():
    return sorted(f for f in os.listdir(HERE) if f.endswith((".cu", ".cuh")))


def _write_json(out_dir, info):
    with open(os.path.join(out_dir, BUILD_JSON), "w") as fh:
        json.dump(info, fh, indent=1, sort_keys=True)


def _up_to_date(out_dir, archs):
    """True when the fatbin exists, is newer than every source, and was built for `archs`."""
    fat = os.path.join(out_dir, FATBIN)
    try:
        with open(os.path.join(out_dir, BUILD_JSON)) as fh:
            info = json.load(fh)
        t = os.path.getmtime(fat)
    except (OSError, ValueError):
        return False
    newest = max(os.path.getmtime(os.path.join(HERE, s)) for s in sources())
    return info.get("built") and info.get("archs") == archs and t >= newest


def build(out_dir, force=False):
    """Build the fatbin into out_dir; returns its path, or None when nvcc is missing."""
    os.makedirs(out_dir, exist_ok=True)
    nvcc = find_nvcc()
    if not nvcc:
        sys.stderr.write("warning: nvcc not found; reflex-ipc installs without CUDA kernels "
                         "(the numpy backend still works; --device cuda will say so)\n")
        stale = os.path.join(out_dir, FATBIN)
        if os.path.exists(stale):
            os.remove(stale)
        _write_json(out_dir, {"built": False, "reason": "nvcc was not found when the package was built"})
        return None
    archs = wanted_archs(nvcc)
    out = os.path.join(out_dir, FATBIN)
    if not force and _up_to_date(out_dir, archs):
        return out
    with tempfile.TemporaryDirectory() as tmp:
        cmd = nvcc_command(nvcc, archs, os.path.join(tmp, FATBIN))
        sys.stderr.write("kernels: " + " ".join(cmd) + "\n")
        subprocess.run(cmd, check=True)
        shutil.move(os.path.join(tmp, FATBIN), out)
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    _write_json(out_dir, {"built": True, "archs": archs, "ptx": archs[-1], "sources": sources(),
                          "nvcc": version.strip().splitlines()[-1] if version.strip() else "unknown"})
    return out


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--force"]
    print(build(args[0] if args else os.path.join(HERE, "..", "reflex_ipc", "kernels"),
                force="--force" in sys.argv))
