// Mixture-of-experts decode on matvec.cuh's machinery (wide loads, factored scales, groups of
// warps), for its formats only (Q4_K, Q5_K, Q6_K, Q8_0; the other formats keep moe.cuh's
// generic moe_glu / moe_down). Like those, they read each pair's expert from the device ids
// (graph-capturable: the launch arguments do not depend on the routing). Only in the main
// fatbin (kernels/all.cu): the IQ unit has no MV formats.
//
//   moe_mvglu{V}_T  Y[p, r] = act(Wg[row] . x) * (Wu[row] . x), row = ids[p] * es + r,
//                   x = X[p / x_div]; V one of matvec.cuh's variants (R, W, G, U: c, d, e).
//                   Grid (ceil(F / (G * R)), N * k); block 32 * W * G.
//   moe_mvdown_T    Y[n, r] = sum over j < k, in slot order, of wts[p] * (W[ids[p] * es + r] . H[p])
//                   (p = n * k + j). A block holds MOE_MVD_R rows of one token for all its k
//                   pairs: warp w takes pair j0 + w of each chunk of nw = blockDim.x / 32 pairs
//                   (a warp over whole rows, mv_core with W = 1), its weighted dots go to shared
//                   memory, and MOE_MVD_R threads add them in slot order (no atomics: the same
//                   bits for the same inputs). Grid (ceil(D / MOE_MVD_R), N); block 32 * min(k, 8).
#pragma once
#include "matvec.cuh"

// Register caps (launch bounds): 16 warps an SM for the gate/up variants, 2 blocks of 8 warps
// for down; uncapped, ptxas takes 160-215 registers and an SM holds 8-12 warps of these
// latency-bound loops. Under the cap only Q4_K's e / c spill (16 bytes, as matvec.cuh's
// mvglue_q4_k) and Q5_K's e / c (~200 bytes: the backend picks d for Q5_K).
#define MOE_MVD_R 4
#define MOE_MVD_WARPS 8
#define MOE_MVG_WARPS_SM 16
#define MOE_MVD_MINB 2

template <int T, int R, int W, int G, int U>
__device__ __forceinline__ void moe_mvglu_body(const uint8_t* __restrict__ Wg, const uint8_t* __restrict__ Wu,
                                               const float* __restrict__ X, const int* __restrict__ ids,
                                               float* __restrict__ Y, int K, int F, int x_div, long long es,
                                               long long rb, int act) {
    const int p = blockIdx.y;
    const int row0 = mv_row0<R, W, G>();
    const long long base = (long long)ids[p] * es;
    const uint8_t* wr[2 * R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const long long off = (base + min(row0 + r, F - 1)) * rb;  // rows past F: a real row, not written
        wr[r] = Wg + off, wr[R + r] = Wu + off;
    }
    float acc[2 * R], ss;
    mv_core<T, 2 * R, W, U>(wr, X + (long long)(p / x_div) * K, nullptr, K, 0, acc, ss);
    mv_reduce<2 * R, W, G>(acc, ss);
    if (mv_writer<W>()) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (row0 + r < F) {
                const float g = acc[r], u = acc[R + r];
                Y[(long long)p * F + row0 + r] = (act ? gelu_tanh(g) : silu(g)) * u;
            }
        }
    }
}

template <int T>
__device__ __forceinline__ void moe_mvdown_body(const uint8_t* __restrict__ Wt, const float* __restrict__ H,
                                                const int* __restrict__ ids, const float* __restrict__ wts,
                                                float* __restrict__ Y, int F, int D, int k, long long es,
                                                long long rb) {
    constexpr int R = MOE_MVD_R;
    __shared__ float part[MOE_MVD_WARPS][R];
    const int n = blockIdx.y, nw = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row0 = blockIdx.x * R;
    float s = 0.f;  // thread t < R: row row0 + t
    for (int j0 = 0; j0 < k; j0 += nw) {
        const int j = j0 + warp;
        if (j < k) {
            const int p = n * k + j;
            const long long base = (long long)ids[p] * es;
            const uint8_t* wr[R];
#pragma unroll
            for (int r = 0; r < R; r++) wr[r] = Wt + (base + min(row0 + r, D - 1)) * rb;
            float acc[R], ss;
            mv_core<T, R, 1, 1>(wr, H + (long long)p * F, nullptr, F, 0, acc, ss);
            const float wp = wts[p];
#pragma unroll
            for (int r = 0; r < R; r++) {
                const float d = warp_sum(acc[r]);
                if (lane == 0) part[warp][r] = wp * d;
            }
        }
        __syncthreads();
        if (threadIdx.x < R) {
            const int m = min(nw, k - j0);
            for (int w = 0; w < m; w++) s += part[w][threadIdx.x];
        }
        __syncthreads();
    }
    if (threadIdx.x < R && row0 + (int)threadIdx.x < D) Y[(long long)n * D + row0 + threadIdx.x] = s;
}

#define RX_MOE_MVGLU_V(V, NAME, T, R, W, G, U)                                                          \
    RX_EXTERN void __launch_bounds__(32 * W * G, MOE_MVG_WARPS_SM / (W * G)) moe_mvglu##V##_##NAME(     \
        const uint8_t* Wg, const uint8_t* Wu, const float* X, const int* ids, float* Y, int K, int F,   \
        int x_div, long long es, long long rb, int act) {                                               \
        moe_mvglu_body<T, R, W, G, U>(Wg, Wu, X, ids, Y, K, F, x_div, es, rb, act);                     \
    }

// the gate/up variants: matvec.cuh's c, d, e (the backend's MOE_MV_GLU lists the same)
#define RX_MOE_MV(NAME, T)                                                                              \
    RX_MOE_MVGLU_V(c, NAME, T, 4, 2, 1, 1)                                                              \
    RX_MOE_MVGLU_V(d, NAME, T, 2, 1, 4, 1)                                                              \
    RX_MOE_MVGLU_V(e, NAME, T, 4, 1, 2, 1)                                                              \
    RX_EXTERN void __launch_bounds__(32 * MOE_MVD_WARPS, MOE_MVD_MINB) moe_mvdown_##NAME(               \
        const uint8_t* W, const float* H, const int* ids, const float* wts, float* Y, int F, int D,     \
        int k, long long es, long long rb) {                                                            \
        moe_mvdown_body<T>(W, H, ids, wts, Y, F, D, k, es, rb);                                         \
    }

RX_MOE_MV(q4_k, T_Q4_K)
RX_MOE_MV(q5_k, T_Q5_K)
RX_MOE_MV(q6_k, T_Q6_K)
RX_MOE_MV(q8_0, T_Q8_0)
