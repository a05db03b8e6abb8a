"""The model cache of `reflex stdio` / `reflex uds`: loaded runners keyed by the model
file's identity (device, inode, size, mtime) and device, at most `max_models` of them
and `max_model_bytes` of files (least recently used go first), the active model, and
read leases on the files.

Each cached file carries a read lease where the kernel grants one, so a writer that
opens or truncates it waits until the server has let go of its mapping: the server's
SIGIO handler calls `release_changed` (see runner_for). A file changed since it was
loaded is loaded again.
"""

import os
import time

from .errors import ReflexError
from .transport import log

_BACKEND_DEVICE = {"numpy": "cpu", "cpu": "cpu", "cuda": "cuda"}


def _ms(t0: float, t1: float) -> float:
    return round((t1 - t0) * 1e3, 3)


class _Entry:
    """One cached runner: the file it came from (path and identity), its lease fd."""

    __slots__ = ("runner", "info", "path", "ident", "device", "nbytes", "lease_fd", "keys",
                 "lora", "api", "asked", "settled")

    def __init__(self, runner, info, path, ident, device, nbytes, lease_fd):
        self.runner, self.info, self.path, self.ident = runner, info, path, ident
        self.device, self.nbytes, self.lease_fd = device, nbytes, lease_fd
        self.keys = []
        self.lora = None
        self.api = None  # its api.Model, made by the first op that runs on it
        self.asked = device  # the device it was asked for ("auto" resolves in _settle)
        self.settled = False


def file_identity(path):
    """(st_dev, st_ino, st_size, st_mtime_ns) of a regular file; model_not_found if the
    path is gone or is not a regular file (stat never blocks, even on a FIFO)."""
    import stat

    try:
        st = os.stat(path)
    except OSError as e:
        raise ReflexError("model_not_found", f"{path}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ReflexError("model_not_found", f"{path} is not a regular file")
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _take_lease(path, ident):
    """A read lease on `path` (an fd holding it), or None where the kernel grants none
    (not the file's owner, a file system without leases). A lease makes a writer that
    opens or truncates the file wait (up to /proc/sys/fs/lease-break-time) while we
    are told (SIGIO) and let go. gguf_error when the file is open for writing now."""
    try:
        import fcntl
    except ImportError:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) != ident:
            raise ReflexError("gguf_error", f"{path} changed while it was being loaded")
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except ReflexError:
        os.close(fd)
        raise
    except OSError as e:
        os.close(fd)
        import errno

        if e.errno == errno.EAGAIN:
            raise ReflexError("gguf_error", f"{path} is open for writing by another "
                              "process; not loading a file that is being written") from None
        return None
    return fd


def _lease_broken(fd) -> bool:
    import fcntl

    try:
        return fcntl.fcntl(fd, fcntl.F_GETLEASE) != fcntl.F_RDLCK
    except OSError:
        return True


class ModelCache:
    """`loader(path, device) -> Runner` (default: engine.load_runner); `resolve(name) ->
    path` (default: modelpath.resolve_model); `identify(path)` -> a hashable identity of
    the file (default: dev, inode, size, mtime_ns; with a custom loader and no identify,
    the path string itself). `model`/`device`/`lora`: the defaults (--model, --device,
    --lora). Leases are taken only once `sigio` says a SIGIO handler is in place."""

    def __init__(self, *, model=None, device="auto", lora=None, loader=None, resolve=None,
                 identify=None, model_dirs=None, max_models=4, max_model_bytes=32 << 30,
                 leases=None):
        self.default_model = model
        self.default_lora = lora or []  # --lora FILE[:SCALE] for the preloaded model
        self.default_device = device or "auto"
        self._loader = loader
        self._resolve = resolve
        if identify is None:
            identify = file_identity if loader is None else str
        self._identify = identify
        self.leases = (identify is file_identity) if leases is None else leases
        self.sigio = False  # a SIGIO handler is installed (leases may be taken)
        self.model_dirs = [os.path.realpath(d) for d in (model_dirs or ())]
        self.max_models = max(1, int(max_models))
        self.max_model_bytes = max_model_bytes
        self.entries = {}  # (identity, device) -> _Entry, least recently used first
        self.runners = {}  # (identity, device) -> runner
        self.infos = {}  # (identity, device) -> runner.info()
        self.paths = {}  # model name -> path (a small memo; aliases and repeated names)
        self._active = None  # key of the active runner
        self._active_src = None  # (path, device, lora) it was asked for under
        self.auto_device = None  # the device "auto" resolved to, once known

    def release_changed(self):
        """Drop every cached model whose lease is being broken, then release the lease:
        the writer proceeds only once nothing will read the old mapping."""
        for e in list(self._unique_entries()):
            if e.lease_fd is not None and _lease_broken(e.lease_fd):
                log(f"{e.path} is being modified; dropping the loaded model")
                self._evict(e)

    # -- models

    @property
    def active(self):
        return self._active

    @active.setter
    def active(self, key):
        self._active = key
        e = self.entries.get(key)
        if e is not None:
            self._active_src = (e.path, e.device, e.lora)

    def _path(self, name):
        path = self.paths.get(name)
        if path is None:
            if self._resolve is None:
                from .modelpath import resolve_model

                self._resolve = resolve_model
            path = self._resolve(name)
            if len(self.paths) >= 64:
                self.paths.clear()
            if name is None or len(name) <= 4096:
                self.paths[name] = path
        return path

    def _check_dirs(self, name, path):
        """--model-dir: a model named by a request must resolve inside one of the dirs."""
        if not self.model_dirs or name is None:
            return
        from .modelpath import ALIASES

        if name in ALIASES:
            return
        real = os.path.realpath(path)
        for d in self.model_dirs:
            if real == d or real.startswith(d.rstrip(os.sep) + os.sep):
                return
        raise ReflexError("model_not_found", f"{name!r} is outside the model directories "
                          "this server may read (--model-dir)")

    def _unique_entries(self):
        seen = set()
        for e in self.entries.values():
            if id(e) not in seen:
                seen.add(id(e))
                yield e

    def _evict(self, e):
        for k in e.keys:
            self.entries.pop(k, None)
            self.runners.pop(k, None)
            self.infos.pop(k, None)
        e.keys = []
        try:
            close = getattr(e.runner, "close", None)
            if close is not None:
                close()
        except Exception as ex:  # noqa: BLE001  (a runner that cannot close is dropped anyway)
            log(f"closing {e.path}: {ex}")
        e.runner = None
        if e.lease_fd is not None:
            try:
                import fcntl

                fcntl.fcntl(e.lease_fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
            except OSError:
                pass
            os.close(e.lease_fd)
            e.lease_fd = None

    def _evict_stale(self, path, ident):
        """Entries loaded from `path` that no longer match the file there, and entries of
        the same inode whose size or mtime changed (written in place: the old mapping
        is not safe to read)."""
        for e in list(self._unique_entries()):
            same_path = e.path == path and e.ident != ident
            in_place = (isinstance(ident, tuple) and len(ident) == 4 and
                        isinstance(e.ident, tuple) and e.ident[:2] == ident[:2] and
                        e.ident != ident)
            if same_path or in_place:
                self._evict(e)

    def _make_room(self, keep):
        while True:
            uniq = list(self._unique_entries())
            total = sum(e.nbytes for e in uniq)
            if len(uniq) <= self.max_models and total <= self.max_model_bytes:
                return
            victims = [e for e in uniq if e is not keep]
            if not victims:
                return
            self._evict(victims[0])  # least recently used

    def _touch(self, e):
        for k in e.keys:  # most recently used last
            self.entries[k] = self.entries.pop(k)

    def _adapter_identity(self, path):
        try:
            return self._identify(path)
        except Exception:  # noqa: BLE001  (a missing adapter: loading it names the error)
            return None

    def runner_for(self, model, device, timings, use_active=True, lora=None):
        """The runner for (model, device), loading it when not cached. Either
        left out means the active model's (with use_active, and one is
        active), else the server's default (--model / --device). lora: a
        tuple of (adapter path, scale) (load only): the same model with other
        adapters is another runner, cached under (identity, device, lora). The file
        is looked at (stat) every time: a file changed since it was loaded is
        loaded again."""
        src = self._active_src if (use_active and self._active is not None) else None
        if model is None and device is None and src is not None and not lora:
            path, device, lora = src
        else:
            if model is None:
                path = src[0] if src else self._path(self.default_model)
            else:
                path = self._path(model)
                self._check_dirs(model, path)
            if device is None:
                device = src[1] if src else self.default_device
        if device == "auto" and self.auto_device:
            device = self.auto_device
        ident = self._identify(path)
        # adapters by path, scale and their file's identity: one rewritten in place is loaded
        # again, as a model file is (the fuzz suite found a stale adapter served; issue 32)
        key = (ident, device) + ((tuple((p, sc, self._adapter_identity(p)) for p, sc in lora),) if lora else ())
        e = self.entries.get(key)
        if e is not None and e.lease_fd is not None and _lease_broken(e.lease_fd):
            self._evict(e)
            e = None
        if e is None:
            e = self._coming(ident, device, key[2:])
        if e is None:
            self._evict_stale(path, ident)
            # a lease only with our SIGIO handler in place (SIGIO's default action kills)
            lease = _take_lease(path, ident) if self.leases and self.sigio else None
            try:
                t0 = time.perf_counter()
                if self._loader is None:
                    from .engine import load_runner

                    self._loader = lambda p, d, lora=None: load_runner(p, device=d, lora=lora)
                runner = (self._loader(path, device, lora=list(lora)) if lora
                          else self._loader(path, device))
                timings["load"] = _ms(t0, time.perf_counter())
                info = dict(runner.info())
            except BaseException:
                if lease is not None:
                    os.close(lease)
                raise
            nbytes = ident[2] if isinstance(ident, tuple) and len(ident) == 4 else 0
            e = _Entry(runner, info, path, ident, device, nbytes, lease)
            e.lora = lora
            self._add(e, key)
            e.asked = device
            self._settle(e)
            self._make_room(e)
        else:
            self._touch(e)
            self._settle(e)
        if self._active is None or self._active not in self.entries:
            self.active = key
        return key, e.runner

    def _coming(self, ident, device, rest):
        """A runner of this file serving on the cpu backend while `device` (e.g. "cuda") comes
        up for it: a request naming that device waits for it rather than loading the file on
        it a second time. None when there is none."""
        for e in self._unique_entries():
            lb = getattr(e.runner, "pending", None)
            if e.ident == ident and lb is not None and lb.name == device and tuple(e.keys[0][2:]) == tuple(rest):
                e.runner.adopt(wait=True)
                if e.runner.ops.name != device:
                    return None  # it failed to come up: load as asked (and report why)
                self._settle(e)
                self._touch(e)
                return e
        return None

    def _settle(self, e):
        """"auto" (or "cuda") resolved to a concrete device: cache the runner under that name
        too, so naming it later finds it. A runner still waiting for its GPU (engine: it
        serves on the cpu backend meanwhile) settles once it has moved (or given up)."""
        runner = e.runner
        if e.settled or runner is None:
            return
        if getattr(runner, "pending", None) is not None or getattr(runner, "want_gpu", None) is not None:
            return
        e.settled = True
        info = dict(runner.info())
        e.info = info
        for k in e.keys:
            self.infos[k] = info
        device, ident, key = e.asked, e.ident, e.keys[0]
        real = info.get("device") or _BACKEND_DEVICE.get(info.get("backend"))
        if info.get("backend") == "numpy":
            real = "numpy"  # the oracle (asked for, or what auto gives a numpy-only model)
        if real and real != device:
            if (ident, real) + key[2:] not in self.entries:
                self._add(e, (ident, real) + key[2:])
            if device == "auto" and real != "numpy":
                self.auto_device = real  # what "auto" means on this machine

    def api_model(self, key, runner):
        """The api.Model over the runner cached under key (one per loaded model)."""
        e = self.entries[key]
        if e.api is None or e.api.runner is not runner:
            from .api import Model

            e.api = Model(runner)
        return e.api

    def _add(self, e, key):
        e.keys.append(key)
        self.entries[key] = e
        self.runners[key] = e.runner
        self.infos[key] = e.info

    def close(self):
        for e in list(self._unique_entries()):
            self._evict(e)

    def preload(self, timings):
        """--model: load it (and make it active) before the ready line."""
        lora = None
        if self.default_lora:
            from .lora import normalize
            from .modelpath import resolve_model

            lora = tuple((resolve_model(p), s) for p, s in normalize(self.default_lora))
        self.runner_for(self.default_model, self.default_device, timings, lora=lora)

    def active_info(self):
        if not self.active:
            return {}
        e = self.entries.get(self.active)
        if e is not None and not e.settled and e.runner is not None:
            self._settle(e)
            if not e.settled:  # serving on the cpu backend while its GPU comes up
                return dict(e.runner.info())
        return self.infos.get(self.active, {})

    def listing(self) -> list:
        """hello's `models`: each loaded model once, with the path it was loaded from."""
        return [{"model": e.info.get("model"), "path": e.path, "device": e.device,
                 "backend": e.info.get("backend")} for e in self._unique_entries()]

    # -- lines
