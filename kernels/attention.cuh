// Attention over an f16 KV cache laid out [n_kv_heads, ctx, hd] for K and for V.
#pragma once
#include "common.cuh"

// Write k, v of shape [N, Hkv, hd] (float32) into the caches at positions pos[n].
RX_EXTERN void kv_store(const float* k, const float* v, __half* kc, __half* vc, const int* pos,
                        int N, int Hkv, int hd, int ctx) {
    const long long total = (long long)N * Hkv * hd;
    GRID_STRIDE(i, total) {
        const int d = i % hd;
        const int h = (i / hd) % Hkv;
        const int n = i / ((long long)hd * Hkv);
        const long long dst = ((long long)h * ctx + pos[n]) * hd + d;
        kc[dst] = __float2half(k[i]);
        vc[dst] = __float2half(v[i]);
    }
}

#define ATT_WARPS 4
#define ATT_MAXD 8  // head dims per lane: hd <= 256

// out[n, h, :] = softmax_j(score(n, h, j)) . V[h / group, j, :], score = scale * q.k
// (then softcap c*tanh(s/c) when softcap > 0, then + mask[n, j] when mask is given).
// Keys j in [lo, hi]: hi = pos[n] when causal else n_kv - 1; lo = pos[n] - window + 1 when
// window > 0 (sliding window), else 0. One block per (head, query); each warp walks a
// strided subset of the keys with an online softmax; the warps then merge.
RX_EXTERN void __launch_bounds__(32 * ATT_WARPS)
attention_f16kv(const float* __restrict__ q, const __half* __restrict__ kc, const __half* __restrict__ vc,
                float* __restrict__ out, const int* __restrict__ pos, const float* __restrict__ mask,
                int Hq, int Hkv, int hd, int ctx, int n_kv, float scale, float softcap, int causal,
                int window) {
    const int h = blockIdx.x, n = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kvh = h / (Hq / Hkv);
    const int p = pos[n];
    int hi = causal ? min(p, n_kv - 1) : n_kv - 1;
    int lo = window > 0 ? max(0, p - window + 1) : 0;

    float qr[ATT_MAXD], acc[ATT_MAXD];
    const float* qp = q + ((long long)n * Hq + h) * hd;
#pragma unroll
    for (int t = 0; t < ATT_MAXD; t++) {
        const int d = lane + 32 * t;
        qr[t] = d < hd ? qp[d] * scale : 0.f;
        acc[t] = 0.f;
    }
    float m = -INFINITY, l = 0.f;
    const __half* kb = kc + (long long)kvh * ctx * hd;
    const __half* vb = vc + (long long)kvh * ctx * hd;
    const float* mrow = mask ? mask + (long long)n * n_kv : nullptr;
    for (int j = lo + warp; j <= hi; j += ATT_WARPS) {
        const __half* kr = kb + (long long)j * hd;
        float s = 0.f;
#pragma unroll
        for (int t = 0; t < ATT_MAXD; t++) {
            const int d = lane + 32 * t;
            if (d < hd) s += qr[t] * __half2float(kr[d]);
        }
        s = warp_sum(s);
        if (softcap > 0.f) s = softcap * tanhf(s / softcap);
        if (mrow) s += mrow[j];
        if (s == -INFINITY) continue;
        const float mn = fmaxf(m, s);
        const float corr = expf(m - mn), e = expf(s - mn);
        l = l * corr + e;
        const __half* vr = vb + (long long)j * hd;
#pragma unroll
        for (int t = 0; t < ATT_MAXD; t++) {
            const int d = lane + 32 * t;
            if (d < hd) acc[t] = acc[t] * corr + e * __half2float(vr[d]);
        }
        m = mn;
    }
    __shared__ float sm[ATT_WARPS], sl[ATT_WARPS];
    __shared__ float sacc[ATT_WARPS][32 * ATT_MAXD];
    if (lane == 0) { sm[warp] = m; sl[warp] = l; }
#pragma unroll
    for (int t = 0; t < ATT_MAXD; t++) sacc[warp][lane + 32 * t] = acc[t];
    __syncthreads();
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, sm[w]);
    float L = 0.f, f[ATT_WARPS];
#pragma unroll
    for (int w = 0; w < ATT_WARPS; w++) {
        f[w] = sm[w] == -INFINITY ? 0.f : expf(sm[w] - M);
        L += sl[w] * f[w];
    }
    float* op = out + ((long long)n * Hq + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float s = 0.f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++) s += sacc[w][d] * f[w];
        op[d] = L > 0.f ? s / L : 0.f;
    }
}
