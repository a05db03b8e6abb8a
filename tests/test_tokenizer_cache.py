"""Issue 12 item 4: the tokenizer's disk cache never changes an answer.

A corrupted, truncated, swapped or stale cache entry, and a model rewritten in place
with the same size and mtime, all give the tokens of the file as it is now.
"""

import os
import shutil
import pathlib

import pytest

from reflex_ipc.gguffile import GGUFFile
from reflex_ipc.tokenizer import load_tokenizer

DATA = pathlib.Path(__file__).resolve().parent / "data"
TEXT = "Hello world, this is a test of the tokenizer cache: caf\u00e9 \u4f60\u597d 12345."


def _encode(path):
    with GGUFFile(str(path)) as f:
        return load_tokenizer(f).encode(TEXT, add_bos=False)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("REFLEX_CACHE", str(d))
    monkeypatch.setenv("REFLEX_TOKENIZER_CACHE", "1")
    return d / "tokenizer"


def _uncached(path, monkeypatch):
    monkeypatch.setenv("REFLEX_TOKENIZER_CACHE", "0")
    try:
        return _encode(path)
    finally:
        monkeypatch.setenv("REFLEX_TOKENIZER_CACHE", "1")


@pytest.mark.parametrize("damage", ["flip", "zeros", "truncate", "empty", "extend", "header"])
def test_corrupted_cache_is_rebuilt(tmp_path, cache, monkeypatch, damage):
    model = tmp_path / "m.gguf"
    shutil.copy(DATA / "synthetic-llama.gguf", model)
    want = _uncached(model, monkeypatch)
    assert _encode(model) == want  # writes the entries
    files = sorted(cache.iterdir())
    assert len(files) == 2  # tokens and merges
    for p in files:
        data = bytearray(p.read_bytes())
        if damage == "flip":
            data[len(data) // 2] ^= 0x40
        elif damage == "zeros":  # right size, the old format would have taken it
            data[32:] = bytes(len(data) - 32)
        elif damage == "truncate":
            data = data[:len(data) - 8]
        elif damage == "empty":
            data = bytearray()
        elif damage == "extend":
            data += b"\0" * 8
        else:
            data[8] ^= 1  # the count
        p.write_bytes(bytes(data))
    assert _encode(model) == want
    assert _encode(model) == want  # and the rewritten entries are good


def test_entries_swapped_between_arrays(tmp_path, cache, monkeypatch):
    model = tmp_path / "m.gguf"
    shutil.copy(DATA / "synthetic-qwen2.gguf", model)
    want = _uncached(model, monkeypatch)
    _encode(model)
    a, b = sorted(cache.iterdir())
    da, db = a.read_bytes(), b.read_bytes()
    a.write_bytes(db)
    b.write_bytes(da)
    assert _encode(model) == want


def test_model_rewritten_with_the_same_size_and_mtime(tmp_path, cache, monkeypatch):
    """Same path, inode, size and mtime, another vocabulary: the source CRC catches it."""
    model = tmp_path / "m.gguf"
    shutil.copy(DATA / "synthetic-qwen2.gguf", model)
    old = _encode(model)
    st = model.stat()
    data = bytearray(model.read_bytes())
    with GGUFFile(str(model)) as f:
        toks = f.metadata["tokenizer.ggml.tokens"]
        # swap the text of a token the sentence uses with another token's of its length
        i = next(i for i in old if toks.lengths[i] >= 3)
        j = next(j for j in range(1000, toks.count)
                 if toks.lengths[j] == toks.lengths[i] and j not in old)
        s, n = toks.starts[i], toks.lengths[i]
        t, m = toks.starts[j], toks.lengths[j]
    a, b = bytes(data[s:s + n]), bytes(data[t:t + m])
    assert n == m and a != b
    data[s:s + n], data[t:t + m] = b, a
    with open(model, "r+b") as fh:  # in place: same inode
        fh.write(data)
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))
    st2 = model.stat()
    assert (st2.st_ino, st2.st_size, st2.st_mtime_ns) == (st.st_ino, st.st_size, st.st_mtime_ns)
    want = _uncached(model, monkeypatch)
    assert want != old
    assert _encode(model) == want


def test_cache_hit_gives_the_same_tokens(tmp_path, cache, monkeypatch):
    model = tmp_path / "m.gguf"
    shutil.copy(DATA / "synthetic-gemma3.gguf", model)
    want = _uncached(model, monkeypatch)
    assert _encode(model) == want
    mtimes = [p.stat().st_mtime_ns for p in sorted(cache.iterdir())]
    assert _encode(model) == want
    assert [p.stat().st_mtime_ns for p in sorted(cache.iterdir())] == mtimes  # read, not rebuilt
