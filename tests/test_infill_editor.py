"""Infill for editors (issue 29): llama.cpp server's `n_indent` and `t_max_predict_ms`
honoured (reflex_ipc/generation/stops.py; the protocol's infill fields, the HTTP /infill
body), the prefix cut at a block boundary, and a mid-file edit that reads the saved state
of the unchanged text before it from the prefix store."""

import os
import time

import msgspec
import numpy as np
import pytest

from reflex_ipc import infill, prepare
from reflex_ipc.api import Model
from reflex_ipc.engine import load_runner
from reflex_ipc.generation.stops import StopMatcher
from reflex_ipc.ops import infill as infill_op
from reflex_ipc.runtime import prefixstore
from reflex_ipc.testing import vocab as vg

pytestmark = pytest.mark.usefixtures("smollm2")


def llama_cpp_indent(text, n_indent):
    """llama.cpp's rule (server-context.cpp, process_token) applied to a whole text: the
    first line after a newline whose indentation is below n_indent ends it, cut before
    that line's first other character. Returns (text, stopped)."""
    pos = text.find("\n")
    while pos >= 0:
        start = p = pos + 1
        while p < len(text) and text[p] in " \t":
            p += 1
        if p < len(text) and p - start < n_indent:
            return text[:p], True
        pos = text.find("\n", start)
    return text, False


@pytest.mark.parametrize("text", ["def f():\n    return 1\nprint(2)", "a\n\n  b", "x\n    y\n    z\n",
                                  "if x:\n\tpass\n  done", "no newline at all", "\n   \n    ok\n x"])
@pytest.mark.parametrize("n_indent", [1, 2, 4])
def test_n_indent_as_llama_cpp(text, n_indent):
    """Pushed one character at a time (any split gives the same), the released text is
    llama.cpp's cut, and nothing past the cut is ever released."""
    for step in (1, 3):
        st = StopMatcher([], n_indent=n_indent)
        out, stopped = "", False
        for i in range(0, len(text), step):
            t, stopped = st.push(text[i:i + step])
            out += t
            if stopped:
                break
        if not stopped:
            out += st.rest()
        want, want_stop = llama_cpp_indent(text, n_indent)
        assert (out, stopped) == (want, want_stop)
        assert st.reason == ("length" if stopped else None)


class Script:
    """A constraint that forces the given token ids, one per step."""

    def __init__(self, ids, n_vocab):
        self.ids, self.n, self.i = list(ids), n_vocab, 0

    def allowed(self):
        m = np.zeros(self.n, bool)
        m[self.ids[min(self.i, len(self.ids) - 1)]] = True
        return m

    def commit(self, tid):
        self.i += 1

    def done(self):
        return self.i >= len(self.ids)


@pytest.fixture(scope="module")
def fim_model(tmp_path_factory):
    from reflex_ipc.testing.synthetic import parity_model

    d = tmp_path_factory.mktemp("fimmodel")
    vocab = str(d / "vocab.gguf")
    vg.vocab_gguf(vocab, vg.FIM_QWEN)
    return parity_model("llama", str(d / "fim-llama.gguf"), vocab_paths={"gpt2": vocab})


def test_limits_end_generation(fim_model):
    r = load_runner(fim_model, device="cpu", n_ctx=512)
    try:
        ids = r.tok.encode("    a = 1\n    b = 2\nc = 3\n    d = 4\n", add_bos=False)
        free = r.generate("x", max_tokens=len(ids), constraint=Script(ids, r.n_vocab))
        assert free["text"] == "    a = 1\n    b = 2\nc = 3\n    d = 4\n"
        out = r.generate("x", max_tokens=len(ids), constraint=Script(ids, r.n_vocab), n_indent=4)
        assert out["text"] == "    a = 1\n    b = 2\n" and out["finish_reason"] == "length"
        streamed = []
        r.generate("x", max_tokens=len(ids), constraint=Script(ids, r.n_vocab), n_indent=4,
                   on_token=lambda tid, text, **_: streamed.append(text))
        assert "".join(streamed) == out["text"]
        # t_max_predict_ms: after the limit, the next token holding a newline ends it
        out = r.generate("x", max_tokens=len(ids), constraint=Script(ids, r.n_vocab), t_max_predict_ms=1,
                         on_logits=lambda step, row: time.sleep(0.002))
        # (the token holding the newline is kept whole, as llama.cpp keeps it)
        assert out["text"].count("\n") == 1 and out["text"].startswith("    a = 1\n")
        assert free["text"].startswith(out["text"]) and out["finish_reason"] == "length"
        out = r.generate("x", max_tokens=len(ids), constraint=Script(ids, r.n_vocab), t_max_predict_ms=60000)
        assert out["text"] == free["text"]
    finally:
        r.close()


def test_infill_op_fields(fim_model):
    req = msgspec.convert({"prefix": "def f(x):\n", "suffix": "\n", "max_tokens": 6, "n_indent": 4,
                           "t_max_predict_ms": 5000}, infill_op.Request)
    assert req.n_indent == 4 and req.t_max_predict_ms == 5000
    r = load_runner(fim_model, device="cpu", n_ctx=512)
    try:
        out = Model(r).infill(req)
        assert llama_cpp_indent(out["text"], 4)[0] == out["text"]
    finally:
        r.close()
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"prefix": "a", "n_indent": -1}, infill_op.Request)


def test_http_infill_body_passes_the_limits():
    from reflex_ipc.front import api

    req = api.decode(b'{"input_prefix": "a", "input_suffix": "b", "n_indent": 2, "t_max_predict_ms": 300, '
                     b'"cache_prompt": false}', api.InfillRequest)
    op, p = api.infill_params(req)
    assert op == "infill" and p["n_indent"] == 2 and p["t_max_predict_ms"] == 300 and p["cache_prompt"] is False
    op, p = api.infill_params(api.decode(b'{"input_prefix": "a", "t_max_predict_ms": -1}', api.InfillRequest))
    assert "t_max_predict_ms" not in p


def test_prefix_cut_at_a_block_boundary(fim_model):
    r = load_runner(fim_model, device="cpu", n_ctx=512)
    try:
        tok = r.tok
        prefix = "".join(f"v{i} = {i}\n" for i in range(40))
        p_ids = tok.encode(prefix, add_bos=False, parse_special=False)
        kw = dict(n_batch=64, n_ctx=512, max_tokens=8)
        exact = infill.infill_prompt(tok, prefix, "s", **kw)
        pre = exact.index(tok.fim_ids["pre"])
        assert exact[pre + 1:exact.index(tok.fim_ids["suf"])] == p_ids[-48:]  # llama.cpp's cut
        cut = -(-(len(p_ids) - 48) // 16) * 16
        al = infill.infill_prompt(tok, prefix, "s", align=16, **kw)
        assert al[pre + 1:al.index(tok.fim_ids["suf"])] == p_ids[cut:]
        # typing at the end of the prefix keeps the cut (and all before it) in place
        more = infill.infill_prompt(tok, prefix + "v4", "s", align=16, **kw)
        assert more[:len(al) - 3] == al[:len(al) - 3] or more[pre + 1:pre + 1 + 30] == al[pre + 1:pre + 1 + 30]
        # a short prefix is whole either way
        assert infill.infill_prompt(tok, "a = 1\n", "s", align=16, **kw) == infill.infill_prompt(tok, "a = 1\n", "s", **kw)
    finally:
        r.close()


def test_mid_file_edit_reuses_the_unchanged_prefix(fim_model, tmp_path, monkeypatch):
    monkeypatch.setenv("REFLEX_PREFIX_CACHE_DIR", str(tmp_path / "store"))
    monkeypatch.setenv("REFLEX_PREFIX_CACHE_BLOCK", "16")
    prefixstore.PENDING.clear()
    head = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(8))
    extra = [{"filename": "util.py", "text": "def helper(a, b):\n    return a * b\n"}]
    before = {"prefix": head + "def g(x):\n    return ", "suffix": "\n\nprint(g(1))\n", "input_extra": extra,
              "max_tokens": 6}
    after = {**before, "prefix": head + "def g(x, y):\n    z = y\n    return ", "suffix": "\n\nprint(g(1, 2))\n"}

    def run(fields, cache=True):
        req = msgspec.convert({**fields, "prefix_cache": cache}, infill_op.Request)
        r = load_runner(fim_model, device="cpu", n_ctx=512)
        try:
            out = Model(r).infill(req)
            ids = prepare.infill_ids(r, req.prefix, req.suffix, prompt=req.prompt, max_tokens=req.max_tokens,
                                     input_extra=[{"filename": c.filename, "text": c.text} for c in req.input_extra],
                                     prefix_cache=req.prefix_cache)
            prefixstore.flush()
            return out, ids
        finally:
            r.close()

    run(before)  # the editor's first completion: its prompt's state is saved
    ref, ids_ref = run(after, cache=False)
    got, ids = run(after)  # the edit, in a fresh process
    assert ids == ids_ref and got["token_ids"] == ref["token_ids"]
    _, ids_before = run(before, cache=False)
    common = 0
    while ids[common] == ids_before[common]:
        common += 1
    assert got["timings"]["prefix_cache_tokens"] == common // 16 * 16 >= 64
    assert got["cached_tokens"] == got["timings"]["prefix_cache_tokens"]
    prefixstore.PENDING.clear()
