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

from ..backends.base import RECURRENT_OPS, require_ops, require_state_cols
from ..errors import ReflexError
from ..runtime.state import SeqSpec, attention_spec
from . import blocks
from .common import MAX_HEAD_DIM, MAX_HEADS, Decoder, default_attn_scale, moe_captured, split_rows
from .plan import Layer, T, dense, example, keys, layer, opt, variant


def _bad(key, msg):
    return ReflexError("gguf_error", f"metadata key {key}: {msg}")


class Model(Decoder):
    KEYS = keys(required=("ssm.conv_kernel", "ssm.inner_size", "ssm.state_size", "ssm.time_step_rank",
                          "ssm.group_count"),
                optional=("embedding_scale", "residual_scale", "logit_scale", "rope.scaling.finetuned",
                          "expert_count", "expert_used_count", "expert_shared_feed_forward_length"))
    attention_free_layers = True
    # Mamba-2, attention, Mamba-2, attention, dense SwiGLU, rope, Granite's four scales; _moe: attention
    # first, MoE (4 experts, 2 used) with a shared expert, NoPE (rope.scaling.finetuned false)
    _GR = {"context_length": 512, "block_count": 4, "embedding_length": 64, "feed_forward_length": 128,
           "attention.head_count": 4, "attention.head_count_kv": [0, 2, 0, 2], "rope.freq_base": 10000.0,
           "attention.layer_norm_rms_epsilon": 1e-5, "ssm.conv_kernel": 4, "ssm.inner_size": 128, "ssm.state_size": 16,
           "ssm.time_step_rank": 8, "ssm.group_count": 2, "embedding_scale": 2.0, "residual_scale": 0.5,
           "logit_scale": 2.0, "attention.scale": 0.2, "rope.scaling.finetuned": True}
    EXAMPLES = {
        "granitehybrid": example({}, base=_GR, gain=4.0, embd_std=0.25, has=("ssm_conv1d.bias",)),
        "granitehybrid_moe": example({"attention.head_count_kv": [2, 0, 0, 2], "feed_forward_length": 32,
                                      "rope.scaling.finetuned": False, "expert_count": 4, "expert_used_count": 2,
                                      "expert_shared_feed_forward_length": 64}, base=_GR, gain=4.0, embd_std=0.25,
                                     seed=3, has=("ssm_conv1d.bias",)),
        "granitehybrid@q": variant("granitehybrid_moe", {"feed_forward_length": 256,
                                                         "expert_shared_feed_forward_length": 256}, quantize=True)}

    # -- hyperparameters ---------------------------------------------------------------------
    @classmethod
    def dims(cls, hp):
        a = hp.arch
        d = Layer(E=hp.n_embd, n_rot=hp.n_rot)
        d.d_conv = hp.int("ssm.conv_kernel", required=True, lo=2, hi=64)
        d.d_inner = di = hp.int("ssm.inner_size", required=True, lo=1, hi=1 << 20)
        d.d_state = hp.int("ssm.state_size", required=True, lo=1, hi=MAX_HEAD_DIM)
        d.n_head = H = hp.int("ssm.time_step_rank", required=True, lo=1, hi=MAX_HEADS)
        d.n_group = G = hp.int("ssm.group_count", required=True, lo=1, hi=MAX_HEADS)
        if di % H:
            raise _bad(f"{a}.ssm.inner_size", f"{di} is not a multiple of {H} heads")
        if H % G or di % G:
            raise _bad(f"{a}.ssm.group_count", f"{H} heads / inner size {di} cannot be split in {G} groups")
        if di != 2 * hp.n_embd:
            raise _bad(f"{a}.ssm.inner_size", f"{di} != 2 x embedding_length (llama.cpp supports "
                       f"only an expansion factor of 2)")
        if hp.head_dim_v != hp.head_dim:
            raise ReflexError("unsupported_architecture", f"key length {hp.head_dim} != value length {hp.head_dim_v}")
        d.conv_dim = di + 2 * G * d.d_state
        d.n_expert = hp.int("expert_count", default=0, lo=0, hi=1 << 12)
        used = hp.per_layer("expert_used_count", default=0, lo=0, hi=max(d.n_expert, 0))
        if d.n_expert and not all(used):
            raise _bad(f"{a}.expert_used_count", "0 experts used per token")
        d.n_ff_shexp = hp.int("expert_shared_feed_forward_length", default=0, lo=0, hi=1 << 20)
        # a layer is recurrent exactly when its head_count_kv is 0 (llama.cpp's rule)
        d.layers = [Layer(recurrent=hkv == 0, n_head=h, n_head_kv=hkv, head_dim=hp.head_dim, n_ff=f, n_used=u)
                    for h, hkv, f, u in zip(hp.n_head_l, hp.n_head_kv_l, hp.n_ff_l, used)]
        return d

    # -- tensors -------------------------------------------------------------------------------
    @classmethod
    def plan(cls, d):
        E = d.E
        return [T("token_embd.weight", None, E), T("output_norm.weight", E), opt("output.weight", None, E),
                opt("rope_freqs.weight", d.n_rot // 2),
                *(layer(i, T("attn_norm.weight", E), *(cls._mamba_plan(d) if L.recurrent else cls._attention_plan(d, L)),
                        T("ffn_norm.weight", E), *cls._ffn_plan(d, L))
                  for i, L in enumerate(d.layers))]

    @staticmethod
    def _mamba_plan(d):
        E, H, G, di, cd = d.E, d.n_head, d.n_group, d.d_inner, d.conv_dim
        return (T("ssm_in.weight", 2 * di + 2 * G * d.d_state + H, E), dense("ssm_conv1d.weight", cd, d.d_conv),
                opt("ssm_conv1d.bias", cd), T("ssm_dt.bias", H), dense("ssm_a", H, 1, as_shape=(H,)),
                dense("ssm_d", H, 1, as_shape=(H,)), dense("ssm_norm.weight", G, di // G, as_shape=(di,)),
                T("ssm_out.weight", E, di))

    @staticmethod
    def _attention_plan(d, L):
        E, H, Hkv, hd = d.E, L.n_head, L.n_head_kv, L.head_dim
        return (T("attn_q.weight", H * hd, E), T("attn_k.weight", Hkv * hd, E), T("attn_v.weight", Hkv * hd, E),
                opt("attn_q.bias", H * hd), opt("attn_k.bias", Hkv * hd), opt("attn_v.bias", Hkv * hd),
                T("attn_output.weight", E, H * hd), opt("attn_output.bias", E))

    @staticmethod
    def _ffn_plan(d, L):
        E, F, X, Fs = d.E, L.n_ff, d.n_expert, d.n_ff_shexp
        if not X:
            return (T("ffn_gate.weight", F, E), T("ffn_up.weight", F, E), T("ffn_down.weight", E, F),
                    opt("ffn_gate.bias", F), opt("ffn_up.bias", F), opt("ffn_down.bias", E))
        return (T("ffn_gate_inp.weight", X, E), T("ffn_gate_exps.weight", X, F, E), T("ffn_up_exps.weight", X, F, E),
                T("ffn_down_exps.weight", X, E, F),
                *((T("ffn_gate_shexp.weight", Fs, E), T("ffn_up_shexp.weight", Fs, E),
                   T("ffn_down_shexp.weight", E, Fs)) if Fs else ()))

    def __init__(self, ops, f, lora=None):
        require_ops(ops, RECURRENT_OPS, f.architecture)
        require_state_cols(ops, self.hparams(f).int("ssm.state_size", required=True), f"{f.architecture}.ssm.state_size")
        t = self._load(ops, f, lora)  # its dense tensors (conv kernel, A, D, norm) are no matmul's: no LoRA
        hp, d = self.hp, self.d
        if d.n_expert and not d.n_ff_shexp and any(n.endswith(".ffn_gate_shexp.weight") for n in f.tensors):
            # silently unused otherwise; llama.cpp refuses such a file too (issue 32 item 15)
            raise ReflexError("gguf_error", f"tensor 'ffn_gate_shexp.weight' is present but metadata key "
                              f"{hp.arch}.expert_shared_feed_forward_length is missing or 0")
        self.embd_scale = hp.float("embedding_scale", default=0.0, lo=0.0) or 1.0
        self.res_scale = hp.float("residual_scale", default=0.0, lo=0.0) or 1.0
        logit_scale = hp.float("logit_scale", default=0.0, lo=0.0)
        self.out_scale = 1.0 / logit_scale if logit_scale else 1.0
        self.rope = dict(n_rot=hp.n_rot, base=hp.rope_base, freq_scale=hp.rope_scale, freq_factors=t.rope_freqs,
                         neox=False) if hp.bool("rope.scaling.finetuned", default=True) else None
        self.scale = default_attn_scale(hp)
        # a decode step is captured in a CUDA graph unless its experts' routing waits for the device
        # (a backend without moe_capturable, or CUDA with REFLEX_CUDA_MOE=host)
        self.capturable = not d.n_expert or moe_captured(ops)
        for L in self.layers:
            if L.recurrent:
                L.ssm_in_z, L.ssm_in_xbc, L.ssm_in_dt = split_rows(ops, L.ssm_in, [d.d_inner, d.conv_dim, d.n_head])

    # -- state ---------------------------------------------------------------------------
    def state_spec(self):
        d = self.d
        return [SeqSpec(conv=(d.d_conv - 1, d.conv_dim), ssm=(d.n_head, d.d_inner // d.n_head, d.d_state))
                if L.recurrent else attention_spec(L.n_head_kv, L.head_dim, L.head_dim) for L in self.layers]

    # -- forward ---------------------------------------------------------------------------
    def forward(self, state, batch, rows=None, output="logits", check=None):
        ops, d, eps, s = self.ops, self.d, self.hp.eps, self.res_scale
        x = ops.embed(self.tok_embd, batch.ids, scale=self.embd_scale)
        for L, S in zip(self.layers, state.layers):
            if check is not None:
                check()
            if L.recurrent:
                blocks.mamba2(ops, x, L, S, batch, eps, n_head=d.n_head, n_group=d.n_group, d_state=d.d_state,
                              d_inner=d.d_inner, res_scale=s)
            else:
                blocks.attention(ops, x, L, S, batch, eps, rope=self.rope, scale=self.scale, res_scale=s)
            if d.n_expert:
                blocks.moe(ops, ops.rms_norm(x, L.ffn_norm, eps), L, L.n_used, gating="softmax", norm=True, res=x,
                           res_scale=s)
            else:
                blocks.ffn(ops, x, L, eps, res_scale=s)
        return blocks.head(ops, x, self.output_norm, self.output, eps, rows, output, scale=self.out_scale)
