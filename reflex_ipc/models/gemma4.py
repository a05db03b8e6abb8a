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
from types import SimpleNamespace

from ..errors import ReflexError
from ..runtime.state import SlotSpec, State, attention_spec
from .common import HParams, Weights, attention_block, moe_captured


def _unsupported(what):
    return ReflexError("unsupported_architecture", f"gemma4: {what} is not supported")


class Model:
    def __init__(self, ops, f, lora=None):
        if ops.name == "cuda":
            from . import cuda_unfit

            why = cuda_unfit(f)
            if why:
                raise ReflexError("unsupported_architecture", f"{why}; use --device cpu")
        self.ops = ops
        self.hp = hp = HParams(f)
        a = hp.arch
        self.n_pl = hp.int("embedding_length_per_layer_input", required=True, lo=0, hi=1 << 16)
        n_shared = hp.int("attention.shared_kv_layers", default=0, lo=0, hi=hp.n_layer)
        self.window = hp.int("attention.sliding_window", required=True, lo=0, hi=1 << 24)
        flags = hp.layer_flags("attention.sliding_window_pattern")
        if flags is None or len(flags) < hp.n_layer:
            raise ReflexError("gguf_error", f"metadata key {a}.attention.sliding_window_pattern: expected an "
                              f"array of {hp.n_layer} per-layer flags")
        self.is_swa = flags[:hp.n_layer]
        if self.window == 0 and any(self.is_swa):
            raise ReflexError("gguf_error", f"metadata key {a}.attention.sliding_window: 0 with sliding-window layers")
        hd_swa = hp.int("attention.key_length_swa", required=True, lo=1, hi=1 << 12)
        if hp.int("attention.value_length_swa", required=True, lo=1, hi=1 << 12) != hd_swa:
            raise _unsupported(f"metadata key {a}.attention.value_length_swa != key_length_swa")
        if hp.head_dim_v != hp.head_dim:
            raise _unsupported(f"metadata key {a}.attention.value_length != key_length")
        n_rot_swa = hp.int("rope.dimension_count_swa", default=hp.n_rot, lo=0, hi=hd_swa)
        if n_rot_swa % 2:
            raise ReflexError("gguf_error", f"metadata key {a}.rope.dimension_count_swa: {n_rot_swa} is odd")
        self.hd = [hd_swa if s else hp.head_dim for s in self.is_swa]
        # KV sharing: layers from kv_start on store nothing and attend over the state of the
        # last layer of their kind before kv_start (kv_start - 2 if sliding, else - 1)
        self.kv_start = hp.n_layer - n_shared
        self.reuse = [None] * hp.n_layer
        if n_shared:
            if self.kv_start < 2:
                raise ReflexError("gguf_error", f"metadata key {a}.attention.shared_kv_layers: {n_shared} of "
                                  f"{hp.n_layer} layers leaves fewer than 2 with their own KV")
            for i in range(self.kv_start, hp.n_layer):
                j = self.kv_start - (2 if self.is_swa[i] else 1)
                if self.is_swa[j] != self.is_swa[i] or hp.n_head_kv_l[j] != hp.n_head_kv_l[i]:
                    raise ReflexError("gguf_error", f"metadata key {a}.attention.shared_kv_layers: layer {i} "
                                      f"would reuse layer {j}'s KV, of another kind or head count")
                self.reuse[i] = j
        self.n_rot = [n_rot_swa if s else hp.n_rot for s in self.is_swa]
        self.rope_base_swa = hp.float("rope.freq_base_swa", default=hp.rope_base, gt=0.0)
        self.embd_scale = math.sqrt(hp.n_embd)
        self.n_expert = None  # read with the first mixture-of-experts layer
        w = Weights(ops, f, lora)
        self.tok_embd = w("token_embd.weight", (None, hp.n_embd))
        self.output_norm = w("output_norm.weight", (hp.n_embd,))
        self.output = w.output(hp.n_embd)
        self.ple = None
        if self.n_pl:
            missing = [op for op in ("split",) if not callable(getattr(ops, op, None))]
            if missing:
                raise _unsupported(f"per-layer embeddings on the {ops.name} backend (no {missing[0]} op)")
            L_pl = self.n_pl * hp.n_layer
            self.ple = SimpleNamespace(embd=w("per_layer_token_embd.weight", (None, L_pl)),
                                       proj=w("per_layer_model_proj.weight", (L_pl, hp.n_embd)),
                                       norm=w("per_layer_proj_norm.weight", (self.n_pl,)))
        self.rope_freqs = None
        if not all(self.is_swa):
            self.rope_freqs = w("rope_freqs.weight", (hp.head_dim // 2,))[:hp.n_rot // 2]
        self.layers = [self._load_layer(w, i) for i in range(hp.n_layer)]
        # graphs hold MoE layers unless the backend's moe waits for the device (host routing)
        self.capturable = all(L.moe is None for L in self.layers) or moe_captured(ops)

    def _load_layer(self, w, i):
        hp, p = self.hp, f"blk.{i}."
        H, Hkv, hd, E, F = hp.n_head_l[i], hp.n_head_kv_l[i], self.hd[i], hp.n_embd, hp.n_ff_l[i]
        scale = w(p + "layer_output_scale.weight", (1,), optional=True)
        if w.has(p + "attn_qkv.weight"):
            qkv = w(p + "attn_qkv.weight", ((H + 2 * Hkv) * hd, E))
            wq, wk, wv = (self.ops.weight_rows(qkv, 0, H * hd), self.ops.weight_rows(qkv, H * hd, Hkv * hd),
                          self.ops.weight_rows(qkv, (H + Hkv) * hd, Hkv * hd))
        else:
            own_kv = self.reuse[i] is None
            wq, wk = w(p + "attn_q.weight", (H * hd, E)), w(p + "attn_k.weight", (Hkv * hd, E), not own_kv)
            wv = w(p + "attn_v.weight", (Hkv * hd, E), optional=True)
        pl = None
        if self.n_pl:
            pl = SimpleNamespace(gate=w(p + "inp_gate.weight", (self.n_pl, E)),
                                 proj=w(p + "proj.weight", (E, self.n_pl)),
                                 norm=w(p + "post_norm.weight", (E,)))
        return SimpleNamespace(
            n_head=H, n_head_kv=Hkv, hd=hd, wq=wq, wk=wk, wv=wv,
            attn_norm=w(p + "attn_norm.weight", (E,)),
            q_norm=w(p + "attn_q_norm.weight", (hd,)),
            k_norm=w(p + "attn_k_norm.weight", (hd,), optional=self.reuse[i] is not None), pl=pl,
            wo=w(p + "attn_output.weight", (E, H * hd)),
            attn_post_norm=w(p + "post_attention_norm.weight", (E,)),
            ffn_norm=w(p + "ffn_norm.weight", (E,)),
            gate=w(p + "ffn_gate.weight", (F, E)), up=w(p + "ffn_up.weight", (F, E)),
            down=w(p + "ffn_down.weight", (E, F)),
            ffn_post_norm=w(p + "post_ffw_norm.weight", (E,)),
            out_scale=None if scale is None else float(self.ops.to_numpy(scale)[0]),
            moe=self._load_moe(w, p) if w.has(p + "ffn_gate_inp.weight") else None,
        )

    def _load_moe(self, w, p):
        """A mixture-of-experts layer's extra tensors (beside the dense FFN, its shared expert)."""
        hp, E = self.hp, self.hp.n_embd
        if self.n_expert is None:
            self.n_expert = X = hp.int("expert_count", required=True, lo=1, hi=1 << 12)
            used = hp.per_layer("expert_used_count", required=True, lo=1, hi=X)
            if len(set(used)) > 1:  # llama.cpp routes every layer with layer 0's count
                raise _unsupported(f"metadata key {hp.arch}.expert_used_count: different counts per layer")
            self.n_used = used[0]
            self.n_ff_exp = hp.per_layer("expert_feed_forward_length", required=True, lo=1, hi=1 << 20)[0]
        X, Fe = self.n_expert, self.n_ff_exp
        fused = w.has(p + "ffn_gate_up_exps.weight")
        return SimpleNamespace(
            router=w(p + "ffn_gate_inp.weight", (X, E)), router_scale=w(p + "ffn_gate_inp.scale", (E,)),
            pre_norm=w(p + "pre_ffw_norm_2.weight", (E,)), post_norm_1=w(p + "post_ffw_norm_1.weight", (E,)),
            post_norm_2=w(p + "post_ffw_norm_2.weight", (E,)),
            gate_exps=w(p + "ffn_gate_up_exps.weight", (X, 2 * Fe, E)) if fused else
            w(p + "ffn_gate_exps.weight", (X, Fe, E)),
            up_exps=None if fused else w(p + "ffn_up_exps.weight", (X, Fe, E)),
            down_exps=w(p + "ffn_down_exps.weight", (X, E, Fe)),
            down_scale=w(p + "ffn_down_exps.scale", (X,), optional=True),
        )

    def _ffn(self, x, L):
        """The feed-forward of the residual x (dense, or the shared expert plus the routed ones),
        before its post-norm."""
        ops, hp = self.ops, self.hp
        f = ops.matmul(ops.matmul_glu(ops.rms_norm(x, L.ffn_norm, hp.eps), L.gate, L.up, act="gelu"), L.down)
        M = L.moe
        if M is None:
            return f
        f = ops.rms_norm(f, M.post_norm_1, hp.eps)
        # the router reads the unweighted-normed residual, scaled by 1/sqrt(n_embd) and a vector
        r = ops.mul(ops.scale(ops.rms_norm(x, None, hp.eps), 1.0 / math.sqrt(hp.n_embd)), M.router_scale)
        m = ops.moe(ops.rms_norm(x, M.pre_norm, hp.eps), None, M.gate_exps, M.up_exps, M.down_exps, self.n_used,
                    gating="softmax", norm=True, act="gelu", logits=ops.matmul(r, M.router),
                    expert_scale=M.down_scale)
        return ops.add(f, ops.rms_norm(m, M.post_norm_2, hp.eps))

    # -- state: each layer's own KV heads and head width ------------------------------------
    def state_spec(self):
        """K/V of each layer's own width; nothing for a layer that reuses another's."""
        return [attention_spec(L.n_head_kv, L.hd, L.hd) if self.reuse[i] is None else SlotSpec()
                for i, L in enumerate(self.layers)]

    def new_state(self, ops, n_slots, n_seq=1):
        return State(ops, self.state_spec(), n_slots, n_seq)

    def state_bytes(self, n_slots, itemsize=2):
        return State.nbytes(self.state_spec(), n_slots, 1, itemsize)

    def _per_layer_inputs(self, x, batch):
        """Each layer's per-layer input [N, n_pl]: (rms_norm(x0 @ model_proj / sqrt(n_embd)) +
        per_layer_token_embd[ids] * sqrt(n_pl)) / sqrt(2), x0 the scaled token embedding."""
        ops, hp, N, P = self.ops, self.hp, batch.n, self.n_pl
        proj = ops.scale(ops.matmul(x, self.ple.proj), 1.0 / math.sqrt(hp.n_embd))
        proj = ops.rms_norm(proj.reshape(N, hp.n_layer, P), self.ple.norm, hp.eps)
        tok = ops.embed(self.ple.embd, batch.ids, scale=math.sqrt(P)).reshape(N, hp.n_layer, P)
        both = ops.scale(ops.add(proj, tok), 1.0 / math.sqrt(2.0))
        return [p.reshape(N, P) for p in ops.split(both.reshape(N, hp.n_layer * P), [P] * hp.n_layer)]

    def forward(self, state, batch, rows=None, output="logits", check=None):
        ops, hp, N = self.ops, self.hp, batch.n
        x = ops.embed(self.tok_embd, batch.ids, scale=self.embd_scale)
        pl = self._per_layer_inputs(x, batch) if self.ple is not None else None
        for i, (L, S) in enumerate(zip(self.layers, state.layers)):
            if check is not None:
                check()
            swa = self.is_swa[i]
            rope = dict(n_rot=self.n_rot[i], neox=True, base=self.rope_base_swa if swa else hp.rope_base,
                        freq_scale=1.0 if swa else hp.rope_scale, freq_factors=None if swa else self.rope_freqs)
            h = ops.rms_norm(x, L.attn_norm, hp.eps)
            window = self.window if swa else 0
            if self.reuse[i] is not None:  # attends over an earlier layer's K/V, stores nothing
                q = ops.rms_norm_rope(ops.matmul(h, L.wq).reshape(N, L.n_head, L.hd), L.q_norm, hp.eps,
                                      batch.pos, **rope)
                R = state.layers[self.reuse[i]]
                a = ops.attention(q, R.k, R.v, batch.slots, batch.n_kv, scale=1.0, **batch.attention_args(window))
                a = a.reshape(N, L.n_head * L.hd)
            else:
                if L.wv is not None:
                    q, k, v = ops.matmul_n(h, [L.wq, L.wk, L.wv])
                else:
                    q, k = ops.matmul_n(h, [L.wq, L.wk])
                    v = k
                v = ops.rms_norm(v.reshape(N, L.n_head_kv, L.hd), None, hp.eps)  # a new array: k may be v
                q = ops.rms_norm_rope(q.reshape(N, L.n_head, L.hd), L.q_norm, hp.eps, batch.pos, **rope)
                k = ops.rms_norm_rope(k.reshape(N, L.n_head_kv, L.hd), L.k_norm, hp.eps, batch.pos, **rope)
                a = attention_block(ops, S, batch, q, k, v, scale=1.0, window=window)
            x = ops.add(x, ops.rms_norm(ops.matmul(a, L.wo), L.attn_post_norm, hp.eps))
            x = ops.add(x, ops.rms_norm(self._ffn(x, L), L.ffn_post_norm, hp.eps))
            if pl is not None:  # the per-layer embedding's contribution
                g = ops.mul(ops.gelu(ops.matmul(x, L.pl.gate)), pl[i])
                x = ops.add(x, ops.rms_norm(ops.matmul(g, L.pl.proj), L.pl.norm, hp.eps))
            if L.out_scale is not None:
                x = ops.scale(x, L.out_scale)
        if rows is not None:
            x = x[rows]
        x = ops.rms_norm(x, self.output_norm, hp.eps)
        if output == "hidden":
            return x
        logits = ops.matmul(x, self.output)
        return ops.softcap(logits, hp.final_softcap) if hp.final_softcap > 0 else logits
