"""The Runner: a loaded model with its tokenizer, backend and executor, and the
algorithms the protocol's ops run (generate, system1, embed).

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

import time

from .errors import ReflexError

DEFAULT_N_CTX = 4096
SEQ_GROUP = 16  # system1 on recurrent models: candidates per batch (each holds a copy of the state)


def _ms(t0, t1=None):
    return round(((time.perf_counter() if t1 is None else t1) - t0) * 1e3, 3)


def _cpu_backend():
    """The compiled CPU backend, else (kernels not built or not loadable) the numpy one, with a
    warning that says why (once per process)."""
    from .backends import cpu_ops

    ok, why = cpu_ops.available()
    if ok:
        try:
            return cpu_ops.CpuOps()
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
    from .ops import DEVICES

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


def load_runner(model=None, device="auto", n_ctx=None, lora=None):
    """A Runner for `model` (path, alias or None for the default) on `device`, with LoRA
    adapters `lora` (a list of "FILE[:SCALE]" strings, {"path", "scale"} dicts or (path,
    scale) pairs; reflex_ipc/lora.py) applied at load."""
    t0 = time.perf_counter()
    gpu = False
    if device in ("auto", "cuda"):
        from . import cuda

        gpu = cuda.start_init()  # overlaps CUDA start-up with the GGUF parse and the tokenizer
    import numpy  # noqa: F401  (needed anyway; loaded first, GGUFFile walks the vocab with it)

    from . import phases
    from .gguffile import GGUFFile
    from .modelpath import resolve_model

    phases.mark("numpy_imported")
    path = resolve_model(model)
    f = GGUFFile(path)
    phases.mark("gguf_open")
    adapters = []
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
        tok = load_tokenizer(f)
        phases.mark("tokenizer")
        lora_set = None
        if lora:
            from . import lora as lora_mod

            adapters = lora_mod.open_adapters(lora_mod.normalize(lora), f)
        ops = make_backend(device, no_cpu=f.architecture in NO_CPU)
        phases.mark("backend_ready")  # with CUDA: the init thread joined, kernels loaded
        if adapters:
            lora_set = lora_mod.LoraSet(ops, adapters)
        net = load_model(ops, f, lora_set)
        phases.mark("weights_loaded")  # with CUDA: uploaded
        runner = Runner(path, f, ops, net, tok, n_ctx, _ms(t0))
    except BaseException:
        for a in adapters:
            a.close()
        f.close()
        raise
    finally:
        if gpu:
            cuda.startup_done()
    if adapters:
        runner.lora = adapters
        runner.lora_mode = lora_set.mode
        runner.adapters = [(lora_mod.digest(a), a.scale) for a in adapters]
    return runner


def _name_of(name, path) -> str:
    """general.name when it is a non-empty string (a file may hold anything there), else
    the file's name."""
    import os

    return name if isinstance(name, str) and name else os.path.basename(path)


class _StopText:
    """Generated text released as it becomes final: never past a stop string, and holding
    back any tail that could still become the start of one."""

    def __init__(self, stops):
        self.stops = [s for s in stops if s]
        self.maxlen = max((len(s) for s in self.stops), default=0)
        self.text = ""
        self.emitted = 0

    def push(self, piece):
        """Add decoded text; returns (newly final text, stopped)."""
        before = len(self.text)
        self.text += piece
        safe = len(self.text)
        if self.stops:
            start = max(0, before - self.maxlen + 1)
            hits = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
            if hits:
                cut = min(hits)
                self.text = self.text[:cut]
                return self._release(cut), True
            hold = 0
            for s in self.stops:
                for k in range(min(len(s) - 1, len(self.text)), hold, -1):
                    if self.text.endswith(s[:k]):
                        hold = k
                        break
            safe -= hold
        return self._release(safe), False

    def _release(self, upto):
        out = self.text[self.emitted:upto] if upto > self.emitted else ""
        self.emitted = max(self.emitted, upto)
        return out

    def rest(self):
        """Everything held back (generation ended without completing a stop string)."""
        return self._release(len(self.text))


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

    # -- small things ----------------------------------------------------------------
    def info(self) -> dict:
        hp = self.model.hp
        import os

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
        }

    def tokenize(self, text, *, add_bos=False, parse_special=True) -> list:
        return self.tok.encode(text, add_bos=add_bos, parse_special=parse_special)

    def detokenize(self, ids, *, special=False) -> str:
        """The text of token ids; control tokens (e.g. <|im_end|>) rendered when special."""
        return self.tok.decode(list(ids), special=special)

    def close(self):
        self.exec.close()
        for a in self.lora:
            a.close()
        self.f.close()

    # -- saved state (runtime/statefile.py, protocol/STATE.md) ---------------------------
    def identity(self):
        """(model digest, adapter digest) that a saved state must carry to load here."""
        if self._identity is None:
            from .runtime.statefile import adapter_digest, model_digest

            self._identity = (model_digest(self.f), adapter_digest(self.adapters))
        return self._identity

    def save_state(self, path) -> dict:
        """Write the state's tokens and arrays to `path` (atomically replaced). Returns
        {"path", "n_tokens", "bytes", "timings": {"state_save"}}."""
        from .runtime import statefile

        t0 = time.perf_counter()
        path = statefile.resolve_path(path)
        st = self.exec.state
        if st is None or not st.tokens:
            raise ReflexError("invalid_request", "the state holds no tokens to save")
        tokens, arrays = st.snapshot()
        layers = [(spec.kind, [(name, arrays[i][name], spec.slot_axis(name) if spec.kind == "slot" else None)
                               for name in spec.arrays]) for i, spec in enumerate(st.specs)]
        digest, adig = self.identity()
        size = statefile.write_state(path, digest=digest, adapters_digest=adig, arch=self.model.hp.arch,
                                     tokens=tokens, layers=layers)
        return {"path": path, "n_tokens": len(tokens), "bytes": size, "timings": {"state_save": _ms(t0)}}

    def _open_state(self, path):
        """A StateFile checked against this runner: structure (state_error) and identity,
        context and layout (invalid_request naming the mismatch)."""
        from .runtime import statefile

        sf = statefile.StateFile(statefile.resolve_path(path))
        try:
            self._check_state(sf)
        except BaseException:
            sf.close()
            raise
        return sf

    def _check_state(self, sf):
        import os

        def bad(msg):
            return ReflexError("invalid_request", f"{sf.path}: {msg}")

        arch = self.model.hp.arch
        if sf.arch != arch:
            raise bad(f"the state was saved by a {sf.arch!r} model; this model's architecture is {arch!r}")
        digest, adig = self.identity()
        if sf.digest != digest:
            raise bad(f"the state was saved by another model (model digest {sf.digest.hex()[:16]}, "
                      f"{os.path.basename(self.path)} has {digest.hex()[:16]})")
        if sf.adapters_digest != adig:
            raise bad("the state was saved with other LoRA adapters or scales than this model has loaded")
        if sf.n_tokens > self.n_ctx:
            raise bad(f"the state holds {sf.n_tokens} tokens; n_ctx {self.n_ctx} is too small")
        specs = self.model.state_spec()
        if len(specs) != len(sf.layers):
            raise bad(f"{len(sf.layers)} layers of state; the model has {len(specs)}")
        for i, (spec, (kind, arrays)) in enumerate(zip(specs, sf.layers)):
            names = [e.name for e in arrays]
            if kind != spec.kind or sorted(names) != sorted(spec.arrays):
                raise bad(f"layer {i}: {kind} state {names}; the model keeps {spec.kind} state "
                          f"{sorted(spec.arrays)}")
            for e in arrays:
                want = spec.shape(e.name, sf.n_tokens) if kind == "slot" else spec.shape(e.name, 1)[1:]
                axis = spec.slot_axis(e.name) if kind == "slot" else None
                if tuple(e.shape) != tuple(want) or e.slot_axis != axis:
                    raise bad(f"layer {i} array {e.name!r}: shape {e.shape}; the model's is {want}")
        if sf.tokens and max(sf.tokens) >= self.n_vocab:
            raise ReflexError("state_error", f"{sf.path}: token id {max(sf.tokens)} is outside the vocabulary")

    def _restore(self, sf, room=0):
        """Make the executor's state hold the saved tokens and arrays, with room for `room`
        more tokens (so that the request that follows needs no larger state)."""
        ex = self.exec
        ex.forget()
        st = ex.reserve(max(sf.n_tokens + room, 1))
        sf.restore(st)

    def load_state(self, path) -> dict:
        """Load a saved state (the next request whose tokens start with its tokens evaluates
        only the rest). Returns {"path", "n_tokens", "timings": {"state_load"}}."""
        t0 = time.perf_counter()
        with self._open_state(path) as sf:
            self._restore(sf)
            return {"path": sf.path, "n_tokens": sf.n_tokens, "timings": {"state_load": _ms(t0)}}

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

    def _token_text(self, tid):
        return self.tok.token_bytes(int(tid)).decode("utf-8", "replace")

    def _logprob_entry(self, logits, tid, n, temperature):
        """{"token_id", "text", "logprob", "top": [...n]} for the chosen token tid: the
        full-vocabulary log-softmax of logits / temperature (1 when greedy), on the backend."""
        ops = self.ops
        z = logits if temperature <= 0.0 or temperature == 1.0 else ops.scale(logits, 1.0 / temperature)
        top = [int(t) for t in ops.topk(z, n, n=self.n_vocab)] if n > 0 else []
        lp = ops.logprobs(z, [0] * (len(top) + 1), [tid, *top], n=self.n_vocab)
        return {"token_id": int(tid), "text": self._token_text(tid), "logprob": float(lp[0]),
                "top": [{"token_id": t, "text": self._token_text(t), "logprob": float(v)}
                        for t, v in zip(top, lp[1:])]}

    def prompt_logits(self, token_ids):
        """float32 [n_vocab]: the logits after the last of token_ids, from an empty state."""
        ids = self._prompt_ids(list(token_ids))
        if len(ids) > self.n_ctx:
            raise ReflexError("context_overflow", f"{len(ids)} tokens exceed the context of {self.n_ctx}")
        import numpy as np

        logits, _ = self.exec.prefill(ids, reuse=False)
        return np.asarray(self._row(logits), dtype=np.float32)

    # -- generate ------------------------------------------------------------------
    def generate(self, prompt, *, max_tokens=64, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0,
                 seed=None, repeat_penalty=1.0, repeat_last_n=64, stop=(), on_token=None,
                 should_cancel=None, cache_prompt=True, logprobs=None, constraint=None,
                 on_logits=None, kv_import=None, kv_export=None) -> dict:
        """Continue `prompt` (a string, or a list of token ids used as is). Generation ends at
        an end-of-generation token (not included in token_ids or text; finish_reason "stop"),
        after max_tokens tokens ("length"), when the text contains one of `stop`
        ("stop_string"; the text ends before it, token_ids keep the token that completed
        it), or when the constraint is done ("stop").

        on_token(token_id, text, **extra) is called for each generated token with the text
        that became final with it ("" while text is held back: an incomplete UTF-8
        character or a possible start of a stop string); extra holds `logprobs=entry` when
        logprobs were asked for. When generation ends at an end-of-generation token with text
        still held back, one last call on_token(eog_id, rest) delivers it. The texts of all
        calls join to the result's text.

        cache_prompt: reuse the state of the longest common token prefix with what the
        previous request left (the result's cached_tokens says how many prompt tokens were
        not evaluated again). logprobs=N (0-20; None: none): each generated token's
        log-probability and the N most likely alternatives (result["logprobs"]). constraint: an object with
        allowed() -> numpy bool [n_vocab] or None, commit(token_id) and done() -> bool
        (reflex_ipc's constrained decoding); tokens it disallows get -inf on the backend
        before selection. on_logits(step, row) receives each step's logits (numpy float32
        [n_vocab], before the constraint) before the token is chosen.

        kv_import: a saved state file (protocol/STATE.md) to start from; `prompt` is then the
        text (or ids) that follows its tokens, tokenized without BOS, and only that is
        evaluated. kv_export: a file to save the state to once the prompt is evaluated
        (before generating). The result then has "kv_import"/"kv_export": {"path",
        "n_tokens"[, "bytes"]} and timings state_load/state_save.
        """
        import numpy as np

        from .sampling import Sampler, apply_repeat_penalty

        # the parameters' ranges are the protocol's (reflex_ipc/ops/generate.py), checked when a
        # request or the CLI's options are decoded; here only what depends on the model
        t0 = time.perf_counter()
        if isinstance(stop, str):
            stop = (stop,)
        max_tokens = int(max_tokens)
        check = self._checker(should_cancel)
        extra_out, extra_t = {}, {}
        sf = self._open_state(kv_import) if kv_import is not None else None
        try:
            ids = sf.tokens + self._continuation_ids(prompt) if sf is not None else self._prompt_ids(prompt)
            t_tok = time.perf_counter()
            if len(ids) + max_tokens > self.n_ctx:
                raise ReflexError("context_overflow",
                                  f"{len(ids)} prompt tokens + max_tokens {max_tokens} exceed the "
                                  f"context of {self.n_ctx}")
            if sf is not None:
                self._restore(sf, room=len(ids) - sf.n_tokens + max_tokens)
                cache_prompt = True  # the imported tokens are the prefix to keep
                extra_out["kv_import"] = {"path": sf.path, "n_tokens": sf.n_tokens}
                extra_t["state_load"] = _ms(t_tok)
        finally:
            if sf is not None:
                sf.close()
        ops, ex = self.ops, self.exec
        sampler = Sampler(temperature, top_k, top_p, min_p, seed)
        penalize = repeat_penalty != 1.0 and (repeat_last_n != 0)
        # argmax on the backend unless the logits need host work (penalty, padded vocabulary)
        on_device = sampler.greedy and not penalize and self.n_out == self.n_vocab
        window = len(ids) + max_tokens if repeat_last_n < 0 else int(repeat_last_n)
        eog = self.tok.eog_ids
        dec = self.tok.stream_decoder()
        st = _StopText(stop)
        out_ids: list = []
        entries: list = []
        finish = "length"
        cached = 0
        want_lp = logprobs is not None
        n_lp = int(logprobs) if want_lp else 0

        def choose(logits):
            step = len(out_ids)
            if on_logits is not None:
                on_logits(step, np.array(self._row(logits), dtype=np.float32))
            raw = logits
            if constraint is not None:
                allowed = constraint.allowed()
                if allowed is not None:
                    bias = np.full((1, logits.shape[-1]), -np.inf, np.float32)
                    bias[0, :self.n_vocab][np.asarray(allowed, bool)[:self.n_vocab]] = 0.0
                    logits = ops.add(logits, ops.asarray(bias))
            if on_device:
                tid = ex.argmax(logits) if logits is raw else int(ops.argmax(logits)[0])
            else:
                row = self._row(logits).copy()
                if penalize and window > 0:
                    apply_repeat_penalty(row, (ids + out_ids)[-window:], repeat_penalty)
                tid = sampler(row)
            if want_lp:
                entries.append(self._logprob_entry(raw, tid, n_lp, sampler.temperature))
            return tid

        if max_tokens > 0 or kv_export is not None:
            logits, cached = ex.prefill(ids, room=max_tokens, reuse=cache_prompt, check=check)
        if kv_export is not None:
            saved = self.save_state(kv_export)
            extra_t.update(saved.pop("timings"))
            extra_out["kv_export"] = saved
        if max_tokens > 0:
            self.ops.synchronize()  # an asynchronous backend's prefill ends here, not at its last launch
        t_prompt = time.perf_counter()
        tokens = ex.decode(logits, choose, check) if max_tokens > 0 else iter(())
        for tid in tokens:
            extra = {"logprobs": entries[-1]} if want_lp else {}
            if tid in eog:
                if want_lp:
                    entries.pop()  # the end-of-generation token is not part of the output
                rest, stopped = st.push(dec.flush())
                finish = "stop_string" if stopped else "stop"
                rest += "" if stopped else st.rest()
                if rest and on_token is not None:
                    on_token(tid, rest)
                break
            out_ids.append(tid)
            if constraint is not None:
                constraint.commit(tid)
            piece = dec.feed(tid)
            done = constraint is not None and constraint.done()
            last = len(out_ids) >= max_tokens or done
            if last:
                piece += dec.flush()
            text, stopped = st.push(piece)
            if last and not stopped:
                text += st.rest()
            if on_token is not None:
                on_token(tid, text, **extra)
            if stopped:
                finish = "stop_string"
                break
            if last:
                finish = "stop" if done else "length"
                break
        t_end = time.perf_counter()
        n_dec = max(len(out_ids) - 1, 0)
        out = {
            "token_ids": out_ids,
            "text": st.text,
            "finish_reason": finish,
            "prompt_tokens": len(ids),
            "completion_tokens": len(out_ids),
            "cached_tokens": cached,
            "timings": {
                "tokenize": _ms(t0, t_tok),
                "prompt_eval": _ms(t_tok, t_prompt),
                "decode": _ms(t_prompt, t_end),
                "total": _ms(t0, t_end),
                "decode_tokens_per_s": round(n_dec / (t_end - t_prompt), 3) if n_dec and t_end > t_prompt else None,
            },
        }
        if want_lp:
            out["logprobs"] = entries[:len(out_ids)]
        out.update(extra_out)
        out["timings"].update(extra_t)
        return out

    # -- system1 -------------------------------------------------------------------
    def system1(self, prompt, candidates, *, temperature=1.0, should_cancel=None, cache_prompt=True,
                kv_import=None, kv_export=None) -> dict:
        """Score candidate continuations of `prompt` in one forward pass over all of them.

        Every candidate's tokens are stored after the prompt, each attending to the prompt and
        to its own earlier tokens only, at positions continuing from the prompt's end. When
        the prompt tokens not already held (prefix reuse) and the candidates fit one batch
        they run as one forward pass (timed as prompt_eval; candidates_eval is then 0);
        otherwise the prompt is prefilled first and the candidates follow in batches. logprob
        is the sum over a candidate's tokens of the full-vocabulary log-softmax (float64);
        probability is the softmax of logprob / temperature over the candidates; entropy is
        theirs, in bits. The state then holds the prompt.

        kv_import / kv_export: as for generate (the prompt is then the text after the saved
        tokens; each candidate is tokenized with it, without BOS); the export holds the
        prompt.

        On a model with recurrent layers (per-sequence state) the prompt is prefilled first,
        its state copied to one sequence per candidate, and the candidates run as one batch
        (SEQ_GROUP candidates at a time, which bounds the copies held), each from its own copy.
        """
        import numpy as np

        t0 = time.perf_counter()
        if isinstance(candidates, str) or not len(candidates):
            raise ReflexError("invalid_request", "candidates must be a non-empty list of strings")
        if not temperature > 0.0:
            raise ReflexError("invalid_request", f"temperature must be > 0, not {temperature}")
        check = self._checker(should_cancel)
        extra_out, extra_t = {}, {}
        sf = self._open_state(kv_import) if kv_import is not None else None
        try:
            return self._system1(prompt, candidates, temperature, check, cache_prompt, sf, kv_export,
                                 extra_out, extra_t, t0)
        finally:
            if sf is not None:
                sf.close()

    def _system1(self, prompt, candidates, temperature, check, cache_prompt, sf, kv_export, extra_out,
                 extra_t, t0):
        import numpy as np

        if sf is not None:
            if not isinstance(prompt, str):
                raise ReflexError("invalid_request", "the prompt must be a string")
            prefix = sf.tokens

            def encode(text):
                return prefix + self._continuation_ids(text)

            p_ids = encode(prompt)
        else:
            encode = self.tok.encode
            p_ids = self._prompt_ids(prompt)
        cand_ids = []
        for i, c in enumerate(candidates):
            if not isinstance(c, str):
                raise ReflexError("invalid_request", f"candidate {i} is not a string")
            full = encode(prompt + c)
            if full[:len(p_ids)] != p_ids:
                raise ReflexError("invalid_request",
                                  f"candidate {i} ({c[:40]!r}) changes the tokenization of the prompt: "
                                  f"the prompt's tokens are not a prefix of prompt+candidate")
            if len(full) == len(p_ids):
                raise ReflexError("invalid_request", f"candidate {i} ({c[:40]!r}) adds no tokens")
            cand_ids.append(full[len(p_ids):])
        t_tok = time.perf_counter()
        P, M = len(p_ids), sum(len(t) for t in cand_ids)
        if P + M > self.n_ctx:
            raise ReflexError("context_overflow", f"{P} prompt tokens + {M} candidate tokens exceed "
                              f"the context of {self.n_ctx}")
        ex = self.exec
        if sf is not None:
            t_imp = time.perf_counter()
            self._restore(sf, room=P - sf.n_tokens + M)
            cache_prompt = True
            extra_out["kv_import"] = {"path": sf.path, "n_tokens": sf.n_tokens}
            extra_t["state_load"] = _ms(t_imp)
        # candidate c's token t is stored at slot P + offset_c + t, rotated at position P + t,
        # and sees the prompt and its own tokens up to itself; token t is predicted by the
        # prompt's last logits (t = 0), else by the row of its candidate's token t - 1
        owner = np.concatenate([np.full(len(t), c) for c, t in enumerate(cand_ids)])
        within = np.concatenate([np.arange(len(t)) for t in cand_ids])
        flat = np.concatenate([np.asarray(t, np.int64) for t in cand_ids])
        starts = within == 0
        key_pos = np.concatenate([np.arange(P), P + within])  # the position of every slot
        mine = (owner[:, None] == owner[None, :]) & (within[None, :] <= within[:, None])
        recurrent = ex.recurrent
        held = ex.begin(p_ids, room=M, reuse=cache_prompt) if not recurrent else 0
        if not recurrent and P - held + M <= ex.chunk:
            # one pass over the prompt tokens not held and the candidates: the prompt causal,
            # candidates masked
            N = P - held + M
            allowed = np.zeros((N, P + M), dtype=bool)
            allowed[:P - held, :P] = np.arange(P)[None, :] <= np.arange(held, P)[:, None]
            allowed[P - held:, :P] = True
            allowed[P - held:, P:] = mine
            logits = ex.forward(np.concatenate([np.asarray(p_ids[held:], np.int64), flat]),
                                np.concatenate([np.arange(held, P), P + within]),
                                slots=np.arange(held, P + M), allowed=allowed, key_pos=key_pos,
                                rows=slice(P - held - 1, N), check=check)
            ex.state.tokens[:] = p_ids
            # row 0 is the prompt's last token, row r + 1 candidate token r
            lp_tok = self.ops.logprobs(logits, np.where(starts, 0, np.arange(M)), flat, n=self.n_vocab)
            t_prompt = time.perf_counter()
        else:
            # recurrent layers: the prompt's state computed once (sequence 0), then copied to
            # sequence j + 1 for the j-th candidate of a group of at most SEQ_GROUP (fork); a
            # group's candidates run as one batch, each from its own copy
            lp_tok = np.empty(M)
            C = len(cand_ids)
            group = min(C, SEQ_GROUP) if recurrent else C
            first, held = ex.prefill(p_ids, room=M, reuse=cache_prompt, check=check,
                                     n_seq=group + 1 if recurrent else 1)
            lp_tok[starts] = self.ops.logprobs(first, np.zeros(int(starts.sum()), np.int64), flat[starts],
                                               n=self.n_vocab)
            t_prompt = time.perf_counter()
            cstart = np.append(np.flatnonzero(starts), M)  # candidate c's tokens: cstart[c]..cstart[c+1]
            for c0 in range(0, C, group):
                c1 = min(C, c0 + group)
                seqs = None
                if recurrent:
                    ex.state.fork(0, range(1, c1 - c0 + 1))
                    seqs = owner - c0 + 1
                # batches of more than one chunk go in slot order, chunk by chunk: a token's keys
                # are all in its own or an earlier chunk
                for a in range(cstart[c0], cstart[c1], ex.chunk):
                    e = min(cstart[c1], a + ex.chunk)
                    allowed = np.zeros((e - a, P + e), dtype=bool)
                    allowed[:, :P] = True
                    allowed[:, P:] = mine[a:e, :e]
                    rows = ex.forward(flat[a:e], key_pos[P + a:P + e], slots=P + np.arange(a, e),
                                      allowed=allowed, key_pos=key_pos[:P + e], check=check,
                                      seqs=None if seqs is None else seqs[a:e])
                    r = np.arange(a, e)
                    has_next = np.flatnonzero((r + 1 < M) & ~starts[np.minimum(r + 1, M - 1)])
                    if has_next.size:
                        lp_tok[r[has_next] + 1] = self.ops.logprobs(rows, has_next, flat[r[has_next] + 1],
                                                                    n=self.n_vocab)
        t_eval = time.perf_counter()

        logprob = np.zeros(len(cand_ids))
        np.add.at(logprob, owner, lp_tok)
        # softmax of logprob / temperature, from differences to the best (<= 0): a tiny
        # temperature sends them to -inf, never to NaN
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            z = (logprob - logprob.max()) / temperature
        z = np.where(np.isnan(z), -np.inf, z)
        prob = np.exp(z)
        prob /= prob.sum()
        nz = prob[prob > 0]
        entropy = float(max(0.0, -(nz * np.log2(nz)).sum()))
        out = []
        for c, text in enumerate(candidates):
            n = len(cand_ids[c])
            out.append({"text": text, "token_ids": [int(x) for x in cand_ids[c]],
                        "logprob": float(logprob[c]), "mean_logprob": float(logprob[c] / n),
                        "probability": float(prob[c])})
        if kv_export is not None:
            saved = self.save_state(kv_export)
            extra_t.update(saved.pop("timings"))
            extra_out["kv_export"] = saved
        t_end = time.perf_counter()
        return {
            **extra_out,
            "candidates": out,
            "best_idx": int(np.argmax(logprob)),
            "entropy": entropy,
            "prompt_tokens": P,
            "candidate_tokens": M,
            "cached_tokens": held,
            "timings": {"tokenize": _ms(t0, t_tok), "prompt_eval": _ms(t_tok, t_prompt),
                        "candidates_eval": _ms(t_prompt, t_eval), "total": _ms(t0, t_end), **extra_t},
        }

    # -- embed ---------------------------------------------------------------------
    def embed(self, texts, *, pooling="mean", normalize=False, should_cancel=None) -> dict:
        """Pooled final hidden states (after the final norm) of each text: the mean over its
        tokens, the last token's, or the first token's ("cls"); L2-normalized on request."""
        import numpy as np

        t0 = time.perf_counter()
        if pooling not in ("mean", "last", "cls"):
            raise ReflexError("invalid_request", f"pooling must be mean, last or cls, not {pooling!r}")
        if isinstance(texts, str):
            texts = [texts]
        if not len(texts):
            raise ReflexError("invalid_request", "no texts to embed")
        check = self._checker(should_cancel)
        vectors, n_tokens = [], []
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise ReflexError("invalid_request", f"text {i} is not a string")
            ids = self.tok.encode(text)
            if not ids:
                raise ReflexError("invalid_request", f"text {i} is empty (no tokens)")
            if len(ids) > self.n_ctx:
                raise ReflexError("context_overflow", f"text {i}: {len(ids)} tokens exceed the "
                                  f"context of {self.n_ctx}")
            acc = first = last = None
            for h in self.exec.hidden(ids, check=check):
                h = self.ops.to_numpy(h).astype(np.float64)
                acc = h.sum(axis=0) if acc is None else acc + h.sum(axis=0)
                first = h[0] if first is None else first
                last = h[-1]
            v = {"mean": acc / len(ids), "last": last, "cls": first}[pooling]
            if normalize:
                norm = np.linalg.norm(v)
                v = v / norm if norm > 0 else v
            vectors.append(v.astype(np.float32).tolist())
            n_tokens.append(len(ids))
        t_end = time.perf_counter()
        return {"embeddings": vectors, "dim": len(vectors[0]), "n_tokens": n_tokens,
                "timings": {"total": _ms(t0, t_end)}}
