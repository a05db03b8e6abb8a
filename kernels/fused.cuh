// Fused decode kernels: fewer dependent launches per layer (a one-token decode step is bound
// by its kernel count, not by bandwidth). Each computes exactly a sequence of plain ops
// (backends/base.py: rms_norm_matmul_n, rms_norm_matmul_glu, qk_rope_kv_store), up to
// float32 rounding.
//
//   mmnorm1_T    matmul_n(rms_norm(x, nw, eps), [W0, W1, W2]) for one token
//   mmgnorm1_T   matmul_glu(rms_norm(x, nw, eps), Wg, Wu) for one token
//   mmsk1_T      matmul(x, W) (or y += it) for one token, a block per row (split K)
//   qk_rope_kv_store_f32   per-head RMSNorm (optional) + rope of q and k in place, k and v
//                          written to the layer's f16 cache: one warp per head row
//   attention_split_last_f16kv   split-key attention whose last block per (head, query) merges
//                          the partials (attention_split_f16kv + attention_combine in one launch)
//   residual_add_f32       x = (x + scale * rms_norm(y, w, eps)) * out_scale in place (base.py's
//                          residual_add: a post-norm residual, a residual scale, a layer output
//                          scale): rmsnorm_f32 + scale_f32 + add_f32 + scale_f32 in one launch
//
// The RMSNorm folds into the matvec for free: y[r] = s * sum_k W[r,k] * x[k] * nw[k] with
// s = 1/sqrt(mean(x^2) + eps), and every warp reads all of x for its dot product anyway,
// so it accumulates sum(x^2) on the way (no extra read, no block barrier).
#pragma once
#include "matmul.cuh"
#include "elementwise.cuh"
#include "attention.cuh"

// acc[r] = the thread's share of dot(row r of wr[], x * nw) (nw may be null: x as is); ss = its
// share of sum(x^2). One token, chunks of 8 weights.
// The thread takes chunks tid, tid + nthr, ... (a warp per row: tid = lane, nthr = 32; a block
// per row: tid = threadIdx.x, nthr = blockDim.x).
template <int T, int NW>
__device__ __forceinline__ void dot_rows_normed(const uint8_t* const (&wr)[NW], const float* __restrict__ x,
                                                const float* __restrict__ nw, int K, int tid, int nthr,
                                                float (&acc)[NW], float& ss) {
    constexpr int CPB = QT<T>::QK / 8;
    const int nchunks = K >> 3;
#pragma unroll
    for (int r = 0; r < NW; r++) acc[r] = 0.f;
    ss = 0.f;
    // unrolled: a thread's next chunks' loads are independent, so they can all be in flight
#pragma unroll 4
    for (int ch = tid; ch < nchunks; ch += nthr) {
        float w[NW][8];
#pragma unroll
        for (int r = 0; r < NW; r++) deq8<T>(wr[r] + (ch / CPB) * QT<T>::BYTES, ch % CPB, w[r]);
        const int k0 = ch * 8;
        const float4* xp = reinterpret_cast<const float4*>(x + k0);
        float4 a = __ldg(xp), c = __ldg(xp + 1);
        ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w + c.x * c.x + c.y * c.y + c.z * c.z + c.w * c.w;
        if (nw) {
            const float4* np4 = reinterpret_cast<const float4*>(nw + k0);
            const float4 na = __ldg(np4), nc = __ldg(np4 + 1);
            a.x *= na.x, a.y *= na.y, a.z *= na.z, a.w *= na.w;
            c.x *= nc.x, c.y *= nc.y, c.z *= nc.z, c.w *= nc.w;
        }
#pragma unroll
        for (int r = 0; r < NW; r++)
            acc[r] += w[r][0] * a.x + w[r][1] * a.y + w[r][2] * a.z + w[r][3] * a.w + w[r][4] * c.x +
                      w[r][5] * c.y + w[r][6] * c.z + w[r][7] * c.w;
    }
}

// The sum of v over the threads of one row: its warp (split 0), or the whole block (split 1:
// every thread of the block must call it, the same number of times).
__device__ __forceinline__ float row_sum(float v, int split) {
    v = warp_sum(v);
    if (!split) return v;
    __shared__ float part[MM_ROWS];
    __syncthreads();  // the previous call's readers are done with part
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < MM_ROWS; i++) s += part[i];
    return s;
}

// split 0: MM_ROWS rows a block, a warp each; split 1: one row a block, its 32 * MM_ROWS threads
// over K (4x the warps and a quarter of the serial loads each: for the few thousand rows of a
// small model's projections, which otherwise leave most of the GPU's warp slots empty).
// Up to three weights W0 [M0, K], W1 [M1, K], W2 [M2, K] (one type and row_bytes; unused: M = 0)
// times rms_norm(x [K], nw, eps) into Y0 [M0], Y1 [M1], Y2 [M2]. Grid: ceil((M0 + M1 + M2) /
// MM_ROWS) blocks (split 0) or M0 + M1 + M2 (split 1); block 32 * MM_ROWS.
template <int T>
__device__ __forceinline__ void mmnorm_body(const uint8_t* W0, const uint8_t* W1, const uint8_t* W2,
                                            const float* X, const float* nw, float eps, float* Y0,
                                            float* Y1, float* Y2, int K, int M0, int M1, int M2,
                                            long long row_bytes, int split) {
    int row = split ? blockIdx.x : blockIdx.x * MM_ROWS + (threadIdx.x >> 5);
    const uint8_t* W = W0;
    float* Y = Y0;
    if (row >= M0) {
        row -= M0;
        W = W1, Y = Y1;
        if (row >= M1) {
            row -= M1;
            W = W2, Y = Y2;
            if (row >= M2) return;
        }
    }
    // (split: grid = M0 + M1 + M2 blocks, so no block returns above: row_sum's barriers hold)
    const uint8_t* wr[1] = {W + row * row_bytes};
    float acc[1], ss;
    dot_rows_normed<T, 1>(wr, X, nw, K, split ? threadIdx.x : threadIdx.x & 31, split ? blockDim.x : 32, acc, ss);
    const float s = row_sum(acc[0], split);
    const float r = rsqrtf(row_sum(ss, split) / K + eps);
    if ((split ? threadIdx.x : threadIdx.x & 31) == 0) Y[row] = s * r;
}

// y[r] = act(g) * u with g, u the rows r of Wg, Wu [M, K] times rms_norm(x [K], nw, eps);
// act 0 = silu, 1 = tanh gelu. Grid: ceil(M / MM_ROWS) (split 0) or M (split 1); block 32 * MM_ROWS.
template <int T>
__device__ __forceinline__ void mmgnorm_body(const uint8_t* __restrict__ Wg, const uint8_t* __restrict__ Wu,
                                             const float* __restrict__ X, const float* __restrict__ nw,
                                             float eps, float* __restrict__ Y, int K, int M,
                                             long long row_bytes, int act, int split) {
    const int row = split ? blockIdx.x : blockIdx.x * MM_ROWS + (threadIdx.x >> 5);
    if (row >= M) return;  // (split: grid = M blocks, none returns)
    const uint8_t* wr[2] = {Wg + row * row_bytes, Wu + row * row_bytes};
    float acc[2], ss;
    dot_rows_normed<T, 2>(wr, X, nw, K, split ? threadIdx.x : threadIdx.x & 31, split ? blockDim.x : 32, acc, ss);
    const float r = rsqrtf(row_sum(ss, split) / K + eps);
    const float g = row_sum(acc[0], split) * r;
    const float u = row_sum(acc[1], split) * r;
    if ((split ? threadIdx.x : threadIdx.x & 31) == 0) Y[row] = (act ? gelu_tanh(g) : silu(g)) * u;
}

// y[row] = dot(W[row], x) (accumulate: y[row] += ...) for one token, one row per block, its
// 32 * MM_ROWS threads over K (the split layout above, without a norm). Grid: M blocks.
template <int T>
__device__ __forceinline__ void mmsk_body(const uint8_t* __restrict__ W, const float* __restrict__ X,
                                          float* __restrict__ Y, int K, long long row_bytes, int accumulate) {
    const int row = blockIdx.x;
    const uint8_t* wr[1] = {W + row * row_bytes};
    float acc[1], ss;
    dot_rows_normed<T, 1>(wr, X, nullptr, K, threadIdx.x, blockDim.x, acc, ss);
    const float s = row_sum(acc[0], 1);
    if (threadIdx.x == 0) Y[row] = accumulate ? Y[row] + s : s;
}

#define RX_MMNORM(NAME, T)                                                                           \
    RX_EXTERN void __launch_bounds__(32 * MM_ROWS) mmnorm1_##NAME(                                   \
        const uint8_t* W0, const uint8_t* W1, const uint8_t* W2, const float* X, const float* nw,    \
        float eps, float* Y0, float* Y1, float* Y2, int K, int M0, int M1, int M2, long long rb,     \
        int split) {                                                                                 \
        mmnorm_body<T>(W0, W1, W2, X, nw, eps, Y0, Y1, Y2, K, M0, M1, M2, rb, split);                \
    }                                                                                                \
    RX_EXTERN void __launch_bounds__(32 * MM_ROWS) mmgnorm1_##NAME(                                  \
        const uint8_t* Wg, const uint8_t* Wu, const float* X, const float* nw, float eps, float* Y,  \
        int K, int M, long long rb, int act, int split) {                                            \
        mmgnorm_body<T>(Wg, Wu, X, nw, eps, Y, K, M, rb, act, split);                                \
    }                                                                                                \
    RX_EXTERN void __launch_bounds__(32 * MM_ROWS) mmsk1_##NAME(const uint8_t* W, const float* X,    \
                                                                float* Y, int K, long long rb,       \
                                                                int acc) {                           \
        mmsk_body<T>(W, X, Y, K, rb, acc);                                                           \
    }

RX_MMNORM(f32, T_F32)
RX_MMNORM(f16, T_F16)
RX_MMNORM(bf16, T_BF16)
RX_MMNORM(q4_0, T_Q4_0)
RX_MMNORM(q4_1, T_Q4_1)
RX_MMNORM(q5_0, T_Q5_0)
RX_MMNORM(q5_1, T_Q5_1)
RX_MMNORM(q8_0, T_Q8_0)
RX_MMNORM(q4_k, T_Q4_K)
RX_MMNORM(q5_k, T_Q5_K)
RX_MMNORM(q6_k, T_Q6_K)

// q [N, Hq, hd] and k [N, Hkv, hd] in place: (when norm) RMSNorm of each head row times qw / kw
// [hd] (either may be null: no weight), then rope at pos[n] (rope_f32's rotation: n_rot dims,
// neox or normal pairs, freq factors ff or null, mscale); each k row is also written as f16 to
// kc [Hkv, ctx, hd] at slot slots[n], and v [N, Hkv, dv] to vc [Hkv, ctx, dv]. One warp per
// row of q then k: rows N*Hq + N*Hkv, QK_ROPE_ROWS a block.
#define QK_ROPE_ROWS 4
RX_EXTERN void __launch_bounds__(32 * QK_ROPE_ROWS)
qk_rope_kv_store_f32(float* q, float* k, const float* v, const float* qw, const float* kw, __half* kc,
                     __half* vc, const int* pos, const int* slots, int N, int Hq, int Hkv, int hd, int dv,
                     int ctx, int norm, float eps, int n_rot, float base, float freq_scale, const float* ff,
                     int neox, float mscale) {
    const int row = blockIdx.x * QK_ROPE_ROWS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    const int nq = N * Hq;
    if (row >= nq + N * Hkv) return;
    const bool isk = row >= nq;
    const int rr = isk ? row - nq : row;
    const int H = isk ? Hkv : Hq;
    const int n = rr / H, h = rr % H;
    float* x = (isk ? k : q) + (long long)rr * hd;
    const float* w = isk ? kw : qw;
    float sc = 1.f;
    if (norm) {
        float ss = 0.f;
        for (int i = lane; i < hd; i += 32) ss += x[i] * x[i];
        // warp_sum's shuffles order every lane's reads of x before any lane's writes below
        sc = rsqrtf(warp_sum(ss) / hd + eps);
    }
    __half* kd = isk ? kc + ((long long)h * ctx + slots[n]) * hd : nullptr;
    const int p = pos[n], half_rot = n_rot >> 1;
    for (int i = lane; i < half_rot; i += 32) {
        const int a = neox ? i : 2 * i, b = neox ? i + half_rot : 2 * i + 1;
        const float x0 = x[a] * sc * (w ? w[a] : 1.f), x1 = x[b] * sc * (w ? w[b] : 1.f);
        float s, c;
        rope_sincos(p, i, n_rot, base, freq_scale, ff, &s, &c);
        const float y0 = (x0 * c - x1 * s) * mscale, y1 = (x0 * s + x1 * c) * mscale;
        x[a] = y0;
        x[b] = y1;
        if (kd) {
            kd[a] = __float2half(y0);
            kd[b] = __float2half(y1);
        }
    }
    for (int i = n_rot + lane; i < hd; i += 32) {
        const float y = x[i] * sc * (w ? w[i] : 1.f);
        x[i] = y;
        if (kd) kd[i] = __float2half(y);
    }
    if (isk) {
        const float* vr = v + (long long)rr * dv;
        __half* vd = vc + ((long long)h * ctx + slots[n]) * dv;
        for (int i = lane; i < dv; i += 32) vd[i] = __float2half(vr[i]);
    }
}

// attention_split_f16kv and attention_combine (attention.cuh) in one launch: block (h, n, s)
// writes its partial like attention_split_f16kv, then takes a ticket from count[n*Hq + h]; the
// block that takes the last one (all S partials of that (head, query) are written) merges them
// into out[n, h, :] with attention_combine's arithmetic and sets the counter back to 0. count:
// one unsigned int per (n, h), 0 before the launch and 0 after it (a buffer kept by the backend).
// Grid (Hq, N, S), block 32 * ATT_WARPS.
RX_EXTERN void __launch_bounds__(32 * ATT_WARPS)
attention_split_last_f16kv(const float* __restrict__ q, const __half* __restrict__ kc,
                           const __half* __restrict__ vc, float* part_ml, float* part_acc,
                           float* __restrict__ out, unsigned int* count, const int* __restrict__ pos,
                           const float* __restrict__ mask, const float* __restrict__ sinks, int Hq, int Hkv,
                           int hd, int ctx, int n_kv, float scale, float softcap, int causal, int window, int chunk,
                           int span) {
    __shared__ AttPart res;
    __shared__ unsigned int ticket;
    const int h = blockIdx.x, n = blockIdx.y, s = blockIdx.z, S = gridDim.z;
    const long long hn = (long long)n * Hq + h, base = hn * S;
    const long long slot = base + s;
    const int p = pos[n];
    const int hi = causal ? min(p, n_kv - 1) : n_kv - 1;
    const int lo = att_lo(p, window, span);
    if (s * chunk > hi || (s + 1) * chunk <= lo) {  // nothing visible here (the same for the whole block)
        if (threadIdx.x == 0) { part_ml[2 * slot] = -INFINITY; part_ml[2 * slot + 1] = 0.f; }
    } else {
        attend(q, kc, vc, pos, mask, h, n, Hq, Hkv, hd, ctx, n_kv, scale, softcap, causal, window, span,
               s * chunk, (s + 1) * chunk, res);
        for (int d = threadIdx.x; d < hd; d += blockDim.x) part_acc[slot * hd + d] = res.acc[d];
        if (threadIdx.x == 0) { part_ml[2 * slot] = res.m; part_ml[2 * slot + 1] = res.l; }
    }
    __threadfence();  // each thread's partial writes are visible device-wide ...
    __syncthreads();  // ... before thread 0 takes the ticket
    if (threadIdx.x == 0) ticket = atomicAdd(count + hn, 1u);
    __syncthreads();
    if (ticket != (unsigned int)(S - 1)) return;
    __threadfence();
    // the last block: every partial is written; read them past L1 (other SMs wrote them)
    float M = -INFINITY;
    for (int t = 0; t < S; t++) M = fmaxf(M, __ldcg(part_ml + 2 * (base + t)));
    if (sinks && M != -INFINITY) M = fmaxf(M, sinks[h]);  // an attention sink: attention_combine's
    float* op = out + hn * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.f, L = 0.f;
        for (int t = 0; t < S; t++) {
            const float m = __ldcg(part_ml + 2 * (base + t));
            if (m == -INFINITY) continue;
            const float f = expf(m - M);
            L += __ldcg(part_ml + 2 * (base + t) + 1) * f;
            a += __ldcg(part_acc + (base + t) * hd + d) * f;
        }
        if (sinks && L > 0.f) L += expf(sinks[h] - M);
        op[d] = L > 0.f ? a / L : 0.f;
    }
    if (threadIdx.x == 0) count[hn] = 0u;  // ready for the next launch (stream order)
}


// x = (x + scale * post(y)) * out_scale in place over rows of `dim` (x, y [rows, dim]), post(y) =
// y / sqrt(mean(y^2) + eps) * w (w may be null) when norm, else y: base.py's residual_add, the
// plain ops' order of operations (norm, weight, scale, add, output scale). One block per row.
RX_EXTERN void residual_add_f32(float* x, const float* y, const float* w, int dim, int norm, float eps, float scale,
                                float out_scale) {
    float* xr = x + (long long)blockIdx.x * dim;
    const float* yr = y + (long long)blockIdx.x * dim;
    float r = 1.f;
    if (norm) {
        float ss = 0.f;
        for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += yr[i] * yr[i];
        r = rsqrtf(block_sum(ss) / dim + eps);
    }
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = norm ? yr[i] * r * (w ? w[i] : 1.f) : yr[i];
        xr[i] = (xr[i] + v * scale) * out_scale;
    }
}
