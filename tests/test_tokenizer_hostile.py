"""Issue 12 items 3 and 8: tokenizer metadata of the wrong type is one gguf_error naming the
key; huge single pieces and huge results are bounded (`too_large`), and below the bounds
the tokens do not change."""

import math
import pathlib
import random
import string

import pytest

from reflex_ipc import tokenizer as T
from reflex_ipc.errors import ReflexError
from reflex_ipc.gguffile import ArrayValue, GGUFFile
from reflex_ipc.tokenizer import load_tokenizer

DATA = pathlib.Path(__file__).resolve().parent / "data"
FILES = ["synthetic-llama.gguf", "synthetic-gemma3.gguf"]  # gpt2 BPE, SPM


@pytest.fixture(autouse=True)
def _no_cache(monkeypatch):
    monkeypatch.setenv("REFLEX_TOKENIZER_CACHE", "0")


@pytest.mark.parametrize("name", FILES)
def test_wrong_types_in_tokenizer_metadata(name):
    f = GGUFFile(str(DATA / name))
    orig = dict(f.metadata)
    arrays = [v for v in orig.values() if isinstance(v, ArrayValue)]
    keys = sorted({k for k in orig if k.startswith("tokenizer.")} |
                  {"tokenizer.ggml.scores", "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
                   "tokenizer.ggml.pre", "general.name", "tokenizer.ggml.eos_token_id"})
    values = [None, 0, -1, 2**40, True, 1.5, math.nan, math.inf, "x", ""] + arrays
    errors = 0
    for k in keys:
        for v in values:
            f.metadata = dict(orig)
            if v is None:
                f.metadata.pop(k, None)
            else:
                f.metadata[k] = v
            try:
                t = load_tokenizer(f)
                t.encode("Hello world <s> caf\u00e9 \n\n 123", add_bos=None)
                t.decode(list(range(min(t.n_vocab, 300))))
            except ReflexError as e:
                assert e.kind in ("gguf_error", "unsupported_architecture"), (k, v, e)
                if e.kind == "gguf_error":
                    assert "tokenizer." in e.message or "vocabulary" in e.message, e.message
                errors += 1
    assert errors > 10
    f.close()


def test_byte_token_with_a_lying_text():
    f = GGUFFile(str(DATA / "synthetic-gemma3.gguf"))
    tok = load_tokenizer(f)
    i = tok.find_text("<0x41>")
    assert tok.token_piece(i) == b"A"
    assert T._byte_of("<0xZZ>") == b"<0xZZ>" and T._byte_of("<0x4") == b"<0x4"


def _word(n, seed=1):
    rnd = random.Random(seed)
    return "".join(rnd.choice(string.ascii_letters) for _ in range(n))


@pytest.mark.parametrize("name", FILES)
def test_huge_single_piece_is_too_large_quickly(name):
    import time

    tok = load_tokenizer(GGUFFile(str(DATA / name)))
    cap = T.MAX_SPM_PIECE if tok.kind == "spm" else T.MAX_BPE_PIECE
    t = time.monotonic()
    with pytest.raises(ReflexError) as e:
        tok.encode("a" * (cap + 1))
    assert e.value.kind == "too_large"
    assert time.monotonic() - t < 10


def test_bpe_piece_at_the_cap_still_tokenizes(monkeypatch):
    from reflex_ipc.tokenizer import bpe

    tok = load_tokenizer(GGUFFile(str(DATA / "synthetic-llama.gguf")))
    w = _word(5000)
    want = tok.encode(w, add_bos=False)
    monkeypatch.setattr(bpe, "MAX_BPE_PIECE", 5000)
    tok._words.clear()
    assert tok.encode(w, add_bos=False) == want
    tok._words.clear()
    with pytest.raises(ReflexError, match="too_large"):
        tok.encode(w + "x", add_bos=False)
    assert tok.encode((w[:-1] + " ") * 3, add_bos=False)  # many pieces at the cap: fine


def test_detokenize_output_is_bounded(monkeypatch):
    tok = load_tokenizer(GGUFFile(str(DATA / "synthetic-llama.gguf")))
    monkeypatch.setattr(T, "MAX_DECODE_BYTES", 1000)
    long_ = max(range(tok.n_vocab), key=lambda i: len(tok.token_piece(i)))
    n = 1000 // len(tok.token_piece(long_))
    assert len(tok.decode_bytes([long_] * n)) <= 1000
    with pytest.raises(ReflexError, match="too_large"):
        tok.decode([long_] * (n + 1))


def test_result_size_limit_through_the_loop():
    import json
    import tempfile

    from reflex_ipc import server
    from reflex_ipc.testing.fake_server import fake_loader, fake_resolve, lines_of

    def serve_bytes(data, limit=1 << 20, **kw):
        srv = server.Server(loader=fake_loader(), resolve=fake_resolve, max_line_bytes=limit,
                            **kw)
        with tempfile.TemporaryFile() as fin, tempfile.TemporaryFile() as fout:
            fin.write(data)
            fin.seek(0)
            srv.serve_conn(server.FdConn(fin.fileno(), fout.fileno(), limit))
            fout.seek(0)
            return srv, [json.loads(x) for x in fout.read().split(b"\n")[:-1]]

    _, lines = serve_bytes(lines_of({"id": 1, "op": "tokenize", "text": "x" * 5000},
                                    {"id": 2, "op": "tokenize", "text": "x" * 10}),
                           max_result_bytes=4000)
    assert lines[1]["error"]["kind"] == "too_large" and lines[1]["id"] == 1
    assert lines[2]["ok"]


def test_token_type_longer_than_the_vocabulary(tmp_path):
    """Found by the long fuzz run: a one-token vocabulary with the full token_type array
    made the special-token scan look up ids past the vocabulary (IndexError)."""
    import numpy as np

    from reflex_ipc.testing import fuzz

    kvs, tensors = fuzz.tiny_model("qwen2", np.random.default_rng(0))
    kvs = [(k, t, (fuzz.STR, ["x"])) if k == "tokenizer.ggml.tokens" else (k, t, v)
           for k, t, v in kvs]
    p = fuzz.write_gguf(tmp_path / "m.gguf", kvs, tensors)
    with GGUFFile(str(p)) as f:
        tok = load_tokenizer(f)
        assert tok.n_vocab == 1
        ids = tok.encode("x<|im_end|>xy", add_bos=False)
        assert all(0 <= i < 1 for i in ids)
        assert tok.decode(ids) == "xx"
