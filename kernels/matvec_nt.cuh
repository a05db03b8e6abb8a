// Matvecs of a few tokens (2 <= N < MMA_MIN_N), laid out for the memory side:
// y[n, r] = sum_k W[r, k] * x[n, k] with W in its ggml block format (row r at W + r*row_bytes).
//
// A block of MMT_THREADS threads owns MMT_R weight rows and NT tokens (grid y: token groups,
// tokens blockIdx.y*NT ..). Its threads split K: thread tid takes the 8-weight chunks
// tid, tid + MMT_THREADS, ... of every one of its rows, so a warp reads 32 consecutive chunks
// of a row (coalesced), each chunk's x of a token is loaded once and applied to all MMT_R
// rows, and the MMT_R rows' loads are in flight together. (The chunk loop is not unrolled:
// at K = 1024 every thread has one chunk, and unrolling doubled the code.)
// Each thread ends with V = MMT_R * NT partial sums acc[j * NT + t] (row slot j, token t);
// a warp reduce-scatter leaves lane l with the warp's sum of value l / (32 / V), the warps'
// sums meet in shared memory and thread i < V adds them in warp order. Fixed order
// everywhere: the results do not change from run to run. Floats on dequantized weights,
// as the other matvecs (activations are not quantized).
//
//   mmt{NT}_T     one weight [M, K]: y = W x, or y += W x (the residual add folded in)
//   mmtn{NT}_T    up to three weights of one type and K (q/k/v) over the same x: the grid covers
//                 M0 + M1 + M2 rows; a block may hold rows of two weights
//   mmtglu{NT}_T  gate and up: a block owns MMT_R / 2 rows of both; y = act(g) * u
//
// Grid: (ceil(rows / MMT_R), ceil(N / NT)) with rows = M, M0 + M1 + M2, or ceil(M / (MMT_R / 2))
// blocks for the gated unit; block MMT_THREADS.
#pragma once
#include "quants.cuh"

#define MMT_THREADS 128
#define MMT_WARPS (MMT_THREADS / 32)
#define MMT_R 4  // weight rows per block (the gated unit: 2 gate + 2 up rows)

// 8 bytes at a 2-byte aligned address, as two little-endian words, in two or three aligned
// 4-byte loads (ld8_a2 takes four 2-byte loads). The third word, read only when p is not
// 4-aligned, ends 2 bytes past p + 8 inside the same aligned word as p + 7: never past a page.
__device__ __forceinline__ uint2 ld8_w(const uint8_t* p) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    const uint32_t* q = reinterpret_cast<const uint32_t*>(a & ~(uintptr_t)3);
    const uint32_t sh = (uint32_t)(a & 3) * 8u;  // 0 or 16
    const uint32_t w0 = __ldg(q), w1 = __ldg(q + 1);
    const uint32_t w2 = sh ? __ldg(q + 2) : 0u;
    return make_uint2(__funnelshift_r(w0, w1, sh), __funnelshift_r(w1, w2, sh));
}

// byte i (0..7) of v
__device__ __forceinline__ uint32_t byte8(uint2 v, int i) { return ((i < 4 ? v.x : v.y) >> (8 * (i & 3))) & 0xffu; }

// deq8t<T>: deq8<T> (quants.cuh) with wider loads for the formats whose 8 quant bytes of a chunk
// are contiguous (same values, same float expressions); the rest are deq8<T> itself.
template <int T> __device__ __forceinline__ void deq8t(const uint8_t* b, int c, float w[8]) { deq8<T>(b, c, w); }

template <> __device__ __forceinline__ void deq8t<T_Q8_0>(const uint8_t* b, int c, float w[8]) {
    const float d = ld_f16(b);
    const uint2 v = ld8_w(b + 2 + 8 * c);
#pragma unroll
    for (int i = 0; i < 8; i++) w[i] = d * (float)(int8_t)(uint8_t)byte8(v, i);
}

template <> __device__ __forceinline__ void deq8t<T_Q4_K>(const uint8_t* b, int c, float w[8]) {
    const int e0 = 8 * c, sub = e0 >> 5, p = e0 >> 6, l = e0 & 31;
    int sc, mn;
    kscale(b + 4, sub, sc, mn);
    const float d = ld_f16(b) * sc, m = ld_f16(b + 2) * mn;
    const uint2 v = ld8_w(b + 16 + 32 * p + l);
    const int sh = (sub & 1) * 4;
#pragma unroll
    for (int i = 0; i < 8; i++) w[i] = d * (float)((byte8(v, i) >> sh) & 0xF) - m;
}

template <> __device__ __forceinline__ void deq8t<T_Q6_K>(const uint8_t* b, int c, float w[8]) {
    const int e0 = 8 * c, n = e0 >> 7, g = (e0 >> 5) & 3, l = e0 & 31;
    const float d = ld_f16(b + 208) * (float)(int8_t)b[192 + 8 * n + 2 * g + (l >> 4)];
    const uint2 q = ld8_w(b + 64 * n + 32 * (g & 1) + l);
    const uint2 h = ld8_w(b + 128 + 32 * n + l);
    const int sh = (g >> 1) * 4;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int v = (int)((byte8(q, i) >> sh) & 0xF) | (int)(((byte8(h, i) >> (2 * g)) & 3) << 4);
        w[i] = d * (float)(v - 32);
    }
}

// acc[j * NT + t] = this thread's share of dot(row j of wr[], x of token t): chunks
// threadIdx.x, threadIdx.x + MMT_THREADS, ... Tokens t >= nt are skipped (their sums stay 0).
template <int T, int NT>
__device__ __forceinline__ void mmt_dot(const uint8_t* const (&wr)[MMT_R], const float* __restrict__ xb,
                                        int K, int nt, float (&acc)[MMT_R * NT]) {
    constexpr int CPB = QT<T>::QK / 8;  // chunks per block
    const int nchunks = K >> 3;
#pragma unroll
    for (int i = 0; i < MMT_R * NT; i++) acc[i] = 0.f;
#pragma unroll 1
    for (int ch = threadIdx.x; ch < nchunks; ch += MMT_THREADS) {
        const int boff = (ch / CPB) * QT<T>::BYTES, c = ch % CPB;
        float w[MMT_R][8];
#pragma unroll
        for (int j = 0; j < MMT_R; j++) deq8t<T>(wr[j] + boff, c, w[j]);
        const float* xp = xb + ch * 8;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t < nt) {
                const float4* x4 = reinterpret_cast<const float4*>(xp + (long long)t * K);
                const float4 a = __ldg(x4), e = __ldg(x4 + 1);
#pragma unroll
                for (int j = 0; j < MMT_R; j++)
                    acc[j * NT + t] += w[j][0] * a.x + w[j][1] * a.y + w[j][2] * a.z + w[j][3] * a.w +
                                       w[j][4] * e.x + w[j][5] * e.y + w[j][6] * e.z + w[j][7] * e.w;
            }
        }
    }
}

// Warp reduce-scatter of v[0..V) (V a power of 2, <= 32) over the 32 lanes. At offset O while
// more than one value is left, a lane keeps the lower half of its values (lane bit O clear) or
// the upper half (set), adding its partner's copy of that half; once one value is left, plain
// butterfly steps. At the end v[0] of lane l is the sum over all lanes of value l / (32 / V).
template <int V, int O = 16>
__device__ __forceinline__ void warp_scatter_sum(float* v, int lane) {
    if constexpr (O > 0) {
        if constexpr (V > 1) {
            constexpr int H = V / 2;
            const bool up = (lane & O) != 0;
#pragma unroll
            for (int i = 0; i < H; i++) {
                const float send = up ? v[i] : v[i + H];
                const float keep = up ? v[i + H] : v[i];
                v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
            }
            warp_scatter_sum<H, O / 2>(v, lane);
        } else {
            v[0] += __shfl_xor_sync(0xffffffffu, v[0], O);
            warp_scatter_sum<1, O / 2>(v, lane);
        }
    }
}

// The block's sums: returns, for thread i < V, the sum over all threads of acc[i] (warp sums
// added in warp order); other threads get 0. Every thread of the block must call it.
template <int V>
__device__ __forceinline__ float mmt_block_sum(float (&acc)[V], float (&part)[MMT_WARPS][V]) {
    static_assert(V <= 32 && (V & (V - 1)) == 0, "V: a power of 2 up to 32");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    constexpr int G = 32 / V;  // lanes holding the same value after the scatter
    warp_scatter_sum<V>(acc, lane);
    if (lane % G == 0) part[warp][lane / G] = acc[0];
    __syncthreads();
    float s = 0.f;
    if (threadIdx.x < V) {
        s = part[0][threadIdx.x];
#pragma unroll
        for (int w = 1; w < MMT_WARPS; w++) s += part[w][threadIdx.x];
    }
    return s;
}

// Global row g of the concatenated weights W0 [M0], W1 [M1], W2 [M2] (M0 >= 1): its weight's
// row pointer, output column and output array; false (and row 0 of W0, to keep loads in
// bounds) past the end.
__device__ __forceinline__ bool mmt_locate(int g, const uint8_t* W0, const uint8_t* W1, const uint8_t* W2,
                                           float* Y0, float* Y1, float* Y2, int M0, int M1, int M2,
                                           long long row_bytes, const uint8_t*& w, float*& y, int& M, int& r) {
    if (g < M0) {
        w = W0 + g * row_bytes, y = Y0, M = M0, r = g;
        return true;
    }
    g -= M0;
    if (g < M1) {
        w = W1 + g * row_bytes, y = Y1, M = M1, r = g;
        return true;
    }
    g -= M1;
    if (g < M2) {
        w = W2 + g * row_bytes, y = Y2, M = M2, r = g;
        return true;
    }
    w = W0, y = Y0, M = M0, r = 0;
    return false;
}

// mmt (W1 = W2 = null, M1 = M2 = 0; accumulate: y += W x) and mmtn (accumulate 0).
template <int T, int NT>
__device__ __forceinline__ void mmt_body(const uint8_t* W0, const uint8_t* W1, const uint8_t* W2,
                                         const float* __restrict__ X, float* Y0, float* Y1, float* Y2, int K,
                                         int M0, int M1, int M2, int N, long long row_bytes, int accumulate) {
    __shared__ float part[MMT_WARPS][MMT_R * NT];
    const int n0 = blockIdx.y * NT;
    const int nt = min(NT, N - n0);
    const uint8_t* wr[MMT_R];
#pragma unroll
    for (int j = 0; j < MMT_R; j++) {
        float* y;
        int M, r;
        mmt_locate(blockIdx.x * MMT_R + j, W0, W1, W2, Y0, Y1, Y2, M0, M1, M2, row_bytes, wr[j], y, M, r);
    }
    float acc[MMT_R * NT];
    mmt_dot<T, NT>(wr, X + (long long)n0 * K, K, nt, acc);
    const float s = mmt_block_sum<MMT_R * NT>(acc, part);
    if (threadIdx.x < MMT_R * NT) {
        const int j = threadIdx.x / NT, t = threadIdx.x % NT;
        const uint8_t* w;
        float* y;
        int M, r;
        if (t < nt && mmt_locate(blockIdx.x * MMT_R + j, W0, W1, W2, Y0, Y1, Y2, M0, M1, M2, row_bytes, w, y, M, r)) {
            float* yp = y + (long long)(n0 + t) * M + r;
            *yp = accumulate ? *yp + s : s;
        }
    }
}

// Gated unit: y[n, r] = act(dot(Wg[r], x[n])) * dot(Wu[r], x[n]); act 0 = silu, 1 = tanh gelu.
// Row slots 0, 1: gate rows blockIdx.x*2 + 0, 1; slots 2, 3: the same rows of up.
template <int T, int NT>
__device__ __forceinline__ void mmtglu_body(const uint8_t* __restrict__ Wg, const uint8_t* __restrict__ Wu,
                                            const float* __restrict__ X, float* __restrict__ Y, int K, int M,
                                            int N, long long row_bytes, int act) {
    constexpr int RG = MMT_R / 2;
    __shared__ float part[MMT_WARPS][MMT_R * NT];
    const int n0 = blockIdx.y * NT;
    const int nt = min(NT, N - n0);
    const uint8_t* wr[MMT_R];
#pragma unroll
    for (int j = 0; j < RG; j++) {
        const int r = blockIdx.x * RG + j;
        const long long off = (r < M ? r : 0) * row_bytes;
        wr[j] = Wg + off;
        wr[RG + j] = Wu + off;
    }
    float acc[MMT_R * NT];
    mmt_dot<T, NT>(wr, X + (long long)n0 * K, K, nt, acc);
    const float s = mmt_block_sum<MMT_R * NT>(acc, part);
    // thread i < RG * NT holds the gate sum of (row slot i / NT, token i % NT); the up sum of the
    // same pair is thread i + RG * NT's: from shared memory (mmt_block_sum's barrier is behind us)
    __syncthreads();
    if (threadIdx.x < MMT_R * NT) part[0][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.x < RG * NT) {
        const int j = threadIdx.x / NT, t = threadIdx.x % NT;
        const int r = blockIdx.x * RG + j;
        if (t < nt && r < M) {
            const float g = s, u = part[0][RG * NT + threadIdx.x];
            Y[(long long)(n0 + t) * M + r] = (act ? gelu_tanh(g) : silu(g)) * u;
        }
    }
}

#define RX_MMT_NT(NAME, T, NT)                                                                       \
    RX_EXTERN void __launch_bounds__(MMT_THREADS) mmt##NT##_##NAME(const uint8_t* W, const float* X,  \
                                                                   float* Y, int K, int M, int N,     \
                                                                   long long rb, int acc) {           \
        mmt_body<T, NT>(W, nullptr, nullptr, X, Y, nullptr, nullptr, K, M, 0, 0, N, rb, acc);        \
    }                                                                                                \
    RX_EXTERN void __launch_bounds__(MMT_THREADS) mmtn##NT##_##NAME(                                 \
        const uint8_t* W0, const uint8_t* W1, const uint8_t* W2, const float* X, float* Y0,         \
        float* Y1, float* Y2, int K, int M0, int M1, int M2, int N, long long rb) {                 \
        mmt_body<T, NT>(W0, W1, W2, X, Y0, Y1, Y2, K, M0, M1, M2, N, rb, 0);                         \
    }                                                                                                \
    RX_EXTERN void __launch_bounds__(MMT_THREADS) mmtglu##NT##_##NAME(                               \
        const uint8_t* Wg, const uint8_t* Wu, const float* X, float* Y, int K, int M, int N,         \
        long long rb, int act) {                                                                     \
        mmtglu_body<T, NT>(Wg, Wu, X, Y, K, M, N, rb, act);                                          \
    }

// NT = 8 only (fewer tokens: the rest of the group is skipped): each instantiation is ~9 KB of
// sm_90 code, and the fatbin's size is paid at every cold start
#define RX_MMT(NAME, T) RX_MMT_NT(NAME, T, 8)

RX_MMT(f32, T_F32)
RX_MMT(f16, T_F16)
RX_MMT(bf16, T_BF16)
RX_MMT(q4_0, T_Q4_0)
RX_MMT(q4_1, T_Q4_1)
RX_MMT(q5_0, T_Q5_0)
RX_MMT(q5_1, T_Q5_1)
RX_MMT(q8_0, T_Q8_0)
RX_MMT(q4_k, T_Q4_K)
RX_MMT(q5_k, T_Q5_K)
RX_MMT(q6_k, T_Q6_K)
