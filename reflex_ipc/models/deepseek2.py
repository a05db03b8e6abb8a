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
from types import SimpleNamespace

from ..backends.base import MLA_OPS
from ..errors import ReflexError
from ..runtime.state import SlotSpec, State
from .common import MOE_CAPTURABLE, HParams, Weights, residual

GATING = {0: "softmax", 1: "softmax", 2: "sigmoid"}  # llama.cpp's expert_gating_func (0: unset)


def _bad(key, msg):
    return ReflexError("gguf_error", f"metadata key {key}: {msg}")


class Model:
    capturable = MOE_CAPTURABLE

    def __init__(self, ops, f, lora=None):
        missing = [op for op in MLA_OPS if not callable(getattr(ops, op, None))]
        if missing:
            raise ReflexError("unsupported_architecture", f"deepseek2 (latent attention) needs ops the "
                              f"{ops.name} backend lacks ({', '.join(missing)}); use --device numpy")
        self.ops = ops
        self.hp = hp = HParams(f, rope_scalings=("none", "linear", "yarn"))
        a = hp.arch
        self._read_attention_keys(f)
        self._read_moe_keys(f)
        self._rope_setup()
        w = Weights(ops, f, lora)
        self.tok_embd = w("token_embd.weight", (None, hp.n_embd))
        self.output_norm = w("output_norm.weight", (hp.n_embd,))
        self.output = w.output(hp.n_embd)
        if hp.float("attention.temperature_scale", default=0.0) != 0.0:
            raise ReflexError("unsupported_architecture", f"metadata key {a}.attention.temperature_scale: "
                              "attention temperature tuning is not supported")
        self.layers = [self._load_layer(w, i) for i in range(hp.n_layer)]

    # -- hyperparameters ---------------------------------------------------------------
    def _read_attention_keys(self, f):
        hp, a = self.hp, self.hp.arch
        n_vocab = hp.n_vocab
        # llama.cpp's "lite" variants (V2-Lite and kin) have no q LoRA and no q_lora_rank key
        lite = hp.n_layer in (26, 27) or (hp.n_layer == 48 and n_vocab == 128256)
        self.q_lora = 0 if lite else hp.int("attention.q_lora_rank", required=True, lo=0, hi=1 << 16)
        self.R = hp.int("attention.kv_lora_rank", required=True, lo=1, hi=1 << 16)
        k_mla = hp.int("attention.key_length_mla", default=0, lo=0, hi=1 << 12)
        v_mla = hp.int("attention.value_length_mla", default=0, lo=0, hi=1 << 12)
        if not (k_mla and v_mla):
            raise ReflexError("unsupported_architecture", f"metadata key {a}.attention.key_length_mla / "
                              "value_length_mla missing: a legacy deepseek2 file with a fused attn_kv_b "
                              "(re-convert it with a current converter)")
        self.r = hp.n_rot
        self.nope, self.v_dim = k_mla - self.r, v_mla
        if self.nope < 1:
            raise _bad(f"{a}.attention.key_length_mla", f"{k_mla} leaves no non-rope dims beside {self.r}")
        # value_length may be absent (llama.cpp loads such files; the latent's width is R)
        has_v = f.metadata.get(f"{a}.attention.value_length") is not None
        if hp.head_dim != self.R + self.r or (has_v and hp.head_dim_v != self.R):
            raise _bad(f"{a}.attention.key_length", f"key/value length {hp.head_dim}/{hp.head_dim_v}, "
                       f"expected kv_lora_rank + rope dims = {self.R + self.r} / {self.R}")
        if any(h != 1 for h in hp.n_head_kv_l):
            raise _bad(f"{a}.attention.head_count_kv", "latent attention has one KV head")

    def _read_moe_keys(self, f):
        hp, a = self.hp, self.hp.arch
        self.n_dense = hp.int("leading_dense_block_count", default=0, lo=0, hi=hp.n_layer)
        moe = self.n_dense < hp.n_layer
        self.n_expert = hp.int("expert_count", required=moe, default=0, lo=1 if moe else 0, hi=1 << 12)
        used = hp.per_layer("expert_used_count", required=moe, default=0, lo=1 if moe else 0,
                            hi=self.n_expert)
        self.n_used = used[0]  # llama.cpp's graph routes every layer with layer 0's count
        if len(set(used)) > 1:
            raise ReflexError("unsupported_architecture", f"metadata key {a}.expert_used_count: "
                              f"different counts per layer {used} are not supported")
        self.n_ff_exp = hp.per_layer("expert_feed_forward_length", required=moe, default=0, lo=1 if moe else 0,
                                     hi=1 << 20)[0]
        self.n_shared = hp.int("expert_shared_count", required=moe, default=0, lo=0, hi=1 << 10)
        self.w_scale = hp.float("expert_weights_scale", default=0.0, lo=0.0)
        self.w_norm = hp.bool("expert_weights_norm", default=False)
        g = hp.int("expert_gating_func", default=0, lo=0, hi=1 << 16)
        if g not in GATING:
            kind = "unsupported_architecture" if g in (3, 4) else "gguf_error"
            raise ReflexError(kind, f"metadata key {a}.expert_gating_func: gating function {g} is not "
                              f"supported (1 softmax, 2 sigmoid)")
        if g == 0 and hp.n_layer in (47, 48) and hp.n_vocab == 154880:
            g = 2  # llama.cpp's default for GLM-4.7-Lite files without the key
        self.gating = GATING[g]
        n_groups = hp.int("expert_group_count", default=0, lo=0, hi=1 << 12)
        n_group_used = hp.int("expert_group_used_count", default=0, lo=0, hi=1 << 12)
        self.groups = None
        if n_groups > 1:
            if self.n_expert % n_groups or not 0 < n_group_used < n_groups or n_groups >= self.n_expert:
                raise _bad(f"{a}.expert_group_count", f"{self.n_expert} experts in {n_groups} groups, "
                           f"{n_group_used} used")
            self.groups = (n_groups, n_group_used)

    def _rope_setup(self):
        """The rope arguments and the score scale, as llama.cpp derives them (llama-context's
        yarn_attn_factor, then the deepseek2 graph's mscale)."""
        hp = self.hp
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
        self.scale = m * m / math.sqrt(self.nope + self.r)
        self.rope = dict(n_rot=self.r, base=hp.rope_base, freq_scale=fs, neox=False, mscale=attn,
                         yarn=(ext, n_ctx_orig, 32.0, 1.0) if ext else None)

    # -- weights -------------------------------------------------------------------------
    def _load_layer(self, w, i):
        hp, p, ops = self.hp, f"blk.{i}.", self.ops
        E, H, R, r = hp.n_embd, hp.n_head_l[i], self.R, self.r
        qd = self.nope + r
        L = SimpleNamespace(n_head=H, attn_norm=w(p + "attn_norm.weight", (E,)),
                            ffn_norm=w(p + "ffn_norm.weight", (E,)))
        if self.q_lora:
            L.wq_a = w(p + "attn_q_a.weight", (self.q_lora, E))
            L.q_a_norm = w(p + "attn_q_a_norm.weight", (self.q_lora,))
            L.wq = w(p + "attn_q_b.weight", (H * qd, self.q_lora))
        else:
            L.wq_a, L.wq = None, w(p + "attn_q.weight", (H * qd, E))
        if w.has(p + "attn_kv_b.weight") and not w.has(p + "attn_k_b.weight"):
            raise ReflexError("unsupported_architecture", f"tensor {p}attn_kv_b.weight: a legacy fused k/v "
                              "up-projection (current converters write attn_k_b / attn_v_b)")
        kv_a = w(p + "attn_kv_a_mqa.weight", (R + r, E))
        L.w_c, L.w_pe = ops.weight_rows(kv_a, 0, R), ops.weight_rows(kv_a, R, r)
        L.kv_a_norm = w(p + "attn_kv_a_norm.weight", (R,))
        L.wk_b = w(p + "attn_k_b.weight", (H, R, self.nope))
        L.wv_b = w(p + "attn_v_b.weight", (H, self.v_dim, R))
        L.wo = w(p + "attn_output.weight", (E, H * self.v_dim))
        if i < self.n_dense:
            F = hp.n_ff_l[i]
            L.moe = False
            L.gate, L.up = w(p + "ffn_gate.weight", (F, E)), w(p + "ffn_up.weight", (F, E))
            L.down = w(p + "ffn_down.weight", (E, F))
            return L
        X, Fe, S = self.n_expert, self.n_ff_exp, self.n_ff_exp * self.n_shared
        L.moe = True
        L.router = w(p + "ffn_gate_inp.weight", (X, E))
        L.probs_b = w(p + "exp_probs_b.bias", (X,), optional=True)
        L.gate_exps = w(p + "ffn_gate_exps.weight", (X, Fe, E))
        L.up_exps = w(p + "ffn_up_exps.weight", (X, Fe, E))
        L.down_exps = w(p + "ffn_down_exps.weight", (X, E, Fe))
        if not S and w.has(p + "ffn_gate_shexp.weight"):
            raise ReflexError("gguf_error", f"tensor '{p}ffn_gate_shexp.weight' is present but metadata key "
                              f"{hp.arch}.expert_shared_count is 0")
        L.gate_sh = w(p + "ffn_gate_shexp.weight", (S, E)) if S else None
        L.up_sh = w(p + "ffn_up_shexp.weight", (S, E)) if S else None
        L.down_sh = w(p + "ffn_down_shexp.weight", (E, S)) if S else None
        return L

    # -- state -----------------------------------------------------------------------------
    def state_spec(self):
        """One latent head per layer: [c (kv_lora_rank), rope(k_pe) (rope dims)] per slot."""
        # exact: float32 where the backend's KV cache is float16 (CUDA): the latent is both the keys
        # and the values of every head, and its f16 rounding moved system1 log-probs by up to
        # 7e-4 per token (issue 32 item 18)
        return [SlotSpec(kv=(1, None, self.R + self.r), exact=True) for _ in self.layers]

    def new_state(self, ops, n_slots, n_seq=1):
        return State(ops, self.state_spec(), n_slots, n_seq)

    def state_bytes(self, n_slots, itemsize=2):
        return State.nbytes(self.state_spec(), n_slots, 1, itemsize)

    # -- forward -----------------------------------------------------------------------------
    def _attention(self, h, L, S, batch):
        ops, hp, N, H = self.ops, self.hp, batch.n, L.n_head
        q = ops.matmul(h, L.wq) if L.wq_a is None else \
            ops.matmul(ops.rms_norm(ops.matmul(h, L.wq_a), L.q_a_norm, hp.eps), L.wq)
        q_nope, q_pe = ops.split(q.reshape(N, H, self.nope + self.r), [self.nope, self.r])
        q_pe = ops.rope(q_pe, batch.pos, inplace=True, **self.rope)
        q = ops.concat([ops.head_matmul(q_nope, L.wk_b), q_pe])  # [N, H, R + r]
        c, k_pe = ops.matmul_n(h, [L.w_c, L.w_pe])
        c = ops.rms_norm(c, L.kv_a_norm, hp.eps)
        k_pe = ops.rope(k_pe.reshape(N, 1, self.r), batch.pos, inplace=True, **self.rope)
        ops.kv_store(S.kv, None, ops.concat([c.reshape(N, 1, self.R), k_pe]), None, batch.slots)
        o = ops.attention(q, S.kv, None, batch.slots, batch.n_kv, scale=self.scale, v_dim=self.R,
                          **batch.attention_args(0))  # [N, H, R]
        return ops.head_matmul(o, L.wv_b).reshape(N, H * self.v_dim)

    def _ffn(self, x, h, L):
        ops = self.ops
        if not L.moe:
            residual(ops, x, ops.matmul_glu(h, L.gate, L.up, act="silu"), L.down)
            return
        ops.add(x, ops.moe(h, L.router, L.gate_exps, L.up_exps, L.down_exps, self.n_used, gating=self.gating,
                           norm=self.w_norm, scale=self.w_scale, selection_bias=L.probs_b, groups=self.groups),
                out=x)
        if L.gate_sh is not None:
            residual(ops, x, ops.matmul_glu(h, L.gate_sh, L.up_sh, act="silu"), L.down_sh)

    def forward(self, state, batch, rows=None, output="logits", check=None):
        ops, hp = self.ops, self.hp
        x = ops.embed(self.tok_embd, batch.ids)
        for L, S in zip(self.layers, state.layers):
            if check is not None:
                check()
            residual(ops, x, self._attention(ops.rms_norm(x, L.attn_norm, hp.eps), L, S, batch), L.wo)
            self._ffn(x, ops.rms_norm(x, L.ffn_norm, hp.eps), L)
        if rows is not None:
            x = x[rows]
        x = ops.rms_norm(x, self.output_norm, hp.eps)
        return x if output == "hidden" else ops.matmul(x, self.output)
