// y[n, r] = sum_k W[r, k] * x[n, k] with W in its ggml block format (row r is `row_bytes`
// bytes at W + r*row_bytes). One warp per output row; lane l reads chunks l, l+32, ...
// of 8 weights, dequantizes them in registers and applies them to NT tokens at once.
// Grid: (ceil(M / ROWS_PER_BLOCK), ceil(N / NT)); block: 32*ROWS_PER_BLOCK threads.
#pragma once
#include "quants.cuh"

#define MM_ROWS 4

template <int T, int NT>
__device__ __forceinline__ void mm_body(const uint8_t* __restrict__ W, const float* __restrict__ X,
                                        float* __restrict__ Y, int K, int M, int N,
                                        long long row_bytes, int accumulate) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * MM_ROWS + (threadIdx.x >> 5);
    const int n0 = blockIdx.y * NT;
    if (row >= M) return;
    const int nt = min(NT, N - n0);
    const uint8_t* wr = W + row * row_bytes;
    const float* xb = X + (long long)n0 * K;
    constexpr int CPB = QT<T>::QK / 8;  // chunks per block
    const int nchunks = K >> 3;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.f;
    for (int ch = lane; ch < nchunks; ch += 32) {
        float w[8];
        deq8<T>(wr + (ch / CPB) * QT<T>::BYTES, ch % CPB, w);
        const int k0 = ch * 8;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t < nt) {
                const float4* xp = reinterpret_cast<const float4*>(xb + (long long)t * K + k0);
                const float4 a = __ldg(xp), c = __ldg(xp + 1);
                acc[t] += w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w +
                          w[4] * c.x + w[5] * c.y + w[6] * c.z + w[7] * c.w;
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float s = warp_sum(acc[t]);
        if (lane == 0 && t < nt) {
            float* yp = Y + (long long)(n0 + t) * M + row;
            *yp = accumulate ? *yp + s : s;
        }
    }
}

// Rows of W, dequantized: out[i, :] = W[ids[i], :] (embedding lookup). One thread per chunk.
// Grid: (ceil(K/8 / 128), n_ids); block 128.
template <int T>
__device__ __forceinline__ void get_rows_body(const uint8_t* __restrict__ W, const int* __restrict__ ids,
                                              float* __restrict__ out, int K, long long row_bytes,
                                              float scale) {
    const int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= (K >> 3)) return;
    constexpr int CPB = QT<T>::QK / 8;
    const uint8_t* wr = W + (long long)ids[blockIdx.y] * row_bytes;
    float w[8];
    deq8<T>(wr + (ch / CPB) * QT<T>::BYTES, ch % CPB, w);
    float* o = out + (long long)blockIdx.y * K + ch * 8;
#pragma unroll
    for (int i = 0; i < 8; i++) o[i] = w[i] * scale;
}

#define RX_MM(NAME, T)                                                                              \
    RX_EXTERN void __launch_bounds__(128) mm1_##NAME(const uint8_t* W, const float* X, float* Y,     \
                                                     int K, int M, int N, long long rb, int acc) {   \
        mm_body<T, 1>(W, X, Y, K, M, N, rb, acc);                                                   \
    }                                                                                               \
    RX_EXTERN void __launch_bounds__(128) mm4_##NAME(const uint8_t* W, const float* X, float* Y,     \
                                                     int K, int M, int N, long long rb, int acc) {   \
        mm_body<T, 4>(W, X, Y, K, M, N, rb, acc);                                                   \
    }                                                                                               \
    RX_EXTERN void __launch_bounds__(128) mm8_##NAME(const uint8_t* W, const float* X, float* Y,     \
                                                     int K, int M, int N, long long rb, int acc) {   \
        mm_body<T, 8>(W, X, Y, K, M, N, rb, acc);                                                   \
    }                                                                                               \
    RX_EXTERN void get_rows_##NAME(const uint8_t* W, const int* ids, float* out, int K,             \
                                   long long rb, float scale) {                                      \
        get_rows_body<T>(W, ids, out, K, rb, scale);                                                \
    }

RX_MM(f32, T_F32)
RX_MM(f16, T_F16)
RX_MM(bf16, T_BF16)
RX_MM(q4_0, T_Q4_0)
RX_MM(q4_1, T_Q4_1)
RX_MM(q5_0, T_Q5_0)
RX_MM(q5_1, T_Q5_1)
RX_MM(q8_0, T_Q8_0)
RX_MM(q4_k, T_Q4_K)
RX_MM(q5_k, T_Q5_K)
RX_MM(q6_k, T_Q6_K)
