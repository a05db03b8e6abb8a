"""Generation: a prompt continued token by token, as a pipeline of small parts.

    logits (backend) -> constraint stage (backend mask) -> logit processors (host:
    bias, penalties, DRY, thinking budget; processors.py) -> selector (greedy or seeded
    sampling; selectors.py) -> token
    token -> stream decoder -> stop matcher (stops.py) -> reasoning splitter
    (reasoning.py) -> text events;  logprob recorder (logprobs.py) beside it

`Params` says what to generate (the protocol's generate fields of the same names, with
their defaults; the engine does not read the protocol's structs). `Generation` runs one
request: iterating it yields a token event per generated token (a dict: token_id, text,
[logprobs], [reasoning_content], [index]) and leaves the result in `.result`. With n > 1
the choices are generated one after another from the prompt's state (evaluated once).

Only the parts a request needs are built; a greedy request with no processors keeps its
argmax on the backend (inside the captured decode graph where there is one).
"""

from __future__ import annotations

import time

from ..errors import ReflexError

DRY_BREAKERS = ("\n", ":", "\"", "*")


class Params:
    """What to generate. Unknown names are a TypeError; values are the protocol's
    (reflex_ipc/ops/generate.py checks their ranges when a request is decoded)."""

    DEFAULTS = {
        "max_tokens": 64, "temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
        "typical_p": 1.0, "seed": None, "repeat_penalty": 1.0, "repeat_last_n": 64,
        "frequency_penalty": 0.0, "presence_penalty": 0.0, "logit_bias": None,
        "dry_multiplier": 0.0, "dry_base": 1.75, "dry_allowed_length": 2,
        "dry_penalty_last_n": 64, "dry_sequence_breakers": DRY_BREAKERS, "stop": (),
        "logprobs": None, "n": 1, "thinking_budget": None, "reasoning": False,
        "n_indent": 0, "t_max_predict_ms": 0,
    }
    __slots__ = tuple(DEFAULTS)

    def __init__(self, **kw):
        bad = set(kw) - set(self.DEFAULTS)
        if bad:
            raise TypeError(f"unknown generation parameter(s): {', '.join(sorted(bad))}")
        for k, v in self.DEFAULTS.items():
            setattr(self, k, kw.get(k, v))
        if isinstance(self.stop, str):
            self.stop = (self.stop,)

    @classmethod
    def of(cls, obj, **kw):
        """Params from the same-named attributes of obj (e.g. a protocol request), then kw."""
        vals = {k: getattr(obj, k) for k in cls.DEFAULTS if hasattr(obj, k)}
        vals.update(kw)
        return cls(**vals)

    def replace(self, **kw):
        return Params(**{**{k: getattr(self, k) for k in self.DEFAULTS}, **kw})


def _ms(t0, t1=None):
    return round(((time.perf_counter() if t1 is None else t1) - t0) * 1e3, 3)


class Generation:
    """One generate request on a runner (engine.Runner): see Runner.generate for the
    arguments. The prompt is tokenized, a saved state restored and the prompt evaluated
    when it is made; the tokens come when it is iterated."""

    def __init__(self, runner, prompt, params=None, *, constraint=None, on_logits=None,
                 should_cancel=None, cache_prompt=True, kv_import=None, kv_export=None,
                 prefix_cache=True):
        from ..runtime import prefixstore

        prefixstore.begin(runner, prefix_cache)  # the prefix cache's session (runtime/prefixstore.py)
        self.runner = runner
        self.p = p = params if params is not None else Params()
        self.constraint, self.on_logits = constraint, on_logits
        self.check = runner._checker(should_cancel)
        self.cache_prompt = cache_prompt
        self.kv_export = kv_export
        self.result = None
        self.extra_out, self.extra_t = {}, {}
        self.t0 = time.perf_counter()
        self.max_tokens = int(p.max_tokens)
        self._prepare(prompt, kv_import)

    def _prepare(self, prompt, kv_import):
        r = self.runner
        sf = r._open_state(kv_import) if kv_import is not None else None
        try:
            ids = sf.tokens + r._continuation_ids(prompt) if sf is not None else r._prompt_ids(prompt)
            self.t_tok = time.perf_counter()
            if len(ids) + self.max_tokens > r.n_ctx:
                raise ReflexError("context_overflow",
                                  f"{len(ids)} prompt tokens + max_tokens {self.max_tokens} exceed "
                                  f"the context of {r.n_ctx}")
            self._start(ids, sf)
            if sf is not None:
                r._restore(sf, room=len(ids) - sf.n_tokens + self.max_tokens)
                self.cache_prompt = True  # the imported tokens are the prefix to keep
                self.extra_out["kv_import"] = {"path": sf.path, "n_tokens": sf.n_tokens}
                self.extra_t["state_load"] = _ms(self.t_tok)
        finally:
            if sf is not None:
                sf.close()
        self.ids = ids
        p = self.p
        self.think = None
        self.harmony = False
        if p.reasoning or p.thinking_budget is not None:
            from .reasoning import think_tokens

            self.think = think_tokens(r.tok)
            if self.think is None and p.reasoning:  # gpt-oss: channels instead of <think> blocks
                from ..harmony import is_harmony

                self.harmony = is_harmony(r.tok)
        # choice 0's parts, built (and so checked) before anything runs
        self._first = self._pipeline(0)

    def _start(self, ids, sf):
        """Where this request runs while another backend is coming up (Runner.start_request:
        here, there, or here then there); the decision goes into the result's `start`."""
        r = self.runner
        self.steps = []  # [[backend, tokens chosen from its logits]]
        self._cur = [None]  # the ops object of the last step
        self.n_handovers = len(r.handovers)
        if r.pending is None and r.want_gpu is None:
            self.start = None
            return
        from ..runtime.executor import common_prefix

        held = 0 if sf is not None or not self.cache_prompt else common_prefix(r.exec.tokens, ids)
        new = len(ids) - (sf.n_tokens if sf is not None else min(held, len(ids) - 1))
        self.start = r.start_request("generate", new, self.max_tokens * int(self.p.n))

    def _start_fields(self, out):
        d = self.start
        if d is None:
            return
        r = self.runner
        d = dict(d)
        moves = r.handovers[self.n_handovers:]
        if moves:
            d["handovers"] = moves
            out["timings"]["handover"] = round(sum(m["ms"] for m in moves), 3)
        d["steps"] = [{"backend": b, "tokens": n} for b, n in self.steps]
        for k, v in (d.get("est_ms") or {}).items():
            out["timings"][f"start_est_{k}"] = v
        out["start"] = d

    # -- the pipeline of one choice -----------------------------------------------------
    def _pipeline(self, index):
        r, p = self.runner, self.p
        think_open = False
        if self.think is not None:
            from .reasoning import opens_block

            think_open = opens_block(self.ids, self.think)
        self.think_open = think_open
        procs = []
        if (p.logit_bias or p.thinking_budget is not None or p.dry_multiplier != 0.0
                or (p.repeat_last_n != 0 and (p.repeat_penalty != 1.0 or p.frequency_penalty != 0.0
                                              or p.presence_penalty != 0.0))):
            from . import processors

            procs = processors.build(p, r.tok, r.n_vocab, self.think, think_open)
        stages = []
        if self.constraint is not None:
            from .processors import ConstraintStage

            if index > 0:
                self.constraint.reset()  # each choice starts the grammar over
            stages.append(ConstraintStage(self.constraint, r.ops, r.n_vocab))
        if p.temperature > 0.0:
            from .selectors import Sampler

            seed = p.seed + index if p.seed is not None else None
            selector = Sampler(p.temperature, p.top_k, p.top_p, p.min_p, seed, p.typical_p)
        else:
            from .selectors import Greedy

            selector = Greedy()
        recorder = None
        if p.logprobs is not None:
            from .logprobs import LogprobRecorder

            recorder = LogprobRecorder(r.ops, r.tok, r.n_vocab, p.logprobs, p.temperature)
        return procs, stages, selector, recorder

    # -- the loop -----------------------------------------------------------------------
    def __iter__(self):
        try:
            yield from self._run()
        finally:
            self.runner.end_request()

    def _run(self):
        r, p = self.runner, self.p
        ex = r.exec
        n = int(p.n)
        choices = []
        cached = 0
        t_prompt = None
        logits = None
        for index in range(n):
            if index == 0:
                if self.max_tokens > 0 or self.kv_export is not None:
                    r.f.release_metadata()  # what the request's set-up read of the vocabulary: not held
                    logits, cached = ex.prefill(self.ids, room=self.max_tokens, reuse=self.cache_prompt,
                                                check=self.check)
                if self.kv_export is not None:
                    saved = r.save_state(self.kv_export)
                    self.extra_t.update(saved.pop("timings"))
                    self.extra_out["kv_export"] = saved
                if self.max_tokens > 0:
                    r.ops.synchronize()  # an asynchronous backend's prefill ends here
                t_prompt = time.perf_counter()
            else:  # the prompt's state again: held, so only its last token is evaluated
                logits, _ = ex.prefill(self.ids, room=self.max_tokens, reuse=True, check=self.check)
            choice = yield from self._choice(index, logits, n)
            choices.append(choice)
        t_end = time.perf_counter()
        n_dec = sum(max(c["completion_tokens"] - 1, 0) for c in choices)
        first = dict(choices[0])
        first.pop("index", None)
        out = {
            **{k: first[k] for k in ("token_ids", "text")},
            "finish_reason": first["finish_reason"],
            "prompt_tokens": len(self.ids),
            "completion_tokens": first["completion_tokens"],
            "cached_tokens": cached,
            "timings": {
                "tokenize": _ms(self.t0, self.t_tok),
                "prompt_eval": _ms(self.t_tok, t_prompt),
                "decode": _ms(t_prompt, t_end),
                "total": _ms(self.t0, t_end),
                "decode_tokens_per_s": round(n_dec / (t_end - t_prompt), 3)
                if n_dec and t_end > t_prompt else None,
            },
        }
        for k in ("logprobs", "reasoning_content"):
            if k in first:
                out[k] = first[k]
        if n > 1:
            out["choices"] = choices
        out.update(self.extra_out)
        out["timings"].update(self.extra_t)
        from ..runtime import prefixstore

        prefixstore.end(r, out["timings"])
        self._start_fields(out)
        self.result = out

    def _choice(self, index, logits, n):
        """Generates one choice from the prompt's logits: yields its token events, returns
        its fields."""
        r, p = self.runner, self.p
        ex = r.exec
        procs, stages, selector, recorder = self._first if index == 0 else self._pipeline(index)
        history = list(self.ids)
        step_logits = self.on_logits
        # argmax on the backend unless the logits need host work (processors, sampling, a
        # padded vocabulary)
        on_device = selector.greedy and not procs and r.n_out == r.n_vocab
        out_ids = []

        steps, cur = self.steps, self._cur

        def choose(logits):
            ops = r.ops  # the backend that computed these logits (a hand-over changes it)
            if ops is not cur[0]:
                cur[0] = ops
                steps.append([ops.name, 0])
                for s in stages:
                    s.ops = ops
                if recorder is not None:
                    recorder.ops = ops
            steps[-1][1] += 1
            if step_logits is not None:
                import numpy as np

                step_logits(len(out_ids), np.array(r._row(logits), dtype=np.float32))
            raw = logits
            for s in stages:
                logits = s.apply_device(logits)
            if on_device:
                tid = ex.argmax(logits) if logits is raw else int(ops.argmax(logits)[0])
            else:
                row = r._row(logits).copy()
                for proc in procs:
                    proc.apply(row, history)
                tid = selector(row)
            if recorder is not None:
                recorder.record(raw, tid)
            return tid

        eog = r.tok.eog_ids
        dec = r.tok.stream_decoder()
        stops = None
        if p.stop or p.n_indent or (p.t_max_predict_ms or 0) > 0:
            from .stops import StopMatcher

            stops = StopMatcher(p.stop, p.n_indent, p.t_max_predict_ms)
        split = None
        if p.reasoning and self.think is not None:
            from .reasoning import ReasoningSplitter

            split = ReasoningSplitter(self.think_open)
        elif p.reasoning and self.harmony:
            from ..harmony import HarmonySplitter

            split = HarmonySplitter()
        text_parts, reasoning_parts = [], []
        finish = "length"
        constraint = stages[0] if stages else None

        def event(tid, piece, final=False):
            """The token event of `piece` (text that became final), through the stop
            matcher and the reasoning splitter; (event, stopped)."""
            stopped = False
            if stops is not None:
                text, stopped = stops.push(piece)
                if final and not stopped:
                    text += stops.rest()
            else:
                text = piece
            ev = {"token_id": int(tid)}
            if split is not None:
                content, reasoning = split.push(text)
                if final or stopped:
                    c2, r2 = split.finish()
                    content, reasoning = content + c2, reasoning + r2
                ev["text"] = content
                if reasoning:
                    ev["reasoning_content"] = reasoning
                    reasoning_parts.append(reasoning)
            else:
                ev["text"] = text
            text_parts.append(ev["text"])
            if n > 1:
                ev["index"] = index
            return ev, stopped

        tokens = ex.decode(logits, choose, self.check) if self.max_tokens > 0 else iter(())
        for tid in tokens:
            if tid in eog:
                if recorder is not None:
                    recorder.drop_last()  # the end-of-generation token is not part of the output
                ev, stopped = event(tid, dec.flush(), final=True)
                finish = (stops.reason or "stop_string") if stopped else "stop"
                if ev["text"] or ev.get("reasoning_content"):
                    yield ev
                break
            out_ids.append(tid)
            history.append(tid)
            for s in stages:
                s.accept(tid)
            for proc in procs:
                proc.accept(tid)
            piece = dec.feed(tid)
            done = constraint is not None and constraint.done()
            last = len(out_ids) >= self.max_tokens or done
            if last:
                piece += dec.flush()
            ev, stopped = event(tid, piece, final=last)
            if recorder is not None:
                ev["logprobs"] = recorder.entries[-1]
            yield ev
            if stopped:
                finish = stops.reason or "stop_string"
                break
            if last:
                finish = "stop" if done else "length"
                break
        choice = {"index": index, "text": "".join(text_parts), "token_ids": out_ids,
                  "finish_reason": finish, "completion_tokens": len(out_ids)}
        if recorder is not None:
            choice["logprobs"] = recorder.entries[:len(out_ids)]
        if split is not None and reasoning_parts:
            choice["reasoning_content"] = "".join(reasoning_parts)
        return choice

    def run(self, on_token=None) -> dict:
        """Generates to the end; on_token(token_id, text, **extra) per event (extra: the
        event's other fields). Returns the result."""
        for ev in self:
            if on_token is not None:
                extra = {k: v for k, v in ev.items() if k not in ("token_id", "text")}
                on_token(ev["token_id"], ev["text"], **extra)
        return self.result
