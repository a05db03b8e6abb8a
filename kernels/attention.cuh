// Attention over an f16 KV cache laid out [n_kv_heads, ctx, hd] for K and for V.
#pragma once
#include "common.cuh"

// Write k, v of shape [N, Hkv, hd] (float32) into the caches at positions pos[n] (v, vc null:
// keys only).
RX_EXTERN void kv_store(const float* k, const float* v, __half* kc, __half* vc, const int* pos,
                        int N, int Hkv, int hd, int ctx) {
    const long long total = (long long)N * Hkv * hd;
    GRID_STRIDE(i, total) {
        const int d = i % hd;
        const int h = (i / hd) % Hkv;
        const int n = i / ((long long)hd * Hkv);
        const long long dst = ((long long)h * ctx + pos[n]) * hd + d;
        kc[dst] = __float2half(k[i]);
        if (vc) vc[dst] = __float2half(v[i]);  // null: keys only (an MLA latent)
    }
}

#define ATT_WARPS 16  // keys are split over the warps: more warps, shorter serial chains
#define ATT_MAXD 8     // head dims per lane: hd <= 256

// Scores: score(n, h, j) = scale * q[n,h].K[h/group, j], then softcap c*tanh(s/c) when
// softcap > 0, then + mask[n, j] when a mask is given. Visible keys j in [lo, hi]:
// hi = pos[n] when causal else n_kv - 1; lo = pos[n] - window + 1 when window > 0 (sliding
// window), else 0, and at least pos[n] - pos[n] % span when span > 0 (chunked attention).
// Attention sinks (sinks[h], when given) join the softmax's denominator only: att_sink.
// attend() runs one (head, query) over the visible keys inside
// [jbeg, jend): each warp walks a strided subset with an online softmax, then the warps
// merge. It returns (in shared memory) the block's max m, sum l and unnormalized acc[hd].
struct AttPart {
    float m, l;
    float acc[32 * ATT_MAXD];
};

// the first visible key of a query at position p: its sliding window's, its chunk's (span)
__device__ __forceinline__ int att_lo(int p, int window, int span) {
    int lo = window > 0 ? max(0, p - window + 1) : 0;
    if (span > 0) lo = max(lo, p - p % span);
    return lo;
}

// A softmax's denominator with an attention sink: the running max m and sum l of the visible
// keys' exps become M = max(m, sink), l * exp(m - M) + exp(sink - M); *f = exp(m - M) rescales
// the accumulated values. No sink (sinks null) or nothing visible (l = 0): l, f = 1.
__device__ __forceinline__ float att_sink(float m, float l, const float* __restrict__ sinks, int h, float* f) {
    *f = 1.f;
    if (!sinks || !(l > 0.f)) return l;
    const float s = sinks[h], M = fmaxf(m, s);
    *f = expf(m - M);
    return l * *f + expf(s - M);
}

__device__ __forceinline__ void attend(const float* __restrict__ q, const __half* __restrict__ kc,
                                       const __half* __restrict__ vc, const int* __restrict__ pos,
                                       const float* __restrict__ mask, int h, int n, int Hq, int Hkv,
                                       int hd, int ctx, int n_kv, float scale, float softcap, int causal,
                                       int window, int span, int jbeg, int jend, AttPart& res) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kvh = h / (Hq / Hkv);
    const int p = pos[n];
    const int hi = min(causal ? min(p, n_kv - 1) : n_kv - 1, jend - 1);
    const int lo = max(att_lo(p, window, span), jbeg);

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
        if (mrow && mrow[j] == -INFINITY) continue;  // hidden: no dot product (same result)
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
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++) a += sacc[w][d] * f[w];
        res.acc[d] = a;
    }
    if (threadIdx.x == 0) { res.m = M; res.l = L; }
    __syncthreads();
}

// out[n, h, :] = softmax over the visible keys of the scores . V. A query with no visible
// key gets zeros. Grid (Hq, N), block 32*ATT_WARPS.
RX_EXTERN void __launch_bounds__(32 * ATT_WARPS)
attention_f16kv(const float* __restrict__ q, const __half* __restrict__ kc, const __half* __restrict__ vc,
                float* __restrict__ out, const int* __restrict__ pos, const float* __restrict__ mask,
                const float* __restrict__ sinks, int Hq, int Hkv, int hd, int ctx, int n_kv, float scale,
                float softcap, int causal, int window, int span) {
    __shared__ AttPart res;
    const int h = blockIdx.x, n = blockIdx.y;
    attend(q, kc, vc, pos, mask, h, n, Hq, Hkv, hd, ctx, n_kv, scale, softcap, causal, window, span, 0,
           0x7fffffff, res);
    float f;
    const float L = att_sink(res.m, res.l, sinks, h, &f);
    float* op = out + ((long long)n * Hq + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) op[d] = L > 0.f ? res.acc[d] * f / L : 0.f;
}

// Split-K form for few queries over many keys (decode): block (h, n, s) takes the keys
// [s*chunk, (s+1)*chunk) and writes its partial (m, l) to part_ml[(n*Hq + h)*S + s] and
// its unnormalized acc to part_acc[((n*Hq + h)*S + s)*hd ...]; attention_combine merges.
RX_EXTERN void __launch_bounds__(32 * ATT_WARPS)
attention_split_f16kv(const float* __restrict__ q, const __half* __restrict__ kc,
                      const __half* __restrict__ vc, float* __restrict__ part_ml,
                      float* __restrict__ part_acc, const int* __restrict__ pos,
                      const float* __restrict__ mask, int Hq, int Hkv, int hd, int ctx, int n_kv,
                      float scale, float softcap, int causal, int window, int chunk, int span) {
    __shared__ AttPart res;
    const int h = blockIdx.x, n = blockIdx.y, s = blockIdx.z, S = gridDim.z;
    const long long slot = ((long long)n * Hq + h) * S + s;
    const int p = pos[n];
    const int hi = causal ? min(p, n_kv - 1) : n_kv - 1;
    const int lo = att_lo(p, window, span);
    if (s * chunk > hi || (s + 1) * chunk <= lo) {  // nothing visible here
        if (threadIdx.x == 0) { part_ml[2 * slot] = -INFINITY; part_ml[2 * slot + 1] = 0.f; }
        return;
    }
    attend(q, kc, vc, pos, mask, h, n, Hq, Hkv, hd, ctx, n_kv, scale, softcap, causal, window, span,
           s * chunk, (s + 1) * chunk, res);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) part_acc[slot * hd + d] = res.acc[d];
    if (threadIdx.x == 0) { part_ml[2 * slot] = res.m; part_ml[2 * slot + 1] = res.l; }
}

// out[n, h, :] from the S partials of attention_split_f16kv, with the attention sink sinks[h]
// in the denominator when sinks is given. Grid (Hq, N), block >= hd.
RX_EXTERN void attention_combine(const float* __restrict__ part_ml, const float* __restrict__ part_acc,
                                 float* __restrict__ out, const float* __restrict__ sinks, int Hq, int hd, int S) {
    const int h = blockIdx.x, n = blockIdx.y;
    const long long base = ((long long)n * Hq + h) * S;
    float M = -INFINITY;
    for (int s = 0; s < S; s++) M = fmaxf(M, part_ml[2 * (base + s)]);
    if (sinks && M != -INFINITY) M = fmaxf(M, sinks[h]);
    float* op = out + ((long long)n * Hq + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.f, L = 0.f;
        for (int s = 0; s < S; s++) {
            const float m = part_ml[2 * (base + s)];
            if (m == -INFINITY) continue;
            const float f = expf(m - M);
            L += part_ml[2 * (base + s) + 1] * f;
            a += part_acc[(base + s) * hd + d] * f;
        }
        if (sinks && L > 0.f) L += expf(sinks[h] - M);
        op[d] = L > 0.f ? a / L : 0.f;
    }
}
