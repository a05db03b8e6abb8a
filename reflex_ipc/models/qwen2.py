"""Qwen2: the llama decoder with q/k/v biases (optional there, present here) and neox rope."""

from .llama import Model as _Llama
from .plan import example


class Model(_Llama):
    rope_neox = True  # llama.cpp rope type for qwen2: neox (pairs i, i + n_rot/2)
    EXAMPLES = {"qwen2": example({"rope.freq_base": 1e6}, has=("attn_q.bias", "attn_k.bias", "attn_v.bias"))}
