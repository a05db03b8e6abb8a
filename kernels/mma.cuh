// Prefill matmuls (many tokens) on tensor cores: Y[n, m] = sum_k W[m, k] * X[n, k] with W
// in its ggml block format (dequantized on the fly, never stored as floats in global
// memory) and X [N, K] as f16 (mma_x_f16 converts the float32 activations once per matmul;
// the q/k/v of one x share the copy).
//
// One block computes a tile of MMA_BM weight rows x MMA_BN tokens, walking its share of K
// in slices of BK columns (MMA_BK; MMA_BK_GLU for the gated unit, which holds two weight
// tiles) through two shared-memory stages. All 8 warps load and all multiply: per slice
// every thread fetches its part of the next slice into registers (W chunks dequantized by
// deq8, the decode kernels' reader, and packed to f16; X chunks as 16-byte loads; every
// global load issued before any shared store), multiplies the current stage with
// mma.sync.m16n8k16 (f16 inputs, f32 accumulators; warp w owns rows (w & 1) * 32.. and
// tokens (w >> 1) * 16.., 2 row tiles of 16 x 2 token tiles of 8 per 16 columns), then
// stores the fetched slice into the other stage; one barrier per slice.
//
// Few tiles (short prompts, narrow weights) would leave most SMs idle while each block
// walks all of K: the host splits K over gridDim.z blocks (cuda_ops._mma_splits), which
// write partial sums that mma_reduce adds in a fixed order.
//
// Fragment layout of mma.m16n8k16 .row.col f16 -> f32 (PTX ISA, "Matrix Fragments for
// mma.m16n8k16 with floating point type"), g = lane >> 2, t = lane & 3:
//   A (16 x 16, row major; here W rows x k): register r holds two consecutive columns
//     r=0: (g, 2t..2t+1)  r=1: (g+8, 2t..)  r=2: (g, 2t+8..)  r=3: (g+8, 2t+8..)
//   B (16 x 8, k x tokens; "col" = each token's k values contiguous, as X rows are):
//     r=0: k 2t..2t+1 of token g    r=1: k 2t+8..2t+9 of token g
//   C (16 x 8 f32): c0, c1 = (row g, tokens 2t, 2t+1); c2, c3 = (row g+8, tokens 2t, 2t+1)
// tests/test_mma_tiling.py models this indexing in numpy.
//
// Edges: rows >= M and tokens >= N load zeros and are not stored; K needs only to be a
// multiple of 8 (chunks past K load zeros, a slice may end past K). Architectures before
// sm_80 have no m16n8k16: there each lane computes the same C elements from the same
// shared tiles with scalar loops (correct, slow; the host only picks these kernels on
// sm_80+). f16 inputs: |x| above 65504 would overflow (activations that reach matmuls are
// normalized or gated products, far below that).
#pragma once
#include "quants.cuh"

#define MMA_BM 64       // weight rows per block
#define MMA_BN 64       // tokens per block
#define MMA_BK 64       // columns per slice (one weight)
#define MMA_BK_GLU 32   // columns per slice of the gated unit (two weight tiles a stage)
#define MMA_PAD 8       // row stride of the shared tiles = BK + MMA_PAD halves: 144 or 80
                        // bytes, so the 32-bit fragment loads of 8 groups x 4 lanes hit 32 banks
#define MMA_THREADS 256
#define MMA_LOADERS 256 // every thread loads (and every warp multiplies)
#define MMA_WN 16       // tokens per warp: 8 warps = 2 along the rows (32 each) x 4 along the tokens
#define MMA_WIDE 4      // mma_* / mmaglu_*'s mode bit: DeqWide's wide loads (below)
static_assert(MMA_BM == MMA_BN && MMA_BM == 64 && MMA_THREADS == MMA_LOADERS && MMA_WN == 16,
              "mma_tile's warp layout (2 x 4 warps of 32 x 16) and the stage layout assume these");

__device__ __forceinline__ uint32_t pack_half2(float a, float b) {
    __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&h);
}

// One stage's fill, in two phases so that every global load of a slice is issued before
// any shared store (no store between two loads: a thread's loads are all in flight
// together, one memory latency a slice), with the multiplication of the other stage in
// between: mma_fetch_w / mma_fetch_x into registers, then mma_put_w / mma_put_x.
// p = the thread's index 0..MMA_LOADERS-1 (every thread of the block).
//
// W rows m0.. (MMA_BM of them), columns k0..k0+BK-1, as f16 for s[MMA_BM][BK + MMA_PAD].
// Job j (of MMA_BM * BK/8) = row j / (BK/8), chunk j % (BK/8) of 8 columns; a loader has
// jobs p + i * MMA_LOADERS.
template <int BK>
struct MmaJobs {
    static constexpr int W = MMA_BM * (BK / 8) / MMA_LOADERS;  // W chunks (uint4) per loader
    static constexpr int X = MMA_BN * (BK / 8) / MMA_LOADERS;  // X chunks (uint4) per loader
};

// The K-quants' chunks read with wide loads (MMA_WIDE, MOE_WIDE: REFLEX_MMA_WIDE): deq8's values,
// bit for bit (the same arithmetic on the same bytes), from fewer load instructions. deq8
// reads a Q4_K chunk with ~9 loads of 1-2 bytes (d, dmin, 2-4 scale bytes, 4 x 2 quant bytes)
// and every load of a warp touches as many lines as the warp has rows (8 at BK = 32): the L1
// wavefronts of those loads, not the tensor cores, bound the kernels. Here Q4_K / Q5_K take
// the 16-byte header (d, dmin, scales[12]) in one load and 8 quant bytes (Q5_K: and 8 high-bit
// bytes) in one each (blocks of 144 / 176 bytes: 16-byte aligned when the tensor is); Q6_K
// (210-byte blocks, 2-byte aligned) takes each 8-byte run from two aligned 8-byte loads
// (the words around it, all inside its block when the tensor is 8-byte aligned) and a
// funnel shift. The host sets the flag only for tensors so aligned (cuda_ops._wide_ok). The
// small integers become floats by qf (exact, as deq8's conversions), so the products are the same.
template <int T>
struct DeqWide {
    static constexpr bool has = false;
    static __device__ __forceinline__ void deq(const uint8_t* b, int c, float w[8]) { deq8<T>(b, c, w); }
};

__device__ __forceinline__ int hbyte(const uint4& h, int j) {  // byte j (0..11) of h.y, h.z, h.w
    const uint32_t v = j < 4 ? h.y : (j < 8 ? h.z : h.w);
    return (int)((v >> (8 * (j & 3))) & 0xffu);
}

// kscale's values from the header in registers
__device__ __forceinline__ void kscale_h(const uint4& h, int j, int& sc, int& mn) {
    if (j < 4) {
        sc = hbyte(h, j) & 63;
        mn = hbyte(h, j + 4) & 63;
    } else {
        sc = (hbyte(h, j + 4) & 0xF) | ((hbyte(h, j - 4) >> 6) << 4);
        mn = (hbyte(h, j + 4) >> 4) | ((hbyte(h, j) >> 6) << 4);
    }
}

__device__ __forceinline__ float lo_f16(uint32_t v) {
    return __half2float(__ushort_as_half((unsigned short)(v & 0xffffu)));
}
__device__ __forceinline__ float hi_f16(uint32_t v) {
    return __half2float(__ushort_as_half((unsigned short)(v >> 16)));
}
__device__ __forceinline__ int qbyte(const uint2& q, int i) {  // byte i (0..7) of q
    return (int)(((i < 4 ? q.x : q.y) >> (8 * (i & 3))) & 0xffu);
}
// (float)(v) for 0 <= v < 2^23, exactly, without an int conversion (a quarter-rate pipe):
// 0x4B000000 | v is 2^23 + v; qf(v, 2^23 + 32) = (float)(v - 32)
__device__ __forceinline__ float qf(int v, float bias) { return __int_as_float(0x4B000000 | v) - bias; }
#define DEQ_TWO23 8388608.f

// bytes p..p+7 (p 2-byte aligned) from the aligned 8-byte words at (p & ~7) and 8 after it
__device__ __forceinline__ uint2 ld8_w2(const uint8_t* p) {
    const unsigned long long a = reinterpret_cast<unsigned long long>(p);
    const uint2* w = reinterpret_cast<const uint2*>(a & ~7ull);
    const uint2 u0 = __ldg(w), u1 = __ldg(w + 1);
    const int s = (int)(a & 7);
    const uint32_t x0 = (s & 4) ? u0.y : u0.x, x1 = (s & 4) ? u1.x : u0.y, x2 = (s & 4) ? u1.y : u1.x;
    return make_uint2(__funnelshift_r(x0, x1, 8 * (s & 3)), __funnelshift_r(x1, x2, 8 * (s & 3)));
}

template <>
struct DeqWide<T_Q4_K> {
    static constexpr bool has = true;
    static __device__ __forceinline__ void deq(const uint8_t* b, int c, float w[8]) {
        const int e0 = 8 * c, sub = e0 >> 5, p = e0 >> 6, l = e0 & 31;
        const uint4 h = __ldg(reinterpret_cast<const uint4*>(b));
        const uint2 q = __ldg(reinterpret_cast<const uint2*>(b + 16 + 32 * p + l));
        int sc, mn;
        kscale_h(h, sub, sc, mn);
        const float d = lo_f16(h.x) * sc, m = hi_f16(h.x) * mn;
        const int sh = (sub & 1) * 4;
#pragma unroll
        for (int i = 0; i < 8; i++) w[i] = d * qf((qbyte(q, i) >> sh) & 0xF, DEQ_TWO23) - m;
    }
};

template <>
struct DeqWide<T_Q5_K> {
    static constexpr bool has = true;
    static __device__ __forceinline__ void deq(const uint8_t* b, int c, float w[8]) {
        const int e0 = 8 * c, sub = e0 >> 5, p = e0 >> 6, l = e0 & 31;
        const uint4 h = __ldg(reinterpret_cast<const uint4*>(b));
        const uint2 q = __ldg(reinterpret_cast<const uint2*>(b + 48 + 32 * p + l));
        const uint2 hb = __ldg(reinterpret_cast<const uint2*>(b + 16 + l));
        int sc, mn;
        kscale_h(h, sub, sc, mn);
        const float d = lo_f16(h.x) * sc, m = hi_f16(h.x) * mn;
        const int sh = (sub & 1) * 4;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int v = ((qbyte(q, i) >> sh) & 0xF) | (((qbyte(hb, i) >> sub) & 1) << 4);
            w[i] = d * qf(v, DEQ_TWO23) - m;
        }
    }
};

template <>
struct DeqWide<T_Q6_K> {
    static constexpr bool has = true;
    static __device__ __forceinline__ void deq(const uint8_t* b, int c, float w[8]) {
        const int e0 = 8 * c, n = e0 >> 7, g = (e0 >> 5) & 3, l = e0 & 31;
        const float d = ld_f16(b + 208) * (float)(int8_t)b[192 + 8 * n + 2 * g + (l >> 4)];
        const uint2 q = ld8_w2(b + 64 * n + 32 * (g & 1) + l), hb = ld8_w2(b + 128 + 32 * n + l);
        const int sh = (g >> 1) * 4;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int v = ((qbyte(q, i) >> sh) & 0xF) | (((qbyte(hb, i) >> (2 * g)) & 3) << 4);
            w[i] = d * qf(v, DEQ_TWO23 + 32.f);
        }
    }
};

// wide: DeqWide's readers (the dense GEMMs' MMA_WIDE, the grouped ones' MOE_WIDE)
template <int T, int BK>
__device__ __forceinline__ void mma_fetch_w(const uint8_t* __restrict__ W, uint4 (&v)[MmaJobs<BK>::W], int p,
                                            int m0, int k0, int M, int K, long long row_bytes,
                                            bool wide = false) {
    constexpr int CPB = QT<T>::QK / 8;
    constexpr int CPR = BK / 8;  // chunks per tile row
#pragma unroll
    for (int i = 0; i < MmaJobs<BK>::W; i++) {
        const int j = p + i * MMA_LOADERS;
        const int r = j / CPR, c = j % CPR;
        const int m = m0 + r, ch = (k0 >> 3) + c;
        v[i] = make_uint4(0, 0, 0, 0);
        if (m < M && ch < (K >> 3)) {
            float w[8];
            const uint8_t* b = W + (long long)m * row_bytes + (ch / CPB) * QT<T>::BYTES;
            if (DeqWide<T>::has && wide)
                DeqWide<T>::deq(b, ch % CPB, w);
            else
                deq8<T>(b, ch % CPB, w);
            v[i].x = pack_half2(w[0], w[1]);
            v[i].y = pack_half2(w[2], w[3]);
            v[i].z = pack_half2(w[4], w[5]);
            v[i].w = pack_half2(w[6], w[7]);
        }
    }
}

template <int BK>
__device__ __forceinline__ void mma_put_w(__half* s, const uint4 (&v)[MmaJobs<BK>::W], int p) {
    constexpr int CPR = BK / 8, LD = BK + MMA_PAD;
#pragma unroll
    for (int i = 0; i < MmaJobs<BK>::W; i++) {
        const int j = p + i * MMA_LOADERS;
        *reinterpret_cast<uint4*>(s + (j / CPR) * LD + (j % CPR) * 8) = v[i];
    }
}

// X (f16, converted once per matmul by mma_x_f16) tokens n0.. (MMA_BN), columns
// k0..k0+BK-1, for s[MMA_BN][BK + MMA_PAD]. Job j = token j / (BK/8), chunk j % (BK/8) of
// 8 halves (one 16-byte load; K is a multiple of 8, so a chunk is all in or all past K).
template <int BK>
__device__ __forceinline__ void mma_fetch_x(const __half* __restrict__ X, uint4 (&f)[MmaJobs<BK>::X], int p,
                                            int n0, int k0, int N, int K) {
    constexpr int CPR = BK / 8;
#pragma unroll
    for (int i = 0; i < MmaJobs<BK>::X; i++) {
        const int j = p + i * MMA_LOADERS;
        const int r = j / CPR, c = j % CPR;
        const int n = n0 + r, k = k0 + 8 * c;
        f[i] = (n < N && k < K) ? __ldg(reinterpret_cast<const uint4*>(X + (long long)n * K + k))
                                : make_uint4(0, 0, 0, 0);
    }
}

template <int BK>
__device__ __forceinline__ void mma_put_x(__half* s, const uint4 (&f)[MmaJobs<BK>::X], int p) {
    constexpr int CPR = BK / 8, LD = BK + MMA_PAD;
#pragma unroll
    for (int i = 0; i < MmaJobs<BK>::X; i++) {
        const int j = p + i * MMA_LOADERS;
        *reinterpret_cast<uint4*>(s + (j / CPR) * LD + (j % CPR) * 8) = f[i];
    }
}

// A stage (NW W tiles then the X tile) for the columns k0..k0+BK-1: fetched into registers,
// then stored.
template <int T, int NW, int BK>
__device__ __forceinline__ void mma_fetch(const uint8_t* __restrict__ W0, const uint8_t* __restrict__ W1,
                                          const __half* __restrict__ X, uint4 (&v0)[MmaJobs<BK>::W],
                                          uint4 (&v1)[MmaJobs<BK>::W], uint4 (&f)[MmaJobs<BK>::X], int p, int m0,
                                          int n0, int k0, int M, int N, int K, long long row_bytes,
                                          bool wide) {
    mma_fetch_w<T, BK>(W0, v0, p, m0, k0, M, K, row_bytes, wide);
    if (NW == 2) mma_fetch_w<T, BK>(W1, v1, p, m0, k0, M, K, row_bytes, wide);
    mma_fetch_x<BK>(X, f, p, n0, k0, N, K);
}

template <int NW, int BK>
__device__ __forceinline__ void mma_put(__half* st, const uint4 (&v0)[MmaJobs<BK>::W],
                                        const uint4 (&v1)[MmaJobs<BK>::W], const uint4 (&f)[MmaJobs<BK>::X], int p) {
    constexpr int TILE = MMA_BM * (BK + MMA_PAD);
    mma_put_w<BK>(st, v0, p);
    if (NW == 2) mma_put_w<BK>(st + TILE, v1, p);
    mma_put_x<BK>(st + NW * TILE, f, p);
}

// acc[w][mt][nt][i] += warp cw's 32 x 16 tile (rows wr.., tokens wn..) of weight w < NW over
// the BK columns in shared memory, each X fragment loaded once for the NW weights (each
// accumulator still takes its MMAs in k order: the same sums as one weight at a time);
// ntn = 1 multiplies only its first 8 tokens (nt = 0: the grouped MoE GEMMs' MOE_SKIP when
// the rest lie past the group; acc[.][.][1] then stays as it was).
// st: a stage, NW W tiles [MMA_BM][BK + MMA_PAD] then the X tile [MMA_BN][BK + MMA_PAD].
template <int BK, int NW>
__device__ __forceinline__ void mma_tile(const __half* st, int cw, float (&acc)[NW][2][2][4], int ntn = 2) {
    constexpr int LD = BK + MMA_PAD;
    constexpr int TILE = MMA_BM * LD;
    const __half* sx = st + NW * TILE;
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int wr = (cw & 1) * 32, wn = (cw >> 1) * MMA_WN;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
#if __CUDA_ARCH__ >= 800
        uint32_t b[2][2];
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            if (nt >= ntn) continue;
            const __half* p = sx + (wn + nt * 8 + g) * LD + kk + 2 * t;
            b[nt][0] = *reinterpret_cast<const uint32_t*>(p);
            b[nt][1] = *reinterpret_cast<const uint32_t*>(p + 8);
        }
#pragma unroll
        for (int w = 0; w < NW; w++) {
            uint32_t a[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                const __half* p = st + w * TILE + (wr + mt * 16 + g) * LD + kk + 2 * t;
                a[mt][0] = *reinterpret_cast<const uint32_t*>(p);
                a[mt][1] = *reinterpret_cast<const uint32_t*>(p + 8 * LD);
                a[mt][2] = *reinterpret_cast<const uint32_t*>(p + 8);
                a[mt][3] = *reinterpret_cast<const uint32_t*>(p + 8 * LD + 8);
            }
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int nt = 0; nt < 2; nt++) {
                    if (nt >= ntn) continue;
                    float* c = acc[w][mt][nt];
                    asm volatile(
                        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                        : "r"(a[mt][0]), "r"(a[mt][1]), "r"(a[mt][2]), "r"(a[mt][3]), "r"(b[nt][0]),
                          "r"(b[nt][1]));
                }
        }
#else
        // the same C elements (row g or g+8, tokens 2t, 2t+1) with scalar loops
#pragma unroll
        for (int w = 0; w < NW; w++)
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int nt = 0; nt < 2; nt++)
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        if (nt >= ntn) continue;
                        const __half* pw = st + w * TILE + (wr + mt * 16 + g + (i >> 1) * 8) * LD + kk;
                        const __half* px = sx + (wn + nt * 8 + 2 * t + (i & 1)) * LD + kk;
                        float s = 0.f;
                        for (int k = 0; k < 16; k++) s += __half2float(pw[k]) * __half2float(px[k]);
                        acc[w][mt][nt][i] += s;
                    }
#endif
    }
}

// NW = 1: Y = W X (mode 1: Y += W X). NW = 2 (gated unit): Y = act(Wg X) * (Wu X), mode 0
// silu, 1 tanh gelu. mode | MMA_WIDE: the weights read by DeqWide's wide loads (the same
// values; the host sets it for K-quant tensors aligned as DeqWide needs: cuda_ops._wide_ok).
// Grid: (ceil(M / MMA_BM), ceil(N / MMA_BN), S); block: MMA_THREADS.
// A stage holds NW W tiles then the X tile, each [64][BK + MMA_PAD] halves.
//
// Split K (S = gridDim.z > 1, more blocks for few tiles): block z sums the slices
// z * per .. min((z + 1) * per, nk) - 1 (per = ceil(nk / S)) and stores its raw sums of
// weight w at P[((z * NW + w) * N + n) * M + m]; mma_reduce then adds the S partials in
// order z = 0..S-1 (deterministic) and applies the epilogue (Y = / Y += / act(g) * u).
template <int T, int NW>
__device__ __forceinline__ void mma_body(const uint8_t* __restrict__ W0, const uint8_t* __restrict__ W1,
                                         const __half* __restrict__ X, float* __restrict__ Y, int K, int M,
                                         int N, long long row_bytes, int mode, float* __restrict__ P) {
    constexpr int BK = NW == 1 ? MMA_BK : MMA_BK_GLU;
    constexpr int TILE = MMA_BM * (BK + MMA_PAD);  // halves per tile (MMA_BN == MMA_BM)
    __shared__ __align__(16) __half stage[2][(NW + 1) * TILE];
    const bool wide = (mode & MMA_WIDE) != 0;
    mode &= ~MMA_WIDE;
    const int m0 = blockIdx.x * MMA_BM, n0 = blockIdx.y * MMA_BN;
    const int cw = threadIdx.x >> 5;  // warp 0..7
    const int nk_all = (K + BK - 1) / BK;
    const int per = (nk_all + gridDim.z - 1) / gridDim.z;
    const int kb = blockIdx.z * per;                    // first slice of this block
    const int nk = max(0, min(nk_all - kb, per));       // slices of this block
    float acc[NW][2][2][4];
#pragma unroll
    for (int w = 0; w < NW; w++)
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) acc[w][mt][nt][i] = 0.f;
    if (nk > 0) {
        uint4 v0[MmaJobs<BK>::W], v1[MmaJobs<BK>::W], f[MmaJobs<BK>::X];
        mma_fetch<T, NW, BK>(W0, W1, X, v0, v1, f, threadIdx.x, m0, n0, kb * BK, M, N, K, row_bytes, wide);
        mma_put<NW, BK>(stage[0], v0, v1, f, threadIdx.x);
    }
    __syncthreads();
    for (int it = 0; it < nk; it++) {
        // every thread fetches slice it+1 into registers, multiplies stage it&1, then stores
        // the fetched slice into stage (it+1)&1, last read before the previous barrier
        const bool more = it + 1 < nk;
        uint4 v0[MmaJobs<BK>::W], v1[MmaJobs<BK>::W], f[MmaJobs<BK>::X];
        if (more)
            mma_fetch<T, NW, BK>(W0, W1, X, v0, v1, f, threadIdx.x, m0, n0, (kb + it + 1) * BK, M, N, K,
                                 row_bytes, wide);
        const __half* st = stage[it & 1];
        mma_tile<BK, NW>(st, cw, acc);
        if (more) mma_put<NW, BK>(stage[(it + 1) & 1], v0, v1, f, threadIdx.x);
        __syncthreads();
    }
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int wr = (cw & 1) * 32, wn = (cw >> 1) * MMA_WN;
    const bool split = gridDim.z > 1;
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int m = m0 + wr + mt * 16 + g + (i >> 1) * 8;
                const int n = n0 + wn + nt * 8 + 2 * t + (i & 1);
                if (m < M && n < N) {
                    if (split) {
#pragma unroll
                        for (int w = 0; w < NW; w++)
                            P[(((long long)blockIdx.z * NW + w) * N + n) * M + m] = acc[w][mt][nt][i];
                        continue;
                    }
                    float* yp = Y + (long long)n * M + m;
                    if (NW == 1) {
                        const float v = acc[0][mt][nt][i];
                        *yp = mode ? *yp + v : v;
                    } else {
                        const float gv = acc[0][mt][nt][i], uv = acc[NW - 1][mt][nt][i];
                        *yp = (mode ? gelu_tanh(gv) : silu(gv)) * uv;
                    }
                }
            }
}

#define RX_MMA(NAME, T)                                                                            \
    RX_EXTERN void __launch_bounds__(MMA_THREADS, 3) mma_##NAME(const uint8_t* W, const __half* X,  \
                                                             float* Y, int K, int M, int N,       \
                                                             long long rb, int acc, float* P) {   \
        mma_body<T, 1>(W, W, X, Y, K, M, N, rb, acc, P);                                           \
    }                                                                                              \
    RX_EXTERN void __launch_bounds__(MMA_THREADS, 3) mmaglu_##NAME(const uint8_t* Wg, const uint8_t* Wu, \
                                                                const __half* X, float* Y, int K,  \
                                                                int M, int N, long long rb, int act, \
                                                                float* P) {                       \
        mma_body<T, 2>(Wg, Wu, X, Y, K, M, N, rb, act, P);                                         \
    }

// x [n] float32 -> f16 (n a multiple of 4), the tensor-core kernels' X: converted once per
// matmul (or once for the q/k/v of one x), then read as 16-byte chunks.
RX_EXTERN void mma_x_f16(const float* __restrict__ x, __half* __restrict__ y, long long n) {
    for (long long e = 4 * (blockIdx.x * (long long)blockDim.x + threadIdx.x); e < n;
         e += 4LL * gridDim.x * blockDim.x) {
        const float4 f = *reinterpret_cast<const float4*>(x + e);
        *reinterpret_cast<uint2*>(y + e) = make_uint2(pack_half2(f.x, f.y), pack_half2(f.z, f.w));
    }
}

// The split-K epilogue: P [S][NW][NM] partial sums (NM = N * M) -> Y [NM]. NW = 1: Y = sum
// (mode 1: Y += sum); NW = 2: Y = act(sum of gate) * (sum of up), mode 0 silu, 1 tanh gelu.
RX_EXTERN void mma_reduce(const float* __restrict__ P, float* __restrict__ Y, int S, int NW, long long NM,
                          int mode) {
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < NM;
         e += (long long)gridDim.x * blockDim.x) {
        float g = 0.f, u = 0.f;
        for (int z = 0; z < S; z++) {
            g += P[(long long)z * NW * NM + e];
            if (NW == 2) u += P[((long long)z * NW + 1) * NM + e];
        }
        if (NW == 1)
            Y[e] = mode ? Y[e] + g : g;
        else
            Y[e] = (mode ? gelu_tanh(g) : silu(g)) * u;
    }
}

RX_MMA(f16, T_F16)
RX_MMA(bf16, T_BF16)
RX_MMA(q4_0, T_Q4_0)
RX_MMA(q4_1, T_Q4_1)
RX_MMA(q5_0, T_Q5_0)
RX_MMA(q5_1, T_Q5_1)
RX_MMA(q8_0, T_Q8_0)
RX_MMA(q4_k, T_Q4_K)
RX_MMA(q5_k, T_Q5_K)
RX_MMA(q6_k, T_Q6_K)

// ---------------------------------------------------------------------------------------
// Grouped GEMMs for mixtures of experts (prefill): the rows of X that one expert takes,
// gathered, times that expert's weight tiles; the same stages, fetches and mma_tile as
// above, one expert per block. moe_group_i32 (moe.cuh) sorts the batch's (token, slot)
// pairs by expert: order[eoff[e] .. eoff[e+1]-1] are expert e's pairs p = n * k + j (in
// pair order), and tiles[0] = T tiles of at most MMA_BN of those pairs, tile t being
// (expert tiles[1 + 2t], first row tiles[2 + 2t] of its group). Grid (ceil(M / MMA_BM),
// TMAX): block y >= T returns at once (the host sizes TMAX = P / MMA_BN + min(E, P) without
// knowing the routing, so the grid is fixed and the call can be captured).
//   GATHER (gate and up, NW = 2): X [N, K] f16 (the tokens), row r of the tile is token
//     order[g] / k (g = eoff[e] + r0 + r; k = 1 when X holds a row per pair: Llama 4's
//     weighted inputs); H [P, M] f16 gets act(Wg x) * (Wu x) at row g (act 0 silu, 1 gelu),
//     or act 2, gpt-oss's swiglu_oai(Wg x + bg[e], Wu x + bu[e]) (biases [E, M] or null):
//     the pairs in group order, the down projection's X as it is.
//   !GATHER (down, NW = 1): X = H [P, K] f16, row r of the tile is row g; Y [P, M] f32
//     gets W x at row order[g] (the pair: no two blocks write one row, so no atomics;
//     moe_wsum_f32 then adds a token's k rows with their weights, in slot order).
// Expert e's rows start at W + e * es * rb (es: rows one expert spans). No split K: the
// grid has a block per (expert tile, row tile) already.
// flags (cuda_ops._moe_flags): an expert's group is ~P / E rows (32 on
// Qwen3-30B-A3B's 512-token prefill), so most tiles are partly filled (nr < MMA_BN rows).
//   MOE_SKIP (REFLEX_MOE_SKIP): a warp whose 16 tokens all lie past nr multiplies nothing (and one whose last 8
//     do multiplies 8; mma_tile's ntn), so the co-resident blocks get the shared-memory and
//     tensor pipes; the rows written are the same sums in the same order (same bits).
//   MOE_WIDE (REFLEX_MMA_WIDE): the K-quants' weights read by DeqWide's wide loads (same values).
// X rows past nr load nothing (zeros) either way.
#define MOE_SKIP 1
#define MOE_WIDE 2
template <int BK>
__device__ __forceinline__ void mma_fetch_xrows(const __half* const (&xr)[MmaJobs<BK>::X], uint4 (&f)[MmaJobs<BK>::X],
                                                int p, int k0, int K) {
    constexpr int CPR = BK / 8;
#pragma unroll
    for (int i = 0; i < MmaJobs<BK>::X; i++) {
        const int k = k0 + 8 * ((p + i * MMA_LOADERS) % CPR);
        f[i] = (xr[i] != nullptr && k < K) ? __ldg(reinterpret_cast<const uint4*>(xr[i] + k))
                                           : make_uint4(0, 0, 0, 0);
    }
}

template <int T, int NW, bool GATHER>
__device__ __forceinline__ void mma_moe_body(const uint8_t* __restrict__ W0, const uint8_t* __restrict__ W1,
                                             const __half* __restrict__ X, const int* __restrict__ order,
                                             const int* __restrict__ eoff, const int* __restrict__ tiles,
                                             __half* __restrict__ H, float* __restrict__ Y,
                                             const float* __restrict__ bg, const float* __restrict__ bu, int K,
                                             int M, int k, long long es, long long row_bytes, int act, float alpha,
                                             float limit, int flags) {
    constexpr int BK = NW == 1 ? MMA_BK : MMA_BK_GLU;
    constexpr int TILE = MMA_BM * (BK + MMA_PAD);
    __shared__ __align__(16) __half stage[2][(NW + 1) * TILE];
    __shared__ int srow[MMA_BN];  // the tile's rows: X row (GATHER: token) and output row, -1 past the group
    __shared__ int sout[MMA_BN];
    const int t = blockIdx.y;
    if (t >= tiles[0]) return;
    const int e = tiles[1 + 2 * t], r0 = tiles[2 + 2 * t];
    const int g0 = eoff[e] + r0, nr = min(MMA_BN, eoff[e + 1] - g0);
    if (threadIdx.x < MMA_BN) {
        const int r = threadIdx.x;
        int xrow = -1, orow = -1;
        if (r < nr) {
            const int pair = order[g0 + r];
            xrow = GATHER ? pair / k : g0 + r;
            orow = GATHER ? g0 + r : pair;
        }
        srow[threadIdx.x] = xrow;
        sout[threadIdx.x] = orow;
    }
    __syncthreads();
    const uint8_t* w0 = W0 + (long long)e * es * row_bytes;
    const uint8_t* w1 = W1 + (long long)e * es * row_bytes;
    const int m0 = blockIdx.x * MMA_BM;
    const int cw = threadIdx.x >> 5;
    const int nk = (K + BK - 1) / BK;
    const bool wide = (flags & MOE_WIDE) != 0;
    // this warp's 8-token tiles that hold rows of the group (warp-uniform)
    const int ntn = (flags & MOE_SKIP) ? min(2, max(0, (nr - (cw >> 1) * MMA_WN + 7) / 8)) : 2;
    const __half* xr[MmaJobs<BK>::X];
#pragma unroll
    for (int i = 0; i < MmaJobs<BK>::X; i++) {
        const int r = (threadIdx.x + i * MMA_LOADERS) / (BK / 8);
        xr[i] = srow[r] >= 0 ? X + (long long)srow[r] * K : nullptr;
    }
    float acc[NW][2][2][4];
#pragma unroll
    for (int w = 0; w < NW; w++)
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) acc[w][mt][nt][i] = 0.f;
    {
        uint4 v0[MmaJobs<BK>::W], v1[MmaJobs<BK>::W], f[MmaJobs<BK>::X];
        mma_fetch_w<T, BK>(w0, v0, threadIdx.x, m0, 0, M, K, row_bytes, wide);
        if (NW == 2) mma_fetch_w<T, BK>(w1, v1, threadIdx.x, m0, 0, M, K, row_bytes, wide);
        mma_fetch_xrows<BK>(xr, f, threadIdx.x, 0, K);
        mma_put<NW, BK>(stage[0], v0, v1, f, threadIdx.x);
    }
    __syncthreads();
    for (int it = 0; it < nk; it++) {
        const bool more = it + 1 < nk;
        uint4 v0[MmaJobs<BK>::W], v1[MmaJobs<BK>::W], f[MmaJobs<BK>::X];
        if (more) {
            const int k0 = (it + 1) * BK;
            mma_fetch_w<T, BK>(w0, v0, threadIdx.x, m0, k0, M, K, row_bytes, wide);
            if (NW == 2) mma_fetch_w<T, BK>(w1, v1, threadIdx.x, m0, k0, M, K, row_bytes, wide);
            mma_fetch_xrows<BK>(xr, f, threadIdx.x, k0, K);
        }
        const __half* st = stage[it & 1];
        if (ntn > 0) mma_tile<BK, NW>(st, cw, acc, ntn);
        if (more) mma_put<NW, BK>(stage[(it + 1) & 1], v0, v1, f, threadIdx.x);
        __syncthreads();
    }
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2, tq = lane & 3;
    const int wr = (cw & 1) * 32, wn = (cw >> 1) * MMA_WN;
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int m = m0 + wr + mt * 16 + g + (i >> 1) * 8;
                const int n = wn + nt * 8 + 2 * tq + (i & 1);
                if (m >= M || n >= nr) continue;
                const long long o = (long long)sout[n] * M + m;
                if (NW == 2) {
                    float gv = acc[0][mt][nt][i], uv = acc[NW - 1][mt][nt][i];
                    float hv;
                    if (act == 2) {
                        if (bg) gv += bg[(long long)e * M + m];
                        if (bu) uv += bu[(long long)e * M + m];
                        hv = swiglu_oai(gv, uv, alpha, limit);
                    } else {
                        hv = (act ? gelu_tanh(gv) : silu(gv)) * uv;
                    }
                    H[o] = __float2half_rn(hv);
                } else {
                    Y[o] = acc[0][mt][nt][i];
                }
            }
}

#define RX_MMA_MOE(NAME, T)                                                                              \
    RX_EXTERN void __launch_bounds__(MMA_THREADS, 3)                                                     \
        mmaglu_moe_##NAME(const uint8_t* Wg, const uint8_t* Wu, const __half* X, const int* order,      \
                          const int* eoff, const int* tiles, __half* H, const float* bg, const float* bu, \
                          int K, int M, int k, long long es, long long rb, int act, float alpha,         \
                          float limit, int flags) {                                                      \
        mma_moe_body<T, 2, true>(Wg, Wu, X, order, eoff, tiles, H, nullptr, bg, bu, K, M, k, es, rb, act, \
                                 alpha, limit, flags);                                                   \
    }                                                                                                    \
    RX_EXTERN void __launch_bounds__(MMA_THREADS, 3)                                                     \
        mma_moe_##NAME(const uint8_t* W, const __half* X, const int* order, const int* eoff,            \
                       const int* tiles, float* Y, int K, int M, long long es, long long rb, int flags) { \
        mma_moe_body<T, 1, false>(W, W, X, order, eoff, tiles, nullptr, Y, nullptr, nullptr, K, M, 1, es, rb, \
                                  0, 0.f, 0.f, flags);                                                   \
    }

RX_MMA_MOE(f16, T_F16)
RX_MMA_MOE(bf16, T_BF16)
RX_MMA_MOE(q4_0, T_Q4_0)
RX_MMA_MOE(q4_1, T_Q4_1)
RX_MMA_MOE(q5_0, T_Q5_0)
RX_MMA_MOE(q5_1, T_Q5_1)
RX_MMA_MOE(q8_0, T_Q8_0)
RX_MMA_MOE(q4_k, T_Q4_K)
RX_MMA_MOE(q5_k, T_Q5_K)
RX_MMA_MOE(q6_k, T_Q6_K)
