"""Qwen3-MoE: the qwen3 decoder (neox rope, per-head q/k RMSNorm) with a mixture-of-experts
feed-forward in every layer.

`expert_count` experts, `expert_used_count` chosen per token by a softmax router
(`ffn_gate_inp`), their weights renormalized to sum to 1 (llama.cpp's qwen3moe graph
always normalizes). Expert tensors are 3-D: `ffn_{gate,up}_exps` [experts, n_ff_exp,
n_embd] and `ffn_down_exps` [experts, n_embd, n_ff_exp] (numpy order), n_ff_exp from
`expert_feed_forward_length` (per layer), else feed_forward_length / expert_used_count.
"""

from ..errors import ReflexError
from .common import MOE_CAPTURABLE
from .qwen3 import Model as _Qwen3


class Model(_Qwen3):
    capturable = MOE_CAPTURABLE
    dense_ffn = False  # every layer routed: feed_forward_length optional, as in llama.cpp

    def __init__(self, ops, f, lora=None):
        from .common import HParams

        hp = HParams(f, dense_ffn=False)
        self.n_expert = hp.int("expert_count", required=True, lo=1, hi=1 << 12)
        self.n_used = hp.per_layer("expert_used_count", required=True, lo=1, hi=self.n_expert)
        if len(set(self.n_used)) > 1:  # llama.cpp would route every layer with layer 0's count
            raise ReflexError("unsupported_architecture", f"metadata key {hp.arch}.expert_used_count: "
                              f"different counts per layer {self.n_used} are not supported")
        n_ff_exp = hp.per_layer("expert_feed_forward_length", default=0, lo=0, hi=1 << 20)
        self.n_ff_exp = [x or hp.n_ff_l[i] // self.n_used[i] for i, x in enumerate(n_ff_exp)]
        if not all(self.n_ff_exp):
            raise ReflexError("gguf_error", f"metadata key {hp.arch}.expert_feed_forward_length: "
                              f"an expert width of 0")
        super().__init__(ops, f)

    def _load_ffn(self, w, i):
        p, E, F, X = f"blk.{i}.", self.hp.n_embd, self.n_ff_exp[i], self.n_expert
        return dict(router=w(p + "ffn_gate_inp.weight", (X, E)),
                    gate_exps=w(p + "ffn_gate_exps.weight", (X, F, E)),
                    up_exps=w(p + "ffn_up_exps.weight", (X, F, E)),
                    down_exps=w(p + "ffn_down_exps.weight", (X, E, F)), n_used=self.n_used[i])

    def _ffn(self, x, h, L):
        ops = self.ops
        ops.add(x, ops.moe(h, L.router, L.gate_exps, L.up_exps, L.down_exps, L.n_used, gating="softmax",
                           norm=True), out=x)
