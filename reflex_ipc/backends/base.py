"""The backend ops: the normative list of what models (reflex_ipc/models/*.py) may call.

A backend is an object with the methods of `Ops` below; numpy_ops.NumpyOps (the
oracle) and cuda_ops.CudaOps implement them. Models call nothing else, so a
model written once runs on every backend.

Conventions (all ops):
- Shapes are in numpy order (last axis contiguous). "Array" means a
  backend-native array (numpy.ndarray / a device array) with `.shape`,
  `.ndim`, `.size`, `.dtype`. Activations are float32 unless stated.
  Arrays also support `.reshape(*shape)` and leading-axis `x[i]` / `x[a:b]`
  (step 1), all three views without a copy (models use them to split heads
  and to keep only the last row before the output projection).
- Ops return new arrays unless they take `out=` (then they write `out`, which
  has the result's shape, and return it). Inputs are never modified except by
  `kv_store`, `rope(..., inplace=True)` and `rms_norm_rope` (both rotate x itself), and
  `matmul(..., out=y, accumulate=True)` (adds into y).
- Fused ops (`matmul_n`, `matmul_glu`, `rms_norm_rope`) are defined as a sequence of the
  plain ops and compute exactly that sequence on the numpy backend; other backends may
  run them as one kernel, within float32 rounding of the sequence. They exist because a
  GPU decode step is bound by the number of kernels it launches.
- Token ids, positions and cache slots are given as Python sequences, numpy
  integer arrays or backend int32 arrays (`positions()` converts once so a
  model can reuse one array across layers).
- Host <-> backend crossings are explicit: `asarray` (numpy -> backend) and
  `to_numpy` (backend -> numpy, waits for the device).

Weights (`load_weight(f, name)`): `f` is an open GGUFFile. A tensor with
GGUF shape (ggml order) [ne0, ne1, ...] is, in numpy order, a matrix
[rows = ne1*ne2*..., cols = ne0]. For tensors with 2 or more dimensions the
backend returns an opaque weight handle with `.shape == (rows, cols)` that
`matmul` and `embed` accept (the CUDA backend keeps the GGUF blocks on the
device; the numpy backend dequantizes to float32 at load). 1-D tensors (norm
weights, biases, rope frequency factors) come back as float32 arrays [n] that
any op taking an array accepts.

State: models own it (reflex_ipc/runtime/state.py). Its arrays are allocated
with `zeros(shape, dtype)`: an attention layer's K [n_kv_heads, n_slots, head_dim]
and V [n_kv_heads, n_slots, head_dim_v], in the backend's `kv_dtype` (float32 on
numpy, float16 on CUDA). Rows are addressed by *slot* (0..n_slots-1). In ordinary
use a token's slot is its position; system1 stores candidates at slots after the
prompt while their rope positions restart at the prompt end for each candidate,
and passes an explicit mask. The executor tracks which slots are filled; the
arrays hold no length.

Attention semantics (`attention`): for query n and head h, with
g = Hq / Hkv query heads per KV head (GQA; Hq % Hkv == 0) and kv head h // g:
    s[j] = scale * dot(q[n, h], K[h // g, j])       j = 0..n_kv-1
    if softcap > 0: s[j] = softcap * tanh(s[j] / softcap)
    if mask is not None: s[j] += mask[n, j]
    keys visible: lo <= j <= hi, hi = pos[n] if causal else n_kv - 1,
                  lo = pos[n] - window + 1 if window > 0 else 0 (clamped to 0),
                  and with chunk > 0 (chunked attention, Llama 4) also
                  lo >= pos[n] - pos[n] % chunk (the start of the query's chunk)
    out[n, h] = sum_j softmax(s over visible j)[j] * V[h // g, j]
    with sinks (gpt-oss): a per-head logit sinks[h] joins the softmax's denominator only:
    out[n, h] = sum_j exp(s[j] - M) V[h // g, j] / (sum_j exp(s[j] - M) + exp(sinks[h] - M)),
    M = max(max_j s[j], sinks[h]) (raw: not scaled, capped or masked)
A query with no visible key (all masked with -inf) gets zeros. `pos` here are
the queries' *slots* (equal to positions in ordinary use). With an explicit
mask the caller passes causal=False, window=0 and encodes everything in the
mask: float32 [N, n_kv], 0 for visible and -inf for hidden, made with
`asarray` from numpy (runtime.batch.attention_mask).

Backend attributes: `name` ("numpy", "cpu", "cuda": the protocol's `backend`),
`device` ("cpu" or "cuda"), `kv_dtype` (the state's dtype), `prefill_chunk`
(tokens per prefill batch). A backend that can replay work from a captured graph
also has `capture(fn) -> (graph, result)`: fn's launches recorded, `graph.launch()`
replays them with the same arguments and buffers, `graph.close()` frees it
(runtime/graphs.py uses it; what changes between replays must live in arrays
updated with `write` before each launch). `moe_capturable = True` says that its `moe` runs
without waiting for the device, so a graph can hold it (MoE models are captured only then).
"""

from __future__ import annotations

import math

from .. import settings as _settings

# The op names every backend must provide (see Ops for their contracts).
OPS = (
    "empty", "zeros", "asarray", "to_numpy", "write", "copy", "synchronize", "positions",
    "load_weight", "weight_rows", "matmul", "matmul_n", "matmul_glu", "moe", "embed",
    "add", "mul", "scale", "softcap", "silu", "gelu", "swiglu", "geglu",
    "rms_norm", "rope", "rms_norm_rope",
    "kv_store", "attention", "pos_scale",
    "argmax", "topk", "logprobs",
)

# Ops of recurrent layers (linear attention, state-space models). Optional: a backend without
# them cannot run the architectures that need them, and those refuse to load on it
# (`unsupported_architecture`, via `require_ops`).
RECURRENT_OPS = ("sigmoid", "softplus", "columns", "ssm_conv", "delta_net", "ssm_scan")


def require_state_cols(backend, n, key):
    """ReflexError unsupported_architecture when the backend's recurrent kernels cannot hold state
    rows of n columns (its optional attribute `max_state_cols`; unlimited without it)."""
    limit = getattr(backend, "max_state_cols", None)
    if limit is not None and n > limit:
        from ..errors import ReflexError

        raise ReflexError("unsupported_architecture", f"{key} = {n}: the {getattr(backend, 'name', '?')} backend's "
                          f"recurrent kernels hold state rows of at most {limit}")


# Ops only multi-head latent attention (deepseek2) needs; a backend may lack them (then such
# models are refused on it at load). The numpy, cpu and CUDA backends have them.
MLA_OPS = ("split", "concat", "head_matmul")


# Fused ops a backend may provide (CudaOps does) to cut the kernels of a decode step. Models
# do not call them (models/blocks.py does) but the functions of the same name below, which run the
# backend's version when it has one and fusion is on, else the sequence of plain ops that
# defines them (what numpy and cpu compute). REFLEX_FUSE=0 turns them off (A/B runs).
FUSED_OPS = ("rms_norm_matmul_n", "rms_norm_matmul_glu", "qk_rope_kv_store", "residual_add",
             # the element-wise chains of the hybrid (Gated DeltaNet / gated attention) layers
             "delta_gates", "ssm_conv_silu", "delta_qkv", "rms_norm_gate", "sigmoid_gate")


def latent_attention(ops, q_nope, q_pe, kv, wk_b, wv_b, slots, n_kv, *, scale, causal=True, window=0,
                     mask=None):
    """Multi-head latent attention (deepseek2) over a layer's latent cache kv [1, n_slots, R + r]
    (rows [c, rope(k_pe)], this batch's already stored): q_nope [N, H, nope], q_pe [N, H, r]
    (rotated), wk_b [H*R, nope] (per head [R, nope]), wv_b [H*dv, R] -> [N, H, dv]. Exactly the
    absorbed form
        q = concat([head_matmul(q_nope, wk_b), q_pe])              # [N, H, R + r]
        o = attention(q, kv, None, slots, n_kv, scale=scale, v_dim=R, causal=.., window=.., mask=..)
        head_matmul(o, wv_b)
    which decode runs everywhere; a backend with `mla_attention` may compute the same product
    another way (CUDA: long prompts decompress each head's keys and values and run the flash
    kernel). LoRA weights take the absorbed form."""
    f = getattr(ops, "mla_attention", None)
    if callable(f) and not any(getattr(w, "terms", None) is not None for w in (wk_b, wv_b)):
        return f(q_nope, q_pe, kv, wk_b, wv_b, slots, n_kv, scale=scale, causal=causal, window=window, mask=mask)
    return latent_attention_absorbed(ops, q_nope, q_pe, kv, wk_b, wv_b, slots, n_kv, scale=scale, causal=causal,
                                     window=window, mask=mask)


def latent_attention_absorbed(ops, q_nope, q_pe, kv, wk_b, wv_b, slots, n_kv, *, scale, causal=True, window=0,
                              mask=None):
    """latent_attention's defining sequence of plain ops."""
    R = kv.shape[-1] - q_pe.shape[-1]
    q = ops.concat([ops.head_matmul(q_nope, wk_b), q_pe])
    o = ops.attention(q, kv, None, slots, n_kv, scale=scale, v_dim=R, causal=causal, window=window, mask=mask)
    return ops.head_matmul(o, wv_b)


def fusion_on() -> bool:
    """False when $REFLEX_FUSE is "0": models then run the plain ops' sequence."""
    return _settings.get().fuse


def _fused(ops, name, weights=()):
    """The backend's fused op `name`, or None (fusion off, no such op, or a LoRA weight among
    `weights`, whose low-rank terms only the plain matmuls of a LoraOps add)."""
    if not fusion_on() or any(getattr(w, "terms", None) is not None for w in weights):
        return None
    f = getattr(ops, name, None)
    return f if callable(f) else None


def rms_norm_matmul_n(ops, x, w_norm, eps, ws):
    """matmul_n(rms_norm(x, w_norm, eps), ws): the norm folded into the products (the normed
    x itself is not returned)."""
    f = _fused(ops, "rms_norm_matmul_n", ws)
    if f is not None:
        return f(x, w_norm, eps, ws)
    return ops.matmul_n(ops.rms_norm(x, w_norm, eps), ws)


def rms_norm_matmul_glu(ops, x, w_norm, eps, w_gate, w_up, act="silu"):
    """matmul_glu(rms_norm(x, w_norm, eps), w_gate, w_up, act)."""
    f = _fused(ops, "rms_norm_matmul_glu", (w_gate, w_up))
    if f is not None:
        return f(x, w_norm, eps, w_gate, w_up, act=act)
    return ops.matmul_glu(ops.rms_norm(x, w_norm, eps), w_gate, w_up, act=act)


def qk_rope_kv_store(ops, q, k, v, q_norm, k_norm, eps, pos, k_cache, v_cache, slots, *, norm=True,
                     **rope):
    """q [N, Hq, hd] and k [N, Hkv, hd] rotated in place (after a per-head rms_norm with q_norm /
    k_norm [hd] or None when `norm`), then k and v [N, Hkv, dv] stored at `slots` of a layer's
    K/V: exactly
        q = rms_norm_rope(q, q_norm, eps, pos, **rope)   (rope(q, pos, inplace=True, **rope) when not norm)
        k = rms_norm_rope(k, k_norm, eps, pos, **rope)   (likewise)
        kv_store(k_cache, v_cache, k, v, slots)
    rope: rope's keyword arguments (n_rot, base, freq_scale, freq_factors, neox, mscale).
    Returns (q, k)."""
    f = _fused(ops, "qk_rope_kv_store")
    if f is not None and v_cache is not None and not rope.get("yarn"):
        return f(q, k, v, q_norm, k_norm, eps, pos, k_cache, v_cache, slots, norm=norm, **rope)
    if norm:
        q = ops.rms_norm_rope(q, q_norm, eps, pos, **rope)
        k = ops.rms_norm_rope(k, k_norm, eps, pos, **rope)
    else:
        q = ops.rope(q, pos, inplace=True, **rope)
        k = ops.rope(k, pos, inplace=True, **rope)
    ops.kv_store(k_cache, v_cache, k, v, slots)
    return q, k


def residual_add(ops, x, y, w, eps, *, norm=True, scale=1.0, out_scale=1.0):
    """x = (x + scale * (rms_norm(y, w, eps) if norm else y)) * out_scale, in place on x (which
    is returned): a residual add after a post-norm (gemma's sandwich norms), scaled (granite's
    residual_scale), and a layer output scale (gemma4). Exactly
        y = rms_norm(y, w, eps)  (when norm)
        y = scale(y, scale)      (when scale != 1)
        add(x, y, out=x)
        scale(x, out_scale, out=x)  (when out_scale != 1)"""
    f = _fused(ops, "residual_add")
    if f is not None:
        return f(x, y, w, eps, norm=norm, scale=scale, out_scale=out_scale)
    if norm:
        y = ops.rms_norm(y, w, eps)
    if scale != 1.0:
        y = ops.scale(y, scale)
    ops.add(x, y, out=x)
    if out_scale != 1.0:
        ops.scale(x, out_scale, out=x)
    return x


def delta_gates(ops, alpha, dt_bias, a, b):
    """A Gated DeltaNet's decay and write strength from alpha, b [N, H] (dt_bias, a [H]):
    (mul(softplus(add(alpha, dt_bias)), a), sigmoid(b))."""
    f = _fused(ops, "delta_gates")
    if f is not None:
        return f(alpha, dt_bias, a, b)
    return ops.mul(ops.softplus(ops.add(alpha, dt_bias)), a), ops.sigmoid(b)


def ssm_conv_silu(ops, x, state, w, seqs=None):
    """silu(ssm_conv(x, state, w, seqs)) (the state updated as by ssm_conv)."""
    f = _fused(ops, "ssm_conv_silu")
    if f is not None:
        return f(x, state, w, seqs)
    return ops.silu(ops.ssm_conv(x, state, w, seqs))


def delta_qkv(ops, c, n_k, n_v, d, eps):
    """The q, k [N, n_k, d] and v [N, n_v, d] of a Gated DeltaNet's conv output c
    [N, (2 n_k + n_v) d] (q, k, v by columns), q and k L2-normalized as llama.cpp computes it,
    t / sqrt(sum t^2 + eps): scale(rms_norm(t, None, eps / d), 1 / sqrt(d))."""
    f = _fused(ops, "delta_qkv")
    if f is not None:
        return f(c, n_k, n_v, d, eps)
    N, kd = c.shape[0], n_k * d

    def l2(t):
        return ops.scale(ops.rms_norm(t, None, eps / d), 1.0 / math.sqrt(d))

    return (l2(ops.columns(c, 0, kd).reshape(N, n_k, d)), l2(ops.columns(c, kd, kd).reshape(N, n_k, d)),
            ops.columns(c, 2 * kd, n_v * d).reshape(N, n_v, d))


def rms_norm_gate(ops, x, w, eps, z):
    """mul(rms_norm(x, w, eps), silu(z)), z of x's shape: a gated RMSNorm."""
    f = _fused(ops, "rms_norm_gate")
    if f is not None:
        return f(x, w, eps, z)
    return ops.mul(ops.rms_norm(x, w, eps), ops.silu(z))


def sigmoid_gate(ops, a, x, start, width):
    """mul(a, sigmoid(columns(x, start, width).reshape(a.shape))): a times a sigmoid gate
    read from columns of x (an attention output gated by part of its query projection)."""
    f = _fused(ops, "sigmoid_gate")
    if f is not None:
        return f(a, x, start, width)
    return ops.mul(a, ops.sigmoid(ops.columns(x, start, width).reshape(a.shape)))


def missing_ops(backend) -> list[str]:
    """The names in OPS that `backend` does not provide (empty when it conforms)."""
    return [name for name in OPS if not callable(getattr(backend, name, None))]


def require_ops(backend, names, arch):
    """ReflexError unsupported_architecture unless `backend` has every op in names."""
    lacking = [n for n in names if not callable(getattr(backend, n, None))]
    if lacking:
        from ..errors import ReflexError

        raise ReflexError("unsupported_architecture",
                          f"{arch} needs the ops {', '.join(lacking)}, which the {getattr(backend, 'name', '?')} "
                          f"backend does not have yet (use the cpu device)")


def seq_groups(seqs, n):
    """[(sequence, token indices in batch order)] for per-token sequence ids seqs (None: all n
    tokens belong to sequence 0), sequences in order of first appearance."""
    import numpy as np

    if seqs is None:
        return [(0, np.arange(n))]
    seqs = np.asarray(seqs).reshape(-1)
    _, first = np.unique(seqs, return_index=True)
    return [(int(seqs[i]), np.flatnonzero(seqs == seqs[i])) for i in sorted(first)]


def seq_group_table(seqs, n):
    """(int32 table, n_groups) describing seq_groups(seqs, n) to a kernel: the G+1 starts of the
    groups in the token order, the G sequence ids, then the n token indices grouped by sequence
    (batch order within a group). kernels/recurrent.cuh reads it."""
    import numpy as np

    groups = seq_groups(seqs, n)
    starts = np.cumsum([0] + [len(idx) for _, idx in groups])
    table = np.concatenate([starts, [s for s, _ in groups]] + [idx for _, idx in groups]).astype(np.int32)
    return table, len(groups)


def matmul_result(y, out, accumulate):
    """A host backend's matmul result y put where `matmul` promises it: added into out
    (accumulate), written into out, or y itself when there is no out."""
    if accumulate:
        out += y
        return out
    if out is not None:
        out[...] = y
        return out
    return y


def check_matmul_n(ws):
    """ValueError unless ws is 1 to 3 weights of one width (matmul_n's precondition)."""
    if not 1 <= len(ws) <= 3:
        raise ValueError(f"matmul_n takes 1 to 3 weights, not {len(ws)}")
    if any(w.shape[1] != ws[0].shape[1] for w in ws):
        raise ValueError(f"matmul_n: weights of different widths {[tuple(w.shape) for w in ws]}")


def unique_ids(a):
    """np.unique(a) for integer ids (sorted, distinct), without numpy.ma: numpy 2.x's plain
    np.unique imports numpy.ma (~6 ms, more beside a streaming upload) the first time, on
    the path of a cold MoE process's first token."""
    import numpy as np

    s = np.sort(np.asarray(a).reshape(-1))
    if s.size < 2:
        return s
    return s[np.concatenate(([True], s[1:] != s[:-1]))]


def moe_route(logits, n_used, gating="softmax", norm=True, scale=1.0, selection_bias=None, groups=None):
    """The routing of `moe` on the host: (top [N, n_used] expert ids best first, w [N, n_used]
    their float32 weights) from float32 router logits [N, E]. groups (G, G_used): the experts
    form G consecutive groups; a group's score is the sum of its two best selection values,
    and only the G_used best groups' experts may be chosen (DeepSeek-V3's grouped routing)."""
    import numpy as np

    logits = np.asarray(logits, np.float32)
    if gating == "softmax_weight":  # gpt-oss: chosen by logit, then a softmax over the chosen
        top = np.argsort(-logits, axis=-1, kind="stable")[:, :n_used]
        z = np.take_along_axis(logits, top, axis=-1)
        w = np.exp(z - z.max(axis=-1, keepdims=True))
        w /= w.sum(axis=-1, keepdims=True)
        if norm:
            w = w / np.maximum(w.sum(axis=-1, keepdims=True), np.float32(6.103515625e-5))
        if scale not in (0.0, 1.0):
            w = w * np.float32(scale)
        return top, w.astype(np.float32)
    if gating == "softmax":
        z = logits - logits.max(axis=-1, keepdims=True)
        probs = np.exp(z)
        probs /= probs.sum(axis=-1, keepdims=True)
    elif gating == "sigmoid":
        probs = np.float32(1) / (np.float32(1) + np.exp(-logits))
    else:
        raise ValueError(f"moe: gating must be softmax, sigmoid or softmax_weight, not {gating!r}")
    sel = probs if selection_bias is None else probs + np.asarray(selection_bias, np.float32)
    if groups is not None and groups[0] > 1:
        G, G_used = groups
        N, E = sel.shape
        g = sel.reshape(N, G, E // G)
        score = -np.sort(-g, axis=-1)[:, :, :2].sum(axis=-1)  # [N, G]
        keep = np.argsort(-score, axis=-1, kind="stable")[:, :G_used]
        hidden = np.ones((N, G), bool)
        np.put_along_axis(hidden, keep, False, axis=-1)
        sel = np.where(np.repeat(hidden, E // G, axis=-1), np.float32(-np.inf), sel)
    top = np.argsort(-sel, axis=-1, kind="stable")[:, :n_used]
    w = np.take_along_axis(probs, top, axis=-1)
    if norm:
        w = w / np.maximum(w.sum(axis=-1, keepdims=True), np.float32(6.103515625e-5))
    if scale not in (0.0, 1.0):
        w = w * np.float32(scale)
    return top, w.astype(np.float32)


OAI_ALPHA, OAI_LIMIT = 1.702, 7.0  # llama.cpp's LLM_FFN_SWIGLU_OAI_MOE constants


def swiglu_oai(g, u, alpha=OAI_ALPHA, limit=OAI_LIMIT):
    """gpt-oss's clamped SwiGLU on the host (float32): x = min(g, limit), y = clamp(u, -limit,
    limit), x * sigmoid(alpha x) * (y + 1)."""
    import numpy as np

    x = np.minimum(np.asarray(g, np.float32), np.float32(limit))
    y = np.clip(np.asarray(u, np.float32), np.float32(-limit), np.float32(limit))
    with np.errstate(over="ignore"):  # exp overflowing to inf for a very negative x: x / inf = -0, as in C
        return (x / (np.float32(1) + np.exp(np.float32(-alpha) * x)) * (y + np.float32(1))).astype(np.float32)


def pos_temperature(pos, floor, scale, offset=1.0):
    """Llama 4's attention temperature per position (float32 [N]): llama.cpp's
    log(floor((pos + offset) / floor) + 1) * scale + 1, in float64 then rounded."""
    import numpy as np

    p = np.asarray(pos, np.float32).reshape(-1)
    q = np.floor((p + np.float32(offset)) / np.float32(floor)).astype(np.float64)  # float, as llama.cpp's
    return (np.log(q + 1.0) * float(np.float32(scale)) + 1.0).astype(np.float32)


def host_topk(logits, k, n=None):
    """`topk` on the host: the k largest of the first n columns of one row, best first,
    lower index first on ties (numpy int64)."""
    import numpy as np

    row = np.asarray(logits).reshape(-1)
    row = row[:n] if n is not None else row
    k = max(0, min(int(k), row.size))
    if not k:
        return np.empty(0, np.int64)
    idx = np.argpartition(-row, k - 1)[:k]
    return idx[np.lexsort((idx, -row[idx]))].astype(np.int64)


def host_logprobs(logits, rows, targets, n=None):
    """`logprobs` on the host (float64 sums; each distinct row's normalizer once)."""
    import numpy as np

    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    targets = np.asarray(targets, dtype=np.int64).reshape(-1)
    z = np.asarray(logits)[:, :n] if n is not None else np.asarray(logits)
    out = np.empty(len(rows))
    for r in unique_ids(rows):
        zr = z[r].astype(np.float64)
        m = zr.max()
        lse = m + np.log(np.exp(zr - m).sum())
        sel = rows == r
        out[sel] = zr[targets[sel]] - lse
    return out


def check_glu(w_gate, w_up, act):
    """ValueError unless matmul_glu's weights have one shape and act is silu or gelu."""
    if act not in ("silu", "gelu"):
        raise ValueError(f"matmul_glu: act must be 'silu' or 'gelu', not {act!r}")
    if tuple(w_gate.shape) != tuple(w_up.shape):
        raise ValueError(f"matmul_glu: gate {tuple(w_gate.shape)} and up {tuple(w_up.shape)} differ")



def weight_shape(t, ndim=None):
    """A GGUF tensor's shape in numpy order; with ndim, its last ndim dimensions (the
    leading ones, ggml's trailing dims, are 1: models.common.Weights checked)."""
    shape = tuple(reversed(t.shape))
    return shape if ndim is None else shape[len(shape) - ndim:]

class Ops:
    """The contract. Backends need not inherit from this class; they must match it.

    Attributes: see the module docstring (name, device, kv_dtype, prefill_chunk).
    """

    name = "abstract"
    device = "cpu"
    kv_dtype = "float32"
    prefill_chunk = 256

    # -- memory ------------------------------------------------------------------
    def empty(self, shape, dtype="float32"):
        """An uninitialised array of `shape` (int or tuple) and dtype "float32"/"int32"/"float16"."""
        raise NotImplementedError

    def zeros(self, shape, dtype="float32"):
        """An array of `shape` filled with zeros (the state's arrays)."""
        raise NotImplementedError

    def asarray(self, a, dtype=None):
        """numpy (or anything np.asarray takes) -> backend array. dtype None: integer and bool
        input becomes int32, everything else float32. A backend array is returned as is."""
        raise NotImplementedError

    def to_numpy(self, x):
        """Backend array -> numpy array with the same shape and dtype (waits for the device)."""
        raise NotImplementedError

    def write(self, dst, host):
        """Copy numpy array `host` (dst's size; cast to dst's dtype) into the existing backend
        array dst, in stream order without waiting; returns dst."""
        raise NotImplementedError

    def copy(self, src, out):
        """out[...] = src for backend arrays of one shape and dtype; returns out."""
        raise NotImplementedError

    def synchronize(self):
        """Wait until all queued work has finished (a no-op on numpy)."""
        raise NotImplementedError

    def positions(self, pos):
        """Positions / slots / token ids (list, range, numpy ints) -> backend int32 array [N]."""
        raise NotImplementedError

    # -- weights -----------------------------------------------------------------
    def load_weight(self, f, name, ndim=None):
        """Tensor `name` of GGUFFile f: a weight handle [rows, cols] for 2+-D tensors, a
        float32 array [n] for 1-D ones (see the module docstring). KeyError if absent
        (models check presence with `name in f.tensors` first). ndim: the dimensions the
        model expects, when the file gives more whose extra ones are 1 (ggml's trailing
        dims, e.g. a norm vector stored as [n, 1]): those are dropped (weight_shape)."""
        raise NotImplementedError

    def weight_rows(self, w, start, n):
        """Rows start..start+n-1 of weight handle w [M, K] as a weight handle [n, K] sharing
        its storage (a fused q/k/v or gate/up tensor split into its parts; one expert of a
        3-D expert tensor)."""
        raise NotImplementedError

    # -- linear algebra ----------------------------------------------------------
    def matmul(self, x, w, out=None, accumulate=False):
        """x float32 [..., K] times weight handle w [M, K]: y[..., m] = sum_k x[..., k] w[m, k]
        (x @ w.T), float32 [..., M]. accumulate=True adds the product into `out` (required).
        Backends with RECURRENT_OPS also take a float32 array [M, K] as w (a small matrix a
        model makes from a vector: qwen35moe's shared-expert gate)."""
        raise NotImplementedError

    def matmul_n(self, x, ws):
        """Several weights of one width K over the same x: [matmul(x, w) for w in ws], a list
        of float32 [..., M_i] arrays (separate, contiguous). 1 to 3 weights (e.g. q, k, v)."""
        raise NotImplementedError

    def matmul_glu(self, x, w_gate, w_up, act="silu"):
        """A gated unit: swiglu(matmul(x, w_gate), matmul(x, w_up)) for act="silu",
        geglu(...) (tanh gelu) for act="gelu". w_gate and w_up have one shape [M, K];
        float32 [..., M]."""
        raise NotImplementedError

    def moe(self, x, router, w_gate, w_up, w_down, n_used, *, gating="softmax", norm=True, scale=1.0,
            selection_bias=None, act="silu", groups=None, logits=None, expert_scale=None, router_bias=None,
            gate_bias=None, up_bias=None, down_bias=None, weight_before=False):
        """A mixture-of-experts feed-forward, as llama.cpp's build_moe_ffn computes it:
            logits = matmul(x, router) (+ router_bias [E])   router [E, K]: E experts
            probs  = softmax(logits) (gating "softmax") or sigmoid(logits) ("sigmoid"); gating
                     "softmax_weight" (gpt-oss): top = the n_used largest logits, w = softmax
                     over those logits (then norm and scale as below)
            top    = the n_used largest of probs (+ selection_bias [E], for choosing only),
                     best first, lower index first on ties; with groups (G, G_used) only among
                     the G_used groups of experts whose two best values sum highest (moe_route)
            w      = probs[top], divided by max(sum(w), 2^-14) when norm, times scale
                     (unless scale is 0 or 1)
            out[n] = sum_k w[n, k] * down_e(glu(gate_e(x[n]), up_e(x[n])))   e = top[n, k]
        w_gate, w_up are the 3-D expert tensors as weight handles [E*F, K] (expert e's rows
        e*F..e*F+F-1), w_down [E*K', F]; glu is swiglu (act "silu") or geglu ("gelu").
        x float32 [N, K] -> float32 [N, K']. A backend reads only the selected experts.
        Variants (gemma4): `logits` float32 [N, E] given instead of a router (router None);
        w_up None when w_gate holds each expert's gate and up rows together ([E*2F, K]: expert
        e's gate at rows 2eF..2eF+F-1, its up right after); expert_scale [E] multiplies expert
        e's output (a per-expert scale of the down projection).
        gpt-oss: gate_bias, up_bias [E, F] and down_bias [E, K'] (float32 arrays) added to
        expert e's gate, up and down products; act "swiglu_oai": with g, u the (biased) gate
        and up values, x = min(g, 7), y = clamp(u, -7, 7), glu = x * sigmoid(1.702 x) * (y + 1)
        (llama.cpp's alpha and limit; base.swiglu_oai). Llama 4: weight_before, expert e gets
        w[n, k] * x[n] and the outputs are summed unweighted (the weight before the FFN)."""
        raise NotImplementedError

    def embed(self, w, ids, scale=1.0):
        """Rows `ids` (N ints) of the weight handle w [n_vocab, dim], dequantized, times scale:
        float32 [N, dim]."""
        raise NotImplementedError

    # -- element-wise (float32) --------------------------------------------------------
    def add(self, a, b, out=None):
        """a + b; b has a's shape, or is 1-D [a.shape[-1]] and broadcasts over the rows (a bias)."""
        raise NotImplementedError

    def mul(self, a, b, out=None):
        """a * b with add's broadcasting, or b [a.shape[0], 1] scaling each row of a 2-D a
        (a per-token gate)."""
        raise NotImplementedError

    def scale(self, a, s, out=None):
        """a * s for a Python float s."""
        raise NotImplementedError

    def softcap(self, a, cap, out=None):
        """cap * tanh(a / cap) (cap > 0)."""
        raise NotImplementedError

    def silu(self, a):
        """a * sigmoid(a)."""
        raise NotImplementedError

    def gelu(self, a):
        """The tanh approximation: 0.5 a (1 + tanh(sqrt(2/pi) (a + 0.044715 a^3)))."""
        raise NotImplementedError

    def swiglu(self, g, u):
        """silu(g) * u, g and u of one shape."""
        raise NotImplementedError

    def geglu(self, g, u):
        """gelu(g) * u (tanh gelu), g and u of one shape."""
        raise NotImplementedError

    # -- normalization, rotary -------------------------------------------------------
    def rms_norm(self, x, w, eps):
        """Over the last axis: x / sqrt(mean(x^2) + eps), times w [D] when w is not None.
        x may have any leading shape ([N, D], or [N, H, hd] with w [hd] for per-head norms)."""
        raise NotImplementedError

    def rope(self, x, pos, *, n_rot=None, base=10000.0, freq_scale=1.0, freq_factors=None,
             neox=False, mscale=1.0, inplace=False, yarn=None):
        """Rotary embedding of x float32 [N, H, hd] at positions pos [N].

        For i in 0..n_rot/2-1 (n_rot defaults to hd; dims >= n_rot pass through):
            theta = pos[n] * base^(-2i/n_rot) * freq_scale / (freq_factors[i] if given)
            normal (llama.cpp "norm"): the pair is (2i, 2i+1)
            neox:                      the pair is (i, i + n_rot/2)
            (x_a, x_b) -> ((x_a cos - x_b sin) * mscale, (x_a sin + x_b cos) * mscale)
        yarn (ext_factor, n_ctx_orig, beta_fast, beta_slow), ext_factor != 0: YaRN as ggml's
        rope computes it: with theta_e = theta / freq_scale (extrapolated) and the correction
        range [lo, hi] = [max(0, floor(d(beta_fast))), min(n_rot - 1, ceil(d(beta_slow)))],
        d(b) = n_rot * ln(n_ctx_orig / (2 pi b)) / (2 ln base),
            ramp  = (1 - clamp((i - lo) / max(0.001, hi - lo), 0, 1)) * ext_factor
            theta = theta * (1 - ramp) + theta_e * ramp
            mscale = mscale * (1 + 0.1 ln(1 / freq_scale))
        A backend without YaRN raises unsupported_architecture for ext_factor != 0.
        Returns a new array, or rotates x itself when inplace."""
        raise NotImplementedError

    def rms_norm_rope(self, x, w, eps, pos, *, n_rot=None, base=10000.0, freq_scale=1.0,
                      freq_factors=None, neox=False, mscale=1.0):
        """Per-head RMSNorm then rotary, in place on x float32 [N, H, hd]: exactly
            rope(rms_norm(x, w, eps), pos, ...) written into x (returned),
        with w [hd] (or None) and rope's keyword arguments (q/k norms of qwen3, gemma3)."""
        raise NotImplementedError

    # -- attention ---------------------------------------------------------------
    def kv_store(self, k_cache, v_cache, k, v, slots):
        """Write k [N, Hkv, dk], v [N, Hkv, dv] into k_cache[:, slots[n]], v_cache[:, slots[n]]
        (a layer's state arrays [Hkv, n_slots, d]). v_cache and v None: keys only (an MLA
        latent, whose values are a prefix of the keys)."""
        raise NotImplementedError

    def attention(self, q, k_cache, v_cache, pos, n_kv, *, scale, softcap=0.0, causal=True, window=0,
                  mask=None, v_dim=None, sinks=None, chunk=0):
        """q float32 [N, Hq, dk] over slots 0..n_kv-1 of a layer's K/V arrays -> float32
        [N, Hq, dv] (semantics in the module docstring). Store the batch's own k/v first.
        v_cache None: the values are the first v_dim dims of the keys (multi-head latent
        attention's latent, one KV head); a backend may support only v_cache given.
        sinks: float32 [Hq] attention sinks (or None); chunk: chunked attention's chunk size
        (0: none; with a mask the caller encodes it in the mask and passes 0)."""
        raise NotImplementedError

    def pos_scale(self, x, pos, *, floor, scale, offset=1.0):
        """x float32 [N, ...] with row n times Llama 4's attention temperature at position
        pos[n]: log(floor((pos[n] + offset) / floor) + 1) * scale + 1 (computed in float64,
        rounded to float32 once). Returns a new array."""
        raise NotImplementedError

    # -- multi-head latent attention (MLA_OPS: optional) ---------------------------------
    def split(self, x, sizes):
        """x [..., sum(sizes)] -> [x[..., :s0], x[..., s0:s0+s1], ...] as separate contiguous
        arrays."""
        raise NotImplementedError

    def concat(self, xs):
        """Arrays of one leading shape [..., d_i] -> [..., sum(d_i)] along the last axis."""
        raise NotImplementedError

    def head_matmul(self, x, w):
        """A weight per head: x float32 [N, H, K] and weight handle w [H*M, K] (a 3-D tensor
        [H, M, K]) -> float32 [N, H, M], y[n, h] = w[h] @ x[n, h]."""
        raise NotImplementedError

    # -- recurrent layers (RECURRENT_OPS: optional) ---------------------------------------
    # Per-sequence state arrays (runtime.state.SeqSpec) have a leading axis of n_seq; these
    # ops update the state of each token's sequence in place. `seqs` gives each token's
    # sequence (a host int sequence [N]; None: every token is in sequence 0); the tokens of
    # one sequence are processed in batch order, sequences independently (system1 runs every
    # candidate, each in its own sequence, in one batch).
    def sigmoid(self, a):
        """1 / (1 + exp(-a))."""
        raise NotImplementedError

    def softplus(self, a):
        """log(1 + exp(a)), and a itself where a > 20 (ggml's)."""
        raise NotImplementedError

    def columns(self, x, start, n):
        """A new contiguous array x[..., start:start+n] (split a fused projection's output)."""
        raise NotImplementedError

    def ssm_conv(self, x, state, w, seqs=None):
        """Causal depthwise convolution with state. x float32 [N, C]; state [n_seq, K-1, C] (the
        last K-1 inputs of each sequence); w [C, K] (the conv weight as load_weight returns it).
        For a sequence's tokens t = 0..T-1 with xx = concat(state[s], x[tokens of s]):
            y[t, c] = sum_k w[c, k] * xx[t + k, c]
        then state[s] = the last K-1 rows of xx. Returns float32 [N, C] (no bias, no activation)."""
        raise NotImplementedError

    def delta_net(self, q, k, v, g, beta, state, seqs=None, scale=1.0):
        """The gated delta rule (Gated DeltaNet). q, k float32 [N, Hk, D]; v [N, Hv, D]; g [N, Hv]
        (log decay); beta [N, Hv]; state [n_seq, Hv, D, D] (value x key). Value head h reads
        q/k head h % Hk (ggml's tiled broadcast). For each token, in order, with S = state[s, h]:
            S = exp(g) * S
            S = S + beta * (v - S k) k^T
            out[n, h] = scale * S q
        Returns float32 [N, Hv, D]. Backends may run a sequence's tokens in the chunked
        (parallel) form; it equals the sequential one within float32 rounding."""
        raise NotImplementedError

    def ssm_scan(self, x, dt, A, B, C, state, seqs=None, D=None):
        """The Mamba-2 selective scan. x float32 [N, H, P]; dt [N, H] (positive: after softplus);
        A [H]; B, C [N, G, Ns]; state [n_seq, H, P, Ns]; head h reads group h // (H / G). For
        each token, in order, with S = state[s, h]:
            S = exp(dt * A) * S + (dt * x) B^T
            y[n, h] = S C (+ D[h] * x[n, h] when D [H] is given)
        Returns float32 [N, H, P]; a chunked form is allowed as for delta_net."""
        raise NotImplementedError

    # -- selection ---------------------------------------------------------------
    def argmax(self, logits, out=None):
        """Index of the largest value in each row of float32 [..., V] (first index on ties): a
        numpy int array [...] (waits for the device), or, given `out` (a backend int32 array
        of one entry per row), written there without waiting (a captured graph can hold it)."""
        raise NotImplementedError

    def topk(self, logits, k, n=None):
        """The k largest of the first n columns (default: all) of one row of logits ([V] or
        [1, V]), best first (lower index first on ties): numpy int64 [min(k, n)]."""
        raise NotImplementedError

    def logprobs(self, logits, rows, targets, n=None):
        """Log-probabilities of chosen tokens: numpy float64 [K] with
            out[k] = logits[rows[k], targets[k]] - log(sum_j exp(logits[rows[k], j]))
        over the first n columns (default: all) of float32 logits [R, V]; rows and targets
        are integer sequences of length K. The sum runs in float64. Waits for the device;
        only K numbers cross to the host."""
        raise NotImplementedError
