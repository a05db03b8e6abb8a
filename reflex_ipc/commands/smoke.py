"""reflex smoke: load the kernel fatbin, launch one kernel, check its answer, and report
which image the driver chose and the time from process start to the result.

Exit 0: the kernel ran and was right. 3: CUDA is not available here (no pycuda, no
driver, no GPU): nothing to test; the CPU backend does not use the kernels.
1: CUDA is available and the check failed."""

import json
import os
import sys


EXAMPLES = """\
  reflex smoke                 (exit 0: a kernel ran and was right; 3: no CUDA here)
  reflex smoke --json"""


def add_arguments(parser):
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--device-index", type=int, default=0, metavar="N",
                        help="the GPU to use (default 0)")


def run(args) -> int:
    from .. import cuda, phases

    cuda.start_init(args.device_index)  # first: overlaps the numpy import below
    import numpy as np

    report = {"ok": False}
    if not cuda.pycuda_installed():
        report.update(cuda_available=False, error="pycuda is not installed")
        return _report(args, report)
    try:
        rt = cuda.runtime()
        phases.mark("cuda_ready")
        n = 100_003
        x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
        x[77_777] = 1e6
        dx = rt.drv.mem_alloc(x.nbytes)
        dout = rt.drv.mem_alloc(4)
        rt.drv.memcpy_htod(dx, x)
        rt.kernel("argmax_f32")((1, 1, 1), (1024, 1, 1), x=int(dx), n=n, out=int(dout))
        got = np.empty(1, np.int32)
        rt.drv.memcpy_dtoh_async(got, dout, rt.stream)
        rt.stream.synchronize()
        ms = phases.mark("smoke_result")
        binary = rt.loaded_binary_version("argmax_f32")
        sm = [i["arch"] for i in rt.images if i["kind"] == "sm"]
        report.update({
            "ok": int(got[0]) == 77_777,
            "result": int(got[0]), "expected": 77_777,
            "device": rt.name, "compute_capability": "%d.%d" % rt.cc,
            "image": rt.image, "loaded_binary_version": binary,
            "jit": binary not in sm,
            "fatbin_images": [f"{i['kind']}_{i['arch']}" for i in rt.images],
            "process_start_to_result_ms": round(ms, 2),
            "init": {k: round(v, 2) for k, v in cuda.init_timings().items()},
            "phases": phases.snapshot(),
        })
    except Exception as e:
        report["error"] = f"{type(e).__name__}: {getattr(e, 'message', None) or e}"
        report["cuda_available"] = not _no_cuda(e)
    return _report(args, report)


def _no_cuda(e) -> bool:
    """Whether the failure says CUDA is absent (no driver, no device) rather than broken."""
    text = f"{type(e).__name__}: {getattr(e, 'message', None) or e}".lower()
    return any(s in text for s in ("no cuda-capable device", "cuda_error_no_device",
                                   "libcuda", "cuinit failed", "no device", "driver"))


def _report(args, report) -> int:
    absent = report.get("cuda_available") is False
    if args.json:
        sys.stdout.write(json.dumps(report) + "\n")
    else:
        if report["ok"]:
            print(f"ok: {report['device']} (cc {report['compute_capability']}), image {report['image']}"
                  f"{' (JIT!)' if report['jit'] else ''}, argmax correct, "
                  f"{report['process_start_to_result_ms']} ms from process start")
        elif absent:
            print(f"CUDA is not available here ({report['error']}): nothing to test. The CPU "
                  "backend does not use these kernels; `reflex doctor` checks the CPU path.")
        else:
            print("FAILED: " + report.get("error", f"argmax gave {report.get('result')}"))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if report["ok"] else 3 if absent else 1)  # driver teardown stays off the clock
