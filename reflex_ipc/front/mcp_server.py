"""`reflex mcp`: a Model Context Protocol server over stdio exposing the engine's ops as
tools: `generate`, `decide` (the classify op: system1 with labels), `embed` and `infill`.

The MCP side is the official `mcp` package (the `mcp` extra, imported only here); the
engine is in this process: the in-process API (`reflex_ipc.Model`, api.py), loaded on a
thread when the server starts (so the model loads while the client initializes), its
calls run one at a time on worker threads (a lock: the engine stays sequential, tool
calls queue FIFO) while the event loop keeps serving the session. A cancelled tool call
sets the call's cancel flag, which the engine polls between tokens. The wire is a private
dup of stdout and fd 1 points at stderr, so nothing the engine prints can corrupt it.

Each tool checks its parameters with the op's own Request struct (Model's methods), so
a value the protocol refuses is a tool error (`isError`) whose text is `KIND: MESSAGE`
with the protocol's error kinds; a model that failed to load answers every call with its
load error. The sampling and reasoning parameters of generate and infill are the
protocol's own fields, with the JSON schemas of protocol/schema.json (read from the op
structs, so they cannot drift).
"""

import inspect
import os
import sys
import threading
from typing import Annotated, Any, Optional, Union

INSTRUCTIONS = ("A local language model. generate: continue a prompt or answer a conversation. "
                "decide: pick one of a few labels for a text or conversation in one forward pass "
                "(probabilities and entropy; a batch of questions over one shared text). "
                "embed: vectors for texts. infill: fill in the middle (code models with FIM tokens).")

# generate's and infill's protocol fields that the tools take as they are
SAMPLING = ("top_k", "top_p", "min_p", "typical_p", "seed", "repeat_penalty", "repeat_last_n",
            "frequency_penalty", "presence_penalty", "logit_bias", "dry_multiplier", "dry_base",
            "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers", "n")
REASONING = ("enable_thinking", "thinking_budget")


class Engine:
    """The in-process model behind the tools: loaded once on a thread, then called one
    request at a time (a threading lock held by the worker thread that runs it)."""

    def __init__(self, model=None, device="auto", n_ctx=None):
        self.spec, self.device, self.n_ctx = model, device, n_ctx
        self.model = None
        self.error = None  # (kind, message) when the load failed
        self.lock = threading.Lock()
        self.thread = None

    def start(self):
        self.thread = threading.Thread(target=self._load, name="reflex-mcp-load", daemon=True)
        self.thread.start()

    def _load(self):
        from ..errors import ReflexError

        with self.lock:
            try:
                from ..api import Model

                self.model = Model.load(self.spec, device=self.device or "auto", n_ctx=self.n_ctx)
            except ReflexError as e:
                self.error = (e.kind, e.message)
            except Exception as e:  # noqa: BLE001  (a bug: reported as internal, with its name)
                self.error = ("internal", f"{type(e).__name__}: {e}")
            if self.error is not None:
                sys.stderr.write(f"reflex mcp: the model did not load: {self.error[0]}: {self.error[1]}\n")
                sys.stderr.flush()

    def run(self, method, cancel, args):
        """Worker thread: the Model method with the call's arguments (None: the default)."""
        from ..errors import ReflexError

        with self.lock:
            if cancel.is_set():
                raise ReflexError("cancelled", "cancelled before it ran")
            if self.model is None:
                kind, msg = self.error or ("internal", "the model is not loaded")
                raise ReflexError(kind, f"the model did not load: {msg}")
            fields = {k: v for k, v in args.items() if v is not None}
            return getattr(self.model, method)(should_cancel=cancel.is_set, **fields)

    def close(self):
        if self.thread is not None:
            self.thread.join()
        with self.lock:
            if self.model is not None:
                self.model.close()
                self.model = None


def _protocol_fields(fn, struct, names):
    """fn (which takes **kw) with keyword parameters `names` whose JSON schemas are those
    of the op's Request struct (protocol/schema.json's): the MCP SDK reads the signature."""
    import msgspec
    from pydantic import WithJsonSchema

    schema = msgspec.json.schema(struct)
    props = schema["$defs"][struct.__name__]["properties"]
    sig = inspect.signature(fn)
    params = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    for name in names:
        prop = {k: v for k, v in props[name].items() if k != "default"}
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None,
                                        annotation=Annotated[Any, WithJsonSchema(prop)]))
    fn.__signature__ = sig.replace(parameters=params)
    return fn


def _choice(r):
    out = {"text": r["text"], "finish_reason": r["finish_reason"], "completion_tokens": r["completion_tokens"]}
    if r.get("reasoning_content"):
        out["reasoning_content"] = r["reasoning_content"]
    return out


def build(model=None, device="auto", *, max_tokens=256, n_ctx=None):
    """The MCPServer with the four tools (the model loads with the server's lifespan)."""
    import contextlib
    import functools

    import anyio
    from pydantic import Field

    try:
        from mcp.server.mcpserver import MCPServer
        from mcp.server.mcpserver.exceptions import ToolError
    except ImportError:  # mcp 1.x
        from mcp.server.fastmcp import FastMCP as MCPServer
        from mcp.server.fastmcp.exceptions import ToolError

    from ..errors import ReflexError
    from ..ops.generate import GenerateRequest
    from ..ops.infill import InfillRequest

    engine = Engine(model, device, n_ctx)

    @contextlib.asynccontextmanager
    async def lifespan(server):
        engine.start()
        try:
            yield {}
        finally:
            await anyio.to_thread.run_sync(engine.close)

    async def call(method, args):
        cancel = threading.Event()
        try:
            return await anyio.to_thread.run_sync(functools.partial(engine.run, method, cancel, args),
                                                  abandon_on_cancel=True)
        except ReflexError as e:
            raise ToolError(f"{e.kind}: {e.message}") from None
        except anyio.get_cancelled_exc_class():
            cancel.set()  # the engine stops at its next token; the lock then passes on
            raise

    server = MCPServer("reflex", instructions=INSTRUCTIONS, lifespan=lifespan)

    Text = Optional[Annotated[str, Field(min_length=1)]]
    Messages = Optional[Annotated[list[dict[str, Any]], Field(
        min_length=1, description="a conversation, [{\"role\": \"system\"|\"user\"|\"assistant\", \"content\": "
                                  "text}, ...], rendered with the model's chat template")]]

    async def generate(
        prompt: Annotated[Text, Field(description="plain text to continue")] = None,
        messages: Messages = None,
        max_tokens: Annotated[int, Field(ge=1, le=131072, description="the most tokens to generate")] = max_tokens,
        temperature: Annotated[float, Field(ge=0, le=100, description="0 is greedy")] = 0.0,
        stop: Annotated[Optional[list[Annotated[str, Field(min_length=1)]]], Field(
            max_length=16, description="strings that end the text")] = None,
        json_schema: Annotated[Optional[dict[str, Any]], Field(
            description="constrain the output to this JSON Schema")] = None,
        **sampling,
    ) -> dict[str, Any]:
        r = await call("generate", {"prompt": prompt, "messages": messages, "max_tokens": max_tokens,
                                    "temperature": temperature, "stop": stop, "json_schema": json_schema,
                                    **sampling})
        out = {**_choice(r), "prompt_tokens": r["prompt_tokens"]}
        if r.get("choices"):
            out["choices"] = [{"index": c["index"], **_choice(c)} for c in r["choices"]]
        return out

    server.tool(name="generate", description=(
        "Generate text: continue `prompt`, or answer the conversation in `messages` (exactly one). "
        "Greedy unless temperature > 0; the sampling parameters are llama.cpp's (top_k, min_p, "
        "typical_p, penalties, logit_bias, DRY); n > 1 answers `choices`. Reasoning models: "
        "enable_thinking switches the template's thinking, thinking_budget caps it, and the "
        "reasoning comes back as reasoning_content."))(
        _protocol_fields(generate, GenerateRequest, SAMPLING + REASONING))

    @server.tool(description="Decide: score each label as the continuation of `text` (or as the first words "
                             "of the reply to `messages`) in one forward pass; returns each label's "
                             "probability, the best one and the entropy. With `questions`, one decision per "
                             "question over the shared text (evaluated once).")
    async def decide(
        labels: Annotated[list[Annotated[str, Field(min_length=1)]], Field(
            min_length=1, max_length=64, description="the choices, distinct; for `text` give the leading space "
                                                     "the text needs (\"Sentiment:\" + \" positive\")")],
        text: Annotated[Text, Field(description="the text the labels continue")] = None,
        messages: Messages = None,
        questions: Annotated[Optional[list[Annotated[str, Field(min_length=1)]]], Field(
            min_length=1, max_length=256, description="a batch: each appended to the text (or as a last user "
                                                      "message) and decided on its own")] = None,
        temperature: Annotated[float, Field(gt=0, le=100, description="for the probabilities")] = 1.0,
    ) -> dict[str, Any]:
        r = await call("classify", {"input": text, "messages": messages, "labels": labels, "questions": questions,
                                    "temperature": temperature})
        return {k: r[k] for k in ("labels", "best", "best_idx", "entropy", "results", "warning",
                                  "prompt_tokens", "cached_tokens") if r.get(k) is not None}

    @server.tool(description="Embed texts: one mean-pooled vector per input (L2-normalized by default).")
    async def embed(
        input: Annotated[Union[Annotated[str, Field(min_length=1)], Annotated[list[Annotated[str, Field(
            min_length=1)]], Field(min_length=1, max_length=1024)]], Field(description="a text or a list of texts")],
        normalize: bool = True,
    ) -> dict[str, Any]:
        r = await call("embed", {"input": input, "normalize": normalize, "pooling": "mean"})
        return {"embeddings": r["embeddings"], "dim": r["dim"], "n_tokens": r["n_tokens"]}

    async def infill(
        prefix: str,
        suffix: str = "",
        max_tokens: Annotated[int, Field(ge=1, le=131072)] = 64,
        temperature: Annotated[float, Field(ge=0, le=100)] = 0.0,
        stop: Annotated[Optional[list[Annotated[str, Field(min_length=1)]]], Field(max_length=16)] = None,
        **sampling,
    ) -> dict[str, Any]:
        r = await call("infill", {"prefix": prefix, "suffix": suffix, "max_tokens": max_tokens,
                                  "temperature": temperature, "stop": stop, **sampling})
        out = _choice(r)
        if r.get("choices"):
            out["choices"] = [{"index": c["index"], **_choice(c)} for c in r["choices"]]
        return out

    server.tool(name="infill", description=(
        "Fill in the middle: the text between `prefix` and `suffix` (code models with "
        "fill-in-the-middle tokens); the sampling parameters as generate's."))(
        _protocol_fields(infill, InfillRequest, SAMPLING))

    return server


def _private_stdout():
    """The MCP wire on a private dup of stdout, fd 1 pointed at stderr: a stray print (ours,
    a library's, C code's) can never corrupt the stream (as `reflex stdio` does)."""
    out_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = open(out_fd, "w", encoding="utf-8", closefd=True)


def run(model=None, device="auto", max_tokens=256, n_ctx=None) -> int:
    server = build(model, device, max_tokens=max_tokens, n_ctx=n_ctx)
    _private_stdout()
    server.run("stdio")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run(os.environ.get("REFLEX_MODEL")))
