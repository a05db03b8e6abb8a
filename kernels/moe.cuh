// Mixture of experts on the device: the routing (moe_route_f32) and the expert matvecs that
// read the selected expert ids from device memory (moe_glu_T, moe_mm_T, moe_down_T), so a
// MoE layer needs no host round trip and can be captured in a graph.
//
// Expert tensors are weight matrices [E * rows_per_expert, K] in a ggml block format; expert
// e's row r is row e * estride + r (estride = the rows one expert spans: F, or 2F when each
// expert holds its gate rows and then its up rows). ids [N, k] int32 and wts [N, k] float32
// come from moe_route_f32; "pair" p = n * k + j is token n's j-th chosen expert.
#pragma once
#include <limits.h>
#include "matmul.cuh"
#include "mma.cuh"

#define MOE_ROUTE_THREADS 256

// (a, ia) ranks before (b, ib): larger value first, lower index first on equal values
__device__ __forceinline__ bool moe_before(float a, int ia, float b, int ib) {
    return a > b || (a == b && ia < ib);
}

// The best (value, index) over the block; every thread gets it. sv/si: >= 32 entries.
__device__ __forceinline__ void moe_block_best(float& v, int& i, float* sv, int* si) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
        const int i2 = __shfl_xor_sync(0xffffffffu, i, o);
        if (moe_before(v2, i2, v, i)) v = v2, i = i2;
    }
    if (lane == 0) sv[warp] = v, si[warp] = i;
    __syncthreads();
    if (warp == 0) {
        v = lane < nw ? sv[lane] : -INFINITY;
        i = lane < nw ? si[lane] : INT_MAX;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
            const int i2 = __shfl_xor_sync(0xffffffffu, i, o);
            if (moe_before(v2, i2, v, i)) v = v2, i = i2;
        }
        if (lane == 0) sv[32] = v, si[32] = i;
    }
    __syncthreads();
    v = sv[32], i = si[32];
    __syncthreads();  // sv/si are reused by the next call
}

// One block (MOE_ROUTE_THREADS threads) per token n of logits [N, E]:
//   probs = softmax(logits) (gating 0), sigmoid(logits) (gating 1) or the logits (gating 2:
//           gpt-oss's softmax_weight, whose weights are a softmax over the chosen k)
//   sel   = probs (+ bias[e] when bias is given: for choosing only)
//   groups (G > 1): E/G consecutive experts a group; a group's score is the sum of its two
//         largest sel values (its one value when groups have one expert); the G_used best
//         groups (lower index first on ties) stay, every other expert's sel becomes -inf
//   ids[n, j] for j < k: the k best sel, best first, lower index first on ties
//   wts[n, j] = probs[ids[n, j]], / max(sum_j, 2^-14) when norm, * scale, * escale[e] if given
// Dynamic shared memory: 4*(2E + G) + E + G bytes (probs, sel, group scores, taken, kept).
RX_EXTERN void __launch_bounds__(MOE_ROUTE_THREADS) moe_route_f32(
    const float* __restrict__ logits, const float* __restrict__ bias, const float* __restrict__ escale,
    int* __restrict__ ids, float* __restrict__ wts, int E, int k, int gating, int norm, float scale,
    int G, int G_used) {
    extern __shared__ float moe_sh[];
    __shared__ float sv[33];
    __shared__ int si[33];
    float* probs = moe_sh;
    float* sel = probs + E;
    float* gscore = sel + E;
    uint8_t* taken = reinterpret_cast<uint8_t*>(gscore + (G > 1 ? G : 0));
    uint8_t* gkeep = taken + E;
    const int n = blockIdx.x, tid = threadIdx.x;
    const float* lr = logits + (long long)n * E;

    if (gating == 0) {
        float m = -INFINITY;
        for (int e = tid; e < E; e += blockDim.x) m = fmaxf(m, lr[e]);
        m = block_max(m);
        float s = 0.f;
        for (int e = tid; e < E; e += blockDim.x) {
            const float z = expf(lr[e] - m);
            probs[e] = z;
            s += z;
        }
        s = block_sum(s);
        for (int e = tid; e < E; e += blockDim.x) probs[e] = probs[e] / s;
    } else if (gating == 1) {
        for (int e = tid; e < E; e += blockDim.x) probs[e] = 1.f / (1.f + expf(-lr[e]));
    } else {
        for (int e = tid; e < E; e += blockDim.x) probs[e] = lr[e];
    }
    for (int e = tid; e < E; e += blockDim.x) {
        sel[e] = bias ? probs[e] + bias[e] : probs[e];
        taken[e] = 0;
    }
    __syncthreads();

    if (G > 1) {
        const int per = E / G;
        for (int g = tid; g < G; g += blockDim.x) {
            float b1 = -INFINITY, b2 = -INFINITY;  // the two largest of the group
            for (int e = g * per; e < (g + 1) * per; e++) {
                const float v = sel[e];
                if (v > b1) b2 = b1, b1 = v;
                else if (v > b2) b2 = v;
            }
            gscore[g] = per >= 2 ? b1 + b2 : b1;
            gkeep[g] = 0;
        }
        __syncthreads();
        if (tid == 0) {
            for (int u = 0; u < G_used && u < G; u++) {
                float bv = -INFINITY;
                int bi = INT_MAX;
                for (int g = 0; g < G; g++)
                    if (!gkeep[g] && moe_before(gscore[g], g, bv, bi)) bv = gscore[g], bi = g;
                gkeep[bi] = 1;
            }
        }
        __syncthreads();
        for (int e = tid; e < E; e += blockDim.x)
            if (!gkeep[e / per]) sel[e] = -INFINITY;
        __syncthreads();
    }

    float wsum = 0.f;  // thread 0's
    for (int j = 0; j < k; j++) {
        float v = -INFINITY;
        int i = INT_MAX;
        for (int e = tid; e < E; e += blockDim.x)
            if (!taken[e] && moe_before(sel[e], e, v, i)) v = sel[e], i = e;
        moe_block_best(v, i, sv, si);
        if (i < 0 || i >= E) i = j;  // only NaN scores leave no candidate: keep ids in range
        if (tid == 0) {
            taken[i] = 1;
            ids[(long long)n * k + j] = i;
            wts[(long long)n * k + j] = probs[i];
            wsum += probs[i];
        }
        __syncthreads();
    }
    if (tid == 0 && gating == 2) {  // softmax over the chosen logits (best first: wts[0] is the max)
        const float mx = wts[(long long)n * k];
        wsum = 0.f;
        for (int j = 0; j < k; j++) {
            const float z = expf(wts[(long long)n * k + j] - mx);
            wts[(long long)n * k + j] = z;
            wsum += z;
        }
        const float inv = wsum;
        wsum = 0.f;
        for (int j = 0; j < k; j++) {
            wts[(long long)n * k + j] = wts[(long long)n * k + j] / inv;
            wsum += wts[(long long)n * k + j];
        }
    }
    if (tid == 0) {
        const float div = norm ? fmaxf(wsum, 6.103515625e-5f) : 1.f;
        for (int j = 0; j < k; j++) {
            float w = wts[(long long)n * k + j];
            if (norm) w = w / div;
            w = w * scale;
            if (escale) w = w * escale[ids[(long long)n * k + j]];
            wts[(long long)n * k + j] = w;
        }
    }
}

// moe_route_f32's routing for up to MOE_ROUTE_WARP_MAXE experts without groups, a warp per
// token (MOE_ROUTE_WARP_TOKENS tokens a block; tokens n < N): lane l holds experts l, l + 32, ...
// in registers, the top k come from k warp-wide argmaxes over (sel, index, prob) by shuffles
// (no block barriers: decode's routing is a few microseconds of latency, not a block's k rounds
// of __syncthreads). The same ids as moe_route_f32 (the same order: larger first, lower index
// first on ties; NaN never chosen); the weights differ only by softmax's summation order.
#define MOE_ROUTE_WARP_MAXE 256
#define MOE_ROUTE_WARP_TOKENS 4
RX_EXTERN void __launch_bounds__(32 * MOE_ROUTE_WARP_TOKENS) moe_route_warp_f32(
    const float* __restrict__ logits, const float* __restrict__ bias, const float* __restrict__ escale,
    int* __restrict__ ids, float* __restrict__ wts, int N, int E, int k, int gating, int norm, float scale) {
    constexpr int PL = MOE_ROUTE_WARP_MAXE / 32;
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * MOE_ROUTE_WARP_TOKENS + (int)(threadIdx.x >> 5);
    if (n >= N) return;  // (a whole warp: no block barrier follows)
    const float* lr = logits + (long long)n * E;
    float pr[PL], sl[PL];
    unsigned taken = 0u;  // bit i: expert lane + 32 i taken (or past E)
#pragma unroll
    for (int i = 0; i < PL; i++) {
        const int e = lane + 32 * i;
        pr[i] = e < E ? lr[e] : -INFINITY;
        if (e >= E) taken |= 1u << i;
    }
    if (gating == 0) {
        float m = -INFINITY;
#pragma unroll
        for (int i = 0; i < PL; i++) m = fmaxf(m, pr[i]);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < PL; i++) {
            if (!((taken >> i) & 1u)) {
                pr[i] = expf(pr[i] - m);
                s += pr[i];
            }
        }
        s = warp_sum(s);
#pragma unroll
        for (int i = 0; i < PL; i++) pr[i] = pr[i] / s;
    } else if (gating == 1) {
#pragma unroll
        for (int i = 0; i < PL; i++) pr[i] = 1.f / (1.f + expf(-pr[i]));
    }
#pragma unroll
    for (int i = 0; i < PL; i++) {
        const int e = lane + 32 * i;
        sl[i] = (bias && e < E) ? pr[i] + bias[e] : pr[i];
    }
    float wsum = 0.f;  // the same in every lane
    for (int j = 0; j < k; j++) {
        float v = -INFINITY, p = 0.f;
        int bi = INT_MAX;
#pragma unroll
        for (int i = 0; i < PL; i++)
            if (!((taken >> i) & 1u) && moe_before(sl[i], lane + 32 * i, v, bi)) v = sl[i], bi = lane + 32 * i, p = pr[i];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float v2 = __shfl_xor_sync(0xffffffffu, v, o), p2 = __shfl_xor_sync(0xffffffffu, p, o);
            const int i2 = __shfl_xor_sync(0xffffffffu, bi, o);
            if (moe_before(v2, i2, v, bi)) v = v2, bi = i2, p = p2;
        }
        if (bi < 0 || bi >= E) {  // only NaN scores leave no candidate: keep ids in range
            bi = j;
            float q = 0.f;
#pragma unroll
            for (int i = 0; i < PL; i++)
                if (i == (j >> 5)) q = pr[i];
            p = __shfl_sync(0xffffffffu, q, j & 31);
        }
        if (lane == (bi & 31)) taken |= 1u << (bi >> 5);
        if (lane == 0) {
            ids[(long long)n * k + j] = bi;
            wts[(long long)n * k + j] = p;
        }
        wsum += p;
    }
    if (lane == 0 && gating == 2) {  // softmax over the chosen logits (best first: wts[0] is the max)
        const float mx = wts[(long long)n * k];
        wsum = 0.f;
        for (int j = 0; j < k; j++) {
            const float z = expf(wts[(long long)n * k + j] - mx);
            wts[(long long)n * k + j] = z;
            wsum += z;
        }
        const float inv = wsum;
        wsum = 0.f;
        for (int j = 0; j < k; j++) {
            wts[(long long)n * k + j] = wts[(long long)n * k + j] / inv;
            wsum += wts[(long long)n * k + j];
        }
    }
    if (lane == 0) {
        const float div = norm ? fmaxf(wsum, 6.103515625e-5f) : 1.f;
        for (int j = 0; j < k; j++) {
            float w = wts[(long long)n * k + j];
            if (norm) w = w / div;
            w = w * scale;
            if (escale) w = w * escale[ids[(long long)n * k + j]];
            wts[(long long)n * k + j] = w;
        }
    }
}

// Gate and up of each pair: Y[p, r] = act(dot(Wg[row], x[n])) * dot(Wu[row], x[n]) with
// row = ids[p] * estride + r, n = p / k; act 0 silu, 1 tanh gelu. X [N, K], Y [N*k, F].
// Grid: (N*k, ceil(F / MM_ROWS)); block 32*MM_ROWS.
template <int T>
__device__ __forceinline__ void moe_glu_body(const uint8_t* __restrict__ Wg, const uint8_t* __restrict__ Wu,
                                             const float* __restrict__ X, const int* __restrict__ ids,
                                             float* __restrict__ Y, int K, int F, int k, long long estride,
                                             long long rb, int act) {
    const int r = blockIdx.y * MM_ROWS + (threadIdx.x >> 5);
    if (r >= F) return;
    const int p = blockIdx.x;
    const long long row = (long long)ids[p] * estride + r;
    const uint8_t* wr[2] = {Wg + row * rb, Wu + row * rb};
    float acc[2][1];
    dot_rows<T, 1, 2>(wr, X + (long long)(p / k) * K, K, 1, acc);
    const float g = warp_sum(acc[0][0]), u = warp_sum(acc[1][0]);
    if ((threadIdx.x & 31) == 0) Y[(long long)p * F + r] = (act ? gelu_tanh(g) : silu(g)) * u;
}

// One weight per pair: Y[p, r] = dot(W[ids[p] * estride + r], X[p / x_div]); X [*, K],
// Y [N*k, M]. (Gate and up of different formats: two of these, then swiglu / geglu.)
// Grid: (N*k, ceil(M / MM_ROWS)); block 32*MM_ROWS.
template <int T>
__device__ __forceinline__ void moe_mm_body(const uint8_t* __restrict__ W, const float* __restrict__ X,
                                            const int* __restrict__ ids, float* __restrict__ Y, int K, int M,
                                            int x_div, long long estride, long long rb) {
    const int r = blockIdx.y * MM_ROWS + (threadIdx.x >> 5);
    if (r >= M) return;
    const int p = blockIdx.x;
    const uint8_t* wr[1] = {W + ((long long)ids[p] * estride + r) * rb};
    float acc[1][1];
    dot_rows<T, 1, 1>(wr, X + (long long)(p / x_div) * K, K, 1, acc);
    const float s = warp_sum(acc[0][0]);
    if ((threadIdx.x & 31) == 0) Y[(long long)p * M + r] = s;
}

// Down projection and the weighted sum over a token's k experts, in slot order (no atomics:
// the same inputs give the same bits): Y[n, r] = sum_j wts[p] * dot(W[ids[p] * estride + r], H[p])
// with p = n * k + j. H [N*k, F], Y [N, D]. Grid: (N, ceil(D / MM_ROWS)); block 32*MM_ROWS.
template <int T>
__device__ __forceinline__ void moe_down_body(const uint8_t* __restrict__ W, const float* __restrict__ H,
                                              const int* __restrict__ ids, const float* __restrict__ wts,
                                              float* __restrict__ Y, int F, int D, int k, long long estride,
                                              long long rb) {
    const int r = blockIdx.y * MM_ROWS + (threadIdx.x >> 5);
    if (r >= D) return;
    const int n = blockIdx.x;
    float s = 0.f;
    for (int j = 0; j < k; j++) {
        const int p = n * k + j;
        const uint8_t* wr[1] = {W + ((long long)ids[p] * estride + r) * rb};
        float acc[1][1];
        dot_rows<T, 1, 1>(wr, H + (long long)p * F, F, 1, acc);
        s += wts[p] * warp_sum(acc[0][0]);
    }
    if ((threadIdx.x & 31) == 0) Y[(long long)n * D + r] = s;
}

#define RX_MOE(NAME, T)                                                                               \
    RX_EXTERN void __launch_bounds__(128) moe_glu_##NAME(const uint8_t* Wg, const uint8_t* Wu,          \
                                                         const float* X, const int* ids, float* Y,      \
                                                         int K, int F, int k, long long es,             \
                                                         long long rb, int act) {                       \
        moe_glu_body<T>(Wg, Wu, X, ids, Y, K, F, k, es, rb, act);                                     \
    }                                                                                                 \
    RX_EXTERN void __launch_bounds__(128) moe_mm_##NAME(const uint8_t* W, const float* X, const int* ids, \
                                                        float* Y, int K, int M, int x_div, long long es, \
                                                        long long rb) {                                 \
        moe_mm_body<T>(W, X, ids, Y, K, M, x_div, es, rb);                                            \
    }                                                                                                 \
    RX_EXTERN void __launch_bounds__(128) moe_down_##NAME(const uint8_t* W, const float* H, const int* ids, \
                                                          const float* wts, float* Y, int F, int D,     \
                                                          int k, long long es, long long rb) {          \
        moe_down_body<T>(W, H, ids, wts, Y, F, D, k, es, rb);                                         \
    }

RX_MOE(f32, T_F32)
RX_MOE(f16, T_F16)
RX_MOE(bf16, T_BF16)
RX_MOE(q4_0, T_Q4_0)
RX_MOE(q4_1, T_Q4_1)
RX_MOE(q5_0, T_Q5_0)
RX_MOE(q5_1, T_Q5_1)
RX_MOE(q8_0, T_Q8_0)
RX_MOE(q4_k, T_Q4_K)
RX_MOE(q5_k, T_Q5_K)
RX_MOE(q6_k, T_Q6_K)

// Prefill on tensor cores (mma.cuh's grouped GEMMs): the pairs sorted by expert, stably.
// ids [P] (P = N * k pairs, expert of pair p, as moe_route_f32 writes them) ->
//   order [P]: pairs grouped by expert, each group in pair order;
//   eoff [E + 1]: expert e's group is order[eoff[e] .. eoff[e + 1] - 1];
//   tiles [1 + 2 * TMAX]: tiles[0] = T, then (expert, first row of its group) for each tile
//     of BN rows, experts in order (TMAX >= P / BN + min(E, P) >= T).
// One block of 32 * W threads; dynamic shared memory 4 * (W * E + 2 * (E + 1)) bytes. Warp w
// takes the pairs [w * seg, (w + 1) * seg) (seg = ceil(P / W)) 32 at a time: the lanes with
// one expert find each other (__match_any_sync) and the lowest of them adds their number to
// the warp's count of that expert (cnt[w][e]: one writer per entry, no atomics). Then each
// count becomes the pairs of that expert in earlier warps (a scan over w), the group sizes
// become offsets (a scan over e, with the tiles' offsets beside them), and the warps walk
// their pairs again, placing pair p at eoff[e] + (earlier warps' pairs of e) + (this warp's
// earlier pairs of e): the same order for the same ids, whatever the scheduling.
__device__ __forceinline__ int moe_clamp_id(int e, int E) { return e < 0 ? 0 : (e >= E ? E - 1 : e); }

RX_EXTERN void moe_group_i32(const int* __restrict__ ids, int* __restrict__ order, int* __restrict__ eoff,
                             int* __restrict__ tiles, int P, int E, int BN) {
    extern __shared__ int mg_sh[];
    const int W = blockDim.x >> 5, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int* cnt = mg_sh;              // [W][E]
    int* off = cnt + W * E;        // [E + 1] group offsets
    int* toff = off + (E + 1);     // [E + 1] tile offsets
    for (int i = threadIdx.x; i < W * E; i += blockDim.x) cnt[i] = 0;
    __syncthreads();
    const int seg = (P + W - 1) / W, pb = warp * seg, pe = min(P, pb + seg);
    const unsigned lt = (1u << lane) - 1u;  // lanes below this one
    for (int b = pb; b < pe; b += 32) {
        const int p = b + lane;
        const int e = p < pe ? moe_clamp_id(ids[p], E) : -1;
        const unsigned same = __match_any_sync(0xffffffffu, e);
        if (e >= 0 && (same & lt) == 0) cnt[warp * E + e] += __popc(same);
        __syncwarp();
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {  // cnt[w][e] -> pairs of e in warps < w
        int run = 0;
        for (int w = 0; w < W; w++) {
            const int c = cnt[w * E + e];
            cnt[w * E + e] = run;
            run += c;
        }
        off[e] = run;  // the group's size, for now
    }
    __syncthreads();
    if (warp == 0) {  // exclusive scans over e of the group sizes and of their tiles
        int base = 0, tbase = 0;
        for (int e0 = 0; e0 < E; e0 += 32) {
            const int e = e0 + lane;
            const int c = e < E ? off[e] : 0, nt = (c + BN - 1) / BN;
            int s = c, ts = nt;  // inclusive scans over the 32 lanes
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int a = __shfl_up_sync(0xffffffffu, s, o), at = __shfl_up_sync(0xffffffffu, ts, o);
                if (lane >= o) s += a, ts += at;
            }
            if (e < E) {
                off[e] = base + s - c;
                toff[e] = tbase + ts - nt;
            }
            base += __shfl_sync(0xffffffffu, s, 31);
            tbase += __shfl_sync(0xffffffffu, ts, 31);
        }
        if (lane == 0) {
            off[E] = base;
            toff[E] = tbase;
            tiles[0] = tbase;
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e <= E; e += blockDim.x) eoff[e] = off[e];
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        for (int j = 0; j < toff[e + 1] - toff[e]; j++) {
            tiles[1 + 2 * (toff[e] + j)] = e;
            tiles[2 + 2 * (toff[e] + j)] = j * BN;
        }
    for (int b = pb; b < pe; b += 32) {
        const int p = b + lane;
        const int e = p < pe ? moe_clamp_id(ids[p], E) : -1;
        const unsigned same = __match_any_sync(0xffffffffu, e);
        if (e >= 0) order[off[e] + cnt[warp * E + e] + __popc(same & lt)] = p;
        __syncwarp();
        if (e >= 0 && (same & lt) == 0) cnt[warp * E + e] += __popc(same);
        __syncwarp();
    }
}

// out [N, D] = sum over j < k, in order, of wts[p] * Y[p] (p = n * k + j; Y [P, D] the
// grouped down projection's rows, one per pair): moe_down's sum, after the tensor cores.
RX_EXTERN void moe_wsum_f32(const float* __restrict__ Y, const float* __restrict__ wts, float* __restrict__ out,
                            int N, int D, int k) {
    GRID_STRIDE(i, (long long)N * D) {
        const long long n = i / D;
        const int d = (int)(i - n * D);
        float s = 0.f;
        for (int j = 0; j < k; j++) {
            const long long p = n * k + j;
            s += wts[p] * Y[p * D + d];
        }
        out[i] = s;
    }
}
