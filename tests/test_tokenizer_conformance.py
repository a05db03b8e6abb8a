"""Tokenizer conformance with llama.cpp.

1. llama.cpp's own test vectors (the vocab-only GGUFs with .inp/.out pairs in
   llama-cpp-python 0.3.36's sdist), read as test-tokenizer-0 reads them: no
   BOS/EOS (add_special=false), special tokens not parsed.
2. The llama.cpp library itself (llama-cpp-python, the oracle) on generated
   strings: unicode, code, numbers, whitespace runs, special-token text, with
   and without BOS and special parsing; detokenization (llama_detokenize with
   and without special tokens); BOS/EOS ids and the end-of-generation set.
"""

import ctypes
import os
import random
import zlib

import pytest

from reflex_ipc.gguffile import GGUFFile
from reflex_ipc.testing.sdist import read_vectors, vocab_models_dir
from reflex_ipc.tokenizer import load_tokenizer

VECTOR_VOCABS = ["gpt-2", "llama-bpe", "qwen2", "qwen35", "deepseek-llm", "deepseek-coder",
                 "starcoder", "falcon", "command-r", "llama-spm", "phi-3", "gemma-4",
                 "mpt", "refact"]
# vocab files without vectors: the library is the only reference (aquila and
# gpt-neox have no tokenizer.ggml.pre: llama.cpp's default pre-tokenizer)
ORACLE_ONLY = ["aquila", "gpt-neox", "baichuan"]


@pytest.fixture(autouse=True)
def _smollm2_when_named(request):
    """The cases named "smollm2" need SmolLM2 (the conftest fixture skips, or fails in CI)."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.params.get("name") == "smollm2":
        request.getfixturevalue("smollm2")


def _path(name):
    if name == "smollm2":
        from reflex_ipc.modelpath import resolve_model

        return resolve_model("smollm2")
    return os.path.join(vocab_models_dir(), f"ggml-vocab-{name}.gguf")


_toks = {}


def tokenizer(name):
    if name not in _toks:
        _toks[name] = load_tokenizer(GGUFFile(_path(name)))
    return _toks[name]


@pytest.mark.parametrize("name", VECTOR_VOCABS)
def test_llama_cpp_vectors(name):
    path = _path(name)
    tok = tokenizer(name)
    cases = read_vectors(path)
    assert len(cases) > 40
    failed = []
    for text, want in cases:
        got = tok.encode(text, add_bos=False, parse_special=False)
        if got != want:
            failed.append((text, want, got))
    assert not failed, f"{len(failed)}/{len(cases)} vectors differ; first: {failed[0]!r}"


# -- against the llama.cpp library -------------------------------------------------
PIECES = [
    "Hello", " world", "'s", "'LL", "'Re", "'ve", " ", "  ", "   ", "\n", "\n\n", "\r\n", "\t",
    " \t ", "123", "4567890", "3.14", "1,000", "\u0661\u0662\u0663", "\u00b2", "\u00bd",
    "\u4e2d\u6587", "\u65e5\u672c\u8a9e\u30c6\u30ad\u30b9\u30c8", "\ud55c\uad6d\uc5b4",
    "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac", "\u0440\u0443\u0441\u0441\u043a\u0438\u0439",
    "\u00e9", "e\u0301", "\u0301", "\U0001f999", "\U0001f468\u200d\U0001f469\u200d\U0001f467",
    "\u00a0", "\u3000", "\u2003", "\x85", "\x0b", "\x1c", "\x00", "\ufeff", "\u200b", "\U0001f600",
    "\ufb01", "\u216b", "\u00b5", "\u01c5", "\u00ff", "\u0100",
    # assigned after Unicode 14 (newer than Python 3.11's unicodedata)
    "\U00031350\U00031351", "a\u0cf3", "\U00011f04\U00011f05", "\u2ffc", "x\U0001e4d0",
    "def f(x):\n    return x**2", "{\"a\": [1, 2]}", "if (a <= b) { c += 1; }", "#include <stdio.h>",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "<unk>", "<|eot_id|>",
    "<start_of_turn>", "<end_of_turn>", "<|begin_of_text|>", "<|end|>", "<|user|>", "<0x0A>",
    "\u2581", "\u0120", "...", "!!!", "?!", " ,", " .", " 's", " ' ", " 're", "$", "+=", "<=>",
    "~", "|", "`", "@", "#", "%", "&&", "__init__", "ALL CAPS", "camelCaseWord",
]


def _strings(n, seed):
    rng = random.Random(seed)
    out = ["", " ", "  ", "\n", " Hello", "Hello world", "   leading and trailing   ",
           "a" * 300, " " * 50 + "x", "\n" * 7, "9" * 40]
    for _ in range(n):
        out.append("".join(rng.choice(PIECES) for _ in range(rng.randint(1, 8))))
    return out


def _oracle(llama_cpp, name):
    return llama_cpp, llama_cpp.Llama(model_path=_path(name), vocab_only=True, verbose=False)


def _detok(llama_cpp, llm, ids, special):
    arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
    cap = 64 + 16 * len(ids)
    while True:
        buf = ctypes.create_string_buffer(cap)
        n = llama_cpp.llama_detokenize(llm._model.vocab, arr, len(ids), buf, cap, False, special)
        if n >= 0:
            return buf.raw[:n]
        cap = -n


@pytest.mark.parametrize("name,n", [("smollm2", 600)] +
                         [(v, 120) for v in VECTOR_VOCABS + ORACLE_ONLY])
def test_against_llama_cpp(name, n, llama_cpp):
    llama_cpp, llm = _oracle(llama_cpp, name)
    tok = tokenizer(name)
    vocab = llm._model.vocab
    assert tok.n_vocab == llama_cpp.llama_vocab_n_tokens(vocab)
    assert tok.bos_id == llm.token_bos()
    assert tok.eos_id == llm.token_eos()
    mism = []
    for s in _strings(n, seed=zlib.crc32(name.encode())):
        for special in (False, True):
            for bos in (False, True):
                want = llm.tokenize(s.encode("utf-8"), add_bos=bos, special=special)
                got = tok.encode(s, add_bos=None if bos else False, parse_special=special)
                if got != want:
                    mism.append(("encode", s, special, bos, want, got))
        ids = llm.tokenize(s.encode("utf-8"), add_bos=True, special=True)
        for special in (False, True):
            want = _detok(llama_cpp, llm, ids, special)
            got = tok.decode_bytes(ids, special=special)
            if got != want:
                mism.append(("decode", s, special, ids, want, got))
    assert not mism, f"{len(mism)} mismatches; first: {mism[0]!r}"


@pytest.mark.parametrize("name", ["smollm2", "qwen2", "llama-bpe", "llama-spm", "phi-3",
                                  "gemma-4", "command-r", "deepseek-llm"])
def test_eog_and_control_match_llama_cpp(name, llama_cpp):
    llama_cpp, llm = _oracle(llama_cpp, name)
    tok = tokenizer(name)
    vocab = llm._model.vocab
    want = {i for i in range(tok.n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i)}
    assert set(tok.eog_ids) == want
    want_ctl = {i for i in range(tok.n_vocab) if llama_cpp.llama_vocab_is_control(vocab, i)}
    assert {i for i in range(tok.n_vocab) if tok.is_control(i)} == want_ctl


@pytest.mark.parametrize("name", ["smollm2", "gpt-2", "llama-bpe", "llama-spm", "phi-3",
                                  "gemma-4"])
def test_decode_random_ids_matches_llama_cpp(name, llama_cpp):
    """Arbitrary id sequences (byte tokens, control tokens, BOS first or not)."""
    llama_cpp, llm = _oracle(llama_cpp, name)
    tok = tokenizer(name)
    rng = random.Random(zlib.crc32(name.encode()))
    mism = []
    for _ in range(500):
        ids = [rng.randrange(tok.n_vocab) for _ in range(rng.randint(1, 6))]
        if rng.random() < 0.3:
            ids.insert(0, tok.bos_id)
        for special in (False, True):
            want = _detok(llama_cpp, llm, ids, special)
            if tok.decode_bytes(ids, special) != want:
                mism.append((ids, special, want, tok.decode_bytes(ids, special)))
    buf = ctypes.create_string_buffer(1024)
    for i in range(0, tok.n_vocab, max(1, tok.n_vocab // 3000)):
        for special in (False, True):
            n = llama_cpp.llama_token_to_piece(llm._model.vocab, i, buf, 1024, 0, special)
            if buf.raw[:n] != tok.token_piece(i, special):
                mism.append(("piece", i, special, buf.raw[:n], tok.token_piece(i, special)))
    assert not mism, f"{len(mism)} mismatches; first: {mism[0]!r}"


@pytest.mark.parametrize("pre", ["gpt-4o", "llama4"])
def test_gpt4o_pre_tokenizer_against_llama_cpp(pre, tmp_path, llama_cpp, smollm2):
    """gpt-oss's and Llama 4's pre-tokenizer (tokenizer.ggml.pre "gpt-4o" / "llama4": tiktoken's
    o200k pattern, case-aware words) on SmolLM2's vocabulary and merges, against llama.cpp."""
    from reflex_ipc.gguffile import GGUFFile
    from reflex_ipc.testing import vocab as vg
    from reflex_ipc.tokenizer import load_tokenizer

    path = str(tmp_path / "v.gguf")
    vg.vocab_gguf(path, meta={"tokenizer.ggml.pre": pre})
    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    try:
        with GGUFFile(path) as f:
            tok = load_tokenizer(f)
        extra = ["HELLOworld it's", "CamelCaseWORDSandMore", "I'LL DON'T we'Ve", "ÉLAN Vital ÜBER alles",
                 "abc/def/\n\nghi", "x//\r\n", "12345678", "ÀÉÎõü ßẞ ǅǆ"]
        mism = []
        for s in _strings(300, seed=4) + extra:
            want = llm.tokenize(s.encode("utf-8"), add_bos=False, special=False)
            got = tok.encode(s, add_bos=False, parse_special=False)
            if got != want:
                mism.append((s, want, got))
        assert not mism, f"{len(mism)} mismatches; first: {mism[0]!r}"
    finally:
        llm.close()
