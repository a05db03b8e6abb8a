/* Portable C kernels of the IQ, TQ and MXFP4 formats (rx_iq.h): dot products of the stored
 * blocks with int8 activations, and rows dequantized. Each dot product sums integer products
 * of the grid / table values with the activation's int8 values per scale group, then applies
 * the block's float scales once: the sum equals the dequantized weights (quants.py) times the
 * rounded activations up to float32 rounding (tests/test_cpu_ops.py checks it). */
#include <string.h>

#include "rx_iq.h"
#include "../quant_tables.h"

int rx_iq_act_format(int type) {
    switch (type) {
    case RX_IQ4_NL: case RX_MXFP4: return RX_ACT_A32;
    case RX_IQ2_XXS: case RX_IQ2_XS: case RX_IQ2_S: case RX_IQ3_XXS: case RX_IQ3_S: case RX_IQ1_S:
    case RX_IQ1_M: case RX_IQ4_XS: case RX_TQ1_0: case RX_TQ2_0: return RX_ACT_A256;
    default: return 0;
    }
}

/* sum_j g[j] * (bit j of signs ? -p[j] : p[j]) over n values (grid bytes are unsigned) */
static int8_t g_signs[256][8]; /* a byte's 8 sign bits as +-1 (rx_fill_iq fills it) */

static inline int signed_dot(const uint8_t *g, uint8_t signs, const int8_t *p, int n) {
    const int8_t *sv = g_signs[signs];
    int s = 0;
    for (int j = 0; j < n; j++) s += g[j] * sv[j] * p[j];
    return s;
}

static float dot_iq2_xxs(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w; const rx_a256 *y = a;
    float acc = 0.f;
    for (int64_t b = 0; b < n / 256; b++, x += RX_IQ2_XXS_B) {
        const uint8_t *qs = x + 2;
        int sumi = 0;
        for (int ib = 0; ib < 8; ib++) {
            const uint32_t idx = rx_rd32(qs + 8 * ib), aux = rx_rd32(qs + 8 * ib + 4);
            int s = 0;
            for (int l = 0; l < 4; l++) {
                const uint8_t *g = (const uint8_t *)(rx_iq2xxs_grid + ((idx >> 8 * l) & 255));
                s += signed_dot(g, rx_ksigns_iq2xs[(aux >> 7 * l) & 127], y[b].q + 32 * ib + 8 * l, 8);
            }
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
        const uint8_t *qs = x + 2, *sc = x + 66;
        int sumi = 0;
        for (int ib = 0; ib < 8; ib++) {
            int s[2] = {0, 0};
            for (int l = 0; l < 4; l++) {
                const uint16_t q = rx_rd16(qs + 2 * (4 * ib + l));
                const uint8_t *g = (const uint8_t *)(rx_iq2xs_grid + (q & 511));
                s[l >> 1] += signed_dot(g, rx_ksigns_iq2xs[q >> 9], y[b].q + 32 * ib + 8 * l, 8);
            }
            sumi += (2 * (sc[ib] & 15) + 1) * s[0] + (2 * (sc[ib] >> 4) + 1) * s[1];
        }
        acc += rx_h2f(rx_rd16(x)) * y[b].d * 0.125f * (float)sumi;
    }
    return acc;
}

static float dot_iq2_s(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w; const rx_a256 *y = a;
    float acc = 0.f;
    for (int64_t b = 0; b < n / 256; b++, x += RX_IQ2_S_B) {
        const uint8_t *qs = x + 2, *signs = x + 34, *qh = x + 66, *sc = x + 74;
        int sumi = 0;
        for (int ib = 0; ib < 8; ib++) {
            int s[2] = {0, 0};
            for (int l = 0; l < 4; l++) {
                const int idx = qs[4 * ib + l] | ((qh[ib] << (8 - 2 * l)) & 0x300);
                const uint8_t *g = (const uint8_t *)(rx_iq2s_grid + idx);
                s[l >> 1] += signed_dot(g, signs[4 * ib + l], y[b].q + 32 * ib + 8 * l, 8);
            }
            sumi += (2 * (sc[ib] & 15) + 1) * s[0] + (2 * (sc[ib] >> 4) + 1) * s[1];
        }
        acc += rx_h2f(rx_rd16(x)) * y[b].d * 0.125f * (float)sumi;
    }
    return acc;
}

static float dot_iq3_xxs(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w; const rx_a256 *y = a;
    float acc = 0.f;
    for (int64_t b = 0; b < n / 256; b++, x += RX_IQ3_XXS_B) {
        const uint8_t *qs = x + 2, *sas = x + 66;
        int sumi = 0;
        for (int ib = 0; ib < 8; ib++) {
            const uint32_t aux = rx_rd32(sas + 4 * ib);
            int s = 0;
            for (int l = 0; l < 4; l++) {
                const uint8_t signs = rx_ksigns_iq2xs[(aux >> 7 * l) & 127];
                const int8_t *p = y[b].q + 32 * ib + 8 * l;
                const uint8_t *g1 = (const uint8_t *)(rx_iq3xxs_grid + qs[8 * ib + 2 * l]);
                const uint8_t *g2 = (const uint8_t *)(rx_iq3xxs_grid + qs[8 * ib + 2 * l + 1]);
                s += signed_dot(g1, signs, p, 4) + signed_dot(g2, (uint8_t)(signs >> 4), p + 4, 4);
            }
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
            int s = 0;
            for (int l = 0; l < 4; l++) {
                const int i1 = qs[8 * ib + 2 * l] | ((qh[ib] << (8 - 2 * l)) & 256);
                const int i2 = qs[8 * ib + 2 * l + 1] | ((qh[ib] << (7 - 2 * l)) & 256);
                const int8_t *p = y[b].q + 32 * ib + 8 * l;
                const uint8_t sg = signs[4 * ib + l];
                s += signed_dot((const uint8_t *)(rx_iq3s_grid + i1), sg, p, 4) +
                     signed_dot((const uint8_t *)(rx_iq3s_grid + i2), (uint8_t)(sg >> 4), p + 4, 4);
            }
            sumi += (2 * ((sc[ib >> 1] >> 4 * (ib & 1)) & 15) + 1) * s;
        }
        acc += rx_h2f(rx_rd16(x)) * y[b].d * (float)sumi;
    }
    return acc;
}

/* sum_j grid[j] * p[j] for an IQ1 grid point (values -1, 0, 1) */
static inline int iq1_dot(int idx, const int8_t *p) {
    const int8_t *g = (const int8_t *)(rx_iq1s_grid + idx);
    int s = 0;
    for (int j = 0; j < 8; j++) s += g[j] * p[j];
    return s;
}

static float dot_iq1_s(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w; const rx_a256 *y = a;
    float acc = 0.f;
    for (int64_t b = 0; b < n / 256; b++, x += RX_IQ1_S_B) {
        const uint8_t *qs = x + 2;
        int sumi = 0, sumd = 0; /* grid products; activation sums signed by the delta */
        for (int ib = 0; ib < 8; ib++) {
            const uint16_t h = rx_rd16(x + 34 + 2 * ib);
            const int ls = 2 * ((h >> 12) & 7) + 1;
            int s = 0;
            for (int l = 0; l < 4; l++) s += iq1_dot(qs[4 * ib + l] | (((h >> 3 * l) & 7) << 8), y[b].q + 32 * ib + 8 * l);
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
            const int ls[2] = {2 * ((s16 >> sh) & 7) + 1, 2 * ((s16 >> (sh + 3)) & 7) + 1};
            for (int l = 0; l < 4; l++) {
                const int nib = (qh[2 * ib + (l >> 1)] >> 4 * (l & 1)) & 15;
                const int8_t *p = y[b].q + 32 * ib + 8 * l;
                int sq = 0;
                for (int j = 0; j < 8; j++) sq += p[j];
                sumi += ls[l >> 1] * iq1_dot(qs[4 * ib + l] | ((nib & 7) << 8), p);
                sumd += ls[l >> 1] * ((nib & 8) ? -sq : sq);
            }
        }
        acc += rx_iq1m_d(sc) * y[b].d * ((float)sumi + 0.125f * (float)sumd);
    }
    return acc;
}

static float dot_iq4_nl(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w; const rx_a32 *y = a;
    float acc = 0.f;
    for (int64_t b = 0; b < n / 32; b++, x += RX_IQ4_NL_B) {
        const uint8_t *qs = x + 2;
        int s = 0;
        for (int j = 0; j < 16; j++)
            s += rx_kvalues_iq4nl[qs[j] & 15] * y[b].q[j] + rx_kvalues_iq4nl[qs[j] >> 4] * y[b].q[j + 16];
        acc += rx_h2f(rx_rd16(x)) * y[b].d * (float)s;
    }
    return acc;
}

static float dot_iq4_xs(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w; const rx_a256 *y = a;
    float acc = 0.f;
    for (int64_t b = 0; b < n / 256; b++, x += RX_IQ4_XS_B) {
        const uint16_t sh = rx_rd16(x + 2);
        const uint8_t *sl = x + 4, *qs = x + 8;
        int sumi = 0;
        for (int ib = 0; ib < 8; ib++) {
            const int ls = (((sl[ib >> 1] >> 4 * (ib & 1)) & 15) | (((sh >> 2 * ib) & 3) << 4)) - 32;
            const int8_t *p = y[b].q + 32 * ib;
            int s = 0;
            for (int j = 0; j < 16; j++)
                s += rx_kvalues_iq4nl[qs[16 * ib + j] & 15] * p[j] + rx_kvalues_iq4nl[qs[16 * ib + j] >> 4] * p[j + 16];
            sumi += ls * s;
        }
        acc += rx_h2f(rx_rd16(x)) * y[b].d * (float)sumi;
    }
    return acc;
}

static float dot_mxfp4(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w; const rx_a32 *y = a;
    float acc = 0.f;
    for (int64_t b = 0; b < n / 32; b++, x += RX_MXFP4_B) {
        const uint8_t *qs = x + 1;
        int s = 0;
        for (int j = 0; j < 16; j++)
            s += rx_kvalues_mxfp4[qs[j] & 15] * y[b].q[j] + rx_kvalues_mxfp4[qs[j] >> 4] * y[b].q[j + 16];
        acc += rx_e8m0_half(x[0]) * y[b].d * (float)s;
    }
    return acc;
}

/* digit k (0..4) of a TQ1_0 byte: the k-th base-3 digit of its fixed-point fraction */
static inline int tq1_digit(uint8_t q, int k) {
    static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    return ((uint16_t)(uint8_t)(q * pow3[k]) * 3) >> 8;
}

static inline int a256_sum(const rx_a256 *y) {
    int s = 0;
    for (int g = 0; g < 16; g++) s += y->bsum[g];
    return s;
}

static float dot_tq1_0(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w; const rx_a256 *y = a;
    float acc = 0.f;
    for (int64_t b = 0; b < n / 256; b++, x += RX_TQ1_0_B) {
        const int8_t *p = y[b].q;
        int s = 0; /* sum of digit * q; the value is digit - 1 */
        for (int k = 0; k < 5; k++) {
            for (int m = 0; m < 32; m++) s += tq1_digit(x[m], k) * p[32 * k + m];
            for (int m = 0; m < 16; m++) s += tq1_digit(x[32 + m], k) * p[160 + 16 * k + m];
        }
        for (int k = 0; k < 4; k++)
            for (int j = 0; j < 4; j++) s += tq1_digit(x[48 + j], k) * p[240 + 4 * k + j];
        acc += rx_h2f(rx_rd16(x + 52)) * y[b].d * (float)(s - a256_sum(&y[b]));
    }
    return acc;
}

static float dot_tq2_0(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w; const rx_a256 *y = a;
    float acc = 0.f;
    for (int64_t b = 0; b < n / 256; b++, x += RX_TQ2_0_B) {
        const int8_t *p = y[b].q;
        int s = 0;
        for (int c = 0; c < 2; c++)
            for (int l = 0; l < 4; l++)
                for (int m = 0; m < 32; m++) s += ((x[32 * c + m] >> 2 * l) & 3) * p[128 * c + 32 * l + m];
        acc += rx_h2f(rx_rd16(x + 64)) * y[b].d * (float)(s - a256_sum(&y[b]));
    }
    return acc;
}

void rx_fill_iq(rx_isa *t) {
    for (int b = 0; b < 256; b++)
        for (int j = 0; j < 8; j++) g_signs[b][j] = (int8_t)((b >> j & 1) ? -1 : 1);
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

/* ------------------------------------------------------------------ rows dequantized */
/* y[j] = db * g[j] * (bit j of signs ? -1 : 1), j < n (ggml's float expression) */
static inline void signed_row(float *y, float db, const uint8_t *g, uint8_t signs, int n) {
    for (int j = 0; j < n; j++) y[j] = db * (float)g[j] * ((signs >> j & 1) ? -1.f : 1.f);
}

int rx_iq_dequant_row(int type, const void *src, float *y, int64_t k) {
    const uint8_t *x = src;
    switch (type) {
    case RX_IQ2_XXS:
        for (int64_t b = 0; b < k / 256; b++, x += RX_IQ2_XXS_B) {
            const float d = rx_h2f(rx_rd16(x));
            for (int ib = 0; ib < 8; ib++) {
                const uint32_t idx = rx_rd32(x + 2 + 8 * ib), aux = rx_rd32(x + 6 + 8 * ib);
                const float db = d * (0.5f + (float)(aux >> 28)) * 0.25f;
                for (int l = 0; l < 4; l++, y += 8)
                    signed_row(y, db, (const uint8_t *)(rx_iq2xxs_grid + ((idx >> 8 * l) & 255)),
                               rx_ksigns_iq2xs[(aux >> 7 * l) & 127], 8);
            }
        }
        return 1;
    case RX_IQ2_XS:
        for (int64_t b = 0; b < k / 256; b++, x += RX_IQ2_XS_B) {
            const float d = rx_h2f(rx_rd16(x));
            for (int ib = 0; ib < 8; ib++) {
                const float db[2] = {d * (0.5f + (float)(x[66 + ib] & 15)) * 0.25f,
                                     d * (0.5f + (float)(x[66 + ib] >> 4)) * 0.25f};
                for (int l = 0; l < 4; l++, y += 8) {
                    const uint16_t q = rx_rd16(x + 2 + 2 * (4 * ib + l));
                    signed_row(y, db[l >> 1], (const uint8_t *)(rx_iq2xs_grid + (q & 511)), rx_ksigns_iq2xs[q >> 9], 8);
                }
            }
        }
        return 1;
    case RX_IQ2_S:
        for (int64_t b = 0; b < k / 256; b++, x += RX_IQ2_S_B) {
            const float d = rx_h2f(rx_rd16(x));
            for (int ib = 0; ib < 8; ib++) {
                const float db[2] = {d * (0.5f + (float)(x[74 + ib] & 15)) * 0.25f,
                                     d * (0.5f + (float)(x[74 + ib] >> 4)) * 0.25f};
                for (int l = 0; l < 4; l++, y += 8) {
                    const int idx = x[2 + 4 * ib + l] | ((x[66 + ib] << (8 - 2 * l)) & 0x300);
                    signed_row(y, db[l >> 1], (const uint8_t *)(rx_iq2s_grid + idx), x[34 + 4 * ib + l], 8);
                }
            }
        }
        return 1;
    case RX_IQ3_XXS:
        for (int64_t b = 0; b < k / 256; b++, x += RX_IQ3_XXS_B) {
            const float d = rx_h2f(rx_rd16(x));
            for (int ib = 0; ib < 8; ib++) {
                const uint32_t aux = rx_rd32(x + 66 + 4 * ib);
                const float db = d * (0.5f + (float)(aux >> 28)) * 0.5f;
                for (int l = 0; l < 4; l++, y += 8) {
                    const uint8_t signs = rx_ksigns_iq2xs[(aux >> 7 * l) & 127];
                    signed_row(y, db, (const uint8_t *)(rx_iq3xxs_grid + x[2 + 8 * ib + 2 * l]), signs, 4);
                    signed_row(y + 4, db, (const uint8_t *)(rx_iq3xxs_grid + x[2 + 8 * ib + 2 * l + 1]),
                               (uint8_t)(signs >> 4), 4);
                }
            }
        }
        return 1;
    case RX_IQ3_S:
        for (int64_t b = 0; b < k / 256; b++, x += RX_IQ3_S_B) {
            const float d = rx_h2f(rx_rd16(x));
            for (int ib = 0; ib < 8; ib++) {
                const float db = d * (float)(1 + 2 * ((x[106 + (ib >> 1)] >> 4 * (ib & 1)) & 15));
                const uint8_t qh = x[66 + ib];
                for (int l = 0; l < 4; l++, y += 8) {
                    const int i1 = x[2 + 8 * ib + 2 * l] | ((qh << (8 - 2 * l)) & 256);
                    const int i2 = x[2 + 8 * ib + 2 * l + 1] | ((qh << (7 - 2 * l)) & 256);
                    const uint8_t sg = x[74 + 4 * ib + l];
                    signed_row(y, db, (const uint8_t *)(rx_iq3s_grid + i1), sg, 4);
                    signed_row(y + 4, db, (const uint8_t *)(rx_iq3s_grid + i2), (uint8_t)(sg >> 4), 4);
                }
            }
        }
        return 1;
    case RX_IQ1_S:
        for (int64_t b = 0; b < k / 256; b++, x += RX_IQ1_S_B) {
            const float d = rx_h2f(rx_rd16(x));
            for (int ib = 0; ib < 8; ib++) {
                const uint16_t h = rx_rd16(x + 34 + 2 * ib);
                const float dl = d * (float)(2 * ((h >> 12) & 7) + 1);
                const float delta = (h & 0x8000) ? -0.125f : 0.125f;
                for (int l = 0; l < 4; l++, y += 8) {
                    const int8_t *g = (const int8_t *)(rx_iq1s_grid + (x[2 + 4 * ib + l] | (((h >> 3 * l) & 7) << 8)));
                    for (int j = 0; j < 8; j++) y[j] = dl * ((float)g[j] + delta);
                }
            }
        }
        return 1;
    case RX_IQ1_M:
        for (int64_t b = 0; b < k / 256; b++, x += RX_IQ1_M_B) {
            const float d = rx_iq1m_d(x + 48);
            for (int ib = 0; ib < 8; ib++) {
                const uint16_t s16 = rx_rd16(x + 48 + 2 * (ib >> 1));
                const int sh = 6 * (ib & 1);
                const float dl[2] = {d * (float)(2 * ((s16 >> sh) & 7) + 1), d * (float)(2 * ((s16 >> (sh + 3)) & 7) + 1)};
                for (int l = 0; l < 4; l++, y += 8) {
                    const int nib = (x[32 + 2 * ib + (l >> 1)] >> 4 * (l & 1)) & 15;
                    const int8_t *g = (const int8_t *)(rx_iq1s_grid + (x[4 * ib + l] | ((nib & 7) << 8)));
                    const float delta = (nib & 8) ? -0.125f : 0.125f;
                    for (int j = 0; j < 8; j++) y[j] = dl[l >> 1] * ((float)g[j] + delta);
                }
            }
        }
        return 1;
    case RX_IQ4_NL:
        for (int64_t b = 0; b < k / 32; b++, x += RX_IQ4_NL_B, y += 32) {
            const float d = rx_h2f(rx_rd16(x));
            for (int j = 0; j < 16; j++) {
                y[j] = d * (float)rx_kvalues_iq4nl[x[2 + j] & 15];
                y[j + 16] = d * (float)rx_kvalues_iq4nl[x[2 + j] >> 4];
            }
        }
        return 1;
    case RX_IQ4_XS:
        for (int64_t b = 0; b < k / 256; b++, x += RX_IQ4_XS_B) {
            const float d = rx_h2f(rx_rd16(x));
            const uint16_t sh = rx_rd16(x + 2);
            for (int ib = 0; ib < 8; ib++, y += 32) {
                const int ls = ((x[4 + (ib >> 1)] >> 4 * (ib & 1)) & 15) | (((sh >> 2 * ib) & 3) << 4);
                const float dl = d * (float)(ls - 32);
                for (int j = 0; j < 16; j++) {
                    y[j] = dl * (float)rx_kvalues_iq4nl[x[8 + 16 * ib + j] & 15];
                    y[j + 16] = dl * (float)rx_kvalues_iq4nl[x[8 + 16 * ib + j] >> 4];
                }
            }
        }
        return 1;
    case RX_MXFP4:
        for (int64_t b = 0; b < k / 32; b++, x += RX_MXFP4_B, y += 32) {
            const float d = rx_e8m0_half(x[0]);
            for (int j = 0; j < 16; j++) {
                y[j] = (float)rx_kvalues_mxfp4[x[1 + j] & 15] * d;
                y[j + 16] = (float)rx_kvalues_mxfp4[x[1 + j] >> 4] * d;
            }
        }
        return 1;
    case RX_TQ1_0:
        for (int64_t b = 0; b < k / 256; b++, x += RX_TQ1_0_B, y += 256) {
            const float d = rx_h2f(rx_rd16(x + 52));
            for (int kk = 0; kk < 5; kk++) {
                for (int m = 0; m < 32; m++) y[32 * kk + m] = (float)(tq1_digit(x[m], kk) - 1) * d;
                for (int m = 0; m < 16; m++) y[160 + 16 * kk + m] = (float)(tq1_digit(x[32 + m], kk) - 1) * d;
            }
            for (int kk = 0; kk < 4; kk++)
                for (int j = 0; j < 4; j++) y[240 + 4 * kk + j] = (float)(tq1_digit(x[48 + j], kk) - 1) * d;
        }
        return 1;
    case RX_TQ2_0:
        for (int64_t b = 0; b < k / 256; b++, x += RX_TQ2_0_B, y += 256) {
            const float d = rx_h2f(rx_rd16(x + 64));
            for (int c = 0; c < 2; c++)
                for (int l = 0; l < 4; l++)
                    for (int m = 0; m < 32; m++) y[128 * c + 32 * l + m] = (float)(((x[32 * c + m] >> 2 * l) & 3) - 1) * d;
        }
        return 1;
    default:
        return 0;
    }
}
