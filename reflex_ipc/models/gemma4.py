"""Gemma 4 (text): the gemma3 decoder with per-layer attention shapes, and optional experts.

- sliding-window and global layers from `attention.sliding_window_pattern` (an array of
  per-layer flags, required), each kind with its own head width (`attention.key_length` /
  `key_length_swa`), rope dims (`rope.dimension_count` / `dimension_count_swa`) and rope base
  (`rope.freq_base` / `rope.freq_base_swa`, the sliding ones unscaled); KV head counts
  per layer; neox rope; the global layers divide their frequencies by `rope_freqs`
  (one tensor shared by them, required as in llama.cpp);
- q and k RMS-normed per head (weights), v RMS-normed without a weight; a layer without
  attn_v uses its k projection (before the k norm) as v;
- attention scores are not scaled (scale 1: the norms take that role);
- sandwich norms around attention and the GeGLU feed-forward; an optional per-layer
  scalar `layer_output_scale` multiplies the layer's output (the residual stream);
- embeddings times sqrt(n_embd), final logit softcap.

- mixture-of-experts layers (those with `ffn_gate_inp`, the 26B-A4B model): the dense
  feed-forward acts as a shared expert (post-normed by post_ffw_norm_1) beside routed GeGLU
  experts (input pre_ffw_norm_2, output post_ffw_norm_2) whose router reads
  rms_norm(x) / sqrt(n_embd) * ffn_gate_inp.scale; softmax gating, weights normalized,
  gate and up experts separate or fused (ffn_gate_up_exps), an optional per-expert output
  scale (ffn_down_exps.scale); the sum goes through post_ffw_norm.
q, k and v may also come fused (`attn_qkv`, split by rows).

E2B/E4B-style pieces:
- per-layer embeddings (`embedding_length_per_layer_input` = P > 0): each layer gets an input
  [P] from per_layer_token_embd (times sqrt(P)) plus rms_norm(per_layer_model_proj(x0) /
  sqrt(n_embd)), over sqrt(2); after its feed-forward the layer adds
  post_norm(proj(gelu(inp_gate(x)) * input)). Needs the `split` op;
- KV shared across layers (`attention.shared_kv_layers` = S): the last S layers store no
  K/V and attend over the state of the last layer of their kind before them (llama.cpp's
  rule), so their state spec is empty.
"""

import math

from ..errors import ReflexError
from ..runtime.state import SlotSpec, attention_spec
from . import blocks
from .common import Decoder, moe_captured, split_rows
from .plan import Alt, If, Layer, T, example, keys, layer, opt, variant


def _unsupported(what):
    return ReflexError("unsupported_architecture", f"gemma4: {what} is not supported")


class Model(Decoder):
    KEYS = keys(required=("embedding_length_per_layer_input", "attention.sliding_window",
                          "attention.sliding_window_pattern", "attention.key_length_swa",
                          "attention.value_length_swa"),
                optional=("attention.shared_kv_layers", "rope.dimension_count_swa", "rope.freq_base_swa",
                          "expert_count", "expert_used_count", "expert_feed_forward_length"))
    # sliding and global layers of their own head widths, rope bases and rope dims; per-layer KV head
    # counts; V = K where attn_v is absent; layer output scales. _moe: experts beside the dense FFN on
    # some layers (gate/up fused on one: 26B-A4B-like); _e2b: per-layer embeddings, the last layers
    # sharing earlier layers' KV (E2B-like)
    _G4 = {"block_count": 4, "feed_forward_length": 64, "attention.head_count_kv": [2, 2, 1, 2], "rope.freq_base": 1e6,
           "attention.key_length": 32, "attention.value_length": 32, "attention.key_length_swa": 16,
           "attention.value_length_swa": 16, "rope.dimension_count": 32, "rope.dimension_count_swa": 16,
           "rope.freq_base_swa": 10000.0, "attention.sliding_window": 4,
           "attention.sliding_window_pattern": [True, True, False, True], "embedding_length_per_layer_input": 0,
           "attention.shared_kv_layers": None, "final_logit_softcapping": 15.0}
    _HAS = ("attn_v.weight", "layer_output_scale.weight")
    EXAMPLES = {
        "gemma4": example(_G4, has=_HAS, lacks=("blk.2.attn_v.weight",)),
        "gemma4_moe": example({**_G4, "block_count": 3, "attention.head_count_kv": 2,
                               "attention.sliding_window_pattern": [True, False, True], "expert_count": 8,
                               "expert_used_count": 2, "expert_feed_forward_length": 32}, seed=2,
                              has=_HAS + ("blk.0.ffn_gate_inp.weight", "blk.2.ffn_gate_inp.weight",
                                          "blk.2.ffn_gate_up_exps.weight", "ffn_down_exps.scale")),
        "gemma4_e2b": example({**_G4, "block_count": 5, "attention.head_count_kv": 2,
                               "attention.sliding_window_pattern": [True, True, False, True, False],
                               "embedding_length_per_layer_input": 8, "attention.shared_kv_layers": 2}, seed=3,
                              has=_HAS + ("attn_k.weight", "attn_k_norm.weight")),
        "gemma4_fused_qkv": example({**_G4, "block_count": 3, "attention.head_count": 2, "attention.head_count_kv": 1,
                                     "attention.sliding_window": 3, "attention.sliding_window_pattern": [True, False, True]},
                                    seed=1, has=("attn_qkv.weight", "layer_output_scale.weight")),
        "gemma4@q": variant("gemma4_moe", {"feed_forward_length": 256, "expert_feed_forward_length": 256},
                            quantize=True)}

    # -- hyperparameters ---------------------------------------------------------------------
    @classmethod
    def dims(cls, hp):
        a = hp.arch
        d = Layer(E=hp.n_embd, n_layer=hp.n_layer, n_rot=hp.n_rot, head_dim=hp.head_dim)
        d.n_pl = hp.int("embedding_length_per_layer_input", required=True, lo=0, hi=1 << 16)
        n_shared = hp.int("attention.shared_kv_layers", default=0, lo=0, hi=hp.n_layer)
        d.window = hp.int("attention.sliding_window", required=True, lo=0, hi=1 << 24)
        flags = hp.layer_flags("attention.sliding_window_pattern")
        if flags is None or len(flags) < hp.n_layer:
            raise ReflexError("gguf_error", f"metadata key {a}.attention.sliding_window_pattern: expected an "
                              f"array of {hp.n_layer} per-layer flags")
        is_swa = flags[:hp.n_layer]
        if d.window == 0 and any(is_swa):
            raise ReflexError("gguf_error", f"metadata key {a}.attention.sliding_window: 0 with sliding-window layers")
        hd_swa = hp.int("attention.key_length_swa", required=True, lo=1, hi=1 << 12)
        if hp.int("attention.value_length_swa", required=True, lo=1, hi=1 << 12) != hd_swa:
            raise _unsupported(f"metadata key {a}.attention.value_length_swa != key_length_swa")
        if hp.head_dim_v != hp.head_dim:
            raise _unsupported(f"metadata key {a}.attention.value_length != key_length")
        n_rot_swa = hp.int("rope.dimension_count_swa", default=hp.n_rot, lo=0, hi=hd_swa)
        if n_rot_swa % 2:
            raise ReflexError("gguf_error", f"metadata key {a}.rope.dimension_count_swa: {n_rot_swa} is odd")
        # KV sharing: layers from kv_start on store nothing and attend over the state of the
        # last layer of their kind before kv_start (kv_start - 2 if sliding, else - 1)
        kv_start = hp.n_layer - n_shared
        reuse = [None] * hp.n_layer
        if n_shared:
            if kv_start < 2:
                raise ReflexError("gguf_error", f"metadata key {a}.attention.shared_kv_layers: {n_shared} of "
                                  f"{hp.n_layer} layers leaves fewer than 2 with their own KV")
            for i in range(kv_start, hp.n_layer):
                j = kv_start - (2 if is_swa[i] else 1)
                if is_swa[j] != is_swa[i] or hp.n_head_kv_l[j] != hp.n_head_kv_l[i]:
                    raise ReflexError("gguf_error", f"metadata key {a}.attention.shared_kv_layers: layer {i} "
                                      f"would reuse layer {j}'s KV, of another kind or head count")
                reuse[i] = j
        d.layers = [Layer(n_head=hp.n_head_l[i], n_head_kv=hp.n_head_kv_l[i], swa=s, reuse=reuse[i],
                          head_dim=hd_swa if s else hp.head_dim, n_rot=n_rot_swa if s else hp.n_rot,
                          n_ff=hp.n_ff_l[i]) for i, s in enumerate(is_swa)]
        d.experts = lambda: cls._experts(hp, d)  # read with the first layer that has experts
        return d

    @staticmethod
    def _experts(hp, d):
        if d.n_expert is None:
            d.n_expert = X = hp.int("expert_count", required=True, lo=1, hi=1 << 12)
            used = hp.per_layer("expert_used_count", required=True, lo=1, hi=X)
            if len(set(used)) > 1:  # llama.cpp routes every layer with layer 0's count
                raise _unsupported(f"metadata key {hp.arch}.expert_used_count: different counts per layer")
            d.n_used = used[0]
            d.n_ff_exp = hp.per_layer("expert_feed_forward_length", required=True, lo=1, hi=1 << 20)[0]
        return d.n_expert, d.n_ff_exp

    # -- tensors -------------------------------------------------------------------------------
    @classmethod
    def plan(cls, d):
        E, P, n = d.E, d.n_pl, d.n_layer
        return [T("token_embd.weight", None, E), T("output_norm.weight", E), opt("output.weight", None, E),
                *((T("per_layer_token_embd.weight", None, n * P), T("per_layer_model_proj.weight", n * P, E),
                   T("per_layer_proj_norm.weight", P)) if P else ()),
                None if all(L.swa for L in d.layers) else T("rope_freqs.weight", d.head_dim // 2),
                *(cls._layer_plan(d, i, L) for i, L in enumerate(d.layers))]

    @classmethod
    def _layer_plan(cls, d, i, L):
        E, H, Hkv, hd, own = d.E, L.n_head, L.n_head_kv, L.head_dim, L.reuse is None
        return layer(
            i, T("attn_norm.weight", E),
            Alt([T("attn_qkv.weight", (H + 2 * Hkv) * hd, E)],
                [T("attn_q.weight", H * hd, E), T("attn_k.weight", Hkv * hd, E, optional=not own),
                 opt("attn_v.weight", Hkv * hd, E)]),
            T("attn_q_norm.weight", hd), T("attn_k_norm.weight", hd, optional=not own),
            T("attn_output.weight", E, H * hd), T("post_attention_norm.weight", E), T("ffn_norm.weight", E),
            T("ffn_gate.weight", L.n_ff, E), T("ffn_up.weight", L.n_ff, E), T("ffn_down.weight", E, L.n_ff),
            T("post_ffw_norm.weight", E), opt("layer_output_scale.weight", 1),
            *((T("inp_gate.weight", d.n_pl, E), T("proj.weight", E, d.n_pl), T("post_norm.weight", E)) if d.n_pl else ()),
            If("ffn_gate_inp.weight", lambda: cls._moe_plan(d)))

    @staticmethod
    def _moe_plan(d):
        """A mixture-of-experts layer's extra tensors (beside the dense FFN, its shared expert)."""
        (X, Fe), E = d.experts(), d.E
        return [T("ffn_gate_inp.weight", X, E), T("ffn_gate_inp.scale", E), T("pre_ffw_norm_2.weight", E),
                T("post_ffw_norm_1.weight", E), T("post_ffw_norm_2.weight", E),
                Alt([T("ffn_gate_up_exps.weight", X, 2 * Fe, E)],
                    [T("ffn_gate_exps.weight", X, Fe, E), T("ffn_up_exps.weight", X, Fe, E)]),
                T("ffn_down_exps.weight", X, E, Fe), opt("ffn_down_exps.scale", X)]

    def __init__(self, ops, f, lora=None):
        if ops.name == "cuda":
            from . import cuda_unfit

            why = cuda_unfit(f)
            if why:
                raise ReflexError("unsupported_architecture", f"{why}; use --device cpu")
        t = self._load(ops, f, lora)
        hp, d = self.hp, self.d
        if d.n_pl and not callable(getattr(ops, "split", None)):
            raise _unsupported(f"per-layer embeddings on the {ops.name} backend (no split op)")
        self.ple = t if d.n_pl else None
        rope_freqs = None if t.rope_freqs is None else t.rope_freqs[:hp.n_rot // 2]
        rope_base_swa = hp.float("rope.freq_base_swa", default=hp.rope_base, gt=0.0)
        self.embd_scale = math.sqrt(hp.n_embd)
        for L in self.layers:
            H, Hkv, hd = L.n_head, L.n_head_kv, L.head_dim
            if L.attn_qkv is not None:
                L.attn_q, L.attn_k, L.attn_v = split_rows(ops, L.attn_qkv, [H * hd, Hkv * hd, Hkv * hd])
            L.rope = dict(n_rot=L.n_rot, neox=True, base=rope_base_swa if L.swa else hp.rope_base,
                          freq_scale=1.0 if L.swa else hp.rope_scale, freq_factors=None if L.swa else rope_freqs)
            s = L.layer_output_scale
            L.out_scale = 1.0 if s is None else float(ops.to_numpy(s)[0])
        # graphs hold MoE layers unless the backend's moe waits for the device (host routing)
        self.capturable = all(L.ffn_gate_inp is None for L in self.layers) or moe_captured(ops)

    # -- state: each layer's own KV heads and head width ------------------------------------
    def state_spec(self):
        """K/V of each layer's own width; nothing for a layer that reuses another's."""
        return [attention_spec(L.n_head_kv, L.head_dim, L.head_dim) if L.reuse is None else SlotSpec()
                for L in self.layers]

    # -- forward -------------------------------------------------------------------------------
    def _per_layer_inputs(self, x, batch):
        """Each layer's per-layer input [N, n_pl]: (rms_norm(x0 @ model_proj / sqrt(n_embd)) +
        per_layer_token_embd[ids] * sqrt(n_pl)) / sqrt(2), x0 the scaled token embedding."""
        ops, hp, N, P = self.ops, self.hp, batch.n, self.d.n_pl
        proj = ops.scale(ops.matmul(x, self.ple.per_layer_model_proj), 1.0 / math.sqrt(hp.n_embd))
        proj = ops.rms_norm(proj.reshape(N, hp.n_layer, P), self.ple.per_layer_proj_norm, hp.eps)
        tok = ops.embed(self.ple.per_layer_token_embd, batch.ids, scale=math.sqrt(P)).reshape(N, hp.n_layer, P)
        both = ops.scale(ops.add(proj, tok), 1.0 / math.sqrt(2.0))
        return [p.reshape(N, P) for p in ops.split(both.reshape(N, hp.n_layer * P), [P] * hp.n_layer)]

    def _moe_ffn(self, x, L):
        """The feed-forward of a layer with experts (before its post-norm): the dense FFN as a
        shared expert (post-normed by post_ffw_norm_1) plus the routed GeGLU experts (input
        pre_ffw_norm_2, output post_ffw_norm_2), whose router reads rms_norm(x) / sqrt(n_embd)
        * ffn_gate_inp.scale."""
        ops, hp = self.ops, self.hp
        f = ops.matmul(blocks.glu(ops, x, L.ffn_gate, L.ffn_up, "gelu", norm=L.ffn_norm, eps=hp.eps), L.ffn_down)
        f = ops.rms_norm(f, L.post_ffw_norm_1, hp.eps)
        r = ops.mul(ops.scale(ops.rms_norm(x, None, hp.eps), 1.0 / math.sqrt(hp.n_embd)), L.ffn_gate_inp_scale)
        m = blocks.moe(ops, ops.rms_norm(x, L.pre_ffw_norm_2, hp.eps), L, self.d.n_used, act="gelu",
                       gating="softmax", norm=True, logits=ops.matmul(r, L.ffn_gate_inp),
                       expert_scale=L.ffn_down_exps_scale)
        return ops.add(f, ops.rms_norm(m, L.post_ffw_norm_2, hp.eps))

    def forward(self, state, batch, rows=None, output="logits", check=None):
        ops, hp, eps = self.ops, self.hp, self.hp.eps
        x = ops.embed(self.tok_embd, batch.ids, scale=self.embd_scale)
        pl = self._per_layer_inputs(x, batch) if self.ple is not None else None
        for i, (L, S) in enumerate(zip(self.layers, state.layers)):
            if check is not None:
                check()
            window = self.d.window if L.swa else 0
            if L.reuse is not None:  # attends over an earlier layer's K/V, stores nothing
                q = blocks.rope_q(ops, blocks.qkv(ops, x, L, eps, kv=False)[0], L, eps, batch, L.rope)
                a = blocks.attend(ops, q, state.layers[L.reuse], batch, 1.0, window)
            else:
                q, k, v = blocks.qkv(ops, x, L, eps)
                v = ops.rms_norm(v if v is not None else k, None, eps)  # a new array: k is rotated in place
                q = blocks.rope_store(ops, q, k, v, L, S, batch, eps, L.rope)
                a = blocks.attend(ops, q, S, batch, 1.0, window)  # unscaled scores: the norms scale
            blocks.residual(ops, x, a, L.attn_output, post_norm=L.post_attention_norm, eps=eps)
            out_scale = L.out_scale if pl is None else 1.0
            if L.ffn_gate_inp is None:
                blocks.ffn(ops, x, L, eps, "gelu", post_norm=L.post_ffw_norm, out_scale=out_scale)
            else:
                blocks.add(ops, x, self._moe_ffn(x, L), post_norm=L.post_ffw_norm, eps=eps, out_scale=out_scale)
            if pl is not None:  # the per-layer embedding's contribution
                g = ops.mul(ops.gelu(ops.matmul(x, L.inp_gate)), pl[i])
                blocks.residual(ops, x, g, L.proj, post_norm=L.post_norm, eps=eps, out_scale=L.out_scale)
        return blocks.head(ops, x, self.output_norm, self.output, eps, rows, output, softcap=hp.final_softcap)
