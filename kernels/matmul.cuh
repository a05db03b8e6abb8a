// y[n, r] = sum_k W[r, k] * x[n, k] with W in its ggml block format (row r is `row_bytes`
// bytes at W + r*row_bytes). One warp per output row; lane l reads chunks l, l+32, ...
// of 8 weights, dequantizes them in registers and applies them to NT tokens at once.
// Grid: (ceil(rows / MM_ROWS), ceil(N / NT)); block: 32*MM_ROWS threads.
//
// Three kernel families share the row loop (dot_rows):
//   mm{NT}_T     one weight; optionally y += (the residual add folded into the product)
//   mmn{NT}_T    up to three weights of one type and width K over the same x (q/k/v):
//                the grid covers the rows of all of them, each warp finds its weight
//   mmglu{NT}_T  gate and up rows of one index from one x, then y = act(g) * u
#pragma once
#include "quants.cuh"

#define MM_ROWS 4

// acc[r][t] = the lane's share of dot(row r of the NW rows wr[], x of token t): chunks
// lane, lane+32, ... of the K/8 chunks (a warp_sum completes it); tokens t >= nt are
// skipped. The 8 inputs of a chunk are loaded once and used for all NW rows.
template <int T, int NT, int NW>
__device__ __forceinline__ void dot_rows(const uint8_t* const (&wr)[NW], const float* __restrict__ xb,
                                         int K, int nt, float (&acc)[NW][NT]) {
    const int lane = threadIdx.x & 31;
    constexpr int CPB = QT<T>::QK / 8;  // chunks per block
    const int nchunks = K >> 3;
#pragma unroll
    for (int r = 0; r < NW; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.f;
    for (int ch = lane; ch < nchunks; ch += 32) {
        float w[NW][8];
#pragma unroll
        for (int r = 0; r < NW; r++) deq8<T>(wr[r] + (ch / CPB) * QT<T>::BYTES, ch % CPB, w[r]);
        const int k0 = ch * 8;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t < nt) {
                const float4* xp = reinterpret_cast<const float4*>(xb + (long long)t * K + k0);
                const float4 a = __ldg(xp), c = __ldg(xp + 1);
#pragma unroll
                for (int r = 0; r < NW; r++)
                    acc[r][t] += w[r][0] * a.x + w[r][1] * a.y + w[r][2] * a.z + w[r][3] * a.w +
                                 w[r][4] * c.x + w[r][5] * c.y + w[r][6] * c.z + w[r][7] * c.w;
            }
        }
    }
}

// Row `row` of one weight (M rows) for tokens blockIdx.y*NT ..: y = dot (or y += dot).
template <int T, int NT>
__device__ __forceinline__ void mm_row(const uint8_t* __restrict__ W, const float* __restrict__ X,
                                       float* __restrict__ Y, int K, int M, int N, long long row_bytes,
                                       int accumulate, int row) {
    const int n0 = blockIdx.y * NT;
    const int nt = min(NT, N - n0);
    const uint8_t* wr[1] = {W + row * row_bytes};
    float acc[1][NT];
    dot_rows<T, NT, 1>(wr, X + (long long)n0 * K, K, nt, acc);
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float s = warp_sum(acc[0][t]);
        if (lane == 0 && t < nt) {
            float* yp = Y + (long long)(n0 + t) * M + row;
            *yp = accumulate ? *yp + s : s;
        }
    }
}

template <int T, int NT>
__device__ __forceinline__ void mm_body(const uint8_t* __restrict__ W, const float* __restrict__ X,
                                        float* __restrict__ Y, int K, int M, int N,
                                        long long row_bytes, int accumulate) {
    const int row = blockIdx.x * MM_ROWS + (threadIdx.x >> 5);
    if (row >= M) return;
    mm_row<T, NT>(W, X, Y, K, M, N, row_bytes, accumulate, row);
}

// Up to three weights W0 [M0, K], W1 [M1, K], W2 [M2, K] (one type, one row_bytes) times
// the same X [N, K] into separate outputs Y0 [N, M0], Y1 [N, M1], Y2 [N, M2]. The grid
// covers M0 + M1 + M2 rows; a block may hold rows of two weights. An unused weight: M = 0.
template <int T, int NT>
__device__ __forceinline__ void mmn_body(const uint8_t* W0, const uint8_t* W1, const uint8_t* W2,
                                         const float* X, float* Y0, float* Y1, float* Y2, int K,
                                         int M0, int M1, int M2, int N, long long row_bytes) {
    int row = blockIdx.x * MM_ROWS + (threadIdx.x >> 5);
    const uint8_t* W = W0;
    float* Y = Y0;
    int M = M0;
    if (row >= M0) {
        row -= M0;
        W = W1, Y = Y1, M = M1;
        if (row >= M1) {
            row -= M1;
            W = W2, Y = Y2, M = M2;
            if (row >= M2) return;
        }
    }
    mm_row<T, NT>(W, X, Y, K, M, N, row_bytes, 0, row);
}

// Gated unit: y[n, r] = act(dot(Wg[r], x[n])) * dot(Wu[r], x[n]); act 0 = silu, 1 = tanh gelu.
// Wg and Wu are [M, K] of one type and row_bytes.
template <int T, int NT>
__device__ __forceinline__ void mmglu_body(const uint8_t* __restrict__ Wg, const uint8_t* __restrict__ Wu,
                                           const float* __restrict__ X, float* __restrict__ Y, int K,
                                           int M, int N, long long row_bytes, int act) {
    const int row = blockIdx.x * MM_ROWS + (threadIdx.x >> 5);
    if (row >= M) return;
    const int n0 = blockIdx.y * NT;
    const int nt = min(NT, N - n0);
    const uint8_t* wr[2] = {Wg + row * row_bytes, Wu + row * row_bytes};
    float acc[2][NT];
    dot_rows<T, NT, 2>(wr, X + (long long)n0 * K, K, nt, acc);
    // every lane gets every token's sums; lane t finishes token t (one copy of the activation)
    const int lane = threadIdx.x & 31;
    float g = 0.f, u = 0.f;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float gs = warp_sum(acc[0][t]), us = warp_sum(acc[1][t]);
        if (lane == t) g = gs, u = us;
    }
    if (lane < nt) Y[(long long)(n0 + lane) * M + row] = (act ? gelu_tanh(g) : silu(g)) * u;
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

#define RX_MM_NT(NAME, T, NT)                                                                       \
    RX_EXTERN void __launch_bounds__(128) mm##NT##_##NAME(const uint8_t* W, const float* X, float* Y, \
                                                          int K, int M, int N, long long rb, int acc) { \
        mm_body<T, NT>(W, X, Y, K, M, N, rb, acc);                                                  \
    }                                                                                               \
    RX_EXTERN void __launch_bounds__(128) mmn##NT##_##NAME(                                         \
        const uint8_t* W0, const uint8_t* W1, const uint8_t* W2, const float* X, float* Y0,        \
        float* Y1, float* Y2, int K, int M0, int M1, int M2, int N, long long rb) {                \
        mmn_body<T, NT>(W0, W1, W2, X, Y0, Y1, Y2, K, M0, M1, M2, N, rb);                           \
    }                                                                                               \
    RX_EXTERN void __launch_bounds__(128, 1) mmglu##NT##_##NAME(const uint8_t* Wg, const uint8_t* Wu,  \
                                                             const float* X, float* Y, int K, int M, \
                                                             int N, long long rb, int act) {         \
        mmglu_body<T, NT>(Wg, Wu, X, Y, K, M, N, rb, act);                                          \
    }

#define RX_MM(NAME, T)                                                                              \
    RX_MM_NT(NAME, T, 1)                                                                            \
    RX_MM_NT(NAME, T, 4)                                                                            \
    RX_MM_NT(NAME, T, 8)                                                                            \
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
