"""`reflex mcp`: a Model Context Protocol server over stdio exposing the engine's ops as
tools: `generate`, `decide` (the classify op: system1 with labels), `embed` and `infill`.

The MCP side is the official `mcp` package (the `mcp` extra, imported only here); the
engine is a `reflex stdio` child spoken to through reflex_client's AsyncClient, one request
at a time (the engine stays a strictly sequential loop; the client queues concurrent tool
calls FIFO and starts a new engine when one dies). The child starts before the MCP
session is set up, so the model loads while the client initializes. An engine error is a
tool error (`isError`) whose text is `KIND: MESSAGE`, with the protocol's error kinds.
"""

import os
import sys
from typing import Annotated, Any, Optional, Union

INSTRUCTIONS = ("A local language model. generate: continue a prompt or answer a conversation. "
                "decide: pick one of a few labels for a text or conversation in one forward pass "
                "(probabilities and entropy; a batch of questions over one shared text). "
                "embed: vectors for texts. infill: fill in the middle (code models with FIM tokens).")


def engine_argv(model=None, device="auto"):
    argv = [sys.executable, *(["-P"] if sys.version_info >= (3, 11) else []), "-m", "reflex_ipc", "stdio",
            "--device", device]
    if model:
        argv += ["--model", model]
    return argv


def build(model=None, device="auto", *, max_tokens=256):
    """The MCPServer with the four tools (the engine starts with the server's lifespan)."""
    import contextlib

    from pydantic import Field

    try:
        from mcp.server.mcpserver import MCPServer
        from mcp.server.mcpserver.exceptions import ToolError
    except ImportError:  # mcp 1.x
        from mcp.server.fastmcp import FastMCP as MCPServer
        from mcp.server.fastmcp.exceptions import ToolError

    from reflex_client import ReflexError
    from reflex_client._async import AsyncClient

    state = {"client": None}

    @contextlib.asynccontextmanager
    async def lifespan(server):
        argv = engine_argv(model, device)
        state["client"] = await AsyncClient.spawn(argv[0], argv[1:], stderr=None, ready_timeout=600)
        try:
            yield {}
        finally:
            client, state["client"] = state["client"], None
            await client.close()

    async def call(op, params):
        try:
            return await state["client"].request(op, {k: v for k, v in params.items() if v is not None})
        except ReflexError as e:
            raise ToolError(f"{e.kind}: {e.message}") from None

    server = MCPServer("reflex", instructions=INSTRUCTIONS, lifespan=lifespan)

    Text = Optional[Annotated[str, Field(min_length=1)]]
    Messages = Optional[Annotated[list[dict[str, Any]], Field(
        min_length=1, description="a conversation, [{\"role\": \"system\"|\"user\"|\"assistant\", \"content\": "
                                  "text}, ...], rendered with the model's chat template")]]

    @server.tool(description="Generate text: continue `prompt`, or answer the conversation in `messages` "
                             "(exactly one). Greedy unless temperature > 0.")
    async def generate(
        prompt: Annotated[Text, Field(description="plain text to continue")] = None,
        messages: Messages = None,
        max_tokens: Annotated[int, Field(ge=1, le=131072, description="the most tokens to generate")] = max_tokens,
        temperature: Annotated[float, Field(ge=0, le=100, description="0 is greedy")] = 0.0,
        top_p: Annotated[Optional[float], Field(gt=0, le=1)] = None,
        seed: Annotated[Optional[int], Field(ge=0)] = None,
        stop: Annotated[Optional[list[str]], Field(max_length=16, description="strings that end the text")] = None,
        json_schema: Annotated[Optional[dict[str, Any]], Field(
            description="constrain the output to this JSON Schema")] = None,
    ) -> dict[str, Any]:
        r = await call("generate", {"prompt": prompt, "messages": messages, "max_tokens": max_tokens,
                                    "temperature": temperature, "top_p": top_p, "seed": seed, "stop": stop,
                                    "json_schema": json_schema})
        out = {"text": r["text"], "finish_reason": r["finish_reason"], "prompt_tokens": r["prompt_tokens"],
               "completion_tokens": r["completion_tokens"]}
        if r.get("reasoning_content"):
            out["reasoning_content"] = r["reasoning_content"]
        return out

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

    @server.tool(description="Fill in the middle: the text between `prefix` and `suffix` (code models with "
                             "fill-in-the-middle tokens).")
    async def infill(
        prefix: str,
        suffix: str = "",
        max_tokens: Annotated[int, Field(ge=1, le=131072)] = 64,
        temperature: Annotated[float, Field(ge=0, le=100)] = 0.0,
        stop: Annotated[Optional[list[str]], Field(max_length=16)] = None,
    ) -> dict[str, Any]:
        r = await call("infill", {"prefix": prefix, "suffix": suffix, "max_tokens": max_tokens,
                                  "temperature": temperature, "stop": stop})
        return {"text": r["text"], "finish_reason": r["finish_reason"], "completion_tokens": r["completion_tokens"]}

    return server


def run(model=None, device="auto", max_tokens=256) -> int:
    server = build(model, device, max_tokens=max_tokens)
    server.run("stdio")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run(os.environ.get("REFLEX_MODEL")))
