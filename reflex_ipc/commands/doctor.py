"""reflex doctor: what reflex would use here. The CPU path (numpy, the default model, the
backend `--device auto` would pick) and what the CUDA backend would find: GPU, driver,
pycuda, the kernel images in the package and the one the driver would load, NVML.

Exit 0 when a model can run here (the CPU path is enough: no GPU is not a failure);
1 when it cannot (numpy missing, the default model not found)."""

import json
import os
import platform
import sys


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


def _cpu():
    """numpy and the default model: what every backend needs."""
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
    out["ok"] = "version" in out["numpy"] and "path" in out["default_model"]
    return out


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
    # what --device auto picks (engine.make_backend): CUDA when it starts, else numpy
    rep["auto_backend"] = "cuda" if rep["cuda"].get("ok") else "numpy"
    rep["ok"] = rep["cpu"]["ok"]
    return rep


def run(args) -> int:
    from .. import cuda

    cuda.start_init()
    rep = collect()
    if args.json:
        sys.stdout.write(json.dumps(rep) + "\n")
    else:
        k = rep["kernels"]
        cpu = rep["cpu"]
        print(f"python    {rep['python']} on {rep['platform']}")
        print(f"numpy     {cpu['numpy'].get('version') or 'MISSING: ' + cpu['numpy']['error']}")
        dm = cpu["default_model"]
        print(f"model     {dm['name'] + ' = ' + dm['path'] if 'path' in dm else 'NOT FOUND: ' + dm['error']}")
        print(f"auto      --device auto uses the {rep['auto_backend']} backend"
              + ("" if rep["auto_backend"] == "cuda" else " (CPU; CUDA is unavailable, see below)"))
        print(f"kernels   {'built for ' + ', '.join(k.get('images', [])) if k['built'] else 'NOT BUILT: ' + k.get('reason', '')}")
        print(f"pycuda    {rep['pycuda'].get('version') or rep['pycuda'].get('error')}")
        nv = rep["nvml"]
        if nv.get("available"):
            for g in nv.get("gpus", []):
                print(f"nvml      GPU {g['index']}: {g['name']}, {g['memory_total_mib']} MiB, driver {nv.get('driver')}")
        else:
            print(f"nvml      unavailable ({nv.get('error')})")
        c = rep["cuda"]
        if c["ok"]:
            print(f"cuda      {c['device']} cc {c['compute_capability']}, driver API {c['driver_version']}, "
                  f"loads {c['image']} (binary version {c['loaded_binary_version']})")
        else:
            print(f"cuda      unavailable: {c['error']}")
        print("ok: a model can run here" if rep["ok"] else "NOT OK: no model can run here")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if rep["ok"] else 1)  # driver teardown stays off the clock
