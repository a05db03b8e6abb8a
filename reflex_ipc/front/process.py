"""Starting the engine process (`reflex uds`) of `reflex http`: kept free of asyncio and the
HTTP stack, so the engine is on its way before the front imports them."""

import os
import subprocess
import sys
import tempfile


def _die_with_parent():
    """In the child: SIGTERM when the front dies (Linux), so no engine outlives its front."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def spawn(sock_dir, *, model=None, device="auto"):
    """Popen of `reflex uds SOCK_DIR/engine.sock`; returns (proc, socket path). The engine
    logs to the front's stderr; SIGINT from the terminal reaches the front alone (it would
    cancel the engine's request), the engine gets SIGTERM from the front's shutdown."""
    path = os.path.join(sock_dir, "engine.sock")
    # -P (3.11+): `-m` must not put the current directory first on sys.path
    argv = [sys.executable, *(["-P"] if sys.version_info >= (3, 11) else []),
            "-m", "reflex_ipc", "uds", path, "--device", device]
    if model:
        argv += ["--model", model]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            start_new_session=True,
                            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
    return proc, path


def new_dir():
    return tempfile.mkdtemp(prefix="reflex-http-")
