"""Phi-3: a pre-norm decoder with fused projections.

- `attn_qkv` holds q, k and v stacked by rows (or separate attn_q/k/v, as llama.cpp
  also accepts); `ffn_up` holds the gate and up halves of a SwiGLU (gate first);
- neox rope; LongRoPE frequency factors `rope_factors_long` / `rope_factors_short`
  (one pair for all layers), the long ones when the context exceeds
  `rope.scaling.original_context_length` (llama.cpp's rule, on the context the engine
  runs with), and `rope.scaling.attn_factor` scaling the rotated q/k;
- queries scaled by 1/sqrt(head_dim). llama.cpp disables Phi-3's sliding window
  (a converter issue), so `attention.sliding_window` is ignored as it does.
"""

from . import blocks
from .common import Decoder, default_attn_scale, same_head_dims, split_rows
from .plan import Alt, Layer, T, example, keys, layer, opt, variant


class Model(Decoder):
    KEYS = keys(optional=("rope.scaling.original_context_length", "rope.scaling.attn_factor"))
    _KEYS = {"rope.dimension_count": 8, "rope.scaling.original_context_length": 64, "rope.scaling.attn_factor": 1.19,
             "attention.layer_norm_rms_epsilon": 1e-5}
    _HAS = ("output.weight", "rope_factors_long.weight", "rope_factors_short.weight")
    EXAMPLES = {
        "phi3_fused_long": example(_KEYS, has=_HAS + ("attn_qkv.weight",)),
        "phi3_split_short": example({**_KEYS, "rope.scaling.original_context_length": 4096}, has=_HAS),
        "phi3@q": variant("phi3_fused_long", {"feed_forward_length": 256}, quantize=True)}

    @classmethod
    def dims(cls, hp):
        same_head_dims(hp)
        return Layer(E=hp.n_embd, n_rot=hp.n_rot, layers=[
            Layer(n_head=h, n_head_kv=hkv, head_dim=hp.head_dim, n_ff=f)
            for h, hkv, f in zip(hp.n_head_l, hp.n_head_kv_l, hp.n_ff_l)])

    @classmethod
    def plan(cls, d):
        E = d.E
        return [T("token_embd.weight", None, E), T("output_norm.weight", E), opt("output.weight", None, E),
                opt("output.bias", None), opt("rope_factors_long.weight", d.n_rot // 2),
                opt("rope_factors_short.weight", d.n_rot // 2),
                *(layer(i, T("attn_norm.weight", E),
                        Alt([T("attn_qkv.weight", (L.n_head + 2 * L.n_head_kv) * L.head_dim, E)],
                            [T("attn_q.weight", L.n_head * L.head_dim, E),
                             T("attn_k.weight", L.n_head_kv * L.head_dim, E),
                             T("attn_v.weight", L.n_head_kv * L.head_dim, E)]),
                        T("attn_output.weight", E, L.n_head * L.head_dim), T("ffn_norm.weight", E),
                        T("ffn_up.weight", 2 * L.n_ff, E), T("ffn_down.weight", E, L.n_ff))
                  for i, L in enumerate(d.layers))]

    def __init__(self, ops, f, lora=None):
        t = self._load(ops, f, lora)
        hp = self.hp
        self.output_b = t.output_bias
        if self.output_b is not None and self.output_b.shape[0] != self.output.shape[0]:
            from ..errors import ReflexError

            raise ReflexError("gguf_error", f"tensor 'output.bias' has shape {self.output_b.shape[0]}, "
                              f"expected {self.output.shape[0]}")
        self.factors_long, self.factors_short = t.rope_factors_long, t.rope_factors_short
        self.n_ctx_orig = hp.int("rope.scaling.original_context_length", default=hp.n_ctx_train, lo=0, hi=1 << 24)
        self.attn_factor = hp.float("rope.scaling.attn_factor", default=1.0, gt=0.0)
        self.rope_factors = self.factors_short
        self.scale = default_attn_scale(hp)
        for L in self.layers:
            H, Hkv, hd = L.n_head, L.n_head_kv, L.head_dim
            if L.attn_qkv is not None:
                L.attn_q, L.attn_k, L.attn_v = split_rows(ops, L.attn_qkv, [H * hd, Hkv * hd, Hkv * hd])
            L.ffn_gate, L.ffn_up = split_rows(ops, L.ffn_up, [L.n_ff, L.n_ff])

    def configure(self, n_ctx):
        """LongRoPE: the long factors when the engine's context exceeds the original one."""
        self.rope_factors = self.factors_long if n_ctx > self.n_ctx_orig else self.factors_short

    def forward(self, state, batch, rows=None, output="logits", check=None):
        ops, hp = self.ops, self.hp
        rope = dict(n_rot=hp.n_rot, base=hp.rope_base, freq_scale=hp.rope_scale, freq_factors=self.rope_factors,
                    neox=True, mscale=self.attn_factor)
        x = ops.embed(self.tok_embd, batch.ids)
        for L, S in zip(self.layers, state.layers):
            if check is not None:
                check()
            blocks.attention(ops, x, L, S, batch, hp.eps, rope=rope, scale=self.scale)
            blocks.ffn(ops, x, L, hp.eps)
        return blocks.head(ops, x, self.output_norm, self.output, hp.eps, rows, output, bias=self.output_b)
