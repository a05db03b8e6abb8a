"""Llama 4 (text; llama.cpp's llama4 graph).

- rope ("norm" pairs, Llama-3 frequency factors `rope_freqs` when present) on three layers of
  four; every fourth layer (i % 4 == 3) is a NoPE layer: no rotation, and its queries times
  the attention temperature log(floor((pos + 1) / 8192) + 1) * 0.1 + 1 (long contexts);
- chunked attention on the windowed layers (`attention.sliding_window_pattern`, default 4:
  layers i % 4 < 3, the rope ones): a query sees only the keys of its own chunk of 8192
  positions (llama.cpp fixes the size); a file whose `attention.sliding_window` is 0 has
  neither chunks nor NoPE layers but the last one (llama.cpp's reading), and no temperature;
- on the rope layers q and k RMS-normalized per head without weights after rotation (not
  for the 128-expert model, as llama.cpp decides); a norm without weights commutes with a
  rotation of every dim, so it is applied before it here;
- a mixture of experts every `interleave_moe_layer_step` layers (i + 1 divisible by it), the
  dense gated FFN elsewhere: a sigmoid router choosing `expert_used_count` experts (1), the
  chosen expert fed the token times its weight (llama.cpp's weight before the FFN), plus a
  shared expert (ffn_*_shexp) of the experts' width.
"""

from ..errors import ReflexError
from . import blocks
from .common import MOE_CAPTURABLE, Decoder, default_attn_scale, experts, same_head_dims, swa_layers
from .plan import Layer, T, example, keys, layer, opt, variant

CHUNK = 8192  # llama.cpp's n_swa for llama4 (the chunk size), whatever the file says
NOPE_STEP = 4  # llama.cpp's n_no_rope_layer_step default
TEMPERATURE = dict(floor=8192.0, scale=0.1, offset=1.0)  # n_attn_temp_floor_scale, f_attn_temp_scale, offset

_EXAMPLE = {"block_count": 4, "attention.key_length": 16, "attention.value_length": 16, "expert_count": 4,
            "expert_used_count": 1, "expert_feed_forward_length": 24, "interleave_moe_layer_step": 2,
            "rope.freq_base": 500000.0}


class Model(Decoder):
    KEYS = keys(required=("expert_count", "expert_used_count", "expert_feed_forward_length",
                          "interleave_moe_layer_step"),
                optional=("feed_forward_length", "attention.sliding_window",  # llama.cpp's: optional
                          "attention.sliding_window_pattern", "rope.freq_base_swa"))
    capturable = MOE_CAPTURABLE
    EXAMPLES = {
        "llama4": example(_EXAMPLE, has=("output.weight", "rope_freqs.weight")),
        "llama4@q": variant("llama4", {"expert_feed_forward_length": 256, "feed_forward_length": 256},
                            quantize=True)}

    @classmethod
    def dims(cls, hp):
        same_head_dims(hp)
        if hp.n_rot != hp.head_dim:
            raise ReflexError("unsupported_architecture", f"llama4 with rope over {hp.n_rot} of {hp.head_dim} dims")
        d = Layer(E=hp.n_embd, n_rot=hp.n_rot)
        d.n_expert, used, n_ff_exp = experts(hp)
        step = hp.int("interleave_moe_layer_step", required=True, lo=0, hi=1 << 16)
        # absent or nonzero: chunks of CHUNK (llama.cpp ignores the value); 0: no chunks
        d.chunked = hp.int("attention.sliding_window", default=1, lo=0, hi=1 << 24) != 0
        swa = swa_layers(hp, 4) if d.chunked else [False] * hp.n_layer
        nope_step = NOPE_STEP if d.chunked else hp.n_layer
        d.qk_norm = d.n_expert != 128
        d.layers = [Layer(n_head=h, n_head_kv=hkv, head_dim=hp.head_dim, n_ff=f, n_used=u, n_ff_exp=fe,
                          moe=step > 0 and (i + 1) % step == 0, rope=(i + 1) % nope_step != 0, chunked=s)
                    for i, (h, hkv, f, u, fe, s) in enumerate(zip(hp.n_head_l, hp.n_head_kv_l, hp.n_ff_l, used,
                                                                   n_ff_exp, swa))]
        return d

    @classmethod
    def plan(cls, d):
        E, X = d.E, d.n_expert
        return [T("token_embd.weight", None, E), T("output_norm.weight", E), opt("output.weight", None, E),
                opt("rope_freqs.weight", d.n_rot // 2),
                *(layer(i, T("attn_norm.weight", E),
                        T("attn_q.weight", L.n_head * L.head_dim, E), T("attn_k.weight", L.n_head_kv * L.head_dim, E),
                        T("attn_v.weight", L.n_head_kv * L.head_dim, E),
                        opt("attn_q.bias", L.n_head * L.head_dim), opt("attn_k.bias", L.n_head_kv * L.head_dim),
                        opt("attn_v.bias", L.n_head_kv * L.head_dim),
                        T("attn_output.weight", E, L.n_head * L.head_dim), T("ffn_norm.weight", E),
                        *((T("ffn_gate_inp.weight", X, E), T("ffn_gate_exps.weight", X, L.n_ff_exp, E),
                           T("ffn_up_exps.weight", X, L.n_ff_exp, E), T("ffn_down_exps.weight", X, E, L.n_ff_exp),
                           T("ffn_gate_shexp.weight", L.n_ff_exp, E), T("ffn_up_shexp.weight", L.n_ff_exp, E),
                           T("ffn_down_shexp.weight", E, L.n_ff_exp)) if L.moe else
                          (T("ffn_gate.weight", L.n_ff, E), T("ffn_up.weight", L.n_ff, E),
                           T("ffn_down.weight", E, L.n_ff))))
                  for i, L in enumerate(d.layers))]

    def __init__(self, ops, f, lora=None):
        t = self._load(ops, f, lora)
        hp, d = self.hp, self.d
        base_swa = hp.float("rope.freq_base_swa", default=hp.rope_base, gt=0.0)
        fs = 1.0 if hp.rope_scaling == "none" else hp.rope_scale
        for L in self.layers:
            L.rope_args = None if not L.rope else dict(
                n_rot=hp.n_rot, neox=False, base=base_swa if L.chunked else hp.rope_base,
                freq_scale=hp.rope_scale if L.chunked else fs, freq_factors=t.rope_freqs)
        self.scale = default_attn_scale(hp)

    def forward(self, state, batch, rows=None, output="logits", check=None):
        ops, d, eps = self.ops, self.d, self.hp.eps
        x = ops.embed(self.tok_embd, batch.ids)
        for L, S in zip(self.layers, state.layers):
            if check is not None:
                check()
            blocks.attention(ops, x, L, S, batch, eps, rope=L.rope_args, scale=self.scale,
                             chunk=CHUNK if L.chunked else 0, qk_norm=L.rope and d.qk_norm,
                             temperature=TEMPERATURE if not L.rope and d.chunked else None)
            if L.moe:
                blocks.moe(ops, ops.rms_norm(x, L.ffn_norm, eps), L, L.n_used, gating="sigmoid", norm=False,
                           weight_before=True, res=x)
            else:
                blocks.ffn(ops, x, L, eps)
        return blocks.head(ops, x, self.output_norm, self.output, eps, rows, output)
