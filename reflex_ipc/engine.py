"""The Runner: a loaded model with its tokenizer, backend and executor; the algorithms
run on it live beside it (generation/, scoring.py, embedding.py, savedstate.py).

`load_runner(model, device, n_ctx)` opens the GGUF, picks the backend (the
compiled CPU kernels on "cpu", the numpy oracle on "numpy", the CUDA kernels on
"cuda", CUDA when usable else cpu on "auto"), loads and checks the weights and the tokenizer. The model's state (runtime/state.py) is
allocated by the executor at the first request, sized to what it needs, and
outlives requests: a request whose tokens start with the tokens the state holds
evaluates only the rest (prefix reuse; `cache_prompt=False` starts empty).

Prompts are tokenized as llama.cpp's tools do: special tokens parsed, BOS per
the GGUF's add_bos flag. Errors are ReflexError with the protocol's kinds.
"""

from __future__ import annotations

import sys
import time

from .errors import ReflexError

DEFAULT_N_CTX = 4096


def _ms(t0, t1=None):
    return round(((time.perf_counter() if t1 is None else t1) - t0) * 1e3, 3)


def _cpu_backend(threads=None):
    """The compiled CPU backend, else (kernels not built or not loadable) the numpy one, with a
    warning that says why (once per process)."""
    from .backends import cpu_ops

    ok, why = cpu_ops.available()
    if ok:
        try:
            return cpu_ops.CpuOps(threads=threads)
        except ReflexError:  # the user's settings (a bad REFLEX_* variable)
            raise
        except Exception as e:  # the library misbehaves: say so, run on numpy
            why = f"{type(e).__name__}: {e}"
    from .backends.numpy_ops import NumpyOps

    if not getattr(cpu_ops, "_warned", False):
        import sys

        cpu_ops._warned = True
        print(f"reflex: warning: the CPU kernels are unavailable ({why}); using the numpy backend",
              file=sys.stderr)
    return NumpyOps()


def make_backend(device, no_cpu=False):
    """The backend ops object for a device name: "cpu" (the compiled kernels), "numpy" (the
    oracle), "cuda", or "auto" (CUDA when usable, else cpu; else numpy with no_cpu, for the
    architectures the cpu backend cannot run: models.NO_CPU)."""
    from .backends import DEVICES

    if device not in DEVICES:
        raise ReflexError("invalid_request", f"device {device!r} is not one of {', '.join(DEVICES)}")
    if device == "numpy":
        from .backends.numpy_ops import NumpyOps

        return NumpyOps()
    if device == "cpu":
        return _cpu_backend()
    from . import cuda

    def fallback():
        if no_cpu:
            from .backends.numpy_ops import NumpyOps

            return NumpyOps()
        return _cpu_backend()

    started = cuda.start_init()
    if device == "auto" and not started:  # pycuda is not installed
        return fallback()
    try:
        from .backends.cuda_ops import CudaOps

        return CudaOps()
    except Exception as e:
        if device == "auto":
            return fallback()
        if isinstance(e, ReflexError):
            raise
        raise ReflexError("cuda_error", f"the CUDA backend is unavailable: {type(e).__name__}: {e}") from e


def _start_mode(start):
    """REFLEX_START (or the value given) for device "auto"."""
    if start is not None:
        return start
    from . import settings

    return settings.get().start


def load_runner(model=None, device="auto", n_ctx=None, lora=None, start=None, gpu_now=True):
    """A Runner for `model` (path, alias or None for the default) on `device`, with LoRA
    adapters `lora` (a list of "FILE[:SCALE]" strings, {"path", "scale"} dicts or (path,
    scale) pairs; reflex_ipc/lora.py) applied at load.

    With device "auto" where CUDA may be usable (pycuda installed, the architecture runs on
    it), `start` (default: $REFLEX_START) says where requests that come before the GPU is
    ready run: "gpu" loads on CUDA as before (the runner waits for it); "auto", "cpu" and
    "race" load on the cpu backend now (the mapped weights, no copy) and bring the CUDA
    backend up on a thread (`runner.pending`) when gpu_now, else when a request first asks
    for it (startrule.py decides per request; handover.py moves the runner)."""
    t0 = time.perf_counter()
    mode = _start_mode(start) if device == "auto" else None
    import numpy  # noqa: F401  (needed anyway; loaded first, GGUFFile walks the vocab with it)

    # CUDA's init: cuInit and the context run on a ctypes thread the CLI starts first thing
    # (cuda.start_driver); its pycuda side starts here, after numpy, which pycuda imports too:
    # started before, it held the import lock and the GIL against the main thread's imports
    gpu = False
    if device == "cuda" or (device == "auto" and mode == "gpu"):
        from . import cuda

        gpu = cuda.start_init()  # overlaps CUDA start-up with the GGUF parse and the tokenizer
    from . import phases
    from .gguffile import GGUFFile
    from .modelpath import resolve_model

    phases.mark("numpy_imported")
    path = resolve_model(model)
    f = GGUFFile(path)
    phases.mark("gguf_open")
    adapters = []
    late = False
    try:
        from .models import ARCHITECTURES, NO_CPU, NO_CUDA, NUMPY_ONLY, cuda_unfit, load_model
        from .tokenizer import load_tokenizer

        if f.architecture not in ARCHITECTURES:
            raise ReflexError("unsupported_architecture",
                              f"architecture {f.architecture!r} is not supported "
                              f"(supported: {', '.join(ARCHITECTURES)})")
        if device == "auto" and f.architecture in NUMPY_ONLY:
            device = "numpy"  # its ops exist on numpy only so far
        elif device == "auto" and (f.architecture in NO_CUDA or cuda_unfit(f)):
            device = "cpu"
        if device == "auto" and mode != "gpu" and f.architecture not in NO_CPU:
            from . import cuda

            late = cuda.pycuda_installed()  # else "auto" is the cpu backend anyway
            if late and gpu_now:
                cuda.start_init()  # beside the tokenizer and the cpu backend's load
        if late or device in ("cpu", "numpy") or (device == "auto" and not gpu):
            _prefault(f)  # the first pass on the CPU finds its pages mapped
        tok = load_tokenizer(f)
        phases.mark("tokenizer")
        lora_set = None
        if lora:
            from . import lora as lora_mod

            adapters = lora_mod.open_adapters(lora_mod.normalize(lora), f)
        if late:
            ops = _cpu_backend(threads=_cpu_threads_beside_gpu(gpu_now))
            phases.mark("cpu_backend_ready")
        else:
            ops = make_backend(device, no_cpu=f.architecture in NO_CPU)
            phases.mark("backend_ready")  # with CUDA: the init thread joined, kernels loaded
        if adapters:
            lora_set = lora_mod.LoraSet(ops, adapters)
        net = load_model(ops, f, lora_set)
        phases.mark("weights_loaded")  # with CUDA: uploaded
        runner = Runner(path, f, ops, net, tok, n_ctx, _ms(t0))
        f.release_metadata()  # parsed: its pages leave the resident set (the page cache keeps them)
    except BaseException:
        for a in adapters:
            a.close()
        f.close()
        raise
    finally:
        if gpu:
            from . import cuda

            cuda.startup_done()
    if adapters:
        runner.lora = adapters
        runner.lora_mode = lora_set.mode
        runner.adapters = [(lora_mod.digest(a), a.scale) for a in adapters]
    if late:
        runner.start_mode = mode
        if gpu_now:
            runner.pending = _late_cuda(f, adapters)
        else:
            runner.want_gpu = lambda: _want_cuda(runner, f, adapters)
    return runner


def _prefault(f):
    """Map the tensor data's pages on a thread (prefault.py) while the tokenizer and the
    backend load: the cpu backend reads every weight in place on its first pass."""
    if f.prefault is not None:  # the CLI premapped the file and started on it already
        return None
    n = f.size - f.data_offset
    if n <= 0:
        return None
    from . import prefault

    v = f.bytes_view(f.data_offset, n)
    f.prefault = prefault.start(v.ctypes.data, n)
    return None


def _cpu_threads_beside_gpu(gpu_now):
    """The cpu backend's threads while CUDA comes up: a core left to its init and upload
    threads (also to cuInit alone, which the CLI starts first thing)."""
    from . import cuda, settings, startrule

    n = settings.get().cpu_threads
    if n:
        return n
    cores = startrule.host()["cores"]
    return max(1, cores - 1) if (gpu_now or cuda.started()) and cores > 2 else None


def _want_cuda(runner, f, adapters):
    """A request asks for the GPU that was not brought up at load: bring it up now."""
    from . import cuda

    runner.want_gpu = None
    cuda.start_init()
    runner.pending = _late_cuda(f, adapters)


def _late_cuda(f, adapters):
    """The CUDA backend for GGUFFile f coming up on a thread (handover.LateBackend): the init
    thread joined, the model's weights uploaded. Taking it makes the context current in the
    taking thread."""
    from . import cuda, phases
    from .handover import LateBackend

    def build():
        try:
            from .backends.cuda_ops import CudaOps
            from .models import load_model

            ops = CudaOps()
            phases.mark("gpu_backend_ready")
            lora_set = None
            if adapters:
                from .lora import LoraSet

                lora_set = LoraSet(ops, adapters)
            net = load_model(ops, f, lora_set)
            ops.wait_uploads()
            phases.mark("gpu_ready")
            return ops, net
        finally:
            cuda.startup_done()
            cuda.release_thread()  # the taker pushes the context in its own thread

    return LateBackend.thread(build, "cuda", prepare=cuda.runtime)


def _name_of(name, path) -> str:
    """general.name when it is a non-empty string (a file may hold anything there), else
    the file's name."""
    import os

    return name if isinstance(name, str) and name else os.path.basename(path)


class Runner:
    def __init__(self, path, f, ops, model, tok, n_ctx, load_ms):
        from .runtime.executor import Executor

        self.path, self.f, self.ops, self.model, self.tok = path, f, ops, model, tok
        hp = model.hp
        if n_ctx is None:
            n_ctx = min(hp.n_ctx_train or DEFAULT_N_CTX, DEFAULT_N_CTX)
        n_ctx = int(n_ctx)
        if n_ctx < 1:
            raise ReflexError("invalid_request", f"n_ctx must be positive, not {n_ctx}")
        self.n_ctx = n_ctx
        if hasattr(model, "configure"):
            model.configure(n_ctx)  # what depends on the context the engine runs with (LongRoPE)
        self.exec = Executor(ops, model, n_ctx)
        self.n_vocab = tok.n_vocab
        self.n_out = model.output.shape[0]  # LM head rows (a padded vocabulary has more)
        if self.n_out < self.n_vocab:
            raise ReflexError("gguf_error", f"the output layer has {self.n_out} rows for a vocabulary "
                              f"of {self.n_vocab} tokens")
        self.load_ms = load_ms
        self.adapters = []  # [(adapter digest, scale)] of LoRA adapters applied at load
        self.lora = []  # their lora.Adapter objects (open until close: runtime mode reads them)
        self.lora_mode = None
        self._identity = None
        # starting on the CPU while the GPU comes up (startrule.py, handover.py)
        self.pending = None  # handover.LateBackend: the backend the runner moves to when ready
        self.start_mode = None  # REFLEX_START for requests that come while pending (None: none)
        self.want_gpu = None  # start_gpu(): brings the GPU up when a request asks for it
        self.handovers = []  # [{"from", "to", "at_ms", "ms", "bytes", "tokens"}]
        self.gpu_error = None  # why the pending backend failed (the runner stays where it is)
        self._weight_bytes = None
        self._mapped = False  # a pass has run on this backend (its weight pages are mapped)

    # -- small things ----------------------------------------------------------------
    def info(self) -> dict:
        hp = self.model.hp
        import os

        from .modeldefaults import sampling_defaults

        return {
            "model": _name_of(self.f.get("general.name"), self.path),
            "path": self.path,
            "architecture": hp.arch,
            "backend": self.ops.name,
            "device": self.ops.device,
            "n_vocab": self.n_vocab,
            "n_ctx": self.n_ctx,
            "n_ctx_train": hp.n_ctx_train,
            "n_layer": hp.n_layer,
            "n_embd": hp.n_embd,
            "n_head": hp.n_head,
            "n_head_kv": hp.n_head_kv,
            "load_ms": self.load_ms,
            "lora": [{"path": a.path, "scale": a.scale} for a in self.lora],
            "sampling": sampling_defaults(self.f),
            "next_backend": self.pending.name if self.pending is not None else None,
        }

    def tokenize(self, text, *, add_bos=False, parse_special=True) -> list:
        return self.tok.encode(text, add_bos=add_bos, parse_special=parse_special)

    def detokenize(self, ids, *, special=False) -> str:
        """The text of token ids; control tokens (e.g. <|im_end|>) rendered when special."""
        return self.tok.decode(ids, special=special)  # iterated once: no copy of a long list

    def close(self):
        if self.pending is not None:  # a backend still coming up: dropped when its thread ends
            self.pending.cancelled = True
        self.pending = self.want_gpu = None
        store = sys.modules.get("reflex_ipc.runtime.prefixstore")
        if store is not None:
            store.flush(self)  # what the last request queued, from the state it left
        self.exec.close()
        for a in self.lora:
            a.close()
        self.f.close()

    def _continuation_ids(self, text):
        """Token ids of text that follows saved tokens: a string, tokenized as text that
        continues other text (no BOS, no SentencePiece space prefix), or ids (checked)."""
        if isinstance(text, str):
            tok = self.tok
            if not getattr(tok, "add_space_prefix", False):
                return tok.encode(text, add_bos=False)
            tok.add_space_prefix = False
            try:
                return tok.encode(text, add_bos=False)
            finally:
                tok.add_space_prefix = True
        ids = [int(i) for i in text]
        self._check_ids(ids)
        return ids

    # -- helpers ------------------------------------------------------------------------
    @staticmethod
    def _checker(should_cancel):
        if should_cancel is None:
            return None

        def check():
            if should_cancel():
                raise ReflexError("cancelled", "the request was cancelled")

        return check

    def _row(self, logits):
        """Backend logits [1, V] -> numpy float32 [n_vocab]."""
        return self.ops.to_numpy(logits)[0, :self.n_vocab]

    def _check_ids(self, ids):
        bad = [i for i in ids if not 0 <= int(i) < self.n_vocab]
        if bad:
            raise ReflexError("invalid_request", f"token id {bad[0]} is outside the vocabulary "
                              f"(0..{self.n_vocab - 1})")

    def _prompt_ids(self, prompt):
        """Token ids of a prompt: a string (tokenized) or a list of ids (checked, used as is)."""
        if isinstance(prompt, str):
            ids = self.tok.encode(prompt)
        else:
            ids = [int(i) for i in prompt]
            self._check_ids(ids)
        if not ids:
            raise ReflexError("invalid_request", "the prompt is empty (no tokens)")
        return ids

    def prompt_logits(self, token_ids):
        """float32 [n_vocab]: the logits after the last of token_ids, from an empty state."""
        ids = self._prompt_ids(list(token_ids))
        if len(ids) > self.n_ctx:
            raise ReflexError("context_overflow", f"{len(ids)} tokens exceed the context of {self.n_ctx}")
        import numpy as np

        logits, _ = self.exec.prefill(ids, reuse=False)
        return np.asarray(self._row(logits), dtype=np.float32)

    # -- saved state (savedstate.py; runtime/statefile.py, protocol/STATE.md) -----------
    def identity(self):
        """(model digest, adapter digest) that a saved state must carry to load here."""
        from . import savedstate

        return savedstate.identity(self)

    def save_state(self, path) -> dict:
        """Write the state's tokens and arrays to `path` (atomically replaced). Returns
        {"path", "n_tokens", "bytes", "timings": {"state_save"}}."""
        from . import savedstate

        return savedstate.save(self, path)

    def load_state(self, path) -> dict:
        """Load a saved state (the next request whose tokens start with its tokens evaluates
        only the rest). Returns {"path", "n_tokens", "timings": {"state_load"}}."""
        from . import savedstate

        return savedstate.load(self, path)

    def _open_state(self, path):
        from . import savedstate

        return savedstate.open_checked(self, path)

    def _restore(self, sf, room=0):
        from . import savedstate

        savedstate.restore(self, sf, room)

    # -- starting on the CPU, finishing on the GPU (startrule.py, handover.py) -----------
    def weight_bytes(self):
        """(bytes, weights) one forward pass reads: every tensor, mixture-of-experts tensors
        scaled by the share of experts a token uses, the embedding table left out when the
        output matrix is its own (only rows of it are read)."""
        if self._weight_bytes is None:
            f, hp = self.f, self.model.hp
            n_exp = getattr(hp, "n_expert", 0) or 0
            used = getattr(hp, "n_expert_used", 0) or 0
            share = used / n_exp if n_exp and used else 1.0
            untied = "output.weight" in f.tensors
            total = elems = 0
            for name, t in f.tensors.items():
                if untied and name == "token_embd.weight":
                    continue
                k = share if "_exps" in name else 1.0
                total += t.nbytes * k
                elems += t.n_elements * k
            self._weight_bytes = (int(total), int(elems))
        return self._weight_bytes

    def adopt(self, wait=False, mid_request=False) -> bool:
        """Move to the pending backend when it is ready (with wait: once it is). Returns whether
        the runner moved. A backend that failed is dropped (its error in gpu_error); the runner
        stays where it is. mid_request: a request's state, partly computed on the old backend,
        is not offered to the prefix store (its segments are kept per backend)."""
        lb = self.pending
        if lb is None or not (wait or lb.ready()):
            return False
        import time as _t

        t0 = _t.perf_counter()
        try:
            ops, model = lb.take()
        except BaseException as e:  # noqa: BLE001  (the GPU is optional for device "auto")
            self.pending = None
            self.gpu_error = f"{type(e).__name__}: {e}"
            return False
        self.pending = None
        if hasattr(model, "configure"):
            model.configure(self.n_ctx)
        old = self.ops.name
        n = len(self.exec.tokens)
        if mid_request:
            self.exec.store = None
        moved = self.exec.move_to(ops, model)
        self.ops, self.model = ops, model
        self._mapped = False
        from . import phases

        self.handovers.append({"from": old, "to": ops.name, "at_ms": round(phases.since_launch_ms(), 3),
                               "ms": _ms(t0), "bytes": moved, "tokens": n})
        return True

    def start_request(self, op, prompt_tokens, gen_tokens=0, one_pass=False):
        """Before a request runs: move to a pending backend that is ready; while it is not,
        decide (startrule.decide) where this request runs: "cpu" (here, to the end), "gpu"
        (wait for it, then move) or "race" (here, moving between steps once it is ready).
        Returns the decision (None when no other backend is coming)."""
        if self.pending is None and self.want_gpu is None:
            return None
        if self.pending is not None and self.pending.ready():
            self.adopt()
            return {"choice": "gpu", "mode": self.start_mode, "gpu_in_ms": 0.0, "ready": True}
        from . import phases, startrule
        from .cuda import progress

        req = startrule.Request(op, prompt_tokens, gen_tokens, one_pass=one_pass,
                                state_bytes=self._state_bytes())
        W, E = self.weight_bytes()
        d = startrule.decide(W, req, elems=E, mode=self.start_mode or "auto",
                             now_ms=phases.since_launch_ms(), progress=progress(),
                             cpu_mapped=self._mapped, threads=getattr(self.ops, "threads", None))
        d["backend"] = self.ops.name
        if d["choice"] != "cpu" and self.pending is None and self.want_gpu is not None:
            self.want_gpu()  # the GPU was not brought up at start: now it is wanted
        if d["choice"] == "gpu":
            t0 = time.perf_counter()
            self.adopt(wait=True)
            d["waited_ms"] = _ms(t0)
        elif d["choice"] == "race" and self.pending is not None:
            self.exec.mover = self._poll
        self._mapped = True
        return d

    def end_request(self):
        self.exec.mover = None

    def _poll(self):
        if self.pending is not None and self.pending.ready():
            self.adopt(mid_request=True)

    def _state_bytes(self):
        from .handover import state_nbytes

        return state_nbytes(self.exec.state)

    # -- the algorithms ----------------------------------------------------------------
    def stream(self, prompt, params=None, *, constraint=None, on_logits=None, should_cancel=None,
               cache_prompt=True, kv_import=None, kv_export=None, prefix_cache=True, **kw):
        """A generation.Generation of `prompt` (a string, or a list of token ids used as is):
        iterate it for the token events, then read its .result. `params` (a
        generation.Params) says what to generate; keyword arguments name its fields instead
        (or override them). The prompt is tokenized and evaluated here, before iterating.

        Generation ends at an end-of-generation token (not included in token_ids or text;
        finish_reason "stop"), after max_tokens tokens ("length"), when the text contains one
        of `stop` ("stop_string"; the text ends before it, token_ids keep the token that
        completed it), or when the constraint is done ("stop").

        constraint: an object with allowed() -> numpy bool [n_vocab] or None, commit(token_id),
        done() -> bool and reset() (constrain.py); tokens it disallows get -inf on the backend
        before selection. on_logits(step, row) receives each step's logits (numpy float32
        [n_vocab], before the constraint and the processors) before the token is chosen.
        cache_prompt: reuse the state of the longest common token prefix with what the
        previous request left (the result's cached_tokens). kv_import: a saved state file
        (protocol/STATE.md) to start from; `prompt` is then the text (or ids) that follows its
        tokens, tokenized without BOS, and only that is evaluated. kv_export: a file to save
        the state to once the prompt is evaluated (before generating). The result then has
        "kv_import"/"kv_export": {"path", "n_tokens"[, "bytes"]} and timings
        state_load/state_save. prefix_cache: start from the prefix cache's saved state of the
        prompt's leading tokens and queue the prompt's state for it after the answer
        (runtime/prefixstore.py); timings prefix_cache_tokens / prefix_cache_import.
        """
        from .generation import Generation, Params

        if params is None:
            params = Params(**kw)
        elif kw:
            params = params.replace(**kw)
        return Generation(self, prompt, params, constraint=constraint, on_logits=on_logits,
                          should_cancel=should_cancel, cache_prompt=cache_prompt,
                          kv_import=kv_import, kv_export=kv_export, prefix_cache=prefix_cache)

    def generate(self, prompt, params=None, *, on_token=None, **kw) -> dict:
        """stream(prompt, params, **kw) run to the end. Returns
        {"token_ids", "text", "finish_reason", "prompt_tokens", "completion_tokens",
        "cached_tokens", ["logprobs"], ["reasoning_content"], ["choices"] (n > 1), "timings"}.

        on_token(token_id, text, **extra) is called for each generated token with the text
        that became final with it ("" while text is held back: an incomplete UTF-8
        character or a possible start of a stop string); extra holds the event's other
        fields (logprobs, reasoning_content, index). When generation ends at an
        end-of-generation token with text still held back, one last call on_token(eog_id,
        rest) delivers it. The texts of all calls join to the result's text."""
        return self.stream(prompt, params, **kw).run(on_token)

    def system1(self, prompt, candidates, **kw) -> dict:
        """Scores candidate continuations of `prompt` (scoring.system1)."""
        from . import scoring

        return scoring.system1(self, prompt, candidates, **kw)

    def embed(self, texts, **kw) -> dict:
        """Pooled final hidden states of texts (embedding.embed)."""
        from . import embedding

        return embedding.embed(self, texts, **kw)
