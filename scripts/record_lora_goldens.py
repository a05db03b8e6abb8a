#!/usr/bin/env python3
"""Record llama.cpp's greedy continuations with LoRA adapters (tests/goldens/lora.json).

    python3 scripts/record_lora_goldens.py

Needs llama-cpp-python 0.3.36 (CPU build); never imported by the package. For the llama
and qwen3 synthetic models (tests/data/), it writes each model's F32 twin (every tensor
dequantized: llama.cpp then rounds no activation, as reflex's numpy backend) and the
synthetic adapters of scripts/make_lora.py (ADAPTERS; written from the committed
quantized model: their bytes do not depend on which of the two they are made from), then
records llama.cpp's greedy continuation (argmax of the raw logits, one token per decode, F32
KV cache) of each prompt for each adapter combination in CASES: one adapter through
`Llama(lora_path=..., lora_scale=...)`, two through llama_set_adapters_lora. The adapters'
sha256 are recorded so that tests/test_lora.py can tell that it rebuilt the same files.
"""

import ctypes
import hashlib
import json
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from make_lora import write_lora  # noqa: E402
from record_goldens import f32_twin  # noqa: E402

MODELS = ("llama", "qwen3")
ADAPTERS = {
    "a": dict(rank=4, alpha=8.0, seed=1),
    "b": dict(rank=2, alpha=0.0, seed=2, targets=("attn_q", "attn_v", "output")),
}
CASES = [[("a", 1.0)], [("a", 0.5)], [("b", 1.0)], [("b", -0.75)], [("a", 1.0), ("b", 0.7)]]
PROMPTS = ["Once upon a time", "The capital of France is"]
STEPS = 12


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def make_adapters(base, d):
    return {k: write_lora(base, os.path.join(d, f"lora-{k}.gguf"), **kw) for k, kw in ADAPTERS.items()}


def main():
    import llama_cpp

    out = {"llama_cpp": llama_cpp.__version__, "steps": STEPS, "adapters": ADAPTERS, "models": {}}
    with tempfile.TemporaryDirectory() as d:
        for arch in MODELS:
            base = os.path.join(ROOT, "tests", "data", f"synthetic-{arch}.gguf")
            twin = f32_twin(base, os.path.join(d, f"twin-{arch}.gguf"))
            paths = make_adapters(base, d)
            rec = {"adapter_sha256": {k: sha256(p) for k, p in paths.items()}, "cases": []}
            for case in CASES:
                first, s0 = case[0]
                llm = llama_cpp.Llama(twin, n_ctx=256, n_threads=2, n_batch=256, n_ubatch=256, seed=0,
                                      n_gpu_layers=0, type_k=0, type_v=0, verbose=False,
                                      lora_path=paths[first], lora_scale=s0)
                keep = []
                if len(case) > 1:
                    ads = [llm._lora_adapter]
                    for k, _ in case[1:]:
                        a = llama_cpp.llama_adapter_lora_init(llm._model.model, paths[k].encode())
                        assert a, k
                        keep.append(a)
                        ads.append(a)
                    arr = (llama_cpp.llama_adapter_lora_p_ctypes * len(ads))(*ads)
                    scales = (ctypes.c_float * len(ads))(*[s for _, s in case])
                    assert llama_cpp.llama_set_adapters_lora(llm._ctx.ctx, arr, len(ads), scales) == 0
                n_vocab = llm.n_vocab()
                for prompt in PROMPTS:
                    ids = llm.tokenize(prompt.encode(), add_bos=True, special=True)
                    llm.reset()
                    llm.eval(ids)
                    toks = []
                    for _ in range(STEPS):
                        ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
                        z = np.ctypeslib.as_array(ptr, shape=(n_vocab,))
                        toks.append(int(np.argmax(z)))
                        llm.eval([toks[-1]])
                    rec["cases"].append({"adapters": [[k, s] for k, s in case], "prompt_ids": list(ids),
                                         "tokens": toks})
                llm.close()  # frees the adapters loaded on its model too (freeing them after it crashes)
                keep.clear()
            out["models"][arch] = rec
    path = os.path.join(ROOT, "tests", "goldens", "lora.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
