/* x86-64 kernels (AVX2 + FMA + F16C), built twice by build.py: as rx_fill_avx2, and with
 * RX_VNNI as rx_fill_avx512vnni, where the int8 pair sums use VPDPBUSD (AVX512-VNNI on
 * 256-bit vectors, AVX512VL) instead of VPMADDUBSW + VPMADDWD.
 *
 * The scheme (as in ggml's x86 code, written here from the formats): unpack a weight
 * block's 4/5/6-bit values into 32 bytes, multiply them with the int8 activations as
 * u8 x s8 pairs summed into int32, and scale the int32 sums by the two float scales. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "rx_cpu.h"
#include "rx_iq.h"

#ifdef RX_VNNI
#define RX_FILL rx_fill_avx512vnni
#define RX_NAME "avx512vnni"
#else
#define RX_FILL rx_fill_avx2
#define RX_NAME "avx2"
#endif

static inline float hsum8(__m256 v) {
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

static inline float half1(rx_half h) { return _cvtsh_ss(h); }

/* sum of u8 x s8 products, 4 adjacent pairs per int32 lane */
static inline __m256i dot_us(__m256i u, __m256i s) {
#ifdef RX_VNNI
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

/* s8 x s8: move the sign of a onto b so the left factor is unsigned */
static inline __m256i dot_ss(__m256i a, __m256i b) {
    return dot_us(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
}

/* 16 bytes of nibbles -> 32 bytes: the 16 low nibbles, then the 16 high ones */
static inline __m256i nibbles32(const uint8_t *p) {
    __m128i t = _mm_loadu_si128((const __m128i *)p);
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    return _mm256_and_si256(v, _mm256_set1_epi8(15));
}

/* 32 bits -> 32 bytes, 0xFF where the bit is set */
static inline __m256i bits32(const uint8_t *p) {
    uint32_t x; memcpy(&x, p, 4);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                           0x0101010101010101, 0x0000000000000000);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), shuf);
    const __m256i bit = _mm256_set1_epi64x((long long)0x7fbfdfeff7fbfdfeULL);
    b = _mm256_or_si256(b, bit);
    return _mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1));
}

/* ---------------------------------------------------------------- tiles (RX_TILE_M x RX_TILE_N)
 * The learnt scheme of ggml's repacked / llamafile's tiled products, on the GGUF's blocks in
 * place (no repacked copy of the weights: none of the memory a repack costs): per block, the
 * 4 weight rows' blocks are unpacked once to unsigned bytes (value + offset; the offset's
 * share, offset * d_w * (activation block sum), is the per-block "min" term m), each of the
 * 4 activation blocks is loaded once, and the 16 int32 dot products are reduced to one
 * 4-lane vector per activation row, scaled by (d_w of the 4 rows) * d_a. */

/* sums of the 8 int32 lanes of d0..d3 as one vector [s0, s1, s2, s3] */
static inline __m128i hsum4x8(__m256i d0, __m256i d1, __m256i d2, __m256i d3) {
    __m256i t = _mm256_hadd_epi32(_mm256_hadd_epi32(d0, d1), _mm256_hadd_epi32(d2, d3));
    return _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
}

static inline int hsum_i32x8(__m256i v) {
    __m128i r = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    r = _mm_add_epi32(r, _mm_shuffle_epi32(r, 0x4e));
    r = _mm_add_epi32(r, _mm_shuffle_epi32(r, 0xb1));
    return _mm_cvtsi128_si32(r);
}

static inline __m128 half4(rx_half a, rx_half b, rx_half c, rx_half d) {
    return _mm_cvtph_ps(_mm_setr_epi16((short)a, (short)b, (short)c, (short)d, 0, 0, 0, 0));
}

/* how far ahead a tile prefetches its weight rows: the next tile's with 4 or more activation rows,
 * further with fewer (less work a block: one-token steps stream the weights from memory) */
#ifndef PF_SMALL
#define PF_SMALL 12
#endif
#define PF_ROWS(nc) ((nc) >= 4 ? 4 : PF_SMALL)

/* UNPACK(block pointer) -> __m256i of 32 unsigned values; MIN(block pointer, d) -> the float
 * offset term per unit of activation sum (value = d * u + MIN) */
#define TILE_A32(NAME, NC, TYPE, UNPACK, MIN, DOT)                                                 \
    static void NAME(int64_t n, const uint8_t *w, int64_t rb, const uint8_t *a, size_t ar, float *y,  \
                     int64_t ldy) {                                                                \
        const TYPE *x0 = (const TYPE *)w, *x1 = (const TYPE *)(w + rb);                              \
        const TYPE *x2 = (const TYPE *)(w + 2 * rb), *x3 = (const TYPE *)(w + 3 * rb);               \
        __m128 acc[NC];                                                                            \
        _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) acc[c] = _mm_setzero_ps();            \
        for (int64_t b = 0; b < n / 32; b++) {                                                     \
            /* the next tile's rows: a large matrix streams from memory (the output layer) */       \
            _mm_prefetch((const char *)(x0 + b) + PF_ROWS(NC) * rb, _MM_HINT_T0);                  \
            _mm_prefetch((const char *)(x1 + b) + PF_ROWS(NC) * rb, _MM_HINT_T0);                  \
            _mm_prefetch((const char *)(x2 + b) + PF_ROWS(NC) * rb, _MM_HINT_T0);                  \
            _mm_prefetch((const char *)(x3 + b) + PF_ROWS(NC) * rb, _MM_HINT_T0);                  \
            __m256i q0 = UNPACK(x0 + b), q1 = UNPACK(x1 + b), q2 = UNPACK(x2 + b), q3 = UNPACK(x3 + b); \
            __m128 dw = half4(x0[b].d, x1[b].d, x2[b].d, x3[b].d);                                  \
            __m128 mw = MIN(x0 + b, x1 + b, x2 + b, x3 + b, dw);                                    \
            _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) {                                  \
                const rx_a32 *yc = (const rx_a32 *)(a + c * ar) + b;                                \
                __m256i p = _mm256_loadu_si256((const __m256i *)yc->q);                            \
                __m128 s = _mm_cvtepi32_ps(hsum4x8(DOT(q0, p), DOT(q1, p), DOT(q2, p), DOT(q3, p)));\
                acc[c] = _mm_fmadd_ps(_mm_mul_ps(dw, _mm_set1_ps(yc->d)), s, acc[c]);              \
                acc[c] = _mm_fmadd_ps(mw, _mm_set1_ps(yc->s), acc[c]);                             \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) _mm_storeu_ps(y + c * ldy, acc[c]);   \
    }

static inline __m256i u_q4(const uint8_t *qs) { return nibbles32(qs); }
static inline __m256i u_q5(const uint8_t *qs, const uint8_t *qh) {
    return _mm256_or_si256(nibbles32(qs), _mm256_and_si256(bits32(qh), _mm256_set1_epi8(0x10)));
}
#define UNPACK_Q4_0(x) u_q4((x)->qs)
#define UNPACK_Q4_1(x) u_q4((x)->qs)
#define UNPACK_Q5_0(x) u_q5((x)->qs, (x)->qh)
#define UNPACK_Q5_1(x) u_q5((x)->qs, (x)->qh)
#define MIN_OFF8(a, b, c, d, dw) _mm_mul_ps(dw, _mm_set1_ps(-8.f))
#define MIN_OFF16(a, b, c, d, dw) _mm_mul_ps(dw, _mm_set1_ps(-16.f))
#define MIN_M(a, b, c, d, dw) half4((a)->m, (b)->m, (c)->m, (d)->m)
#define MIN_NONE(a, b, c, d, dw) _mm_setzero_ps()
/* The tile of 4 weight rows x 1 activation row (one-token steps), in two passes over chunks of
 * up to 64 blocks: the integer sums row after row (each row's blocks read in order: the
 * weights stream from memory as in a plain dot, where a 4-row tile's 4 interleaved streams
 * were twice as slow for a large matrix), then the float steps of TILE_A32 for the 4 rows in
 * the lanes, block after block: the same bits as TILE_A32 with NC = 1. */
#define ROWS4_CHUNK 64
#define ROWS4_A32(NAME, TYPE, UNPACK, MIN, DOT)                                                    \
    static void NAME(int64_t n, const uint8_t *w, int64_t rb, const uint8_t *a, size_t ar, float *y,  \
                     int64_t ldy) {                                                                \
        (void)ar; (void)ldy;                                                                       \
        const rx_a32 *ya = (const rx_a32 *)a;                                                      \
        const TYPE *x0 = (const TYPE *)w, *x1 = (const TYPE *)(w + rb);                              \
        const TYPE *x2 = (const TYPE *)(w + 2 * rb), *x3 = (const TYPE *)(w + 3 * rb);               \
        __m128 acc = _mm_setzero_ps();                                                             \
        int64_t nb = n / 32;                                                                       \
        _Alignas(16) int32_t s[4][ROWS4_CHUNK];                                                    \
        for (int64_t b0 = 0; b0 < nb; b0 += ROWS4_CHUNK) {                                         \
            int64_t nc = nb - b0 < ROWS4_CHUNK ? nb - b0 : ROWS4_CHUNK;                            \
            for (int i = 0; i < 4; i++) {                                                          \
                const TYPE *x = (const TYPE *)(w + i * rb) + b0;                                   \
                const rx_a32 *yb = ya + b0;                                                        \
                int64_t b = 0;                                                                     \
                for (; b + 4 <= nc; b += 4)                                                        \
                    _mm_store_si128((__m128i *)(s[i] + b),                                          \
                        hsum4x8(DOT(UNPACK(x + b), _mm256_loadu_si256((const __m256i *)yb[b].q)),   \
                                DOT(UNPACK(x + b + 1), _mm256_loadu_si256((const __m256i *)yb[b + 1].q)), \
                                DOT(UNPACK(x + b + 2), _mm256_loadu_si256((const __m256i *)yb[b + 2].q)), \
                                DOT(UNPACK(x + b + 3), _mm256_loadu_si256((const __m256i *)yb[b + 3].q)))); \
                for (; b < nc; b++)                                                                \
                    s[i][b] = hsum_i32x8(DOT(UNPACK(x + b), _mm256_loadu_si256((const __m256i *)yb[b].q))); \
            }                                                                                      \
            for (int64_t k = 0; k < nc; k++) {                                                     \
                int64_t b = b0 + k;                                                                \
                __m128 dw = half4(x0[b].d, x1[b].d, x2[b].d, x3[b].d);                              \
                __m128 mw = MIN(x0 + b, x1 + b, x2 + b, x3 + b, dw);                                \
                __m128 sf = _mm_cvtepi32_ps(_mm_setr_epi32(s[0][k], s[1][k], s[2][k], s[3][k]));   \
                acc = _mm_fmadd_ps(_mm_mul_ps(dw, _mm_set1_ps(ya[b].d)), sf, acc);                 \
                acc = _mm_fmadd_ps(mw, _mm_set1_ps(ya[b].s), acc);                                 \
            }                                                                                      \
        }                                                                                          \
        _mm_storeu_ps(y, acc);                                                                     \
    }

#define TILES_A32(NAME, TYPE, UNPACK, MIN, DOT)                                                    \
    TILE_A32(NAME, 4, TYPE, UNPACK, MIN, DOT)                                                      \
    TILE_A32(NAME##_8, 8, TYPE, UNPACK, MIN, DOT)                                                 \
    ROWS4_A32(NAME##_1, TYPE, UNPACK, MIN, DOT)                                                    \
    TILE_A32(NAME##_2, 2, TYPE, UNPACK, MIN, DOT)                                                  \
    TILE_A32(NAME##_3, 3, TYPE, UNPACK, MIN, DOT)
TILES_A32(tile_q4_0, rx_q4_0, UNPACK_Q4_0, MIN_OFF8, dot_us)
TILES_A32(tile_q4_1, rx_q4_1, UNPACK_Q4_1, MIN_M, dot_us)
TILES_A32(tile_q5_0, rx_q5_0, UNPACK_Q5_0, MIN_OFF16, dot_us)
TILES_A32(tile_q5_1, rx_q5_1, UNPACK_Q5_1, MIN_M, dot_us)
#ifdef RX_VNNI /* int8 weights + 128 as unsigned bytes: VPDPBUSD has no 16-bit saturation */
#define UNPACK_Q8_0(x) _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(x)->qs), _mm256_set1_epi8((char)0x80))
#define MIN_OFF128(a, b, c, d, dw) _mm_mul_ps(dw, _mm_set1_ps(-128.f))
TILES_A32(tile_q8_0, rx_q8_0, UNPACK_Q8_0, MIN_OFF128, dot_us)
#else
#define UNPACK_Q8_0(x) _mm256_loadu_si256((const __m256i *)(x)->qs)
TILES_A32(tile_q8_0, rx_q8_0, UNPACK_Q8_0, MIN_NONE, dot_ss)
#endif


/* ---------------------------------------------------------------- rows the tiles' way
 * A single dot (one-token steps, the rows a tile leaves over) and dot2 compute each output
 * the way the tiles and panels compute their lanes, so that a row's result does not depend
 * on the batch it is in: the block's values unpacked as the tile's (unsigned + offset / min),
 * the block's integer sum (exact, in any order), then per block, in block order,
 * acc = fma(d_w * d_a, sum, acc); acc = fma(m_w, s_a, acc) (m_w: the offset / min term). */

#define MIN1_OFF8(x, dw) ((dw) * -8.f)
#define MIN1_OFF16(x, dw) ((dw) * -16.f)
#define MIN1_OFF128(x, dw) ((dw) * -128.f)
#define MIN1_M(x, dw) half1((x)->m)
#define MIN1_NONE(x, dw) 0.f

/* NR (1, 2) activation rows against one weight row, 4 blocks at a time (their integer sums
 * reduced together, then the float steps block after block) */
#define ROW_A32(NAME, TYPE, UNPACK, MIN, MIN1, DOT)                                                \
    static inline __attribute__((always_inline)) void NAME##_n(int64_t n, const TYPE *x,              \
                                                               const rx_a32 *const *y, int nr,        \
                                                               float *out) {                          \
        float acc[2] = {0.f, 0.f};                                                                 \
        int64_t nb = n / 32, b = 0;                                                                \
        for (; b + 4 <= nb; b += 4) {                                                              \
            __m256i q0 = UNPACK(x + b), q1 = UNPACK(x + b + 1), q2 = UNPACK(x + b + 2), q3 = UNPACK(x + b + 3); \
            __m128 dw = half4(x[b].d, x[b + 1].d, x[b + 2].d, x[b + 3].d);                          \
            float mw[4];                                                                           \
            _mm_storeu_ps(mw, MIN(x + b, x + b + 1, x + b + 2, x + b + 3, dw));                    \
            for (int r = 0; r < nr; r++) {                                                         \
                const rx_a32 *a = y[r] + b;                                                        \
                __m128i si = hsum4x8(DOT(q0, _mm256_loadu_si256((const __m256i *)a[0].q)),          \
                                     DOT(q1, _mm256_loadu_si256((const __m256i *)a[1].q)),          \
                                     DOT(q2, _mm256_loadu_si256((const __m256i *)a[2].q)),          \
                                     DOT(q3, _mm256_loadu_si256((const __m256i *)a[3].q)));         \
                float s[4], f[4];                                                                  \
                _mm_storeu_ps(s, _mm_cvtepi32_ps(si));                                             \
                _mm_storeu_ps(f, _mm_mul_ps(dw, _mm_setr_ps(a[0].d, a[1].d, a[2].d, a[3].d)));     \
                float t = acc[r];                                                                  \
                for (int k = 0; k < 4; k++) {                                                      \
                    t = fmaf(f[k], s[k], t);                                                       \
                    t = fmaf(mw[k], a[k].s, t);                                                    \
                }                                                                                  \
                acc[r] = t;                                                                        \
            }                                                                                      \
        }                                                                                          \
        for (; b < nb; b++) {                                                                      \
            __m256i q = UNPACK(x + b);                                                             \
            float dw = half1(x[b].d), mw = MIN1(x + b, dw);                                        \
            for (int r = 0; r < nr; r++) {                                                         \
                const rx_a32 *a = y[r] + b;                                                        \
                float s = (float)hsum_i32x8(DOT(q, _mm256_loadu_si256((const __m256i *)a->q)));    \
                acc[r] = fmaf(dw * a->d, s, acc[r]);                                               \
                acc[r] = fmaf(mw, a->s, acc[r]);                                                   \
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
ROW_A32(dot_q4_0, rx_q4_0, UNPACK_Q4_0, MIN_OFF8, MIN1_OFF8, dot_us)
ROW_A32(dot_q4_1, rx_q4_1, UNPACK_Q4_1, MIN_M, MIN1_M, dot_us)
ROW_A32(dot_q5_0, rx_q5_0, UNPACK_Q5_0, MIN_OFF16, MIN1_OFF16, dot_us)
ROW_A32(dot_q5_1, rx_q5_1, UNPACK_Q5_1, MIN_M, MIN1_M, dot_us)
#ifdef RX_VNNI
ROW_A32(dot_q8_0, rx_q8_0, UNPACK_Q8_0, MIN_OFF128, MIN1_OFF128, dot_us)
#else
ROW_A32(dot_q8_0, rx_q8_0, UNPACK_Q8_0, MIN_NONE, MIN1_NONE, dot_ss)
#endif

/* the 8 six-bit scales of a Q4_K/Q5_K block, and sum_j min_j * (activation sum of j) */
static inline int k_scales(const uint8_t *scales, const int16_t *bsum, uint8_t *sc) {
    int summ = 0;
    for (int j = 0; j < 8; j++) {
        uint8_t d, m;
        rx_k4_scale_min(j, scales, &d, &m);
        sc[j] = d;
        summ += m * (bsum[2 * j] + bsum[2 * j + 1]);
    }
    return summ;
}

/* u8 x s8 over 32 bytes, each 16-bit pair sum times a per-lane int16 scale -> 8 int32 */
static inline __m256i dot_us_scaled(__m256i u, __m256i s, __m256i scale16) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), scale16);
}

static float dot_q5_k(int64_t n, const void *w, const void *a) {
    const rx_q5_k *x = w; const rx_a256 *y = a;
    __m256 acc = _mm256_setzero_ps();
    float accm = 0.f;
    const __m256i m4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    for (int64_t b = 0; b < n / 256; b++) {
        uint8_t sc[8];
        int summ = k_scales(x[b].scales, y[b].bsum, sc);
        __m256i hb = _mm256_loadu_si256((const __m256i *)x[b].qh);
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(x[b].qs + 32 * j));
            __m256i h0 = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * j)), one);
            __m256i h1 = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * j + 1)), one);
            __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4), _mm256_slli_epi16(h0, 4));
            __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), _mm256_slli_epi16(h1, 4));
            __m256i p0 = _mm256_loadu_si256((const __m256i *)(y[b].q + 64 * j));
            __m256i p1 = _mm256_loadu_si256((const __m256i *)(y[b].q + 64 * j + 32));
            sumi = _mm256_add_epi32(sumi, dot_us_scaled(lo, p0, _mm256_set1_epi16(sc[2 * j])));
            sumi = _mm256_add_epi32(sumi, dot_us_scaled(hi, p1, _mm256_set1_epi16(sc[2 * j + 1])));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(y[b].d * half1(x[b].d)), _mm256_cvtepi32_ps(sumi), acc);
        accm += y[b].d * half1(x[b].dmin) * (float)summ;
    }
    return hsum8(acc) - accm;
}

/* K-quant tiles: per super-block, the int32 sums of scale_g * (group g of the weights . the
 * activations) for the 16 (row, activation) pairs, reduced to one 4-lane vector per
 * activation row; the mins (Q4_K) / the -32 offset (Q6_K) through the activations' group
 * sums, as in the dot products above. */
static inline __m256i acc_scaled(__m256i acc, __m256i p16, __m256i scale16) {
#ifdef RX_VNNI
    return _mm256_dpwssd_epi32(acc, p16, scale16);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p16, scale16));
#endif
}

/* [sum of a0's 4 lanes, a1's, a2's, a3's] */
static inline __m128i hsum4x4(__m128i a0, __m128i a1, __m128i a2, __m128i a3) {
    return _mm_hadd_epi32(_mm_hadd_epi32(a0, a1), _mm_hadd_epi32(a2, a3));
}

static inline __attribute__((always_inline)) void tile_q4_k_n(int64_t n, const uint8_t *w, int64_t rb,
        const uint8_t *a, size_t ar, float *y, int64_t ldy, int nc) {
    const rx_q4_k *x[4] = {(const rx_q4_k *)w, (const rx_q4_k *)(w + rb), (const rx_q4_k *)(w + 2 * rb),
                           (const rx_q4_k *)(w + 3 * rb)};
    const rx_a256 *yv[4] = {(const rx_a256 *)a, (const rx_a256 *)(a + ar * (nc > 1)),
                            (const rx_a256 *)(a + 2 * ar * (nc > 2)), (const rx_a256 *)(a + 3 * ar * (nc > 3))};
    __m128 acc[4] = {_mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps()};
    const __m256i m4 = _mm256_set1_epi8(15);
    for (int64_t b = 0; b < n / 256; b++) {
        uint8_t sc[4][8], mn[4][8];
        for (int i = 0; i < 4; i++) {
            _mm_prefetch((const char *)(x[i] + b) + PF_ROWS(nc) * rb, _MM_HINT_T0);
            _mm_prefetch((const char *)(x[i] + b) + PF_ROWS(nc) * rb + 64, _MM_HINT_T0);
            _mm_prefetch((const char *)(x[i] + b) + PF_ROWS(nc) * rb + 128, _MM_HINT_T0);
            for (int g = 0; g < 8; g++) rx_k4_scale_min(g, x[i][b].scales, &sc[i][g], &mn[i][g]);
        }
        __m256i s[4][4];
        for (int i = 0; i < 4; i++)
            for (int c = 0; c < nc; c++) s[i][c] = _mm256_setzero_si256();
        for (int g2 = 0; g2 < 4; g2++) { /* 32 bytes: groups 2 g2 (low nibbles), 2 g2 + 1 (high) */
            __m256i lo[4], hi[4];
            for (int i = 0; i < 4; i++) {
                __m256i q = _mm256_loadu_si256((const __m256i *)(x[i][b].qs + 32 * g2));
                lo[i] = _mm256_and_si256(q, m4);
                hi[i] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            }
            for (int c = 0; c < nc; c++) {
                __m256i p0 = _mm256_loadu_si256((const __m256i *)(yv[c][b].q + 64 * g2));
                __m256i p1 = _mm256_loadu_si256((const __m256i *)(yv[c][b].q + 64 * g2 + 32));
                for (int i = 0; i < 4; i++) {
                    s[i][c] = acc_scaled(s[i][c], _mm256_maddubs_epi16(lo[i], p0), _mm256_set1_epi16(sc[i][2 * g2]));
                    s[i][c] = acc_scaled(s[i][c], _mm256_maddubs_epi16(hi[i], p1), _mm256_set1_epi16(sc[i][2 * g2 + 1]));
                }
            }
        }
        __m128 d = half4(x[0][b].d, x[1][b].d, x[2][b].d, x[3][b].d);
        __m128 dmin = half4(x[0][b].dmin, x[1][b].dmin, x[2][b].dmin, x[3][b].dmin);
        __m128i mins[4];
        for (int i = 0; i < 4; i++)
            mins[i] = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn[i]));
        for (int c = 0; c < nc; c++) {
            const int16_t *bs = yv[c][b].bsum;
            /* pair sums of the 16 group sums: the activation sum of each group of 32 */
            __m128i b01 = _mm_loadu_si128((const __m128i *)bs), b23 = _mm_loadu_si128((const __m128i *)(bs + 8));
            __m128i pairs = _mm_packs_epi32(_mm_madd_epi16(b01, _mm_set1_epi16(1)), _mm_madd_epi16(b23, _mm_set1_epi16(1)));
            __m128i summ = hsum4x4(_mm_madd_epi16(mins[0], pairs), _mm_madd_epi16(mins[1], pairs),
                                   _mm_madd_epi16(mins[2], pairs), _mm_madd_epi16(mins[3], pairs));
            __m128i sumi = hsum4x8(s[0][c], s[1][c], s[2][c], s[3][c]);
            __m128 t = _mm_sub_ps(_mm_mul_ps(d, _mm_cvtepi32_ps(sumi)), _mm_mul_ps(dmin, _mm_cvtepi32_ps(summ)));
            acc[c] = _mm_fmadd_ps(_mm_set1_ps(yv[c][b].d), t, acc[c]);
        }
    }
    for (int c = 0; c < nc; c++) _mm_storeu_ps(y + c * ldy, acc[c]);
}

static void tile_q4_k(int64_t n, const uint8_t *w, int64_t rb, const uint8_t *a, size_t ar, float *y, int64_t ldy) {
    tile_q4_k_n(n, w, rb, a, ar, y, ldy, 4);
}
static void tile_q4_k_2(int64_t n, const uint8_t *w, int64_t rb, const uint8_t *a, size_t ar, float *y, int64_t ldy) {
    tile_q4_k_n(n, w, rb, a, ar, y, ldy, 2);
}
static void tile_q4_k_3(int64_t n, const uint8_t *w, int64_t rb, const uint8_t *a, size_t ar, float *y, int64_t ldy) {
    tile_q4_k_n(n, w, rb, a, ar, y, ldy, 3);
}

static inline __attribute__((always_inline)) void tile_q6_k_n(int64_t n, const uint8_t *w, int64_t rb,
        const uint8_t *a, size_t ar, float *y, int64_t ldy, int nc) {
    const rx_q6_k *x[4] = {(const rx_q6_k *)w, (const rx_q6_k *)(w + rb), (const rx_q6_k *)(w + 2 * rb),
                           (const rx_q6_k *)(w + 3 * rb)};
    const rx_a256 *yv[4] = {(const rx_a256 *)a, (const rx_a256 *)(a + ar * (nc > 1)),
                            (const rx_a256 *)(a + 2 * ar * (nc > 2)), (const rx_a256 *)(a + 3 * ar * (nc > 3))};
    __m128 acc[4] = {_mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps()};
    const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3);
    for (int64_t b = 0; b < n / 256; b++) {
        __m256i s[4][4];
        for (int i = 0; i < 4; i++) {
            for (int k = 0; k < 210; k += 64) _mm_prefetch((const char *)(x[i] + b) + PF_ROWS(nc) * rb + k, _MM_HINT_T0);
            for (int c = 0; c < nc; c++) s[i][c] = _mm256_setzero_si256();
        }
        for (int h = 0; h < 2; h++) {
            for (int part = 0; part < 4; part++) { /* 32 values: part 0..3 of the half (q1..q4) */
                __m256i q[4], scale[4];
                for (int i = 0; i < 4; i++) {
                    const uint8_t *ql = x[i][b].ql + 64 * h;
                    __m256i qh = _mm256_loadu_si256((const __m256i *)(x[i][b].qh + 32 * h));
                    __m256i l = _mm256_loadu_si256((const __m256i *)(ql + (part & 1) * 32));
                    __m256i lv = part < 2 ? _mm256_and_si256(l, m4) : _mm256_and_si256(_mm256_srli_epi16(l, 4), m4);
                    __m256i hv = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * part)), m2);
                    q[i] = _mm256_or_si256(lv, _mm256_slli_epi16(hv, 4));
                    const int8_t *sc = x[i][b].scales + 8 * h + 2 * part;
                    scale[i] = _mm256_set_m128i(_mm_set1_epi16(sc[1]), _mm_set1_epi16(sc[0]));
                }
                for (int c = 0; c < nc; c++) {
                    __m256i p = _mm256_loadu_si256((const __m256i *)(yv[c][b].q + 128 * h + 32 * part));
                    for (int i = 0; i < 4; i++) s[i][c] = acc_scaled(s[i][c], _mm256_maddubs_epi16(q[i], p), scale[i]);
                }
            }
        }
        __m128 d = half4(x[0][b].d, x[1][b].d, x[2][b].d, x[3][b].d);
        for (int c = 0; c < nc; c++) {
            /* the -32 offset: 32 * sum_g scale_g * (activation sum of group g) */
            __m128i b0 = _mm_loadu_si128((const __m128i *)yv[c][b].bsum);
            __m128i b1 = _mm_loadu_si128((const __m128i *)(yv[c][b].bsum + 8));
            __m128i cr[4];
            for (int i = 0; i < 4; i++) {
                __m128i sc = _mm_loadu_si128((const __m128i *)x[i][b].scales);
                __m128i s0 = _mm_cvtepi8_epi16(sc), s1 = _mm_cvtepi8_epi16(_mm_srli_si128(sc, 8));
                cr[i] = _mm_add_epi32(_mm_madd_epi16(s0, b0), _mm_madd_epi16(s1, b1));
            }
            __m128i corr = hsum4x4(cr[0], cr[1], cr[2], cr[3]);
            __m128i sumi = _mm_sub_epi32(hsum4x8(s[0][c], s[1][c], s[2][c], s[3][c]), _mm_slli_epi32(corr, 5));
            acc[c] = _mm_fmadd_ps(_mm_mul_ps(d, _mm_set1_ps(yv[c][b].d)), _mm_cvtepi32_ps(sumi), acc[c]);
        }
    }
    for (int c = 0; c < nc; c++) _mm_storeu_ps(y + c * ldy, acc[c]);
}

static void tile_q6_k(int64_t n, const uint8_t *w, int64_t rb, const uint8_t *a, size_t ar, float *y, int64_t ldy) {
    tile_q6_k_n(n, w, rb, a, ar, y, ldy, 4);
}
static void tile_q6_k_2(int64_t n, const uint8_t *w, int64_t rb, const uint8_t *a, size_t ar, float *y, int64_t ldy) {
    tile_q6_k_n(n, w, rb, a, ar, y, ldy, 2);
}
static void tile_q6_k_3(int64_t n, const uint8_t *w, int64_t rb, const uint8_t *a, size_t ar, float *y, int64_t ldy) {
    tile_q6_k_n(n, w, rb, a, ar, y, ldy, 3);
}


/* Q4_K / Q6_K rows the tiles' way: per super-block the exact integer sums (plain adds: one
 * row has no other sums to hide a chain of VPDPWSSD's latency behind), then that lane's float
 * steps of tile_q4_k / tile_q6_k */
static inline __attribute__((always_inline)) void q4k_ints(const rx_q4_k *x, const rx_a256 *y, int32_t *sumi,
                                                           int32_t *summ) {
    const __m256i m4 = _mm256_set1_epi8(15);
    uint8_t sc[8], mn[8];
    for (int g = 0; g < 8; g++) rx_k4_scale_min(g, x->scales, &sc[g], &mn[g]);
    __m256i s = _mm256_setzero_si256();
    for (int j = 0; j < 4; j++) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * j));
        __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        const int8_t *p = y->q + 64 * j;
        s = _mm256_add_epi32(s, dot_us_scaled(lo, _mm256_loadu_si256((const __m256i *)p), _mm256_set1_epi16(sc[2 * j])));
        s = _mm256_add_epi32(s, dot_us_scaled(hi, _mm256_loadu_si256((const __m256i *)(p + 32)),
                                              _mm256_set1_epi16(sc[2 * j + 1])));
    }
    int m = 0;
    for (int j = 0; j < 8; j++) m += mn[j] * (y->bsum[2 * j] + y->bsum[2 * j + 1]);
    *sumi = hsum_i32x8(s);
    *summ = m;
}

/* the super-block's integer sum with the -32 offset: sum_g scale_g (q_g . p_g) - 32 sum_g scale_g bsum_g */
static inline __attribute__((always_inline)) int32_t q6k_int(const rx_q6_k *x, const rx_a256 *y) {
    const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3);
    const int8_t *sc = x->scales;
    __m256i s = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = x->ql + 64 * h;
        __m256i qh = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
        __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
        __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
        __m256i q[4];
        q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4));
        q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4));
        q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4));
        q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4));
        for (int i = 0; i < 4; i++) {
            const int8_t *si = sc + 8 * h + 2 * i;
            __m256i scale = _mm256_set_m128i(_mm_set1_epi16(si[1]), _mm_set1_epi16(si[0]));
            __m256i pv = _mm256_loadu_si256((const __m256i *)(y->q + 128 * h + 32 * i));
            s = _mm256_add_epi32(s, dot_us_scaled(q[i], pv, scale));
        }
    }
    int corr = 0;
    for (int g = 0; g < 16; g++) corr += sc[g] * y->bsum[g];
    return hsum_i32x8(s) - corr * 32;
}

static inline __attribute__((always_inline)) void q4k_n(int64_t n, const rx_q4_k *x, const rx_a256 *const *y,
                                                        int nr, float *out) {
    float acc[2] = {0.f, 0.f};
    for (int64_t b = 0; b < n / 256; b++) {
        float d = half1(x[b].d), dmin = half1(x[b].dmin);
        for (int r = 0; r < nr; r++) {
            int32_t si, sm;
            q4k_ints(x + b, y[r] + b, &si, &sm);
            float t = d * (float)si - dmin * (float)sm;
            acc[r] = fmaf(y[r][b].d, t, acc[r]);
        }
    }
    for (int r = 0; r < nr; r++) out[r] = acc[r];
}

static inline __attribute__((always_inline)) void q6k_n(int64_t n, const rx_q6_k *x, const rx_a256 *const *y,
                                                        int nr, float *out) {
    float acc[2] = {0.f, 0.f};
    for (int64_t b = 0; b < n / 256; b++) {
        float d = half1(x[b].d);
        for (int r = 0; r < nr; r++) acc[r] = fmaf(d * y[r][b].d, (float)q6k_int(x + b, y[r] + b), acc[r]);
    }
    for (int r = 0; r < nr; r++) out[r] = acc[r];
}

/* 4 weight rows x 1 activation row (one-token steps) as ROWS4_A32: the integer sums row after
 * row, then the tile's float steps with the 4 rows in the lanes (tile_q4_k / tile_q6_k, NC = 1) */
static void tile_q4_k_1(int64_t n, const uint8_t *w, int64_t rb, const uint8_t *a, size_t ar, float *y,
                        int64_t ldy) {
    (void)ar; (void)ldy;
    const rx_a256 *ya = (const rx_a256 *)a;
    const rx_q4_k *x[4] = {(const rx_q4_k *)w, (const rx_q4_k *)(w + rb), (const rx_q4_k *)(w + 2 * rb),
                           (const rx_q4_k *)(w + 3 * rb)};
    __m128 acc = _mm_setzero_ps();
    int64_t nb = n / 256;
    _Alignas(16) int32_t si[4][16], sm[4][16];
    for (int64_t b0 = 0; b0 < nb; b0 += 16) {
        int64_t nc = nb - b0 < 16 ? nb - b0 : 16;
        for (int i = 0; i < 4; i++)
            for (int64_t k = 0; k < nc; k++) q4k_ints(x[i] + b0 + k, ya + b0 + k, &si[i][k], &sm[i][k]);
        for (int64_t k = 0; k < nc; k++) {
            int64_t b = b0 + k;
            __m128 d = half4(x[0][b].d, x[1][b].d, x[2][b].d, x[3][b].d);
            __m128 dmin = half4(x[0][b].dmin, x[1][b].dmin, x[2][b].dmin, x[3][b].dmin);
            __m128 S = _mm_cvtepi32_ps(_mm_setr_epi32(si[0][k], si[1][k], si[2][k], si[3][k]));
            __m128 M = _mm_cvtepi32_ps(_mm_setr_epi32(sm[0][k], sm[1][k], sm[2][k], sm[3][k]));
            __m128 t = _mm_sub_ps(_mm_mul_ps(d, S), _mm_mul_ps(dmin, M));
            acc = _mm_fmadd_ps(_mm_set1_ps(ya[b].d), t, acc);
        }
    }
    _mm_storeu_ps(y, acc);
}

static void tile_q6_k_1(int64_t n, const uint8_t *w, int64_t rb, const uint8_t *a, size_t ar, float *y,
                        int64_t ldy) {
    (void)ar; (void)ldy;
    const rx_a256 *ya = (const rx_a256 *)a;
    const rx_q6_k *x[4] = {(const rx_q6_k *)w, (const rx_q6_k *)(w + rb), (const rx_q6_k *)(w + 2 * rb),
                           (const rx_q6_k *)(w + 3 * rb)};
    __m128 acc = _mm_setzero_ps();
    int64_t nb = n / 256;
    _Alignas(16) int32_t si[4][16];
    for (int64_t b0 = 0; b0 < nb; b0 += 16) {
        int64_t nc = nb - b0 < 16 ? nb - b0 : 16;
        for (int i = 0; i < 4; i++)
            for (int64_t k = 0; k < nc; k++) si[i][k] = q6k_int(x[i] + b0 + k, ya + b0 + k);
        for (int64_t k = 0; k < nc; k++) {
            int64_t b = b0 + k;
            __m128 d = half4(x[0][b].d, x[1][b].d, x[2][b].d, x[3][b].d);
            __m128 S = _mm_cvtepi32_ps(_mm_setr_epi32(si[0][k], si[1][k], si[2][k], si[3][k]));
            acc = _mm_fmadd_ps(_mm_mul_ps(d, _mm_set1_ps(ya[b].d)), S, acc);
        }
    }
    _mm_storeu_ps(y, acc);
}

static float dot_q4_k(int64_t n, const void *w, const void *a) {
    const rx_a256 *y[1] = {a};
    float o;
    q4k_n(n, w, y, 1, &o);
    return o;
}

static void dot2_q4_k(int64_t n, const void *w, const void *a0, const void *a1, float *out) {
    const rx_a256 *y[2] = {a0, a1};
    q4k_n(n, w, y, 2, out);
}

static float dot_q6_k(int64_t n, const void *w, const void *a) {
    const rx_a256 *y[1] = {a};
    float o;
    q6k_n(n, w, y, 1, &o);
    return o;
}

static void dot2_q6_k(int64_t n, const void *w, const void *a0, const void *a1, float *out) {
    const rx_a256 *y[2] = {a0, a1};
    q6k_n(n, w, y, 2, out);
}


/* ---------------------------------------------------------------- panels (rx_cpu.h)
 * PM weight rows a panel: 16 with AVX-512 (512-bit vectors, one lane a row), else 8. A panel
 * holds, per weight block, the rows' values as unsigned bytes in groups of 4 (group g: values
 * 4g..4g+3 of row 0, of row 1, ...: PM * 4 bytes, one vector), then the format's per-row
 * numbers, each as one vector of PM lanes:
 *   32-value formats: 8 groups, d, the offset term m (value = d * u + m) as floats;
 *   Q4_K: 64 groups, the 8 sub-block scales as int32, the mins as int16 pairs (m_2k, m_2k+1)
 *         [4], d, dmin;
 *   Q6_K: 64 groups, the 16 scales as int32, as int16 pairs (sc_2k, sc_2k+1) [8], d.
 * The products: one multiply-add of a group vector with a broadcast 4-byte group of the
 * activations gives every row's partial sum in its lane; the integer sums are the tiles'
 * (exact), and the float steps per lane are the tiles', in their order, so the results are
 * the tiles' bit for bit. */
#ifdef RX_VNNI
#define PM 16
typedef __m512i vi;
typedef __m512 vf;
#define VI_LOAD(p) _mm512_loadu_si512((const void *)(p))
#define VF_LOAD(p) _mm512_loadu_ps(p)
#define VF_STORE(p, v) _mm512_storeu_ps(p, v)
#define VI_ZERO() _mm512_setzero_si512()
#define VF_ZERO() _mm512_setzero_ps()
#define VI_SET1(x) _mm512_set1_epi32(x)
#define VF_SET1(x) _mm512_set1_ps(x)
#define VI_ADD(a, b) _mm512_add_epi32(a, b)
#define VI_SUB(a, b) _mm512_sub_epi32(a, b)
#define VI_SLLI(a, k) _mm512_slli_epi32(a, k)
#define VI_MULLO(a, b) _mm512_mullo_epi32(a, b)
#define VF_CVT(a) _mm512_cvtepi32_ps(a)
#define VF_MUL(a, b) _mm512_mul_ps(a, b)
#define VF_SUB(a, b) _mm512_sub_ps(a, b)
#define VF_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VDPB(acc, u, s) _mm512_dpbusd_epi32(acc, u, s)
#define VDPW(acc, a, b) _mm512_dpwssd_epi32(acc, a, b)
static inline vf vf_half(const rx_half *h) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h)); }
static inline void panel_store(float *y, vf v, int rows, int accumulate) {
    __mmask16 m = rows >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << rows) - 1);
    if (accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, y), v);
    _mm512_mask_storeu_ps(y, m, v);
}
#else
#define PM 8
typedef __m256i vi;
typedef __m256 vf;
#define VI_LOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define VF_LOAD(p) _mm256_loadu_ps(p)
#define VF_STORE(p, v) _mm256_storeu_ps(p, v)
#define VI_ZERO() _mm256_setzero_si256()
#define VF_ZERO() _mm256_setzero_ps()
#define VI_SET1(x) _mm256_set1_epi32(x)
#define VF_SET1(x) _mm256_set1_ps(x)
#define VI_ADD(a, b) _mm256_add_epi32(a, b)
#define VI_SUB(a, b) _mm256_sub_epi32(a, b)
#define VI_SLLI(a, k) _mm256_slli_epi32(a, k)
#define VI_MULLO(a, b) _mm256_mullo_epi32(a, b)
#define VF_CVT(a) _mm256_cvtepi32_ps(a)
#define VF_MUL(a, b) _mm256_mul_ps(a, b)
#define VF_SUB(a, b) _mm256_sub_ps(a, b)
#define VF_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VDPB(acc, u, s) _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)))
#define VDPW(acc, a, b) _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
static inline vf vf_half(const rx_half *h) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h)); }
static inline void panel_store(float *y, vf v, int rows, int accumulate) {
    if (rows == 8) {
        if (accumulate) v = _mm256_add_ps(_mm256_loadu_ps(y), v);
        _mm256_storeu_ps(y, v);
        return;
    }
    float t[8];
    _mm256_storeu_ps(t, v);
    for (int r = 0; r < rows; r++) y[r] = accumulate ? y[r] + t[r] : t[r];
}
#endif
/* signed weights (AVX2 Q8_0): the sign of w moved onto the activations */
#define VDPB_SS(acc, w, s) VDPB(acc, _mm256_sign_epi8(w, w), _mm256_sign_epi8(s, w))

#define PG (PM * 4)                              /* bytes of one group vector */
#define PANEL_A32_BYTES (8 * PG + 2 * PM * 4)
#define PANEL_Q4K_BYTES (64 * PG + 8 * PM * 4 + 4 * PM * 4 + 2 * PM * 4)
#define PANEL_Q6K_BYTES (64 * PG + 16 * PM * 4 + 8 * PM * 4 + PM * 4)

/* rows[0..7] (32 bytes each) -> out + g * stride = dword g of the 8 rows: an 8x8 transpose */
static inline void transpose8(const __m256i r[8], uint8_t *out, int64_t stride) {
    __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]), t1 = _mm256_unpackhi_epi32(r[0], r[1]);
    __m256i t2 = _mm256_unpacklo_epi32(r[2], r[3]), t3 = _mm256_unpackhi_epi32(r[2], r[3]);
    __m256i t4 = _mm256_unpacklo_epi32(r[4], r[5]), t5 = _mm256_unpackhi_epi32(r[4], r[5]);
    __m256i t6 = _mm256_unpacklo_epi32(r[6], r[7]), t7 = _mm256_unpackhi_epi32(r[6], r[7]);
    __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
    __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
    __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
    __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
    /* u0 = [r0.0 r1.0 r2.0 r3.0 | r0.4 r1.4 r2.4 r3.4], u4 the same of rows 4..7 */
    _mm256_storeu_si256((__m256i *)(out + 0 * stride), _mm256_permute2x128_si256(u0, u4, 0x20));
    _mm256_storeu_si256((__m256i *)(out + 1 * stride), _mm256_permute2x128_si256(u1, u5, 0x20));
    _mm256_storeu_si256((__m256i *)(out + 2 * stride), _mm256_permute2x128_si256(u2, u6, 0x20));
    _mm256_storeu_si256((__m256i *)(out + 3 * stride), _mm256_permute2x128_si256(u3, u7, 0x20));
    _mm256_storeu_si256((__m256i *)(out + 4 * stride), _mm256_permute2x128_si256(u0, u4, 0x31));
    _mm256_storeu_si256((__m256i *)(out + 5 * stride), _mm256_permute2x128_si256(u1, u5, 0x31));
    _mm256_storeu_si256((__m256i *)(out + 6 * stride), _mm256_permute2x128_si256(u2, u6, 0x31));
    _mm256_storeu_si256((__m256i *)(out + 7 * stride), _mm256_permute2x128_si256(u3, u7, 0x31));
}

/* u[r] (32 unsigned bytes of each of the PM rows) -> the 8 group vectors at p */
static inline void transpose_rows(const __m256i u[PM], uint8_t *p) {
    for (int h = 0; h < PM / 8; h++) transpose8(u + 8 * h, p + 32 * h, PG);
}

static inline void store_half_f(uint8_t *p, const rx_half *h) { VF_STORE((float *)p, vf_half(h)); }

/* UNPACK / MIN as the tiles' (MIN from the vector of the rows' d); the missing rows are zeros */
#define PACK_A32(NAME, TYPE, UNPACK, MIN, HAS_M)                                                   \
    static void NAME(int64_t n, const uint8_t *w, int64_t rb, int rows, void *panel) {              \
        uint8_t *p = panel;                                                                        \
        for (int64_t b = 0; b < n / 32; b++, p += PANEL_A32_BYTES) {                               \
            __m256i r[PM];                                                                         \
            rx_half d[PM], m[PM];                                                                  \
            for (int i = 0; i < PM; i++) {                                                         \
                if (i < rows) {                                                                    \
                    const TYPE *x = (const TYPE *)(w + i * rb) + b;                                \
                    r[i] = UNPACK(x);                                                              \
                    d[i] = x->d;                                                                   \
                    m[i] = HAS_M ? x->d2m : 0;                                                     \
                } else {                                                                           \
                    r[i] = _mm256_setzero_si256();                                                 \
                    d[i] = m[i] = 0;                                                               \
                }                                                                                  \
            }                                                                                      \
            transpose_rows(r, p);                                                                  \
            vf dw = vf_half(d);                                                                    \
            VF_STORE((float *)(p + 8 * PG), dw);                                                   \
            VF_STORE((float *)(p + 8 * PG + PM * 4), MIN(dw, m));                                  \
        }                                                                                          \
    }

#define MINV_OFF8(dw, m) VF_MUL(dw, VF_SET1(-8.f))
#define MINV_OFF16(dw, m) VF_MUL(dw, VF_SET1(-16.f))
#define MINV_OFF128(dw, m) VF_MUL(dw, VF_SET1(-128.f))
#define MINV_M(dw, m) vf_half(m)
#define MINV_NONE(dw, m) VF_ZERO()
#define d2m d
PACK_A32(pack_q4_0, rx_q4_0, UNPACK_Q4_0, MINV_OFF8, 0)
PACK_A32(pack_q5_0, rx_q5_0, UNPACK_Q5_0, MINV_OFF16, 0)
#ifdef RX_VNNI
PACK_A32(pack_q8_0, rx_q8_0, UNPACK_Q8_0, MINV_OFF128, 0)
#else
PACK_A32(pack_q8_0, rx_q8_0, UNPACK_Q8_0, MINV_NONE, 0) /* signed bytes: the products use the sign trick */
#endif
#undef d2m
#define d2m m
PACK_A32(pack_q4_1, rx_q4_1, UNPACK_Q4_1, MINV_M, 1)
PACK_A32(pack_q5_1, rx_q5_1, UNPACK_Q5_1, MINV_M, 1)
#undef d2m

/* NC activation rows at a time; the block's 8 group vectors stay in registers for them */
#define PANEL_A32_COLS(NC, DOT)                                                                    \
    for (; c0 + NC <= ncols; c0 += NC) {                                                           \
        vf acc[NC];                                                                                \
        for (int c = 0; c < NC; c++) acc[c] = VF_ZERO();                                           \
        const uint8_t *p = panel;                                                                  \
        for (int64_t b = 0; b < nb; b++, p += PANEL_A32_BYTES) {                                   \
            vi w0 = VI_LOAD(p), w1 = VI_LOAD(p + PG), w2 = VI_LOAD(p + 2 * PG), w3 = VI_LOAD(p + 3 * PG); \
            vi w4 = VI_LOAD(p + 4 * PG), w5 = VI_LOAD(p + 5 * PG), w6 = VI_LOAD(p + 6 * PG);       \
            vi w7 = VI_LOAD(p + 7 * PG);                                                           \
            vf dw = VF_LOAD((const float *)(p + 8 * PG)), mw = VF_LOAD((const float *)(p + 8 * PG + PM * 4)); \
            for (int c = 0; c < NC; c++) {                                                         \
                const rx_a32 *yc = (const rx_a32 *)(a + (c0 + c) * ar) + b;                        \
                const int32_t *q = (const int32_t *)yc->q;                                         \
                vi s0 = DOT(VI_ZERO(), w0, VI_SET1(q[0]));                                         \
                vi s1 = DOT(VI_ZERO(), w1, VI_SET1(q[1]));                                         \
                s0 = DOT(s0, w2, VI_SET1(q[2]));                                                   \
                s1 = DOT(s1, w3, VI_SET1(q[3]));                                                   \
                s0 = DOT(s0, w4, VI_SET1(q[4]));                                                   \
                s1 = DOT(s1, w5, VI_SET1(q[5]));                                                   \
                s0 = DOT(s0, w6, VI_SET1(q[6]));                                                   \
                s1 = DOT(s1, w7, VI_SET1(q[7]));                                                   \
                vf sf = VF_CVT(VI_ADD(s0, s1));                                                    \
                acc[c] = VF_FMA(VF_MUL(dw, VF_SET1(yc->d)), sf, acc[c]);                           \
                acc[c] = VF_FMA(mw, VF_SET1(yc->s), acc[c]);                                       \
            }                                                                                      \
        }                                                                                          \
        for (int c = 0; c < NC; c++) panel_store(y + (c0 + c) * ldy, acc[c], rows, accumulate);   \
    }

#define PANEL_A32(NAME, DOT)                                                                       \
    static void NAME(int64_t n, const void *panel, const uint8_t *a, size_t ar, int64_t ncols, float *y, \
                     int64_t ldy, int rows, int accumulate) {                                      \
        int64_t nb = n / 32, c0 = 0;                                                               \
        PANEL_A32_COLS(4, DOT)                                                                     \
        PANEL_A32_COLS(1, DOT)                                                                     \
    }
PANEL_A32(panel_a32, VDPB)
#ifndef RX_VNNI
PANEL_A32(panel_a32_ss, VDPB_SS)
#endif

/* the PM rows' unsigned values u[r][0..255] -> the panel's 64 group vectors */
static inline void transpose_sb(const uint8_t (*u)[256], uint8_t *p) {
    for (int k = 0; k < 8; k++) {
        __m256i r[PM];
        for (int i = 0; i < PM; i++) r[i] = _mm256_loadu_si256((const __m256i *)(u[i] + 32 * k));
        transpose_rows(r, p + 8 * PG * k);
    }
}

static void pack_q4_k(int64_t n, const uint8_t *w, int64_t rb, int rows, void *panel) {
    uint8_t *p = panel;
    const __m256i m4 = _mm256_set1_epi8(15);
    _Alignas(64) uint8_t u[PM][256];
    for (int64_t b = 0; b < n / 256; b++, p += PANEL_Q4K_BYTES) {
        int32_t *sc = (int32_t *)(p + 64 * PG);
        int16_t *mn = (int16_t *)(p + 64 * PG + 8 * PM * 4);
        rx_half d[PM], dm[PM];
        for (int i = 0; i < PM; i++) {
            if (i >= rows) {
                memset(u[i], 0, 256);
                for (int j = 0; j < 8; j++) {
                    sc[j * PM + i] = 0;
                    mn[(j / 2) * 2 * PM + i * 2 + j % 2] = 0;
                }
                d[i] = dm[i] = 0;
                continue;
            }
            const rx_q4_k *x = (const rx_q4_k *)(w + i * rb) + b;
            for (int g2 = 0; g2 < 4; g2++) {
                __m256i q = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * g2));
                _mm256_storeu_si256((__m256i *)(u[i] + 64 * g2), _mm256_and_si256(q, m4));
                _mm256_storeu_si256((__m256i *)(u[i] + 64 * g2 + 32), _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
            }
            for (int j = 0; j < 8; j++) {
                uint8_t sj, mj;
                rx_k4_scale_min(j, x->scales, &sj, &mj);
                sc[j * PM + i] = sj;
                mn[(j / 2) * 2 * PM + i * 2 + j % 2] = mj;
            }
            d[i] = x->d;
            dm[i] = x->dmin;
        }
        transpose_sb((const uint8_t(*)[256])u, p);
        store_half_f(p + 64 * PG + 12 * PM * 4, d);
        store_half_f(p + 64 * PG + 13 * PM * 4, dm);
    }
}

static void pack_q6_k(int64_t n, const uint8_t *w, int64_t rb, int rows, void *panel) {
    uint8_t *p = panel;
    const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3);
    _Alignas(64) uint8_t u[PM][256];
    for (int64_t b = 0; b < n / 256; b++, p += PANEL_Q6K_BYTES) {
        int32_t *sc = (int32_t *)(p + 64 * PG);
        int16_t *sp = (int16_t *)(p + 64 * PG + 16 * PM * 4);
        rx_half d[PM];
        for (int i = 0; i < PM; i++) {
            if (i >= rows) {
                memset(u[i], 0, 256);
                for (int g = 0; g < 16; g++) {
                    sc[g * PM + i] = 0;
                    sp[(g / 2) * 2 * PM + i * 2 + g % 2] = 0;
                }
                d[i] = 0;
                continue;
            }
            const rx_q6_k *x = (const rx_q6_k *)(w + i * rb) + b;
            for (int h = 0; h < 2; h++) {
                const uint8_t *ql = x->ql + 64 * h;
                __m256i qh = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
                for (int part = 0; part < 4; part++) {
                    __m256i l = _mm256_loadu_si256((const __m256i *)(ql + (part & 1) * 32));
                    __m256i lv = part < 2 ? _mm256_and_si256(l, m4) : _mm256_and_si256(_mm256_srli_epi16(l, 4), m4);
                    __m256i hv = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * part)), m2);
                    _mm256_storeu_si256((__m256i *)(u[i] + 128 * h + 32 * part),
                                        _mm256_or_si256(lv, _mm256_slli_epi16(hv, 4)));
                }
            }
            for (int g = 0; g < 16; g++) {
                sc[g * PM + i] = x->scales[g];
                sp[(g / 2) * 2 * PM + i * 2 + g % 2] = x->scales[g];
            }
            d[i] = x->d;
        }
        transpose_sb((const uint8_t(*)[256])u, p);
        store_half_f(p + 64 * PG + 24 * PM * 4, d);
    }
}

/* the int32 sums of the rows' values in NG consecutive groups (group vectors at wg) with the
 * activation's 4-byte groups q[0..NG-1] */
#define GROUP_SUMS(NG, wg, q, out)                                                                 \
    do {                                                                                           \
        vi s0_ = VI_ZERO(), s1_ = VI_ZERO();                                                       \
        for (int g_ = 0; g_ < NG; g_ += 2) {                                                       \
            s0_ = VDPB(s0_, VI_LOAD((wg) + g_ * PG), VI_SET1((q)[g_]));                           \
            s1_ = VDPB(s1_, VI_LOAD((wg) + (g_ + 1) * PG), VI_SET1((q)[g_ + 1]));                 \
        }                                                                                          \
        out = VI_ADD(s0_, s1_);                                                                    \
    } while (0)

#define PANEL_Q4K_COLS(NC)                                                                         \
    for (; c0 + NC <= ncols; c0 += NC) {                                                           \
        vf acc[NC];                                                                                \
        for (int c = 0; c < NC; c++) acc[c] = VF_ZERO();                                           \
        const uint8_t *p = panel;                                                                  \
        for (int64_t b = 0; b < nb; b++, p += PANEL_Q4K_BYTES) {                                   \
            const rx_a256 *yc[NC];                                                                 \
            vi S[NC];                                                                              \
            for (int c = 0; c < NC; c++) {                                                         \
                yc[c] = (const rx_a256 *)(a + (c0 + c) * ar) + b;                                  \
                S[c] = VI_ZERO();                                                                  \
            }                                                                                      \
            for (int j = 0; j < 8; j++) {                                                          \
                const uint8_t *wg = p + 8 * PG * j;                                                \
                vi sc = VI_LOAD(p + 64 * PG + j * PM * 4);                                         \
                for (int c = 0; c < NC; c++) {                                                     \
                    vi t;                                                                          \
                    GROUP_SUMS(8, wg, (const int32_t *)(yc[c]->q + 32 * j), t);                    \
                    S[c] = VI_ADD(S[c], VI_MULLO(t, sc));                                          \
                }                                                                                  \
            }                                                                                      \
            const uint8_t *mn = p + 64 * PG + 8 * PM * 4;                                          \
            vf d = VF_LOAD((const float *)(p + 64 * PG + 12 * PM * 4));                            \
            vf dmin = VF_LOAD((const float *)(p + 64 * PG + 13 * PM * 4));                         \
            for (int c = 0; c < NC; c++) {                                                         \
                const int16_t *bs = yc[c]->bsum;                                                   \
                /* dword k: the activation sums of sub-blocks 2k and 2k + 1, as int16 */            \
                int32_t pr[4];                                                                     \
                for (int k = 0; k < 4; k++)                                                        \
                    pr[k] = (int32_t)(uint16_t)(int16_t)(bs[4 * k] + bs[4 * k + 1]) |              \
                            (int32_t)((uint32_t)(uint16_t)(int16_t)(bs[4 * k + 2] + bs[4 * k + 3]) << 16); \
                vi M = VI_ZERO();                                                                  \
                for (int k = 0; k < 4; k++) M = VDPW(M, VI_LOAD(mn + k * PM * 4), VI_SET1(pr[k])); \
                vf t = VF_SUB(VF_MUL(d, VF_CVT(S[c])), VF_MUL(dmin, VF_CVT(M)));                   \
                acc[c] = VF_FMA(VF_SET1(yc[c]->d), t, acc[c]);                                     \
            }                                                                                      \
        }                                                                                          \
        for (int c = 0; c < NC; c++) panel_store(y + (c0 + c) * ldy, acc[c], rows, accumulate);   \
    }

static void panel_q4_k(int64_t n, const void *panel, const uint8_t *a, size_t ar, int64_t ncols, float *y,
                       int64_t ldy, int rows, int accumulate) {
    int64_t nb = n / 256, c0 = 0;
    PANEL_Q4K_COLS(4)
    PANEL_Q4K_COLS(1)
}

#define PANEL_Q6K_COLS(NC)                                                                         \
    for (; c0 + NC <= ncols; c0 += NC) {                                                           \
        vf acc[NC];                                                                                \
        for (int c = 0; c < NC; c++) acc[c] = VF_ZERO();                                           \
        const uint8_t *p = panel;                                                                  \
        for (int64_t b = 0; b < nb; b++, p += PANEL_Q6K_BYTES) {                                   \
            const rx_a256 *yc[NC];                                                                 \
            vi S[NC];                                                                              \
            for (int c = 0; c < NC; c++) {                                                         \
                yc[c] = (const rx_a256 *)(a + (c0 + c) * ar) + b;                                  \
                S[c] = VI_ZERO();                                                                  \
            }                                                                                      \
            for (int g = 0; g < 16; g++) {                                                         \
                const uint8_t *wg = p + 4 * PG * g;                                                \
                vi sc = VI_LOAD(p + 64 * PG + g * PM * 4);                                         \
                for (int c = 0; c < NC; c++) {                                                     \
                    vi t;                                                                          \
                    GROUP_SUMS(4, wg, (const int32_t *)(yc[c]->q + 16 * g), t);                    \
                    S[c] = VI_ADD(S[c], VI_MULLO(t, sc));                                          \
                }                                                                                  \
            }                                                                                      \
            const uint8_t *sp = p + 64 * PG + 16 * PM * 4;                                         \
            vf d = VF_LOAD((const float *)(p + 64 * PG + 24 * PM * 4));                            \
            for (int c = 0; c < NC; c++) {                                                         \
                const int32_t *bs = (const int32_t *)yc[c]->bsum;                                  \
                vi corr = VI_ZERO();                                                               \
                for (int k = 0; k < 8; k++) corr = VDPW(corr, VI_LOAD(sp + k * PM * 4), VI_SET1(bs[k])); \
                vi sumi = VI_SUB(S[c], VI_SLLI(corr, 5));                                          \
                acc[c] = VF_FMA(VF_MUL(d, VF_SET1(yc[c]->d)), VF_CVT(sumi), acc[c]);               \
            }                                                                                      \
        }                                                                                          \
        for (int c = 0; c < NC; c++) panel_store(y + (c0 + c) * ldy, acc[c], rows, accumulate);   \
    }

static void panel_q6_k(int64_t n, const void *panel, const uint8_t *a, size_t ar, int64_t ncols, float *y,
                       int64_t ldy, int rows, int accumulate) {
    int64_t nb = n / 256, c0 = 0;
    PANEL_Q6K_COLS(4)
    PANEL_Q6K_COLS(1)
}

static float dot_q8_k(int64_t n, const void *w, const void *a) {
    const rx_q8_k *x = w; const rx_a256 *y = a;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / 256; b++) {
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(x[b].qs + 32 * j));
            __m256i p = _mm256_loadu_si256((const __m256i *)(y[b].q + 32 * j));
            sumi = _mm256_add_epi32(sumi, dot_ss(q, p));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(x[b].d * y[b].d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum8(acc);
}

static float dot_f32(const float *x, const float *y, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), a1);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), a0);
    float s = hsum8(_mm256_add_ps(a0, a1));
    for (; i < n; i++) s += x[i] * y[i];
    return s;
}

static inline __m256 load_h8(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

static inline __m256 load_bf8(const uint16_t *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

static float dot_f32_f16(const float *x, const uint16_t *y, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), load_h8(y + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), load_h8(y + i + 8), a1);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), load_h8(y + i), a0);
    float s = hsum8(_mm256_add_ps(a0, a1));
    for (; i < n; i++) s += x[i] * half1(y[i]);
    return s;
}

static float dot_f32w(int64_t n, const void *w, const void *a) { return dot_f32(w, a, n); }
static float dot_f16w(int64_t n, const void *w, const void *a) { return dot_f32_f16(a, w, n); }

static float dot_bf16w(int64_t n, const void *w, const void *a) {
    const uint16_t *x = w; const float *y = a;
    __m256 a0 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(load_bf8(x + i), _mm256_loadu_ps(y + i), a0);
    float s = hsum8(a0);
    for (; i < n; i++) s += rx_bf2f(x[i]) * y[i];
    return s;
}

static void axpy_f32(float *y, float a, const float *x, int64_t n) {
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

static void axpy_f16(float *y, float a, const uint16_t *x, int64_t n) {
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, load_h8(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * half1(x[i]);
}

static void to_f16(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) y[i] = rx_f2h(x[i]);
}

/* round x * id to int8 in 32 bytes (values within [-127, 127]) */
static inline __m256i quant32(const float *x, __m256 id) {
    __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), id));
    __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), id));
    __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16), id));
    __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 24), id));
    __m256i w0 = _mm256_packs_epi32(i0, i1), w1 = _mm256_packs_epi32(i2, i3);
    __m256i b = _mm256_packs_epi16(w0, w1);
    /* packs interleaves the 128-bit lanes: restore element order */
    return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static inline float amax_n(const float *x, int n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
    __m128 r = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    r = _mm_max_ps(r, _mm_movehl_ps(r, r));
    r = _mm_max_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

static inline int hsum_i8x32(__m256i q) {
    __m256i s16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), q);
    __m256i s32 = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
    __m128i r = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
    r = _mm_add_epi32(r, _mm_shuffle_epi32(r, 0x4e));
    r = _mm_add_epi32(r, _mm_shuffle_epi32(r, 0xb1));
    return _mm_cvtsi128_si32(r);
}

static void quant_a32(const float *x, rx_a32 *y, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++, x += 32) {
        float amax = amax_n(x, 32);
        float d = amax / 127.f, id = d ? 1.f / d : 0.f;
        __m256i q = quant32(x, _mm256_set1_ps(id));
        _mm256_storeu_si256((__m256i *)y[b].q, q);
        y[b].d = d;
        y[b].s = d * (float)hsum_i8x32(q);
    }
}

static void quant_a256(const float *x, rx_a256 *y, int64_t n) {
    for (int64_t b = 0; b < n / 256; b++, x += 256) {
        float amax = amax_n(x, 256);
        float d = amax / 127.f, id = d ? 1.f / d : 0.f;
        __m256 vid = _mm256_set1_ps(id);
        for (int j = 0; j < 8; j++) {
            __m256i q = quant32(x + 32 * j, vid);
            _mm256_storeu_si256((__m256i *)(y[b].q + 32 * j), q);
            __m256i s16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), q); /* 16 pair sums */
            __m128i lo = _mm256_castsi256_si128(s16), hi = _mm256_extracti128_si256(s16, 1);
            __m128i ones = _mm_set1_epi16(1);
            __m128i a = _mm_madd_epi16(lo, ones), c = _mm_madd_epi16(hi, ones);
            a = _mm_hadd_epi32(a, c); /* [g0 a, g0 b, g1 a, g1 b] */
            a = _mm_hadd_epi32(a, a);
            y[b].bsum[2 * j] = (int16_t)_mm_cvtsi128_si32(a);
            y[b].bsum[2 * j + 1] = (int16_t)_mm_extract_epi32(a, 1);
        }
        y[b].d = d;
    }
}

/* several queries / output rows against one float16 key / value row (attention's grouped
 * query heads): the row converted once, 8 values at a time */
static void dotn_f32_f16(const float *q, int64_t ldq, int nq, const uint16_t *k, int64_t ldk, int nk, int64_t n,
                         float *out) {
    const uint16_t *k1 = nk > 1 ? k + ldk : k;
    for (int h0 = 0; h0 < nq; h0 += 4) {
        int m = nq - h0 < 4 ? nq - h0 : 4;
        const float *q0 = q + h0 * ldq;
        __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        __m256 b[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) {
            __m256 kv = load_h8(k + i), kw = load_h8(k1 + i);
            for (int h = 0; h < 4; h++) {
                if (h >= m) break;
                __m256 qv = _mm256_loadu_ps(q0 + h * ldq + i);
                a[h] = _mm256_fmadd_ps(qv, kv, a[h]);
                b[h] = _mm256_fmadd_ps(qv, kw, b[h]);
            }
        }
        for (int h = 0; h < m; h++) {
            float ra = hsum8(a[h]), rb = hsum8(b[h]);
            for (int64_t e = i; e < n; e++) {
                ra += q0[h * ldq + e] * half1(k[e]);
                rb += q0[h * ldq + e] * half1(k1[e]);
            }
            out[h0 + h] = ra;
            if (nk > 1) out[nq + h0 + h] = rb;
        }
    }
}

static void axpyn_f16(float *y, int64_t ldy, int ny, const float *a, const uint16_t *x, int64_t ldx, int nx,
                      int64_t n) {
    const uint16_t *x1 = x + ldx;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 xv = load_h8(x + i), xw = nx > 1 ? load_h8(x1 + i) : _mm256_setzero_ps();
        for (int h = 0; h < ny; h++) {
            float *yh = y + h * ldy + i;
            __m256 acc = _mm256_fmadd_ps(_mm256_set1_ps(a[h]), xv, _mm256_loadu_ps(yh));
            if (nx > 1) acc = _mm256_fmadd_ps(_mm256_set1_ps(a[ny + h]), xw, acc);
            _mm256_storeu_ps(yh, acc);
        }
    }
    for (; i < n; i++)
        for (int k = 0; k < nx; k++) {
            float xv = half1(x[k * ldx + i]);
            for (int h = 0; h < ny; h++) y[h * ldy + i] += a[k * ny + h] * xv;
        }
}

/* Attention over a block of queries (rx_cpu.h's qk_f16 / pv_f16): register tiles of NQ query
 * rows x NK key rows (each key's 8 values converted once for the NQ queries), and of NO output
 * rows x 32 values (each value row's 8 values converted once for the NO rows). Per dot and per
 * output value the operations are dotn_f32_f16's / axpyn_f16's, in their order. */
#ifdef RX_VNNI /* 32 vector registers (AVX-512VL) */
#define QK_NK 4
#else
#define QK_NK 2
#endif

#define QK_TILE(NAME, NQ, NK)                                                                      \
    static inline void NAME(const float *const *q, const uint16_t *k, int64_t ldk, int64_t n, float *s, \
                            int64_t lds) {                                                         \
        __m256 acc[NQ][NK];                                                                        \
        _Pragma("GCC unroll 4") for (int a = 0; a < NQ; a++)                                       \
            _Pragma("GCC unroll 4") for (int b = 0; b < NK; b++) acc[a][b] = _mm256_setzero_ps();  \
        int64_t i = 0;                                                                             \
        for (; i + 8 <= n; i += 8) {                                                               \
            __m256 kv[NK];                                                                         \
            _Pragma("GCC unroll 4") for (int b = 0; b < NK; b++) kv[b] = load_h8(k + b * ldk + i); \
            _Pragma("GCC unroll 4") for (int a = 0; a < NQ; a++) {                                 \
                __m256 qv = _mm256_loadu_ps(q[a] + i);                                             \
                _Pragma("GCC unroll 4") for (int b = 0; b < NK; b++) acc[a][b] = _mm256_fmadd_ps(qv, kv[b], acc[a][b]); \
            }                                                                                      \
        }                                                                                          \
        for (int a = 0; a < NQ; a++)                                                               \
            for (int b = 0; b < NK; b++) {                                                         \
                float r = hsum8(acc[a][b]);                                                        \
                for (int64_t e = i; e < n; e++) r += q[a][e] * half1(k[b * ldk + e]);              \
                s[a * lds + b] = r;                                                                \
            }                                                                                      \
    }
QK_TILE(qk_tile, 4, QK_NK)
QK_TILE(qk_tile_q1, 1, QK_NK)
QK_TILE(qk_tile_k1, 4, 1)
QK_TILE(qk_tile_11, 1, 1)

static void qk_f16(const float *const *q, int nq, const uint16_t *k, int64_t ldk, int nk, int64_t n, float *s,
                   int64_t lds) {
    int a = 0;
    for (; a + 4 <= nq; a += 4) {
        int b = 0;
        for (; b + QK_NK <= nk; b += QK_NK) qk_tile(q + a, k + b * ldk, ldk, n, s + a * lds + b, lds);
        for (; b < nk; b++) qk_tile_k1(q + a, k + b * ldk, ldk, n, s + a * lds + b, lds);
    }
    for (; a < nq; a++) {
        int b = 0;
        for (; b + QK_NK <= nk; b += QK_NK) qk_tile_q1(q + a, k + b * ldk, ldk, n, s + a * lds + b, lds);
        for (; b < nk; b++) qk_tile_11(q + a, k + b * ldk, ldk, n, s + a * lds + b, lds);
    }
}

#define PV_TILE(NAME, NO)                                                                          \
    static inline void NAME(float *const *o, int64_t d0, const float *p, int64_t ldp, const uint16_t *v, \
                            int64_t ldv, int nv) {                                                 \
        __m256 acc[NO][4];                                                                         \
        _Pragma("GCC unroll 4") for (int a = 0; a < NO; a++)                                       \
            _Pragma("GCC unroll 4") for (int b = 0; b < 4; b++) acc[a][b] = _mm256_loadu_ps(o[a] + d0 + 8 * b); \
        for (int t = 0; t < nv; t++) {                                                             \
            const uint16_t *vt = v + t * ldv + d0;                                                 \
            __m256 x0 = load_h8(vt), x1 = load_h8(vt + 8), x2 = load_h8(vt + 16), x3 = load_h8(vt + 24); \
            _Pragma("GCC unroll 4") for (int a = 0; a < NO; a++) {                                 \
                __m256 pa = _mm256_set1_ps(p[a * ldp + t]);                                        \
                acc[a][0] = _mm256_fmadd_ps(pa, x0, acc[a][0]);                                    \
                acc[a][1] = _mm256_fmadd_ps(pa, x1, acc[a][1]);                                    \
                acc[a][2] = _mm256_fmadd_ps(pa, x2, acc[a][2]);                                    \
                acc[a][3] = _mm256_fmadd_ps(pa, x3, acc[a][3]);                                    \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 4") for (int a = 0; a < NO; a++)                                       \
            _Pragma("GCC unroll 4") for (int b = 0; b < 4; b++) _mm256_storeu_ps(o[a] + d0 + 8 * b, acc[a][b]); \
    }
PV_TILE(pv_tile, 4)
PV_TILE(pv_tile_1, 1)

static void pv_f16(float *const *o, int no, const float *p, int64_t ldp, const uint16_t *v, int64_t ldv, int nv,
                   int64_t n) {
    int64_t d0 = 0;
    for (; d0 + 32 <= n; d0 += 32) {
        int a = 0;
        for (; a + 4 <= no; a += 4) pv_tile(o + a, d0, p + a * ldp, ldp, v, ldv, nv);
        for (; a < no; a++) pv_tile_1(o + a, d0, p + a * ldp, ldp, v, ldv, nv);
    }
    for (; d0 + 8 <= n; d0 += 8) /* 8 values at a time */
        for (int a = 0; a < no; a++) {
            __m256 acc = _mm256_loadu_ps(o[a] + d0);
            for (int t = 0; t < nv; t++) acc = _mm256_fmadd_ps(_mm256_set1_ps(p[a * ldp + t]), load_h8(v + t * ldv + d0), acc);
            _mm256_storeu_ps(o[a] + d0, acc);
        }
    for (; d0 < n; d0++) /* axpyn_f16's scalar tail */
        for (int a = 0; a < no; a++)
            for (int t = 0; t < nv; t++) o[a][d0] += p[a * ldp + t] * half1(v[t * ldv + d0]);
}

/* exp(x) in float32 (Cephes' reduction and polynomial: within 2 ulp of expf) */
static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* RMS norm of a row: the squares summed in double (exact products), 8 at a time in 2 x 4
 * lanes; y = (x * r) * w as the portable loop computes it */
static void rms_row(const float *x, float *y, const float *w, int64_t D, float eps) {
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 8 <= D; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v)), hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
        a0 = _mm256_fmadd_pd(lo, lo, a0);
        a1 = _mm256_fmadd_pd(hi, hi, a1);
    }
    a0 = _mm256_add_pd(a0, a1);
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(a0), _mm256_extractf128_pd(a0, 1));
    double ss = _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
    for (; i < D; i++) ss += (double)x[i] * x[i];
    float ms = (float)(ss / (double)D) + eps;
    float r = 1.f / sqrtf(ms);
    __m256 vr = _mm256_set1_ps(r);
    i = 0;
    if (w) {
        for (; i + 8 <= D; i += 8)
            _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vr), _mm256_loadu_ps(w + i)));
        for (; i < D; i++) y[i] = (x[i] * r) * w[i];
    } else {
        for (; i + 8 <= D; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vr));
        for (; i < D; i++) y[i] = x[i] * r;
    }
}

/* s[i] = exp(s[i] - mx), 0 for -inf, 8 at a time (exp8); returns the sum */
static float exp_sum(float *s, int64_t n, float mx) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY), vmx = _mm256_set1_ps(mx);
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(s + i);
        __m256 e = _mm256_andnot_ps(_mm256_cmp_ps(x, ninf, _CMP_EQ_OQ), exp8(_mm256_sub_ps(x, vmx)));
        _mm256_storeu_ps(s + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    float sum = hsum8(acc);
    for (; i < n; i++) {
        float e = s[i] == -INFINITY ? 0.f : expf(s[i] - mx);
        s[i] = e;
        sum += e;
    }
    return sum;
}

/* the gated units' activations, 8 at a time: silu(g) = g / (1 + e^-g); gelu (tanh form)
 * g * 0.5 (1 + tanh w) = g / (1 + e^-2w), w = sqrt(2/pi) (g + 0.044715 g^3) */
static inline __m256 act8(int mode, __m256 x, __m256 u, int has_u) {
    const __m256 one = _mm256_set1_ps(1.f);
    __m256 v;
    if (mode == 1) {
        v = _mm256_div_ps(x, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
    } else {
        /* 0.5 (1 + tanh w) = 1 / (1 + e^-2w): no cancellation where tanh w is near -1 */
        __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
        __m256 z = _mm256_mul_ps(_mm256_set1_ps(-2.f * 0.79788456080286535588f),
                                 _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), x3, x));
        v = _mm256_div_ps(x, _mm256_add_ps(one, exp8(z)));
    }
    return has_u ? _mm256_mul_ps(v, u) : v;
}

/* the last n % 8 values go through the same vector steps (zero-padded lanes), so a value's
 * result does not depend on where it falls in the call (a row's units in a batch or alone) */
static void act(int mode, float *y, const float *g, const float *u, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, act8(mode, _mm256_loadu_ps(g + i), u ? _mm256_loadu_ps(u + i) : _mm256_setzero_ps(),
                                     u != NULL));
    if (i < n) {
        float tg[8] = {0}, tu[8] = {0}, ty[8];
        memcpy(tg, g + i, (size_t)(n - i) * sizeof(float));
        if (u) memcpy(tu, u + i, (size_t)(n - i) * sizeof(float));
        _mm256_storeu_ps(ty, act8(mode, _mm256_loadu_ps(tg), _mm256_loadu_ps(tu), u != NULL));
        memcpy(y + i, ty, (size_t)(n - i) * sizeof(float));
    }
}

void RX_FILL(rx_isa *t) {
    t->act = act;
    t->dotn_f32_f16 = dotn_f32_f16;
    t->axpyn_f16 = axpyn_f16;
    t->qk_f16 = qk_f16;
    t->pv_f16 = pv_f16;
    t->exp_sum = exp_sum;
    t->rms_row = rms_row;
    t->name = RX_NAME;
    rx_fill_iq_avx2(t); /* the IQ / TQ2_0 / MXFP4 formats (iq_x86.c) */
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
    t->dot2[RX_Q4_0] = dot_q4_02;
    t->dot2[RX_Q4_1] = dot_q4_12;
    t->dot2[RX_Q5_0] = dot_q5_02;
    t->dot2[RX_Q5_1] = dot_q5_12;
    t->dot2[RX_Q8_0] = dot_q8_02;
    t->dot2[RX_Q4_K] = dot2_q4_k;
    t->dot2[RX_Q6_K] = dot2_q6_k;
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
    t->tile[RX_Q4_K] = tile_q4_k;
    t->tile[RX_Q6_K] = tile_q6_k;
    t->tile_c[1][RX_Q4_0] = tile_q4_0_1;
    t->tile_c[2][RX_Q4_0] = tile_q4_0_2;
    t->tile_c[3][RX_Q4_0] = tile_q4_0_3;
    t->tile_c[1][RX_Q4_1] = tile_q4_1_1;
    t->tile_c[2][RX_Q4_1] = tile_q4_1_2;
    t->tile_c[3][RX_Q4_1] = tile_q4_1_3;
    t->tile_c[1][RX_Q5_0] = tile_q5_0_1;
    t->tile_c[2][RX_Q5_0] = tile_q5_0_2;
    t->tile_c[3][RX_Q5_0] = tile_q5_0_3;
    t->tile_c[1][RX_Q5_1] = tile_q5_1_1;
    t->tile_c[2][RX_Q5_1] = tile_q5_1_2;
    t->tile_c[3][RX_Q5_1] = tile_q5_1_3;
    t->tile_c[1][RX_Q8_0] = tile_q8_0_1;
    t->tile_c[2][RX_Q8_0] = tile_q8_0_2;
    t->tile_c[3][RX_Q8_0] = tile_q8_0_3;
    t->tile_c[1][RX_Q4_K] = tile_q4_k_1;
    t->tile_c[2][RX_Q4_K] = tile_q4_k_2;
    t->tile_c[3][RX_Q4_K] = tile_q4_k_3;
    t->tile_c[1][RX_Q6_K] = tile_q6_k_1;
    t->tile_c[2][RX_Q6_K] = tile_q6_k_2;
    t->tile_c[3][RX_Q6_K] = tile_q6_k_3;
    t->pack[RX_Q4_0] = pack_q4_0;
    t->pack[RX_Q4_1] = pack_q4_1;
    t->pack[RX_Q5_0] = pack_q5_0;
    t->pack[RX_Q5_1] = pack_q5_1;
    t->pack[RX_Q8_0] = pack_q8_0;
    t->panel[RX_Q4_0] = t->panel[RX_Q4_1] = t->panel[RX_Q5_0] = t->panel[RX_Q5_1] = panel_a32;
#ifdef RX_VNNI
    t->panel[RX_Q8_0] = panel_a32;
#else
    t->panel[RX_Q8_0] = panel_a32_ss;
#endif
    t->panel_bytes[RX_Q4_0] = t->panel_bytes[RX_Q4_1] = t->panel_bytes[RX_Q5_0] = PANEL_A32_BYTES;
    t->panel_bytes[RX_Q5_1] = t->panel_bytes[RX_Q8_0] = PANEL_A32_BYTES;
    t->pack[RX_Q4_K] = pack_q4_k;
    t->panel[RX_Q4_K] = panel_q4_k;
    t->panel_bytes[RX_Q4_K] = PANEL_Q4K_BYTES;
    t->pack[RX_Q6_K] = pack_q6_k;
    t->panel[RX_Q6_K] = panel_q6_k;
    t->panel_bytes[RX_Q6_K] = PANEL_Q6K_BYTES;
    t->panel_m = PM;
    t->quant_a32 = quant_a32;
    t->quant_a256 = quant_a256;
    t->dot_f32 = dot_f32;
    t->dot_f32_f16 = dot_f32_f16;
    t->axpy_f32 = axpy_f32;
    t->axpy_f16 = axpy_f16;
    t->to_f16 = to_f16;
}
