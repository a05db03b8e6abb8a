/* The grid formats (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S), the non-linear
 * 4-bit ones (IQ4_NL, IQ4_XS), the ternary ones (TQ1_0, TQ2_0) and MXFP4 on the cpu backend:
 * dot products of the stored blocks with the int8 activations (IQ4_NL and MXFP4 with A32,
 * the 256-value formats with A256, as ggml's CPU backend pairs them with Q8_0 / Q8_K), and
 * their rows dequantized (the embedding lookup). iq.c is the portable C path, iq_x86.c the
 * AVX2 one (the same integer sums), iq_neon.c the aarch64 one (the same results, bit for bit). Block layouts: ggml-common.h; tables: ../quant_tables.h. */
#ifndef RX_IQ_H
#define RX_IQ_H

#include "rx_cpu.h"

/* the activation format (RX_ACT_A32 / RX_ACT_A256) of one of these types, else 0 */
int rx_iq_act_format(int type);
/* registers the portable dot products in t->dot */
void rx_fill_iq(rx_isa *t);
#if defined(__x86_64__) || defined(_M_X64)
/* overrides them with the AVX2 ones (needs AVX2; called from x86.c's fill) */
void rx_fill_iq_avx2(rx_isa *t);
#endif
#if defined(__aarch64__)
/* ... with the NEON ones (iq_neon.c: bit for bit iq.c's; called from neon.c's fills) */
void rx_fill_iq_neon(rx_isa *t);
#endif
/* one row of k values of one of these types -> float32; 0 when `type` is not one of them */
int rx_iq_dequant_row(int type, const void *src, float *y, int64_t k);

/* E8M0 scale of MXFP4 at half (the E2M1 table holds doubled values), as ggml takes it */
static inline float rx_e8m0_half(uint8_t e) {
    union { uint32_t u; float f; } v;
    v.u = e < 2 ? (uint32_t)0x00200000u << e : (uint32_t)(e - 1) << 23;
    return v.f;
}

static inline uint16_t rx_rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t rx_rd32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* bytes per block */
enum {
    RX_IQ2_XXS_B = 66, RX_IQ2_XS_B = 74, RX_IQ2_S_B = 82, RX_IQ3_XXS_B = 98, RX_IQ3_S_B = 110,
    RX_IQ1_S_B = 50, RX_IQ1_M_B = 56, RX_IQ4_NL_B = 18, RX_IQ4_XS_B = 136, RX_TQ1_0_B = 54,
    RX_TQ2_0_B = 66, RX_MXFP4_B = 17
};

/* IQ1_M: the float16 d spread over the top nibbles of its four scale words */
static inline float rx_iq1m_d(const uint8_t *sc) {
    uint16_t s0 = rx_rd16(sc), s1 = rx_rd16(sc + 2), s2 = rx_rd16(sc + 4), s3 = rx_rd16(sc + 6);
    return rx_h2f((uint16_t)((s0 >> 12) | ((s1 >> 8) & 0x00f0) | ((s2 >> 4) & 0x0f00) | (s3 & 0xf000)));
}

#endif
