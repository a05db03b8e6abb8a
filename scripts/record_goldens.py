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
  tokens rendered, joined as bytes, decoded as UTF-8);
- llama.cpp's own noise: the same prompt under two settings that compute the same
  function in exact arithmetic: an F32 KV cache instead of F16, and the prompt fed one
  token per micro-batch (other kernels, other summation order). llama.cpp quantizes
  activations to 8 bits for quantized matmuls, so such changes move its logits by
  percents of max|logit|; `self_noise` (max|diff| / max|logit| over the vocabulary) and
  `self_noise_top` (the same over llama.cpp's 20 best tokens) are the larger of the two,
  and `alt_greedy` is the greedy continuation with the F32 KV cache (where it diverges,
  llama.cpp itself flips at that gap);
- llama.cpp in exact arithmetic: the same model with every weight dequantized to F32 (an
  "F32 twin" made here with gguf.quants, never committed) and an F32 KV cache, so no
  activation is rounded: its logits after the prompt (e<i> in the .npz), its greedy
  continuation (`exact_steps`) and `rounding_noise` (max|quantized - exact| / max|logit|,
  `rounding_noise_top` over the 20 best tokens): how far llama.cpp's 8-bit activation
  rounding alone moves it. tests/test_parity.py scales its bounds against the quantized
  goldens by these, and holds the engine to tight bounds against the exact ones.

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


def smollm2_path():
    """The default model's GGUF, wherever it is installed (reflex_ipc.modelpath)."""
    sys.path.insert(0, ROOT)
    from reflex_ipc.modelpath import resolve_model

    return resolve_model("smollm2")

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


def f32_twin(src, dst):
    """Write dst: src with every tensor dequantized to F32 (metadata copied as is)."""
    import gguf
    from gguf import GGUFValueType as VT

    r = gguf.GGUFReader(src)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    w = gguf.GGUFWriter(dst, arch)
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.alignment", "general.file_type"):
            continue
        vt = VT(f.types[0])
        if vt == VT.ARRAY:
            st = VT(f.types[1])
            val = ([bytes(f.parts[i]) for i in f.data] if st == VT.STRING
                   else [x.item() for i in f.data for x in f.parts[i]])
            w.add_key_value(key, val, vt, sub_type=st)
        elif vt == VT.STRING:
            w.add_key_value(key, bytes(f.parts[f.data[0]]), vt)
        else:
            w.add_key_value(key, f.parts[f.data[0]][0].item(), vt)
    w.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    for t in r.tensors:
        shape = [int(x) for x in reversed(t.shape)]  # numpy order
        w.add_tensor(t.name, np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape),
                                                  dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


ALT_SETTINGS = {"f32_kv": dict(type_k=0, type_v=0), "ubatch1": dict(n_batch=1, n_ubatch=1)}


def open_llama(path, **override):
    import llama_cpp

    kw = dict(n_ctx=SETTINGS["n_ctx"], n_threads=SETTINGS["n_threads"],
              n_threads_batch=SETTINGS["n_threads_batch"], n_batch=SETTINGS["n_batch"],
              n_ubatch=SETTINGS["n_ubatch"], seed=SETTINGS["seed"], flash_attn=False,
              n_gpu_layers=0, logits_all=False, verbose=False)
    kw.update(override)
    return llama_cpp.Llama(path, **kw)


def record_model(name, path, prompts, model_ref):
    import llama_cpp

    import tempfile

    m = open_llama(path)
    alts = {k: open_llama(path, **kw) for k, kw in ALT_SETTINGS.items()}
    tmp = tempfile.TemporaryDirectory()
    exact = open_llama(f32_twin(path, os.path.join(tmp.name, "twin.gguf")), type_k=0, type_v=0)
    vocab = m._model.vocab
    n_vocab = m.n_vocab()
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(vocab))

    def last_logits(llm=m):
        ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).astype(np.float32, copy=True)

    def greedy(llm, ids, n):
        llm.reset()
        llm.eval(ids)
        out = []
        for _ in range(n):
            out.append(int(np.argmax(last_logits(llm))))
            llm.eval([out[-1]])
        return out

    def greedy_steps(llm, ids, n):
        """Incremental greedy from an empty cache: per step the token, the top-2 gap,
        max|logit|, end-of-generation flag and top-5; and the logits after the prompt."""
        llm.reset()
        llm.eval(ids)
        z = first = last_logits(llm)
        steps = []
        for _ in range(n):
            order = np.argsort(-z, kind="stable")[:5]
            tok = int(order[0])
            steps.append({"token": tok, "gap": float(z[order[0]] - z[order[1]]),
                          "max_abs": float(np.abs(z).max()),
                          "eog": bool(llama_cpp.llama_vocab_is_eog(vocab, tok)),
                          "top5": [[int(t), float(z[t])] for t in order]})
            llm.eval([tok])
            z = last_logits(llm)
        return first, steps

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
        first, steps = greedy_steps(m, ids, STEPS)
        arrays[f"p{i}"] = first
        pieces = b""
        for st in steps:
            if st["eog"]:
                break
            pieces += piece(st["token"])
        exact_first, exact_steps = greedy_steps(exact, ids, STEPS)
        arrays[f"e{i}"] = exact_first
        if not np.isfinite(first).all():
            raise SystemExit(f"{name} prompt {i}: non-finite logits")
        top = np.argsort(-first)[:20]
        noise, noise_top = 0.0, 0.0
        for alt in alts.values():
            alt.reset()
            alt.eval(ids)
            d = np.abs(last_logits(alt) - first) / np.abs(first).max()
            noise, noise_top = max(noise, float(d.max())), max(noise_top, float(d[top].max()))
        alt_greedy = greedy(alts["f32_kv"], ids, STEPS)
        own = [st["token"] for st in steps]
        d = np.abs(first - exact_first) / np.abs(first).max()
        rounding, rounding_top = float(d.max()), float(d[top].max())
        alt_div = next((k for k, (a, b) in enumerate(zip(alt_greedy, own)) if a != b), None)
        exact_div = next((k for k, (a, b) in enumerate(zip(exact_steps, steps)) if a["token"] != b["token"]), None)
        records.append({
            "kind": kind, "text": text, "ids": ids, "add_bos": add_bos,
            "first_logits": f"p{i}", "first_max_abs": float(np.abs(first).max()),
            "first_std": float(first.std()),
            "greedy": [s["token"] for s in steps], "steps": steps,
            "greedy_text": pieces.decode("utf-8", errors="replace"),
            "self_noise": noise, "self_noise_top": noise_top, "alt_greedy": alt_greedy,
            "exact_logits": f"e{i}", "rounding_noise": rounding, "rounding_noise_top": rounding_top,
            "exact_steps": exact_steps,
            "alt_greedy_divergence": None if alt_div is None else {
                "step": alt_div, "gap_rel": steps[alt_div]["gap"] / steps[alt_div]["max_abs"]},
        })
        print(f"  {name} [{kind}] {len(ids)} tokens; max|logit| {np.abs(first).max():.2f}; "
              f"self-noise {noise:.4f} (top-20 {noise_top:.4f}); rounding {rounding:.4f} "
              f"(top-20 {rounding_top:.4f}); greedy of the exact twin diverges at {exact_div}, "
              f"with an F32 KV cache at {alt_div}; "
              f"greedy {pieces.decode('utf-8', errors='replace')[:40]!r}", flush=True)
    golden = {
        "model": model_ref, "sha256": sha256(path), "n_vocab": n_vocab, "add_bos": add_bos,
        "eog_ids": sorted(t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)),
        "oracle": {
            "llama_cpp_python": llama_cpp.__version__,
            "llama_cpp_commit": LLAMA_CPP_COMMIT,
            "system_info": llama_cpp.llama_print_system_info().decode().strip(),
        },
        "settings": SETTINGS, "alt_settings": ALT_SETTINGS, "exact_settings": "F32 twin, F32 KV cache",
        "steps": STEPS, "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "prompts": records,
    }
    m.close()
    for alt in alts.values():
        alt.close()
    exact.close()
    tmp.cleanup()
    os.makedirs(OUT, exist_ok=True)
    np.savez_compressed(os.path.join(OUT, f"{name}.npz"), **arrays)
    with open(os.path.join(OUT, f"{name}.json"), "w") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1)
        f.write("\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", help="golden names to record (default: all)")
    a = ap.parse_args(argv)
    jobs = [("smollm2", smollm2_path(), SMOLLM2_PROMPTS, "smollm2")]
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
