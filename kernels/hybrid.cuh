// Fused element-wise kernels of the hybrid models' layers (Gated DeltaNet, gated attention):
// base.py's delta_gates, delta_qkv, rms_norm_gate, sigmoid_gate, each one launch for what the
// plain ops compute in two to seven (a decode step is bound by its launches). Every kernel
// serves any number of tokens N (decode, prefill, several sequences): nothing here reads the
// state.
#pragma once
#include "common.cuh"

#define HYB_ROWS 4  // rows (warps) per block of the row kernels below

// g = softplus(alpha + bias) * a (bias, a per head: [H]), beta = sigmoid(b); alpha, b, g, beta
// [N, H], n = N * H. softplus as ggml's (the argument itself above 20).
RX_EXTERN void delta_gates_f32(const float* alpha, const float* bias, const float* a, const float* b, float* g,
                               float* beta, long long n, int H) {
    GRID_STRIDE(i, n) {
        const int h = (int)(i % H);
        const float v = alpha[i] + bias[h];
        g[i] = (v > 20.f ? v : log1pf(expf(v))) * a[h];
        beta[i] = 1.f / (1.f + expf(-b[i]));
    }
}

// The conv output c [N, (2 nk + nv) d] split into heads of d: row h of token n (h < nk: q,
// nk <= h < 2 nk: k) L2-normalized as rms_norm(row, eps) * scale (eps = eps_model / d,
// scale = 1/sqrt(d)) into q or k [N, nk, d]; the rows h >= 2 nk copied into v [N, nv, d].
// A warp per row; the branch is per warp, so warp_sum's lanes all take it.
RX_EXTERN void __launch_bounds__(32 * HYB_ROWS)
delta_qkv_f32(const float* c, float* q, float* k, float* v, int N, int nk, int nv, int d, float eps, float scale) {
    const int rpt = 2 * nk + nv;  // rows per token
    const long long row = (long long)blockIdx.x * HYB_ROWS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= (long long)N * rpt) return;
    const long long n = row / rpt;
    const int h = (int)(row % rpt);
    const float* src = c + row * d;  // = c + n * rpt * d + h * d
    if (h >= 2 * nk) {
        float* dst = v + (n * nv + (h - 2 * nk)) * d;
        for (int i = lane; i < d; i += 32) dst[i] = src[i];
        return;
    }
    float ss = 0.f;
    for (int i = lane; i < d; i += 32) ss += src[i] * src[i];
    ss = warp_sum(ss);
    const float r = rsqrtf(ss / d + eps);
    float* dst = h < nk ? q + (n * nk + h) * d : k + (n * nk + (h - nk)) * d;
    for (int i = lane; i < d; i += 32) dst[i] = src[i] * r * scale;
}

// y = rms_norm(x, w, eps) * silu(z) over rows of d (x, z, y [rows, d]; w [d], may be null).
// A warp per row.
RX_EXTERN void __launch_bounds__(32 * HYB_ROWS)
rms_norm_gate_f32(const float* x, const float* w, const float* z, float* y, int rows, int d, float eps) {
    const long long row = (long long)blockIdx.x * HYB_ROWS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const float* xr = x + row * d;
    const float* zr = z + row * d;
    float* yr = y + row * d;
    float ss = 0.f;
    for (int i = lane; i < d; i += 32) ss += xr[i] * xr[i];
    ss = warp_sum(ss);
    const float r = rsqrtf(ss / d + eps);
    for (int i = lane; i < d; i += 32) yr[i] = xr[i] * r * (w ? w[i] : 1.f) * silu(zr[i]);
}

// y[r, c] = a[r, c] * sigmoid(x[r, start + c]) for c < width (a, y [rows, width]; x rows of W).
RX_EXTERN void sigmoid_gate_f32(const float* a, const float* x, float* y, long long n, int width, int W, int start) {
    GRID_STRIDE(i, n) {
        const long long r = i / width, c = i % width;
        y[i] = a[i] * (1.f / (1.f + expf(-x[r * W + start + c])));
    }
}
