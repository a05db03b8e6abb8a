// Element-wise and row-wise kernels over float32 activations.
#pragma once
#include "common.cuh"

// y = a + b
RX_EXTERN void add_f32(const float* a, const float* b, float* y, long long n) {
    GRID_STRIDE(i, n) y[i] = a[i] + b[i];
}
// y = a * b
RX_EXTERN void mul_f32(const float* a, const float* b, float* y, long long n) {
    GRID_STRIDE(i, n) y[i] = a[i] * b[i];
}
// y = a * s
RX_EXTERN void scale_f32(const float* a, float s, float* y, long long n) {
    GRID_STRIDE(i, n) y[i] = a[i] * s;
}
// y[r, c] = a[r, c] + v[c]  (bias), v of length ncol
RX_EXTERN void add_row_f32(const float* a, const float* v, float* y, long long n, int ncol) {
    GRID_STRIDE(i, n) y[i] = a[i] + v[i % ncol];
}
// y[r, c] = a[r, c] * v[c]
RX_EXTERN void mul_row_f32(const float* a, const float* v, float* y, long long n, int ncol) {
    GRID_STRIDE(i, n) y[i] = a[i] * v[i % ncol];
}
// y = c * tanh(a / c)
RX_EXTERN void softcap_f32(const float* a, float c, float* y, long long n) {
    GRID_STRIDE(i, n) y[i] = c * tanhf(a[i] / c);
}
RX_EXTERN void silu_f32(const float* a, float* y, long long n) {
    GRID_STRIDE(i, n) y[i] = silu(a[i]);
}
RX_EXTERN void gelu_f32(const float* a, float* y, long long n) {
    GRID_STRIDE(i, n) y[i] = gelu_tanh(a[i]);
}
// Fused gated units over g, u of shape [rows, ncol]: y = act(g) * u.
// gs/us: row strides of g and u (so g and u may be the two halves of one [rows, 2*ncol] buffer).
RX_EXTERN void swiglu_f32(const float* g, const float* u, float* y, long long n, int ncol, int gs, int us) {
    GRID_STRIDE(i, n) {
        const long long r = i / ncol, c = i % ncol;
        y[i] = silu(g[r * gs + c]) * u[r * us + c];
    }
}
RX_EXTERN void geglu_f32(const float* g, const float* u, float* y, long long n, int ncol, int gs, int us) {
    GRID_STRIDE(i, n) {
        const long long r = i / ncol, c = i % ncol;
        y[i] = gelu_tanh(g[r * gs + c]) * u[r * us + c];
    }
}
RX_EXTERN void copy_f32(const float* a, float* y, long long n) {
    GRID_STRIDE(i, n) y[i] = a[i];
}

// RMSNorm over rows of length `dim`: y = x / sqrt(mean(x^2) + eps) * w  (w may be null).
// One block per row.
RX_EXTERN void rmsnorm_f32(const float* x, const float* w, float* y, int dim, float eps) {
    const float* xr = x + (long long)blockIdx.x * dim;
    float* yr = y + (long long)blockIdx.x * dim;
    float ss = 0.f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss);
    const float r = rsqrtf(ss / dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = xr[i] * r * (w ? w[i] : 1.f);
}

// The rotation of pair i (0 <= i < n_rot/2) at position p: angle
// p * freq_scale * base^(-2i/n_rot) / ff[i] (ff may be null), reduced in double precision so
// that long positions keep float accuracy.
__device__ __forceinline__ void rope_sincos(int p, int i, int n_rot, float base, float freq_scale,
                                            const float* ff, float* s, float* c) {
    double inv = pow((double)base, -2.0 * i / n_rot) * freq_scale;
    if (ff) inv /= ff[i];
    const double ang = fmod((double)p * inv, 6.283185307179586);
    sincosf((float)ang, s, c);
}

// Rotary embedding in place on x[N, H, hd]: the first n_rot dims of each head rotate by
// rope_sincos's angle; neox pairs (i, i + n_rot/2), otherwise (2i, 2i+1). mscale multiplies
// both outputs (YaRN attention factor).
RX_EXTERN void rope_f32(float* x, const int* pos, int N, int H, int hd, int n_rot, float base,
                        float freq_scale, const float* ff, int neox, float mscale) {
    const int half_rot = n_rot >> 1;
    const long long total = (long long)N * H * half_rot;
    GRID_STRIDE(t, total) {
        const int i = t % half_rot;
        const long long nh = t / half_rot;
        const int n = nh / H;
        float s, c;
        rope_sincos(pos[n], i, n_rot, base, freq_scale, ff, &s, &c);
        float* v = x + nh * hd;
        const int a = neox ? i : 2 * i, b = neox ? i + half_rot : 2 * i + 1;
        const float x0 = v[a], x1 = v[b];
        v[a] = (x0 * c - x1 * s) * mscale;
        v[b] = (x0 * s + x1 * c) * mscale;
    }
}

// rmsnorm_f32 over each head row of x[N, H, hd] (weight w[hd], may be null), then rope_f32,
// in place: one warp per (n, h) row, RMSNORM_ROPE_ROWS rows a block. The warp reads the row
// for the sum of squares (warp_sum's shuffles order all those reads before any write), then
// each lane reads, normalizes, rotates and writes back its own pairs and tail dims.
#define RMSNORM_ROPE_ROWS 4
RX_EXTERN void __launch_bounds__(32 * RMSNORM_ROPE_ROWS)
rmsnorm_rope_f32(float* x, const float* w, const int* pos, int rows, int H, int hd, float eps, int n_rot,
                 float base, float freq_scale, const float* ff, int neox, float mscale) {
    const int row = blockIdx.x * RMSNORM_ROPE_ROWS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    float* v = x + (long long)row * hd;
    float ss = 0.f;
    for (int i = lane; i < hd; i += 32) ss += v[i] * v[i];
    ss = warp_sum(ss);
    const float r = rsqrtf(ss / hd + eps);
    const int p = pos[row / H], half_rot = n_rot >> 1;
    for (int i = lane; i < half_rot; i += 32) {
        const int a = neox ? i : 2 * i, b = neox ? i + half_rot : 2 * i + 1;
        const float x0 = v[a] * r * (w ? w[a] : 1.f), x1 = v[b] * r * (w ? w[b] : 1.f);
        float s, c;
        rope_sincos(p, i, n_rot, base, freq_scale, ff, &s, &c);
        v[a] = (x0 * c - x1 * s) * mscale;
        v[b] = (x0 * s + x1 * c) * mscale;
    }
    for (int i = n_rot + lane; i < hd; i += 32) v[i] = v[i] * r * (w ? w[i] : 1.f);
}

