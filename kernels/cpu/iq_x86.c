/* AVX2 kernels of the IQ, TQ1_0, TQ2_0 and MXFP4 formats (rx_iq.h; the portable ones are iq.c, the
 * same integer sums). Built with -mavx2 -mfma -mf16c; x86.c's fills register them.
 *
 * The grid formats: 32 values at a time, their grid points gathered as 4 (8-value) or 8
 * (4-value) integers of the table into one vector of unsigned bytes, the sign bits expanded to
 * +-1 bytes and moved onto the activations (VPSIGNB), then u8 x s8 pair sums (VPMADDUBSW)
 * and the scale of each 16 or 32 values applied with VPMADDWD; a block's int32 sums get its
 * float scales once. The 4-bit non-linear formats look their values up with VPSHUFB. */
#include <immintrin.h>
#include <string.h>

#include "rx_iq.h"
#include "../quant_tables.h"

static inline float hsum8(__m256 v) {
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

static inline float h2f(const uint8_t *p) { return _cvtsh_ss(rx_rd16(p)); }

/* 32 sign bits (bit i: value i) -> 32 bytes of -1 (set) or +1 */
static inline __m256i signs32(uint32_t x) {
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                           0x0101010101010101, 0x0000000000000000);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), shuf);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    b = _mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit);
    return _mm256_or_si256(b, _mm256_set1_epi8(1));
}

/* 4 sign bytes of the 7-bit indices in aux (ksigns_iq2xs), as 32 sign bits */
static inline uint32_t ksigns4(uint32_t aux) {
    return (uint32_t)rx_ksigns_iq2xs[aux & 127] | ((uint32_t)rx_ksigns_iq2xs[(aux >> 7) & 127] << 8) |
           ((uint32_t)rx_ksigns_iq2xs[(aux >> 14) & 127] << 16) | ((uint32_t)rx_ksigns_iq2xs[(aux >> 21) & 127] << 24);
}

static inline __m256i load32(const int8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* u8 grid values q times the activations p with signs s (+-1 bytes), pairs scaled by sc (int16
 * per pair): 8 int32 lanes */
static inline __m256i gdot(__m256i q, __m256i p, __m256i s, __m256i sc) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(q, _mm256_sign_epi8(p, s)), sc);
}

/* scale a for values 0..15 and b for 16..31 */
static inline __m256i scale2(int a, int b) {
    return _mm256_set_m128i(_mm_set1_epi16((short)b), _mm_set1_epi16((short)a));
}

static float dot_iq2_xxs(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w; const rx_a256 *y = a;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / 256; b++, x += RX_IQ2_XXS_B) {
        __m256i sum = _mm256_setzero_si256();
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *q = x + 2 + 8 * ib;
            const uint32_t aux = rx_rd32(q + 4);
            const __m256i g = _mm256_set_epi64x((long long)rx_iq2xxs_grid[q[3]], (long long)rx_iq2xxs_grid[q[2]],
                                                (long long)rx_iq2xxs_grid[q[1]], (long long)rx_iq2xxs_grid[q[0]]);
            const int ls = (int)(2 * (aux >> 28) + 1);
            sum = _mm256_add_epi32(sum, gdot(g, load32(y[b].q + 32 * ib), signs32(ksigns4(aux)),
                                             _mm256_set1_epi16((short)ls)));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x) * y[b].d * 0.125f), _mm256_cvtepi32_ps(sum), acc);
    }
    return hsum8(acc);
}

static float dot_iq2_xs(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w; const rx_a256 *y = a;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / 256; b++, x += RX_IQ2_XS_B) {
        __m256i sum = _mm256_setzero_si256();
        for (int ib = 0; ib < 8; ib++) {
            uint16_t q[4];
            memcpy(q, x + 2 + 8 * ib, 8);
            const __m256i g = _mm256_set_epi64x((long long)rx_iq2xs_grid[q[3] & 511], (long long)rx_iq2xs_grid[q[2] & 511],
                                                (long long)rx_iq2xs_grid[q[1] & 511], (long long)rx_iq2xs_grid[q[0] & 511]);
            const uint32_t s = (uint32_t)rx_ksigns_iq2xs[q[0] >> 9] | ((uint32_t)rx_ksigns_iq2xs[q[1] >> 9] << 8) |
                               ((uint32_t)rx_ksigns_iq2xs[q[2] >> 9] << 16) | ((uint32_t)rx_ksigns_iq2xs[q[3] >> 9] << 24);
            const uint8_t sc = x[66 + ib];
            sum = _mm256_add_epi32(sum, gdot(g, load32(y[b].q + 32 * ib), signs32(s),
                                             scale2(2 * (sc & 15) + 1, 2 * (sc >> 4) + 1)));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x) * y[b].d * 0.125f), _mm256_cvtepi32_ps(sum), acc);
    }
    return hsum8(acc);
}

static float dot_iq2_s(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w; const rx_a256 *y = a;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / 256; b++, x += RX_IQ2_S_B) {
        const uint8_t *qs = x + 2, *signs = x + 34, *qh = x + 66, *scs = x + 74;
        __m256i sum = _mm256_setzero_si256();
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *q = qs + 4 * ib;
            const int h = qh[ib];
            const __m256i g = _mm256_set_epi64x((long long)rx_iq2s_grid[q[3] | ((h << 2) & 0x300)],
                                                (long long)rx_iq2s_grid[q[2] | ((h << 4) & 0x300)],
                                                (long long)rx_iq2s_grid[q[1] | ((h << 6) & 0x300)],
                                                (long long)rx_iq2s_grid[q[0] | ((h << 8) & 0x300)]);
            const uint8_t sc = scs[ib];
            sum = _mm256_add_epi32(sum, gdot(g, load32(y[b].q + 32 * ib), signs32(rx_rd32(signs + 4 * ib)),
                                             scale2(2 * (sc & 15) + 1, 2 * (sc >> 4) + 1)));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x) * y[b].d * 0.125f), _mm256_cvtepi32_ps(sum), acc);
    }
    return hsum8(acc);
}

static float dot_iq3_xxs(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w; const rx_a256 *y = a;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / 256; b++, x += RX_IQ3_XXS_B) {
        __m256i sum = _mm256_setzero_si256();
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *q = x + 2 + 8 * ib;
            const uint32_t aux = rx_rd32(x + 66 + 4 * ib);
            const __m256i g = _mm256_set_epi32((int)rx_iq3xxs_grid[q[7]], (int)rx_iq3xxs_grid[q[6]], (int)rx_iq3xxs_grid[q[5]],
                                               (int)rx_iq3xxs_grid[q[4]], (int)rx_iq3xxs_grid[q[3]], (int)rx_iq3xxs_grid[q[2]],
                                               (int)rx_iq3xxs_grid[q[1]], (int)rx_iq3xxs_grid[q[0]]);
            const int ls = (int)(2 * (aux >> 28) + 1);
            sum = _mm256_add_epi32(sum, gdot(g, load32(y[b].q + 32 * ib), signs32(ksigns4(aux)),
                                             _mm256_set1_epi16((short)ls)));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x) * y[b].d * 0.25f), _mm256_cvtepi32_ps(sum), acc);
    }
    return hsum8(acc);
}

static float dot_iq3_s(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w; const rx_a256 *y = a;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / 256; b++, x += RX_IQ3_S_B) {
        const uint8_t *qs = x + 2, *qh = x + 66, *signs = x + 74, *scs = x + 106;
        __m256i sum = _mm256_setzero_si256();
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *q = qs + 8 * ib;
            const int h = qh[ib];
            int32_t gi[8];
            for (int k = 0; k < 8; k++) gi[k] = (int32_t)rx_iq3s_grid[q[k] | (((h >> k) & 1) << 8)];
            const __m256i g = _mm256_loadu_si256((const __m256i *)gi);
            const int ls = 2 * ((scs[ib >> 1] >> 4 * (ib & 1)) & 15) + 1;
            sum = _mm256_add_epi32(sum, gdot(g, load32(y[b].q + 32 * ib), signs32(rx_rd32(signs + 4 * ib)),
                                             _mm256_set1_epi16((short)ls)));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x) * y[b].d), _mm256_cvtepi32_ps(sum), acc);
    }
    return hsum8(acc);
}

/* IQ1: grid values -1, 0, 1 are signs: VPSIGNB puts g * p in each byte; pairs then summed */
static inline __m256i iq1_grid(int i0, int i1, int i2, int i3) {
    return _mm256_set_epi64x((long long)rx_iq1s_grid[i3], (long long)rx_iq1s_grid[i2], (long long)rx_iq1s_grid[i1],
                             (long long)rx_iq1s_grid[i0]);
}

static float dot_iq1_s(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w; const rx_a256 *y = a;
    const __m256i ones = _mm256_set1_epi8(1);
    float acc = 0.f;
    for (int64_t b = 0; b < n / 256; b++, x += RX_IQ1_S_B) {
        const uint8_t *qs = x + 2;
        __m256i sum = _mm256_setzero_si256();
        int sumd = 0;
        for (int ib = 0; ib < 8; ib++) {
            const uint16_t h = rx_rd16(x + 34 + 2 * ib);
            const uint8_t *q = qs + 4 * ib;
            const __m256i g = iq1_grid(q[0] | ((h << 8) & 0x700), q[1] | ((h << 5) & 0x700), q[2] | ((h << 2) & 0x700),
                                       q[3] | ((h >> 1) & 0x700));
            const int ls = 2 * ((h >> 12) & 7) + 1;
            const __m256i prod = _mm256_sign_epi8(load32(y[b].q + 32 * ib), g);
            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(ones, prod), _mm256_set1_epi16((short)ls)));
            const int sq = y[b].bsum[2 * ib] + y[b].bsum[2 * ib + 1];
            sumd += ls * ((h & 0x8000) ? -sq : sq);
        }
        __m128i s = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s = _mm_hadd_epi32(s, s);
        s = _mm_hadd_epi32(s, s);
        acc += h2f(x) * y[b].d * ((float)_mm_cvtsi128_si32(s) + 0.125f * (float)sumd);
    }
    return acc;
}

/* four int16 copies of v */
static inline long long rep16(int v) { return (long long)((uint64_t)(uint16_t)v * 0x0001000100010001ULL); }

static float dot_iq1_m(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w; const rx_a256 *y = a;
    const __m256i ones = _mm256_set1_epi8(1);
    float acc = 0.f;
    for (int64_t b = 0; b < n / 256; b++, x += RX_IQ1_M_B) {
        const uint8_t *qs = x, *qh = x + 32, *sc = x + 48;
        __m256i sum = _mm256_setzero_si256(), sumd = _mm256_setzero_si256();
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *q = qs + 4 * ib;
            const int h0 = qh[2 * ib], h1 = qh[2 * ib + 1];
            const __m256i g = iq1_grid(q[0] | ((h0 << 8) & 0x700), q[1] | ((h0 << 4) & 0x700), q[2] | ((h1 << 8) & 0x700),
                                       q[3] | ((h1 << 4) & 0x700));
            const uint16_t s16 = rx_rd16(sc + 2 * (ib >> 1));
            const int sh = 6 * (ib & 1);
            const int l1 = 2 * ((s16 >> sh) & 7) + 1, l2 = 2 * ((s16 >> (sh + 3)) & 7) + 1;
            const __m256i p = load32(y[b].q + 32 * ib);
            /* the delta's sign per 8 values, times their scale: int16 per pair (4 pairs a group) */
            const __m256i ds = _mm256_set_epi64x(rep16((h1 & 0x80) ? -l2 : l2), rep16((h1 & 0x08) ? -l2 : l2),
                                                 rep16((h0 & 0x80) ? -l1 : l1), rep16((h0 & 0x08) ? -l1 : l1));
            const __m256i sc2 = scale2(l1, l2);
            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(ones, _mm256_sign_epi8(p, g)), sc2));
            sumd = _mm256_add_epi32(sumd, _mm256_madd_epi16(_mm256_maddubs_epi16(ones, p), ds));
        }
        __m256i t = _mm256_hadd_epi32(sum, sumd); /* lanes: sum pairs then sumd pairs, per 128 half */
        __m128i s = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
        s = _mm_hadd_epi32(s, s); /* [sum, sumd, sum, sumd] */
        acc += rx_iq1m_d(sc) * y[b].d * ((float)_mm_cvtsi128_si32(s) + 0.125f * (float)_mm_extract_epi32(s, 1));
    }
    return acc;
}

/* 16 bytes of nibbles -> 32 table values: the 16 low nibbles', then the 16 high ones' */
static inline __m256i lookup32(const uint8_t *p, __m256i tbl) {
    __m128i t = _mm_loadu_si128((const __m128i *)p);
    __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(15));
    return _mm256_shuffle_epi8(tbl, v);
}

/* s8 x s8 pair sums scaled by sc (int16 per pair) */
static inline __m256i sdot(__m256i v, __m256i p, __m256i sc) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(p, v)), sc);
}

static inline __m256i table16(const int8_t *t) {
    __m128i v = _mm_loadu_si128((const __m128i *)t);
    return _mm256_set_m128i(v, v);
}

static float dot_iq4_nl(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w; const rx_a32 *y = a;
    const __m256i tbl = table16(rx_kvalues_iq4nl), one = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / 32; b++, x += RX_IQ4_NL_B) {
        __m256i s = sdot(lookup32(x + 2, tbl), load32(y[b].q), one);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x) * y[b].d), _mm256_cvtepi32_ps(s), acc);
    }
    return hsum8(acc);
}

static float dot_mxfp4(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w; const rx_a32 *y = a;
    const __m256i tbl = table16(rx_kvalues_mxfp4), one = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / 32; b++, x += RX_MXFP4_B) {
        __m256i s = sdot(lookup32(x + 1, tbl), load32(y[b].q), one);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(rx_e8m0_half(x[0]) * y[b].d), _mm256_cvtepi32_ps(s), acc);
    }
    return hsum8(acc);
}

static float dot_iq4_xs(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w; const rx_a256 *y = a;
    const __m256i tbl = table16(rx_kvalues_iq4nl);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / 256; b++, x += RX_IQ4_XS_B) {
        const uint16_t sh = rx_rd16(x + 2);
        __m256i sum = _mm256_setzero_si256();
        for (int ib = 0; ib < 8; ib++) {
            const int ls = (((x[4 + (ib >> 1)] >> 4 * (ib & 1)) & 15) | (((sh >> 2 * ib) & 3) << 4)) - 32;
            sum = _mm256_add_epi32(sum, sdot(lookup32(x + 8 + 16 * ib, tbl), load32(y[b].q + 32 * ib),
                                             _mm256_set1_epi16((short)ls)));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x) * y[b].d), _mm256_cvtepi32_ps(sum), acc);
    }
    return hsum8(acc);
}

static float dot_tq2_0(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w; const rx_a256 *y = a;
    const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / 256; b++, x += RX_TQ2_0_B) {
        __m256i sum = _mm256_setzero_si256();
        for (int c = 0; c < 2; c++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x + 32 * c));
            for (int l = 0; l < 4; l++) {
                const __m256i t = _mm256_and_si256(_mm256_srli_epi16(q, 2 * l), m3);
                sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(t, load32(y[b].q + 128 * c + 32 * l)), one));
            }
        }
        /* the value is t - 1: subtract the activations' sum (its group sums) */
        const __m256i bs = _mm256_loadu_si256((const __m256i *)y[b].bsum);
        sum = _mm256_sub_epi32(sum, _mm256_madd_epi16(bs, one));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x + 64) * y[b].d), _mm256_cvtepi32_ps(sum), acc);
    }
    return hsum8(acc);
}

/* TQ1_0: digit k of each byte of v (5 base-3 digits a byte: ((q * 3^k mod 256) * 3) >> 8),
 * 16-bit lanes, order kept (unpack and pack work per 128-bit lane alike) */
static inline __m256i tq1_digits(__m256i v, int pow3) {
    const __m256i z = _mm256_setzero_si256(), m = _mm256_set1_epi16(255), p = _mm256_set1_epi16((short)pow3);
    const __m256i three = _mm256_set1_epi16(3);
    __m256i lo = _mm256_and_si256(_mm256_mullo_epi16(_mm256_unpacklo_epi8(v, z), p), m);
    __m256i hi = _mm256_and_si256(_mm256_mullo_epi16(_mm256_unpackhi_epi8(v, z), p), m);
    lo = _mm256_srli_epi16(_mm256_mullo_epi16(lo, three), 8);
    hi = _mm256_srli_epi16(_mm256_mullo_epi16(hi, three), 8);
    return _mm256_packus_epi16(lo, hi);
}

static float dot_tq1_0(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w; const rx_a256 *y = a;
    const __m256i one = _mm256_set1_epi16(1);
    static const int pow3[5] = {1, 3, 9, 27, 81};
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / 256; b++, x += RX_TQ1_0_B) {
        const int8_t *p = y[b].q;
        __m256i sum = _mm256_setzero_si256();
        /* bytes 0..31: digit k is values 32 k + m */
        const __m256i q0 = _mm256_loadu_si256((const __m256i *)x);
        for (int k = 0; k < 5; k++)
            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(tq1_digits(q0, pow3[k]), load32(p + 32 * k)), one));
        /* bytes 32..47: digit k is values 160 + 16 k + m; digits (0, 1) and (2, 3) a vector each */
        const __m128i q1 = _mm_loadu_si128((const __m128i *)(x + 32));
        for (int k = 0; k < 4; k += 2) {
            const __m256i d = _mm256_set_m128i(_mm256_castsi256_si128(tq1_digits(_mm256_castsi128_si256(q1), pow3[k + 1])),
                                               _mm256_castsi256_si128(tq1_digits(_mm256_castsi128_si256(q1), pow3[k])));
            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(d, load32(p + 160 + 16 * k)), one));
        }
        /* values 224..255: digit 4 of bytes 32..47, then qh's 4 digits of 4 bytes (240 + 4 k + j) */
        uint8_t t[16];
        for (int k = 0; k < 4; k++)
            for (int j = 0; j < 4; j++) t[4 * k + j] = (uint8_t)(((uint16_t)(uint8_t)(x[48 + j] * pow3[k]) * 3) >> 8);
        const __m256i d = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)t),
                                           _mm256_castsi256_si128(tq1_digits(_mm256_castsi128_si256(q1), pow3[4])));
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(d, load32(p + 224)), one));
        /* the value is digit - 1: subtract the activations' sum */
        sum = _mm256_sub_epi32(sum, _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y[b].bsum), one));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x + 52) * y[b].d), _mm256_cvtepi32_ps(sum), acc);
    }
    return hsum8(acc);
}

void rx_fill_iq_avx2(rx_isa *t) {
    t->dot[RX_IQ2_XXS] = dot_iq2_xxs;
    t->dot[RX_IQ2_XS] = dot_iq2_xs;
    t->dot[RX_IQ2_S] = dot_iq2_s;
    t->dot[RX_IQ3_XXS] = dot_iq3_xxs;
    t->dot[RX_IQ3_S] = dot_iq3_s;
    t->dot[RX_IQ1_S] = dot_iq1_s;
    t->dot[RX_IQ1_M] = dot_iq1_m;
    t->dot[RX_IQ4_NL] = dot_iq4_nl;
    t->dot[RX_IQ4_XS] = dot_iq4_xs;
    t->dot[RX_TQ1_0] = dot_tq1_0;
    t->dot[RX_TQ2_0] = dot_tq2_0;
    t->dot[RX_MXFP4] = dot_mxfp4;
}
