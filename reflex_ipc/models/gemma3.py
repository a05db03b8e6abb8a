"""Gemma 3 (text): the llama decoder reshaped.

- token embeddings scaled by sqrt(n_embd);
- sandwich norms: RMSNorm before and after attention and before and after the
  feed-forward (attn_post_norm, ffn_post_norm) — the GGUF norm weights already
  include Gemma's "+1";
- q/k RMSNorm per head, neox rope;
- sliding-window layers on a pattern (`attention.sliding_window_pattern`: an
  array of per-layer flags, or n meaning every n-th layer is global, default 6)
  with their own rope base (`rope.freq_base_swa`, default 10000) and no rope
  scaling; global layers use `rope.freq_base` and the rope scaling factor;
- queries scaled by 1/sqrt(head_dim), or 1/sqrt(n_embd / n_head) for the
  62-layer (27B) model, as llama.cpp does (query_pre_attn_scalar is not in GGUF);
- GeGLU feed-forward (tanh gelu);
- final logit softcap (`final_logit_softcapping`). An `attn_logit_softcapping`
  key is ignored, as llama.cpp does for gemma3 (only its gemma2 graph applies
  it), so that the same file gives the same logits in both engines.
"""

import math
from types import SimpleNamespace

from ..errors import ReflexError
from .common import Decoder, HParams, Weights, attention_block, same_head_dims


class Model(Decoder):
    def __init__(self, ops, f, lora=None):
        self.ops = ops
        self.hp = hp = HParams(f)
        same_head_dims(hp)
        w = Weights(ops, f, lora)
        self.tok_embd = w("token_embd.weight", (None, hp.n_embd))
        self.output_norm = w("output_norm.weight", (hp.n_embd,))
        self.output = w.output(hp.n_embd)
        self.window = hp.int("attention.sliding_window", default=0, lo=0, hi=1 << 24)
        self.is_swa = self._swa_layers(hp)
        self.rope_base_swa = hp.float("rope.freq_base_swa", default=10000.0, gt=0.0)
        if hp.n_layer == 62:
            self.q_scale = 1.0 / math.sqrt(hp.n_embd / hp.n_head)
        else:
            self.q_scale = 1.0 / math.sqrt(hp.head_dim)
        self.embd_scale = math.sqrt(hp.n_embd)
        self.layers = [self._load_layer(w, i) for i in range(hp.n_layer)]

    def _swa_layers(self, hp):
        """Which layers use the sliding window: `attention.sliding_window_pattern` is an array
        of per-layer flags, or n (every n-th layer global; default 6)."""
        if self.window <= 0:
            return [False] * hp.n_layer
        flags = hp.layer_flags("attention.sliding_window_pattern")
        if flags is None:
            n = hp.int("attention.sliding_window_pattern", default=6, lo=0, hi=1 << 16)
            return [n == 0 or i % n < n - 1 for i in range(hp.n_layer)]
        if len(flags) < hp.n_layer:
            raise ReflexError("gguf_error", f"sliding_window_pattern has {len(flags)} entries "
                              f"for {hp.n_layer} layers")
        return flags[:hp.n_layer]

    def _load_layer(self, w, i):
        hp, p = self.hp, f"blk.{i}."
        H, Hkv, hd, E, F = hp.n_head_l[i], hp.n_head_kv_l[i], hp.head_dim, hp.n_embd, hp.n_ff_l[i]
        return SimpleNamespace(
            n_head=H, n_head_kv=Hkv,
            attn_norm=w(p + "attn_norm.weight", (E,)),
            wq=w(p + "attn_q.weight", (H * hd, E)), wk=w(p + "attn_k.weight", (Hkv * hd, E)),
            wv=w(p + "attn_v.weight", (Hkv * hd, E)),
            q_norm=w(p + "attn_q_norm.weight", (hd,)), k_norm=w(p + "attn_k_norm.weight", (hd,)),
            wo=w(p + "attn_output.weight", (E, H * hd)),
            attn_post_norm=w(p + "post_attention_norm.weight", (E,)),
            ffn_norm=w(p + "ffn_norm.weight", (E,)),
            gate=w(p + "ffn_gate.weight", (F, E)), up=w(p + "ffn_up.weight", (F, E)),
            down=w(p + "ffn_down.weight", (E, F)),
            ffn_post_norm=w(p + "post_ffw_norm.weight", (E,)),
        )

    def forward(self, state, batch, rows=None, output="logits", check=None):
        ops, hp, N = self.ops, self.hp, batch.n
        x = ops.embed(self.tok_embd, batch.ids, scale=self.embd_scale)
        for i, (L, S) in enumerate(zip(self.layers, state.layers)):
            if check is not None:
                check()
            swa = self.is_swa[i]
            rope = dict(n_rot=hp.n_rot, neox=True,
                        base=self.rope_base_swa if swa else hp.rope_base,
                        freq_scale=1.0 if swa else hp.rope_scale)
            h = ops.rms_norm(x, L.attn_norm, hp.eps)
            q, k, v = ops.matmul_n(h, [L.wq, L.wk, L.wv])
            q = ops.rms_norm_rope(q.reshape(N, L.n_head, hp.head_dim), L.q_norm, hp.eps, batch.pos, **rope)
            k = ops.rms_norm_rope(k.reshape(N, L.n_head_kv, hp.head_dim), L.k_norm, hp.eps, batch.pos, **rope)
            v = v.reshape(N, L.n_head_kv, hp.head_dim)
            a = attention_block(ops, S, batch, q, k, v, scale=self.q_scale, window=self.window if swa else 0)
            # the residual adds come after the post-norms: not foldable into the matmuls
            x = ops.add(x, ops.rms_norm(ops.matmul(a, L.wo), L.attn_post_norm, hp.eps))
            h = ops.rms_norm(x, L.ffn_norm, hp.eps)
            f = ops.matmul(ops.matmul_glu(h, L.gate, L.up, act="gelu"), L.down)
            x = ops.add(x, ops.rms_norm(f, L.ffn_post_norm, hp.eps))
        if rows is not None:
            x = x[rows]
        x = ops.rms_norm(x, self.output_norm, hp.eps)
        if output == "hidden":
            return x
        logits = ops.matmul(x, self.output)
        return ops.softcap(logits, hp.final_softcap) if hp.final_softcap > 0 else logits
