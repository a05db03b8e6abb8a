"""DeepSeek-V2/V3 (llama.cpp's `deepseek2`): multi-head latent attention (MLA) and a
mixture-of-experts feed-forward with shared experts.

Attention, per layer (R = kv_lora_rank, r = rope.dimension_count, the rope part of each head):
- q from `attn_q` (V2-Lite), or through a LoRA: attn_q_b(rms_norm(attn_q_a(h))) (q_lora_rank
  > 0); per head [nope, r] with nope = key_length_mla - r;
- `attn_kv_a_mqa` gives the latent c [R] (RMS-normed by attn_kv_a_norm) and one shared
  rope key k_pe [r]; the state stores only [c, rope(k_pe)] per token (R + r numbers: a
  SlotSpec `kv` of one head, never expanded K/V);
- the absorbed form: q_nope goes through attn_k_b (per head [R, nope]) into the latent
  space, scores = scale * ([q_nope k_b, rope(q_pe)] . [c, k_pe]) over the one latent head,
  values = the latents c, and each head's output goes through attn_v_b ([v, R]) then
  attn_output. This is the form current converters write (attn_k_b / attn_v_b, with
  key_length_mla / value_length_mla); a legacy file with a fused attn_kv_b is refused.
- rope "norm" (pairs 2i, 2i+1) with YaRN when rope.scaling.type is yarn, and DeepSeek's
  mscale: llama.cpp scales the scores by mscale^2 / sqrt(key_length_mla), mscale =
  attn_factor_org * (1 + 0.1 * yarn_log_multiplier * ln(factor)).

Feed-forward: the first `leading_dense_block_count` layers are dense SwiGLU; the others
route `expert_used_count` of `expert_count` experts (softmax gating for V2, sigmoid with
the selection bias `exp_probs_b` for V3, optionally among the best `expert_group_used_count`
of `expert_group_count` groups), weights normalized (`expert_weights_norm`) and scaled
(`expert_weights_scale`), plus `expert_shared_count` always-on shared experts.
"""

import math

from ..backends.base import MLA_OPS
from ..errors import ReflexError
from ..runtime.state import SlotSpec
from . import blocks
from .common import MOE_CAPTURABLE, Decoder, split_rows
from .plan import Layer, T, example, keys, layer, opt, variant

GATING = {0: "softmax", 1: "softmax", 2: "sigmoid"}  # llama.cpp's expert_gating_func (0: unset)


def _bad(key, msg):
    return ReflexError("gguf_error", f"metadata key {key}: {msg}")


class Model(Decoder):
    KEYS = keys(required=("attention.kv_lora_rank",),
                optional=("attention.q_lora_rank", "attention.key_length_mla", "attention.value_length_mla",
                          "leading_dense_block_count", "expert_count", "expert_used_count",
                          "expert_feed_forward_length", "expert_shared_count", "expert_weights_scale",
                          "expert_weights_norm", "expert_gating_func", "expert_group_count",
                          "expert_group_used_count", "rope.scaling.yarn_log_multiplier", "rope.scaling.attn_factor",
                          "rope.scaling.original_context_length", "attention.temperature_scale"))
    rope_scalings = ("none", "linear", "yarn")
    capturable = MOE_CAPTURABLE
    # V2-Lite-like: plain attn_q, softmax gating, one leading dense layer, YaRN; V3-like: q LoRA,
    # sigmoid gating with a selection bias, grouped routing, a weight scale
    _MLA = {"block_count": 3, "attention.head_count_kv": 1, "attention.key_length": 24, "attention.value_length": 16,
            "attention.key_length_mla": 16, "attention.value_length_mla": 12, "rope.dimension_count": 8,
            "attention.q_lora_rank": 0, "attention.kv_lora_rank": 16, "leading_dense_block_count": 1,
            "expert_count": 8, "expert_used_count": 2, "expert_feed_forward_length": 16, "expert_shared_count": 1}
    EXAMPLES = {
        "deepseek2_v2": example({**_MLA, "expert_gating_func": 1, "expert_weights_norm": False,
                                 "expert_weights_scale": 1.0, "rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
                                 "rope.scaling.yarn_log_multiplier": 0.0707,
                                 "rope.scaling.original_context_length": 32}, has=("output.weight",)),
        "deepseek2_v3": example({**_MLA, "attention.value_length_mla": 8, "attention.q_lora_rank": 24,
                                 "expert_used_count": 3, "expert_gating_func": 2, "expert_weights_norm": True,
                                 "expert_weights_scale": 2.5, "expert_group_count": 4, "expert_group_used_count": 2,
                                 "rope.scaling.type": "yarn", "rope.scaling.factor": 8.0,
                                 "rope.scaling.yarn_log_multiplier": 0.1, "rope.scaling.original_context_length": 16},
                                has=("output.weight", "exp_probs_b.bias")),
        "deepseek2@q": variant("deepseek2_v3", {"feed_forward_length": 256, "expert_feed_forward_length": 256},
                               quantize=True)}

    # -- hyperparameters ---------------------------------------------------------------
    @classmethod
    def dims(cls, hp):
        d = Layer(E=hp.n_embd)
        cls._attention_keys(hp, d)
        cls._moe_keys(hp, d)
        cls._rope_setup(hp, d)
        if hp.float("attention.temperature_scale", default=0.0) != 0.0:
            raise ReflexError("unsupported_architecture", f"metadata key {hp.arch}.attention.temperature_scale: "
                              "attention temperature tuning is not supported")
        d.layers = [Layer(n_head=H, moe=i >= d.n_dense, n_ff=hp.n_ff_l[i]) for i, H in enumerate(hp.n_head_l)]
        return d

    @staticmethod
    def _attention_keys(hp, d):
        a = hp.arch
        # llama.cpp's "lite" variants (V2-Lite and kin) have no q LoRA and no q_lora_rank key
        lite = hp.n_layer in (26, 27) or (hp.n_layer == 48 and hp.n_vocab == 128256)
        d.q_lora = 0 if lite else hp.int("attention.q_lora_rank", required=True, lo=0, hi=1 << 16)
        d.R = hp.int("attention.kv_lora_rank", required=True, lo=1, hi=1 << 16)
        k_mla = hp.int("attention.key_length_mla", default=0, lo=0, hi=1 << 12)
        v_mla = hp.int("attention.value_length_mla", default=0, lo=0, hi=1 << 12)
        if not (k_mla and v_mla):
            raise ReflexError("unsupported_architecture", f"metadata key {a}.attention.key_length_mla / "
                              "value_length_mla missing: a legacy deepseek2 file with a fused attn_kv_b "
                              "(re-convert it with a current converter)")
        d.r = hp.n_rot
        d.nope, d.v_dim = k_mla - d.r, v_mla
        if d.nope < 1:
            raise _bad(f"{a}.attention.key_length_mla", f"{k_mla} leaves no non-rope dims beside {d.r}")
        # value_length may be absent (llama.cpp loads such files; the latent's width is R)
        has_v = hp._f.metadata.get(f"{a}.attention.value_length") is not None
        if hp.head_dim != d.R + d.r or (has_v and hp.head_dim_v != d.R):
            raise _bad(f"{a}.attention.key_length", f"key/value length {hp.head_dim}/{hp.head_dim_v}, "
                       f"expected kv_lora_rank + rope dims = {d.R + d.r} / {d.R}")
        if any(h != 1 for h in hp.n_head_kv_l):
            raise _bad(f"{a}.attention.head_count_kv", "latent attention has one KV head")

    @staticmethod
    def _moe_keys(hp, d):
        a = hp.arch
        d.n_dense = hp.int("leading_dense_block_count", default=0, lo=0, hi=hp.n_layer)
        moe = d.n_dense < hp.n_layer
        d.n_expert = hp.int("expert_count", required=moe, default=0, lo=1 if moe else 0, hi=1 << 12)
        used = hp.per_layer("expert_used_count", required=moe, default=0, lo=1 if moe else 0, hi=d.n_expert)
        d.n_used = used[0]  # llama.cpp's graph routes every layer with layer 0's count
        if len(set(used)) > 1:
            raise ReflexError("unsupported_architecture", f"metadata key {a}.expert_used_count: "
                              f"different counts per layer {used} are not supported")
        d.n_ff_exp = hp.per_layer("expert_feed_forward_length", required=moe, default=0, lo=1 if moe else 0,
                                  hi=1 << 20)[0]
        d.n_shared = hp.int("expert_shared_count", required=moe, default=0, lo=0, hi=1 << 10)
        d.w_scale = hp.float("expert_weights_scale", default=0.0, lo=0.0)
        d.w_norm = hp.bool("expert_weights_norm", default=False)
        g = hp.int("expert_gating_func", default=0, lo=0, hi=1 << 16)
        if g not in GATING:
            kind = "unsupported_architecture" if g in (3, 4) else "gguf_error"
            raise ReflexError(kind, f"metadata key {a}.expert_gating_func: gating function {g} is not "
                              f"supported (1 softmax, 2 sigmoid)")
        if g == 0 and hp.n_layer in (47, 48) and hp.n_vocab == 154880:
            g = 2  # llama.cpp's default for GLM-4.7-Lite files without the key
        d.gating = GATING[g]
        n_groups = hp.int("expert_group_count", default=0, lo=0, hi=1 << 12)
        n_group_used = hp.int("expert_group_used_count", default=0, lo=0, hi=1 << 12)
        d.groups = None
        if n_groups > 1:
            if d.n_expert % n_groups or not 0 < n_group_used < n_groups or n_groups >= d.n_expert:
                raise _bad(f"{a}.expert_group_count", f"{d.n_expert} experts in {n_groups} groups, "
                           f"{n_group_used} used")
            d.groups = (n_groups, n_group_used)

    @staticmethod
    def _rope_setup(hp, d):
        """The rope arguments and the score scale, as llama.cpp derives them (llama-context's
        yarn_attn_factor, then the deepseek2 graph's mscale)."""
        log_mul = hp.float("rope.scaling.yarn_log_multiplier", default=0.0) / 0.1
        rope_attn = hp.float("rope.scaling.attn_factor", default=1.0, gt=0.0)
        fs = 1.0 if hp.rope_scaling == "none" else hp.rope_scale
        ext = 1.0 if hp.rope_scaling == "yarn" else 0.0
        n_ctx_orig = hp.int("rope.scaling.original_context_length", default=hp.n_ctx_train, lo=0, hi=1 << 24) \
            or hp.n_ctx_train
        attn = 1.0
        if ext:
            factor = 1.0 / fs

            def mscale(m):
                return 1.0 if factor <= 1.0 else 0.1 * m * math.log(factor) + 1.0

            if log_mul:
                attn = mscale(log_mul) / mscale(log_mul)  # deepseek2: mscale = mscale_all_dim
            else:
                attn = mscale(1.0)
            attn /= 1.0 + 0.1 * math.log(factor)
        attn *= rope_attn
        attn_org = attn * (1.0 + 0.1 * math.log(1.0 / fs))
        m = attn_org * (1.0 + 0.1 * log_mul * math.log(1.0 / fs))
        d.scale = m * m / math.sqrt(d.nope + d.r)
        d.rope = dict(n_rot=d.r, base=hp.rope_base, freq_scale=fs, neox=False, mscale=attn,
                      yarn=(ext, n_ctx_orig, 32.0, 1.0) if ext else None)

    # -- tensors -------------------------------------------------------------------------
    @classmethod
    def plan(cls, d):
        E, R, r, X, Fe, S = d.E, d.R, d.r, d.n_expert, d.n_ff_exp, d.n_ff_exp * d.n_shared
        return [T("token_embd.weight", None, E), T("output_norm.weight", E), opt("output.weight", None, E),
                *(layer(i, T("attn_norm.weight", E),
                        *((T("attn_q_a.weight", d.q_lora, E), T("attn_q_a_norm.weight", d.q_lora),
                           T("attn_q_b.weight", L.n_head * (d.nope + r), d.q_lora)) if d.q_lora else
                          (T("attn_q.weight", L.n_head * (d.nope + r), E),)),
                        T("attn_kv_a_mqa.weight", R + r, E), T("attn_kv_a_norm.weight", R),
                        T("attn_k_b.weight", L.n_head, R, d.nope), T("attn_v_b.weight", L.n_head, d.v_dim, R),
                        T("attn_output.weight", E, L.n_head * d.v_dim), T("ffn_norm.weight", E),
                        *((T("ffn_gate_inp.weight", X, E), opt("exp_probs_b.bias", X),
                           T("ffn_gate_exps.weight", X, Fe, E), T("ffn_up_exps.weight", X, Fe, E),
                           T("ffn_down_exps.weight", X, E, Fe)) +
                          ((T("ffn_gate_shexp.weight", S, E), T("ffn_up_shexp.weight", S, E),
                            T("ffn_down_shexp.weight", E, S)) if S else ()) if L.moe else
                          (T("ffn_gate.weight", L.n_ff, E), T("ffn_up.weight", L.n_ff, E),
                           T("ffn_down.weight", E, L.n_ff))))
                  for i, L in enumerate(d.layers))]

    def __init__(self, ops, f, lora=None):
        missing = [op for op in MLA_OPS if not callable(getattr(ops, op, None))]
        if missing:
            raise ReflexError("unsupported_architecture", f"deepseek2 (latent attention) needs ops the "
                              f"{ops.name} backend lacks ({', '.join(missing)}); use --device numpy")
        for name in f.tensors:
            if name.endswith(".attn_kv_b.weight") and name.replace("attn_kv_b", "attn_k_b") not in f.tensors:
                raise ReflexError("unsupported_architecture", f"tensor {name}: a legacy fused k/v up-projection "
                                  "(current converters write attn_k_b / attn_v_b)")
        self._load(ops, f, lora)
        d = self.d
        for i, L in enumerate(self.layers):
            if L.moe and not d.n_shared and f"blk.{i}.ffn_gate_shexp.weight" in f.tensors:
                raise ReflexError("gguf_error", f"tensor 'blk.{i}.ffn_gate_shexp.weight' is present but metadata key "
                                  f"{self.hp.arch}.expert_shared_count is 0")
            L.kv_c, L.kv_pe = split_rows(ops, L.attn_kv_a_mqa, [d.R, d.r])

    # -- state -----------------------------------------------------------------------------
    def state_spec(self):
        """One latent head per layer: [c (kv_lora_rank), rope(k_pe) (rope dims)] per slot."""
        # exact: float32 where the backend's KV cache is float16 (CUDA): the latent is both the keys
        # and the values of every head, and its f16 rounding moved system1 log-probs by up to
        # 7e-4 per token (issue 32 item 18)
        return [SlotSpec(kv=(1, None, self.d.R + self.d.r), exact=True) for _ in self.layers]

    # -- forward -----------------------------------------------------------------------------
    def forward(self, state, batch, rows=None, output="logits", check=None):
        ops, d, eps = self.ops, self.d, self.hp.eps
        x = ops.embed(self.tok_embd, batch.ids)
        for L, S in zip(self.layers, state.layers):
            if check is not None:
                check()
            blocks.mla(ops, x, L, S, batch, eps, nope=d.nope, rope_dims=d.r, rank=d.R, v_dim=d.v_dim, rope=d.rope,
                       scale=d.scale)
            if L.moe:
                blocks.moe(ops, ops.rms_norm(x, L.ffn_norm, eps), L, d.n_used, gating=d.gating, norm=d.w_norm,
                           scale=d.w_scale, selection_bias=L.exp_probs_b_bias, groups=d.groups, res=x)
            else:
                blocks.ffn(ops, x, L, eps)
        return blocks.head(ops, x, self.output_norm, self.output, eps, rows, output)
