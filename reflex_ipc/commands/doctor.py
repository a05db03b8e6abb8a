"""reflex doctor: what reflex would use here. The backend `--device auto` picks and why;
the CPU side (numpy, the default model, the C kernels: the ISA path they chose and their
threads); and what the CUDA backend would find: GPU, driver, pycuda, the CUDA kernel
images (fatbin) in the package and the one the driver would load, NVML.

Exit 0 when a model can run here (the CPU path is enough: no GPU is not a failure);
1 when it cannot (numpy missing, the default model not found)."""

import json
import os
import platform
import sys


EXAMPLES = """\
  reflex doctor                (exit 0 when a model can run here, GPU or not)
  reflex doctor --json"""


def add_arguments(parser):
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _nvml():
    """GPU names, memory and driver from NVML through ctypes (no extra package)."""
    import ctypes

    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as e:
        return {"available": False, "error": str(e)}
    out = {"available": True}
    try:
        if lib.nvmlInit_v2() != 0:
            return {"available": False, "error": "nvmlInit failed"}
        buf = ctypes.create_string_buffer(96)
        if lib.nvmlSystemGetDriverVersion(buf, 96) == 0:
            out["driver"] = buf.value.decode()
        n = ctypes.c_uint()
        lib.nvmlDeviceGetCount_v2(ctypes.byref(n))
        gpus = []
        for i in range(n.value):
            h = ctypes.c_void_p()
            if lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)) != 0:
                continue
            name = ctypes.create_string_buffer(96)
            lib.nvmlDeviceGetName(h, name, 96)

            class Mem(ctypes.Structure):
                _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                            ("used", ctypes.c_ulonglong)]

            mem = Mem()
            lib.nvmlDeviceGetMemoryInfo(h, ctypes.byref(mem))
            mw = ctypes.c_uint()
            power = lib.nvmlDeviceGetPowerUsage(h, ctypes.byref(mw)) == 0
            gpus.append({"index": i, "name": name.value.decode(), "memory_total_mib": mem.total >> 20,
                         "memory_used_mib": mem.used >> 20,
                         "power_w": round(mw.value / 1000, 1) if power else None})
        out["gpus"] = gpus
        lib.nvmlShutdown()
    except Exception as e:  # NVML is advisory here
        out["error"] = str(e)
    return out


def _cpu_features():
    """The x86 features the C kernels choose their path by (Linux /proc/cpuinfo), else None."""
    try:
        with open("/proc/cpuinfo") as fh:
            flags = next((ln.split(":", 1)[1].split() for ln in fh if ln.startswith("flags")), [])
    except OSError:
        return None
    want = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni")
    return [f for f in want if f in flags] if flags else None


def _cpu_library():
    """The C kernels (the cpu backend): whether the library loads, the ISA path it picked
    (REFLEX_CPU_ISA may force one), the threads it would use ($REFLEX_CPU_THREADS, else the
    physical cores) and the build record."""
    out = {}
    try:
        from ..backends import cpu_ops

        out["path"] = cpu_ops.library_path()
        ok, what = cpu_ops.available()
        out["ok"] = ok
        if ok:
            from .. import settings

            st = settings.get()
            out["isa"] = what
            out["threads"] = st.cpu_threads or cpu_ops.physical_cores()
            out["threads_from"] = "$REFLEX_CPU_THREADS" if st.cpu_threads else "the physical cores"
            if st.cpu_isa != "auto":
                out["isa_forced_by"] = f"REFLEX_CPU_ISA={st.cpu_isa}"
        else:
            out["error"] = what
        try:
            with open(os.path.join(os.path.dirname(out["path"]), "cpu_build.json")) as fh:
                b = json.load(fh)
            out["build"] = {k: b[k] for k in ("cc", "objects", "reason") if k in b}
        except (OSError, ValueError):
            pass
    except Exception as e:  # numpy missing, say: _cpu reports that
        out.update(ok=False, error=f"{type(e).__name__}: {e}")
    out["cpu_features"] = _cpu_features()
    return out


def _cpu():
    """numpy, the default model and the C kernels: what the CPU backends need."""
    out = {}
    try:
        import numpy

        out["numpy"] = {"version": numpy.__version__}
    except Exception as e:
        out["numpy"] = {"error": f"{type(e).__name__}: {e}"}
    try:
        from ..modelpath import DEFAULT_ALIAS, resolve_model

        from .. import settings

        out["default_model"] = {"name": settings.get().model or DEFAULT_ALIAS,
                                "path": resolve_model(None)}
    except Exception as e:
        out["default_model"] = {"error": getattr(e, "message", None) or str(e)}
    out["library"] = _cpu_library()
    out["ok"] = "version" in out["numpy"] and "path" in out["default_model"]
    return out


def auto_choice(rep) -> tuple:
    """(backend, why) that --device auto picks, by engine.make_backend's rule: CUDA when
    pycuda imports and the CUDA runtime starts with the kernels, else the C kernels (cpu),
    else numpy."""
    c, lib = rep["cuda"], rep["cpu"]["library"]
    if c.get("ok"):
        return "cuda", f"CUDA started on {c['device']}"
    if "error" in rep["pycuda"]:
        why = "pycuda is not installed (the cuda extra)"
    else:
        why = f"CUDA is unavailable: {c.get('error')}"
    if lib.get("ok"):
        return "cpu", f"{why}; the C kernels load ({lib['isa']}, {lib['threads']} threads)"
    return "numpy", f"{why}; the C kernels do not load: {lib.get('error')}"


def collect():
    from .. import cuda
    from ..cuda.fatbin import FatbinError, chosen_image, read_images

    rep = {"python": platform.python_version(), "platform": platform.platform()}
    info = cuda.build_info()
    rep["kernels"] = {"built": bool(info.get("built")), **{k: v for k, v in info.items() if k != "built"}}
    images = []
    if info.get("built"):
        try:
            images = read_images(cuda.FATBIN_PATH)
            rep["kernels"]["images"] = [f"{i['kind']}_{i['arch']}" for i in images]
            rep["kernels"]["fatbin_bytes"] = os.path.getsize(cuda.FATBIN_PATH)
            # the other fatbins (the IQ / TQ / MXFP4 formats'), loaded when a model needs them
            for fat in info.get("fatbins", [])[1:]:
                p = os.path.join(cuda.KERNEL_DIR, fat)
                rep["kernels"].setdefault("other_fatbin_bytes", {})[fat] = (
                    os.path.getsize(p) if os.path.exists(p) else "missing")
        except (OSError, FatbinError) as e:
            rep["kernels"]["error"] = str(e)
    try:
        import pycuda

        rep["pycuda"] = {"version": getattr(pycuda, "VERSION_TEXT", None) or str(getattr(pycuda, "VERSION", "?"))}
    except Exception as e:
        rep["pycuda"] = {"error": f"{type(e).__name__}: {e}"}
    rep["nvml"] = _nvml()
    try:
        rt = cuda.runtime()
        rep["cuda"] = {"ok": True, "device": rt.name, "compute_capability": "%d.%d" % rt.cc,
                       "driver_version": rt.drv.get_driver_version(),
                       "image": chosen_image(images, rt.cc) if images else rt.image,
                       "loaded_binary_version": rt.loaded_binary_version(),
                       "memory": rt.mem_info(), "init": cuda.init_timings()}
    except Exception as e:
        rep["cuda"] = {"ok": False, "error": getattr(e, "message", None) or str(e)}
    rep["cpu"] = _cpu()
    rep["auto_backend"], rep["auto_reason"] = auto_choice(rep)
    rep["ok"] = rep["cpu"]["ok"]
    return rep


def _text(rep):
    k, cpu, c = rep["kernels"], rep["cpu"], rep["cuda"]
    lib = cpu["library"]
    dm = cpu["default_model"]
    lines = [f"python      {rep['python']} on {rep['platform']}",
             f"numpy       {cpu['numpy'].get('version') or 'MISSING: ' + cpu['numpy']['error']}",
             f"model       {dm['name'] + ' = ' + dm['path'] if 'path' in dm else 'NOT FOUND: ' + dm['error']}",
             f"auto        --device auto runs the {rep['auto_backend']} backend: {rep['auto_reason']}",
             "", "CPU (--device cpu: the C kernels; --device numpy: the float32 oracle)"]
    if lib.get("ok"):
        lines.append(f"  C kernels   {lib['path']}")
        lines.append(f"  path        {lib['isa']}" + (f" (forced by {lib['isa_forced_by']})"
                                                     if lib.get("isa_forced_by") else ""))
        lines.append(f"  threads     {lib['threads']} (" + ("from $REFLEX_CPU_THREADS)" if lib["threads_from"].startswith("$")
                                                    else "the physical cores; $REFLEX_CPU_THREADS sets it)"))
    else:
        lines.append(f"  C kernels   NOT LOADED: {lib.get('error')}; --device cpu runs numpy instead")
    if lib.get("cpu_features") is not None:
        lines.append(f"  CPU flags   {' '.join(lib['cpu_features']) or 'none of avx2/avx512'}")
    lines += ["", "CUDA (--device cuda)"]
    lines.append(f"  pycuda      {rep['pycuda'].get('version') or rep['pycuda'].get('error')}")
    nv = rep["nvml"]
    if nv.get("available"):
        for g in nv.get("gpus", []):
            lines.append(f"  GPU {g['index']}       {g['name']}, {g['memory_total_mib']} MiB, driver {nv.get('driver')}")
    else:
        lines.append(f"  NVML        unavailable ({nv.get('error')})")
    lines.append("  fatbin      " + ("built for " + ", ".join(k.get("images", [])) if k["built"]
                                    else "not built (the CUDA kernels; the CPU backends do not need "
                                         "them): " + k.get("reason", "")))
    if c["ok"]:
        lines.append(f"  runtime     {c['device']} cc {c['compute_capability']}, driver API "
                     f"{c['driver_version']}, loads {c['image']} (binary version {c['loaded_binary_version']})")
    else:
        lines.append(f"  runtime     unavailable: {c['error']}")
    lines += ["", "ok: a model can run here" if rep["ok"] else "NOT OK: no model can run here"]
    return "\n".join(lines) + "\n"


def run(args) -> int:
    from .. import cuda

    cuda.start_init()
    rep = collect()
    sys.stdout.write(json.dumps(rep) + "\n" if args.json else _text(rep))
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        pass
    sys.stderr.flush()
    os._exit(0 if rep["ok"] else 1)  # driver teardown stays off the clock
