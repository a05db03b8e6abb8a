"""Qwen3.5-MoE: the qwen35 hybrid (Gated DeltaNet + gated attention) with a mixture-of-experts
feed-forward in every layer, as llama.cpp's qwen35moe graph computes it:

    out = moe(h)  (softmax router `ffn_gate_inp`, `expert_used_count` experts, weights
                   renormalized; widths `expert_feed_forward_length`)
        + sigmoid(h . ffn_gate_inp_shexp) * swiglu shared expert(h)
          (`ffn_{gate,up,down}_shexp`, width `expert_shared_feed_forward_length`)
"""

from ..errors import ReflexError
from .common import MOE_CAPTURABLE
from .qwen35 import Model as _Qwen35


class Model(_Qwen35):
    capturable = MOE_CAPTURABLE
    dense_ffn = False  # every layer routed: feed_forward_length optional, as in llama.cpp

    def __init__(self, ops, f, lora=None):
        from .common import HParams

        hp = HParams(f, dense_ffn=False)
        self.n_expert = hp.int("expert_count", required=True, lo=1, hi=1 << 12)
        self.n_used = hp.per_layer("expert_used_count", required=True, lo=1, hi=self.n_expert)
        n_ff_exp = hp.per_layer("expert_feed_forward_length", default=0, lo=0, hi=1 << 20)
        self.n_ff_exp = [x or hp.n_ff_l[i] // self.n_used[i] for i, x in enumerate(n_ff_exp)]
        if not all(self.n_ff_exp):
            raise ReflexError("gguf_error", f"metadata key {hp.arch}.expert_feed_forward_length: an expert width of 0")
        self.n_ff_sh = hp.int("expert_shared_feed_forward_length", required=True, lo=1, hi=1 << 20)
        super().__init__(ops, f, lora)

    def _load_ffn(self, w, i):
        p, E, F, X, Fs = f"blk.{i}.", self.hp.n_embd, self.n_ff_exp[i], self.n_expert, self.n_ff_sh
        return dict(router=w(p + "ffn_gate_inp.weight", (X, E)),
                    gate_exps=w(p + "ffn_gate_exps.weight", (X, F, E)),
                    up_exps=w(p + "ffn_up_exps.weight", (X, F, E)),
                    down_exps=w(p + "ffn_down_exps.weight", (X, E, F)), n_used=self.n_used[i],
                    sh_gate_inp=w.dense(p + "ffn_gate_inp_shexp.weight", (E,), as_shape=(1, E)),
                    sh_gate=w(p + "ffn_gate_shexp.weight", (Fs, E)), sh_up=w(p + "ffn_up_shexp.weight", (Fs, E)),
                    sh_down=w(p + "ffn_down_shexp.weight", (E, Fs)))

    def _ffn(self, x, h, L):
        ops = self.ops
        ops.add(x, ops.moe(h, L.router, L.gate_exps, L.up_exps, L.down_exps, L.n_used, gating="softmax",
                           norm=True), out=x)
        sh = ops.matmul(ops.matmul_glu(h, L.sh_gate, L.sh_up, act="silu"), L.sh_down)
        ops.add(x, ops.mul(sh, ops.sigmoid(ops.matmul(h, L.sh_gate_inp))), out=x)
