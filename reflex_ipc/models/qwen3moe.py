"""Qwen3-MoE: the qwen3 decoder (neox rope, per-head q/k RMSNorm) with a mixture-of-experts
feed-forward in every layer.

`expert_count` experts, `expert_used_count` chosen per token by a softmax router
(`ffn_gate_inp`), their weights renormalized to sum to 1 (llama.cpp's qwen3moe graph
always normalizes). Expert tensors are 3-D: `ffn_{gate,up}_exps` [experts, n_ff_exp,
n_embd] and `ffn_down_exps` [experts, n_embd, n_ff_exp] (numpy order), n_ff_exp from
`expert_feed_forward_length` (per layer), else feed_forward_length / expert_used_count.
"""

from . import blocks
from .common import MOE_CAPTURABLE, experts
from .plan import T, example, keys, variant
from .qwen3 import Model as _Qwen3


class Model(_Qwen3):
    # every layer routed: feed_forward_length optional, as in llama.cpp (issue 32 item 15)
    KEYS = keys(required=("expert_count", "expert_used_count"),
                optional=("expert_feed_forward_length", "feed_forward_length"))
    capturable = MOE_CAPTURABLE
    EXAMPLES = {
        "qwen3moe": example({"rope.freq_base": 1e6, "attention.key_length": 16, "attention.value_length": 16,
                             "expert_count": 8, "expert_used_count": 2, "expert_feed_forward_length": 24}),
        "qwen3moe@q": variant("qwen3moe", {"expert_feed_forward_length": 256}, quantize=True)}

    @classmethod
    def dims(cls, hp):
        d = super().dims(hp)
        d.n_expert, used, n_ff_exp = experts(hp, same_used=True)
        for L, u, fe in zip(d.layers, used, n_ff_exp):
            L.n_used, L.n_ff_exp = u, fe
        return d

    @classmethod
    def ffn_plan(cls, d, L):
        X, E, F = d.n_expert, d.E, L.n_ff_exp
        return (T("ffn_gate_inp.weight", X, E), T("ffn_gate_exps.weight", X, F, E),
                T("ffn_up_exps.weight", X, F, E), T("ffn_down_exps.weight", X, E, F))

    def ffn(self, x, L):
        ops = self.ops
        blocks.moe(ops, ops.rms_norm(x, L.ffn_norm, self.hp.eps), L, L.n_used, gating="softmax", norm=True, res=x)
