"""Compile kernels/*.cu into one fatbin with nvcc (run by setup.py, or by hand).

    python kernels/build.py [OUT_DIR]

Targets: machine code for sm_75, sm_80, sm_86, sm_89, sm_90 and any newer the
installed nvcc knows, plus PTX of the newest for forward compatibility.
REFLEX_CUDA_ARCHS (e.g. "90" or "80,90") narrows the list. Without nvcc the
build succeeds with a warning and the package has no kernels.
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


def find_nvcc():
    nvcc = os.environ.get("NVCC") or shutil.which("nvcc")
    if not nvcc and os.path.exists("/usr/local/cuda/bin/nvcc"):
        nvcc = "/usr/local/cuda/bin/nvcc"
    return nvcc


def supported_archs(nvcc):
    try:
        out = subprocess.run([nvcc, "--list-gpu-code"], capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return BASE_ARCHS
    have = {int(x.split("_")[1]) for x in out.split() if x.startswith("sm_") and x[3:].isdigit()}
    return [a for a in BASE_ARCHS + NEWER if a in have]


def wanted_archs(nvcc):
    env = os.environ.get("REFLEX_CUDA_ARCHS")
    if env:
        return [int(a) for a in env.replace(";", ",").split(",") if a.strip()]
    return supported_archs(nvcc)


def build(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    sources = sorted(f for f in os.listdir(HERE) if f.endswith(".cu"))
    nvcc = find_nvcc()
    if not sources:
        return None
    if not nvcc:
        sys.stderr.write("warning: nvcc not found; reflex-ipc installs without CUDA kernels "
                         "(the numpy backend still works)\n")
        return None
    archs = wanted_archs(nvcc)
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    gencode.append(f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}")
    out = os.path.join(out_dir, FATBIN)
    with tempfile.TemporaryDirectory() as tmp:
        # one translation unit: kernels/all.cu includes the others if present
        main = "all.cu" if "all.cu" in sources else None
        srcs = [os.path.join(HERE, main)] if main else [os.path.join(HERE, s) for s in sources]
        cmd = [nvcc, "--fatbin", "-O3", "-std=c++17", "--use_fast_math", "-lineinfo",
               *gencode, "-o", os.path.join(tmp, FATBIN), *srcs]
        sys.stderr.write("kernels: " + " ".join(cmd) + "\n")
        subprocess.run(cmd, check=True)
        shutil.move(os.path.join(tmp, FATBIN), out)
    with open(os.path.join(out_dir, "build.json"), "w") as fh:
        json.dump({"archs": archs, "ptx": archs[-1], "sources": sources,
                   "nvcc": subprocess.run([nvcc, "--version"], capture_output=True,
                                          text=True).stdout.strip().splitlines()[-1]}, fh)
    return out


if __name__ == "__main__":
    print(build(sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "reflex_ipc", "kernels")))
