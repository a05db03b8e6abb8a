"""Helpers shared by the tests, the fixture scripts, the GPU harnesses and bench/; never
imported by the runtime (nothing under reflex_ipc outside this package imports it).

- synthetic: the one synthetic-GGUF writer (parity fixtures, mixed-format models, the
  Qwen3-0.6B-shaped timing model, the tiny float-weight test models).
- references: float64 references written from the definitions (rope, attention, the
  fused rms_norm+rope, whole-model logits of the tiny models).
- opchecks: every backend op against those references on random inputs; run on the
  numpy backend by tests/test_fused_ops.py and on the GPU by scripts/gpu/gpu-check;
  `weights_gguf` loads hand-made weight blocks through a real GGUFFile.
- fake_server: a Runner stand-in and subprocess/socket clients for the server tests.
- fuzz: the issue-12 fault and hostile-input suite (tests/test_fuzz.py runs its short mode,
  scripts/fuzz-long its long one).
- sdist: llama.cpp's tokenizer vectors and vocab-only GGUFs from the llama-cpp-python sdist.
"""
