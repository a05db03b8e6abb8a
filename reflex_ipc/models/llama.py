"""Llama (SmolLM2, Mistral-style): pre-norm decoder, RMSNorm, rotary (normal), GQA, SwiGLU.

Optional pieces llama.cpp also accepts for this architecture: q/k/v and output
biases, Llama-3 rope frequency factors (rope_freqs.weight). Subclasses switch
on neox rope (qwen2) and per-head q/k RMSNorm (qwen3).
"""

from types import SimpleNamespace

from .common import HParams, Weights, attention_block, default_attn_scale, linear


class Model:
    rope_neox = False  # llama.cpp rope type: "norm" (pairs 2i, 2i+1)
    qk_norm = False  # RMSNorm over each head of q and k before rope

    def __init__(self, ops, f):
        self.ops = ops
        self.hp = hp = HParams(f)
        w = Weights(ops, f)
        self.tok_embd = w("token_embd.weight")
        self.output_norm = w("output_norm.weight")
        self.output = w.output()
        self.rope_factors = w("rope_freqs.weight", optional=True)
        self.scale = default_attn_scale(hp)
        self.layers = [self._load_layer(w, f"blk.{i}.") for i in range(hp.n_layer)]

    def _load_layer(self, w, p):
        return SimpleNamespace(
            attn_norm=w(p + "attn_norm.weight"),
            wq=w(p + "attn_q.weight"), wk=w(p + "attn_k.weight"), wv=w(p + "attn_v.weight"),
            bq=w(p + "attn_q.bias", True), bk=w(p + "attn_k.bias", True), bv=w(p + "attn_v.bias", True),
            q_norm=w(p + "attn_q_norm.weight") if self.qk_norm else None,
            k_norm=w(p + "attn_k_norm.weight") if self.qk_norm else None,
            wo=w(p + "attn_output.weight"), bo=w(p + "attn_output.bias", True),
            ffn_norm=w(p + "ffn_norm.weight"),
            gate=w(p + "ffn_gate.weight"), up=w(p + "ffn_up.weight"), down=w(p + "ffn_down.weight"),
        )

    def _rope(self, x, batch):
        hp = self.hp
        return self.ops.rope(x, batch.pos, n_rot=hp.n_rot, base=hp.rope_base, freq_scale=hp.rope_scale,
                             freq_factors=self.rope_factors, neox=self.rope_neox, inplace=True)

    def forward(self, cache, batch, rows=None, output="logits", check=None):
        ops, hp, N = self.ops, self.hp, batch.n
        x = ops.embed(self.tok_embd, batch.ids)
        for i, L in enumerate(self.layers):
            if check is not None:
                check()
            h = ops.rms_norm(x, L.attn_norm, hp.eps)
            q = linear(ops, h, L.wq, L.bq).reshape(N, hp.n_head, hp.head_dim)
            k = linear(ops, h, L.wk, L.bk).reshape(N, hp.n_head_kv, hp.head_dim)
            v = linear(ops, h, L.wv, L.bv).reshape(N, hp.n_head_kv, hp.head_dim)
            if self.qk_norm:
                q = ops.rms_norm(q, L.q_norm, hp.eps)
                k = ops.rms_norm(k, L.k_norm, hp.eps)
            q, k = self._rope(q, batch), self._rope(k, batch)
            a = attention_block(ops, hp, cache, i, batch, q, k, v, scale=self.scale)
            x = ops.add(x, linear(ops, a, L.wo, L.bo))
            h = ops.rms_norm(x, L.ffn_norm, hp.eps)
            x = ops.add(x, ops.matmul(ops.swiglu(ops.matmul(h, L.gate), ops.matmul(h, L.up)), L.down))
        if rows is not None:
            x = x[rows]
        x = ops.rms_norm(x, self.output_norm, hp.eps)
        return x if output == "hidden" else ops.matmul(x, self.output)
