// The IQ formats (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS), the
// ternary ones (TQ1_0, TQ2_0) and MXFP4, read in place: iq_<fmt>(b, c, w) writes elements
// 8c..8c+7 of the block at b (in the block's element order) as floats, with ggml's float
// expression for each value (so the same bits as reflex_ipc/quants.py). A chunk of 8 never
// straddles a scale group (IQ4_XS: 32 values; IQ2_XS / IQ2_S / IQ1_M: 16; the grids: 8 or 4).
//
// Plain C++ over byte loads (any alignment: MXFP4's 17-byte blocks start at odd addresses),
// `RX_HD` (__host__ __device__ under nvcc) so that tests/test_cuda_iq.py compiles this very
// file on the host with the C++ compiler and compares every chunk with quants.py. Tables:
// quant_tables.h (ggml's grids and sign patterns, in device memory under nvcc).
#pragma once
#include <stdint.h>

#include "quant_tables.h"

#ifdef __CUDACC__
#include <cuda_fp16.h>
#define RX_HD __host__ __device__ __forceinline__
#else
#include <string.h>
#define RX_HD static inline
#endif

RX_HD uint32_t iq_u8(const uint8_t* p) {
#ifdef __CUDA_ARCH__
    return __ldg(p);
#else
    return *p;
#endif
}
RX_HD uint32_t iq_u16(const uint8_t* p) { return iq_u8(p) | (iq_u8(p + 1) << 8); }
RX_HD uint32_t iq_u32(const uint8_t* p) { return iq_u16(p) | (iq_u16(p + 2) << 16); }

RX_HD float iq_f16(uint32_t h) {
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half((unsigned short)h));
#else
    const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {  // subnormal: normalize
            int e = -1;
            do { e++; man <<= 1; } while (!(man & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
#endif
}

RX_HD float iq_bits_f32(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

// y[j] = db * grid[j] * (bit j of signs ? -1 : 1) for the n bytes of one grid point (a product
// by -1, not a negation: a nan scale keeps its sign bit on the host, as in ggml and numpy)
RX_HD void iq_signed(float* y, float db, uint64_t g, uint32_t signs, int n) {
    for (int j = 0; j < n; j++) y[j] = db * (float)((g >> (8 * j)) & 0xff) * ((signs >> j & 1) ? -1.f : 1.f);
}

// IQ2_XXS (66 bytes): d, then per 32 values 4 grid indices (bytes) and a word of 4 x 7 sign
// bits (ksigns_iq2xs indices) and a 4-bit scale: d * (0.5 + s) / 4.
RX_HD void iq_iq2_xxs(const uint8_t* b, int c, float* w) {
    const int ib = c >> 2, l = c & 3;
    const uint32_t aux = iq_u32(b + 2 + 8 * ib + 4);
    const float db = iq_f16(iq_u16(b)) * (0.5f + (float)(aux >> 28)) * 0.25f;
    iq_signed(w, db, rx_iq2xxs_grid[iq_u8(b + 2 + 8 * ib + l)], rx_ksigns_iq2xs[(aux >> (7 * l)) & 127], 8);
}

// IQ2_XS (74 bytes): d, 32 u16 (9-bit grid index, 7-bit sign index), 8 bytes of two 4-bit
// scales (values 0..15, 16..31 of each 32).
RX_HD void iq_iq2_xs(const uint8_t* b, int c, float* w) {
    const int ib = c >> 2, l = c & 3;
    const uint32_t q = iq_u16(b + 2 + 2 * c), sc = iq_u8(b + 66 + ib);
    const float db = iq_f16(iq_u16(b)) * (0.5f + (float)((sc >> (4 * (l >> 1))) & 15)) * 0.25f;
    iq_signed(w, db, rx_iq2xs_grid[q & 511], rx_ksigns_iq2xs[q >> 9], 8);
}

// IQ2_S (82 bytes): d, qs[32] (low 8 bits of 10-bit grid indices), signs[32] (a byte per 8
// values), qh[8] (2 high bits of each of 4 indices), scales[8] as IQ2_XS.
RX_HD void iq_iq2_s(const uint8_t* b, int c, float* w) {
    const int ib = c >> 2, l = c & 3;
    const uint32_t sc = iq_u8(b + 74 + ib);
    const float db = iq_f16(iq_u16(b)) * (0.5f + (float)((sc >> (4 * (l >> 1))) & 15)) * 0.25f;
    const uint32_t idx = iq_u8(b + 2 + c) | ((iq_u8(b + 66 + ib) << (8 - 2 * l)) & 0x300);
    iq_signed(w, db, rx_iq2s_grid[idx], iq_u8(b + 34 + c), 8);
}

// IQ3_XXS (98 bytes): d, qs[64] (a 4-value grid index each), then per 32 values a word of
// 4 x 7 sign bits and a 4-bit scale: d * (0.5 + s) / 2.
RX_HD void iq_iq3_xxs(const uint8_t* b, int c, float* w) {
    const int ib = c >> 2, l = c & 3;
    const uint32_t aux = iq_u32(b + 66 + 4 * ib);
    const float db = iq_f16(iq_u16(b)) * (0.5f + (float)(aux >> 28)) * 0.5f;
    const uint32_t signs = rx_ksigns_iq2xs[(aux >> (7 * l)) & 127];
    iq_signed(w, db, rx_iq3xxs_grid[iq_u8(b + 2 + 2 * c)], signs, 4);
    iq_signed(w + 4, db, rx_iq3xxs_grid[iq_u8(b + 3 + 2 * c)], signs >> 4, 4);
}

// IQ3_S (110 bytes): d, qs[64] (low 8 bits of 9-bit 4-value grid indices), qh[8] (their 9th
// bits, bit k of qh[ib] for qs[8 ib + k]), signs[32], scales[4] (4-bit, per 32 values:
// d * (1 + 2 s)).
RX_HD void iq_iq3_s(const uint8_t* b, int c, float* w) {
    const int ib = c >> 2, l = c & 3;
    const float db = iq_f16(iq_u16(b)) * (float)(1 + 2 * ((iq_u8(b + 106 + (ib >> 1)) >> (4 * (ib & 1))) & 15));
    const uint32_t qh = iq_u8(b + 66 + ib), signs = iq_u8(b + 74 + c);
    const uint32_t i1 = iq_u8(b + 2 + 2 * c) | ((qh << (8 - 2 * l)) & 256);
    const uint32_t i2 = iq_u8(b + 3 + 2 * c) | ((qh << (7 - 2 * l)) & 256);
    iq_signed(w, db, rx_iq3s_grid[i1], signs, 4);
    iq_signed(w + 4, db, rx_iq3s_grid[i2], signs >> 4, 4);
}

// y[j] = dl * (grid[j] + delta) for an IQ1 grid point (int8 values -1, 0, 1)
RX_HD void iq_iq1(float* y, float dl, uint64_t g, float delta) {
    for (int j = 0; j < 8; j++) y[j] = dl * ((float)(int8_t)(uint8_t)((g >> (8 * j)) & 0xff) + delta);
}

// IQ1_S (50 bytes): d, qs[32] (low 8 bits of 11-bit grid indices), per 32 values a u16: 4 x 3
// high index bits, a 3-bit scale (d * (2 s + 1)), the sign of the delta (+-0.125).
RX_HD void iq_iq1_s(const uint8_t* b, int c, float* w) {
    const int ib = c >> 2, l = c & 3;
    const uint32_t h = iq_u16(b + 34 + 2 * ib);
    const float dl = iq_f16(iq_u16(b)) * (float)(2 * ((h >> 12) & 7) + 1);
    const uint32_t idx = iq_u8(b + 2 + c) | (((h >> (3 * l)) & 7) << 8);
    iq_iq1(w, dl, rx_iq1s_grid[idx], (h & 0x8000) ? -0.125f : 0.125f);
}

// IQ1_M (56 bytes): qs[32], qh[16] (per 8 values a nibble: 3 high index bits, the delta's
// sign), 4 u16 of 3-bit scales (per 16 values; d * (2 s + 1)) whose top nibbles hold d.
RX_HD void iq_iq1_m(const uint8_t* b, int c, float* w) {
    const int ib = c >> 2, l = c & 3;
    const uint32_t d16 = (iq_u16(b + 48) >> 12) | ((iq_u16(b + 50) >> 8) & 0x00f0) |
                         ((iq_u16(b + 52) >> 4) & 0x0f00) | (iq_u16(b + 54) & 0xf000);
    const uint32_t s16 = iq_u16(b + 48 + 2 * (ib >> 1));
    const float dl = iq_f16(d16) * (float)(2 * ((s16 >> (6 * (ib & 1) + 3 * (l >> 1))) & 7) + 1);
    const uint32_t nib = (iq_u8(b + 32 + 2 * ib + (l >> 1)) >> (4 * (l & 1))) & 15;
    iq_iq1(w, dl, rx_iq1s_grid[iq_u8(b + c) | ((nib & 7) << 8)], (nib & 8) ? -0.125f : 0.125f);
}

// IQ4_NL (18 bytes): d, 16 bytes: byte j holds elements j (low nibble) and j + 16 (high),
// each an index into kvalues_iq4nl.
RX_HD void iq_iq4_nl(const uint8_t* b, int c, float* w) {
    const float d = iq_f16(iq_u16(b));
    const int sh = (c >> 1) * 4;
    for (int i = 0; i < 8; i++) w[i] = d * (float)rx_kvalues_iq4nl[(iq_u8(b + 2 + 8 * (c & 1) + i) >> sh) & 15];
}

// IQ4_XS (136 bytes): d, u16 scales_h (2 high bits per 32 values), scales_l[4] (4 low bits),
// qs[128]: per 32 values 16 bytes as IQ4_NL's; scale d * (s - 32).
RX_HD void iq_iq4_xs(const uint8_t* b, int c, float* w) {
    const int ib = c >> 2, h = (c >> 1) & 1, q0 = 8 * (c & 1);
    const int ls = (int)(((iq_u8(b + 4 + (ib >> 1)) >> (4 * (ib & 1))) & 15) | (((iq_u16(b + 2) >> (2 * ib)) & 3) << 4));
    const float dl = iq_f16(iq_u16(b)) * (float)(ls - 32);
    for (int i = 0; i < 8; i++)
        w[i] = dl * (float)rx_kvalues_iq4nl[(iq_u8(b + 8 + 16 * ib + q0 + i) >> (4 * h)) & 15];
}

// MXFP4 (17 bytes): e (E8M0, taken at half as ggml does: 2^(e - 128)), 16 bytes of nibbles as
// IQ4_NL's, indices into the doubled E2M1 values.
RX_HD void iq_mxfp4(const uint8_t* b, int c, float* w) {
    const uint32_t e = iq_u8(b);
    const float d = iq_bits_f32(e < 2 ? 0x00200000u << e : (e - 1) << 23);
    const int sh = (c >> 1) * 4;
    for (int i = 0; i < 8; i++) w[i] = (float)rx_kvalues_mxfp4[(iq_u8(b + 1 + 8 * (c & 1) + i) >> sh) & 15] * d;
}

// TQ1_0 (54 bytes): qs[48] of 5 base-3 digits each (bytes 0..31: values 32 k + m; bytes
// 32..47: 160 + 16 k + m), qh[4] of 4 digits (240 + 4 k + j), d: value d * (digit - 1).
// Digit k of byte q: ((q * 3^k mod 256) * 3) >> 8.
RX_HD int iq_tq1_digit(uint32_t q, int k) {
    const uint32_t p = k == 0 ? 1 : k == 1 ? 3 : k == 2 ? 9 : k == 3 ? 27 : 81;
    return (int)((((q * p) & 255) * 3) >> 8);
}

RX_HD void iq_tq1_0(const uint8_t* b, int c, float* w) {
    const float d = iq_f16(iq_u16(b + 52));
    if (c < 20) {
        for (int i = 0; i < 8; i++) w[i] = (float)(iq_tq1_digit(iq_u8(b + 8 * (c & 3) + i), c >> 2) - 1) * d;
    } else if (c < 30) {
        const int e = 8 * c - 160;  // 16 k + m
        for (int i = 0; i < 8; i++) w[i] = (float)(iq_tq1_digit(iq_u8(b + 32 + (e & 15) + i), e >> 4) - 1) * d;
    } else {
        const int k0 = 2 * (c - 30);  // digits k0 and k0 + 1 of qh[0..3]
        for (int i = 0; i < 8; i++) w[i] = (float)(iq_tq1_digit(iq_u8(b + 48 + (i & 3)), k0 + (i >> 2)) - 1) * d;
    }
}

// TQ2_0 (66 bytes): qs[64] (value 128 h + 32 l + m in bits 2l of byte 32 h + m), d:
// value d * (q - 1).
RX_HD void iq_tq2_0(const uint8_t* b, int c, float* w) {
    const float d = iq_f16(iq_u16(b + 64));
    const int h = c >> 4, l = (c >> 2) & 3, m0 = 8 * (c & 3);
    for (int i = 0; i < 8; i++) w[i] = (float)((int)((iq_u8(b + 32 * h + m0 + i) >> (2 * l)) & 3) - 1) * d;
}
