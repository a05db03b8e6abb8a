"""Qwen3: the llama decoder with neox rope and RMSNorm over each q and k head before rope."""

from .llama import Model as _Llama


class Model(_Llama):
    rope_neox = True
    qk_norm = True  # blk.N.attn_q_norm.weight / attn_k_norm.weight, [head_dim]
