"""The IQ formats, TQ1_0, TQ2_0 and MXFP4 on the CUDA backend (imported by scripts/gpu/gpu-check:
its `iq` section; `scripts/gpu/gpu-check --only iq` runs just this).

- ops: reflex_ipc.testing.opchecks.check_iq (every matmul path of every format against float64
  products with quants.py's dequantized weights: one token, 2..63 tokens, the tensor-core tiles,
  q/k/v, gate/up, the RMSNorm-folded ops, get_rows, head_matmul, moe (per pair, and from 32
  tokens the grouped tensor-core GEMMs, which each such call must take), a captured graph, the
  MLA prefill with IQ4_NL / MXFP4 attn_k_b and IQ attn_v_b on the decompressed flash path).
- models: a small llama model per format (synthetic.tiny_gguf, every matrix and the tied
  embedding in that format, as tests/test_iq_models.py writes them) and qwen3moe files with
  MXFP4 and IQ2_XXS experts, through gpu_check_models.compare_backend: CUDA against numpy
  (first logits within 1e-2 of max|logit|, greedy 32 tokens identical but at near-ties, an
  80-token prompt on the tensor-core matmuls, decode through captured graphs, and the weights
  on the GPU no larger than in the file: no dequantized copy).
- module: the IQ kernels' fatbin is loaded only once a model has such weights (a fresh process
  running a Q8_0 model leaves it unloaded; loading an IQ weight loads it, timed).
"""

import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FORMATS = ["IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0",
           "MXFP4"]
CONFIG = dict(arch="llama", n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=512)
IQ_FATBIN = "reflex_kernels_iq.fatbin"

_PROBE = r"""
import json, sys
from reflex_ipc.engine import load_runner
r = load_runner(sys.argv[1], device="cuda", n_ctx=64)
r.generate([1, 2, 3], max_tokens=2, temperature=0.0)
print(json.dumps({"modules": sorted(r.ops.rt._modules)}))
"""


def module_checks(syn, tok):
    from reflex_ipc.backends.cuda_ops import CudaOps
    from reflex_ipc.testing.synthetic import tiny_gguf

    q8 = os.path.join(syn, "iq-probe-q8_0.gguf")
    tiny_gguf(q8, tokenizer=tok, qtype="Q8_0", **CONFIG)
    p = subprocess.run([sys.executable, "-c", _PROBE, q8], capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
    try:
        mods = json.loads(p.stdout.strip().splitlines()[-1])["modules"]
    except (ValueError, IndexError, KeyError):
        return {"ok": False, "error": p.stderr[-2000:]}
    res = {"q8_0_model_loads_iq_fatbin": IQ_FATBIN in mods}
    ops = CudaOps()
    had = IQ_FATBIN in ops.rt._modules
    path = os.path.join(syn, "iq-probe-iq2_xxs.gguf")
    tiny_gguf(path, tokenizer=tok, qtype="IQ2_XXS", **CONFIG)
    from reflex_ipc.gguffile import GGUFFile

    with GGUFFile(path) as f:
        ops.load_weight(f, "blk.0.attn_q.weight")
    res.update(iq_fatbin_loaded_by_an_iq_weight=IQ_FATBIN in ops.rt._modules, loaded_before=had,
               module_load_ms=ops.rt.timings.get(f"module_load_ms[{IQ_FATBIN}]"),
               main_module_load_ms=ops.rt.timings.get("module_load_ms"))
    res["ok"] = not res["q8_0_model_loads_iq_fatbin"] and res["iq_fatbin_loaded_by_an_iq_weight"]
    return res


def run():
    import gpu_check_models
    from reflex_ipc import settings
    from reflex_ipc.backends.cuda_ops import CudaOps
    from reflex_ipc.testing import opchecks
    from reflex_ipc.testing.synthetic import example_gguf, tiny_gguf

    syn = settings.get().synth_dir
    os.makedirs(syn, exist_ok=True)
    tok = settings.get().synth_tokenizer or os.path.join(ROOT, "tests", "data", "synthetic-llama.gguf")
    rep = {}
    try:
        rep["module"] = module_checks(syn, tok)
    except Exception as e:
        import traceback

        rep["module"] = {"ok": False, "error": "".join(traceback.format_exception(e))[-2500:]}
    ops = CudaOps()
    rows = opchecks.check_iq(ops, np.random.default_rng(31))
    rep["ops"] = {"ok": all(r["ok"] for r in rows), "n": len(rows), "failed": [r for r in rows if not r["ok"]],
                  "rows": rows}
    paths = []
    for fmt in FORMATS:
        p = os.path.join(syn, f"iq-{fmt.lower()}.gguf")
        tiny_gguf(p, tokenizer=tok, qtype=fmt, seed=31, **CONFIG)
        paths.append(p)
    for qtype, keys in (("MXFP4", {"embedding_length": 64, "expert_feed_forward_length": 64, "expert_count": 16,
                                   "expert_used_count": 4}),
                        ("IQ2_XXS", {"embedding_length": 256, "expert_feed_forward_length": 256, "expert_count": 8,
                                     "expert_used_count": 2})):
        paths.append(example_gguf("qwen3moe", os.path.join(syn, f"iq-qwen3moe-{qtype.lower()}.gguf"), tokenizer=tok,
                                  keys=keys, qtype=qtype, seed=5))
    models = []
    for p in paths:
        try:
            models.append(gpu_check_models.compare_backend(p, ops))
        except Exception as e:
            import traceback

            models.append({"file": os.path.basename(p), "ok": False,
                           "error": "".join(traceback.format_exception(e))[-2500:]})
    rep["models"] = models
    rep["ok"] = rep["module"].get("ok", False) and rep["ops"]["ok"] and all(m["ok"] for m in models)
    return rep
