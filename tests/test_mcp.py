"""`reflex mcp` over stdio, driven by the official `mcp` package's client: the four tools
are listed with their JSON schemas and each call answers what the engine answers (a
synthetic model with Qwen2.5-Coder's FIM tokens, so infill works too); engine errors are
tool errors naming the protocol's kind."""

import asyncio
import json
import os
import sys

import jsonschema
import pytest

import reflex_ipc.front  # noqa: F401  (reflex_client on the path)
from reflex_client import Client

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


@pytest.fixture(scope="module")
def fim_model(tmp_path_factory, smollm2):
    from reflex_ipc.testing import vocab as vg
    from reflex_ipc.testing.synthetic import parity_model

    d = tmp_path_factory.mktemp("mcp")
    vocab = str(d / "vocab.gguf")
    vg.vocab_gguf(vocab, vg.FIM_QWEN)
    return parity_model("llama", str(d / "fim.gguf"), vocab_paths={"gpt2": vocab})


@pytest.fixture(scope="module")
def engine(fim_model):
    c = Client.spawn(sys.executable, args=("-m", "reflex_ipc", "stdio", "--device", "cpu", "--model", fim_model),
                     env=_env(), ready_timeout=180)
    yield c
    c.close()


SAMPLED = {"max_tokens": 4, "temperature": 0.9, "seed": 3, "n": 2, "top_k": 20, "min_p": 0.02,
           "typical_p": 0.95, "repeat_penalty": 1.1, "frequency_penalty": 0.5, "presence_penalty": 0.2,
           "logit_bias": {"5": -100}, "dry_multiplier": 0.8, "dry_allowed_length": 1}


def session(model, body):
    """Run `body(client)` against a fresh `reflex mcp` over stdio."""
    from mcp import Client as MCPClient
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(command=sys.executable, env=_env(),
                                   args=["-m", "reflex_ipc", "mcp", "--device", "cpu", "--model", model])

    async def main():
        async with MCPClient(params, read_timeout_seconds=300) as c:
            return await body(c)

    return asyncio.run(main())


def test_tools_listed_and_called(fim_model, engine):
    calls = {
        "generate": {"prompt": "def add(a, b):", "max_tokens": 6},
        "decide": {"text": "def add(a, b):", "labels": [" return", " pass"]},
        "embed": {"input": ["def add", "class A"]},
        "infill": {"prefix": "def add(a, b):\n    return ", "suffix": "\n", "max_tokens": 4},
    }

    async def body(c):
        tools = {t.name: t for t in (await c.list_tools()).tools}
        results = {name: await c.call_tool(name, args) for name, args in calls.items()}
        batch = await c.call_tool("decide", {"text": "x = 1\n", "labels": [" yes", " no"],
                                             "questions": ["Is it Python?", "Is it C?"]})
        bad = await c.call_tool("generate", {"prompt": "x", "messages": [{"role": "user", "content": "y"}]})
        invalid = await c.call_tool("decide", {"text": "x", "labels": []})
        sampled = await c.call_tool("generate", {"prompt": "def add(a, b):", **SAMPLED})
        out_of_range = await c.call_tool("generate", {"prompt": "x", "typical_p": 0})
        return tools, results, batch, bad, invalid, sampled, out_of_range

    tools, results, batch, bad, invalid, sampled, out_of_range = session(fim_model, body)
    assert set(tools) == {"generate", "decide", "embed", "infill"}
    for name, args in calls.items():  # every tool has a JSON schema that its example satisfies
        schema = tools[name].input_schema
        assert schema["type"] == "object" and tools[name].description
        jsonschema.validate(args, schema)
    assert tools["decide"].input_schema["required"] == ["labels"]
    assert tools["decide"].input_schema["properties"]["labels"]["maxItems"] == 64

    out = {name: r.structured_content for name, r in results.items()}
    assert not any(r.is_error for r in results.values()), results
    for name, r in results.items():  # the text content carries the same JSON
        assert json.loads(r.content[0].text) == out[name]
    ref = engine.generate("def add(a, b):", max_tokens=6)
    assert out["generate"]["text"] == ref["text"] and out["generate"]["completion_tokens"] == 6
    ref = engine.request("classify", {"input": "def add(a, b):", "labels": [" return", " pass"]})
    assert out["decide"]["best"] == ref["best"]
    assert [x["probability"] for x in out["decide"]["labels"]] == pytest.approx([x["probability"] for x in ref["labels"]])
    ref = engine.embed(["def add", "class A"], normalize=True)
    assert out["embed"]["dim"] == ref["dim"] and len(out["embed"]["embeddings"]) == 2
    assert out["embed"]["embeddings"][0] == pytest.approx(ref["embeddings"][0], abs=1e-6)
    ref = engine.infill("def add(a, b):\n    return ", "\n", max_tokens=4)
    assert out["infill"]["text"] == ref["text"]
    assert [x["question"] for x in batch.structured_content["results"]] == ["Is it Python?", "Is it C?"]
    assert bad.is_error and "invalid_request" in bad.content[0].text and "exactly one" in bad.content[0].text
    assert invalid.is_error

    # the sampling and reasoning parameters are the protocol's fields, with its schemas
    from reflex_ipc.front.mcp_server import REASONING, SAMPLING

    with open(os.path.join(REPO, "protocol", "schema.json")) as f:
        proto = json.load(f)
    for op in ("generate", "infill"):
        req = proto["$defs"][f"request_{op}"]["properties"]
        props = tools[op].input_schema["properties"]
        for name in SAMPLING + (REASONING if op == "generate" else ()):
            want = {k: v for k, v in req[name].items() if k not in ("default", "title")}
            got = {k: v for k, v in props[name].items() if k not in ("default", "title")}
            assert got == want, name
    jsonschema.validate({"prompt": "x", **SAMPLED}, tools["generate"].input_schema)
    assert not sampled.is_error, sampled.content
    ref = engine.generate("def add(a, b):", **SAMPLED)
    got = sampled.structured_content
    assert [c["text"] for c in got["choices"]] == [c["text"] for c in ref["choices"]]
    assert got["text"] == ref["text"]
    assert out_of_range.is_error and "invalid_request: " in out_of_range.content[0].text
    assert "typical_p" in out_of_range.content[0].text


def test_missing_extra_is_named(tmp_path):
    """Without the mcp package the command says which extra to install (exit 1)."""
    import subprocess

    shadow = tmp_path / "mcp"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('no mcp here', name='mcp')\n")
    env = _env()
    env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env["PYTHONPATH"]
    p = subprocess.run([sys.executable, "-m", "reflex_ipc", "mcp"], env=env, capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL)
    assert p.returncode == 1 and "pip install 'reflex-ipc[mcp]'" in p.stderr


def test_model_that_does_not_load(tmp_path):
    """The model loads in the MCP server's process while the client initializes; when it
    cannot load, every tool call is a tool error with the load's error kind."""
    missing = str(tmp_path / "nope.gguf")

    async def body(c):
        tools = (await c.list_tools()).tools
        return tools, await c.call_tool("generate", {"prompt": "x"}), await c.call_tool("embed", {"input": "x"})

    tools, gen, emb = session(missing, body)
    assert len(tools) == 4
    for r in (gen, emb):
        assert r.is_error and "model_not_found: the model did not load" in r.content[0].text
