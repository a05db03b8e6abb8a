"""The generation pipeline (reflex_ipc/generation): n choices from one prompt state, the
reasoning splitter and the thinking budget, on tiny models with SmolLM2's tokenizer (one
with <think> and </think> tokens of its own)."""

import json
import random

import numpy as np
import pytest

from reflex_ipc import protocol
from reflex_ipc.engine import load_runner
from reflex_ipc.errors import ReflexError
from reflex_ipc.generation import Params
from reflex_ipc.generation.reasoning import ReasoningSplitter
from reflex_ipc.api import Model

pytestmark = pytest.mark.usefixtures("smollm2")

PROMPT = "The capital of France is"
THINK, END = 49150, 49151  # SmolLM2's last two tokens, renamed <think> and </think> (THINK_IDS)
TEMPLATE = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{%- if add_generation_prompt %}<|im_start|>assistant\n"
            "{%- if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
            "{%- else %}<think>\n{%- endif %}{%- endif %}")


@pytest.fixture(scope="module")
def runner(tiny_models):
    r = load_runner(tiny_models["llama"][0], device="numpy", n_ctx=256)
    yield r
    r.close()


@pytest.fixture(scope="module")
def thinker(tmp_path_factory, smollm2):
    """A tiny llama whose vocabulary has <think> and </think> as user-defined tokens, as
    Qwen3's has."""
    from reflex_ipc.testing.synthetic import thinker_gguf

    r = load_runner(thinker_gguf(tmp_path_factory.mktemp("thinker")), device="numpy", n_ctx=256)
    yield r
    r.close()


def request(**fields):
    """The protocol's generate request struct (checked as a request line is)."""
    _, _, req = protocol.parse_request(json.dumps({"op": "generate", **fields}).encode())
    return req


# -- parameters ------------------------------------------------------------------------

def test_params_names_and_defaults():
    p = Params()
    assert (p.n, p.typical_p, p.dry_base, p.dry_penalty_last_n, p.repeat_last_n) == (1, 1.0, 1.75, 64, 64)
    with pytest.raises(TypeError):
        Params(temprature=1.0)
    req = request(prompt="x", frequency_penalty=0.5, n=3, stop="a")
    q = Params.of(req, stop=["a"])
    assert (q.frequency_penalty, q.n, q.stop, q.max_tokens) == (0.5, 3, ["a"], 64)
    # the engine's defaults are the protocol's
    for name, v in Params.DEFAULTS.items():
        if hasattr(req, name) and name not in ("stop", "n", "frequency_penalty"):
            assert getattr(req, name) == v or list(getattr(req, name)) == list(v), name


# -- n choices ---------------------------------------------------------------------------

def test_n_choices_are_single_requests_with_seed_plus_i(runner):
    out = runner.generate(PROMPT, max_tokens=6, temperature=0.9, seed=11, n=3, cache_prompt=False)
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    for i, c in enumerate(out["choices"]):
        one = runner.generate(PROMPT, max_tokens=6, temperature=0.9, seed=11 + i, cache_prompt=False)
        assert c["token_ids"] == one["token_ids"] and c["text"] == one["text"], i
    first = out["choices"][0]
    assert (out["text"], out["token_ids"], out["finish_reason"], out["completion_tokens"]) == (
        first["text"], first["token_ids"], first["finish_reason"], first["completion_tokens"])
    greedy = runner.generate(PROMPT, max_tokens=4, n=2, cache_prompt=False)
    assert greedy["choices"][0]["token_ids"] == greedy["choices"][1]["token_ids"]
    assert "choices" not in runner.generate(PROMPT, max_tokens=2)


def test_n_choices_stream_with_their_index_and_logprobs(runner):
    events = []
    out = runner.generate(PROMPT, max_tokens=4, temperature=1.0, seed=2, n=2, logprobs=1, stop=["zz"],
                          on_token=lambda t, text, **kw: events.append((t, text, kw)))
    for i, c in enumerate(out["choices"]):
        mine = [e for e in events if e[2]["index"] == i]
        assert "".join(e[1] for e in mine) == c["text"]
        assert [e[2]["logprobs"]["token_id"] for e in mine] == c["token_ids"] == \
            [x["token_id"] for x in c["logprobs"]]


def test_n_choices_with_a_constraint(runner):
    from reflex_ipc import prepare

    extra = prepare.generate_extras(runner, regex="(yes|no)[.!]")
    out = runner.generate(PROMPT, max_tokens=8, temperature=1.5, seed=4, n=3, **extra)
    for c in out["choices"]:
        assert c["text"] in ("yes.", "yes!", "no.", "no!") and c["finish_reason"] == "stop", c


def test_n_choices_over_the_protocol(runner):
    req = request(prompt=PROMPT, max_tokens=3, n=2, temperature=0.7, seed=1)
    out = Model(runner).generate(req)
    assert len(out["choices"]) == 2 and out["prompt_tokens"] == 5


# -- reasoning ---------------------------------------------------------------------------

SPLITS = [
    ("<think>\nabc\n</think>\n\nHello", "Hello", "abc", False),
    ("  <think>a b </think>x <think>y</think>", "x <think>y</think>", "a b", False),
    ("no think <think>x</think>", "no think <think>x</think>", "", False),
    ("\nthought\n</think>\n\nanswer\n", "answer\n", "thought", True),
    ("<think>unfinished  ", "", "unfinished", False),
    ("<thin", "<thin", "", False),
    ("<think>\n\n</think>\n\nok", "ok", "", False),
    ("partial </thi", "", "partial </thi", True),
]


@pytest.mark.parametrize("text,content,reasoning,open_", SPLITS)
def test_reasoning_splitter_any_pieces(text, content, reasoning, open_):
    """The same two texts however the output arrives in pieces."""
    rng = random.Random(len(text))
    for trial in range(30):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 6)))) if len(text) > 1 else []
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        s = ReasoningSplitter(open_)
        c = r = ""
        for p in pieces:
            a, b = s.push(p)
            c, r = c + a, r + b
        a, b = s.finish()
        assert (c + a, r + b) == (content, reasoning), pieces


def chat(runner, **kw):
    req = request(messages=[{"role": "user", "content": "Why?"}], chat_template=TEMPLATE, **kw)
    events = []
    out = Model(runner).generate(req, on_token=lambda t, text, **x: events.append((t, text, x)))
    return out, events


def test_thinking_budget_closes_the_block(thinker):
    tok = thinker.tok
    assert thinker.tokenize("<think></think>", add_bos=False) == [THINK, END]
    for budget in (0, 3):
        out, events = chat(thinker, max_tokens=8, thinking_budget=budget)
        ids = out["token_ids"]
        assert ids[budget] == END and END not in ids[:budget], ids
        assert out["reasoning_content"] == tok.decode(ids[:budget]).strip() if budget else \
            "reasoning_content" not in out
        assert out["text"] == tok.decode(ids[budget + 1:]).lstrip()
        assert "".join(e[1] for e in events) == out["text"]
        assert "".join(e[2].get("reasoning_content", "") for e in events) == out.get("reasoning_content", "")


def test_reasoning_without_a_budget_and_with_thinking_off(thinker):
    out, _ = chat(thinker, max_tokens=6)  # the block stays open: everything is reasoning
    assert out["text"] == "" and out["reasoning_content"] == thinker.tok.decode(out["token_ids"]).strip()
    out, _ = chat(thinker, max_tokens=6, enable_thinking=False)  # the template closed it
    assert "reasoning_content" not in out and out["text"] == thinker.tok.decode(out["token_ids"])
    # a prompt request returns the raw text; a budget still closes an open block
    ids = thinker.tokenize("Why? <think>", add_bos=None)
    raw = thinker.generate(ids, max_tokens=5, thinking_budget=2)
    assert raw["token_ids"][2] == END and "reasoning_content" not in raw
    assert raw["text"] == thinker.tok.decode(raw["token_ids"])


def test_model_opened_block_is_separated(thinker):
    """A block the model opens itself (biased here to start with <think>)."""
    out, events = chat(thinker, max_tokens=6, enable_thinking=False, thinking_budget=2,
                       logit_bias={str(THINK): 100.0})
    ids = out["token_ids"]
    assert ids[:4] == [THINK, THINK, THINK, END], ids  # opened, 2 tokens counted, then closed
    assert out["reasoning_content"] == "<think><think>"  # a second start tag is reasoning text
    assert out["text"] == thinker.tok.decode(ids[4:]).lstrip()


def test_budget_needs_think_tokens(runner):
    with pytest.raises(ReflexError) as ei:
        runner.generate(PROMPT, max_tokens=2, thinking_budget=5)
    assert ei.value.kind == "invalid_request" and "<think>" in ei.value.message


def test_enable_thinking_rules(runner):
    with pytest.raises(ReflexError) as ei:
        Model(runner).generate(request(prompt="x", enable_thinking=True))
    assert ei.value.kind == "invalid_request"
    with pytest.raises(ReflexError) as ei:
        Model(runner).generate(request(messages=[{"role": "user", "content": "x"}], chat_template=TEMPLATE,
                                       enable_thinking=True, chat_template_kwargs={"enable_thinking": False}))
    assert ei.value.kind == "invalid_request" and "differ" in ei.value.message


def test_typical_p_over_the_protocol(runner):
    out = Model(runner).generate(request(prompt=PROMPT, max_tokens=4, temperature=1.0, typical_p=0.5,
                                         seed=3))
    assert out["completion_tokens"] == 4
    assert np.isfinite([out["timings"]["decode"]]).all()


def test_the_engine_imports_nothing_of_the_protocol(tiny_models):
    """generate (with processors and choices), system1 and embed run without reflex_ipc.ops
    or msgspec: the engine does not depend on the protocol."""
    import subprocess
    import sys

    code = ("import sys\nfrom reflex_ipc.engine import load_runner\n"
            f"r = load_runner({tiny_models['llama'][0]!r}, device='numpy', n_ctx=64)\n"
            "r.generate('Hi', max_tokens=2, frequency_penalty=0.5, dry_multiplier=0.5, n=2, temperature=0.5,"
            " logprobs=1, stop=['x'])\n"
            "r.system1('Hi', [' a', ' b'])\nr.embed(['x'])\n"
            "print(sorted(m for m in sys.modules if m.startswith('reflex_ipc.ops') or m == 'msgspec'"
            " or m == 'reflex_ipc.api'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
