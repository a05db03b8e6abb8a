"""Qwen3.5 (dense): Gated DeltaNet linear-attention layers interleaved with gated full attention.

Per layer (its kind from `attention.recurrent_layers`, an array of flags, else every
`full_attention_interval`-th layer (default 4) is full attention, as llama.cpp reads them):

- pre-norm, residual; then `post_attention_norm` before a SwiGLU feed-forward, residual;
- full attention: `attn_q` gives, per head, the query then an output gate (2 x head_dim)
  (or a fused `attn_qkv`: query+gate, k, v stacked by rows);
  per-head q/k RMSNorm, rope on the first `rope.dimension_count` dims of each head (partial,
  neox pairs: llama.cpp's interleaved multi-section rope, which for text positions, the same
  in every section, is exactly that), GQA attention scaled 1/sqrt(head_dim), times
  sigmoid(gate), `attn_output`;
- Gated DeltaNet: `attn_qkv` -> a causal depthwise conv (`ssm_conv1d`, kernel
  `ssm.conv_kernel`) with silu -> q, k (`ssm.group_count` heads) and v (`ssm.time_step_rank`
  heads) of `ssm.state_size` each; q, k L2-normalized; decay g = softplus(alpha + ssm_dt.bias)
  * ssm_a (ssm_a = -exp(A_log)), beta = sigmoid(ssm_beta x); the gated delta rule
  (ops.delta_net) with its state per sequence; RMSNorm(`ssm_norm`) times silu(`attn_gate` x),
  `ssm_out`.

State: attention layers K/V slots; DeltaNet layers a conv state [K-1, conv channels] and a
recurrent state [v heads, d, d] per sequence (runtime.state.SeqSpec). MTP layers
(`nextn_predict_layers`, stored after the trunk) are not run, as in llama.cpp's main graph.
"""

import math
from types import SimpleNamespace

from ..backends.base import (RECURRENT_OPS, delta_gates, delta_qkv, require_ops, require_state_cols, rms_norm_gate,
                             rms_norm_matmul_glu, rms_norm_matmul_n, sigmoid_gate, ssm_conv_silu)
from ..errors import ReflexError
from ..runtime.state import SeqSpec, State, attention_spec
from .common import MAX_HEAD_DIM, MAX_HEADS, HParams, Weights, attention_block, default_attn_scale, residual


def _bad(key, msg):
    return ReflexError("gguf_error", f"metadata key {key}: {msg}")


class Model:
    dense_ffn = True  # feed_forward_length required (HParams)

    def __init__(self, ops, f, lora=None):
        require_ops(ops, RECURRENT_OPS, f.architecture)
        self.ops = ops
        self.hp = hp = HParams(f, dense_ffn=self.dense_ffn)
        a = hp.arch
        nextn = hp.int("nextn_predict_layers", default=0, lo=0, hi=hp.n_layer - 1)
        self.n_layer = hp.n_layer - nextn
        self.d_conv = hp.int("ssm.conv_kernel", required=True, lo=2, hi=64)
        d_inner = hp.int("ssm.inner_size", required=True, lo=1, hi=1 << 20)
        self.d = hp.int("ssm.state_size", required=True, lo=1, hi=MAX_HEAD_DIM)
        self.n_v = hp.int("ssm.time_step_rank", required=True, lo=1, hi=MAX_HEADS)
        self.n_k = hp.int("ssm.group_count", required=True, lo=1, hi=MAX_HEADS)
        require_state_cols(ops, self.d, f"{a}.ssm.state_size")
        if d_inner != self.d * self.n_v:
            raise _bad(f"{a}.ssm.inner_size", f"{d_inner} != state_size {self.d} x time_step_rank {self.n_v} "
                       f"(value heads of the key width)")
        if self.n_v % self.n_k:
            raise _bad(f"{a}.ssm.group_count", f"{self.n_v} value heads cannot share {self.n_k} key heads")
        if hp.head_dim_v != hp.head_dim:
            raise ReflexError("unsupported_architecture", f"key length {hp.head_dim} != value length {hp.head_dim_v}")
        self.recurrent = self._layer_kinds(hp)
        self._rope_sections(hp)
        self.scale = default_attn_scale(hp)
        w = Weights(ops, f, lora)
        self.tok_embd = w("token_embd.weight", (None, hp.n_embd))
        self.output_norm = w("output_norm.weight", (hp.n_embd,))
        self.output = w.output(hp.n_embd)
        self.layers = [self._load_layer(w, i) for i in range(self.n_layer)]

    def _layer_kinds(self, hp):
        """Per trunk layer: True for Gated DeltaNet, False for full attention."""
        key = f"{hp.arch}.attention.recurrent_layers"
        flags = hp.layer_flags("attention.recurrent_layers")
        if flags is None:
            if hp.get("attention.recurrent_layers") is not None:
                raise _bad(key, "expected an array of per-layer flags")
            n = hp.int("full_attention_interval", default=4, lo=1, hi=1 << 16)
            return [(i + 1) % n != 0 for i in range(self.n_layer)]
        if len(flags) != hp.n_layer:
            raise _bad(key, f"{len(flags)} flags for {hp.n_layer} layers")
        return flags[:self.n_layer]

    def _rope_sections(self, hp):
        """`rope.dimension_sections` (required by llama.cpp): up to 4 counts of rotated pairs
        per position section, not all zero, at most n_rot / 2 in all. Text positions are the
        same in every section, so they do not change the rotation."""
        key = f"{hp.arch}.rope.dimension_sections"
        v = hp.get("rope.dimension_sections")
        if v is None:
            raise ReflexError("gguf_error", f"metadata key {key} is missing")
        v = v if isinstance(v, list) else [v]
        if not 1 <= len(v) <= 4 or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in v):
            raise _bad(key, f"expected up to 4 non-negative integers, got {v!r}")
        if not any(v[:3]) or sum(v) > hp.n_rot // 2:
            raise _bad(key, f"{v} does not fit the {hp.n_rot // 2} rotated pairs")

    def _load_layer(self, w, i):
        hp, p, E = self.hp, f"blk.{i}.", self.hp.n_embd
        L = SimpleNamespace(
            recurrent=self.recurrent[i],
            attn_norm=w(p + "attn_norm.weight", (E,)), post_norm=w(p + "post_attention_norm.weight", (E,)),
            **self._load_ffn(w, i))
        if L.recurrent:
            d, kd, vd = self.d, self.d * self.n_k, self.d * self.n_v
            L.conv_dim = 2 * kd + vd
            L.wqkv = w(p + "attn_qkv.weight", (L.conv_dim, E))
            L.wz = w(p + "attn_gate.weight", (vd, E))
            L.conv = w.dense(p + "ssm_conv1d.weight", (L.conv_dim, self.d_conv))
            L.dt_bias = w(p + "ssm_dt.bias", (self.n_v,))
            L.a = w(p + "ssm_a", (self.n_v,))
            L.wbeta = w(p + "ssm_beta.weight", (self.n_v, E))
            L.walpha = w(p + "ssm_alpha.weight", (self.n_v, E))
            L.norm = w(p + "ssm_norm.weight", (d,))
            L.wo = w(p + "ssm_out.weight", (E, vd))
        else:
            H, Hkv, hd = hp.n_head_l[i], hp.n_head_kv_l[i], hp.head_dim
            L.n_head, L.n_head_kv = H, Hkv
            if w.has(p + "attn_qkv.weight"):  # fused: query+gate, k, v stacked by rows
                qkv = w(p + "attn_qkv.weight", ((2 * H + 2 * Hkv) * hd, E))
                L.wq, L.wk, L.wv = (w.rows(qkv, 0, 2 * H * hd), w.rows(qkv, 2 * H * hd, Hkv * hd),
                                    w.rows(qkv, (2 * H + Hkv) * hd, Hkv * hd))
            else:
                L.wq = w(p + "attn_q.weight", (2 * H * hd, E))
                L.wk = w(p + "attn_k.weight", (Hkv * hd, E))
                L.wv = w(p + "attn_v.weight", (Hkv * hd, E))
            L.q_norm = w(p + "attn_q_norm.weight", (hd,))
            L.k_norm = w(p + "attn_k_norm.weight", (hd,))
            L.wo = w(p + "attn_output.weight", (E, H * hd))
        return L

    def _load_ffn(self, w, i):
        """The feed-forward's tensors of layer i (a SwiGLU here; qwen35moe: experts)."""
        p, E, F = f"blk.{i}.", self.hp.n_embd, self.hp.n_ff_l[i]
        return dict(gate=w(p + "ffn_gate.weight", (F, E)), up=w(p + "ffn_up.weight", (F, E)),
                    down=w(p + "ffn_down.weight", (E, F)))

    def _ffn(self, x, h, L):
        """x += the feed-forward of h (the post-attention-normed x), in place."""
        residual(self.ops, x, self.ops.matmul_glu(h, L.gate, L.up, act="silu"), L.down)

    # -- state ---------------------------------------------------------------------------
    def state_spec(self):
        hp, d = self.hp, self.d
        conv_dim = 2 * d * self.n_k + d * self.n_v
        return [SeqSpec(conv=(self.d_conv - 1, conv_dim), ssm=(self.n_v, d, d)) if r else
                attention_spec(hp.n_head_kv_l[i], hp.head_dim, hp.head_dim) for i, r in enumerate(self.recurrent)]

    def new_state(self, ops, n_slots, n_seq=1):
        return State(ops, self.state_spec(), n_slots, n_seq)

    def state_bytes(self, n_slots, itemsize=2):
        return State.nbytes(self.state_spec(), n_slots, 1, itemsize)

    # -- forward ---------------------------------------------------------------------------
    def forward(self, state, batch, rows=None, output="logits", check=None):
        ops, hp = self.ops, self.hp
        x = ops.embed(self.tok_embd, batch.ids)
        for L, S in zip(self.layers, state.layers):
            if check is not None:
                check()
            (self._delta_net if L.recurrent else self._attention)(x, L, S, batch)
            self._ffn_block(x, L)
        if rows is not None:
            x = x[rows]
        if output == "hidden":
            return ops.rms_norm(x, self.output_norm, hp.eps)
        return rms_norm_matmul_n(ops, x, self.output_norm, hp.eps, [self.output])[0]

    def _ffn_block(self, x, L):
        """x += the feed-forward of rms_norm(x, post_norm): the dense SwiGLU with the norm
        folded into its gate/up product; a subclass's own _ffn gets the normed x."""
        if type(self)._ffn is not Model._ffn:
            return self._ffn(x, self.ops.rms_norm(x, L.post_norm, self.hp.eps), L)
        g = rms_norm_matmul_glu(self.ops, x, L.post_norm, self.hp.eps, L.gate, L.up, act="silu")
        residual(self.ops, x, g, L.down)

    def _attention(self, x, L, S, batch):
        """x += the gated attention of rms_norm(x, attn_norm)."""
        ops, hp, N, hd = self.ops, self.hp, batch.n, self.hp.head_dim
        qg, k, v = rms_norm_matmul_n(ops, x, L.attn_norm, hp.eps, [L.wq, L.wk, L.wv])
        qg = qg.reshape(N, L.n_head, 2 * hd)
        rope = dict(n_rot=hp.n_rot, base=hp.rope_base, freq_scale=hp.rope_scale, neox=True)
        q = ops.rms_norm_rope(ops.columns(qg, 0, hd), L.q_norm, hp.eps, batch.pos, **rope)
        k = ops.rms_norm_rope(k.reshape(N, L.n_head_kv, hd), L.k_norm, hp.eps, batch.pos, **rope)
        a = attention_block(ops, S, batch, q, k, v.reshape(N, L.n_head_kv, hd), scale=self.scale)
        a = sigmoid_gate(ops, a, qg, hd, hd)  # a * sigmoid(the gate half of each head)
        residual(ops, x, a, L.wo)

    def _delta_net(self, x, L, S, batch):
        """x += the Gated DeltaNet mixer of rms_norm(x, attn_norm)."""
        ops, eps, N, d = self.ops, self.hp.eps, batch.n, self.d
        vd = d * self.n_v
        qkv, z = rms_norm_matmul_n(ops, x, L.attn_norm, eps, [L.wqkv, L.wz])
        b, alpha = rms_norm_matmul_n(ops, x, L.attn_norm, eps, [L.wbeta, L.walpha])
        g, beta = delta_gates(ops, alpha, L.dt_bias, L.a, b)
        c = ssm_conv_silu(ops, qkv, S.conv, L.conv, batch.seqs)
        q, k, v = delta_qkv(ops, c, self.n_k, self.n_v, d, eps)
        o = ops.delta_net(q, k, v, g, beta, S.ssm, batch.seqs, scale=1.0 / math.sqrt(d))
        o = rms_norm_gate(ops, o, L.norm, eps, z.reshape(N, self.n_v, d))
        residual(ops, x, o.reshape(N, vd), L.wo)
