"""Float64 references written from the definitions, shared by the tests, the op checks
(opchecks.py) and the GPU harnesses: rope, attention, the fused rms_norm+rope, and whole
tiny models (synthetic.tiny_gguf) end to end."""

import math

import numpy as np


def rms_norm_rope_ref(x, w, eps, pos, n_rot, base, freq_scale, factors, neox, mscale):
    """Per-head RMSNorm (weight w, or none) then rope over the first n_rot dimensions of
    x [N, H, hd], normal or neox pairs, times mscale (the fused rms_norm_rope op)."""
    x = x.astype(np.float64)
    y = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps)
    if w is not None:
        y = y * w
    out = y.copy()
    half = n_rot // 2
    i = np.arange(half)
    inv = base ** (-2.0 * i / n_rot) * freq_scale
    if factors is not None:
        inv = inv / factors
    ang = np.asarray(pos, np.float64)[:, None] * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = (i, i + half) if neox else (2 * i, 2 * i + 1)
    out[..., a] = (y[..., a] * c - y[..., b] * s) * mscale
    out[..., b] = (y[..., a] * s + y[..., b] * c) * mscale
    return out


def attention_ref(q, K, V, pos, n_kv, scale, softcap=0.0, causal=True, window=0, mask=None, sinks=None, chunk=0):
    """base.py's attention formula in float64, query by query and head by head (q [N, Hq, hd],
    K and V [Hkv, n, hd]; the reference of opchecks.check_attention and tests/test_engine_ops.py);
    attention sinks [Hq] in the denominator, chunked attention's chunk size."""
    q, K, V = (np.asarray(a, np.float64) for a in (q, K, V))
    N, Hq, hd = q.shape
    Hkv = K.shape[0]
    g = Hq // Hkv
    out = np.zeros((N, Hq, V.shape[-1]))
    for n in range(N):
        for h in range(Hq):
            s = (K[h // g, :n_kv] @ q[n, h]) * scale
            if softcap:
                s = softcap * np.tanh(s / softcap)
            j = np.arange(n_kv)
            keep = np.ones(n_kv, bool)
            if causal:
                keep &= j <= pos[n]
            if window:
                keep &= j > pos[n] - window
            if chunk:
                keep &= j >= pos[n] - pos[n] % chunk
            if mask is not None:
                s = s + mask[n, :n_kv]
            s = np.where(keep, s, -np.inf)
            if np.all(np.isneginf(s)):
                continue
            m = s.max() if sinks is None else max(s.max(), float(sinks[h]))
            p = np.exp(s - m)
            denom = p.sum() + (0.0 if sinks is None else np.exp(float(sinks[h]) - m))
            out[n, h] = (p / denom) @ V[h // g, :n_kv]
    return out


def _rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope(x, pos, base, scale, neox, factors=None):
    N, H, hd = x.shape
    half = hd // 2
    inv = base ** (-np.arange(half) * 2.0 / hd) * scale
    if factors is not None:
        inv = inv / factors
    ang = np.asarray(pos, np.float64)[:, None, None] * inv[None, None, :]
    c, s = np.cos(ang), np.sin(ang)
    y = x.copy()
    ia, ib = (np.arange(half), np.arange(half) + half) if neox else (np.arange(0, hd, 2), np.arange(1, hd, 2))
    y[..., ia] = x[..., ia] * c - x[..., ib] * s
    y[..., ib] = x[..., ia] * s + x[..., ib] * c
    return y


def reference_logits(t, cfg, ids, hidden=False):
    """Logits [len(ids), n_vocab] (or, with hidden, the final normed hidden states) of the
    tiny model of synthetic.tiny_gguf(**cfg) with tensors t (its return value) for the
    prompt ids at positions 0.., in float64, written from the architectures' definitions."""
    arch = cfg["arch"]
    n_embd = t["token_embd.weight"].shape[1]
    n_layer, n_head, n_kv = cfg["n_layer"], cfg.get("n_head", 4), cfg.get("n_head_kv", 2)
    hd = cfg.get("head_dim") or n_embd // n_head
    eps = cfg.get("eps", 1e-5)
    gemma = arch == "gemma3"
    neox = arch != "llama"
    N = len(ids)
    pos = np.arange(N)
    x = t["token_embd.weight"][ids] * (math.sqrt(n_embd) if gemma else 1.0)
    for i in range(n_layer):
        p = f"blk.{i}."
        pattern = cfg.get("pattern")
        if isinstance(pattern, list):
            swa = gemma and cfg.get("window") and pattern[i]
        else:
            swa = gemma and cfg.get("window") and i % pattern < pattern - 1
        if gemma and swa:
            base, scale = cfg.get("rope_base_swa", 10000.0), 1.0
        else:
            base = cfg.get("rope_base", 10000.0)
            scale = 1.0 / cfg["rope_factor"] if cfg.get("rope_factor") else 1.0
        h = _rms(x, t[p + "attn_norm.weight"], eps)
        q = h @ t[p + "attn_q.weight"].T + t.get(p + "attn_q.bias", 0.0)
        k = h @ t[p + "attn_k.weight"].T + t.get(p + "attn_k.bias", 0.0)
        v = h @ t[p + "attn_v.weight"].T + t.get(p + "attn_v.bias", 0.0)
        q, k, v = q.reshape(N, n_head, hd), k.reshape(N, n_kv, hd), v.reshape(N, n_kv, hd)
        if cfg.get("qk_norm"):
            q = _rms(q, t[p + "attn_q_norm.weight"], eps)
            k = _rms(k, t[p + "attn_k_norm.weight"], eps)
        q = _rope(q, pos, base, scale, neox, t.get("rope_freqs.weight"))
        k = _rope(k, pos, base, scale, neox, t.get("rope_freqs.weight"))
        att = np.zeros((N, n_head, hd))
        for hq in range(n_head):
            kv = hq // (n_head // n_kv)
            s = q[:, hq] @ k[:, kv].T / math.sqrt(hd)
            if cfg.get("attn_softcap"):
                s = cfg["attn_softcap"] * np.tanh(s / cfg["attn_softcap"])
            ok = pos[None, :] <= pos[:, None]
            if swa:
                ok &= pos[:, None] - pos[None, :] < cfg["window"]
            s = np.where(ok, s, -np.inf)
            e = np.exp(s - s.max(-1, keepdims=True))
            att[:, hq] = (e / e.sum(-1, keepdims=True)) @ v[:, kv]
        o = att.reshape(N, -1) @ t[p + "attn_output.weight"].T
        if gemma:
            o = _rms(o, t[p + "post_attention_norm.weight"], eps)
        x = x + o
        h = _rms(x, t[p + "ffn_norm.weight"], eps)
        g = h @ t[p + "ffn_gate.weight"].T
        if gemma:
            g = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))
        else:
            g = g / (1 + np.exp(-g))
        f = (g * (h @ t[p + "ffn_up.weight"].T)) @ t[p + "ffn_down.weight"].T
        if gemma:
            f = _rms(f, t[p + "post_ffw_norm.weight"], eps)
        x = x + f
    x = _rms(x, t["output_norm.weight"], eps)
    if hidden:
        return x
    logits = x @ t.get("output.weight", t["token_embd.weight"]).T
    if cfg.get("final_softcap"):
        logits = cfg["final_softcap"] * np.tanh(logits / cfg["final_softcap"])
    return logits


def ggml_cpu_gelu(a):
    """The tanh GELU as llama.cpp's CPU backend evaluates it (GGML_GELU_FP16): the input
    rounded to float16, looked up in a float16 table of gelu, except x <= -10 (0) and
    x >= 10 (x). Tests that compare a GELU model with llama.cpp put this in place of the
    numpy backend's exact gelu, so that the comparison measures the model, not that table."""
    a = np.asarray(a, np.float32)
    h = a.astype(np.float16).astype(np.float32)
    # in float32, as x + c x^3 (this form matched llama.cpp's table best on the gemma4 models;
    # the fp16 rounding of the result flips with the last bit of the float32 value)
    y = np.float32(0.5) * h * (np.float32(1) + np.tanh(np.float32(math.sqrt(2 / math.pi)) *
                                                      (h + np.float32(0.044715) * h * h * h)))
    y = y.astype(np.float16).astype(np.float32)
    return np.where(a <= -10, np.float32(0), np.where(a >= 10, a, y)).astype(np.float32)


# ---------------------------------------------------------------------------------------
# recurrent layers: plain sequential float64 references of the backend ops (base.py)
def ssm_conv_reference(x, state, w):
    """One sequence: y [T, C] and the new state [K-1, C] (float64)."""
    x, state, w = (np.asarray(a, np.float64) for a in (x, state, w))
    K = w.shape[1]
    xx = np.concatenate([state, x])
    y = np.stack([(xx[t:t + K] * w.T).sum(axis=0) for t in range(len(x))])
    return y, xx[len(x):]


def delta_net_reference(q, k, v, g, beta, S, scale):
    """One sequence, token by token: out [T, Hv, D] and the final state [Hv, D, D] (float64)."""
    q, k, v, g, beta, S = (np.array(a, np.float64) for a in (q, k, v, g, beta, S))
    Hk, Hv = q.shape[1], v.shape[1]
    out = np.zeros(v.shape)
    for t in range(len(v)):
        for h in range(Hv):
            kk, qq = k[t, h % Hk], q[t, h % Hk]
            S[h] *= np.exp(g[t, h])
            S[h] += beta[t, h] * np.outer(v[t, h] - S[h] @ kk, kk)
            out[t, h] = scale * (S[h] @ qq)
    return out, S


def ssm_scan_reference(x, dt, A, B, C, S, D=None):
    """One sequence of the Mamba-2 scan, token by token: y [T, H, P], final state [H, P, Ns]."""
    x, dt, A, B, C, S = (np.array(a, np.float64) for a in (x, dt, A, B, C, S))
    H, G = x.shape[1], B.shape[1]
    y = np.zeros(x.shape)
    for t in range(len(x)):
        for h in range(H):
            gi = h // (H // G)
            S[h] = np.exp(dt[t, h] * A[h]) * S[h] + dt[t, h] * np.outer(x[t, h], B[t, gi])
            y[t, h] = S[h] @ C[t, gi] + (0.0 if D is None else D[h] * x[t, h])
    return y, S
