"""The Runner: a loaded model with its tokenizer, backend and KV cache.

`load_runner(model, device, n_ctx)` opens the GGUF, picks the backend (the
compiled CPU kernels on "cpu", the numpy oracle on "numpy", the CUDA kernels on "cuda",
CUDA when usable else cpu on "auto"), loads the
weights and the tokenizer and allocates one KV cache of n_ctx slots. Every
request starts from an empty cache.

Prompts are tokenized as llama.cpp's tools do: special tokens parsed, BOS per
the GGUF's add_bos flag. Errors are ReflexError with the protocol's kinds.
"""

from __future__ import annotations

import time

from .errors import ReflexError

DEFAULT_N_CTX = 4096
KV_MIN = 256  # smallest KV cache, in slots
DEVICES = ("auto", "cpu", "cuda", "numpy")


def _ms(t0, t1=None):
    return round(((time.perf_counter() if t1 is None else t1) - t0) * 1e3, 3)


def _cpu_backend():
    """The compiled CPU backend, else (kernels not built or not loadable) the numpy one, with a
    warning that says why (once per process)."""
    from .backends import cpu_ops

    ok, why = cpu_ops.available()
    if ok:
        return cpu_ops.CpuOps()
    from .backends.numpy_ops import NumpyOps

    if not getattr(cpu_ops, "_warned", False):
        import sys

        cpu_ops._warned = True
        print(f"reflex: warning: the CPU kernels are unavailable ({why}); using the numpy backend",
              file=sys.stderr)
    return NumpyOps()


def make_backend(device):
    """The backend ops object for a device name: "cpu" (the compiled kernels), "numpy" (the
    oracle), "cuda", or "auto" (CUDA when usable, else cpu)."""
    if device not in DEVICES:
        raise ReflexError("invalid_request", f"device {device!r} is not one of {', '.join(DEVICES)}")
    if device == "numpy":
        from .backends.numpy_ops import NumpyOps

        return NumpyOps()
    if device == "cpu":
        return _cpu_backend()
    from . import cuda

    started = cuda.start_init()
    if device == "auto" and not started:  # pycuda is not installed
        return _cpu_backend()
    try:
        from .backends.cuda_ops import CudaOps

        return CudaOps()
    except Exception as e:
        if device == "auto":
            return _cpu_backend()
        if isinstance(e, ReflexError):
            raise
        raise ReflexError("cuda_error", f"the CUDA backend is unavailable: {type(e).__name__}: {e}") from e


def load_runner(model=None, device="auto", n_ctx=None):
    """A Runner for `model` (path, alias or None for the default) on `device`."""
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
    try:
        from .models import ARCHITECTURES, load_model
        from .tokenizer import load_tokenizer

        if f.architecture not in ARCHITECTURES:
            raise ReflexError("unsupported_architecture",
                              f"architecture {f.architecture!r} is not supported "
                              f"(supported: {', '.join(ARCHITECTURES)})")
        tok = load_tokenizer(f)
        phases.mark("tokenizer")
        ops = make_backend(device)
        phases.mark("backend_ready")  # with CUDA: the init thread joined, kernels loaded
        net = load_model(ops, f)
        phases.mark("weights_loaded")  # with CUDA: uploaded
    except BaseException:
        f.close()
        raise
    finally:
        if gpu:
            cuda.startup_done()
    return Runner(path, f, ops, net, tok, n_ctx, _ms(t0))


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
        self.path, self.f, self.ops, self.model, self.tok = path, f, ops, model, tok
        hp = model.hp
        if n_ctx is None:
            n_ctx = min(hp.n_ctx_train or DEFAULT_N_CTX, DEFAULT_N_CTX)
        n_ctx = int(n_ctx)
        if n_ctx < 1:
            raise ReflexError("invalid_request", f"n_ctx must be positive, not {n_ctx}")
        self.n_ctx = n_ctx
        # the KV cache is allocated on first use, sized to what the request needs (a power of
        # two of at least KV_MIN slots, at most n_ctx) and grown when a later one needs more:
        # a one-shot `generate --max-tokens 1` does not pay for 4096 slots it never touches
        self.cache = None
        self.n_vocab = tok.n_vocab
        self.n_out = model.output.shape[0]  # LM head rows (a padded vocabulary has more)
        if self.n_out < self.n_vocab:
            raise ReflexError("gguf_error", f"the output layer has {self.n_out} rows for a vocabulary "
                              f"of {self.n_vocab} tokens")
        self.prefill_chunk = 256 if ops.name == "numpy" else 1024
        # one-token decode steps from a captured graph where the backend offers it
        # ($REFLEX_CUDA_GRAPH=0 turns that off)
        import os

        self.use_graph = os.environ.get("REFLEX_CUDA_GRAPH", "1") != "0"
        self._decoder = None
        self._graph_logits = None
        self._graphs = None  # the backend's forward_graphs, when it has them
        self.load_ms = load_ms

    # -- small things ----------------------------------------------------------------
    def info(self) -> dict:
        hp = self.model.hp
        import os

        return {
            "model": self.f.get("general.name") or os.path.basename(self.path),
            "path": self.path,
            "architecture": hp.arch,
            "backend": self.ops.name,
            "device": "cuda" if self.ops.name == "cuda" else "cpu",
            "n_vocab": self.n_vocab,
            "n_ctx": self.n_ctx,
            "n_ctx_train": hp.n_ctx_train,
            "n_layer": hp.n_layer,
            "n_embd": hp.n_embd,
            "n_head": hp.n_head,
            "n_head_kv": hp.n_head_kv,
            "load_ms": self.load_ms,
        }

    def tokenize(self, text, *, add_bos=False, parse_special=True) -> list:
        return self.tok.encode(text, add_bos=add_bos, parse_special=parse_special)

    def detokenize(self, ids) -> str:
        return self.tok.decode(list(ids))

    def close(self):
        self._drop_graphs()
        self.f.close()

    # -- forward passes -------------------------------------------------------------
    def _ensure_cache(self, n_slots):
        """A KV cache of at least n_slots (<= n_ctx) slots; a larger one replaces a smaller
        (every request starts from an empty cache, so nothing is copied)."""
        if self.cache is not None and self.cache.n_ctx >= n_slots:
            return self.cache
        cap = KV_MIN
        while cap < n_slots:
            cap *= 2
        cap = min(cap, self.n_ctx)
        self._drop_graphs()
        self.cache = None  # the old cache's memory goes back before the new one is taken
        hp = self.model.hp
        self.cache = self.ops.kv_cache(hp.n_layer, hp.n_head_kv, hp.head_dim, cap)
        return self.cache

    def _drop_graphs(self):
        """Forget captured graphs (they hold the old cache's addresses)."""
        for g in (self._decoder, self._graphs):
            if g is not None and hasattr(g, "close"):
                g.close()
        self._decoder = self._graphs = None
        self._graph_logits = None

    @staticmethod
    def _checker(should_cancel):
        if should_cancel is None:
            return None

        def check():
            if should_cancel():
                raise ReflexError("cancelled", "the request was cancelled")

        return check

    def _forward(self, ids, pos, slots=None, allowed=None, key_pos=None, rows=None, output="logits",
                 check=None):
        """model.forward of one batch (see models.common.Batch for the arguments). Backends
        with forward_graphs (CUDA) replay a captured graph when this batch's shape was run
        before (small batches); otherwise it runs op by op."""
        from .models.common import Batch

        if self._graphs is None and self.use_graph and hasattr(self.ops, "forward_graphs"):
            self._graphs = self.ops.forward_graphs(self.model, self.cache)
        if self._graphs is not None:
            if check is not None:
                check()  # a replay cannot stop between layers
            out = self._graphs(ids, pos, slots, allowed, key_pos, rows, output)
            if out is not None:
                return out
        b = Batch(self.ops, ids, pos, slots=slots, allowed=allowed, key_pos=key_pos)
        out = self.model.forward(self.cache, b, rows=rows, output=output, check=check)
        if self._graphs is not None:
            self._graphs.saw(b, rows, output)
        return out

    def _prefill(self, ids, check=None, start=0):
        """Run ids at positions start.. (slots = positions); the logits after the last one,
        a backend array [1, V]."""
        n, step = len(ids), self.prefill_chunk
        logits = None
        for a in range(0, n, step):
            chunk = ids[a:a + step]
            logits = self._forward(chunk, range(start + a, start + a + len(chunk)),
                                   rows=slice(len(chunk) - 1, len(chunk)), check=check)
        return logits

    def _decode_step(self, tid, pos, check):
        """Logits [1, V] after token tid at position pos (slot pos). Backends with a
        graph_decoder (CUDA) replay one captured graph per token; per-layer cancellation
        then gives way to the check between tokens."""
        if self._decoder is None and self.use_graph and hasattr(self.ops, "graph_decoder"):
            self._decoder = self.ops.graph_decoder(self.model, self.cache)
        if self._decoder is not None:
            self._graph_logits = self._decoder(tid, pos)
            return self._graph_logits
        return self._forward([tid], [pos], check=check)

    def _row(self, logits):
        """Backend logits [1, V] -> numpy float32 [n_vocab]."""
        return self.ops.to_numpy(logits)[0, :self.n_vocab]

    def _check_ids(self, ids):
        bad = [i for i in ids if not 0 <= int(i) < self.n_vocab]
        if bad:
            raise ReflexError("invalid_request", f"token id {bad[0]} is outside the vocabulary "
                              f"(0..{self.n_vocab - 1})")

    def prompt_logits(self, token_ids):
        """float32 [n_vocab]: the logits after the last of token_ids, from an empty cache."""
        ids = [int(i) for i in token_ids]
        if not ids:
            raise ReflexError("invalid_request", "no tokens")
        self._check_ids(ids)
        if len(ids) > self.n_ctx:
            raise ReflexError("context_overflow", f"{len(ids)} tokens exceed the context of {self.n_ctx}")
        import numpy as np

        self._ensure_cache(len(ids))
        return np.asarray(self._row(self._prefill(ids)), dtype=np.float32)

    # -- generate ------------------------------------------------------------------
    def generate(self, prompt, *, max_tokens=64, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0,
                 seed=None, repeat_penalty=1.0, repeat_last_n=64, stop=(), on_token=None,
                 should_cancel=None) -> dict:
        """Continue `prompt`. Generation ends at an end-of-generation token (not included in
        token_ids or text; finish_reason "stop"), after max_tokens tokens ("length"), or when
        the text contains one of `stop` ("stop_string"; the text ends before it, token_ids
        keep the token that completed it).

        on_token(token_id, text) is called for each generated token with the text that
        became final with it ("" while text is held back: an incomplete UTF-8 character or
        a possible start of a stop string). When generation ends at an end-of-generation
        token with text still held back, one last call on_token(eog_id, rest) delivers it.
        The texts of all calls join to the result's text.
        """
        from .sampling import Sampler, apply_repeat_penalty

        t0 = time.perf_counter()
        if isinstance(stop, str):
            stop = (stop,)
        max_tokens = int(max_tokens)
        if max_tokens < 0:
            raise ReflexError("invalid_request", f"max_tokens must be >= 0, not {max_tokens}")
        if top_p <= 0.0 or top_p > 1.0:
            raise ReflexError("invalid_request", f"top_p must be in (0, 1], not {top_p}")
        if not 0.0 <= min_p <= 1.0:
            raise ReflexError("invalid_request", f"min_p must be in [0, 1], not {min_p}")
        if top_k < 0:
            raise ReflexError("invalid_request", f"top_k must be >= 0, not {top_k}")
        if repeat_penalty <= 0.0:
            raise ReflexError("invalid_request", f"repeat_penalty must be > 0, not {repeat_penalty}")
        check = self._checker(should_cancel)
        ids = self.tok.encode(prompt)
        t_tok = time.perf_counter()
        if not ids:
            raise ReflexError("invalid_request", "the prompt is empty (no tokens)")
        if len(ids) + max_tokens > self.n_ctx:
            raise ReflexError("context_overflow",
                              f"{len(ids)} prompt tokens + max_tokens {max_tokens} exceed the "
                              f"context of {self.n_ctx}")
        self._ensure_cache(len(ids) + max_tokens)
        sampler = Sampler(temperature, top_k, top_p, min_p, seed)
        # argmax on the backend unless the logits need host work (penalty, padded vocabulary)
        fast_greedy = sampler.greedy and repeat_penalty == 1.0 and self.n_out == self.n_vocab
        window = len(ids) + max_tokens if repeat_last_n < 0 else int(repeat_last_n)
        eog = self.tok.eog_ids
        dec = self.tok.stream_decoder()
        st = _StopText(stop)
        out_ids: list = []
        finish = "length"
        logits = self._prefill(ids, check) if max_tokens > 0 else None
        t_prompt = time.perf_counter()
        pos = len(ids)
        while len(out_ids) < max_tokens:
            if fast_greedy and logits is self._graph_logits:
                tid = self._decoder.argmax()  # computed inside the captured step
            elif fast_greedy:
                tid = int(self.ops.argmax(logits)[0])
            else:
                row = self._row(logits).copy()
                if window > 0 and repeat_penalty != 1.0:
                    recent = (ids + out_ids)[-window:]
                    apply_repeat_penalty(row, recent, repeat_penalty)
                tid = sampler(row)
            if tid in eog:
                rest, stopped = st.push(dec.flush())
                finish = "stop_string" if stopped else "stop"
                rest += "" if stopped else st.rest()
                if rest and on_token is not None:
                    on_token(tid, rest)
                break
            out_ids.append(tid)
            piece = dec.feed(tid)
            last = len(out_ids) >= max_tokens
            if last:
                piece += dec.flush()
            text, stopped = st.push(piece)
            if last and not stopped:
                text += st.rest()
            if on_token is not None:
                on_token(tid, text)
            if stopped:
                finish = "stop_string"
                break
            if last:
                break
            if check is not None:
                check()
            logits = self._decode_step(tid, pos, check)
            pos += 1
        t_end = time.perf_counter()
        n_dec = max(len(out_ids) - 1, 0)
        return {
            "token_ids": out_ids,
            "text": st.text,
            "finish_reason": finish,
            "prompt_tokens": len(ids),
            "completion_tokens": len(out_ids),
            "timings": {
                "tokenize": _ms(t0, t_tok),
                "prompt_eval": _ms(t_tok, t_prompt),
                "decode": _ms(t_prompt, t_end),
                "total": _ms(t0, t_end),
                "decode_tokens_per_s": round(n_dec / (t_end - t_prompt), 3) if n_dec and t_end > t_prompt else None,
            },
        }

    # -- system1 -------------------------------------------------------------------
    def system1(self, prompt, candidates, *, temperature=1.0, should_cancel=None) -> dict:
        """Score candidate continuations of `prompt` in one forward pass over all of them.

        Every candidate's tokens are stored after the prompt, each attending to the prompt and
        to its own earlier tokens only, at positions continuing from the prompt's end. When
        prompt and candidates fit one batch (prefill_chunk tokens) they run as one forward
        pass (timed as prompt_eval; candidates_eval is then 0); otherwise the prompt is
        prefilled first and the candidates follow in batches. logprob is the sum over a candidate's
        tokens of the full-vocabulary log-softmax (float64); probability is the softmax of
        logprob / temperature over the candidates; entropy is theirs, in bits.
        """
        import numpy as np

        t0 = time.perf_counter()
        if isinstance(candidates, str) or not len(candidates):
            raise ReflexError("invalid_request", "candidates must be a non-empty list of strings")
        if not temperature > 0.0:
            raise ReflexError("invalid_request", f"temperature must be > 0, not {temperature}")
        check = self._checker(should_cancel)
        p_ids = self.tok.encode(prompt)
        if not p_ids:
            raise ReflexError("invalid_request", "the prompt is empty (no tokens)")
        cand_ids = []
        for i, c in enumerate(candidates):
            if not isinstance(c, str):
                raise ReflexError("invalid_request", f"candidate {i} is not a string")
            full = self.tok.encode(prompt + c)
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
        self._ensure_cache(P + M)
        # candidate c's token t is stored at slot P + offset_c + t, rotated at position P + t,
        # and sees the prompt and its own tokens up to itself; token t is predicted by the
        # prompt's last logits (t = 0), else by the row of its candidate's token t - 1
        owner = np.concatenate([np.full(len(t), c) for c, t in enumerate(cand_ids)])
        within = np.concatenate([np.arange(len(t)) for t in cand_ids])
        flat = np.concatenate([np.asarray(t, np.int64) for t in cand_ids])
        starts = within == 0
        key_pos = np.concatenate([np.arange(P), P + within])  # the position of every slot
        if P + M <= self.prefill_chunk:
            # one pass over prompt and candidates: the prompt causal, candidates masked
            N = P + M
            allowed = np.zeros((N, N), dtype=bool)
            allowed[:P, :P] = np.tri(P, dtype=bool)
            allowed[P:, :P] = True
            allowed[P:, P:] = (owner[:, None] == owner[None, :]) & (within[None, :] <= within[:, None])
            logits = self._forward(np.concatenate([np.asarray(p_ids, np.int64), flat]), key_pos,
                                   slots=np.arange(N), allowed=allowed, key_pos=key_pos, rows=slice(P - 1, N),
                                   check=check)
            # row 0 is the prompt's last token, row r + 1 candidate token r
            lp_tok = self.ops.logprobs(logits, np.where(starts, 0, np.arange(M)), flat, n=self.n_vocab)
            t_prompt = time.perf_counter()
        else:
            lp_tok = np.empty(M)
            first = self._prefill(p_ids, check)
            lp_tok[starts] = self.ops.logprobs(first, np.zeros(int(starts.sum()), np.int64), flat[starts],
                                               n=self.n_vocab)
            t_prompt = time.perf_counter()
            # batches of more than prefill_chunk tokens go in slot order, chunk by chunk: a
            # token's keys are all in its own or an earlier chunk
            for a in range(0, M, self.prefill_chunk):
                e = min(M, a + self.prefill_chunk)
                allowed = np.zeros((e - a, P + e), dtype=bool)
                allowed[:, :P] = True
                allowed[:, P:] = (owner[a:e, None] == owner[None, :e]) & (within[None, :e] <= within[a:e, None])
                rows = self._forward(flat[a:e], key_pos[P + a:P + e], slots=P + np.arange(a, e),
                                     allowed=allowed, key_pos=key_pos[:P + e], check=check)
                r = np.arange(a, e)
                has_next = np.flatnonzero((r + 1 < M) & ~starts[np.minimum(r + 1, M - 1)])
                if has_next.size:
                    lp_tok[r[has_next] + 1] = self.ops.logprobs(rows, has_next, flat[r[has_next] + 1],
                                                                n=self.n_vocab)
        t_eval = time.perf_counter()

        logprob = np.zeros(len(cand_ids))
        np.add.at(logprob, owner, lp_tok)
        z = logprob / temperature
        prob = np.exp(z - z.max())
        prob /= prob.sum()
        nz = prob[prob > 0]
        entropy = float(-(nz * np.log2(nz)).sum())
        out = []
        for c, text in enumerate(candidates):
            n = len(cand_ids[c])
            out.append({"text": text, "token_ids": [int(x) for x in cand_ids[c]],
                        "logprob": float(logprob[c]), "mean_logprob": float(logprob[c] / n),
                        "probability": float(prob[c])})
        t_end = time.perf_counter()
        return {
            "candidates": out,
            "best_idx": int(np.argmax(logprob)),
            "entropy": entropy,
            "prompt_tokens": P,
            "candidate_tokens": M,
            "timings": {"tokenize": _ms(t0, t_tok), "prompt_eval": _ms(t_tok, t_prompt),
                        "candidates_eval": _ms(t_prompt, t_eval), "total": _ms(t0, t_end)},
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
            self._ensure_cache(len(ids))
            acc = first = last = None
            for a in range(0, len(ids), self.prefill_chunk):
                chunk = ids[a:a + self.prefill_chunk]
                h = self.ops.to_numpy(self._forward(chunk, range(a, a + len(chunk)), output="hidden",
                                                    check=check))
                h = h.astype(np.float64)
                acc = h.sum(axis=0) if acc is None else acc + h.sum(axis=0)
                first = h[0] if first is None else first
                last = h[-1]
            v = {"mean": acc / len(ids) if acc is not None else None, "last": last, "cls": first}[pooling]
            if normalize:
                norm = np.linalg.norm(v)
                v = v / norm if norm > 0 else v
            vectors.append(v.astype(np.float32).tolist())
            n_tokens.append(len(ids))
        t_end = time.perf_counter()
        return {"embeddings": vectors, "dim": len(vectors[0]), "n_tokens": n_tokens,
                "timings": {"total": _ms(t0, t_end)}}
