"""Qwen3.5-MoE: the qwen35 hybrid (Gated DeltaNet + gated attention) with a mixture-of-experts
feed-forward in every layer, as llama.cpp's qwen35moe graph computes it:

    out = moe(h)  (softmax router `ffn_gate_inp`, `expert_used_count` experts, weights
                   renormalized; widths `expert_feed_forward_length`)
        + sigmoid(h . ffn_gate_inp_shexp) * swiglu shared expert(h)
          (`ffn_{gate,up,down}_shexp`, width `expert_shared_feed_forward_length`)
"""

from . import blocks
from .common import MOE_CAPTURABLE, experts
from .plan import T, dense, example, keys, variant
from .qwen35 import Model as _Qwen35


class Model(_Qwen35):
    KEYS = keys(required=("expert_count", "expert_used_count", "expert_shared_feed_forward_length"),
                optional=("expert_feed_forward_length", "feed_forward_length"),  # llama.cpp's (issue 32 item 15)
                base=_Qwen35.KEYS)
    capturable = MOE_CAPTURABLE
    EXAMPLES = {  # 4 experts (2 used, width 32) and a gated shared expert (width 64) in every layer
        "qwen35moe": example({"expert_count": 4, "expert_used_count": 2, "expert_feed_forward_length": 32,
                              "expert_shared_feed_forward_length": 64, "full_attention_interval": 4},
                             base=_Qwen35.BASE, gain=4.0, embd_std=0.5, seed=2),
        "qwen35moe@q": variant("qwen35moe", {"expert_feed_forward_length": 256,
                                             "expert_shared_feed_forward_length": 256}, quantize=True)}

    @classmethod
    def dims(cls, hp):
        d = super().dims(hp)
        d.n_expert, used, n_ff_exp = experts(hp)
        d.n_ff_sh = hp.int("expert_shared_feed_forward_length", required=True, lo=1, hi=1 << 20)
        for L, u, fe in zip(d.layers, used, n_ff_exp):
            L.n_used, L.n_ff_exp = u, fe
        return d

    @classmethod
    def ffn_plan(cls, d, L):
        E, F, X, Fs = d.E, L.n_ff_exp, d.n_expert, d.n_ff_sh
        return (T("ffn_gate_inp.weight", X, E), T("ffn_gate_exps.weight", X, F, E), T("ffn_up_exps.weight", X, F, E),
                T("ffn_down_exps.weight", X, E, F), dense("ffn_gate_inp_shexp.weight", E, as_shape=(1, E)),
                T("ffn_gate_shexp.weight", Fs, E), T("ffn_up_shexp.weight", Fs, E), T("ffn_down_shexp.weight", E, Fs))

    def ffn(self, x, L):
        ops = self.ops
        blocks.moe(ops, ops.rms_norm(x, L.post_attention_norm, self.hp.eps), L, L.n_used, gating="softmax", norm=True,
                   res=x)
