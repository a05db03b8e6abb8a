"""Granite 4.0-H (`granitehybrid`): Mamba-2 layers interleaved with attention, dense or MoE FFN.

A layer is recurrent exactly when its `attention.head_count_kv` is 0 (llama.cpp's rule).

- input embeddings times `embedding_scale`; each mixer's and each feed-forward's output times
  `residual_scale` before its residual add; logits divided by `logit_scale` (all optional);
- attention: q/k/v (optional biases), rope ("norm" pairs) unless `rope.scaling.finetuned` is
  false (the NoPE models), scale `attention.scale` or 1/sqrt(head_dim), output (+ bias);
- Mamba-2: `ssm_in` gives z, xBC and dt; a causal depthwise conv (`ssm_conv1d`, optional
  bias) with silu on xBC, split into x (`ssm.time_step_rank` heads of inner_size / heads),
  B and C (`ssm.group_count` groups of `ssm.state_size`); the selective scan (ops.ssm_scan)
  with dt = softplus(dt + ssm_dt.bias), A = `ssm_a`, the D skip; silu(z) gate; an RMSNorm per
  group (`ssm_norm`); `ssm_out`;
- feed-forward: SwiGLU (optional biases), or with `expert_count` > 0 a softmax-routed MoE
  (weights renormalized) plus an optional shared expert (`expert_shared_feed_forward_length`).

State: attention layers K/V slots; Mamba-2 layers a conv state [K-1, inner + 2 groups x state]
and an SSM state [heads, head_dim, state_size] per sequence.
"""

from types import SimpleNamespace

from ..backends.base import RECURRENT_OPS, require_ops, require_state_cols
from ..errors import ReflexError
from ..runtime.state import SeqSpec, State, attention_spec
from .common import (MAX_HEAD_DIM, MAX_HEADS, HParams, Weights, attention_block, bias, default_attn_scale,
                     moe_captured)


def _bad(key, msg):
    return ReflexError("gguf_error", f"metadata key {key}: {msg}")


class Model:
    def __init__(self, ops, f, lora=None):
        require_ops(ops, RECURRENT_OPS, f.architecture)
        self.ops = ops
        self.hp = hp = HParams(f, attention_free_layers=True)
        a = hp.arch
        self.recurrent = [h == 0 for h in hp.n_head_kv_l]
        self.d_conv = hp.int("ssm.conv_kernel", required=True, lo=2, hi=64)
        self.d_inner = hp.int("ssm.inner_size", required=True, lo=1, hi=1 << 20)
        self.d_state = hp.int("ssm.state_size", required=True, lo=1, hi=MAX_HEAD_DIM)
        self.n_ssm_head = hp.int("ssm.time_step_rank", required=True, lo=1, hi=MAX_HEADS)
        self.n_group = hp.int("ssm.group_count", required=True, lo=1, hi=MAX_HEADS)
        require_state_cols(ops, self.d_state, f"{a}.ssm.state_size")
        if self.d_inner % self.n_ssm_head:
            raise _bad(f"{a}.ssm.inner_size", f"{self.d_inner} is not a multiple of {self.n_ssm_head} heads")
        if self.n_ssm_head % self.n_group or self.d_inner % self.n_group:
            raise _bad(f"{a}.ssm.group_count", f"{self.n_ssm_head} heads / inner size {self.d_inner} cannot "
                       f"be split in {self.n_group} groups")
        if self.d_inner != 2 * hp.n_embd:
            raise _bad(f"{a}.ssm.inner_size", f"{self.d_inner} != 2 x embedding_length (llama.cpp supports "
                       f"only an expansion factor of 2)")
        if hp.head_dim_v != hp.head_dim:
            raise ReflexError("unsupported_architecture", f"key length {hp.head_dim} != value length {hp.head_dim_v}")
        self.embd_scale = hp.float("embedding_scale", default=0.0, lo=0.0) or 1.0
        self.res_scale = hp.float("residual_scale", default=0.0, lo=0.0) or 1.0
        self.logit_scale = hp.float("logit_scale", default=0.0, lo=0.0)
        self.use_rope = hp.bool("rope.scaling.finetuned", default=True)
        self.scale = default_attn_scale(hp)
        self.n_expert = hp.int("expert_count", default=0, lo=0, hi=1 << 12)
        self.n_used = hp.per_layer("expert_used_count", default=0, lo=0, hi=max(self.n_expert, 0))
        if self.n_expert and not all(self.n_used):
            raise _bad(f"{a}.expert_used_count", "0 experts used per token")
        self.n_ff_shexp = hp.int("expert_shared_feed_forward_length", default=0, lo=0, hi=1 << 20)
        # a decode step is captured in a CUDA graph unless its experts' routing waits for the device
        # (a backend without moe_capturable, or CUDA with REFLEX_CUDA_MOE=host)
        self.capturable = not self.n_expert or moe_captured(ops)
        w = Weights(ops, f, lora)  # its `dense` tensors (conv kernel, A, D, norm) are no matmul's: no LoRA
        self.tok_embd = w("token_embd.weight", (None, hp.n_embd))
        self.output_norm = w("output_norm.weight", (hp.n_embd,))
        self.output = w.output(hp.n_embd)
        self.rope_factors = w("rope_freqs.weight", (hp.n_rot // 2,), optional=True)
        self.layers = [self._load_layer(w, i) for i in range(hp.n_layer)]

    @property
    def conv_dim(self):
        return self.d_inner + 2 * self.n_group * self.d_state

    def _load_layer(self, w, i):
        hp, p, E, F = self.hp, f"blk.{i}.", self.hp.n_embd, self.hp.n_ff_l[i]
        L = SimpleNamespace(recurrent=self.recurrent[i], attn_norm=w(p + "attn_norm.weight", (E,)),
                            ffn_norm=w(p + "ffn_norm.weight", (E,)))
        if L.recurrent:
            H, di, cd = self.n_ssm_head, self.d_inner, self.conv_dim
            ssm_in = w(p + "ssm_in.weight", (2 * di + 2 * self.n_group * self.d_state + H, E))
            L.wz, L.wxbc, L.wdt = w.rows(ssm_in, 0, di), w.rows(ssm_in, di, cd), w.rows(ssm_in, di + cd, H)
            L.conv = w.dense(p + "ssm_conv1d.weight", (cd, self.d_conv))
            L.conv_b = w(p + "ssm_conv1d.bias", (cd,), optional=True)
            L.dt_bias = w(p + "ssm_dt.bias", (H,))
            L.A = w.dense(p + "ssm_a", (H, 1), as_shape=(H,))
            L.D = w.dense(p + "ssm_d", (H, 1), as_shape=(H,))
            L.norm = w.dense(p + "ssm_norm.weight", (self.n_group, di // self.n_group), as_shape=(di,))
            L.wo = w(p + "ssm_out.weight", (E, di))
        else:
            H, Hkv, hd = hp.n_head_l[i], hp.n_head_kv_l[i], hp.head_dim
            L.n_head, L.n_head_kv = H, Hkv
            L.wq, L.wk, L.wv = (w(p + "attn_q.weight", (H * hd, E)), w(p + "attn_k.weight", (Hkv * hd, E)),
                                w(p + "attn_v.weight", (Hkv * hd, E)))
            L.bq, L.bk, L.bv = (w(p + "attn_q.bias", (H * hd,), True), w(p + "attn_k.bias", (Hkv * hd,), True),
                                w(p + "attn_v.bias", (Hkv * hd,), True))
            L.wo, L.bo = w(p + "attn_output.weight", (E, H * hd)), w(p + "attn_output.bias", (E,), True)
        if self.n_expert:
            X = self.n_expert
            L.moe = dict(router=w(p + "ffn_gate_inp.weight", (X, E)),
                         w_gate=w(p + "ffn_gate_exps.weight", (X, F, E)), w_up=w(p + "ffn_up_exps.weight", (X, F, E)),
                         w_down=w(p + "ffn_down_exps.weight", (X, E, F)), n_used=self.n_used[i])
            if self.n_ff_shexp:
                Fs = self.n_ff_shexp
                L.sh = (w(p + "ffn_gate_shexp.weight", (Fs, E)), w(p + "ffn_up_shexp.weight", (Fs, E)),
                        w(p + "ffn_down_shexp.weight", (E, Fs)))
            elif w.has(p + "ffn_gate_shexp.weight"):  # silently unused otherwise; llama.cpp refuses too
                raise ReflexError("gguf_error", f"tensor '{p}ffn_gate_shexp.weight' is present but metadata "
                                  f"key {hp.arch}.expert_shared_feed_forward_length is missing or 0")
        else:
            L.gate, L.up, L.down = (w(p + "ffn_gate.weight", (F, E)), w(p + "ffn_up.weight", (F, E)),
                                    w(p + "ffn_down.weight", (E, F)))
            L.bg, L.bu, L.bd = (w(p + "ffn_gate.bias", (F,), True), w(p + "ffn_up.bias", (F,), True),
                                w(p + "ffn_down.bias", (E,), True))
        return L

    # -- state ---------------------------------------------------------------------------
    def state_spec(self):
        hp = self.hp
        P = self.d_inner // self.n_ssm_head
        return [SeqSpec(conv=(self.d_conv - 1, self.conv_dim), ssm=(self.n_ssm_head, P, self.d_state)) if r else
                attention_spec(hp.n_head_kv_l[i], hp.head_dim, hp.head_dim) for i, r in enumerate(self.recurrent)]

    def new_state(self, ops, n_slots, n_seq=1):
        return State(ops, self.state_spec(), n_slots, n_seq)

    def state_bytes(self, n_slots, itemsize=2):
        return State.nbytes(self.state_spec(), n_slots, 1, itemsize)

    # -- forward ---------------------------------------------------------------------------
    def forward(self, state, batch, rows=None, output="logits", check=None):
        ops, hp = self.ops, self.hp
        x = ops.embed(self.tok_embd, batch.ids, scale=self.embd_scale)
        for L, S in zip(self.layers, state.layers):
            if check is not None:
                check()
            h = ops.rms_norm(x, L.attn_norm, hp.eps)
            self._add(x, self._mamba2(L, S, h, batch) if L.recurrent else self._attention(L, S, h, batch))
            self._add(x, self._ffn(L, ops.rms_norm(x, L.ffn_norm, hp.eps)))
        if rows is not None:
            x = x[rows]
        x = ops.rms_norm(x, self.output_norm, hp.eps)
        if output == "hidden":
            return x
        logits = ops.matmul(x, self.output)
        return ops.scale(logits, 1.0 / self.logit_scale) if self.logit_scale else logits

    def _add(self, x, y):
        """x += residual_scale * y, in place."""
        self.ops.add(x, self.ops.scale(y, self.res_scale) if self.res_scale != 1.0 else y, out=x)

    def _attention(self, L, S, h, batch):
        ops, hp, N, hd = self.ops, self.hp, batch.n, self.hp.head_dim
        q, k, v = ops.matmul_n(h, [L.wq, L.wk, L.wv])
        q = bias(ops, q, L.bq).reshape(N, L.n_head, hd)
        k = bias(ops, k, L.bk).reshape(N, L.n_head_kv, hd)
        v = bias(ops, v, L.bv).reshape(N, L.n_head_kv, hd)
        if self.use_rope:
            rope = dict(n_rot=hp.n_rot, base=hp.rope_base, freq_scale=hp.rope_scale, freq_factors=self.rope_factors,
                        neox=False, inplace=True)
            q, k = ops.rope(q, batch.pos, **rope), ops.rope(k, batch.pos, **rope)
        a = attention_block(ops, S, batch, q, k, v, scale=self.scale)
        return bias(ops, ops.matmul(a, L.wo), L.bo)

    def _mamba2(self, L, S, h, batch):
        ops, N = self.ops, batch.n
        H, G, Ns, di = self.n_ssm_head, self.n_group, self.d_state, self.d_inner
        z, xbc, dt = ops.matmul_n(h, [L.wz, L.wxbc, L.wdt])
        xbc = bias(ops, ops.ssm_conv(xbc, S.conv, L.conv, batch.seqs), L.conv_b)
        xbc = ops.silu(xbc)
        xs = ops.columns(xbc, 0, di).reshape(N, H, di // H)
        B = ops.columns(xbc, di, G * Ns).reshape(N, G, Ns)
        C = ops.columns(xbc, di + G * Ns, G * Ns).reshape(N, G, Ns)
        dt = ops.softplus(ops.add(dt, L.dt_bias))
        y = ops.ssm_scan(xs, dt, L.A, B, C, S.ssm, batch.seqs, D=L.D).reshape(N, di)
        y = ops.swiglu(z, y)
        y = ops.rms_norm(y.reshape(N, G, di // G), None, self.hp.eps).reshape(N, di)
        return ops.matmul(ops.mul(y, L.norm), L.wo)

    def _ffn(self, L, h):
        ops = self.ops
        if self.n_expert:
            out = ops.moe(h, n_used=L.moe["n_used"], gating="softmax", norm=True, **{
                k: v for k, v in L.moe.items() if k != "n_used"})
            if self.n_ff_shexp:
                g, u, d = L.sh
                out = ops.add(out, ops.matmul(ops.matmul_glu(h, g, u, act="silu"), d))
            return out
        if L.bg is None and L.bu is None:
            f = ops.matmul_glu(h, L.gate, L.up, act="silu")
        else:
            f = ops.swiglu(bias(ops, ops.matmul(h, L.gate), L.bg), bias(ops, ops.matmul(h, L.up), L.bu))
        return bias(ops, ops.matmul(f, L.down), L.bd)
