// Reading ggml quantized blocks in place: deq8<T>(block, c, w) writes elements
// 8c..8c+7 of one block (in the block's logical element order) as floats.
// Chunks of 8 never straddle a scale group, so each chunk needs one scale.
#pragma once
#include "common.cuh"

enum {
    T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8,
    T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14, T_BF16 = 30
};

template <int T> struct QT;
// QK: elements per block, BYTES: bytes per block. For float types a "block" is 8 elements.
template <> struct QT<T_F32>  { enum { QK = 8,   BYTES = 32 }; };
template <> struct QT<T_F16>  { enum { QK = 8,   BYTES = 16 }; };
template <> struct QT<T_BF16> { enum { QK = 8,   BYTES = 16 }; };
template <> struct QT<T_Q4_0> { enum { QK = 32,  BYTES = 18 }; };
template <> struct QT<T_Q4_1> { enum { QK = 32,  BYTES = 20 }; };
template <> struct QT<T_Q5_0> { enum { QK = 32,  BYTES = 22 }; };
template <> struct QT<T_Q5_1> { enum { QK = 32,  BYTES = 24 }; };
template <> struct QT<T_Q8_0> { enum { QK = 32,  BYTES = 34 }; };
template <> struct QT<T_Q4_K> { enum { QK = 256, BYTES = 144 }; };
template <> struct QT<T_Q5_K> { enum { QK = 256, BYTES = 176 }; };
template <> struct QT<T_Q6_K> { enum { QK = 256, BYTES = 210 }; };

template <int T> __device__ __forceinline__ void deq8(const uint8_t* b, int c, float w[8]);

template <> __device__ __forceinline__ void deq8<T_F32>(const uint8_t* b, int, float w[8]) {
    const float4* p = reinterpret_cast<const float4*>(b);
    float4 a = __ldg(p), d = __ldg(p + 1);
    w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w; w[4] = d.x; w[5] = d.y; w[6] = d.z; w[7] = d.w;
}

template <> __device__ __forceinline__ void deq8<T_F16>(const uint8_t* b, int, float w[8]) {
    uint4 v = __ldg(reinterpret_cast<const uint4*>(b));
    const __half2* h = reinterpret_cast<const __half2*>(&v);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 f = __half22float2(h[i]);
        w[2 * i] = f.x; w[2 * i + 1] = f.y;
    }
}

template <> __device__ __forceinline__ void deq8<T_BF16>(const uint8_t* b, int, float w[8]) {
    uint4 v = __ldg(reinterpret_cast<const uint4*>(b));
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        w[2 * i] = __uint_as_float(u[i] << 16);
        w[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
}

template <> __device__ __forceinline__ void deq8<T_Q8_0>(const uint8_t* b, int c, float w[8]) {
    const float d = ld_f16(b);
    uint8_t q[8];
    ld8_a2(b + 2 + 8 * c, q);
#pragma unroll
    for (int i = 0; i < 8; i++) w[i] = d * (float)(int8_t)q[i];
}

// Q4_0 / Q4_1: byte j holds element j (low nibble) and element j+16 (high nibble)
template <> __device__ __forceinline__ void deq8<T_Q4_0>(const uint8_t* b, int c, float w[8]) {
    const float d = ld_f16(b);
    uint8_t q[8];
    ld8_a2(b + 2 + 8 * (c & 1), q);
    const int sh = (c >> 1) * 4;
#pragma unroll
    for (int i = 0; i < 8; i++) w[i] = d * (float)(((q[i] >> sh) & 0xF) - 8);
}

template <> __device__ __forceinline__ void deq8<T_Q4_1>(const uint8_t* b, int c, float w[8]) {
    const float d = ld_f16(b), m = ld_f16(b + 2);
    uint8_t q[8];
    ld8_a2(b + 4 + 8 * (c & 1), q);
    const int sh = (c >> 1) * 4;
#pragma unroll
    for (int i = 0; i < 8; i++) w[i] = d * (float)((q[i] >> sh) & 0xF) + m;
}

// Q5_0 / Q5_1: as Q4 plus a fifth bit per element; bit e of qh belongs to element e
template <> __device__ __forceinline__ void deq8<T_Q5_0>(const uint8_t* b, int c, float w[8]) {
    const float d = ld_f16(b);
    const uint32_t qh = (uint32_t)(*reinterpret_cast<const uint16_t*>(b + 2)) |
                        ((uint32_t)(*reinterpret_cast<const uint16_t*>(b + 4)) << 16);
    uint8_t q[8];
    ld8_a2(b + 6 + 8 * (c & 1), q);
    const int sh = (c >> 1) * 4;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int e = 8 * c + i;
        const int v = ((q[i] >> sh) & 0xF) | (((qh >> e) & 1) << 4);
        w[i] = d * (float)(v - 16);
    }
}

template <> __device__ __forceinline__ void deq8<T_Q5_1>(const uint8_t* b, int c, float w[8]) {
    const float d = ld_f16(b), m = ld_f16(b + 2);
    const uint32_t qh = (uint32_t)(*reinterpret_cast<const uint16_t*>(b + 4)) |
                        ((uint32_t)(*reinterpret_cast<const uint16_t*>(b + 6)) << 16);
    uint8_t q[8];
    ld8_a2(b + 8 + 8 * (c & 1), q);
    const int sh = (c >> 1) * 4;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int e = 8 * c + i;
        const int v = ((q[i] >> sh) & 0xF) | (((qh >> e) & 1) << 4);
        w[i] = d * (float)v + m;
    }
}

// 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes of Q4_K / Q5_K
__device__ __forceinline__ void kscale(const uint8_t* s, int j, int& sc, int& mn) {
    if (j < 4) {
        sc = s[j] & 63;
        mn = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// Q4_K: 256 elements in 8 sub-blocks of 32. Element e: pair p = e/64 uses bytes
// qs[32p .. 32p+31]; the first 32 elements of the pair take low nibbles, the next 32 high.
template <> __device__ __forceinline__ void deq8<T_Q4_K>(const uint8_t* b, int c, float w[8]) {
    const int e0 = 8 * c, sub = e0 >> 5, p = e0 >> 6, l = e0 & 31;
    int sc, mn;
    kscale(b + 4, sub, sc, mn);
    const float d = ld_f16(b) * sc, m = ld_f16(b + 2) * mn;
    uint8_t q[8];
    ld8_a2(b + 16 + 32 * p + l, q);
    const int sh = (sub & 1) * 4;
#pragma unroll
    for (int i = 0; i < 8; i++) w[i] = d * (float)((q[i] >> sh) & 0xF) - m;
}

// Q5_K: Q4_K plus qh[32]; bit `sub` of qh[l] is the fifth bit of element (sub, l)
template <> __device__ __forceinline__ void deq8<T_Q5_K>(const uint8_t* b, int c, float w[8]) {
    const int e0 = 8 * c, sub = e0 >> 5, p = e0 >> 6, l = e0 & 31;
    int sc, mn;
    kscale(b + 4, sub, sc, mn);
    const float d = ld_f16(b) * sc, m = ld_f16(b + 2) * mn;
    uint8_t q[8], h[8];
    ld8_a2(b + 48 + 32 * p + l, q);
    ld8_a2(b + 16 + l, h);
    const int sh = (sub & 1) * 4;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int v = ((q[i] >> sh) & 0xF) | (((h[i] >> sub) & 1) << 4);
        w[i] = d * (float)v - m;
    }
}

// Q6_K: ql[128] qh[64] scales[16] (int8) d. Element e: half n = e/128, group g = (e%128)/32,
// l = e%32: low 4 bits from ql[64n + 32(g&1) + l] (nibble g>>1), high 2 bits from
// qh[32n + l] >> 2g, scale scales[8n + 2g + l/16].
template <> __device__ __forceinline__ void deq8<T_Q6_K>(const uint8_t* b, int c, float w[8]) {
    const int e0 = 8 * c, n = e0 >> 7, g = (e0 >> 5) & 3, l = e0 & 31;
    const float d = ld_f16(b + 208) * (float)(int8_t)b[192 + 8 * n + 2 * g + (l >> 4)];
    uint8_t q[8], h[8];
    ld8_a2(b + 64 * n + 32 * (g & 1) + l, q);
    ld8_a2(b + 128 + 32 * n + l, h);
    const int sh = (g >> 1) * 4;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int v = ((q[i] >> sh) & 0xF) | (((h[i] >> (2 * g)) & 3) << 4);
        w[i] = d * (float)(v - 32);
    }
}
