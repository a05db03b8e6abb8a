#!/usr/bin/env python3
"""Write a `reflex check` reference from llama.cpp (llama-cpp-python), for users who have it.

    python3 scripts/llama_cpp_reference.py --model M.gguf [--max-tokens N] [--n-ctx N] --out REF.json PROMPT...

Greedy generation by llama.cpp on the same GGUF, in the reference format of
protocol/CHECK.md (backend "llama.cpp"): each step's chosen token, its K largest
logits, max|logit| and top-2 gap. The prompt is tokenized as reflex tokenizes it
(the GGUF's add_bos flag, special tokens parsed), and the model identity is
reflex's digest of the file, so `reflex check --reference REF.json` accepts it.
Run it with an F32 copy of the model for a comparison without llama.cpp's
activation rounding (quantized llama.cpp moves its own logits by 2-4%).
"""

import argparse
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--out", required=True)
    ap.add_argument("prompt", nargs="+")
    a = ap.parse_args()
    import llama_cpp

    from reflex_ipc.commands.check import FORMAT, FORMAT_VERSION, TOP_K
    from reflex_ipc.gguffile import GGUFFile
    from reflex_ipc.tokenizer import load_tokenizer

    f = GGUFFile(a.model)
    tok = load_tokenizer(f)
    llm = llama_cpp.Llama(a.model, n_ctx=a.n_ctx, n_batch=512, logits_all=True, verbose=False)
    prompts = []
    for text in a.prompt:
        ids = tok.encode(text)
        llm.reset()
        llm.eval(ids)
        steps, out = [], []
        for _ in range(a.max_tokens):
            row = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float32)[:tok.n_vocab]
            top = np.argsort(-row, kind="stable")[:TOP_K]
            t = int(top[0])
            steps.append({"top_ids": [int(i) for i in top], "top_logits": [float(row[i]) for i in top],
                          "max_abs_logit": float(np.abs(row).max()), "gap": float(row[top[0]] - row[top[1]]),
                          "token_id": t, "text": tok.token_bytes(t).decode("utf-8", "replace")})
            if t in tok.eog_ids:
                break
            out.append(t)
            llm.eval([t])
        prompts.append({"prompt": text, "prompt_tokens": len(ids), "token_ids": out, "text": tok.decode(out),
                        "finish_reason": "stop" if len(out) < len(steps) else "length",
                        "first_logits_digest": None, "steps": steps})
    ref = {"format": FORMAT, "version": FORMAT_VERSION, "engine": f"llama-cpp-python {llama_cpp.__version__}",
           "model": {"identity": f.identity(), "name": f.get("general.name"), "architecture": f.architecture,
                     "path": a.model},
           "backend": "llama.cpp", "device": "cpu", "max_tokens": a.max_tokens, "top_k": TOP_K, "prompts": prompts}
    with open(a.out, "w") as fh:
        json.dump(ref, fh, ensure_ascii=False, indent=1)
        fh.write("\n")
    print(f"wrote {a.out}: {len(prompts)} prompts")


if __name__ == "__main__":
    sys.exit(main())
