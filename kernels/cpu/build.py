"""Compile the CPU kernels (kernels/cpu/*.c) into one shared library (run by setup.py, or by hand).

    python3 kernels/cpu/build.py [OUT_DIR]      (default: reflex_ipc/kernels/)

The library, libreflex_cpu.so, holds a portable C path for every kernel and, on
x86-64, AVX2+FMA+F16C and AVX-512 VNNI versions of the hot ones, on aarch64 NEON,
dotprod and i8mm versions (each source file compiled with its own -m/-march flags;
ops.c picks one at first use from the CPU's features). Compiler: $CC, else
cc/gcc/clang on PATH; the target is the compiler's (`$CC -dumpmachine`), so
CC=aarch64-linux-gnu-gcc cross-builds the aarch64 library (scripts/aarch64-check). cpu_build.json (next to the
library) records what was built or why nothing was; without a compiler, or when
the compile fails, the build succeeds with a warning and the package falls back
to the numpy backend at run time (reflex_ipc/backends/cpu_ops.py says so once).
REFLEX_CPU_BUILD=strict turns a failed build into an error (CI).

The library's C ABI is declared once, in reflex_ipc/backends/cpu_abi.py; every build first
writes what that table generates (kernels/cpu/rx_abi.h: structs, prototypes, the replay
dispatch; reflex_ipc/backends/cpu_launch.py: the keyword launchers and ctypes types), so the
compiler checks ops.c against it. `python3 kernels/cpu/build.py --abi` writes only those.
"""
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
ABI_TABLE = os.path.join(ROOT, "reflex_ipc", "backends", "cpu_abi.py")
LIB = "libreflex_cpu.so"
BUILD_JSON = "cpu_build.json"
CFLAGS = ["-O3", "-std=c11", "-fPIC", "-fvisibility=hidden", "-fno-math-errno", "-Wall",
          "-Wno-unused-function"]


def find_cc():
    for cc in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cc and shutil.which(cc.split()[0]):
            return cc
    return None


def target(cc=None):
    """The CPU the compiler builds for: `$CC -dumpmachine`'s first field (a cross compiler's
    target, e.g. aarch64 for aarch64-linux-gnu-gcc), else this machine's."""
    if cc:
        try:
            r = subprocess.run([*cc.split(), "-dumpmachine"], capture_output=True, text=True, timeout=30)
            if r.returncode == 0 and r.stdout.strip():
                return r.stdout.strip().split("-")[0].lower()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.machine().lower()


# objects an older compiler may fail to build: the library is then made without them and
# ops.c never picks them (x86: the VNNI one needs -DRX_NO_VNNI in ops.c; aarch64: weak symbols)
OPTIONAL = ("x86_vnni.o", "neon_dotprod.o", "neon_i8mm.o")


def units(machine=None):
    """(source, extra flags, object name) for every translation unit of the target machine."""
    machine = machine or platform.machine().lower()
    # ops.c: every exported function needs its prototype from rx_abi.h (the ABI table)
    out = [("generic.c", [], "generic.o"), ("ops.c", ["-pthread", "-Werror=missing-prototypes"], "ops.o"),
           ("iq.c", [], "iq.o")]
    if machine in ("x86_64", "amd64"):
        isa = ["-mavx2", "-mfma", "-mf16c"]
        out.append(("x86.c", isa, "x86_avx2.o"))
        out.append(("iq_x86.c", isa, "iq_avx2.o"))
        out.append(("x86.c", isa + ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni",
                                    "-DRX_VNNI"], "x86_vnni.o"))
    elif machine in ("aarch64", "arm64"):
        out.append(("neon.c", ["-march=armv8-a"], "neon.o"))
        out.append(("iq_neon.c", ["-march=armv8-a"], "iq_neon.o"))
        out.append(("neon.c", ["-march=armv8.2-a+dotprod", "-DRX_DOTPROD"], "neon_dotprod.o"))
        out.append(("neon.c", ["-march=armv8.2-a+dotprod+i8mm", "-DRX_I8MM"], "neon_i8mm.o"))
    return out


QUANT_TABLES = os.path.join(os.path.dirname(HERE), "quant_tables.h")  # iq*.c include it


def sources():
    return sorted(f for f in os.listdir(HERE) if f.endswith((".c", ".h")))


def abi_table():
    """reflex_ipc/backends/cpu_abi.py, loaded by path (the package need not be importable)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("reflex_cpu_abi_table", ABI_TABLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def write_abi():
    """Write the files the ABI table generates, where they differ; returns the paths written."""
    written = []
    for rel, text in abi_table().outputs().items():
        path = os.path.join(ROOT, rel)
        try:
            with open(path) as fh:
                if fh.read() == text:
                    continue
        except OSError:
            pass
        with open(path, "w") as fh:
            fh.write(text)
        written.append(rel)
    return written


def _write_json(out_dir, info):
    with open(os.path.join(out_dir, BUILD_JSON), "w") as fh:
        json.dump(info, fh, indent=1, sort_keys=True)


def _up_to_date(out_dir):
    lib = os.path.join(out_dir, LIB)
    try:
        t = os.path.getmtime(lib)
    except OSError:
        return False
    here = [os.path.join(HERE, s) for s in sources()] + [os.path.abspath(__file__), ABI_TABLE, QUANT_TABLES]
    return all(os.path.getmtime(p) <= t for p in here)


def build(out_dir=None, force=False, objects_dir=None):
    """Build the library into out_dir; returns the cpu_build.json dict. objects_dir: keep the
    object files there as well (the C kernel test links them: scripts/aarch64-check)."""
    out_dir = out_dir or os.path.join(os.path.dirname(os.path.dirname(HERE)), "reflex_ipc", "kernels")
    os.makedirs(out_dir, exist_ok=True)
    strict = os.environ.get("REFLEX_CPU_BUILD", "") == "strict"
    write_abi()
    if not force and _up_to_date(out_dir):
        with open(os.path.join(out_dir, BUILD_JSON)) as fh:
            return json.load(fh)
    cc = find_cc()
    info = {"built": False, "library": LIB, "machine": platform.machine(), "sources": sources()}
    if cc is None:
        info["reason"] = "no C compiler (set CC, or install gcc)"
        _fail(out_dir, info, strict)
        return info
    info["cc"] = cc
    machine = target(cc)
    info["machine"] = machine
    x86 = machine in ("x86_64", "amd64")
    with tempfile.TemporaryDirectory() as tmp:
        objs = []
        for src, flags, obj in units(machine):
            cmd = [*cc.split(), *CFLAGS, *flags, "-c", os.path.join(HERE, src), "-o", os.path.join(tmp, obj)]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode and obj in OPTIONAL:  # an old compiler: the baseline kernels only
                info.setdefault("skipped", []).append(f"{obj}: {r.stderr.strip()[-400:]}")
                continue
            if r.returncode:
                info["reason"] = f"{' '.join(cmd)}\n{r.stderr[-2000:]}"
                _fail(out_dir, info, strict)
                return info
            objs.append(os.path.join(tmp, obj))
        if x86 and not any(o.endswith("x86_vnni.o") for o in objs):
            info["defines"] = "RX_NO_VNNI"
            r = subprocess.run([*cc.split(), *CFLAGS, "-pthread", "-Werror=missing-prototypes", "-DRX_NO_VNNI", "-c",
                                os.path.join(HERE, "ops.c"), "-o", os.path.join(tmp, "ops.o")],
                               capture_output=True, text=True)
            if r.returncode:
                info["reason"] = r.stderr[-2000:]
                _fail(out_dir, info, strict)
                return info
        tmp_lib = os.path.join(tmp, LIB)
        # -z defs: a function of the ABI table that nothing defines fails here, not at load
        defs = ["-Wl,-z,defs"] if sys.platform.startswith("linux") else []
        cmd = [*cc.split(), "-shared", "-pthread", *objs, "-o", tmp_lib, "-lm", *defs]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            info["reason"] = f"{' '.join(cmd)}\n{r.stderr[-2000:]}"
            _fail(out_dir, info, strict)
            return info
        shutil.move(tmp_lib, os.path.join(out_dir, LIB))
        if objects_dir:
            os.makedirs(objects_dir, exist_ok=True)
            for o in objs:
                shutil.copy(o, objects_dir)
    info["built"] = True
    info["objects"] = [os.path.basename(o) for o in objs]
    _write_json(out_dir, info)
    return info


def _fail(out_dir, info, strict):
    try:
        os.remove(os.path.join(out_dir, LIB))
    except OSError:
        pass
    _write_json(out_dir, info)
    msg = f"reflex-ipc: the CPU kernels were not built: {info['reason']}"
    if strict:
        raise SystemExit(msg)
    print(f"warning: {msg}\n(the cpu device falls back to the numpy backend)", file=sys.stderr)


if __name__ == "__main__":
    args = sys.argv[1:]
    if args == ["--abi"]:
        print("\n".join(write_abi()) or "the generated ABI files are current")
        sys.exit(0)
    objects = None
    if "--objects" in args:  # --objects DIR: keep the object files too
        i = args.index("--objects")
        objects = args[i + 1]
        del args[i:i + 2]
    res = build(args[0] if args else None, force=True, objects_dir=objects)
    print(json.dumps(res, indent=1))
    sys.exit(0 if res.get("built") else 1)
