"""Qwen3: the llama decoder with neox rope and RMSNorm over each q and k head before rope."""

from .llama import Model as _Llama
from .plan import example


class Model(_Llama):
    rope_neox = True
    qk_norm = True  # blk.N.attn_q_norm.weight / attn_k_norm.weight, [head_dim]
    EXAMPLES = {"qwen3": example({"rope.freq_base": 1e6, "attention.key_length": 16, "attention.value_length": 16})}
