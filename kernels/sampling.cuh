// Picking tokens on the GPU: argmax, top-k candidates, and a draw among them.
#pragma once
#include "common.cuh"

// (value, index) order: larger value first, then smaller index. NaN counts as -inf.
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}

__device__ __forceinline__ void warp_best(float& v, int& i) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (better(ov, oi, v, i)) { v = ov; i = oi; }
    }
}

__device__ __forceinline__ void block_best(float& v, int& i) {
    __shared__ float pv[32];
    __shared__ int pi[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    warp_best(v, i);
    __syncthreads();
    if (lane == 0) { pv[warp] = v; pi[warp] = i; }
    __syncthreads();
    v = lane < nw ? pv[lane] : -INFINITY;
    i = lane < nw ? pi[lane] : 0x7fffffff;
    warp_best(v, i);
}

// out[r] = argmax of row r of x[rows, n] (first index among equal maxima). One block per row.
// A 16-byte aligned row is read as float4s, several in flight per thread (a vocabulary row is
// 100-600 KB for one SM: independent wide loads, not a chain of dependent scalar ones).
RX_EXTERN void argmax_f32(const float* x, int n, int* out) {
    const float* xr = x + (long long)blockIdx.x * n;
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    int j0 = 0;
    if ((reinterpret_cast<unsigned long long>(xr) & 15) == 0) {
        const float4* x4 = reinterpret_cast<const float4*>(xr);
        const int n4 = n >> 2;
#pragma unroll 4
        for (int t = threadIdx.x; t < n4; t += blockDim.x) {
            const float4 q = x4[t];
            const float vs[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float v = vs[e] != vs[e] ? -INFINITY : vs[e];
                if (better(v, 4 * t + e, bv, bi)) { bv = v; bi = 4 * t + e; }
            }
        }
        j0 = n4 << 2;
    }
    for (int j = j0 + threadIdx.x; j < n; j += blockDim.x) {
        float v = xr[j];
        if (v != v) v = -INFINITY;
        if (better(v, j, bv, bi)) { bv = v; bi = j; }
    }
    block_best(bv, bi);
    if (threadIdx.x == 0) out[blockIdx.x] = bi == 0x7fffffff ? 0 : bi;
}

// Top-k by repeated selection: round t picks the best element strictly after round t-1's
// pick in (value desc, index asc) order, so no element is picked twice.
// Stage 1: block b takes x[b*slice, (b+1)*slice) (at most TOPK_SLICE) and writes its k best
// to cand_v/cand_i[b*k ...]. Stage 2 (one block) does the same over all candidates
// (x = cand_v, idx = cand_i) and writes the final k in order.
#define TOPK_SLICE 4096
RX_EXTERN void topk_f32(const float* x, const int* idx, int n, int k, int slice,
                        float* out_v, int* out_i) {
    __shared__ float sv[TOPK_SLICE];
    __shared__ int si[TOPK_SLICE];
    const long long base = (long long)blockIdx.x * slice;
    const int cnt = (int)min((long long)slice, n - base);
    for (int j = threadIdx.x; j < cnt; j += blockDim.x) {
        float v = x[base + j];
        sv[j] = v != v ? -INFINITY : v;
        si[j] = idx ? idx[base + j] : (int)(base + j);
    }
    __syncthreads();
    float lv = INFINITY;
    int li = -1;
    for (int t = 0; t < k; t++) {
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int j = threadIdx.x; j < cnt; j += blockDim.x) {
            const float v = sv[j];
            const int i = si[j];
            if (better(lv, li, v, i) && better(v, i, bv, bi)) { bv = v; bi = i; }
        }
        block_best(bv, bi);
        if (threadIdx.x == 0) {
            out_v[(long long)blockIdx.x * k + t] = bv;
            out_i[(long long)blockIdx.x * k + t] = bi;
        }
        lv = bv;
        li = bi;
    }
}

// Log-probabilities of chosen tokens: out[k] = x[r, t] - log(sum_j exp(x[r, j])) over the
// first n columns of row r = rows[k] of x (row stride ld), t = targets[k]. Maximum in float,
// the sum of exponentials in double (as the CPU backend does it). One block per k.
RX_EXTERN void logprob_rows(const float* x, long long ld, const int* rows, const int* targets, int n,
                            double* out) {
    __shared__ double part[32];
    const float* xr = x + (long long)rows[blockIdx.x] * ld;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, xr[j]);
    m = block_max(m);
    double s = 0.0;
    for (int j = threadIdx.x; j < n; j += blockDim.x) s += exp((double)xr[j] - (double)m);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) part[warp] = s;
    __syncthreads();
    if (warp == 0) {
        s = lane < nw ? part[lane] : 0.0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) out[blockIdx.x] = (double)xr[targets[blockIdx.x]] - (double)m - log(s);
    }
}
