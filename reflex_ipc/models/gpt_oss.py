"""gpt-oss (`general.architecture` gpt-oss; llama.cpp's openai-moe graph).

- attention with biases (q/k/v optional, the output's required) and a learned per-head
  attention sink (`attn_sinks`: a logit in every query's softmax denominator), queries scaled
  by 1/sqrt(head_dim);
- sliding-window layers (`attention.sliding_window`) alternating with full attention
  (`attention.sliding_window_pattern`, default 2: even layers windowed), the windowed layers'
  own rope base `rope.freq_base_swa` (default: rope.freq_base);
- neox rope with YaRN when rope.scaling.type is yarn (the released models: factor 32 over an
  original context of 4096);
- every layer a mixture of experts after `post_attention_norm` (the pre-FFN norm): a router
  with a bias, the top-k experts by logit weighted by a softmax over those k logits, expert
  gate/up/down products with per-expert biases and the clamped SwiGLU (x = min(gate, 7),
  y = clamp(up, -7, 7), x * sigmoid(1.702 x) * (y + 1)); experts are MXFP4 in the released
  files (any format here).
"""

import math

from . import blocks
from .common import MOE_CAPTURABLE, Decoder, experts, same_head_dims, swa_layers, yarn_rope
from .plan import Layer, T, dense, example, keys, layer, opt, variant

_EXAMPLE = {"block_count": 4, "attention.key_length": 16, "attention.value_length": 16, "expert_count": 4,
            "expert_used_count": 2, "expert_feed_forward_length": 24, "attention.sliding_window": 4,
            "rope.freq_base": 150000.0, "rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
            "rope.scaling.original_context_length": 64}


class Model(Decoder):
    KEYS = keys(required=("expert_count", "expert_used_count", "expert_feed_forward_length",
                          "attention.sliding_window"),
                optional=("attention.sliding_window_pattern", "rope.freq_base_swa", "rope.scaling.attn_factor",
                          "rope.scaling.original_context_length", "feed_forward_length"))  # every layer routed
    rope_scalings = ("none", "linear", "yarn")
    capturable = MOE_CAPTURABLE
    EXAMPLES = {
        "gpt-oss": example(_EXAMPLE, has=("attn_q.bias", "attn_k.bias", "attn_v.bias"),
                           rules={"attn_sinks.weight": (0.0, 1.0)}, vocab="o200k-harmony"),
        "gpt-oss@q": variant("gpt-oss", {"expert_feed_forward_length": 256}, quantize=True)}

    @classmethod
    def dims(cls, hp):
        same_head_dims(hp)
        if hp.n_rot != hp.head_dim:  # llama.cpp's q/k widths are n_head * n_rot
            from ..errors import ReflexError

            raise ReflexError("unsupported_architecture", f"gpt-oss with rope over {hp.n_rot} of {hp.head_dim} dims")
        d = Layer(E=hp.n_embd, window=hp.int("attention.sliding_window", required=True, lo=0, hi=1 << 24))
        d.n_expert, used, n_ff_exp = experts(hp, same_used=True)
        d.layers = [Layer(n_head=h, n_head_kv=hkv, head_dim=hp.head_dim, n_used=u, n_ff_exp=fe, swa=swa)
                    for h, hkv, u, fe, swa in zip(hp.n_head_l, hp.n_head_kv_l, used, n_ff_exp, swa_layers(hp, 2))]
        return d

    @classmethod
    def plan(cls, d):
        E, X = d.E, d.n_expert
        return [T("token_embd.weight", None, E), T("output_norm.weight", E), T("output.weight", None, E),
                *(layer(i, T("attn_norm.weight", E),
                        T("attn_q.weight", L.n_head * L.head_dim, E), T("attn_k.weight", L.n_head_kv * L.head_dim, E),
                        T("attn_v.weight", L.n_head_kv * L.head_dim, E),
                        opt("attn_q.bias", L.n_head * L.head_dim), opt("attn_k.bias", L.n_head_kv * L.head_dim),
                        opt("attn_v.bias", L.n_head_kv * L.head_dim),
                        T("attn_output.weight", E, L.n_head * L.head_dim), T("attn_output.bias", E),
                        T("attn_sinks.weight", L.n_head), T("post_attention_norm.weight", E),
                        T("ffn_gate_inp.weight", X, E), T("ffn_gate_inp.bias", X),
                        T("ffn_gate_exps.weight", X, L.n_ff_exp, E), dense("ffn_gate_exps.bias", X, L.n_ff_exp),
                        T("ffn_up_exps.weight", X, L.n_ff_exp, E), dense("ffn_up_exps.bias", X, L.n_ff_exp),
                        T("ffn_down_exps.weight", X, E, L.n_ff_exp), dense("ffn_down_exps.bias", X, E))
                  for i, L in enumerate(d.layers))]

    def __init__(self, ops, f, lora=None):
        self._load(ops, f, lora)
        hp = self.hp
        fs, mscale, yarn = yarn_rope(hp)
        base_swa = hp.float("rope.freq_base_swa", default=hp.rope_base, gt=0.0)
        for L in self.layers:  # the windowed layers take the trained scale even without a scaling type
            L.rope = dict(n_rot=hp.n_rot, neox=True, base=base_swa if L.swa else hp.rope_base,
                          freq_scale=hp.rope_scale if L.swa else fs, mscale=mscale, **({"yarn": yarn} if yarn else {}))
        self.scale = 1.0 / math.sqrt(hp.n_rot)

    def forward(self, state, batch, rows=None, output="logits", check=None):
        ops, eps = self.ops, self.hp.eps
        x = ops.embed(self.tok_embd, batch.ids)
        for L, S in zip(self.layers, state.layers):
            if check is not None:
                check()
            blocks.attention(ops, x, L, S, batch, eps, rope=L.rope, scale=self.scale,
                             window=self.d.window if L.swa else 0, sinks=L.attn_sinks)
            blocks.moe(ops, ops.rms_norm(x, L.post_attention_norm, eps), L, L.n_used, gating="softmax_weight",
                       norm=False, act="swiglu_oai", router_bias=L.ffn_gate_inp_bias, gate_bias=L.ffn_gate_exps_bias,
                       up_bias=L.ffn_up_exps_bias, down_bias=L.ffn_down_exps_bias, res=x)
        return blocks.head(ops, x, self.output_norm, self.output, eps, rows, output)
