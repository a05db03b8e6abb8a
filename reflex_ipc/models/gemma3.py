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

from .common import HParams, Weights, attention_block


class Model:
    def __init__(self, ops, f):
        self.ops = ops
        self.hp = hp = HParams(f)
        w = Weights(ops, f)
        self.tok_embd = w("token_embd.weight")
        self.output_norm = w("output_norm.weight")
        self.output = w.output()
        self.window = int(hp.get("attention.sliding_window", 0) or 0)
        pattern = hp.get("attention.sliding_window_pattern", 6)
        if self.window <= 0:
            self.is_swa = [False] * hp.n_layer
        elif isinstance(pattern, list):
            if len(pattern) < hp.n_layer:
                from ..errors import ReflexError

                raise ReflexError("gguf_error", f"sliding_window_pattern has {len(pattern)} entries "
                                  f"for {hp.n_layer} layers")
            self.is_swa = [bool(x) for x in pattern[:hp.n_layer]]
        else:
            n = int(pattern)
            self.is_swa = [n == 0 or i % n < n - 1 for i in range(hp.n_layer)]
        self.rope_base_swa = float(hp.get("rope.freq_base_swa", 10000.0))
        if hp.n_layer == 62:
            self.q_scale = 1.0 / math.sqrt(hp.n_embd / hp.n_head)
        else:
            self.q_scale = 1.0 / math.sqrt(hp.head_dim)
        self.embd_scale = math.sqrt(hp.n_embd)
        self.layers = [self._load_layer(w, f"blk.{i}.") for i in range(hp.n_layer)]

    def _load_layer(self, w, p):
        return SimpleNamespace(
            attn_norm=w(p + "attn_norm.weight"),
            wq=w(p + "attn_q.weight"), wk=w(p + "attn_k.weight"), wv=w(p + "attn_v.weight"),
            q_norm=w(p + "attn_q_norm.weight"), k_norm=w(p + "attn_k_norm.weight"),
            wo=w(p + "attn_output.weight"), attn_post_norm=w(p + "post_attention_norm.weight"),
            ffn_norm=w(p + "ffn_norm.weight"),
            gate=w(p + "ffn_gate.weight"), up=w(p + "ffn_up.weight"), down=w(p + "ffn_down.weight"),
            ffn_post_norm=w(p + "post_ffw_norm.weight"),
        )

    def forward(self, cache, batch, rows=None, output="logits", check=None):
        ops, hp, N = self.ops, self.hp, batch.n
        x = ops.embed(self.tok_embd, batch.ids, scale=self.embd_scale)
        for i, L in enumerate(self.layers):
            if check is not None:
                check()
            swa = self.is_swa[i]
            rope = dict(n_rot=hp.n_rot, neox=True,
                        base=self.rope_base_swa if swa else hp.rope_base,
                        freq_scale=1.0 if swa else hp.rope_scale)
            h = ops.rms_norm(x, L.attn_norm, hp.eps)
            q, k, v = ops.matmul_n(h, [L.wq, L.wk, L.wv])
            q = ops.rms_norm_rope(q.reshape(N, hp.n_head, hp.head_dim), L.q_norm, hp.eps, batch.pos, **rope)
            k = ops.rms_norm_rope(k.reshape(N, hp.n_head_kv, hp.head_dim), L.k_norm, hp.eps, batch.pos, **rope)
            v = v.reshape(N, hp.n_head_kv, hp.head_dim)
            a = attention_block(ops, hp, cache, i, batch, q, k, v, scale=self.q_scale,
                                window=self.window if swa else 0)
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
