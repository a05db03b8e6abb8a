"""Infill prompts (reflex_ipc/infill.py) against llama.cpp's server layout.

The expected ids are built here from llama.cpp's rules (tools/server format_prompt_infill)
with llama.cpp itself doing the parts that matter: the FIM token ids come from the
library's vocabulary (llama_vocab_fim_pre/suf/mid/rep/sep: the GGUF keys and its
fallbacks by token text), every text is tokenized by llama.cpp (no BOS, no special
parsing), BOS from llama_vocab_get_add_bos. Vocabularies: SmolLM2's plus FIM tokens
given by metadata keys (with repo and file-separator tokens: the repo-level layout),
found by text only (no separator: the snippet layout, and a vocabulary that adds BOS),
and SmolLM2 itself, which has none.
"""

import pytest

from reflex_ipc.testing import vocab as vg

from reflex_ipc import infill
from reflex_ipc.errors import ReflexError
from reflex_ipc.gguffile import GGUFFile
from reflex_ipc.tokenizer import load_tokenizer

pytestmark = pytest.mark.usefixtures("smollm2", "llama_cpp")

PREFIX = "def fib(n):\n    \"\"\"Fibonacci, naïve 🙂\"\"\"\n    if n < 2:\n        return n\n    "
SUFFIX = "\n\nprint(fib(10))  # <|fim_middle|> is text here\n"
EXTRA = [{"filename": "utils/math.py", "text": "def add(a, b):\n    return a + b\n"},
         {"filename": "README.md", "text": "# Project\nFibonacci numbers.\n"},
         {"text": "no filename"}]


@pytest.fixture(scope="module")
def vocabs(tmp_path_factory):
    d = tmp_path_factory.mktemp("fim")
    keyed = str(d / "keyed.gguf")
    ids = vg.vocab_gguf(keyed, vg.FIM_QWEN)
    names = ["pre", "suf", "mid", "pad", "rep", "sep"]
    vg.vocab_gguf(keyed, vg.FIM_QWEN, {f"tokenizer.ggml.fim_{n}_token_id": ids[t]
                                       for n, (t, _) in zip(names, vg.FIM_QWEN)})
    bytext = str(d / "bytext.gguf")
    vg.vocab_gguf(bytext, [(t, vg.CONTROL) for t in ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")],
                  {"tokenizer.ggml.add_bos_token": True})
    return {"keyed": keyed, "bytext": bytext, "none": vg.smollm2_path()}


def expected(path, prefix, suffix, extra, prompt="", n_ctx=4096, n_predict=64, n_batch=2048):
    """llama.cpp's server layout, with llama.cpp's vocabulary and tokenizer."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    NULL = -1
    pre, suf, mid = (llama_cpp.llama_vocab_fim_pre(vocab), llama_cpp.llama_vocab_fim_suf(vocab),
                     llama_cpp.llama_vocab_fim_mid(vocab))
    rep, sep = llama_cpp.llama_vocab_fim_rep(vocab), llama_cpp.llama_vocab_fim_sep(vocab)
    assert NULL not in (pre, suf, mid)

    def tok(s, special=False):
        return llm.tokenize(s.encode("utf-8"), add_bos=False, special=special) if s else []

    extra_ids = []
    if rep != NULL:
        extra_ids += [rep] + tok("myproject\n")
    for chunk in extra:
        if sep != NULL:
            extra_ids += [sep] + tok(chunk.get("filename", "tmp") + "\n")
        else:
            extra_ids += tok("\n\n--- snippet ---\n\n")
        extra_ids += tok(chunk.get("text", ""))
    if sep != NULL:
        extra_ids += [sep] + tok("filename\n")
    p, s, pr = tok(prefix), tok(suffix), tok(prompt, special=True)
    add_bos, bos = llama_cpp.llama_vocab_get_add_bos(vocab), llama_cpp.llama_vocab_bos(vocab)
    llm.close()
    n_pre = min(len(p), 3 * (n_batch // 4))
    n_suf = min(len(s), max(0, n_batch // 4 - (2 + len(pr))))
    n_extra = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra_ids))
    head = [pre] + p[len(p) - n_pre:] + pr
    if add_bos:
        head = [bos] + head
    return extra_ids[len(extra_ids) - n_extra:] + head + [suf] + s[:n_suf] + [mid]


def ours(path, *a, **kw):
    return infill.infill_prompt(load_tokenizer(GGUFFile(path)), *a, **kw)


@pytest.mark.parametrize("which", ["keyed", "bytext"])
@pytest.mark.parametrize("extra", [[], EXTRA])
def test_layout_matches_llama_cpp(vocabs, which, extra):
    path = vocabs[which]
    got = ours(path, PREFIX, SUFFIX, input_extra=extra)
    assert got == expected(path, PREFIX, SUFFIX, extra)
    tok = load_tokenizer(GGUFFile(path))
    assert got[-1] == tok.fim_ids["mid"]
    if which == "keyed":
        assert got[0] == tok.fim_ids["rep"] and got.count(tok.fim_ids["sep"]) == len(extra) + 1
    else:
        # SmolLM2's vocabulary has <reponame> (a repo token) but no file separator
        assert tok.fim_ids["sep"] is None and got[0] == tok.fim_ids["rep"]
        assert got[len(got) - got[::-1].index(tok.fim_ids["pre"]) - 2] == tok.bos_id


def test_prompt_and_budgets(vocabs):
    """Long prefix/suffix/extra are cut as llama.cpp cuts them (prefix keeps its end,
    suffix its start, extra its end) for a small batch and context."""
    path = vocabs["keyed"]
    long_p = "x = 1\n" * 400
    long_s = "y = 2\n" * 400
    kw = dict(n_ctx=1024, n_batch=256)
    got = ours(path, long_p, long_s, input_extra=EXTRA * 20, prompt="    return",
               max_tokens=100, **kw)
    want = expected(path, long_p, long_s, EXTRA * 20, prompt="    return", n_predict=100, **kw)
    assert got == want
    assert len(got) < 1024


def test_no_fim_tokens_is_invalid_request(vocabs):
    with pytest.raises(ReflexError) as e:
        ours(vocabs["none"], "a", "b")
    assert e.value.kind == "invalid_request" and "fill-in-the-middle" in e.value.message


def test_bad_input_extra(vocabs):
    with pytest.raises(ReflexError) as e:
        ours(vocabs["keyed"], "a", "b", input_extra=[{"filename": 3, "text": "x"}])
    assert e.value.kind == "invalid_request" and e.value.message.startswith("`input_extra[0]`")
