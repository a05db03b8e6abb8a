// One-token matvecs (decode) built for memory bandwidth, for Q4_K, Q5_K, Q6_K and Q8_0 weights.
// Same sums as matmul.cuh / fused.cuh (float math on the dequantized weights), only the
// summation order differs:
//
//   mv{V}_T     y[r] = W[r] . x (accumulate: y[r] += it), W [M, K]
//   mvn{V}_T    up to three weights [M0|M1|M2, K] over one x (q/k/v); norm: x is first
//               rms_norm(x, nw, eps) (nw may be null), folded in as in fused.cuh
//   mvglu{V}_T  y[r] = act(Wg[r] . x) * (Wu[r] . x) (act 0 silu, 1 tanh gelu), same norm fold
//
// Layout. A block has G groups of W warps; a group computes R rows (2R for the gated unit: gate
// and up rows), the block's rows in order; the group's W warps split K (warp w of the group takes
// quant blocks w*BPW.., stepping BPW*W; W = 1: a warp over the whole row), and within a warp
// P lanes share one quant block, each lane taking a fixed slice of it ("part"). Per step a
// lane loads its slice of every row (wide loads: 16 bytes of Q4_K quants plus the 16-byte
// header; 4-byte words otherwise, as the 2-byte aligned Q6_K / Q8_0 blocks allow), U steps'
// loads are issued before any is used, then loads the matching x values once (float4) and
// uses them for all rows. Quants become floats without int->float conversions (1/8 rate):
// byte_perm puts a byte under the exponent of 2^23 and one subtraction leaves it exactly.
// Per-slice scales are decoded once per slice; the products use the factored form
// sum_i (d*q_i - m) x_i = d * sum_i q_i x_i - m * sum_i x_i (the sums of x are shared by all
// rows). A group's partial sums go through warp shuffles and (W > 1) shared memory, in a
// fixed order (deterministic).
//
// Alignment: x (and nw) 16-byte aligned; Q4_K / Q5_K weights 16-byte aligned (the host checks
// the pointer; rows of 144- / 176-byte blocks keep it); Q6_K / Q8_0 2-byte aligned. K a multiple of the
// block's element count (256, 256, 32).
#pragma once
#include "quants.cuh"

// NWD 4-byte words of the bytes at p (2-byte aligned): aligned word loads, shifted into place.
// The extra word is read only when p is not 4-aligned, and then holds bytes that are needed,
// so nothing past the last needed byte's word is touched.
template <int NWD>
__device__ __forceinline__ void ldw_a2(const uint8_t* p, uint32_t (&out)[NWD]) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    const uint32_t* w = reinterpret_cast<const uint32_t*>(a & ~(uintptr_t)3);
    const int sh = (int)(a & 2) * 8;  // 0 or 16
    uint32_t v[NWD + 1];
#pragma unroll
    for (int i = 0; i < NWD; i++) v[i] = __ldg(w + i);
    v[NWD] = sh ? __ldg(w + NWD) : 0u;
#pragma unroll
    for (int i = 0; i < NWD; i++) out[i] = __funnelshift_r(v[i], v[i + 1], sh);
}

// byte k of w (0..255) as a float, exactly: 0x4B0000bb is 2^23 + bb. `bias` 2^23 (unsigned)
// or 2^23 + 128 (the byte was an int8 with its sign bit flipped).
template <int k>
__device__ __forceinline__ float byte_f(uint32_t w, float bias) {
    return __int_as_float((int)__byte_perm(w, 0x4B000000u, 0x7540u | k)) - bias;
}

// acc + sum_k byte k of w * x[k]
__device__ __forceinline__ float dot4b(uint32_t w, float4 x, float acc, float bias) {
    acc = fmaf(byte_f<0>(w, bias), x.x, acc);
    acc = fmaf(byte_f<1>(w, bias), x.y, acc);
    acc = fmaf(byte_f<2>(w, bias), x.z, acc);
    acc = fmaf(byte_f<3>(w, bias), x.w, acc);
    return acc;
}

__device__ __forceinline__ float hsum4(float4 v) { return (v.x + v.y) + (v.z + v.w); }

__device__ __forceinline__ float half_lo(uint32_t v) {
    return __half2float(__ushort_as_half((unsigned short)(v & 0xffffu)));
}

__device__ __forceinline__ int byte_at(uint32_t v, int k) { return (int)((v >> (8 * k)) & 0xffu); }

#define MV_TWO23 8388608.f

template <int T> struct MV;

// Q4_K (144 bytes: d, dmin, 12 bytes of 6-bit scales/mins, qs[128]). 8 lanes a block; part
// s = 2p + h (p < 4, h < 2) takes qs[32p + 16h .. +15]: its low nibbles are elements
// 64p + 16h + i of sub-block 2p, its high nibbles elements 64p + 32 + 16h + i of sub-block 2p+1.
template <> struct MV<T_Q4_K> {
    enum { P = 8, NX4 = 8 };  // lanes per block, float4s of x per lane
    struct Raw { uint4 h, q; };
    struct XS { float s[2]; };
    static __device__ __forceinline__ void load(const uint8_t* b, int part, Raw& r) {
        r.h = __ldg(reinterpret_cast<const uint4*>(b));
        r.q = __ldg(reinterpret_cast<const uint4*>(b + 16) + part);
    }
    // xb: the block's first x value
    static __device__ __forceinline__ void load_x(const float* xb, int part, float4 (&xv)[NX4]) {
        const int p = part >> 1, h = part & 1;
        const float4* a = reinterpret_cast<const float4*>(xb + 64 * p + 16 * h);
        const float4* c = reinterpret_cast<const float4*>(xb + 64 * p + 32 + 16 * h);
#pragma unroll
        for (int i = 0; i < 4; i++) xv[i] = __ldg(a + i), xv[4 + i] = __ldg(c + i);
    }
    static __device__ __forceinline__ XS xsums(const float4 (&xv)[NX4]) {
        XS s;
        s.s[0] = (hsum4(xv[0]) + hsum4(xv[1])) + (hsum4(xv[2]) + hsum4(xv[3]));
        s.s[1] = (hsum4(xv[4]) + hsum4(xv[5])) + (hsum4(xv[6]) + hsum4(xv[7]));
        return s;
    }
    // 6-bit scale and min of sub-block j (kscale in quants.cuh) from the header's words
    static __device__ __forceinline__ void scale(const uint4& h, int j, int& sc, int& mn) {
        const int k = j & 3;
        const int y = byte_at(h.y, k), z = byte_at(h.z, k), w = byte_at(h.w, k);
        if (j < 4) {
            sc = y & 63, mn = z & 63;
        } else {
            sc = (w & 0xF) | ((y >> 6) << 4), mn = (w >> 4) | ((z >> 6) << 4);
        }
    }
    static __device__ __forceinline__ float dot(const Raw& r, const float4 (&xv)[NX4], const XS& xs, int part) {
        const int p = part >> 1;
        int sc0, mn0, sc1, mn1;
        scale(r.h, 2 * p, sc0, mn0);
        scale(r.h, 2 * p + 1, sc1, mn1);
        const float d = half_lo(r.h.x), dm = half_lo(r.h.x >> 16);
        const uint32_t q[4] = {r.q.x, r.q.y, r.q.z, r.q.w};
        float s0 = 0.f, s1 = 0.f;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            s0 = dot4b(q[i] & 0x0F0F0F0Fu, xv[i], s0, MV_TWO23);
            s1 = dot4b((q[i] >> 4) & 0x0F0F0F0Fu, xv[4 + i], s1, MV_TWO23);
        }
        return ((d * sc0) * s0 - (dm * mn0) * xs.s[0]) + ((d * sc1) * s1 - (dm * mn1) * xs.s[1]);
    }
};

// Q5_K (176 bytes: d, dmin, scales as Q4_K, qh[32], qs[128]): Q4_K's slices, plus the fifth
// bits: bit j of qh[l] belongs to element l of sub-block j, so part 2p + h also loads
// qh[16h .. 16h+15] (bits 2p and 2p + 1 of those bytes).
template <> struct MV<T_Q5_K> {
    enum { P = 8, NX4 = 8 };
    struct Raw { uint4 h, q, b; };
    using XS = MV<T_Q4_K>::XS;
    static __device__ __forceinline__ void load(const uint8_t* b, int part, Raw& r) {
        r.h = __ldg(reinterpret_cast<const uint4*>(b));
        r.b = __ldg(reinterpret_cast<const uint4*>(b + 16) + (part & 1));
        r.q = __ldg(reinterpret_cast<const uint4*>(b + 48) + part);
    }
    static __device__ __forceinline__ void load_x(const float* xb, int part, float4 (&xv)[NX4]) {
        MV<T_Q4_K>::load_x(xb, part, xv);
    }
    static __device__ __forceinline__ XS xsums(const float4 (&xv)[NX4]) { return MV<T_Q4_K>::xsums(xv); }
    static __device__ __forceinline__ float dot(const Raw& r, const float4 (&xv)[NX4], const XS& xs, int part) {
        const int p = part >> 1;
        int sc0, mn0, sc1, mn1;
        MV<T_Q4_K>::scale(r.h, 2 * p, sc0, mn0);
        MV<T_Q4_K>::scale(r.h, 2 * p + 1, sc1, mn1);
        const float d = half_lo(r.h.x), dm = half_lo(r.h.x >> 16);
        const uint32_t q[4] = {r.q.x, r.q.y, r.q.z, r.q.w}, hb[4] = {r.b.x, r.b.y, r.b.z, r.b.w};
        float s0 = 0.f, s1 = 0.f;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t lo = (q[i] & 0x0F0F0F0Fu) | (((hb[i] >> (2 * p)) & 0x01010101u) << 4);
            const uint32_t hi = ((q[i] >> 4) & 0x0F0F0F0Fu) | (((hb[i] >> (2 * p + 1)) & 0x01010101u) << 4);
            s0 = dot4b(lo, xv[i], s0, MV_TWO23);
            s1 = dot4b(hi, xv[4 + i], s1, MV_TWO23);
        }
        return ((d * sc0) * s0 - (dm * mn0) * xs.s[0]) + ((d * sc1) * s1 - (dm * mn1) * xs.s[1]);
    }
};

// Q6_K (210 bytes: ql[128], qh[64], int8 scales[16], d). 8 lanes a block; part = 4n + t
// (half n < 2, t < 4) takes l = 8t .. 8t+7 of all four groups g of half n: elements
// 128n + 32g + l, low 4 bits from ql[64n + 32(g&1) + l] (nibble g>>1), high 2 bits from
// qh[32n + l] >> 2g, scale scales[8n + 2g + l/16]; value d * scale * (q - 32).
template <> struct MV<T_Q6_K> {
    enum { P = 8, NX4 = 8 };
    struct Raw { uint32_t a[2], b[2], h[2], s[2]; uint32_t d; };
    struct XS { float s[4]; };
    static __device__ __forceinline__ void load(const uint8_t* b, int part, Raw& r) {
        const int n = part >> 2, l0 = 8 * (part & 3);
        ldw_a2<2>(b + 64 * n + l0, r.a);
        ldw_a2<2>(b + 64 * n + 32 + l0, r.b);
        ldw_a2<2>(b + 128 + 32 * n + l0, r.h);
        ldw_a2<2>(b + 192 + 8 * n, r.s);
        r.d = __ldg(reinterpret_cast<const unsigned short*>(b + 208));
    }
    static __device__ __forceinline__ void load_x(const float* xb, int part, float4 (&xv)[NX4]) {
        const int n = part >> 2, l0 = 8 * (part & 3);
#pragma unroll
        for (int g = 0; g < 4; g++) {
            const float4* a = reinterpret_cast<const float4*>(xb + 128 * n + 32 * g + l0);
            xv[2 * g] = __ldg(a), xv[2 * g + 1] = __ldg(a + 1);
        }
    }
    static __device__ __forceinline__ XS xsums(const float4 (&xv)[NX4]) {
        XS s;
#pragma unroll
        for (int g = 0; g < 4; g++) s.s[g] = hsum4(xv[2 * g]) + hsum4(xv[2 * g + 1]);
        return s;
    }
    static __device__ __forceinline__ float dot(const Raw& r, const float4 (&xv)[NX4], const XS& xs, int part) {
        const int t = (part & 3) >> 1;  // l/16 of the slice
        float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const uint32_t a = r.a[i], b = r.b[i], h = r.h[i];
            s[0] = dot4b((a & 0x0F0F0F0Fu) | ((h << 4) & 0x30303030u), xv[i], s[0], MV_TWO23);
            s[1] = dot4b((b & 0x0F0F0F0Fu) | ((h << 2) & 0x30303030u), xv[2 + i], s[1], MV_TWO23);
            s[2] = dot4b(((a >> 4) & 0x0F0F0F0Fu) | (h & 0x30303030u), xv[4 + i], s[2], MV_TWO23);
            s[3] = dot4b(((b >> 4) & 0x0F0F0F0Fu) | ((h >> 2) & 0x30303030u), xv[6 + i], s[3], MV_TWO23);
        }
        float acc = 0.f;
#pragma unroll
        for (int g = 0; g < 4; g++) {
            // scales[8n + 2g + t]: byte 2g + t of the 8 loaded (word g/2, byte 2(g&1) + t)
            const float sc = (float)(int8_t)byte_at(r.s[g >> 1], 2 * (g & 1) + t);
            acc = fmaf(sc, s[g] - 32.f * xs.s[g], acc);
        }
        return half_lo(r.d) * acc;
    }
};

// Q8_0 (34 bytes: d, 32 int8). 2 lanes a block; part h takes elements 16h .. 16h+15.
template <> struct MV<T_Q8_0> {
    enum { P = 2, NX4 = 4 };
    struct Raw { uint32_t q[4]; uint32_t d; };
    struct XS {};
    static __device__ __forceinline__ void load(const uint8_t* b, int part, Raw& r) {
        ldw_a2<4>(b + 2 + 16 * part, r.q);
        r.d = __ldg(reinterpret_cast<const unsigned short*>(b));
    }
    static __device__ __forceinline__ void load_x(const float* xb, int part, float4 (&xv)[NX4]) {
        const float4* a = reinterpret_cast<const float4*>(xb + 16 * part);
#pragma unroll
        for (int i = 0; i < 4; i++) xv[i] = __ldg(a + i);
    }
    static __device__ __forceinline__ XS xsums(const float4 (&)[NX4]) { return XS{}; }
    static __device__ __forceinline__ float dot(const Raw& r, const float4 (&xv)[NX4], const XS&, int) {
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < 4; i++) s = dot4b(r.q[i] ^ 0x80808080u, xv[i], s, MV_TWO23 + 128.f);
        return half_lo(r.d) * s;
    }
};

// acc[r] = this thread's share of wr[r] . (x * nw) (nw null: x), ss its share of sum(x^2)
// (when norm). Every x value is read by exactly one thread of the block.
template <int T, int NR, int W, int U>
__device__ __forceinline__ void mv_core(const uint8_t* const (&wr)[NR], const float* __restrict__ x,
                                        const float* __restrict__ nw, int K, int norm, float (&acc)[NR],
                                        float& ss) {
    using Q = MV<T>;
    constexpr int QK = QT<T>::QK, BYTES = QT<T>::BYTES;
    constexpr int BPW = 32 / Q::P;  // quant blocks per warp and step
    constexpr int STEP = BPW * W;   // quant blocks per thread block and step
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) % W;  // warp within the group
    const int part = lane % Q::P;
    const int nb = K / QK;
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] = 0.f;
    ss = 0.f;
    for (int qb0 = warp * BPW + lane / Q::P; qb0 < nb; qb0 += U * STEP) {
        typename Q::Raw raw[U][NR];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int qb = qb0 + u * STEP;
            if (qb < nb) {
#pragma unroll
                for (int r = 0; r < NR; r++) Q::load(wr[r] + (long long)qb * BYTES, part, raw[u][r]);
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int qb = qb0 + u * STEP;
            if (qb < nb) {
                float4 xv[Q::NX4];
                Q::load_x(x + (long long)qb * QK, part, xv);
                if (norm) {
#pragma unroll
                    for (int i = 0; i < Q::NX4; i++)
                        ss += xv[i].x * xv[i].x + xv[i].y * xv[i].y + xv[i].z * xv[i].z + xv[i].w * xv[i].w;
                }
                if (nw) {
                    float4 nv[Q::NX4];
                    Q::load_x(nw + (long long)qb * QK, part, nv);
#pragma unroll
                    for (int i = 0; i < Q::NX4; i++)
                        xv[i].x *= nv[i].x, xv[i].y *= nv[i].y, xv[i].z *= nv[i].z, xv[i].w *= nv[i].w;
                }
                const typename Q::XS xs = Q::xsums(xv);
#pragma unroll
                for (int r = 0; r < NR; r++) acc[r] += Q::dot(raw[u][r], xv, xs, part);
            }
        }
    }
}

// acc[] and ss summed over the thread's group of W warps; every thread gets its group's totals.
// Every thread of the block must call it (W > 1: a block barrier).
template <int NR, int W, int G>
__device__ __forceinline__ void mv_reduce(float (&acc)[NR], float& ss) {
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] = warp_sum(acc[r]);
    ss = warp_sum(ss);
    if (W > 1) {
        __shared__ float part[G * W][NR + 1];
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, w0 = warp / W * W;
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < NR; r++) part[warp][r] = acc[r];
            part[warp][NR] = ss;
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < NR; r++) {
            float s = part[w0][r];
#pragma unroll
            for (int w = 1; w < W; w++) s += part[w0 + w][r];
            acc[r] = s;
        }
        float s = part[w0][NR];
#pragma unroll
        for (int w = 1; w < W; w++) s += part[w0 + w][NR];
        ss = s;
    }
}

// The first row of the thread's group, and whether the thread writes the group's results
// (lane 0 of the group's first warp).
template <int R, int W, int G>
__device__ __forceinline__ int mv_row0() { return (blockIdx.x * G + (int)(threadIdx.x >> 5) / W) * R; }
template <int W>
__device__ __forceinline__ bool mv_writer() { return (threadIdx.x & 31) == 0 && (threadIdx.x >> 5) % W == 0; }

// Grid ceil(M / (G * R)) blocks of 32 * W * G. Rows past M re-read row M - 1 and write nothing.
template <int T, int R, int W, int G, int U>
__device__ __forceinline__ void mv_body(const uint8_t* __restrict__ Wt, const float* __restrict__ X,
                                        float* __restrict__ Y, int K, int M, long long rb, int accumulate) {
    const int row0 = mv_row0<R, W, G>();
    const uint8_t* wr[R];
#pragma unroll
    for (int r = 0; r < R; r++) wr[r] = Wt + (long long)min(row0 + r, M - 1) * rb;
    float acc[R], ss;
    mv_core<T, R, W, U>(wr, X, nullptr, K, 0, acc, ss);
    mv_reduce<R, W, G>(acc, ss);
    if (mv_writer<W>()) {
#pragma unroll
        for (int r = 0; r < R; r++)
            if (row0 + r < M) Y[row0 + r] = accumulate ? Y[row0 + r] + acc[r] : acc[r];
    }
}

// Up to three weights (one type and row_bytes; unused: M = 0) over one x; rows of the three in
// order, R a block (a block may hold rows of two weights). norm: y = (W . (x * nw)) *
// rsqrt(mean(x^2) + eps). Grid ceil((M0 + M1 + M2) / (G * R)) blocks of 32 * W * G.
template <int T, int R, int W, int G, int U>
__device__ __forceinline__ void mvn_body(const uint8_t* W0, const uint8_t* W1, const uint8_t* W2,
                                         const float* X, const float* nw, float eps, float* Y0, float* Y1,
                                         float* Y2, int K, int M0, int M1, int M2, long long rb, int norm) {
    const uint8_t* wr[R];
    float* yp[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        int row = mv_row0<R, W, G>() + r;
        if (row < M0) {
            wr[r] = W0 + (long long)row * rb, yp[r] = Y0 + row;
        } else if ((row -= M0) < M1) {
            wr[r] = W1 + (long long)row * rb, yp[r] = Y1 + row;
        } else if ((row -= M1) < M2) {
            wr[r] = W2 + (long long)row * rb, yp[r] = Y2 + row;
        } else {
            wr[r] = M0 ? W0 : (M1 ? W1 : W2), yp[r] = nullptr;  // past the end: a real row, not written
        }
    }
    float acc[R], ss;
    mv_core<T, R, W, U>(wr, X, nw, K, norm, acc, ss);
    mv_reduce<R, W, G>(acc, ss);
    if (mv_writer<W>()) {
        const float s = norm ? rsqrtf(ss / K + eps) : 1.f;
#pragma unroll
        for (int r = 0; r < R; r++)
            if (yp[r]) *yp[r] = acc[r] * s;
    }
}

// y[r] = act(g) * u, g and u rows r of Wg and Wu [M, K] times x (norm: rms_norm(x, nw, eps)).
// Grid ceil(M / (G * R)) blocks of 32 * W * G.
template <int T, int R, int W, int G, int U>
__device__ __forceinline__ void mvglu_body(const uint8_t* __restrict__ Wg, const uint8_t* __restrict__ Wu,
                                           const float* __restrict__ X, const float* __restrict__ nw, float eps,
                                           float* __restrict__ Y, int K, int M, long long rb, int act, int norm) {
    const int row0 = mv_row0<R, W, G>();
    const uint8_t* wr[2 * R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const long long off = (long long)min(row0 + r, M - 1) * rb;
        wr[r] = Wg + off, wr[R + r] = Wu + off;
    }
    float acc[2 * R], ss;
    mv_core<T, 2 * R, W, U>(wr, X, nw, K, norm, acc, ss);
    mv_reduce<2 * R, W, G>(acc, ss);
    if (mv_writer<W>()) {
        const float s = norm ? rsqrtf(ss / K + eps) : 1.f;
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (row0 + r < M) {
                const float g = acc[r] * s, u = acc[R + r] * s;
                Y[row0 + r] = (act ? gelu_tanh(g) : silu(g)) * u;
            }
        }
    }
}

// Variants (rows a group R, warps a group W, groups a block G, steps in flight U); the
// backend's MV_VARIANTS (cuda_ops.py) lists the same.
#define RX_MV_V(V, NAME, T, R, W, G, U)                                                                \
    RX_EXTERN void __launch_bounds__(32 * W * G) mv##V##_##NAME(const uint8_t* Wt, const float* X,   \
                                                                float* Y, int K, int M, long long rb, \
                                                                int acc) {                            \
        mv_body<T, R, W, G, U>(Wt, X, Y, K, M, rb, acc);                                               \
    }                                                                                                  \
    RX_EXTERN void __launch_bounds__(32 * W * G) mvn##V##_##NAME(                                      \
        const uint8_t* W0, const uint8_t* W1, const uint8_t* W2, const float* X, const float* nw,      \
        float eps, float* Y0, float* Y1, float* Y2, int K, int M0, int M1, int M2, long long rb,       \
        int norm) {                                                                                    \
        mvn_body<T, R, W, G, U>(W0, W1, W2, X, nw, eps, Y0, Y1, Y2, K, M0, M1, M2, rb, norm);          \
    }                                                                                                  \
    RX_EXTERN void __launch_bounds__(32 * W * G) mvglu##V##_##NAME(                                    \
        const uint8_t* Wg, const uint8_t* Wu, const float* X, const float* nw, float eps, float* Y,    \
        int K, int M, long long rb, int act, int norm) {                                               \
        mvglu_body<T, R, W, G, U>(Wg, Wu, X, nw, eps, Y, K, M, rb, act, norm);                         \
    }

// a: a row a block, 4 warps over K (fused.cuh's split layout); b, c: 2 / 4 rows sharing x;
// d, e: a warp (or group of one) over whole rows, for rows of few blocks (K of 1-2 warp steps)
#define RX_MV(NAME, T)                  \
    RX_MV_V(a, NAME, T, 1, 4, 1, 2)     \
    RX_MV_V(b, NAME, T, 2, 4, 1, 1)     \
    RX_MV_V(c, NAME, T, 4, 2, 1, 1)     \
    RX_MV_V(d, NAME, T, 2, 1, 4, 1)     \
    RX_MV_V(e, NAME, T, 4, 1, 2, 1)

RX_MV(q4_k, T_Q4_K)
RX_MV(q5_k, T_Q5_K)
RX_MV(q6_k, T_Q6_K)
RX_MV(q8_0, T_Q8_0)
