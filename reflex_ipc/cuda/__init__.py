"""CUDA start-up: the ahead-of-time kernels, a background init thread, the runtime.

Importing this package is cheap (no pycuda, no numpy). `start_init()` begins, on a
daemon thread, everything CUDA needs before the first kernel: importing pycuda,
cuInit, retaining the device's primary context (about 0.23 s on an H200 host), and
loading the fatbin with module_from_buffer. Call it first thing in the process so
that the work overlaps the heavy imports, the GGUF parse and the tokenizer; later
`runtime()` joins the thread and makes the context current in the calling thread.

Nothing is compiled at run time: the module is the fatbin nvcc built with the
package (kernels/build.py), holding machine code for each supported architecture.

For the engine: `start_init(index)` as early as possible (cli.py does it for the model
commands unless --device cpu), then `reflex_ipc.backends.cuda_ops.CudaOps()` (which
joins it; engine.make_backend picks the backend for a --device value).
"""

import os
import sys
import threading
import time

KERNEL_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "kernels")
FATBIN_PATH = os.path.join(KERNEL_DIR, "reflex_kernels.fatbin")
BUILD_JSON = os.path.join(KERNEL_DIR, "build.json")

_lock = threading.Lock()
_thread = None
_result = {}  # "runtime" or "error", plus "timings"


def build_info() -> dict:
    """What kernels/build.py recorded: {"built": bool, "archs", "ptx", "nvcc"} or a reason."""
    import json  # not at module level: this module is imported before cuInit starts

    try:
        with open(BUILD_JSON) as fh:
            info = json.load(fh)
    except (OSError, ValueError):
        info = {"built": False, "reason": "the package was installed without running the kernel build"}
    if info.get("built") and not os.path.exists(FATBIN_PATH):
        info = {"built": False, "reason": f"{FATBIN_PATH} is missing"}
    return info


def kernels_missing_reason():
    """None when the fatbin is present, else why the CUDA backend has no kernels."""
    info = build_info()
    if info.get("built"):
        return None
    return ("CUDA kernels were not built: " + info.get("reason", "unknown reason")
            + " (build them with nvcc on PATH: `python kernels/build.py` in an editable "
            "checkout, or reinstall with REFLEX_BUILD_CUDA=1 pip install --force-reinstall "
            "--no-deps .)")


def _at(t, key):
    """Record in timings t when (ms since launch, see phases) this step ended."""
    from .. import phases

    t[key + "_at"] = round(phases.since_launch_ms(), 2)


def _init_lock_path():
    return os.path.join(os.environ.get("XDG_RUNTIME_DIR") or "/tmp", f"reflex-cuda-init-{os.getuid()}.lock")


def _hold_init_lock():
    """Unless REFLEX_TEARDOWN=now: hold a shared lock on a per-user file while cuInit and the
    context are made, so that an exiting reflex process (teardown_when_no_init) delays its
    driver teardown until no start-up is in that phase. Never blocks: a start-up that finds
    the lock taken goes on without it. Returns the open fd (kept open: closing releases it)."""
    from .. import settings

    if settings.get().teardown == "now":
        return None
    import fcntl

    try:
        fd = os.open(_init_lock_path(), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def teardown_when_no_init(linger_s=0.15, wait_s=1.0):
    """For a detached child about to exit with a CUDA context (its caller already has the
    answer): wait linger_s (time for a caller's next process to reach cuInit), then until no
    other reflex process holds the init lock (at most wait_s), so the driver's teardown does not
    land on another process's cuInit. Measured on the H200 (bench/results/cold19-h200-d960b5d):
    20 back-to-back cold starts p50 458 -> 300 ms (Q8_0), 431 -> 291 ms (Q4_K), isolated starts
    393 / 379 ms. REFLEX_TEARDOWN=now turns it off."""
    from .. import settings

    if settings.get().teardown == "now":
        return
    import fcntl

    time.sleep(linger_s)
    try:
        fd = os.open(_init_lock_path(), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return
    end = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return  # held until exit: a start-up arriving now goes on without the lock
        except OSError:
            if time.monotonic() > end:
                return
            time.sleep(0.005)


def _driver_init(device_index, t):
    """cuInit and the primary context through ctypes: ctypes releases the GIL during each
    call, so this part truly runs beside the main thread's imports. pycuda later retains
    the same primary context (cheap)."""
    import ctypes

    _at(t, "cuda_thread_start")
    lock_fd = _hold_init_lock()
    lib = ctypes.CDLL("libcuda.so.1")
    _at(t, "libcuda_loaded")
    rc = lib.cuInit(0)
    _at(t, "cuinit")
    if rc:
        raise RuntimeError(f"cuInit failed with CUDA error {rc} (no usable GPU or driver?)")
    n = ctypes.c_int()
    lib.cuDeviceGetCount(ctypes.byref(n))
    if n.value <= device_index:
        raise RuntimeError(f"no CUDA device {device_index} (found {n.value})")
    dev = ctypes.c_int()
    ctx = ctypes.c_void_p()
    rc = lib.cuDeviceGet(ctypes.byref(dev), device_index) or \
        lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
    if rc:
        raise RuntimeError(f"creating the primary context failed with CUDA error {rc}")
    _at(t, "context")
    if lock_fd is not None:
        os.close(lock_fd)


def _init_worker(device_index, driver_thread, drv_err, t):
    t0 = time.perf_counter()
    _at(t, "pycuda_start")
    try:
        reason = kernels_missing_reason()
        if reason:
            raise RuntimeError(reason)
        # cuInit + context run on driver_thread (ctypes, GIL released) while this one
        # imports pycuda (numpy + the boost.python extension, GIL-bound): the two overlap
        t1 = time.perf_counter()
        import pycuda.driver as drv

        t["import_pycuda_ms"] = (time.perf_counter() - t1) * 1e3
        _at(t, "pycuda_imported")
        driver_thread.join()
        if drv_err:
            raise drv_err[0]
        t1 = time.perf_counter()
        drv.init()
        dev = drv.Device(device_index)
        ctx = dev.retain_primary_context()
        ctx.push()
        t["pycuda_context_ms"] = (time.perf_counter() - t1) * 1e3
        try:
            from .core import Runtime

            rt = Runtime(drv, dev, ctx, t)
        finally:
            ctx.pop()
        _result["runtime"] = rt
    except BaseException as e:  # reported to whoever asks for the runtime
        _result["error"] = e
    t["init_thread_ms"] = (time.perf_counter() - t0) * 1e3
    _at(t, "init_thread_end")
    _result["timings"] = t


_pycuda_found = None


def pycuda_installed() -> bool:
    """Whether pycuda can be imported (looked up once: cli.py asks before it forks, and the
    child keeps the answer)."""
    global _pycuda_found
    if _pycuda_found is None:
        import importlib.util

        _pycuda_found = importlib.util.find_spec("pycuda") is not None
    return _pycuda_found


_driver = None  # (thread, errors, timings, device index) of the cuInit + context thread


def start_driver(device_index: int = 0) -> bool:
    """Start only cuInit + the primary context on their thread (ctypes: the GIL is released
    for the whole call, so it costs the main thread nothing), once; start_init() later adds
    the pycuda side. False when pycuda is absent (CUDA cannot be used anyway)."""
    global _driver
    with _lock:
        if _driver is not None:
            return True
        if not pycuda_installed():
            return False
        t, drv_err = _progress, []

        def driver():
            t0 = time.perf_counter()
            try:
                _driver_init(device_index, t)
            except BaseException as e:
                drv_err.append(e)
            t["cuinit_context_ms"] = (time.perf_counter() - t0) * 1e3

        th = threading.Thread(target=driver, name="reflex-cuinit", daemon=True)
        th.start()  # first: cuInit is the longest step of all
        _driver = (th, drv_err, t, device_index)
        return True


def start_init(device_index: int = 0) -> bool:
    """Start CUDA initialization on background threads (once): cuInit + context (start_driver,
    unless it runs already) and the pycuda side (import, context, fatbin). False when pycuda
    is absent."""
    global _thread
    if not start_driver(device_index):
        with _lock:
            if _thread is None:
                _result["error"] = ModuleNotFoundError("pycuda is not installed (pip install pycuda)")
                _thread = threading.Thread()  # a finished stand-in: runtime() reports the error
        return False
    with _lock:
        if _thread is not None:
            return True
        # start-up is a relay between threads that each need the GIL only briefly between
        # long calls that release it (cuInit, the context, page-locking); a short switch
        # interval hands it over sooner (measured on the H200 host: -46 ms to first token).
        # startup_done() restores the interval.
        global _saved_switch
        if _saved_switch is None:
            _saved_switch = sys.getswitchinterval()
            sys.setswitchinterval(STARTUP_SWITCH_INTERVAL)
        th, drv_err, t, index = _driver
        _thread = threading.Thread(target=_init_worker, args=(index, th, drv_err, t),
                                   name="reflex-cuda-init", daemon=True)
        _thread.start()
        return True


_progress = {}  # the init threads' milestones so far (ms since launch: *_at), see progress()


def progress() -> dict:
    """The CUDA start-up's milestones reached so far (cuda_thread_start_at, cuinit_at,
    context_at, init_thread_end_at: ms since launch); {} when it has not started."""
    return dict(_progress)


def started() -> bool:
    """Whether cuInit has been started in this process."""
    return _driver is not None


STARTUP_SWITCH_INTERVAL = 0.0005  # seconds (CPython's default: 0.005)
_saved_switch = None


def startup_done():
    """Restore the GIL switch interval start_init shortened (the engine calls it once the
    runner is loaded)."""
    global _saved_switch
    if _saved_switch is not None:
        sys.setswitchinterval(_saved_switch)
        _saved_switch = None


_pushed = threading.local()


def runtime():
    """The initialized Runtime, current in this thread; ReflexError('cuda_error') if CUDA is unusable."""
    start_init()
    if _thread.ident is not None:
        _thread.join()
    err = _result.get("error")
    if err is not None:
        from ..errors import ReflexError

        raise ReflexError("cuda_error", f"CUDA backend unavailable: {type(err).__name__}: {err}")
    rt = _result["runtime"]
    if not getattr(_pushed, "done", False):
        rt.ctx.push()
        _pushed.done = True
        if threading.current_thread() is threading.main_thread():
            import atexit

            # pycuda aborts the process at exit if a context is still pushed (a process that
            # ends normally rather than through os._exit): pop ours first
            atexit.register(_pop_at_exit, rt.ctx)
    return rt


def release_thread():
    """Pop the context that runtime() pushed in this thread (not the main thread's: atexit pops
    that one). pycuda aborts the whole process when a thread ends with a context still on its
    stack, so a thread that made CUDA objects for another (handover's late backend) lets go of
    it before it ends; the taking thread pushes its own through runtime()."""
    if not getattr(_pushed, "done", False) or threading.current_thread() is threading.main_thread():
        return
    rt = _result.get("runtime")
    _pushed.done = False
    if rt is not None:
        rt.ctx.synchronize()
        rt.ctx.pop()


def _pop_at_exit(ctx):
    import warnings

    # objects made on the init/upload threads are freed at teardown from this thread;
    # pycuda warns about each one, harmlessly
    warnings.filterwarnings("ignore", message=".*out-of-thread context could not be cleaned up")
    try:
        ctx.synchronize()
        ctx.pop()
    except Exception:
        pass


def device_index(device: str) -> int:
    """0 for "cuda"/"auto", N for "cuda:N"."""
    if device.startswith("cuda:"):
        return int(device[5:])
    return 0


def init_timings() -> dict:
    return dict(_result.get("timings", {}))
