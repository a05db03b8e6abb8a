"""Llama (SmolLM2, Mistral-style): pre-norm decoder, RMSNorm, rotary (normal), GQA, SwiGLU.

Optional pieces llama.cpp also accepts for this architecture: q/k/v and output
biases, Llama-3 rope frequency factors (rope_freqs.weight). Subclasses switch
on neox rope (qwen2) and per-head q/k RMSNorm (qwen3). Head counts and the
feed-forward width may differ per layer.
"""

from types import SimpleNamespace

from ..backends.base import qk_rope_kv_store, rms_norm_matmul_glu, rms_norm_matmul_n
from .common import Decoder, HParams, Weights, bias, default_attn_scale, residual, same_head_dims


class Model(Decoder):
    rope_neox = False  # llama.cpp rope type: "norm" (pairs 2i, 2i+1)
    qk_norm = False  # RMSNorm over each head of q and k before rope
    dense_ffn = True  # feed_forward_length required (HParams)

    def __init__(self, ops, f, lora=None):
        self.ops = ops
        self.hp = hp = HParams(f, dense_ffn=self.dense_ffn)
        same_head_dims(hp)
        w = Weights(ops, f, lora)
        self.tok_embd = w("token_embd.weight", (None, hp.n_embd))
        self.output_norm = w("output_norm.weight", (hp.n_embd,))
        self.output = w.output(hp.n_embd)
        self.rope_factors = w("rope_freqs.weight", (hp.n_rot // 2,), optional=True)
        self.scale = default_attn_scale(hp)
        self.layers = [self._load_layer(w, i) for i in range(hp.n_layer)]

    def _load_layer(self, w, i):
        hp, p = self.hp, f"blk.{i}."
        H, Hkv, hd, E = hp.n_head_l[i], hp.n_head_kv_l[i], hp.head_dim, hp.n_embd
        return SimpleNamespace(
            n_head=H, n_head_kv=Hkv,
            **self._load_ffn(w, i),
            attn_norm=w(p + "attn_norm.weight", (E,)),
            wq=w(p + "attn_q.weight", (H * hd, E)), wk=w(p + "attn_k.weight", (Hkv * hd, E)),
            wv=w(p + "attn_v.weight", (Hkv * hd, E)),
            bq=w(p + "attn_q.bias", (H * hd,), True), bk=w(p + "attn_k.bias", (Hkv * hd,), True),
            bv=w(p + "attn_v.bias", (Hkv * hd,), True),
            q_norm=w(p + "attn_q_norm.weight", (hd,)) if self.qk_norm else None,
            k_norm=w(p + "attn_k_norm.weight", (hd,)) if self.qk_norm else None,
            wo=w(p + "attn_output.weight", (E, H * hd)), bo=w(p + "attn_output.bias", (E,), True),
            ffn_norm=w(p + "ffn_norm.weight", (E,)),
        )

    def _load_ffn(self, w, i):
        """The feed-forward's tensors of layer i (a gated SwiGLU here)."""
        p, E, F = f"blk.{i}.", self.hp.n_embd, self.hp.n_ff_l[i]
        return dict(gate=w(p + "ffn_gate.weight", (F, E)), up=w(p + "ffn_up.weight", (F, E)),
                    down=w(p + "ffn_down.weight", (E, F)))

    def _ffn(self, x, h, L):
        """x += the feed-forward of h (the normed x), in place."""
        residual(self.ops, x, self.ops.matmul_glu(h, L.gate, L.up, act="silu"), L.down)

    def _rope_args(self):
        hp = self.hp
        return dict(n_rot=hp.n_rot, base=hp.rope_base, freq_scale=hp.rope_scale,
                    freq_factors=self.rope_factors, neox=self.rope_neox)

    def _ffn_block(self, x, L):
        """x += the feed-forward of rms_norm(x): the dense gated unit with the norm folded into
        its gate/up product (base.rms_norm_matmul_glu); a subclass's own _ffn gets the normed x."""
        if type(self)._ffn is not Model._ffn:
            return self._ffn(x, self.ops.rms_norm(x, L.ffn_norm, self.hp.eps), L)
        g = rms_norm_matmul_glu(self.ops, x, L.ffn_norm, self.hp.eps, L.gate, L.up, act="silu")
        residual(self.ops, x, g, L.down)

    def forward(self, state, batch, rows=None, output="logits", check=None):
        """Per layer (fused ops of backends/base.py; REFLEX_FUSE=0 runs each as its plain ops):
        attn_norm+q/k/v, q/k norm+rope+K/V store, attention, x += output proj, ffn_norm+gate/up
        +GLU, x += down proj; then output_norm+LM head."""
        ops, hp, N = self.ops, self.hp, batch.n
        x = ops.embed(self.tok_embd, batch.ids)  # a fresh array: the residual adds go into it
        for L, S in zip(self.layers, state.layers):
            if check is not None:
                check()
            q, k, v = rms_norm_matmul_n(ops, x, L.attn_norm, hp.eps, [L.wq, L.wk, L.wv])
            q = bias(ops, q, L.bq).reshape(N, L.n_head, hp.head_dim)
            k = bias(ops, k, L.bk).reshape(N, L.n_head_kv, hp.head_dim)
            v = bias(ops, v, L.bv).reshape(N, L.n_head_kv, hp.head_dim)
            q, k = qk_rope_kv_store(ops, q, k, v, L.q_norm, L.k_norm, hp.eps, batch.pos, S.k, S.v, batch.slots,
                                    norm=self.qk_norm, **self._rope_args())
            a = ops.attention(q, S.k, S.v, batch.slots, batch.n_kv, scale=self.scale, **batch.attention_args(0))
            residual(ops, x, a.reshape(N, L.n_head * hp.head_dim), L.wo, L.bo)
            self._ffn_block(x, L)
        if rows is not None:
            x = x[rows]
        if output == "hidden":
            return ops.rms_norm(x, self.output_norm, hp.eps)
        return rms_norm_matmul_n(ops, x, self.output_norm, hp.eps, [self.output])[0]
