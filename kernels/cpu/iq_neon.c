/* aarch64 (base Advanced SIMD) kernels of the IQ, TQ2_0 and MXFP4 formats (rx_iq.h), registered
 * by neon.c's fills. Each returns exactly what iq.c's portable function returns, bit for bit,
 * as neon.c's do for generic.c: the integer sums of a block are exact in any order, and the
 * block's float expression is iq.c's, term for term (tests/test_cpu_ops.py's every-code-path
 * test under qemu-aarch64, scripts/aarch64-check). The grid points are gathered into vectors,
 * the sign bits become masks that negate the grid values ((g ^ m) - m), and 16 int8 products
 * are summed in int16 pairs (at most 2 x 127 x 127) then int32 lanes. TQ1_0 stays iq.c's. */
#include <arm_neon.h>
#include <string.h>

#include "rx_iq.h"
#include "../quant_tables.h"

/* sum of the 16 int8 products a * b (|a * b| <= 127 * 127) */
static inline int32_t dot16(int8x16_t a, int8x16_t b) {
    int16x8_t p = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    p = vmlal_s8(p, vget_high_s8(a), vget_high_s8(b));
    return vaddvq_s32(vpaddlq_s16(p));
}

/* 16 grid bytes (two 8-byte grid points) with the values negated where the sign bits s0 (first
 * 8) / s1 (next 8) are set */
static inline int8x16_t signed16(uint64_t g0, uint64_t g1, uint8_t s0, uint8_t s1) {
    const uint8x16_t bit = vcombine_u8(vcreate_u8(0x8040201008040201ull), vcreate_u8(0x8040201008040201ull));
    const int8x16_t g = vreinterpretq_s8_u8(vcombine_u8(vcreate_u8(g0), vcreate_u8(g1)));
    const int8x16_t m = vreinterpretq_s8_u8(vtstq_u8(vcombine_u8(vdup_n_u8(s0), vdup_n_u8(s1)), bit));
    return vsubq_s8(veorq_s8(g, m), m);
}

static inline const int8_t *aq(const rx_a256 *y, int i) { return y->q + i; }

static float dot_iq2_xxs(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w; const rx_a256 *y = a;
    float acc = 0.f;
    for (int64_t b = 0; b < n / 256; b++, x += RX_IQ2_XXS_B) {
        int sumi = 0;
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *q = x + 2 + 8 * ib;
            const uint32_t aux = rx_rd32(q + 4);
            const int s = dot16(signed16(rx_iq2xxs_grid[q[0]], rx_iq2xxs_grid[q[1]], rx_ksigns_iq2xs[aux & 127],
                                         rx_ksigns_iq2xs[(aux >> 7) & 127]), vld1q_s8(aq(&y[b], 32 * ib))) +
                          dot16(signed16(rx_iq2xxs_grid[q[2]], rx_iq2xxs_grid[q[3]], rx_ksigns_iq2xs[(aux >> 14) & 127],
                                         rx_ksigns_iq2xs[(aux >> 21) & 127]), vld1q_s8(aq(&y[b], 32 * ib + 16)));
            sumi += (int)(2 * (aux >> 28) + 1) * s;
        }
        acc += rx_h2f(rx_rd16(x)) * y[b].d * 0.125f * (float)sumi;
    }
    return acc;
}

static float dot_iq2_xs(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w; const rx_a256 *y = a;
    float acc = 0.f;
    for (int64_t b = 0; b < n / 256; b++, x += RX_IQ2_XS_B) {
        int sumi = 0;
        for (int ib = 0; ib < 8; ib++) {
            uint16_t q[4];
            memcpy(q, x + 2 + 8 * ib, 8);
            const int s0 = dot16(signed16(rx_iq2xs_grid[q[0] & 511], rx_iq2xs_grid[q[1] & 511], rx_ksigns_iq2xs[q[0] >> 9],
                                          rx_ksigns_iq2xs[q[1] >> 9]), vld1q_s8(aq(&y[b], 32 * ib)));
            const int s1 = dot16(signed16(rx_iq2xs_grid[q[2] & 511], rx_iq2xs_grid[q[3] & 511], rx_ksigns_iq2xs[q[2] >> 9],
                                          rx_ksigns_iq2xs[q[3] >> 9]), vld1q_s8(aq(&y[b], 32 * ib + 16)));
            const uint8_t sc = x[66 + ib];
            sumi += (2 * (sc & 15) + 1) * s0 + (2 * (sc >> 4) + 1) * s1;
        }
        acc += rx_h2f(rx_rd16(x)) * y[b].d * 0.125f * (float)sumi;
    }
    return acc;
}

static float dot_iq2_s(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w; const rx_a256 *y = a;
    float acc = 0.f;
    for (int64_t b = 0; b < n / 256; b++, x += RX_IQ2_S_B) {
        const uint8_t *qs = x + 2, *signs = x + 34, *qh = x + 66, *scs = x + 74;
        int sumi = 0;
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *q = qs + 4 * ib, *sg = signs + 4 * ib;
            const int h = qh[ib];
            const int s0 = dot16(signed16(rx_iq2s_grid[q[0] | ((h << 8) & 0x300)], rx_iq2s_grid[q[1] | ((h << 6) & 0x300)],
                                          sg[0], sg[1]), vld1q_s8(aq(&y[b], 32 * ib)));
            const int s1 = dot16(signed16(rx_iq2s_grid[q[2] | ((h << 4) & 0x300)], rx_iq2s_grid[q[3] | ((h << 2) & 0x300)],
                                          sg[2], sg[3]), vld1q_s8(aq(&y[b], 32 * ib + 16)));
            sumi += (2 * (scs[ib] & 15) + 1) * s0 + (2 * (scs[ib] >> 4) + 1) * s1;
        }
        acc += rx_h2f(rx_rd16(x)) * y[b].d * 0.125f * (float)sumi;
    }
    return acc;
}

/* 8 bytes of two 4-byte grid points */
static inline uint64_t grid2(const uint32_t *grid, int i0, int i1) {
    return (uint64_t)grid[i0] | ((uint64_t)grid[i1] << 32);
}

static float dot_iq3_xxs(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w; const rx_a256 *y = a;
    float acc = 0.f;
    for (int64_t b = 0; b < n / 256; b++, x += RX_IQ3_XXS_B) {
        int sumi = 0;
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *q = x + 2 + 8 * ib;
            const uint32_t aux = rx_rd32(x + 66 + 4 * ib);
            const int s = dot16(signed16(grid2(rx_iq3xxs_grid, q[0], q[1]), grid2(rx_iq3xxs_grid, q[2], q[3]),
                                         rx_ksigns_iq2xs[aux & 127], rx_ksigns_iq2xs[(aux >> 7) & 127]),
                                vld1q_s8(aq(&y[b], 32 * ib))) +
                          dot16(signed16(grid2(rx_iq3xxs_grid, q[4], q[5]), grid2(rx_iq3xxs_grid, q[6], q[7]),
                                         rx_ksigns_iq2xs[(aux >> 14) & 127], rx_ksigns_iq2xs[(aux >> 21) & 127]),
                                vld1q_s8(aq(&y[b], 32 * ib + 16)));
            sumi += (int)(2 * (aux >> 28) + 1) * s;
        }
        acc += rx_h2f(rx_rd16(x)) * y[b].d * 0.25f * (float)sumi;
    }
    return acc;
}

static float dot_iq3_s(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w; const rx_a256 *y = a;
    float acc = 0.f;
    for (int64_t b = 0; b < n / 256; b++, x += RX_IQ3_S_B) {
        const uint8_t *qs = x + 2, *qh = x + 66, *signs = x + 74, *sc = x + 106;
        int sumi = 0;
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *q = qs + 8 * ib, *sg = signs + 4 * ib;
            const int h = qh[ib];
            int i[8];
            for (int k = 0; k < 8; k++) i[k] = q[k] | (((h >> k) & 1) << 8);
            const int s = dot16(signed16(grid2(rx_iq3s_grid, i[0], i[1]), grid2(rx_iq3s_grid, i[2], i[3]), sg[0], sg[1]),
                                vld1q_s8(aq(&y[b], 32 * ib))) +
                          dot16(signed16(grid2(rx_iq3s_grid, i[4], i[5]), grid2(rx_iq3s_grid, i[6], i[7]), sg[2], sg[3]),
                                vld1q_s8(aq(&y[b], 32 * ib + 16)));
            sumi += (2 * ((sc[ib >> 1] >> 4 * (ib & 1)) & 15) + 1) * s;
        }
        acc += rx_h2f(rx_rd16(x)) * y[b].d * (float)sumi;
    }
    return acc;
}

/* 16 IQ1 grid values (-1, 0, 1) of two grid points */
static inline int8x16_t iq1_16(int i0, int i1) {
    return vreinterpretq_s8_u8(vcombine_u8(vcreate_u8(rx_iq1s_grid[i0]), vcreate_u8(rx_iq1s_grid[i1])));
}

static float dot_iq1_s(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w; const rx_a256 *y = a;
    float acc = 0.f;
    for (int64_t b = 0; b < n / 256; b++, x += RX_IQ1_S_B) {
        const uint8_t *qs = x + 2;
        int sumi = 0, sumd = 0;
        for (int ib = 0; ib < 8; ib++) {
            const uint16_t h = rx_rd16(x + 34 + 2 * ib);
            const int ls = 2 * ((h >> 12) & 7) + 1;
            const uint8_t *q = qs + 4 * ib;
            const int s = dot16(iq1_16(q[0] | ((h << 8) & 0x700), q[1] | ((h << 5) & 0x700)), vld1q_s8(aq(&y[b], 32 * ib))) +
                          dot16(iq1_16(q[2] | ((h << 2) & 0x700), q[3] | ((h >> 1) & 0x700)), vld1q_s8(aq(&y[b], 32 * ib + 16)));
            const int sq = y[b].bsum[2 * ib] + y[b].bsum[2 * ib + 1];
            sumi += ls * s;
            sumd += ls * ((h & 0x8000) ? -sq : sq);
        }
        acc += rx_h2f(rx_rd16(x)) * y[b].d * ((float)sumi + 0.125f * (float)sumd);
    }
    return acc;
}

static float dot_iq1_m(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w; const rx_a256 *y = a;
    float acc = 0.f;
    for (int64_t b = 0; b < n / 256; b++, x += RX_IQ1_M_B) {
        const uint8_t *qs = x, *qh = x + 32, *sc = x + 48;
        int sumi = 0, sumd = 0;
        for (int ib = 0; ib < 8; ib++) {
            const uint16_t s16 = rx_rd16(sc + 2 * (ib >> 1));
            const int sh = 6 * (ib & 1);
            const int l1 = 2 * ((s16 >> sh) & 7) + 1, l2 = 2 * ((s16 >> (sh + 3)) & 7) + 1;
            const uint8_t *q = qs + 4 * ib;
            const int h0 = qh[2 * ib], h1 = qh[2 * ib + 1];
            const int8x16_t p0 = vld1q_s8(aq(&y[b], 32 * ib)), p1 = vld1q_s8(aq(&y[b], 32 * ib + 16));
            sumi += l1 * dot16(iq1_16(q[0] | ((h0 << 8) & 0x700), q[1] | ((h0 << 4) & 0x700)), p0) +
                    l2 * dot16(iq1_16(q[2] | ((h1 << 8) & 0x700), q[3] | ((h1 << 4) & 0x700)), p1);
            /* the activations' sums per 8 values, signed by each group's delta */
            const int sq[4] = {vaddlv_s8(vget_low_s8(p0)), vaddlv_s8(vget_high_s8(p0)), vaddlv_s8(vget_low_s8(p1)),
                               vaddlv_s8(vget_high_s8(p1))};
            sumd += l1 * (((h0 & 0x08) ? -sq[0] : sq[0]) + ((h0 & 0x80) ? -sq[1] : sq[1])) +
                    l2 * (((h1 & 0x08) ? -sq[2] : sq[2]) + ((h1 & 0x80) ? -sq[3] : sq[3]));
        }
        acc += rx_iq1m_d(sc) * y[b].d * ((float)sumi + 0.125f * (float)sumd);
    }
    return acc;
}

/* 16 bytes of nibbles -> values 0..15 (low nibbles) and 16..31 (high ones) through a 16-entry table */
static inline void lookup32(const uint8_t *p, int8x16_t tbl, int8x16_t *lo, int8x16_t *hi) {
    const uint8x16_t v = vld1q_u8(p);
    *lo = vqtbl1q_s8(tbl, vandq_u8(v, vdupq_n_u8(15)));
    *hi = vqtbl1q_s8(tbl, vshrq_n_u8(v, 4));
}

static float dot_iq4_nl(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w; const rx_a32 *y = a;
    const int8x16_t tbl = vld1q_s8(rx_kvalues_iq4nl);
    float acc = 0.f;
    for (int64_t b = 0; b < n / 32; b++, x += RX_IQ4_NL_B) {
        int8x16_t lo, hi;
        lookup32(x + 2, tbl, &lo, &hi);
        const int s = dot16(lo, vld1q_s8(y[b].q)) + dot16(hi, vld1q_s8(y[b].q + 16));
        acc += rx_h2f(rx_rd16(x)) * y[b].d * (float)s;
    }
    return acc;
}

static float dot_mxfp4(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w; const rx_a32 *y = a;
    const int8x16_t tbl = vld1q_s8(rx_kvalues_mxfp4);
    float acc = 0.f;
    for (int64_t b = 0; b < n / 32; b++, x += RX_MXFP4_B) {
        int8x16_t lo, hi;
        lookup32(x + 1, tbl, &lo, &hi);
        const int s = dot16(lo, vld1q_s8(y[b].q)) + dot16(hi, vld1q_s8(y[b].q + 16));
        acc += rx_e8m0_half(x[0]) * y[b].d * (float)s;
    }
    return acc;
}

static float dot_iq4_xs(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w; const rx_a256 *y = a;
    const int8x16_t tbl = vld1q_s8(rx_kvalues_iq4nl);
    float acc = 0.f;
    for (int64_t b = 0; b < n / 256; b++, x += RX_IQ4_XS_B) {
        const uint16_t sh = rx_rd16(x + 2);
        int sumi = 0;
        for (int ib = 0; ib < 8; ib++) {
            const int ls = (((x[4 + (ib >> 1)] >> 4 * (ib & 1)) & 15) | (((sh >> 2 * ib) & 3) << 4)) - 32;
            int8x16_t lo, hi;
            lookup32(x + 8 + 16 * ib, tbl, &lo, &hi);
            sumi += ls * (dot16(lo, vld1q_s8(aq(&y[b], 32 * ib))) + dot16(hi, vld1q_s8(aq(&y[b], 32 * ib + 16))));
        }
        acc += rx_h2f(rx_rd16(x)) * y[b].d * (float)sumi;
    }
    return acc;
}

static float dot_tq2_0(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w; const rx_a256 *y = a;
    float acc = 0.f;
    for (int64_t b = 0; b < n / 256; b++, x += RX_TQ2_0_B) {
        int s = 0, sq = 0;
        for (int c = 0; c < 2; c++) {
            const uint8x16_t q0 = vld1q_u8(x + 32 * c), q1 = vld1q_u8(x + 32 * c + 16);
            for (int l = 0; l < 4; l++) {
                const int8_t *p = aq(&y[b], 128 * c + 32 * l);
                const int8x16_t t0 = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(q0, vdupq_n_s8((int8_t)(-2 * l))), vdupq_n_u8(3)));
                const int8x16_t t1 = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(q1, vdupq_n_s8((int8_t)(-2 * l))), vdupq_n_u8(3)));
                s += dot16(t0, vld1q_s8(p)) + dot16(t1, vld1q_s8(p + 16));
            }
        }
        for (int g = 0; g < 16; g++) sq += y[b].bsum[g];
        acc += rx_h2f(rx_rd16(x + 64)) * y[b].d * (float)(s - sq);
    }
    return acc;
}

void rx_fill_iq_neon(rx_isa *t) {
    t->dot[RX_IQ2_XXS] = dot_iq2_xxs;
    t->dot[RX_IQ2_XS] = dot_iq2_xs;
    t->dot[RX_IQ2_S] = dot_iq2_s;
    t->dot[RX_IQ3_XXS] = dot_iq3_xxs;
    t->dot[RX_IQ3_S] = dot_iq3_s;
    t->dot[RX_IQ1_S] = dot_iq1_s;
    t->dot[RX_IQ1_M] = dot_iq1_m;
    t->dot[RX_IQ4_NL] = dot_iq4_nl;
    t->dot[RX_IQ4_XS] = dot_iq4_xs;
    t->dot[RX_TQ2_0] = dot_tq2_0;
    t->dot[RX_MXFP4] = dot_mxfp4;
}
