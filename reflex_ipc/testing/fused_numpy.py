"""A numpy backend with the fused ops (base.FUSED_OPS) written independently: the fused decode
path of the layer blocks, checked without a GPU (tests/arch/test_matrix.py, tests/test_fused_ops.py)."""

import numpy as np

from ..backends.numpy_ops import NumpyOps
from .references import rms_norm_rope_ref


class FusedNumpy(NumpyOps):
    """The numpy backend plus every op of base.FUSED_OPS written independently from its
    definition (float64 inside), so that what the layer blocks hand the fused ops (which norm,
    which eps, positions vs slots, which cache, the element-wise chains of the hybrid layers) is
    checked on the CPU the way the CUDA backend receives it: a model on FusedNumpy equals the
    same model on NumpyOps within float32 rounding."""

    def rms_norm_matmul_n(self, x, w_norm, eps, ws):
        h = x.astype(np.float64) / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + eps)
        h = h if w_norm is None else h * w_norm
        return [(h @ np.asarray(w, np.float64).T).astype(np.float32) for w in ws]

    def rms_norm_matmul_glu(self, x, w_norm, eps, w_gate, w_up, act="silu"):
        g, u = self.rms_norm_matmul_n(x, w_norm, eps, [w_gate, w_up])
        return (self.swiglu if act == "silu" else self.geglu)(g, u)

    def qk_rope_kv_store(self, q, k, v, q_norm, k_norm, eps, pos, k_cache, v_cache, slots, *, norm=True,
                         n_rot=None, base=10000.0, freq_scale=1.0, freq_factors=None, neox=False, mscale=1.0):
        n_rot = q.shape[-1] if n_rot is None else n_rot
        for a, w in ((q, q_norm), (k, k_norm)):
            r = rms_norm_rope_ref(a, w, eps, pos, n_rot, base, freq_scale, freq_factors, neox, mscale)
            if not norm:  # rope alone: the reference's normalization undone
                r = rms_norm_rope_ref(a, None, eps, pos, n_rot, base, freq_scale, freq_factors, neox, mscale) * \
                    np.sqrt((a.astype(np.float64) ** 2).mean(-1, keepdims=True) + eps)
            a[...] = r
        k_cache[:, slots] = k.transpose(1, 0, 2)
        v_cache[:, slots] = v.transpose(1, 0, 2)
        return q, k

    def residual_add(self, x, y, w, eps, *, norm=True, scale=1.0, out_scale=1.0):
        y = y.astype(np.float64)
        if norm:
            y = y / np.sqrt((y * y).mean(-1, keepdims=True) + eps) * (1.0 if w is None else w)
        x[...] = ((x + scale * y) * out_scale).astype(np.float32)
        return x

    def delta_gates(self, alpha, dt_bias, a, b):
        v = alpha.astype(np.float64) + dt_bias
        sp = np.where(v > 20, v, np.log1p(np.exp(np.minimum(v, 20))))
        return (sp * a).astype(np.float32), (1 / (1 + np.exp(-b.astype(np.float64)))).astype(np.float32)

    def ssm_conv_silu(self, x, state, w, seqs=None):
        y = self.ssm_conv(x, state, w, seqs).astype(np.float64)
        return (y / (1 + np.exp(-y))).astype(np.float32)

    def delta_qkv(self, c, n_k, n_v, d, eps):
        h = c.astype(np.float64).reshape(c.shape[0], 2 * n_k + n_v, d)
        qk = h[:, :2 * n_k] / np.sqrt((h[:, :2 * n_k] ** 2).sum(-1, keepdims=True) + eps)
        return qk[:, :n_k].astype(np.float32), qk[:, n_k:].astype(np.float32), h[:, 2 * n_k:].astype(np.float32)

    def rms_norm_gate(self, x, w, eps, z):
        x, z = x.astype(np.float64), z.astype(np.float64)
        return (x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w * z / (1 + np.exp(-z))).astype(np.float32)

    def sigmoid_gate(self, a, x, start, width):
        s = 1 / (1 + np.exp(-x[..., start:start + width].astype(np.float64)))
        return (a * s.reshape(a.shape)).astype(np.float32)
