"""Qwen2: the llama decoder with q/k/v biases (optional there, present here) and neox rope."""

from .llama import Model as _Llama


class Model(_Llama):
    rope_neox = True  # llama.cpp rope type for qwen2: neox (pairs i, i + n_rot/2)
