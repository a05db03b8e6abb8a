"""The prefix store: saved prompt states shared by every reflex process of a machine.

A process that evaluated a prompt writes the state of its leading tokens, after its
answer is out, as segment files (protocol/STATE.md, "Prefix store"); a later process
whose prompt starts with the same tokens reads them instead of evaluating those tokens
again. Segments are content-addressed: the key of the tokens [0, b) of a prompt is a
chain of BLAKE2b-128 digests over blocks of BLOCK token ids, starting from a digest of
the model's identity (GGUF digest, LoRA adapters' digest, backend), so a longer prompt
finds every saved block of its start and the store keeps each shared block once.

Segments of a prompt of n tokens (n - 1 >= BLOCK / 2; shorter prompts are neither
looked up nor saved): the full blocks [kB, (k+1)B) that end at or before
n - 1, then the rest up to n - 1 (the last token is always evaluated: its logits are
the answer's start). A segment file holds its tokens' slot rows (attention K/V,
latents) and, for models with recurrent layers, the per-sequence state after its last
token, captured while the prompt was evaluated (recurrent state exists only at exact
positions). Reading a chain takes the slot rows of every segment and the per-sequence
state of the last.

Safety: a file is written to a temporary name in its folder and renamed (concurrent
writers of one key each rename a whole file; the last one stays); every byte read is
checked against the file's CRCs, its tokens and its chain digest before it is used; a
file that fails is deleted and its tokens are evaluated as if it had not been there.
The folder is kept under a size cap by deleting the least recently used files. Nothing
here may fail a request: every error is a miss (or, when writing, nothing written).

Settings (environment): REFLEX_PREFIX_CACHE=0 turns the store off (requests and the
CLI turn it off one at a time: `prefix_cache: false`, `--no-prefix-cache`);
REFLEX_PREFIX_CACHE_DIR (default: prefix/ in reflex's cache folder),
REFLEX_PREFIX_CACHE_MAX (bytes, or with K/M/G; default 4G), REFLEX_PREFIX_CACHE_BLOCK
(tokens per block, default 256), REFLEX_PREFIX_CACHE_SHARE=1 (also read the segments of
the other backends: cpu <-> cuda <-> numpy, as the state format allows).
"""

from __future__ import annotations

import os
import sys
import time

BLOCK = 256
MIN_BLOCK = 16
DEFAULT_MAX = 4 << 30
SUFFIX = ".rxs"
INFO = "model.json"
STALE_TMP_S = 3600  # a writer's temporary file older than this was left by a crash
BACKENDS = ("cpu", "cuda", "numpy")
PENDING = []  # sessions whose segments are written after the answer (flush)


def parse_size(text) -> int:
    """Bytes from "4G", "512M", "1000000" (K, M, G, T: powers of 1024)."""
    t = str(text).strip().upper().rstrip("B")
    mult = 1
    if t and t[-1] in "KMGT":
        mult = 1024 ** ("KMGT".index(t[-1]) + 1)
        t = t[:-1]
    n = float(t)
    if not n >= 0:
        raise ValueError(text)
    return int(n * mult)


def _settings():
    from .. import settings

    return settings.get()


def enabled() -> bool:
    return _settings().prefix_cache


def share() -> bool:
    """REFLEX_PREFIX_CACHE_SHARE=1: a backend also reads the segments other backends saved
    (a state moves between backends within float16 rounding; off by default, so that an
    answer is always what its own backend computes from scratch)."""
    return _settings().prefix_cache_share


def root() -> str:
    d = _settings().prefix_cache_dir
    if d:
        return os.path.abspath(os.path.expanduser(d))
    from ..modelpath import cache_dir

    return os.path.join(cache_dir(), "prefix")


def max_bytes() -> int:
    try:
        return parse_size(_settings().prefix_cache_max or DEFAULT_MAX)
    except ValueError:
        return DEFAULT_MAX


def block_size() -> int:
    try:
        return max(MIN_BLOCK, int(_settings().prefix_cache_block or BLOCK))
    except ValueError:
        return BLOCK


def _warn(msg):
    try:
        sys.stderr.write(f"reflex: prefix cache: {msg}\n")
    except (OSError, ValueError, AttributeError):
        pass


# -- keys --------------------------------------------------------------------------------
def namespace(model_digest: bytes, adapter_digest: bytes, backend: str) -> bytes:
    """The chain's first digest: the model, its adapters and the backend (a backend's
    states are reused by that backend only, so an answer is what it computes from scratch)."""
    import hashlib

    h = hashlib.blake2b(digest_size=16)
    h.update(b"reflex-prefix-store-v1\0")
    h.update(model_digest)
    h.update(adapter_digest)
    h.update(backend.encode("utf-8"))
    return h.digest()


def chain(ns: bytes, ids, bounds):
    """[(a, b, base, key)] for consecutive segments ending at `bounds` (increasing): base is
    the key of ids[:a] (ns for a = 0), key = BLAKE2b-128(base || ids[a:b] as int32 LE)."""
    import hashlib
    import struct

    out, a, h = [], 0, ns
    for b in bounds:
        d = hashlib.blake2b(h, digest_size=16)
        d.update(struct.pack(f"<{b - a}i", *ids[a:b]))
        k = d.digest()
        out.append((a, b, h, k))
        a, h = b, k
    return out


def bounds_of(n: int, block: int):
    """Segment ends for a prompt of n tokens: every multiple of block up to n - 1, then
    n - 1 itself."""
    last = n - 1
    out = list(range(block, last + 1, block))
    if last > 0 and (not out or out[-1] != last):
        out.append(last)
    return out


def runner_identity(runner, folder):
    """runner.identity() (model digest, adapter digest), with the model digest memoized in
    folder/digests/ under the GGUF's path, device, inode, size, mtime and ctime: hashing a
    GGUF's metadata takes ~10-60 ms (SmolLM2's vocabulary), which would be on every cold
    request's path. The memo is trusted as the server's model cache trusts a file identity
    (any write changes mtime/ctime); the runner then uses it too."""
    if runner._identity is not None:
        return runner._identity
    import hashlib

    try:
        real = os.path.realpath(runner.path)
        st = os.stat(real)
        key = hashlib.blake2b(f"{real}|{st.st_dev}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|"
                              f"{st.st_ctime_ns}".encode("utf-8", "surrogateescape"), digest_size=16).hexdigest()
        memo = os.path.join(folder, "digests", key)
    except (OSError, ValueError):
        return runner.identity()
    digest = None
    try:
        with open(memo, "rb") as fh:
            b = fh.read(17)
        if len(b) == 16:
            digest = b
    except OSError:
        pass
    if digest is None:
        digest = runner.identity()[0]
        tmp = f"{memo}.{os.getpid()}.tmp"
        try:
            os.makedirs(os.path.dirname(memo), exist_ok=True)
            with open(tmp, "wb") as fh:
                fh.write(digest)
            os.replace(tmp, memo)
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        return runner.identity()
    from .statefile import adapter_digest

    runner._identity = (digest, adapter_digest(runner.adapters))
    return runner._identity


# -- one request's use of the store ----------------------------------------------------------
class Session:
    """The store as one request of one runner uses it: `extend` (called by the executor's
    begin) imports saved segments, `stops`/`at` capture recurrent state at segment ends
    during prefill, `finish` queues what to write, `write` writes it (after the answer)."""

    def __init__(self, runner, folder, block, cap):
        self.runner, self.block, self.cap = runner, block, cap
        self.ex = runner.exec
        self.recurrent = self.ex.recurrent
        self.root = folder
        self._sources = None
        self.tokens = 0  # imported
        self.import_ms = 0.0
        self.files = 0
        self.import_stats = None  # the last pipelined import's (runtime/stateimport.run)
        self.snaps = {}  # segment end -> per-sequence arrays [{name: numpy}] per layer (recurrent)
        self.want = ()  # segment ends to capture during this prefill
        self.ids = None
        self.todo = []

    @property
    def sources(self):
        """[(chain start, folder)]: this backend's, then (REFLEX_PREFIX_CACHE_SHARE=1) the other
        backends' (their rounding differs: the answer is then not bit for bit this backend's).
        Computed at first need: the model digest hashes the GGUF's metadata (a few MB), which
        a prompt too short for the store never pays."""
        if self._sources is None:
            r = self.runner
            digest, adig = runner_identity(r, self.root)
            names = [r.ops.name] + ([b for b in BACKENDS if b != r.ops.name] if share() else [])
            self._sources = [(ns, os.path.join(self.root, ns.hex()))
                             for ns in (namespace(digest, adig, b) for b in names)]
        return self._sources

    @property
    def ns(self):
        return self.sources[0][0]

    @property
    def dir(self):
        return self.sources[0][1]

    def path(self, key: bytes) -> str:
        return os.path.join(self.dir, key.hex() + SUFFIX)

    # -- reading
    def extend(self, ids, held: int, load=True) -> int:
        """Called with the state already sized for ids: import the longest chain of saved
        segments of ids when it holds more than `held` tokens (with load); returns how many
        leading ids the state now holds. Every failure is a miss."""
        n = len(ids)
        bounds = bounds_of(n, self.block) if n - 1 >= self.block // 2 else []
        self.ids = list(ids)
        self.want = set(bounds) if self.recurrent else ()
        if not load or not bounds or bounds[-1] <= held or not self._holds_segments():
            return held
        segs = chain(self.ns, ids, bounds)
        avail = []  # the longest run of saved segments from the start, of one source
        for i, (ns, d) in enumerate(self.sources):
            run = []
            for a, b, base, key in (segs if i == 0 else chain(ns, ids, [s[1] for s in segs])):
                p = os.path.join(d, key.hex() + SUFFIX)
                if not os.path.isfile(p):
                    break
                run.append((a, b, base, key, p))
            if len(run) > len(avail):
                avail = run
        if not avail or avail[-1][1] <= held:
            return held
        from .. import phases

        t0 = time.perf_counter()
        phases.mark("prefix_import")
        try:
            got = self._import(ids, avail, held)
        except Exception as e:  # noqa: BLE001  (a store problem is a miss, never a failure)
            from ..errors import ReflexError

            if isinstance(e, ReflexError) and e.kind == "cancelled":
                raise
            _warn(f"ignoring saved segments ({type(e).__name__}: {e})")
            self.ex.forget()
            got = 0
        self.import_ms += (time.perf_counter() - t0) * 1e3
        phases.mark("prefix_imported")
        if got > held:
            self.tokens += got - held
            return got
        if got < held:  # the state was cleared
            return 0
        return held

    def _holds_segments(self):
        """Whether the store's folder holds any model's segments: an empty or missing folder
        (a machine's first request) has nothing to find, and the model digest (hashing the
        GGUF's metadata the first time) is then computed when writing, after the answer."""
        try:
            with os.scandir(self.root) as it:
                return any(len(e.name) == 32 and e.is_dir() for e in it)
        except OSError:
            return False

    def _open(self, seg, ids):
        """A StateFile for segment seg checked against the model, its chain position and the
        prompt's tokens; None (the file deleted) when it fails."""
        from ..errors import ReflexError
        from .statefile import StateFile

        a, b, base, key, p = seg
        try:
            sf = StateFile(p)
        except ReflexError as e:
            if "no such" not in e.message:
                self._drop(p, e.message)
            return None
        try:
            from ..savedstate import check

            check(self.runner, sf, segment=True)
            if sf.start != a or sf.base != base or sf.tokens != list(ids[a:b]):
                raise ReflexError("state_error", f"{p}: not the segment its name says")
        except ReflexError as e:
            sf.close()
            self._drop(p, e.message)
            return None
        return sf

    def _import(self, ids, avail, held):
        """Read the segments of `avail` from the one holding position `held` on: slot rows of
        each, the per-sequence state of the last one read whole. Returns the tokens the state
        then holds (0 after clearing it)."""
        from ..errors import ReflexError

        st = self.ex.state
        first = max(i for i, s in enumerate(avail) if s[0] <= held)
        files, done = [], []
        try:
            for seg in avail[first:]:
                sf = self._open(seg, ids)
                if sf is None:
                    break
                files.append(sf)
            from . import stateimport

            if files and stateimport.compatible(st, files):
                return self._import_pipelined(ids, files, held)
            for j, sf in enumerate(files):
                try:
                    sf.restore(st, seq=j == len(files) - 1, set_tokens=False)
                except ReflexError as e:
                    if e.kind != "state_error":
                        raise
                    self._drop(sf.path, e.message)
                    if self.recurrent:  # the per-sequence state must come from the last good one
                        try:
                            if not done:
                                raise ReflexError("state_error", "no segment before it")
                            done[-1].restore(st, seq=True, set_tokens=False)
                        except ReflexError:
                            self.ex.forget()
                            return 0
                    break
                done.append(sf)
            return self._imported(ids, done) if done else held
        finally:
            for sf in files:
                sf.close()

    def _import_pipelined(self, ids, files, held):
        """_import's way when every array goes into the state as stored (runtime/stateimport.py:
        several threads read, check and copy at once; a streaming weight upload holds back the
        experts nobody asked for meanwhile)."""
        from .statefile import pinned_default
        from . import stateimport

        st = self.ex.state
        ops = st.ops
        last = len(files) - 1
        release = ops.hold_uploads() if hasattr(ops, "hold_uploads") else None
        try:
            whole, stats = stateimport.run(ops, st, files, lambda j: j == last, pinned=pinned_default(ops))
            stats["held"] = release is not None and release.held
            if self.recurrent and 0 < whole <= last:  # the per-sequence state of the last whole one
                again, _ = stateimport.run(ops, st, files[whole - 1:whole], lambda j: True, pinned=stats["pinned"])
                if again != 1:
                    whole = 0
        finally:
            if release is not None:
                release()
        self.import_stats = stats
        for path, why in stats.get("refused", {}).items():
            self._drop(path, why)
        if whole == 0:
            if self.recurrent:
                self.ex.forget()
                return 0
            return held
        return self._imported(ids, files[:whole])

    def _imported(self, ids, done):
        """The state holds the segments `done` (read whole): its tokens, their files' use."""
        end = done[-1].start + done[-1].n_tokens
        self.ex.state.tokens = list(ids[:end])
        now = time.time()
        for sf in done:
            try:
                os.utime(sf.path, (now, now))  # least recently used goes first
            except OSError:
                pass
        self.files += len(done)
        return end

    def _drop(self, path, why):
        _warn(f"refused a saved segment ({why}); deleted, its tokens are evaluated again")
        try:
            os.unlink(path)
        except OSError:
            pass

    # -- capture during prefill (recurrent models)
    def stops(self, lo, hi):
        """Segment ends in (lo, hi] at which the prefill must stop to capture recurrent state."""
        return sorted(b for b in self.want if lo < b <= hi) if self.want else []

    def at(self, state, pos):
        """The prefill reached segment end pos: keep sequence 0's per-sequence arrays."""
        if pos not in self.want or pos in self.snaps:
            return
        import numpy as np

        ops = state.ops
        self.snaps[pos] = [{name: np.array(ops.to_numpy(a[0]), copy=True) for name, a in layer.arrays.items()}
                           if layer.spec.kind == "seq" else None for layer in state.layers]

    # -- writing
    def finish(self):
        """The request is done: queue the segments of its prompt (those the store lacks are
        written by flush() after the answer, or at the runner's next request or close)."""
        ids = self.ids
        self.want = ()
        if not ids or len(ids) - 1 < self.block // 2:  # too short to be worth a file
            return
        todo = bounds_of(len(ids), self.block)  # write() names them and skips the saved ones
        if self.recurrent:  # only the ends whose recurrent state was captured
            todo = [b for b in todo if b in self.snaps]
        self.todo = todo
        if todo:
            PENDING.append(self)

    def write(self):
        """Write the queued segments from the runner's state (unchanged since the request:
        this runs before the next one). Errors (a full disk...) end the writing quietly."""
        ends, self.todo = self.todo, []
        st = self.ex.state
        if not ends or st is None:
            return 0
        ids = self.ids
        bounds = bounds_of(len(ids), self.block)
        segs = chain(self.ns, ids, bounds[:bounds.index(ends[-1]) + 1])  # (the chain is over every block)
        wanted = set(ends)
        todo = [s for s in segs if s[1] in wanted and not os.path.isfile(self.path(s[3]))]
        if not todo:
            return 0
        n_max = todo[-1][1]
        if list(st.tokens[:n_max]) != list(ids[:n_max]):
            n_ok = 0
            while n_ok < min(len(st.tokens), n_max) and st.tokens[n_ok] == ids[n_ok]:
                n_ok += 1
            todo = [s for s in todo if s[1] <= n_ok]
        if not todo:
            return 0
        from ..errors import ReflexError
        from .statefile import write_state

        try:
            os.makedirs(self.dir, exist_ok=True)
            self._write_info()
        except OSError:
            return 0
        import numpy as np

        ops = st.ops
        host = [{name: ops.to_numpy(a) for name, a in layer.arrays.items()} if layer.spec.kind == "slot"
                else None for layer in st.layers]
        digest, adig = self.runner.identity()
        arch = self.runner.model.hp.arch
        written = 0
        for a, b, base, key in todo:
            p = self.path(key)
            if os.path.isfile(p):
                continue
            layers = []
            for i, (spec, layer) in enumerate(zip(st.specs, st.layers)):
                arrs = []
                for name in spec.arrays:
                    if spec.kind == "slot":
                        ax = spec.slot_axis(name)
                        h = host[i][name]
                        idx = [slice(None)] * h.ndim
                        idx[ax] = slice(a, b)
                        arrs.append((name, np.ascontiguousarray(h[tuple(idx)]), ax))
                    else:
                        arrs.append((name, self.snaps[b][i][name], None))
                layers.append((spec.kind, arrs))
            try:
                written += write_state(p, digest=digest, adapters_digest=adig, arch=arch, tokens=ids[a:b],
                                       layers=layers, start=a, base=base, durable=False)
            except ReflexError as e:
                _warn(f"not saved: {e.message}")
                break
        self.snaps = {}
        if written:
            evict(self.root, self.cap)
        return written

    def _write_info(self):
        p = os.path.join(self.dir, INFO)
        if os.path.exists(p):
            return
        import json

        r = self.runner
        info = {"model": r.info().get("model"), "path": r.path, "architecture": r.model.hp.arch,
                "backend": r.ops.name, "block": self.block,
                "lora": [{"path": a.path, "scale": a.scale} for a in r.lora]}
        tmp = f"{p}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(info, fh)
            os.replace(tmp, p)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise


def begin(runner, wanted=True):
    """Start a request on runner: write what its previous request queued (the state is still
    that request's), then give its executor this request's session (None: off)."""
    flush(runner)
    runner.exec.store = session(runner, wanted)


def end(runner, timings):
    """End a request: queue its prompt's segments for writing after the answer (flush), and
    say in timings what came from the store (prefix_cache_tokens, prefix_cache_import ms)."""
    s, runner.exec.store = runner.exec.store, None
    if s is not None:
        s.finish()
        timings["prefix_cache_tokens"] = s.tokens
        timings["prefix_cache_import"] = round(s.import_ms, 3)
        if s.import_stats is not None:  # (timings hold numbers only)
            d = s.import_stats
            for k in ("files", "bytes", "threads", "pinned", "held"):
                timings[f"prefix_cache_import_{k}"] = int(d[k])


def session(runner, wanted=True):
    """A Session for one request, or None when the store is off (the request's switch, or
    REFLEX_PREFIX_CACHE=0)."""
    if not wanted or not enabled():
        return None
    try:
        return Session(runner, root(), block_size(), max_bytes())
    except Exception as e:  # noqa: BLE001  (no store is never an error)
        _warn(f"unavailable ({type(e).__name__}: {e})")
        return None


def flush(runner=None):
    """Write what the requests so far queued (those of `runner` only, when given)."""
    keep = []
    while PENDING:
        s = PENDING.pop(0)
        if runner is not None and s.runner is not runner:
            keep.append(s)
            continue
        try:
            s.write()
        except Exception as e:  # noqa: BLE001  (the answer is out; nothing may fail now)
            _warn(f"not saved ({type(e).__name__}: {e})")
    PENDING.extend(keep)


def drop(runner):
    """Forget what `runner` queued (it is closing and its state goes)."""
    PENDING[:] = [s for s in PENDING if s.runner is not runner]


# -- the folder: listing, eviction, clearing ---------------------------------------------------
def scan(folder=None):
    """{namespace hex: {"info": model.json or {}, "files": [(path, size, mtime)]}}."""
    import json

    folder = folder or root()
    out = {}
    try:
        names = os.listdir(folder)
    except OSError:
        return out
    for ns in names:
        d = os.path.join(folder, ns)
        if ns == "digests" or not os.path.isdir(d):
            continue
        ent = {"info": {}, "files": [], "tmp": []}
        try:
            with open(os.path.join(d, INFO), encoding="utf-8") as fh:
                ent["info"] = json.load(fh)
        except (OSError, ValueError):
            pass
        try:
            it = os.scandir(d)
        except OSError:
            continue
        with it:
            for e in it:
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                if e.name.endswith(SUFFIX) and e.is_file(follow_symlinks=False):
                    ent["files"].append((e.path, st.st_size, st.st_mtime))
                elif e.name.endswith(".tmp"):
                    ent["tmp"].append((e.path, st.st_size, st.st_mtime))
        out[ns] = ent
    return out


def evict(folder=None, cap=None):
    """Delete the least recently used files until the store holds at most cap bytes (and
    temporary files that a crashed writer left). Returns the bytes deleted."""
    cap = max_bytes() if cap is None else cap
    now = time.time()
    files, freed = [], 0
    for ent in scan(folder).values():
        files += ent["files"]
        for p, size, mtime in ent["tmp"]:
            if now - mtime > STALE_TMP_S:
                try:
                    os.unlink(p)
                    freed += size
                except OSError:
                    pass
    total = sum(s for _, s, _ in files)
    if total <= cap:
        return freed
    for p, size, _ in sorted(files, key=lambda f: f[2]):
        if total <= cap:
            break
        try:
            os.unlink(p)
            freed += size
        except FileNotFoundError:
            pass
        except OSError:
            continue
        total -= size
    return freed


def clear(folder=None):
    """Delete every saved segment (and the folders of the store). Returns (files, bytes)."""
    import shutil

    folder = folder or root()
    n = size = 0
    for ns, ent in scan(folder).items():
        n += len(ent["files"])
        size += sum(s for _, s, _ in ent["files"])
        shutil.rmtree(os.path.join(folder, ns), ignore_errors=True)
    return n, size
