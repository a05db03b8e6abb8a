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

from ..errors import ReflexError
from . import blocks
from .common import Decoder, same_head_dims
from .plan import Layer, T, example, keys, layer, opt


class Model(Decoder):
    KEYS = keys(optional=("attention.sliding_window", "attention.sliding_window_pattern", "rope.freq_base_swa"))
    EXAMPLES = {"gemma3": example({"block_count": 3, "rope.freq_base": 1e6, "attention.sliding_window": 3,
                                   "attention.sliding_window_pattern": 3, "rope.freq_base_swa": 10000.0,
                                   "final_logit_softcapping": 15.0})}

    @classmethod
    def dims(cls, hp):
        same_head_dims(hp)
        window = hp.int("attention.sliding_window", default=0, lo=0, hi=1 << 24)
        return Layer(E=hp.n_embd, window=window, layers=[
            Layer(n_head=h, n_head_kv=hkv, head_dim=hp.head_dim, n_ff=f, swa=swa)
            for h, hkv, f, swa in zip(hp.n_head_l, hp.n_head_kv_l, hp.n_ff_l, cls._swa_layers(hp, window))])

    @staticmethod
    def _swa_layers(hp, window):
        """Which layers use the sliding window: `attention.sliding_window_pattern` is an array
        of per-layer flags, or n (every n-th layer global; default 6)."""
        if window <= 0:
            return [False] * hp.n_layer
        flags = hp.layer_flags("attention.sliding_window_pattern")
        if flags is None:
            n = hp.int("attention.sliding_window_pattern", default=6, lo=0, hi=1 << 16)
            return [n == 0 or i % n < n - 1 for i in range(hp.n_layer)]
        if len(flags) < hp.n_layer:
            raise ReflexError("gguf_error", f"sliding_window_pattern has {len(flags)} entries "
                              f"for {hp.n_layer} layers")
        return flags[:hp.n_layer]

    @classmethod
    def plan(cls, d):
        E = d.E
        return [T("token_embd.weight", None, E), T("output_norm.weight", E), opt("output.weight", None, E),
                *(layer(i, T("attn_norm.weight", E),
                        T("attn_q.weight", L.n_head * L.head_dim, E), T("attn_k.weight", L.n_head_kv * L.head_dim, E),
                        T("attn_v.weight", L.n_head_kv * L.head_dim, E),
                        T("attn_q_norm.weight", L.head_dim), T("attn_k_norm.weight", L.head_dim),
                        T("attn_output.weight", E, L.n_head * L.head_dim), T("post_attention_norm.weight", E),
                        T("ffn_norm.weight", E), T("ffn_gate.weight", L.n_ff, E), T("ffn_up.weight", L.n_ff, E),
                        T("ffn_down.weight", E, L.n_ff), T("post_ffw_norm.weight", E))
                  for i, L in enumerate(d.layers))]

    def __init__(self, ops, f, lora=None):
        self._load(ops, f, lora)
        hp = self.hp
        rope_base_swa = hp.float("rope.freq_base_swa", default=10000.0, gt=0.0)
        for L in self.layers:
            L.rope = dict(n_rot=hp.n_rot, neox=True, base=rope_base_swa if L.swa else hp.rope_base,
                          freq_scale=1.0 if L.swa else hp.rope_scale)
        # queries scaled by 1/sqrt(n_embd / n_head) for the 62-layer (27B) model (llama.cpp's rule)
        self.q_scale = 1.0 / math.sqrt(hp.n_embd / hp.n_head if hp.n_layer == 62 else hp.head_dim)
        self.embd_scale = math.sqrt(hp.n_embd)

    def forward(self, state, batch, rows=None, output="logits", check=None):
        ops, hp, eps = self.ops, self.hp, self.hp.eps
        x = ops.embed(self.tok_embd, batch.ids, scale=self.embd_scale)
        for L, S in zip(self.layers, state.layers):
            if check is not None:
                check()
            blocks.attention(ops, x, L, S, batch, eps, rope=L.rope, scale=self.q_scale,
                             window=self.d.window if L.swa else 0, post_norm=L.post_attention_norm)
            blocks.ffn(ops, x, L, eps, "gelu", post_norm=L.post_ffw_norm)
        return blocks.head(ops, x, self.output_norm, self.output, eps, rows, output, softcap=hp.final_softcap)
