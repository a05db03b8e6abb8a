"""Tokenizer API: BOS/EOS flags, special tokens, errors, streaming decode, `reflex tokenize`."""

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reflex_ipc.cli import main as cli_main
from reflex_ipc.errors import ReflexError
from reflex_ipc.gguffile import GGUFFile
from reflex_ipc.modelpath import resolve_model
from reflex_ipc.testing.sdist import vocab_models_dir
from reflex_ipc.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def smol(smollm2):
    return load_tokenizer(GGUFFile(smollm2))


@pytest.fixture(scope="module")
def spm():
    return load_tokenizer(GGUFFile(os.path.join(vocab_models_dir(), "ggml-vocab-llama-spm.gguf")))


@pytest.fixture(scope="module")
def gemma():
    return load_tokenizer(GGUFFile(os.path.join(vocab_models_dir(), "ggml-vocab-gemma-4.gguf")))


def test_smollm2_basics(smol):
    assert smol.n_vocab == 49152
    assert smol.bos_id == 1 and smol.eos_id == 2
    assert smol.add_bos is False
    # <|endoftext|> (0) and <|im_end|> (2) end generation
    assert {0, 2} <= smol.eog_ids
    assert smol.token_text(2) == "<|im_end|>"
    assert smol.is_control(2) and not smol.is_control(19556)
    ids = smol.encode("Hello world")
    assert ids == [19556, 905]
    assert smol.decode(ids) == "Hello world"


def test_bos_flags(smol, spm):
    assert smol.encode("Hi", add_bos=True)[0] == smol.bos_id
    assert smol.encode("Hi")[0] != smol.bos_id  # the GGUF says no BOS
    assert spm.encode("Hi")[0] == spm.bos_id  # SPM default: BOS
    assert spm.encode("Hi", add_bos=False)[0] != spm.bos_id
    assert smol.encode("") == [] and spm.encode("") == [spm.bos_id]


def test_special_tokens_parsed_or_not(smol):
    text = "<|im_start|>user\nHi<|im_end|>"
    ids = smol.encode(text)
    assert ids[0] == 1 and ids[-1] == 2
    plain = smol.encode(text, parse_special=False)
    assert 1 not in plain and 2 not in plain
    assert smol.decode(plain) == text
    # control tokens render only when asked
    assert smol.decode(ids) == "user\nHi"
    assert smol.decode(ids, special=True) == text


def test_spm_leading_space_and_bytes(spm):
    ids = spm.encode("Hello \U0001f999")
    assert spm.token_bytes(ids[1]) == b" Hello"
    # llama_detokenize drops the leading space of the first token only: after a
    # BOS it stays; without one it goes
    assert spm.decode(ids) == " Hello \U0001f999"
    assert spm.decode(ids[1:]) == "Hello \U0001f999"
    # streaming is piece concatenation (continuations keep their leading space)
    d = spm.stream_decoder()
    assert "".join(d.feed(i) for i in ids[1:]) + d.flush() == " Hello \U0001f999"
    # the llama emoji has no token: byte fallback, one <0xNN> token per byte
    tail = ids[-4:]
    assert [spm.token_text(i) for i in tail] == ["<0xF0>", "<0x9F>", "<0xA6>", "<0x99>"]


def test_gemma4_eog_and_bos(gemma):
    assert gemma.add_bos is True
    assert gemma.eos_id in gemma.eog_ids
    assert gemma.find_text("<turn|>") in gemma.eog_ids


def test_errors(smol):
    with pytest.raises(ReflexError) as e:
        smol.token_bytes(smol.n_vocab)
    assert e.value.kind == "invalid_request"
    with pytest.raises(ReflexError):
        smol.decode([-1])
    with pytest.raises(ReflexError) as e:
        smol.encode(b"bytes")
    assert e.value.kind == "invalid_request"


def test_unsupported_vocab():
    with pytest.raises(ReflexError) as e:
        load_tokenizer(GGUFFile(os.path.join(vocab_models_dir(), "ggml-vocab-bert-bge.gguf")))
    assert e.value.kind == "unsupported_architecture"


def test_pretokenizer_classes():
    from reflex_ipc.tokenizer import pretok

    gpt2 = pretok.regexes("gpt2")
    assert pretok.split("Hello world's 12 \u00e9t\u00e9!!  \n", gpt2) == \
        ["Hello", " world", "'s", " 12", " \u00e9t\u00e9", "!!", "  \n"]
    # U+31350 (CJK Ext. H, Unicode 15) is a letter for llama.cpp although
    # Python 3.11's unicodedata does not know it yet
    assert pretok.split("ab\U00031350cd", gpt2) == ["ab\U00031350cd"]
    # U+3000 is whitespace, U+00B2 a number
    assert pretok.split("a\u3000\u3000b \u00b2", gpt2) == ["a", "\u3000", "\u3000", "b", " \u00b2"]
    assert pretok.split("12345", pretok.regexes("llama3")) == ["123", "45"]
    assert pretok.split("12345", pretok.regexes("qwen2")) == list("12345")


# -- streaming ---------------------------------------------------------------------
def test_stream_holds_split_characters(smol):
    ids = smol.encode("\U0001f999")  # split over three byte-level tokens: F0 9F | A6 | 99
    assert len(ids) == 3
    d = smol.stream_decoder()
    assert [d.feed(i) for i in ids] == ["", "", "\U0001f999"]
    assert d.flush() == ""
    ids = smol.encode("x\U0001f999\u00e9!")
    d = smol.stream_decoder()
    outs = [d.feed(i) for i in ids]
    assert "\ufffd" not in "".join(outs)
    assert "".join(outs) + d.flush() == "x\U0001f999\u00e9!"


def test_stream_spm_byte_tokens(spm):
    ids = spm.encode("a\U0001f999b\u00e9", add_bos=False)
    d = spm.stream_decoder()
    outs = [d.feed(i) for i in ids]
    for o in outs:
        assert "\ufffd" not in o
    assert "".join(outs) + d.flush() == " a\U0001f999b\u00e9"


def test_stream_invalid_bytes_flush_as_replacement(smol):
    lone = smol.encode("\U0001f999")[1:]  # continuation bytes without their lead byte
    d = smol.stream_decoder()
    text = "".join(d.feed(i) for i in lone) + d.flush()
    assert text and set(text) == {"\ufffd"}
    start = smol.encode("\U0001f999")[:1]  # a lead byte never completed
    d = smol.stream_decoder()
    assert d.feed(start[0]) == ""
    assert d.flush() == "\ufffd"


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=40))
def test_stream_equals_decode(smol, text):
    ids = smol.encode(text, parse_special=False)
    d = smol.stream_decoder()
    parts = [d.feed(i) for i in ids]
    full = smol.decode(ids)
    assert "".join(parts) + d.flush() == full
    assert all("\ufffd" not in p for p in parts) or "\ufffd" in full


# characters whose UTF-8 bytes all have tokens in SmolLM2 (llama.cpp silently
# drops bytes without one, e.g. C0 controls and the F1..F4 lead bytes)
_SPELLABLE = st.characters(max_codepoint=0x1FFFF, blacklist_categories=("Cc", "Cs", "Co", "Cn"))


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=_SPELLABLE, max_size=40))
def test_round_trip(smol, text):
    assert smol.decode(smol.encode(text, parse_special=False)) == text


# -- reflex tokenize -----------------------------------------------------------------
def test_cli_json(smol, capsys):
    rc = cli_main(["tokenize", "--json", "Hello world", "<|im_end|>x"])
    assert rc == 0
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(x) for x in lines] == [
        {"text": "Hello world", "token_ids": smol.encode("Hello world")},
        {"text": "<|im_end|>x", "token_ids": [2] + smol.encode("x")},
    ]


def test_cli_flags(smol, capsys):
    assert cli_main(["tokenize", "--json", "--bos", "--no-special", "<|im_end|>"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["token_ids"] == [smol.bos_id] + smol.encode("<|im_end|>", parse_special=False)


def test_cli_listing(smol, capsys):
    assert cli_main(["tokenize", "Hello \U0001f999"]) == 0
    out = capsys.readouterr().out
    assert out.startswith('"Hello \U0001f999": ')
    for i in smol.encode("Hello \U0001f999"):
        assert f" {i} " in out
    assert "bytes " in out  # a piece that is not valid UTF-8 on its own


def test_cli_missing_model(capsys):
    assert cli_main(["tokenize", "--model", "/nonexistent.gguf", "x"]) == 2  # an input error (README, exit codes)
    assert "model_not_found" in capsys.readouterr().err


def test_load_path_imports_no_gguf(smollm2):
    code = ("import sys\nfrom reflex_ipc.gguffile import GGUFFile\n"
            "from reflex_ipc.modelpath import resolve_model\n"
            "from reflex_ipc.tokenizer import load_tokenizer\n"
            "t = load_tokenizer(GGUFFile(resolve_model(None)))\nt.encode('hi <|im_end|>')\n"
            "t.decode([1, 2, 3])\n"
            "bad = [m for m in ('gguf', 'sentencepiece', 'torch', 'transformers') if m in sys.modules]\n"
            "print(bad)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- disk cache of the lookup index ----------------------------------------------------
def test_index_cache(tmp_path, monkeypatch, smollm2):
    from reflex_ipc.tokenizer import vocab

    monkeypatch.setenv("REFLEX_CACHE", str(tmp_path))
    monkeypatch.setenv("REFLEX_TOKENIZER_CACHE", "1")
    path = resolve_model("smollm2")
    text = "Caching <|im_start|>the index: \u00e9\U0001f999 12345"
    want = load_tokenizer(GGUFFile(path)).encode(text)
    files = sorted((tmp_path / "tokenizer").iterdir())
    assert [p.name.split(".")[-3] for p in files] == ["merges", "tokens"]

    def no_build(self, mm):
        raise AssertionError("index rebuilt although cached")

    with monkeypatch.context() as m:
        m.setattr(vocab.StrIndex, "_build", no_build)
        assert load_tokenizer(GGUFFile(path)).encode(text) == want
    # a damaged (short) cache file is ignored and rewritten
    files[0].write_bytes(files[0].read_bytes()[:-8])
    assert load_tokenizer(GGUFFile(path)).encode(text) == want
    assert files[0].stat().st_size % 8 == 0 and files[0].stat().st_size > 8 * 40000


def test_index_cache_off(tmp_path, monkeypatch, smollm2):
    monkeypatch.setenv("REFLEX_CACHE", str(tmp_path))
    monkeypatch.setenv("REFLEX_TOKENIZER_CACHE", "0")
    tok = load_tokenizer(GGUFFile(resolve_model("smollm2")))
    assert tok.encode("Hello world") == [19556, 905]
    assert not (tmp_path / "tokenizer").exists()
