"""Llama (SmolLM2, Mistral-style): pre-norm decoder, RMSNorm, rotary (normal), GQA, SwiGLU.

Optional pieces llama.cpp also accepts for this architecture: q/k/v and output
biases, Llama-3 rope frequency factors (rope_freqs.weight). Subclasses switch
on neox rope (qwen2) and per-head q/k RMSNorm (qwen3). Head counts and the
feed-forward width may differ per layer.
"""

from . import blocks
from .common import Decoder, default_attn_scale, same_head_dims
from .plan import Layer, T, example, layer, opt


class Model(Decoder):
    rope_neox = False  # llama.cpp rope type: "norm" (pairs 2i, 2i+1)
    qk_norm = False  # RMSNorm over each head of q and k before rope
    EXAMPLES = {"llama": example({}, has=("output.weight",))}

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
                opt("rope_freqs.weight", d.n_rot // 2),
                *(layer(i, T("attn_norm.weight", E),
                        T("attn_q.weight", L.n_head * L.head_dim, E), T("attn_k.weight", L.n_head_kv * L.head_dim, E),
                        T("attn_v.weight", L.n_head_kv * L.head_dim, E),
                        opt("attn_q.bias", L.n_head * L.head_dim), opt("attn_k.bias", L.n_head_kv * L.head_dim),
                        opt("attn_v.bias", L.n_head_kv * L.head_dim),
                        T("attn_q_norm.weight", L.head_dim) if cls.qk_norm else None,
                        T("attn_k_norm.weight", L.head_dim) if cls.qk_norm else None,
                        T("attn_output.weight", E, L.n_head * L.head_dim), opt("attn_output.bias", E),
                        T("ffn_norm.weight", E), *cls.ffn_plan(d, L))
                  for i, L in enumerate(d.layers))]

    @classmethod
    def ffn_plan(cls, d, L):
        """The feed-forward's tensors of a layer (a gated SwiGLU here)."""
        return (T("ffn_gate.weight", L.n_ff, d.E), T("ffn_up.weight", L.n_ff, d.E), T("ffn_down.weight", d.E, L.n_ff))

    def __init__(self, ops, f, lora=None):
        t = self._load(ops, f, lora)
        hp = self.hp
        self.scale = default_attn_scale(hp)
        self.rope = dict(n_rot=hp.n_rot, base=hp.rope_base, freq_scale=hp.rope_scale, freq_factors=t.rope_freqs,
                         neox=self.rope_neox)

    def ffn(self, x, L):
        """x += the layer's feed-forward of rms_norm(x, ffn_norm)."""
        blocks.ffn(self.ops, x, L, self.hp.eps)

    def forward(self, state, batch, rows=None, output="logits", check=None):
        ops, hp = self.ops, self.hp
        x = ops.embed(self.tok_embd, batch.ids)  # a fresh array: the residual adds go into it
        for L, S in zip(self.layers, state.layers):
            if check is not None:
                check()
            blocks.attention(ops, x, L, S, batch, hp.eps, rope=self.rope, scale=self.scale)
            self.ffn(x, L)
        return blocks.head(ops, x, self.output_norm, self.output, hp.eps, rows, output)
