// The element-wise steps gpt-oss's and Llama 4's layers added (backends/base.py moe and
// pos_scale): per-expert biases and the clamped SwiGLU of gpt-oss's experts, Llama 4's
// input weighted per chosen expert, and its attention temperature per position. The expert
// products themselves are moe.cuh's kernels (moe_mm_T, moe_glu_T, moe_down_T). Attention
// sinks and chunked attention live in the attention kernels (attention.cuh, fused.cuh,
// flash.cuh: sinks / span).
#pragma once
#include "common.cuh"

// gpt-oss's experts: for pair p (token p / k's j-th chosen expert e = ids[p]) and r < F,
//   g = G[p, r] + bg[e, r], u = U[p, r] + bu[e, r]   (bg, bu may be null: no bias)
//   x = min(g, limit), y = clamp(u, -limit, limit), H[p, r] = x / (1 + exp(-alpha x)) * (y + 1)
// llama.cpp's swiglu_oai (alpha 1.702, limit 7; common.cuh). G, U, H [n_pairs, F]. The grouped
// prefill (mma.cuh's mmaglu_moe_*, act 2) applies the same biases and unit in its epilogue.
RX_EXTERN void moe_swiglu_oai_f32(const float* __restrict__ G, const float* __restrict__ U,
                                  const float* __restrict__ bg, const float* __restrict__ bu,
                                  const int* __restrict__ ids, float* __restrict__ H, long long n, int F,
                                  float alpha, float limit) {
    GRID_STRIDE(i, n) {
        const long long p = i / F, r = i % F;
        const long long e = ids[p];
        float g = G[i], u = U[i];
        if (bg) g += bg[e * F + r];
        if (bu) u += bu[e * F + r];
        H[i] = swiglu_oai(g, u, alpha, limit);
    }
}

// gpt-oss's down biases, weighted like the experts' outputs and added to them:
// Y[t, c] += sum_j wts[t * k + j] * bd[ids[t * k + j], c] (slot order). Y [N, D].
RX_EXTERN void moe_down_bias_f32(float* __restrict__ Y, const float* __restrict__ bd, const int* __restrict__ ids,
                                 const float* __restrict__ wts, long long n, int D, int k) {
    GRID_STRIDE(i, n) {
        const long long t = i / D, c = i % D;
        float s = 0.f;
        for (int j = 0; j < k; j++) s += wts[t * k + j] * bd[(long long)ids[t * k + j] * D + c];
        Y[i] += s;
    }
}

// Llama 4's weight before the experts: X2[p, c] = X[p / k, c] * wts[p] for the n_pairs pairs
// and unit weights for the down projection's sum (ones[p] = 1). X [N, K], X2 [N*k, K].
RX_EXTERN void moe_weight_input_f32(const float* __restrict__ X, const float* __restrict__ wts,
                                    float* __restrict__ X2, float* __restrict__ ones, long long n, int K, int k) {
    GRID_STRIDE(i, n) {
        const long long p = i / K, c = i % K;
        X2[i] = X[(p / k) * K + c] * wts[p];
        if (c == 0) ones[p] = 1.f;
    }
}

// Llama 4's attention temperature: y[t, c] = x[t, c] * (log(floor((pos[t] + offset) / floor_)
// + 1) * scale + 1), the factor as llama.cpp computes it (float position, double log), rows of
// `row` values.
RX_EXTERN void pos_scale_f32(const float* __restrict__ x, const int* __restrict__ pos, float* __restrict__ y,
                             long long n, int row, float floor_, float scale, float offset) {
    GRID_STRIDE(i, n) {
        const float p = (float)pos[i / row];
        const double q = (double)floorf((p + offset) / floor_);
        y[i] = x[i] * (float)(log(q + 1.0) * (double)scale + 1.0);
    }
}
