"""Issue 14 through the runner and the server: prefix reuse, logprobs (against llama.cpp
on an F32 twin), schema-constrained generation, tool calls, infill on a model with
FIM tokens, chat through `reflex stdio`.

Models: tests/data/synthetic-llama.gguf (random weights, SmolLM2's vocabulary) and its
F32 twin (scripts/record_goldens.f32_twin), a synthetic llama whose vocabulary has FIM
tokens (tests/vocabgguf.py + scripts/make_synthetic.build), and SmolLM2 itself.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from reflex_ipc.testing import vocab as vg

from reflex_ipc import prepare
from reflex_ipc.engine import load_runner
from reflex_ipc.errors import ReflexError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYN = os.path.join(ROOT, "tests", "data", "synthetic-llama.gguf")


pytestmark = pytest.mark.usefixtures("smollm2")


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    from reflex_ipc.testing.synthetic import f32_twin

    return f32_twin(SYN, str(tmp_path_factory.mktemp("twin") / "twin.gguf"))


@pytest.fixture(scope="module")
def smol():
    return load_runner("smollm2", device="cpu", n_ctx=2048)


def log_softmax(z):
    z = np.asarray(z, dtype=np.float64)
    m = z.max()
    return z - m - np.log(np.exp(z - m).sum())


# -- prefix reuse ---------------------------------------------------------------------
def test_prefix_reuse_gives_identical_results(twin):
    r = load_runner(twin, device="cpu", n_ctx=512)
    base = "def add(a, b):\n    return a + b\n\n" * 8
    prompts = [base + "print(add(1, 2))", base + "print(add(3, 4))", base, base + "x = 1"]
    for temp, seed in ((0.0, None), (0.8, 7)):
        fresh = [r.generate(p, max_tokens=12, temperature=temp, seed=seed, cache_prompt=False)
                 for p in prompts]
        reused = [r.generate(p, max_tokens=12, temperature=temp, seed=seed) for p in prompts]
        for a, b in zip(fresh, reused):
            assert a["token_ids"] == b["token_ids"] and a["text"] == b["text"]
            assert a.get("cached_tokens", 0) == 0
        n_base = len(r.tokenize(base, add_bos=None))
        # each request after the first shares at least the base with the one before
        assert all(b["cached_tokens"] >= n_base - 1 for b in reused[1:])
        assert all(b["cached_tokens"] < b["prompt_tokens"] for b in reused)


# -- logprobs -------------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_logprobs_match_llama_cpp_f32_twin(twin, temperature, llama_cpp):
    """Each entry is log_softmax(logits / T) of llama.cpp's logits for the same tokens
    (exact arithmetic: F32 weights, F32 KV cache), within 1e-3."""
    r = load_runner(twin, device="numpy", n_ctx=256)  # the numpy oracle: llama.cpp parity
    prompt = "The quick brown fox jumps over the lazy dog, and then"
    n = 5
    out = r.generate(prompt, max_tokens=10, temperature=temperature, seed=3, logprobs=n,
                     cache_prompt=False)
    entries = out["logprobs"]
    assert len(entries) == len(out["token_ids"]) == out["completion_tokens"]
    ids = r.tokenize(prompt, add_bos=None)
    llm = llama_cpp.Llama(twin, n_ctx=256, n_batch=256, logits_all=True, type_k=0, type_v=0,
                          n_threads=2, verbose=False)
    try:
        llm.eval(ids + out["token_ids"])
        scores = np.array(llm.scores[: len(ids) + len(out["token_ids"])], dtype=np.float64)
    finally:
        llm.close()
    t = temperature if temperature > 0 else 1.0
    for k, (tid, e) in enumerate(zip(out["token_ids"], entries)):
        lp = log_softmax(scores[len(ids) - 1 + k] / t)
        assert e["token_id"] == tid and e["text"] == r.detokenize([tid])
        assert abs(e["logprob"] - lp[tid]) < 1e-3, (k, e["logprob"], lp[tid])
        assert len(e["top"]) == n
        top_ids = [x["token_id"] for x in e["top"]]
        want = np.argsort(-lp)[:n]
        assert np.allclose([x["logprob"] for x in e["top"]], lp[want], atol=1e-3)
        assert set(top_ids[:2]) <= set(np.argsort(-lp)[: n + 1].tolist())
        assert [x["logprob"] for x in e["top"]] == sorted([x["logprob"] for x in e["top"]],
                                                          reverse=True)


def test_logprobs_streamed_and_zero(twin):
    r = load_runner(twin, device="cpu", n_ctx=128)
    seen = []
    out = r.generate("1, 2, 3,", max_tokens=4, logprobs=0,
                     on_token=lambda tid, text, **kw: seen.append(kw.get("logprobs")))
    assert [e["top"] for e in out["logprobs"]] == [[]] * 4
    assert [s for s in seen if s is not None] == out["logprobs"]
    with pytest.raises(ReflexError) as e:
        prepare.check_logprobs(21)
    assert e.value.kind == "invalid_request" and "logprobs" in e.value.message


# -- constrained generation -----------------------------------------------------------
SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 24},
    "country": {"enum": ["France", "Germany", "Italy"]},
    "population_millions": {"type": "integer", "minimum": 0, "maximum": 40}},
    "required": ["city", "country", "population_millions"], "additionalProperties": False}


def test_json_schema_generate(smol):
    import jsonschema

    prompt = prepare.chat_text(smol, [{"role": "user", "content":
                                        "Describe the capital of France as JSON."}])
    for temp, seed in ((0.0, None), (1.0, 1), (1.0, 2)):
        out = smol.generate(prompt, max_tokens=80, temperature=temp, seed=seed,
                            **prepare.generate_extras(smol, json_schema=SCHEMA))
        assert out["finish_reason"] == "stop", out
        jsonschema.validate(json.loads(out["text"]), SCHEMA)


def test_regex_and_grammar_generate(smol):
    out = smol.generate("The year the Eiffel Tower opened:", max_tokens=8,
                        **prepare.generate_extras(smol, regex=r" ?1[89][0-9]{2}"))
    assert out["finish_reason"] == "stop"
    import re

    assert re.fullmatch(r" ?1[89][0-9]{2}", out["text"])
    g = 'start: answer\nanswer: "yes" | "no"'
    out = smol.generate("Is Paris in France?", max_tokens=4, **prepare.generate_extras(smol, grammar=g))
    assert out["text"] in ("yes", "no")


def test_tool_call_parsed(smol):
    """A Hermes-style call (forced with a regex: SmolLM2 has no tool training) comes
    back as tool_calls with parsed arguments."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    prompt = prepare.chat_text(smol, [{"role": "user", "content": "Weather in Paris?"}], tools=tools)
    rx = r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "[A-Z][a-z]{1,10}"\}\}\n</tool_call>'
    out = smol.generate(prompt, max_tokens=60, **prepare.generate_extras(smol, regex=rx))
    out = prepare.add_tool_calls(dict(out), tools)
    assert out["tool_calls"][0]["function"]["name"] == "get_weather"
    assert set(json.loads(out["tool_calls"][0]["function"]["arguments"])) == {"city"}


# -- infill ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fim_model(tmp_path_factory):
    from reflex_ipc.testing.synthetic import parity_model

    d = tmp_path_factory.mktemp("fimmodel")
    vocab = str(d / "vocab.gguf")
    vg.vocab_gguf(vocab, vg.FIM_QWEN)
    return parity_model("llama", str(d / "fim-llama.gguf"), vocab_paths={"gpt2": vocab})


def test_infill_runs_with_the_layout(fim_model):
    from reflex_ipc.infill import infill_prompt

    r = load_runner(fim_model, device="cpu", n_ctx=512)
    ids = prepare.infill_ids(r, "def f(x):\n    return ", "\n\nprint(f(2))", max_tokens=8,
                             input_extra=[{"filename": "a.py", "text": "y = 1\n"}])
    assert ids == infill_prompt(r.tok, "def f(x):\n    return ", "\n\nprint(f(2))", max_tokens=8,
                                n_ctx=512, input_extra=[{"filename": "a.py", "text": "y = 1\n"}])
    out = r.generate(ids, max_tokens=8)
    assert out["prompt_tokens"] == len(ids) and out["completion_tokens"] >= 1


# -- through reflex stdio ------------------------------------------------------------
def _stdio(model, lines):
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.run([sys.executable, "-m", "reflex_ipc", "stdio", "--device", "cpu",
                        "--model", model], input="".join(json.dumps(x) + "\n" for x in lines),
                       capture_output=True, text=True, timeout=600, env=env)
    out = [json.loads(x) for x in p.stdout.splitlines()]
    assert out[0]["event"] == "ready", p.stderr
    return out[1:]


def test_stdio_infill_logprobs_schema_cached(fim_model):
    lines = [
        {"id": 1, "op": "infill", "prefix": "def f(x):\n    return ", "suffix": "\n", "max_tokens": 4,
         "logprobs": 2, "stream": True},
        {"id": 2, "op": "infill", "prefix": "def f(x):\n    return ", "suffix": "\n", "max_tokens": 4},
        {"id": 3, "op": "generate", "prompt": "Answer:", "max_tokens": 20,
         "json_schema": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 999}},
                         "required": ["a"], "additionalProperties": False}},
        {"id": 4, "op": "generate", "prompt": "x", "json_schema": {"type": "nope"}},
        {"id": 5, "op": "generate", "prompt": "Answer:", "max_tokens": 2},
    ]
    res = _stdio(fim_model, lines)
    toks = [x for x in res if x["event"] == "token"]
    results = [x for x in res if x["event"] == "result"]
    assert [x["id"] for x in results] == [1, 2, 3, 4, 5]
    r1, r2, r3, r4, r5 = results
    assert r1["ok"] and len(r1["logprobs"]) == r1["completion_tokens"]
    assert all("logprobs" in t for t in toks) and len(toks) >= 1
    assert r2["ok"] and r2["token_ids"] == r1["token_ids"] and r2["cached_tokens"] > 0
    assert r3["ok"] and "a" in json.loads(r3["text"]) if r3["finish_reason"] == "stop" else r3["ok"]
    assert not r4["ok"] and r4["error"]["kind"] == "invalid_request"
    assert "json_schema" in r4["error"]["message"]
    assert r5["ok"]


def test_features_import_nothing_until_used():
    """A plain generate imports neither jinja2 nor llguidance; messages bring jinja2 only."""
    code = (
        "import sys\n"
        "from reflex_ipc import server, protocol\n"
        "from reflex_ipc.ops import registry\n"
        "class Conn:\n"
        "    out = []\n"
        "    def write(self, b): self.out.append(b)\n"
        "    def hung_up(self): return False\n"
        "s = server.Server(device='cpu'); s.proto, s.ops = protocol, registry(); c = Conn()\n"
        "s.handle(b'{\"op\":\"generate\",\"prompt\":\"Hi\",\"max_tokens\":1}', c)\n"
        "print(sorted(m for m in ('jinja2', 'llguidance') if m in sys.modules))\n"
        "s.handle(b'{\"op\":\"tokenize\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}', c)\n"
        "print(sorted(m for m in ('jinja2', 'llguidance') if m in sys.modules))\n"
        "assert all(b'\"ok\":true' in x for x in c.out), c.out\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["[]", "['jinja2']"]


def test_cli_generate_imports_no_front():
    """`reflex generate` (the cold path to a first token) imports nothing of the HTTP / MCP
    fronts, their packages, chat templates or constraints: each comes with the request or
    command that uses it."""
    code = ("import sys\nfrom reflex_ipc import cli\n"
            "try:\n    cli.main(['generate', '--device', 'cpu', '--max-tokens', '1', 'Hi'])\n"
            "except SystemExit:\n    pass\n"
            "heavy = ('reflex_ipc.front', 'reflex_ipc.toolcalls', 'reflex_ipc.ops.classify', 'starlette',"
            " 'uvicorn', 'mcp', 'pydantic', 'anyio', 'anthropic', 'openai', 'httpx', 'jinja2', 'llguidance')\n"
            "print(sorted(m for m in heavy if m in sys.modules), file=sys.stderr)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=ROOT, REFLEX_DETACH="0"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() and r.stderr.strip().splitlines()[-1] == "[]", (r.stdout, r.stderr)


def _cli(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "reflex_ipc", *args], input=stdin,
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=ROOT, REFLEX_DETACH="0"))


def test_cli_chat_stdin_schema_infill(fim_model):
    # the numpy oracle: on the cpu backend greedy SmolLM2 may open its answer differently
    # (the first token is a close call: "The" at logprob -1.88)
    p = _cli("generate", "--device", "numpy", "--chat", "--max-tokens", "16",
             "What is the capital of France?")
    assert p.returncode == 0 and "Paris" in p.stdout, p.stderr
    p = _cli("generate", "--device", "numpy", "--chat", "--json", "--max-tokens", "16",
             stdin="What is the capital of France?")
    assert p.returncode == 0 and "Paris" in json.loads(p.stdout)["text"], p.stderr
    schema = '{"type":"object","properties":{"city":{"type":"string","maxLength":12}},' \
             '"required":["city"],"additionalProperties":false}'
    p = _cli("generate", "--device", "numpy", "--chat", "--json", "--json-schema", schema,
             "--logprobs", "1", "--max-tokens", "30", "Capital of France as JSON?")
    out = json.loads(p.stdout)
    assert out["finish_reason"] == "stop" and "city" in json.loads(out["text"])
    assert len(out["logprobs"]) == out["completion_tokens"]
    p = _cli("system1", "--device", "numpy", "--chat", "What is the capital of France?",
             "--candidate", "Paris", "--candidate", "London", "--candidate", "Berlin")
    rows = p.stdout.splitlines()
    assert p.returncode == 0 and rows[0].split() == ["prob", "logprob", "tokens", "candidate"]
    assert rows[1].startswith("*") and "'Paris'" in rows[1]
    p = _cli("infill", "--device", "numpy", "--prefix", "def f(", "--suffix", ")")
    # invalid_request: exit 2 (README, "Exit codes")
    assert p.returncode == 2 and "invalid_request" in p.stderr and "fill-in-the-middle" in p.stderr
    p = _cli("infill", "--device", "numpy", "--model", fim_model, "--json", "--max-tokens", "3",
             "--prefix", "def f(", "--suffix", ")")
    assert p.returncode == 0 and json.loads(p.stdout)["completion_tokens"] >= 1, p.stderr
    p = _cli("generate", "--device", "numpy", "--regex", "(a", "x")
    assert p.returncode == 2 and "`regex`" in p.stderr
