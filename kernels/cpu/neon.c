/* aarch64 kernels (Advanced SIMD), built three times by build.py:
 *   rx_fill_neon     the base ARMv8-A instruction set (every aarch64 core);
 *   rx_fill_dotprod  with RX_DOTPROD (-march=armv8.2-a+dotprod): SDOT sums four int8
 *                    products into each int32 lane;
 *   rx_fill_i8mm     with RX_I8MM as well (+i8mm): SMMLA multiplies a 2x8 by an 8x2 int8
 *                    block into a 2x2 int32 tile, used where two activation rows share a
 *                    weight row (dot2: batches, prompt passes, system1's candidates).
 * ops.c picks one at first use from the kernel's hwcaps (AT_HWCAP / AT_HWCAP2).
 *
 * Every function returns exactly what the portable C path (generic.c) returns, bit for bit:
 * the integer sums of a block are exact whatever the order, and the float work is done in
 * generic.c's order (per block (d_w * d_a) * sum, added to one accumulator block after
 * block; the float dot products in the same eight partial sums). tests/c/kernel_check.c
 * checks that per format under qemu-aarch64 (scripts/aarch64-check). */
#include <arm_neon.h>
#include <string.h>

#include "rx_cpu.h"
#include "rx_iq.h"

#if defined(RX_I8MM)
#define RX_FILL rx_fill_i8mm
#define RX_NAME "i8mm"
#elif defined(RX_DOTPROD)
#define RX_FILL rx_fill_dotprod
#define RX_NAME "dotprod"
#else
#define RX_FILL rx_fill_neon
#define RX_NAME "neon"
#endif

/* acc + the dot products of a and b in groups of four adjacent bytes (int8 x int8) */
static inline int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(RX_DOTPROD) || defined(RX_I8MM)
    return vdotq_s32(acc, a, b);
#else
    /* two products of at most 128 * 127 fit an int16 lane */
    int16x8_t p = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    p = vmlal_s8(p, vget_high_s8(a), vget_high_s8(b));
    return vpadalq_s16(acc, p);
#endif
}

static inline float h2f(rx_half h) {
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

/* ------------------------------------------------------------------ 32-value blocks */
/* A weight block of 32 values as two int8x16: values 0..15 and 16..31. */
typedef struct { int8x16_t lo, hi; } q32;

static inline q32 unpack_q4_0(const rx_q4_0 *x) {
    uint8x16_t v = vld1q_u8(x->qs);
    const int8x16_t off = vdupq_n_s8(8);
    q32 q = {vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(15))), off),
             vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), off)};
    return q;
}

static inline q32 unpack_q4_1(const rx_q4_1 *x) {
    uint8x16_t v = vld1q_u8(x->qs);
    q32 q = {vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(15))), vreinterpretq_s8_u8(vshrq_n_u8(v, 4))};
    return q;
}

/* the fifth bits of a Q5 block (bit j of qh for value j) as 0x10 bytes */
static inline void fifth_bits(const uint8_t *qh, uint8x16_t *lo, uint8x16_t *hi) {
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t m = vld1q_u8(bit);
    uint8x16_t b01 = vcombine_u8(vdup_n_u8(qh[0]), vdup_n_u8(qh[1]));
    uint8x16_t b23 = vcombine_u8(vdup_n_u8(qh[2]), vdup_n_u8(qh[3]));
    *lo = vandq_u8(vtstq_u8(b01, m), vdupq_n_u8(0x10));
    *hi = vandq_u8(vtstq_u8(b23, m), vdupq_n_u8(0x10));
}

static inline q32 unpack_q5_0(const rx_q5_0 *x) {
    uint8x16_t v = vld1q_u8(x->qs), hl, hh;
    fifth_bits(x->qh, &hl, &hh);
    const int8x16_t off = vdupq_n_s8(16);
    q32 q = {vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vandq_u8(v, vdupq_n_u8(15)), hl)), off),
             vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(v, 4), hh)), off)};
    return q;
}

static inline q32 unpack_q5_1(const rx_q5_1 *x) {
    uint8x16_t v = vld1q_u8(x->qs), hl, hh;
    fifth_bits(x->qh, &hl, &hh);
    q32 q = {vreinterpretq_s8_u8(vorrq_u8(vandq_u8(v, vdupq_n_u8(15)), hl)),
             vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(v, 4), hh))};
    return q;
}

static inline q32 unpack_q8_0(const rx_q8_0 *x) {
    q32 q = {vld1q_s8(x->qs), vld1q_s8(x->qs + 16)};
    return q;
}

static inline int32x4_t block_dot(q32 q, const rx_a32 *y) {
    int32x4_t s = dot16(vdupq_n_s32(0), q.lo, vld1q_s8(y->q));
    return dot16(s, q.hi, vld1q_s8(y->q + 16));
}

/* the four block sums of a0..a3 in one vector (exact) */
static inline int32x4_t sums4(int32x4_t a0, int32x4_t a1, int32x4_t a2, int32x4_t a3) {
    return vpaddq_s32(vpaddq_s32(a0, a1), vpaddq_s32(a2, a3));
}

/* generic.c's order: acc += p[0]; acc += p[1]; ... */
static inline float add4(float acc, float32x4_t p) {
    acc += vgetq_lane_f32(p, 0);
    acc += vgetq_lane_f32(p, 1);
    acc += vgetq_lane_f32(p, 2);
    acc += vgetq_lane_f32(p, 3);
    return acc;
}

/* NR activation rows against one weight row, four blocks at a time: the weight blocks are
 * unpacked once for all rows. HAS_M: the format has a min (value = d*q + m), whose term
 * m * (activation block sum) generic.c adds to the block's product before accumulating. */
#define DOT_A32(NAME, TYPE, UNPACK, HAS_M)                                                         \
    static void NAME##_n(int64_t n, const TYPE *x, const rx_a32 *const *y, int nr, float *out) {     \
        float acc[4] = {0.f, 0.f, 0.f, 0.f};                                                       \
        int64_t nb = n / 32, b = 0;                                                                \
        for (; b + 4 <= nb; b += 4) {                                                              \
            q32 q0 = UNPACK(x + b), q1 = UNPACK(x + b + 1), q2 = UNPACK(x + b + 2), q3 = UNPACK(x + b + 3); \
            const rx_half hd[4] = {x[b].d, x[b + 1].d, x[b + 2].d, x[b + 3].d};                    \
            float32x4_t dw = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(hd)));                     \
            float32x4_t mw = vdupq_n_f32(0.f);                                                     \
            if (HAS_M) {                                                                           \
                const rx_half hm[4] = {MOF(x[b]), MOF(x[b + 1]), MOF(x[b + 2]), MOF(x[b + 3])};    \
                mw = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(hm)));                             \
            }                                                                                      \
            for (int r = 0; r < nr; r++) {                                                         \
                const rx_a32 *a = y[r] + b;                                                        \
                int32x4_t s = sums4(block_dot(q0, a), block_dot(q1, a + 1), block_dot(q2, a + 2),   \
                                    block_dot(q3, a + 3));                                         \
                const float da[4] = {a[0].d, a[1].d, a[2].d, a[3].d};                              \
                float32x4_t p = vmulq_f32(vmulq_f32(dw, vld1q_f32(da)), vcvtq_f32_s32(s));         \
                if (HAS_M) {                                                                       \
                    const float sa[4] = {a[0].s, a[1].s, a[2].s, a[3].s};                          \
                    p = vaddq_f32(p, vmulq_f32(mw, vld1q_f32(sa)));                                \
                }                                                                                  \
                acc[r] = add4(acc[r], p);                                                          \
            }                                                                                      \
        }                                                                                          \
        for (; b < nb; b++) {                                                                      \
            q32 q = UNPACK(x + b);                                                                 \
            float d = h2f(x[b].d);                                                                 \
            for (int r = 0; r < nr; r++) {                                                         \
                const rx_a32 *a = y[r] + b;                                                        \
                float s = (float)vaddvq_s32(block_dot(q, a));                                      \
                if (HAS_M) acc[r] += d * a->d * s + h2f(MOF(x[b])) * a->s;                         \
                else acc[r] += d * a->d * s;                                                       \
            }                                                                                      \
        }                                                                                          \
        for (int r = 0; r < nr; r++) out[r] = acc[r];                                              \
    }                                                                                              \
    static float NAME(int64_t n, const void *w, const void *a) {                                   \
        const rx_a32 *y[1] = {a};                                                                  \
        float o;                                                                                   \
        NAME##_n(n, w, y, 1, &o);                                                                  \
        return o;                                                                                  \
    }                                                                                              \
    static void NAME##2(int64_t n, const void *w, const void *a0, const void *a1, float *out) {     \
        const rx_a32 *y[2] = {a0, a1};                                                             \
        NAME##_n(n, w, y, 2, out);                                                                 \
    }

#define MOF(blk) (blk).d /* formats without a min: never read (HAS_M is 0) */
DOT_A32(dot_q4_0, rx_q4_0, unpack_q4_0, 0)
DOT_A32(dot_q5_0, rx_q5_0, unpack_q5_0, 0)
DOT_A32(dot_q8_0, rx_q8_0, unpack_q8_0, 0)
#undef MOF
#define MOF(blk) (blk).m
DOT_A32(dot_q4_1, rx_q4_1, unpack_q4_1, 1)
DOT_A32(dot_q5_1, rx_q5_1, unpack_q5_1, 1)
#undef MOF

/* Tiles (prompt passes, batches: ops.c's rx_tile_fn): 4 weight rows x NC activation rows per
 * block, the 4 rows' blocks unpacked once. Each (row, activation row) pair gets generic.c's
 * per-block expression, lane by lane (the 4 weight rows in the 4 lanes), added block after
 * block: the same bits as 16 single dots. With i8mm, SMMLA makes a 2x2 tile of the sums
 * from 8-byte slices of two weight rows and two activation rows. */
#define TILE_A32(NAME, NC, TYPE, UNPACK, HAS_M)                                                    \
    static void NAME(int64_t n, const uint8_t *w, int64_t rb, const uint8_t *a, size_t ar, float *y,  \
                     int64_t ldy) {                                                                \
        const TYPE *x0 = (const TYPE *)w, *x1 = (const TYPE *)(w + rb);                              \
        const TYPE *x2 = (const TYPE *)(w + 2 * rb), *x3 = (const TYPE *)(w + 3 * rb);               \
        float32x4_t acc[NC];                                                                       \
        for (int c = 0; c < NC; c++) acc[c] = vdupq_n_f32(0.f);                                    \
        for (int64_t b = 0; b < n / 32; b++) {                                                     \
            q32 q0 = UNPACK(x0 + b), q1 = UNPACK(x1 + b), q2 = UNPACK(x2 + b), q3 = UNPACK(x3 + b); \
            const rx_half hd[4] = {x0[b].d, x1[b].d, x2[b].d, x3[b].d};                            \
            float32x4_t dw = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(hd)));                     \
            float32x4_t mw = vdupq_n_f32(0.f);                                                     \
            if (HAS_M) {                                                                           \
                const rx_half hm[4] = {MOF(x0[b]), MOF(x1[b]), MOF(x2[b]), MOF(x3[b])};            \
                mw = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(hm)));                             \
            }                                                                                      \
            int32x4_t s[NC];                                                                       \
            TILE_SUMS(NC)                                                                          \
            for (int c = 0; c < NC; c++) {                                                         \
                const rx_a32 *yc = (const rx_a32 *)(a + c * ar) + b;                                \
                float32x4_t p = vmulq_f32(vmulq_n_f32(dw, yc->d), vcvtq_f32_s32(s[c]));            \
                if (HAS_M) p = vaddq_f32(p, vmulq_n_f32(mw, yc->s));                               \
                acc[c] = vaddq_f32(acc[c], p);                                                     \
            }                                                                                      \
        }                                                                                          \
        for (int c = 0; c < NC; c++) vst1q_f32(y + c * ldy, acc[c]);                               \
    }

#if defined(RX_I8MM)
/* s[c] = [row0 . act c, row1 . act c, row2 . act c, row3 . act c] from 2x2 SMMLA tiles */
static inline int8x16_t pair8(int8x16_t u, int8x16_t v, int hi) { /* 8 bytes of u, then of v */
    int64x2_t a = vreinterpretq_s64_s8(u), b = vreinterpretq_s64_s8(v);
    return vreinterpretq_s8_s64(hi ? vzip2q_s64(a, b) : vzip1q_s64(a, b));
}
#define TILE_SUMS(NC)                                                                              \
    {                                                                                              \
        int8x16_t w01[4], w23[4];                                                                  \
        w01[0] = pair8(q0.lo, q1.lo, 0); w01[1] = pair8(q0.lo, q1.lo, 1);                          \
        w01[2] = pair8(q0.hi, q1.hi, 0); w01[3] = pair8(q0.hi, q1.hi, 1);                          \
        w23[0] = pair8(q2.lo, q3.lo, 0); w23[1] = pair8(q2.lo, q3.lo, 1);                          \
        w23[2] = pair8(q2.hi, q3.hi, 0); w23[3] = pair8(q2.hi, q3.hi, 1);                          \
        for (int c = 0; c < NC; c += 2) {                                                          \
            const rx_a32 *ya = (const rx_a32 *)(a + c * ar) + b, *yb = (const rx_a32 *)(a + (c + 1) * ar) + b; \
            int8x16_t pa0 = vld1q_s8(ya->q), pa1 = vld1q_s8(ya->q + 16);                           \
            int8x16_t pb0 = vld1q_s8(yb->q), pb1 = vld1q_s8(yb->q + 16);                           \
            int8x16_t p[4] = {pair8(pa0, pb0, 0), pair8(pa0, pb0, 1), pair8(pa1, pb1, 0), pair8(pa1, pb1, 1)}; \
            int32x4_t m01 = vdupq_n_s32(0), m23 = vdupq_n_s32(0);                                  \
            for (int k = 0; k < 4; k++) {                                                          \
                m01 = vmmlaq_s32(m01, w01[k], p[k]);                                               \
                m23 = vmmlaq_s32(m23, w23[k], p[k]);                                               \
            }                                                                                      \
            /* m01 = [r0.a, r0.b, r1.a, r1.b], m23 = [r2.a, r2.b, r3.a, r3.b] */                    \
            s[c] = vuzp1q_s32(m01, m23);                                                           \
            s[c + 1] = vuzp2q_s32(m01, m23);                                                       \
        }                                                                                          \
    }
#else
#define TILE_SUMS(NC)                                                                              \
    for (int c = 0; c < NC; c++) {                                                                 \
        const rx_a32 *yc = (const rx_a32 *)(a + c * ar) + b;                                        \
        s[c] = sums4(block_dot(q0, yc), block_dot(q1, yc), block_dot(q2, yc), block_dot(q3, yc));  \
    }
#endif

#define TILES_A32(NAME, TYPE, UNPACK, HAS_M)                                                       \
    TILE_A32(NAME, 4, TYPE, UNPACK, HAS_M)                                                         \
    TILE_A32(NAME##_8, 8, TYPE, UNPACK, HAS_M)
#define MOF(blk) (blk).d
TILES_A32(tile_q4_0, rx_q4_0, unpack_q4_0, 0)
TILES_A32(tile_q5_0, rx_q5_0, unpack_q5_0, 0)
TILES_A32(tile_q8_0, rx_q8_0, unpack_q8_0, 0)
#undef MOF
#define MOF(blk) (blk).m
TILES_A32(tile_q4_1, rx_q4_1, unpack_q4_1, 1)
TILES_A32(tile_q5_1, rx_q5_1, unpack_q5_1, 1)
#undef MOF

/* ------------------------------------------------------------------ 256-value blocks */
static inline int k_mins(const uint8_t *scales, const int16_t *bsum, uint8_t *sc) {
    int summ = 0;
    for (int j = 0; j < 8; j++) {
        uint8_t d, m;
        rx_k4_scale_min(j, scales, &d, &m);
        sc[j] = d;
        summ += m * (bsum[2 * j] + bsum[2 * j + 1]);
    }
    return summ;
}

/* sum over the 8 groups of 32 of scale_g * (group g of the weights . the activations), for
 * Q4_K (qh NULL) and Q5_K */
static inline int k45_sumi(const uint8_t *qs, const uint8_t *qh, const uint8_t *sc, const int8_t *p) {
    const uint8x16_t m4 = vdupq_n_u8(15), b5 = vdupq_n_u8(0x10);
    uint8x16_t h0 = vdupq_n_u8(0), h1 = h0;
    if (qh) { h0 = vld1q_u8(qh); h1 = vld1q_u8(qh + 16); }
    int32x4_t sumi = vdupq_n_s32(0);
    for (int j = 0; j < 4; j++) {
        uint8x16_t v0 = vld1q_u8(qs + 32 * j), v1 = vld1q_u8(qs + 32 * j + 16);
        uint8x16_t l0 = vandq_u8(v0, m4), l1 = vandq_u8(v1, m4);
        uint8x16_t u0 = vshrq_n_u8(v0, 4), u1 = vshrq_n_u8(v1, 4);
        if (qh) {
            const uint8x16_t bl = vdupq_n_u8((uint8_t)(1u << (2 * j))), bh = vdupq_n_u8((uint8_t)(2u << (2 * j)));
            l0 = vorrq_u8(l0, vandq_u8(vtstq_u8(h0, bl), b5));
            l1 = vorrq_u8(l1, vandq_u8(vtstq_u8(h1, bl), b5));
            u0 = vorrq_u8(u0, vandq_u8(vtstq_u8(h0, bh), b5));
            u1 = vorrq_u8(u1, vandq_u8(vtstq_u8(h1, bh), b5));
        }
        const int8_t *pj = p + 64 * j;
        int32x4_t s0 = dot16(vdupq_n_s32(0), vreinterpretq_s8_u8(l0), vld1q_s8(pj));
        s0 = dot16(s0, vreinterpretq_s8_u8(l1), vld1q_s8(pj + 16));
        int32x4_t s1 = dot16(vdupq_n_s32(0), vreinterpretq_s8_u8(u0), vld1q_s8(pj + 32));
        s1 = dot16(s1, vreinterpretq_s8_u8(u1), vld1q_s8(pj + 48));
        sumi = vmlaq_n_s32(sumi, s0, sc[2 * j]);
        sumi = vmlaq_n_s32(sumi, s1, sc[2 * j + 1]);
    }
    return vaddvq_s32(sumi);
}

static float dot_q4_k(int64_t n, const void *w, const void *a) {
    const rx_q4_k *x = w; const rx_a256 *y = a;
    float acc = 0.f;
    for (int64_t b = 0; b < n / 256; b++) {
        uint8_t sc[8];
        int summ = k_mins(x[b].scales, y[b].bsum, sc);
        int sumi = k45_sumi(x[b].qs, NULL, sc, y[b].q);
        acc += y[b].d * (h2f(x[b].d) * (float)sumi - h2f(x[b].dmin) * (float)summ);
    }
    return acc;
}

static float dot_q5_k(int64_t n, const void *w, const void *a) {
    const rx_q5_k *x = w; const rx_a256 *y = a;
    float acc = 0.f;
    for (int64_t b = 0; b < n / 256; b++) {
        uint8_t sc[8];
        int summ = k_mins(x[b].scales, y[b].bsum, sc);
        int sumi = k45_sumi(x[b].qs, x[b].qh, sc, y[b].q);
        acc += y[b].d * (h2f(x[b].d) * (float)sumi - h2f(x[b].dmin) * (float)summ);
    }
    return acc;
}

/* a Q6_K half (128 values) as 8 int8x16 of values - 32: v[g] holds values 16g..16g+15, whose
 * scale is scales[g] */
static inline void q6_unpack(const uint8_t *ql, const uint8_t *qh, int8x16_t *v) {
    const uint8x16_t m4 = vdupq_n_u8(15), m2 = vdupq_n_u8(3);
    const int8x16_t off = vdupq_n_s8(32);
    for (int t = 0; t < 2; t++) {
        uint8x16_t la = vld1q_u8(ql + 16 * t), lb = vld1q_u8(ql + 32 + 16 * t), h = vld1q_u8(qh + 16 * t);
        uint8x16_t q1 = vorrq_u8(vandq_u8(la, m4), vshlq_n_u8(vandq_u8(h, m2), 4));
        uint8x16_t q2 = vorrq_u8(vandq_u8(lb, m4), vshlq_n_u8(vandq_u8(vshrq_n_u8(h, 2), m2), 4));
        uint8x16_t q3 = vorrq_u8(vshrq_n_u8(la, 4), vshlq_n_u8(vandq_u8(vshrq_n_u8(h, 4), m2), 4));
        uint8x16_t q4 = vorrq_u8(vshrq_n_u8(lb, 4), vshlq_n_u8(vshrq_n_u8(h, 6), 4));
        v[0 + t] = vsubq_s8(vreinterpretq_s8_u8(q1), off);
        v[2 + t] = vsubq_s8(vreinterpretq_s8_u8(q2), off);
        v[4 + t] = vsubq_s8(vreinterpretq_s8_u8(q3), off);
        v[6 + t] = vsubq_s8(vreinterpretq_s8_u8(q4), off);
    }
}

static inline int q6_half(const int8x16_t *v, const int8_t *sc, const int8_t *p) {
    int32x4_t sumi = vdupq_n_s32(0);
    for (int g = 0; g < 8; g++) {
        int32x4_t s = dot16(vdupq_n_s32(0), v[g], vld1q_s8(p + 16 * g));
        sumi = vmlaq_n_s32(sumi, s, sc[g]);
    }
    return vaddvq_s32(sumi);
}

static float dot_q6_k(int64_t n, const void *w, const void *a) {
    const rx_q6_k *x = w; const rx_a256 *y = a;
    float acc = 0.f;
    for (int64_t b = 0; b < n / 256; b++) {
        int sumi = 0;
        for (int h = 0; h < 2; h++) {
            int8x16_t v[8];
            q6_unpack(x[b].ql + 64 * h, x[b].qh + 32 * h, v);
            sumi += q6_half(v, x[b].scales + 8 * h, y[b].q + 128 * h);
        }
        acc += h2f(x[b].d) * y[b].d * (float)sumi;
    }
    return acc;
}

static void dot2_q6_k(int64_t n, const void *w, const void *a0, const void *a1, float *out) {
    const rx_q6_k *x = w; const rx_a256 *y0 = a0, *y1 = a1;
    float acc0 = 0.f, acc1 = 0.f;
    for (int64_t b = 0; b < n / 256; b++) {
        int s0 = 0, s1 = 0;
        for (int h = 0; h < 2; h++) {
            int8x16_t v[8];
            q6_unpack(x[b].ql + 64 * h, x[b].qh + 32 * h, v);
            s0 += q6_half(v, x[b].scales + 8 * h, y0[b].q + 128 * h);
            s1 += q6_half(v, x[b].scales + 8 * h, y1[b].q + 128 * h);
        }
        float d = h2f(x[b].d);
        acc0 += d * y0[b].d * (float)s0;
        acc1 += d * y1[b].d * (float)s1;
    }
    out[0] = acc0;
    out[1] = acc1;
}

static void dot2_q4_k(int64_t n, const void *w, const void *a0, const void *a1, float *out) {
    const rx_q4_k *x = w; const rx_a256 *y0 = a0, *y1 = a1;
    float acc0 = 0.f, acc1 = 0.f;
    for (int64_t b = 0; b < n / 256; b++) {
        uint8_t sc[8];
        int m0 = k_mins(x[b].scales, y0[b].bsum, sc), m1 = k_mins(x[b].scales, y1[b].bsum, sc);
        int s0 = k45_sumi(x[b].qs, NULL, sc, y0[b].q), s1 = k45_sumi(x[b].qs, NULL, sc, y1[b].q);
        float d = h2f(x[b].d), dmin = h2f(x[b].dmin);
        acc0 += y0[b].d * (d * (float)s0 - dmin * (float)m0);
        acc1 += y1[b].d * (d * (float)s1 - dmin * (float)m1);
    }
    out[0] = acc0;
    out[1] = acc1;
}

static float dot_q8_k(int64_t n, const void *w, const void *a) {
    const rx_q8_k *x = w; const rx_a256 *y = a;
    float acc = 0.f;
    for (int64_t b = 0; b < n / 256; b++) {
        int32x4_t s = vdupq_n_s32(0);
        for (int j = 0; j < 256; j += 16) s = dot16(s, vld1q_s8(x[b].qs + j), vld1q_s8(y[b].q + j));
        acc += x[b].d * y[b].d * (float)vaddvq_s32(s);
    }
    return acc;
}

/* ------------------------------------------------------------------ float rows */
/* generic.c's order: eight partial sums s[k] over elements i + k (multiply, then add), the
 * tail added first, then s[0..7] */
#define DOT_FLOAT(NAME, XT, LOAD_X, SCALAR_X)                                                      \
    static float NAME(int64_t n, const void *w, const void *a) {                                   \
        const XT *x = w; const float *y = a;                                                       \
        float32x4_t s0 = vdupq_n_f32(0.f), s1 = s0;                                                \
        int64_t i = 0;                                                                             \
        for (; i + 8 <= n; i += 8) {                                                               \
            s0 = vaddq_f32(s0, vmulq_f32(LOAD_X(x + i), vld1q_f32(y + i)));                        \
            s1 = vaddq_f32(s1, vmulq_f32(LOAD_X(x + i + 4), vld1q_f32(y + i + 4)));                \
        }                                                                                          \
        float acc = 0.f;                                                                           \
        for (; i < n; i++) acc += SCALAR_X(x[i]) * y[i];                                           \
        return add4(add4(acc, s0), s1);                                                            \
    }

static inline float32x4_t ld_f32(const float *p) { return vld1q_f32(p); }
static inline float32x4_t ld_f16(const uint16_t *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
static inline float32x4_t ld_bf16(const uint16_t *p) {
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16));
}
static inline float id_f32(float v) { return v; }

DOT_FLOAT(dot_f32w, float, ld_f32, id_f32)
DOT_FLOAT(dot_f16w, uint16_t, ld_f16, h2f)
DOT_FLOAT(dot_bf16w, uint16_t, ld_bf16, rx_bf2f)

static float dot_f32(const float *a, const float *b, int64_t n) { return dot_f32w(n, a, b); }
static float dot_f32_f16(const float *a, const uint16_t *b, int64_t n) { return dot_f16w(n, b, a); }

static void axpy_f32(float *y, float a, const float *x, int64_t n) {
    float32x4_t va = vdupq_n_f32(a);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vaddq_f32(vld1q_f32(y + i), vmulq_f32(va, vld1q_f32(x + i))));
    for (; i < n; i++) y[i] += a * x[i];
}

static void axpy_f16(float *y, float a, const uint16_t *x, int64_t n) {
    float32x4_t va = vdupq_n_f32(a);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vaddq_f32(vld1q_f32(y + i), vmulq_f32(va, ld_f16(x + i))));
    for (; i < n; i++) y[i] += a * h2f(x[i]);
}

static void to_f16(const float *x, uint16_t *y, int64_t n) { /* round to nearest even, as rx_f2h */
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(y + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
    for (; i < n; i++) y[i] = rx_f2h(x[i]);
}

/* ------------------------------------------------------------------ activations */
static inline float amax_n(const float *x, int n) {
    float32x4_t m = vdupq_n_f32(0.f);
    for (int i = 0; i < n; i += 4) m = vmaxq_f32(m, vabsq_f32(vld1q_f32(x + i)));
    return vmaxvq_f32(m);
}

/* 16 values rounded (to nearest even, as lrintf) to int8, values within [-127, 127] */
static inline int8x16_t quant16(const float *x, float32x4_t id) {
    int32x4_t i0 = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(x), id));
    int32x4_t i1 = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(x + 4), id));
    int32x4_t i2 = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(x + 8), id));
    int32x4_t i3 = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(x + 12), id));
    int16x8_t w0 = vcombine_s16(vqmovn_s32(i0), vqmovn_s32(i1)), w1 = vcombine_s16(vqmovn_s32(i2), vqmovn_s32(i3));
    return vcombine_s8(vqmovn_s16(w0), vqmovn_s16(w1));
}

static void quant_a32(const float *x, rx_a32 *y, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++, x += 32) {
        float d = amax_n(x, 32) / 127.f, id = d ? 1.f / d : 0.f;
        float32x4_t vid = vdupq_n_f32(id);
        int8x16_t q0 = quant16(x, vid), q1 = quant16(x + 16, vid);
        vst1q_s8(y[b].q, q0);
        vst1q_s8(y[b].q + 16, q1);
        int s = vaddlvq_s8(q0) + vaddlvq_s8(q1);
        y[b].d = d;
        y[b].s = d * (float)s;
    }
}

static void quant_a256(const float *x, rx_a256 *y, int64_t n) {
    for (int64_t b = 0; b < n / 256; b++, x += 256) {
        float d = amax_n(x, 256) / 127.f, id = d ? 1.f / d : 0.f;
        float32x4_t vid = vdupq_n_f32(id);
        for (int g = 0; g < 16; g++) {
            int8x16_t q = quant16(x + 16 * g, vid);
            vst1q_s8(y[b].q + 16 * g, q);
            y[b].bsum[g] = (int16_t)vaddlvq_s8(q);
        }
        y[b].d = d;
    }
}

#if defined(RX_I8MM)
/* Two activation rows with SMMLA: the weight block's 32 values against both rows at once.
 * SMMLA takes a 2x8 by an 8x2 block, so each 16-byte slice of the weights is paired with
 * itself (rows 0 and 1 of the left factor equal) and the activations' two rows interleaved
 * in 8-byte halves; lanes 0 and 1 of the result are then the sums with rows 0 and 1. */
static inline int32x4_t mm2(int32x4_t acc, int8x16_t w8x2, int8x16_t a8x2) { return vmmlaq_s32(acc, w8x2, a8x2); }

#define DOT2_MM(NAME, TYPE, UNPACK, HAS_M)                                                         \
    static void NAME(int64_t n, const void *w, const void *a0, const void *a1, float *out) {        \
        const TYPE *x = w; const rx_a32 *y0 = a0, *y1 = a1;                                         \
        float acc0 = 0.f, acc1 = 0.f;                                                              \
        for (int64_t b = 0; b < n / 32; b++) {                                                     \
            q32 q = UNPACK(x + b);                                                                 \
            int64x2_t wl = vreinterpretq_s64_s8(q.lo), wh = vreinterpretq_s64_s8(q.hi);            \
            int64x2_t p0l = vreinterpretq_s64_s8(vld1q_s8(y0[b].q)), p1l = vreinterpretq_s64_s8(vld1q_s8(y1[b].q)); \
            int64x2_t p0h = vreinterpretq_s64_s8(vld1q_s8(y0[b].q + 16)), p1h = vreinterpretq_s64_s8(vld1q_s8(y1[b].q + 16)); \
            int32x4_t s = vdupq_n_s32(0);                                                          \
            /* k = 0..7, 8..15, 16..23, 24..31: left [w_k, w_k], right [a0_k, a1_k] */              \
            s = mm2(s, vreinterpretq_s8_s64(vdupq_laneq_s64(wl, 0)), vreinterpretq_s8_s64(vzip1q_s64(p0l, p1l))); \
            s = mm2(s, vreinterpretq_s8_s64(vdupq_laneq_s64(wl, 1)), vreinterpretq_s8_s64(vzip2q_s64(p0l, p1l))); \
            s = mm2(s, vreinterpretq_s8_s64(vdupq_laneq_s64(wh, 0)), vreinterpretq_s8_s64(vzip1q_s64(p0h, p1h))); \
            s = mm2(s, vreinterpretq_s8_s64(vdupq_laneq_s64(wh, 1)), vreinterpretq_s8_s64(vzip2q_s64(p0h, p1h))); \
            float d = h2f(x[b].d);                                                                 \
            float s0 = (float)vgetq_lane_s32(s, 0), s1 = (float)vgetq_lane_s32(s, 1);              \
            if (HAS_M) {                                                                           \
                float m = h2f(MOF(x[b]));                                                          \
                acc0 += d * y0[b].d * s0 + m * y0[b].s;                                            \
                acc1 += d * y1[b].d * s1 + m * y1[b].s;                                            \
            } else {                                                                               \
                acc0 += d * y0[b].d * s0;                                                          \
                acc1 += d * y1[b].d * s1;                                                          \
            }                                                                                      \
        }                                                                                          \
        out[0] = acc0;                                                                             \
        out[1] = acc1;                                                                             \
    }
#define MOF(blk) (blk).d
DOT2_MM(mm2_q4_0, rx_q4_0, unpack_q4_0, 0)
DOT2_MM(mm2_q5_0, rx_q5_0, unpack_q5_0, 0)
DOT2_MM(mm2_q8_0, rx_q8_0, unpack_q8_0, 0)
#undef MOF
#define MOF(blk) (blk).m
DOT2_MM(mm2_q4_1, rx_q4_1, unpack_q4_1, 1)
DOT2_MM(mm2_q5_1, rx_q5_1, unpack_q5_1, 1)
#undef MOF
#endif

void RX_FILL(rx_isa *t) {
    t->name = RX_NAME;
    rx_fill_iq_neon(t); /* the IQ / TQ2_0 / MXFP4 formats (iq_neon.c) */
    t->dot[RX_Q4_0] = dot_q4_0;
    t->dot[RX_Q4_1] = dot_q4_1;
    t->dot[RX_Q5_0] = dot_q5_0;
    t->dot[RX_Q5_1] = dot_q5_1;
    t->dot[RX_Q8_0] = dot_q8_0;
    t->dot[RX_Q4_K] = dot_q4_k;
    t->dot[RX_Q5_K] = dot_q5_k;
    t->dot[RX_Q6_K] = dot_q6_k;
    t->dot[RX_Q8_K] = dot_q8_k;
    t->dot[RX_F32] = dot_f32w;
    t->dot[RX_F16] = dot_f16w;
    t->dot[RX_BF16] = dot_bf16w;
#if defined(RX_I8MM)
    t->dot2[RX_Q4_0] = mm2_q4_0;
    t->dot2[RX_Q4_1] = mm2_q4_1;
    t->dot2[RX_Q5_0] = mm2_q5_0;
    t->dot2[RX_Q5_1] = mm2_q5_1;
    t->dot2[RX_Q8_0] = mm2_q8_0;
#else
    t->dot2[RX_Q4_0] = dot_q4_02;
    t->dot2[RX_Q4_1] = dot_q4_12;
    t->dot2[RX_Q5_0] = dot_q5_02;
    t->dot2[RX_Q5_1] = dot_q5_12;
    t->dot2[RX_Q8_0] = dot_q8_02;
#endif
    t->tile[RX_Q4_0] = tile_q4_0;
    t->tile[RX_Q4_1] = tile_q4_1;
    t->tile[RX_Q5_0] = tile_q5_0;
    t->tile[RX_Q5_1] = tile_q5_1;
    t->tile[RX_Q8_0] = tile_q8_0;
    t->tile8[RX_Q4_0] = tile_q4_0_8;
    t->tile8[RX_Q4_1] = tile_q4_1_8;
    t->tile8[RX_Q5_0] = tile_q5_0_8;
    t->tile8[RX_Q5_1] = tile_q5_1_8;
    t->tile8[RX_Q8_0] = tile_q8_0_8;
    t->dot2[RX_Q4_K] = dot2_q4_k;
    t->dot2[RX_Q6_K] = dot2_q6_k;
    t->quant_a32 = quant_a32;
    t->quant_a256 = quant_a256;
    t->dot_f32 = dot_f32;
    t->dot_f32_f16 = dot_f32_f16;
    t->axpy_f32 = axpy_f32;
    t->axpy_f16 = axpy_f16;
    t->to_f16 = to_f16;
}
