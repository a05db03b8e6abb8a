"""Layer blocks: the pieces every architecture's forward is made of, and the one place where
fused kernels are chosen.

A block runs one step of a layer (norm + q/k/v projection, q/k norm + rope + K/V store,
attention, output projection + residual, a gated feed-forward, a mixture of experts, a
recurrent mixer, latent attention, the head) through backends/base.py's fused functions,
which run the backend's fused op when it has one (CUDA) and fusion is on, else exactly the
sequence of plain ops that defines it (what the numpy oracle and the cpu backend compute). A
model file composes blocks and plain ops; it never names a fused op, so every architecture
gets the fused decode path.

Blocks read a layer's tensors by their llama.cpp names, the attributes models/plan.py's
`load` gives a layer (attn_norm, attn_q, attn_q_bias, attn_output, ffn_gate, ...), and its
sizes from attributes the model sets (n_head, n_head_kv, head_dim). A tensor the file lacks
is None and its step is skipped.
"""

import math

from ..backends.base import (delta_gates, delta_qkv, latent_attention, qk_rope_kv_store, residual_add,
                             rms_norm_gate, rms_norm_matmul_glu, rms_norm_matmul_n, sigmoid_gate, ssm_conv_silu)


def bias(ops, y, b):
    """y + b, or y itself when b is None."""
    return ops.add(y, b) if b is not None else y


def linear(ops, x, w, b=None):
    """x @ w.T (+ b)."""
    return bias(ops, ops.matmul(x, w), b)


# -- attention -----------------------------------------------------------------------------
def qkv(ops, x, L, eps, q_width=None, kv=True):
    """The queries, keys and values of rms_norm(x, L.attn_norm): q [N, n_head, q_width or
    head_dim], k and v [N, n_head_kv, head_dim], the norm folded into the projections; biases
    added. v is None when the layer has no attn_v (gemma4 then takes k's values); kv False:
    q alone, (q, None, None) (a layer attending over another layer's K/V)."""
    N, hd = x.shape[0], L.head_dim
    ws = [L.attn_q] + ([L.attn_k] + ([L.attn_v] if L.attn_v is not None else []) if kv else [])
    out = rms_norm_matmul_n(ops, x, L.attn_norm, eps, ws) + [None] * (3 - len(ws))
    q, k, v = (bias(ops, y, b) if y is not None else None
               for y, b in zip(out, (L.attn_q_bias, L.attn_k_bias, L.attn_v_bias)))
    q = q.reshape(N, L.n_head, q_width or hd)
    return q, None if k is None else k.reshape(N, L.n_head_kv, hd), None if v is None else v.reshape(N, L.n_head_kv, hd)


def rope_store(ops, q, k, v, L, S, batch, eps, rope, qk_norm=None):
    """q [N, H, d] and k [N, Hkv, d] RMS-normed per head by L.attn_q_norm / attn_k_norm (when the
    layer has them; qk_norm True: without weights, Llama 4's L2 norm, which commutes with a
    rope over every dim) and rotated (rope: rope's keyword arguments; None: no rotation), then
    k and v stored at the batch's slots of the layer's K/V S. Returns q (rotated in place)."""
    norm = L.attn_q_norm is not None if qk_norm is None else qk_norm
    qn, kn = (L.attn_q_norm, L.attn_k_norm) if qk_norm is None else (None, None)
    if rope is None:  # no positions (a NoPE layer): the norms alone
        if norm:
            q, k = ops.rms_norm(q, qn, eps), ops.rms_norm(k, kn, eps)
        ops.kv_store(S.k, S.v, k, v, batch.slots)
        return q
    return qk_rope_kv_store(ops, q, k, v, qn, kn, eps, batch.pos, S.k, S.v, batch.slots, norm=norm, **rope)[0]


def rope_q(ops, q, L, eps, batch, rope):
    """q alone normed (when the layer has attn_q_norm) and rotated in place: a layer that
    attends over another layer's keys."""
    if L.attn_q_norm is not None:
        return ops.rms_norm_rope(q, L.attn_q_norm, eps, batch.pos, **rope)
    return ops.rope(q, batch.pos, inplace=True, **rope)


def attend(ops, q, S, batch, scale, window=0, softcap=0.0, sinks=None, chunk=0):
    """Attention of q [N, H, d] over slots 0..n_kv-1 of the K/V S (the batch's own stored
    first) -> [N, H * dv]; a sliding window or chunked attention's chunks, attention sinks
    (a per-head logit in the softmax's denominator) when given."""
    kw = {} if sinks is None else {"sinks": sinks}
    out = ops.attention(q, S.k, S.v, batch.slots, batch.n_kv, scale=scale, softcap=softcap,
                        **batch.attention_args(window, chunk), **kw)
    return out.reshape(batch.n, -1)


def residual(ops, x, a, w, b=None, *, post_norm=None, eps=0.0, scale=1.0, out_scale=1.0):
    """x += scale * post(a @ w.T + b), in place on x (the model's own hidden state, which
    nothing else reads as the old value); post = rms_norm(., post_norm, eps) when given (a
    sandwich norm), then x *= out_scale. Plain and without a bias: the product is added into
    x by the matmul itself. A bias goes onto the product before the residual, as llama.cpp
    adds them (x + (a @ w.T + b) rounds unlike (x + a @ w.T) + b)."""
    if post_norm is None and scale == 1.0 and out_scale == 1.0 and b is None:
        ops.matmul(a, w, out=x, accumulate=True)
        return x
    return add(ops, x, linear(ops, a, w, b), post_norm=post_norm, eps=eps, scale=scale, out_scale=out_scale)


def add(ops, x, y, *, post_norm=None, eps=0.0, scale=1.0, out_scale=1.0):
    """x = (x + scale * post(y)) * out_scale, in place on x; post = rms_norm(., post_norm, eps)
    when given."""
    return residual_add(ops, x, y, post_norm, eps, norm=post_norm is not None, scale=scale, out_scale=out_scale)


def attention(ops, x, L, S, batch, eps, *, rope, scale, window=0, softcap=0.0, post_norm=None, res_scale=1.0,
              gated=False, sinks=None, chunk=0, qk_norm=None, temperature=None):
    """x += the self-attention of rms_norm(x, L.attn_norm): q/k/v (qkv), q/k norm + rope +
    K/V store (rope_store), attention (attend), output projection + residual (residual, with
    the layer's post-attention norm and a residual scale when given). gated: attn_q gives each
    head's query then an output gate of its width; the output is times sigmoid(gate) (qwen35).
    sinks / chunk: attend's; qk_norm: rope_store's; temperature: pos_scale's keyword arguments
    (floor, scale, offset): the queries times Llama 4's attention temperature at their positions."""
    hd = L.head_dim
    q, k, v = qkv(ops, x, L, eps, q_width=2 * hd if gated else None)
    qg, q = (q, ops.columns(q, 0, hd)) if gated else (None, q)
    q = rope_store(ops, q, k, v, L, S, batch, eps, rope, qk_norm)
    if temperature is not None:
        q = ops.pos_scale(q, batch.pos, **temperature)
    a = attend(ops, q, S, batch, scale, window, softcap, sinks, chunk)
    if gated:
        a = sigmoid_gate(ops, a, qg, hd, hd)
    return residual(ops, x, a, L.attn_output, L.attn_output_bias, post_norm=post_norm, eps=eps, scale=res_scale)


# -- feed-forward ----------------------------------------------------------------------------
def glu(ops, x, gate, up, act="silu", *, norm=None, eps=0.0, gate_bias=None, up_bias=None, normed=False):
    """act(gate(h)) * up(h) with h = rms_norm(x, norm, eps), or h = x when normed (already
    normed input); the norm folded into the product. Biases: the two products apart."""
    if gate_bias is not None or up_bias is not None:
        h = x if normed else ops.rms_norm(x, norm, eps)
        g, u = linear(ops, h, gate, gate_bias), linear(ops, h, up, up_bias)
        return ops.swiglu(g, u) if act == "silu" else ops.geglu(g, u)
    if normed:
        return ops.matmul_glu(x, gate, up, act=act)
    return rms_norm_matmul_glu(ops, x, norm, eps, gate, up, act=act)


def ffn(ops, x, L, eps, act="silu", *, norm=None, post_norm=None, res_scale=1.0, out_scale=1.0):
    """x += the gated feed-forward of rms_norm(x, L.ffn_norm) (norm: another weight):
    down(act(gate(h)) * up(h)), with the layer's biases, then a post-norm and a residual scale
    when given (residual)."""
    g = glu(ops, x, L.ffn_gate, L.ffn_up, act, norm=L.ffn_norm if norm is None else norm, eps=eps,
            gate_bias=L.ffn_gate_bias, up_bias=L.ffn_up_bias)
    return residual(ops, x, g, L.ffn_down, L.ffn_down_bias, post_norm=post_norm, eps=eps, scale=res_scale,
                    out_scale=out_scale)


def moe(ops, h, L, n_used, *, act="silu", res=None, res_scale=1.0, **routing):
    """A mixture of experts of the normed h (ops.moe over L.ffn_gate_inp and the expert tensors
    ffn_{gate,up,down}_exps, or ffn_gate_up_exps), plus the shared expert when the layer has
    one (ffn_{gate,up,down}_shexp; times sigmoid(h . ffn_gate_inp_shexp) when present), in
    llama.cpp's order: routed + shared, then into the residual res (in place, times res_scale)
    when given. Returns what it added (or the sum, without res)."""
    fused = L.ffn_gate_up_exps
    router = None if routing.get("logits") is not None else L.ffn_gate_inp  # logits: routed by the model
    out = ops.moe(h, router, fused if fused is not None else L.ffn_gate_exps,
                  None if fused is not None else L.ffn_up_exps, L.ffn_down_exps, n_used, act=act, **routing)
    if L.ffn_gate_shexp is not None:
        g = ops.matmul_glu(h, L.ffn_gate_shexp, L.ffn_up_shexp, act="silu")
        if L.ffn_gate_inp_shexp is None:
            ops.matmul(g, L.ffn_down_shexp, out=out, accumulate=True)
        else:
            ops.add(out, ops.mul(ops.matmul(g, L.ffn_down_shexp), ops.sigmoid(ops.matmul(h, L.ffn_gate_inp_shexp))),
                    out=out)
    return out if res is None else add(ops, res, out, scale=res_scale)


# -- head ------------------------------------------------------------------------------------
def head(ops, x, norm, w, eps, rows=None, output="logits", *, bias=None, scale=1.0, softcap=0.0):
    """The rows `rows` of x through the output norm: the hidden states (output "hidden"), or
    the logits through the LM head w, the norm folded into it; then + bias, times scale, and a
    final softcap when given."""
    if rows is not None:
        x = x[rows]
    if output == "hidden":
        return ops.rms_norm(x, norm, eps)
    y = rms_norm_matmul_n(ops, x, norm, eps, [w])[0]
    if bias is not None:
        y = ops.add(y, bias)
    if scale != 1.0:
        y = ops.scale(y, scale)
    return ops.softcap(y, softcap) if softcap > 0 else y


# -- recurrent mixers ------------------------------------------------------------------------
def gated_delta_net(ops, x, L, S, batch, eps, n_k, n_v, d):
    """x += the Gated DeltaNet mixer of rms_norm(x, L.attn_norm) (qwen35): q/k/v through a
    causal conv with silu, q and k L2-normalized, the decay softplus(alpha + dt bias) * a and
    the write strength sigmoid(beta), the delta rule over the state S, RMSNorm(ssm_norm) times
    silu(z), ssm_out."""
    N = x.shape[0]
    qkv_, z = rms_norm_matmul_n(ops, x, L.attn_norm, eps, [L.attn_qkv, L.attn_gate])
    b, alpha = rms_norm_matmul_n(ops, x, L.attn_norm, eps, [L.ssm_beta, L.ssm_alpha])
    g, beta = delta_gates(ops, alpha, L.ssm_dt_bias, L.ssm_a, b)
    c = ssm_conv_silu(ops, qkv_, S.conv, L.ssm_conv1d, batch.seqs)
    q, k, v = delta_qkv(ops, c, n_k, n_v, d, eps)
    o = ops.delta_net(q, k, v, g, beta, S.ssm, batch.seqs, scale=1.0 / math.sqrt(d))
    o = rms_norm_gate(ops, o, L.ssm_norm, eps, z.reshape(N, n_v, d))
    return residual(ops, x, o.reshape(N, n_v * d), L.ssm_out)


def mamba2(ops, x, L, S, batch, eps, *, n_head, n_group, d_state, d_inner, res_scale=1.0):
    """x += res_scale * the Mamba-2 mixer of rms_norm(x, L.attn_norm) (granitehybrid): z, xBC
    and dt from ssm_in (L.ssm_in_z, ssm_in_xbc, ssm_in_dt, its row blocks), a causal conv
    (+ bias) with silu on xBC, split into x, B and C; dt = softplus(dt + ssm_dt.bias); the
    selective scan over the state S with the D skip; silu(z) gate; an RMSNorm per group times
    ssm_norm; ssm_out."""
    N, H, G, Ns, di = x.shape[0], n_head, n_group, d_state, d_inner
    z, xbc, dt = rms_norm_matmul_n(ops, x, L.attn_norm, eps, [L.ssm_in_z, L.ssm_in_xbc, L.ssm_in_dt])
    if L.ssm_conv1d_bias is None:
        xbc = ssm_conv_silu(ops, xbc, S.conv, L.ssm_conv1d, batch.seqs)
    else:
        xbc = ops.silu(bias(ops, ops.ssm_conv(xbc, S.conv, L.ssm_conv1d, batch.seqs), L.ssm_conv1d_bias))
    xs = ops.columns(xbc, 0, di).reshape(N, H, di // H)
    B = ops.columns(xbc, di, G * Ns).reshape(N, G, Ns)
    C = ops.columns(xbc, di + G * Ns, G * Ns).reshape(N, G, Ns)
    dt = ops.softplus(ops.add(dt, L.ssm_dt_bias))
    y = ops.ssm_scan(xs, dt, L.ssm_a, B, C, S.ssm, batch.seqs, D=L.ssm_d).reshape(N, di)
    y = ops.swiglu(z, y)
    y = ops.rms_norm(y.reshape(N, G, di // G), None, eps).reshape(N, di)
    return residual(ops, x, ops.mul(y, L.ssm_norm), L.ssm_out, scale=res_scale)


# -- multi-head latent attention --------------------------------------------------------------
def mla(ops, x, L, S, batch, eps, *, nope, rope_dims, rank, v_dim, rope, scale):
    """x += DeepSeek's multi-head latent attention of rms_norm(x, L.attn_norm), in the absorbed
    form: q (attn_q, or through the q LoRA attn_q_a / attn_q_a_norm / attn_q_b) per head
    [nope, rope]; the latent c = rms_norm(attn_kv_a_mqa's first `rank` rows) and one shared
    rope key (its last rows), stored as [c, rope(k_pe)] (S.kv); q_nope through attn_k_b into
    the latent space; scores over the one latent head; each head's output through attn_v_b,
    then attn_output."""
    N, H, r = batch.n, L.n_head, rope_dims
    if L.attn_q_a is None:
        q, c, k_pe = rms_norm_matmul_n(ops, x, L.attn_norm, eps, [L.attn_q, L.kv_c, L.kv_pe])
    else:
        qa, c, k_pe = rms_norm_matmul_n(ops, x, L.attn_norm, eps, [L.attn_q_a, L.kv_c, L.kv_pe])
        q = rms_norm_matmul_n(ops, qa, L.attn_q_a_norm, eps, [L.attn_q_b])[0]
    q_nope, q_pe = ops.split(q.reshape(N, H, nope + r), [nope, r])
    q_pe = ops.rope(q_pe, batch.pos, inplace=True, **rope)
    c = ops.rms_norm(c, L.attn_kv_a_norm, eps)
    k_pe = ops.rope(k_pe.reshape(N, 1, r), batch.pos, inplace=True, **rope)
    ops.kv_store(S.kv, None, ops.concat([c.reshape(N, 1, rank), k_pe]), None, batch.slots)
    # the absorbed form (q_nope through attn_k_b, scores over the latent head, attn_v_b; base.py),
    # or the backend's equivalent (CUDA: long prompts decompress the heads for the flash kernel)
    o = latent_attention(ops, q_nope, q_pe, S.kv, L.attn_k_b, L.attn_v_b, batch.slots, batch.n_kv, scale=scale,
                         **batch.attention_args(0))  # [N, H, v_dim]
    return residual(ops, x, o.reshape(N, H * v_dim), L.attn_output)
