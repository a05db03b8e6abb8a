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

from types import SimpleNamespace

from .common import Decoder, HParams, Weights, attention_block, default_attn_scale, residual, same_head_dims


class Model(Decoder):
    def __init__(self, ops, f, lora=None):
        self.ops = ops
        self.hp = hp = HParams(f)
        same_head_dims(hp)
        w = Weights(ops, f, lora)
        self.tok_embd = w("token_embd.weight", (None, hp.n_embd))
        self.output_norm = w("output_norm.weight", (hp.n_embd,))
        self.output = w.output(hp.n_embd)
        self.output_b = w("output.bias", (self.output.shape[0],), optional=True)
        self.factors_long = w("rope_factors_long.weight", (hp.n_rot // 2,), optional=True)
        self.factors_short = w("rope_factors_short.weight", (hp.n_rot // 2,), optional=True)
        self.n_ctx_orig = hp.int("rope.scaling.original_context_length", default=hp.n_ctx_train, lo=0, hi=1 << 24)
        self.attn_factor = hp.float("rope.scaling.attn_factor", default=1.0, gt=0.0)
        self.rope_factors = self.factors_short
        self.scale = default_attn_scale(hp)
        self.layers = [self._load_layer(w, i) for i in range(hp.n_layer)]

    def configure(self, n_ctx):
        """LongRoPE: the long factors when the engine's context exceeds the original one."""
        self.rope_factors = self.factors_long if n_ctx > self.n_ctx_orig else self.factors_short

    def _load_layer(self, w, i):
        hp, p, ops = self.hp, f"blk.{i}.", self.ops
        H, Hkv, hd, E, F = hp.n_head_l[i], hp.n_head_kv_l[i], hp.head_dim, hp.n_embd, hp.n_ff_l[i]
        if w.has(p + "attn_qkv.weight"):
            qkv = w(p + "attn_qkv.weight", ((H + 2 * Hkv) * hd, E))
            wq, wk, wv = (w.rows(qkv, 0, H * hd), w.rows(qkv, H * hd, Hkv * hd),
                          w.rows(qkv, (H + Hkv) * hd, Hkv * hd))
        else:
            wq, wk, wv = (w(p + "attn_q.weight", (H * hd, E)), w(p + "attn_k.weight", (Hkv * hd, E)),
                          w(p + "attn_v.weight", (Hkv * hd, E)))
        up = w(p + "ffn_up.weight", (2 * F, E))
        return SimpleNamespace(
            n_head=H, n_head_kv=Hkv, wq=wq, wk=wk, wv=wv,
            attn_norm=w(p + "attn_norm.weight", (E,)),
            wo=w(p + "attn_output.weight", (E, H * hd)),
            ffn_norm=w(p + "ffn_norm.weight", (E,)),
            gate=w.rows(up, 0, F), up=w.rows(up, F, F),
            down=w(p + "ffn_down.weight", (E, F)),
        )

    def forward(self, state, batch, rows=None, output="logits", check=None):
        ops, hp, N = self.ops, self.hp, batch.n
        rope = dict(n_rot=hp.n_rot, base=hp.rope_base, freq_scale=hp.rope_scale, freq_factors=self.rope_factors,
                    neox=True, mscale=self.attn_factor, inplace=True)
        x = ops.embed(self.tok_embd, batch.ids)
        for L, S in zip(self.layers, state.layers):
            if check is not None:
                check()
            h = ops.rms_norm(x, L.attn_norm, hp.eps)
            q, k, v = ops.matmul_n(h, [L.wq, L.wk, L.wv])
            q = ops.rope(q.reshape(N, L.n_head, hp.head_dim), batch.pos, **rope)
            k = ops.rope(k.reshape(N, L.n_head_kv, hp.head_dim), batch.pos, **rope)
            a = attention_block(ops, S, batch, q, k, v.reshape(N, L.n_head_kv, hp.head_dim), scale=self.scale)
            residual(ops, x, a, L.wo)
            h = ops.rms_norm(x, L.ffn_norm, hp.eps)
            residual(ops, x, ops.matmul_glu(h, L.gate, L.up, act="silu"), L.down)
        if rows is not None:
            x = x[rows]
        x = ops.rms_norm(x, self.output_norm, hp.eps)
        if output == "hidden":
            return x
        logits = ops.matmul(x, self.output)
        return ops.add(logits, self.output_b) if self.output_b is not None else logits
