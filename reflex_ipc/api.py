"""The in-process Python API: a loaded model and the protocol's model ops as methods.

    from reflex_ipc import Model

    model = Model.load("smollm2")                      # path, alias or None (the default)
    model.generate("The capital of France is", max_tokens=4)["text"]
    for event in model.generate(messages=[...], stream=True): ...   # token events
    model.decide("Is it raining?", candidates=[" yes", " no"])      # system1
    model.embed(["hello", "world"]), model.tokenize("hi"), model.detokenize([...])
    model.save_state("p.state"), model.load_state("p.state")

Every method takes the protocol's parameters of its op by name (protocol/PROTOCOL.md)
and checks them with the op's own Request struct (reflex_ipc/ops/<op>.py), so a value
the protocol refuses is refused here with the same `invalid_request` message; every
failure is a `ReflexError` with the protocol's kind. Results are the protocol's result
fields (with `model` and `timings`). The stdio/uds server's ops and the CLI's commands
run these same methods: a method also takes an already-checked Request struct in place
of the keywords.

Nothing here is imported by `import reflex_ipc`: `reflex_ipc.Model` loads this module
on first use, and the op structs (msgspec) are imported by the first call.
"""

from __future__ import annotations

import time

from .errors import ReflexError

OPS_OF = {"generate": "generate", "infill": "infill", "decide": "system1", "classify": "classify",
          "embed": "embed",
          "tokenize": "tokenize", "detokenize": "detokenize", "save_state": "state_save",
          "load_state": "state_load"}


def _ms(t0):
    return round((time.perf_counter() - t0) * 1e3, 3)


def _is_struct(x) -> bool:
    """Whether x is an op's checked Request struct (a msgspec Struct)."""
    return hasattr(type(x), "__struct_fields__")


def _struct(op):
    from .ops import registry

    return registry()[op].Request


def check(op, fields: dict):
    """The op's Request struct of `fields`, checked as the protocol checks a request;
    invalid_request with the protocol's message otherwise. `model` and `device` belong to
    Model.load, not to a call."""
    import msgspec

    for name in ("model", "device"):
        if fields.get(name) is not None:
            raise ReflexError("invalid_request", f"`{name}`: a Model runs the model it loaded "
                                                 "(Model.load(model, device=...))")
    lb = fields.get("logit_bias")
    if isinstance(lb, dict):  # token ids as ints too (the protocol's JSON keys are strings)
        fields = {**fields, "logit_bias": {str(k) if isinstance(k, int) and not isinstance(k, bool)
                                           else k: v for k, v in lb.items()}}
    try:
        return msgspec.convert(fields, _struct(op))
    except msgspec.ValidationError as e:
        from .protocol import validation_message

        raise ReflexError("invalid_request", validation_message(e, op, fields)) from None


def _timed(out, name, t0):
    """The engine's result as the protocol's result fields: `model`, and `timings` with
    prompt_eval and decode always there (ops._base.merge) and the call's total."""
    from .ops._base import merge

    timings = {}
    fields = merge(out, name, timings, _ms(t0))
    timings["total"] = _ms(t0)
    fields["timings"] = timings
    return fields


class TokenStream:
    """generate(..., stream=True): iterating yields the token events (dicts as the
    protocol's token lines: {"event": "token", "token_id", "text", ...}); once it is
    exhausted, `result` holds the result (as generate returns it). Leaving the loop early
    stops generating (close())."""

    def __init__(self, gen):
        self._gen = gen
        self.result = None

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self._gen)
        except StopIteration as e:
            self.result = e.value
            raise StopIteration from None

    def close(self):
        self._gen.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Model:
    """A loaded model (engine.Runner) with the protocol's model ops as methods."""

    def __init__(self, runner):
        self.runner = runner
        self._name = None

    @classmethod
    def load(cls, model=None, *, device="auto", n_ctx=None, lora=None, start=None, gpu_now=True) -> "Model":
        """Load a GGUF (a path, an alias such as "smollm2", or None: $REFLEX_MODEL, else
        SmolLM2) on device "auto" (CUDA when usable, else the C CPU backend), "cpu", "cuda"
        or "numpy"; n_ctx: the context (default: the model's trained context, at most
        4096); lora: adapters ["FILE[:SCALE]", ...] applied at load. With "auto" on a CUDA
        host the model answers on the cpu backend until CUDA is up (engine.load_runner:
        start, default $REFLEX_START; gpu_now: bring CUDA up now or when a request asks)."""
        from .engine import load_runner

        return cls(load_runner(model, device=device or "auto", n_ctx=n_ctx, lora=lora, start=start,
                               gpu_now=gpu_now))

    # -- small things --------------------------------------------------------------------
    @property
    def name(self):
        """The model's general.name (else its file name): the results' `model`."""
        if self._name is None:
            self._name = self.runner.info().get("model")
        return self._name

    def info(self) -> dict:
        return self.runner.info()

    def close(self):
        self.runner.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _req(self, op, req, fields):
        if req is not None:
            if fields:
                raise TypeError("give a Request struct or keyword parameters, not both")
            return req
        return check(op, fields)

    # -- generate / infill -----------------------------------------------------------------
    def generate(self, prompt=None, *, stream=False, on_token=None, should_cancel=None, **fields):
        """Continue `prompt` (or `messages=[...]`, rendered with the model's chat template):
        the protocol's generate. Returns the result; with stream=True a TokenStream of token
        events (its `.result` once exhausted). on_token(token_id, text, **extra) is called
        per token either way; should_cancel() -> bool is polled between tokens (true:
        ReflexError "cancelled")."""
        req = prompt if _is_struct(prompt) else None  # a checked Request (the server, the CLI)
        if prompt is not None and req is None:
            fields["prompt"] = prompt
        req = self._req("generate", req, fields)
        gen = self._generate(req, on_token, should_cancel)
        return TokenStream(gen) if stream else _drain(gen)

    def infill(self, prefix=None, suffix=None, *, stream=False, on_token=None, should_cancel=None,
               **fields):
        """Fill in the middle between prefix and suffix (models with FIM tokens): the
        protocol's infill. Returns as generate does."""
        req = prefix if _is_struct(prefix) else None
        if req is None:
            fields.update({k: v for k, v in (("prefix", prefix), ("suffix", suffix)) if v is not None})
        req = self._req("infill", req, fields)
        gen = self._infill(req, on_token, should_cancel)
        return TokenStream(gen) if stream else _drain(gen)

    def _chat_prompt(self, req, text_field="prompt", should_cancel=None):
        from .ops._base import chat_prompt

        return chat_prompt(self.runner, req, text_field, should_cancel)

    def _decode(self, req, prompt, on_token, should_cancel, reasoning=False, **kw):
        """The token events of runner.stream(prompt) with the request's decoding parameters,
        then its result (the generator's return value)."""
        from . import prepare
        from .generation import Params
        from .ops.generate import stops

        extra = prepare.generate_extras(self.runner, logprobs=req.logprobs, cache_prompt=req.cache_prompt,
                                        json_schema=req.json_schema, regex=req.regex,
                                        grammar=req.grammar, prefix_cache=req.prefix_cache)
        params = Params.of(req, stop=stops(req), reasoning=reasoning)
        g = self.runner.stream(prompt, params, should_cancel=should_cancel, **extra, **kw)
        for ev in g:
            if on_token is not None:
                on_token(ev["token_id"], ev["text"],
                         **{k: v for k, v in ev.items() if k not in ("token_id", "text")})
            yield {"event": "token", **ev}
        return g.result

    def _generate(self, req, on_token=None, should_cancel=None):
        from .ops._base import kv_args

        t0 = time.perf_counter()
        tools = req.tools if req.tool_choice != "none" else None
        if tools is None and req.tools is not None:  # tool_choice none: tools not offered
            req = _replace(req, tools=None)
        elif tools and req.tool_choice != "auto":
            req = _forced_call(self.runner, req)
        prompt = self._chat_prompt(req, should_cancel=should_cancel)
        out = yield from self._decode(req, prompt, on_token, should_cancel,
                                      reasoning=req.messages is not None, **kv_args(req))
        if tools:
            from . import prepare

            out = prepare.add_tool_calls(dict(out), tools, runner=self.runner,
                                         chat_template=req.chat_template,
                                         parallel=req.parallel_tool_calls)
        return _timed(out, self.name, t0)

    def _infill(self, req, on_token=None, should_cancel=None):
        from . import prepare

        t0 = time.perf_counter()
        ids = prepare.infill_ids(
            self.runner, req.prefix, req.suffix, prompt=req.prompt, max_tokens=req.max_tokens,
            input_extra=[{"filename": c.filename, "text": c.text} for c in req.input_extra],
            prefix_cache=req.prefix_cache)
        out = yield from self._decode(req, ids, on_token, should_cancel)
        return _timed(out, self.name, t0)

    # -- decide / embed ---------------------------------------------------------------------
    def decide(self, prompt=None, candidates=None, *, should_cancel=None, **fields) -> dict:
        """Score candidate continuations of `prompt` (or of the assistant's turn after
        `messages`) in one forward pass: the protocol's system1."""
        req = prompt if _is_struct(prompt) else None
        if req is None:
            fields.update({k: v for k, v in (("prompt", prompt), ("candidates", candidates))
                           if v is not None})
        req = self._req("system1", req, fields)
        from .ops._base import kv_args

        t0 = time.perf_counter()
        out = self.runner.system1(self._chat_prompt(req, should_cancel=should_cancel), list(req.candidates),
                                  temperature=req.temperature, should_cancel=should_cancel,
                                  cache_prompt=req.cache_prompt, **kv_args(req),
                                  **({} if req.prefix_cache else {"prefix_cache": False}))
        return _timed(out, self.name, t0)

    system1 = decide

    def classify(self, input=None, labels=None, *, should_cancel=None, **fields) -> dict:
        """Pick one of a few labels for a text (or the assistant's turn after `messages`),
        or for each of a batch of `questions` over one shared prefix: the protocol's
        classify (system1 with labels: probabilities, logprobs, best, entropy, a warning
        when the labels tokenize to different lengths)."""
        req = input if _is_struct(input) else None
        if req is None:
            fields.update({k: v for k, v in (("input", input), ("labels", labels)) if v is not None})
        req = self._req("classify", req, fields)
        from .ops.classify import execute

        t0 = time.perf_counter()
        return _timed(execute(self.runner, req, should_cancel=should_cancel), self.name, t0)

    def embed(self, input=None, *, should_cancel=None, **fields) -> dict:
        """Pooled final hidden states of a text or a list of texts: the protocol's embed."""
        req = input if _is_struct(input) else None
        if req is None:
            if input is not None:
                fields["input"] = list(input) if isinstance(input, tuple) else input
        req = self._req("embed", req, fields)
        t0 = time.perf_counter()
        texts = [req.input] if isinstance(req.input, str) else list(req.input)
        out = dict(self.runner.embed(texts, pooling=req.pooling, normalize=req.normalize,
                                     should_cancel=should_cancel,
                                     **({} if req.prefix_cache else {"prefix_cache": False})))
        out["embeddings"] = [e.tolist() if hasattr(e, "tolist") else list(e) for e in out["embeddings"]]
        return _timed(out, self.name, t0)

    # -- tokens -------------------------------------------------------------------------------
    def tokenize(self, text=None, **fields) -> list:
        """Token ids of a text (or of `messages` rendered with the chat template): the
        protocol's tokenize (tokenize_result for all its fields)."""
        return self.tokenize_result(text, **fields)["token_ids"]

    def tokenize_result(self, text=None, *, should_cancel=None, **fields) -> dict:
        """tokenize's result; should_cancel() is polled while a chat template renders."""
        req = text if _is_struct(text) else None
        if req is None:
            if text is not None:
                fields["text"] = text
        req = self._req("tokenize", req, fields)
        t0 = time.perf_counter()
        if req.messages is not None:
            prompt = self._chat_prompt(req, "text", should_cancel)
            ids = self.runner.tokenize(prompt, add_bos=None, parse_special=True)
            out = {"token_ids": list(ids), "prompt": prompt}
        else:
            if (req.tools is not None or req.chat_template is not None
                    or req.chat_template_kwargs is not None or req.enable_thinking is not None):
                self._chat_prompt(req, "text")  # raises: they go with messages
            out = {"token_ids": list(self.runner.tokenize(req.text, add_bos=req.add_bos,
                                                          parse_special=req.parse_special))}
        out["model"] = self.name
        out["timings"] = {"tokenize": _ms(t0)}
        return out

    def detokenize(self, token_ids=None, **fields) -> str:
        """The text of token ids: the protocol's detokenize."""
        return self.detokenize_result(token_ids, **fields)["text"]

    def detokenize_result(self, token_ids=None, **fields) -> dict:
        req = token_ids if _is_struct(token_ids) else None
        if req is None:
            if token_ids is not None:
                fields["token_ids"] = list(token_ids)
        req = self._req("detokenize", req, fields)
        from .ops.detokenize import check_ids

        check_ids(req.token_ids, self.info().get("n_vocab"))
        t0 = time.perf_counter()
        text = self.runner.detokenize(req.token_ids, special=req.special)
        return {"text": text, "model": self.name, "timings": {"detokenize": _ms(t0)}}

    # -- saved state --------------------------------------------------------------------------
    def save_state(self, path=None, **fields) -> dict:
        """Write the state the model holds (the last request's tokens) to a file
        (protocol/STATE.md): the protocol's state_save."""
        req = self._path_req("state_save", path, fields)
        t0 = time.perf_counter()
        return _timed(self.runner.save_state(req.path), self.name, t0)

    def load_state(self, path=None, **fields) -> dict:
        """Load a saved state: a later request whose tokens start with its tokens evaluates
        only the rest. The protocol's state_load."""
        req = self._path_req("state_load", path, fields)
        t0 = time.perf_counter()
        return _timed(self.runner.load_state(req.path), self.name, t0)

    def _path_req(self, op, path, fields):
        if _is_struct(path):
            return self._req(op, path, fields)
        if path is not None:
            fields["path"] = path
        return self._req(op, None, fields)


def _replace(req, **changes):
    import msgspec

    return msgspec.structs.replace(req, **changes)


def _forced_call(runner, req):
    """tool_choice required / named: the request with the grammar that forces the call."""
    from . import prepare

    if req.messages is None:
        raise ReflexError("invalid_request", "`tool_choice`: goes with `messages` and `tools`")
    if any(getattr(req, k) is not None for k in ("json_schema", "regex", "grammar")):
        raise ReflexError("invalid_request", "`tool_choice` required or named forces a tool call; "
                                             "it cannot be combined with json_schema, regex or grammar")
    choice = req.tool_choice
    if not isinstance(choice, str):
        import msgspec

        choice = msgspec.to_builtins(choice)
    thinking = (req.enable_thinking is True
                or (req.chat_template_kwargs or {}).get("enable_thinking") is True)
    g = prepare.tool_grammar(runner, req.tools, choice, req.parallel_tool_calls, req.chat_template,
                             thinking)
    return _replace(req, grammar=g)


def _drain(gen):
    """Run a generator of token events to its end; its return value."""
    while True:
        try:
            next(gen)
        except StopIteration as e:
            return e.value
