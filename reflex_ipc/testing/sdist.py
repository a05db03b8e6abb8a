"""llama.cpp's tokenizer test vectors (and ggml-common.h), from the llama-cpp-python 0.3.36 sdist.

`vocab_models_dir()` returns a directory holding the sdist's
vendor/llama.cpp/models/ggml-vocab-* files (vocab-only GGUFs and their
.inp/.out test pairs). The sdist is fetched once with pip into the cache
($REFLEX_CACHE, else ~/.cache/reflex-ipc) and only those files are extracted.
A failed download raises: the conformance tests must run, never skip.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

VERSION = "0.3.36"
_MEMBER_DIR = "vendor/llama.cpp/models/"


def cache_dir() -> str:
    from reflex_ipc.modelpath import cache_dir as reflex_cache

    d = reflex_cache()
    os.makedirs(d, exist_ok=True)
    return d


def _sdist_path(cache: str) -> str:
    dl = os.path.join(cache, "sdist")
    os.makedirs(dl, exist_ok=True)
    found = glob.glob(os.path.join(dl, f"llama_cpp_python-{VERSION}.tar.gz"))
    if found:
        return found[0]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           f"llama-cpp-python=={VERSION}", "-d", dl]
    p = subprocess.run(cmd, capture_output=True, text=True)
    found = glob.glob(os.path.join(dl, f"llama_cpp_python-{VERSION}.tar.gz"))
    if p.returncode != 0 or not found:
        raise RuntimeError(f"could not download the llama-cpp-python {VERSION} sdist "
                           f"({' '.join(cmd)}):\n{p.stdout}\n{p.stderr}")
    return found[0]


def vocab_models_dir() -> str:
    """The directory of ggml-vocab-* files (downloaded and extracted on first use)."""
    cache = cache_dir()
    out = os.path.join(cache, f"llama-cpp-python-{VERSION}-vocab")
    if os.path.isfile(os.path.join(out, ".complete")):
        return out
    import fcntl

    with open(os.path.join(cache, ".sdist.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one downloader at a time (parallel test runs)
        if not os.path.isfile(os.path.join(out, ".complete")):
            _extract(cache, out)
    return out


def _extract(cache: str, out: str) -> None:
    tar_path = _sdist_path(cache)
    tmp = tempfile.mkdtemp(prefix=".vocab-", dir=cache)
    try:
        n = 0
        with tarfile.open(tar_path, "r:gz") as tar:
            for m in tar:
                parts = m.name.split("/", 1)
                if len(parts) != 2 or not parts[1].startswith(_MEMBER_DIR) or not m.isfile():
                    continue
                base = parts[1][len(_MEMBER_DIR):]
                if "/" in base or not base.startswith("ggml-vocab-"):
                    continue
                src = tar.extractfile(m)
                with open(os.path.join(tmp, base), "wb") as fh:
                    shutil.copyfileobj(src, fh)
                n += 1
        if n == 0:
            raise RuntimeError(f"{tar_path} holds no {_MEMBER_DIR}ggml-vocab-* files")
        open(os.path.join(tmp, ".complete"), "w").close()
        if os.path.isdir(out):  # an interrupted earlier extraction
            shutil.rmtree(out)
        os.rename(tmp, out)
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)


def ggml_common_h() -> str:
    """The text of the sdist's vendor/llama.cpp/ggml/src/ggml-common.h (ggml's block layouts and
    the IQ grids; scripts/fixtures/make_quant_tables.py reads its tables)."""
    want = "vendor/llama.cpp/ggml/src/ggml-common.h"
    with tarfile.open(_sdist_path(cache_dir()), "r:gz") as tar:
        for m in tar:
            parts = m.name.split("/", 1)
            if len(parts) == 2 and parts[1] == want and m.isfile():
                return tar.extractfile(m).read().decode("utf-8")
    raise RuntimeError(f"the llama-cpp-python {VERSION} sdist holds no {want}")


def read_vectors(gguf_path: str) -> list[tuple[str, list[int]]]:
    """The (text, ids) pairs of `gguf_path`.inp/.out, read as test-tokenizer-0 reads them."""
    with open(gguf_path + ".inp", "rb") as fh:
        raw = fh.read().decode("utf-8")
    with open(gguf_path + ".out", "rb") as fh:
        lines = fh.read().decode("utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # getline yields no line after the final newline
    texts = raw.split("\n__ggml_vocab_test__\n")
    if texts and texts[-1] == "":
        texts.pop()  # the file ends with a separator: no test after it
    if len(texts) != len(lines):
        raise ValueError(f"{gguf_path}: {len(texts)} inputs but {len(lines)} outputs")
    return [(t, [int(x) for x in line.strip().split()]) for t, line in zip(texts, lines)]


if __name__ == "__main__":
    print(vocab_models_dir())
