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

from ..backends.base import RECURRENT_OPS, require_ops, require_state_cols
from ..errors import ReflexError
from ..runtime.state import SeqSpec, attention_spec
from . import blocks
from .common import MAX_HEAD_DIM, MAX_HEADS, Decoder, default_attn_scale, split_rows
from .plan import Alt, Layer, T, dense, example, keys, layer, variant


def _bad(key, msg):
    return ReflexError("gguf_error", f"metadata key {key}: {msg}")


class Model(Decoder):
    KEYS = keys(required=("ssm.conv_kernel", "ssm.inner_size", "ssm.state_size", "ssm.time_step_rank",
                          "ssm.group_count", "rope.dimension_sections"),
                optional=("nextn_predict_layers", "attention.recurrent_layers", "full_attention_interval"))
    # 4 layers, partial rope (8 of 16 dims), 4 value heads over 2 key heads (ggml's tiled sharing)
    BASE = {"context_length": 512, "block_count": 4, "embedding_length": 64, "feed_forward_length": 128,
            "attention.head_count": 4, "attention.head_count_kv": 2, "attention.key_length": 16,
            "attention.value_length": 16, "rope.dimension_count": 8, "rope.freq_base": 1e6,
            "attention.layer_norm_rms_epsilon": 1e-6, "rope.dimension_sections": [2, 1, 1, 0], "ssm.conv_kernel": 4,
            "ssm.inner_size": 64, "ssm.state_size": 16, "ssm.time_step_rank": 4, "ssm.group_count": 2}
    EXAMPLES = {  # DeltaNet, attention, DeltaNet, attention; or the kinds as flags, attention fused
        "qwen35": example({"full_attention_interval": 2}, base=BASE, gain=4.0, embd_std=0.5),
        "qwen35_flags": example({"attention.recurrent_layers": [False, True, True, False]}, base=BASE, gain=4.0,
                                embd_std=0.5, seed=1, has=("attn_qkv.weight",)),
        "qwen35@q": variant("qwen35", {"feed_forward_length": 256}, quantize=True)}

    # -- hyperparameters ---------------------------------------------------------------------
    @classmethod
    def dims(cls, hp):
        a = hp.arch
        nextn = hp.int("nextn_predict_layers", default=0, lo=0, hi=hp.n_layer - 1)
        d = Layer(E=hp.n_embd, n_layer=hp.n_layer - nextn)  # the trunk (MTP layers are not run)
        d.d_conv = hp.int("ssm.conv_kernel", required=True, lo=2, hi=64)
        d_inner = hp.int("ssm.inner_size", required=True, lo=1, hi=1 << 20)
        d.d = hp.int("ssm.state_size", required=True, lo=1, hi=MAX_HEAD_DIM)
        d.n_v = hp.int("ssm.time_step_rank", required=True, lo=1, hi=MAX_HEADS)
        d.n_k = hp.int("ssm.group_count", required=True, lo=1, hi=MAX_HEADS)
        if d_inner != d.d * d.n_v:
            raise _bad(f"{a}.ssm.inner_size", f"{d_inner} != state_size {d.d} x time_step_rank {d.n_v} "
                       f"(value heads of the key width)")
        if d.n_v % d.n_k:
            raise _bad(f"{a}.ssm.group_count", f"{d.n_v} value heads cannot share {d.n_k} key heads")
        if hp.head_dim_v != hp.head_dim:
            raise ReflexError("unsupported_architecture", f"key length {hp.head_dim} != value length {hp.head_dim_v}")
        d.conv_dim = (2 * d.n_k + d.n_v) * d.d
        cls._rope_sections(hp)
        d.layers = [Layer(recurrent=r, n_head=hp.n_head_l[i], n_head_kv=hp.n_head_kv_l[i], head_dim=hp.head_dim,
                          n_ff=hp.n_ff_l[i]) for i, r in enumerate(cls._layer_kinds(hp, d.n_layer))]
        return d

    @staticmethod
    def _layer_kinds(hp, n_layer):
        """Per trunk layer: True for Gated DeltaNet, False for full attention."""
        key = f"{hp.arch}.attention.recurrent_layers"
        flags = hp.layer_flags("attention.recurrent_layers")
        if flags is None:
            if hp.get("attention.recurrent_layers") is not None:
                raise _bad(key, "expected an array of per-layer flags")
            n = hp.int("full_attention_interval", default=4, lo=1, hi=1 << 16)
            return [(i + 1) % n != 0 for i in range(n_layer)]
        if len(flags) != hp.n_layer:
            raise _bad(key, f"{len(flags)} flags for {hp.n_layer} layers")
        return flags[:n_layer]

    @staticmethod
    def _rope_sections(hp):
        """`rope.dimension_sections` (required by llama.cpp): up to 4 counts of rotated pairs
        per position section, not all zero, at most n_rot / 2 in all. Text positions are the
        same in every section, so they do not change the rotation."""
        key = f"{hp.arch}.rope.dimension_sections"
        v = hp.get("rope.dimension_sections")
        v = v if isinstance(v, list) else [v]
        if not 1 <= len(v) <= 4 or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in v):
            raise _bad(key, f"expected up to 4 non-negative integers, got {v!r}")
        if not any(v[:3]) or sum(v) > hp.n_rot // 2:
            raise _bad(key, f"{v} does not fit the {hp.n_rot // 2} rotated pairs")

    # -- tensors -------------------------------------------------------------------------------
    @classmethod
    def plan(cls, d):
        E = d.E
        return [T("token_embd.weight", None, E), T("output_norm.weight", E), T("output.weight", None, E, optional=True),
                *(layer(i, T("attn_norm.weight", E), T("post_attention_norm.weight", E),
                        *(cls._delta_plan(d) if L.recurrent else cls._attention_plan(d, L)), *cls.ffn_plan(d, L))
                  for i, L in enumerate(d.layers))]

    @staticmethod
    def _delta_plan(d):
        E, vd = d.E, d.d * d.n_v
        return (T("attn_qkv.weight", d.conv_dim, E), T("attn_gate.weight", vd, E),
                dense("ssm_conv1d.weight", d.conv_dim, d.d_conv), T("ssm_dt.bias", d.n_v), T("ssm_a", d.n_v),
                T("ssm_beta.weight", d.n_v, E), T("ssm_alpha.weight", d.n_v, E), T("ssm_norm.weight", d.d),
                T("ssm_out.weight", E, vd))

    @staticmethod
    def _attention_plan(d, L):
        E, H, Hkv, hd = d.E, L.n_head, L.n_head_kv, L.head_dim
        return (Alt([T("attn_qkv.weight", (2 * H + 2 * Hkv) * hd, E)],  # fused: query+gate, k, v by rows
                    [T("attn_q.weight", 2 * H * hd, E), T("attn_k.weight", Hkv * hd, E),
                     T("attn_v.weight", Hkv * hd, E)]),
                T("attn_q_norm.weight", hd), T("attn_k_norm.weight", hd), T("attn_output.weight", E, H * hd))

    @classmethod
    def ffn_plan(cls, d, L):
        """The feed-forward's tensors of a layer (a SwiGLU here; qwen35moe: experts)."""
        return (T("ffn_gate.weight", L.n_ff, d.E), T("ffn_up.weight", L.n_ff, d.E), T("ffn_down.weight", d.E, L.n_ff))

    def __init__(self, ops, f, lora=None):
        require_ops(ops, RECURRENT_OPS, f.architecture)
        require_state_cols(ops, self.hparams(f).int("ssm.state_size", required=True), f"{f.architecture}.ssm.state_size")
        self._load(ops, f, lora)
        hp = self.hp
        self.scale = default_attn_scale(hp)
        self.rope = dict(n_rot=hp.n_rot, base=hp.rope_base, freq_scale=hp.rope_scale, neox=True)
        for L in self.layers:
            if not L.recurrent and L.attn_qkv is not None:
                H, Hkv, hd = L.n_head, L.n_head_kv, L.head_dim
                L.attn_q, L.attn_k, L.attn_v = split_rows(ops, L.attn_qkv, [2 * H * hd, Hkv * hd, Hkv * hd])

    # -- state ---------------------------------------------------------------------------
    def state_spec(self):
        d = self.d
        return [SeqSpec(conv=(d.d_conv - 1, d.conv_dim), ssm=(d.n_v, d.d, d.d)) if L.recurrent else
                attention_spec(L.n_head_kv, L.head_dim, L.head_dim) for L in self.layers]

    # -- forward ---------------------------------------------------------------------------
    def ffn(self, x, L):
        """x += the feed-forward of rms_norm(x, post_attention_norm)."""
        blocks.ffn(self.ops, x, L, self.hp.eps, norm=L.post_attention_norm)

    def forward(self, state, batch, rows=None, output="logits", check=None):
        ops, d, eps = self.ops, self.d, self.hp.eps
        x = ops.embed(self.tok_embd, batch.ids)
        for L, S in zip(self.layers, state.layers):
            if check is not None:
                check()
            if L.recurrent:
                blocks.gated_delta_net(ops, x, L, S, batch, eps, d.n_k, d.n_v, d.d)
            else:
                blocks.attention(ops, x, L, S, batch, eps, rope=self.rope, scale=self.scale, gated=True)
            self.ffn(x, L)
        return blocks.head(ops, x, self.output_norm, self.output, eps, rows, output)
