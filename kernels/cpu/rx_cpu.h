/* reflex-ipc CPU kernels: shared declarations.
 *
 * Weight blocks are the GGUF's own bytes (ggml block layouts, little-endian),
 * read in place from the file mapping. Activations are quantized per row into
 * one of two internal formats before a quantized dot product:
 *   A32:  per 32 values {float d; float s; int8 q[32]} with x ~= d*q and
 *         s = d * sum(q)   (for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 weights)
 *   A256: per 256 values {float d; int16 bsum[16]; int8 q[256]}, bsum[g] the sum
 *         of q over the g-th group of 16   (for Q4_K, Q5_K, Q6_K, Q8_K weights)
 * (the IQ / TQ / MXFP4 formats: rx_iq.h says which they take)
 * F32/F16/BF16 weights take the float32 activations as they are.
 */
#ifndef RX_CPU_H
#define RX_CPU_H

#include <stdint.h>
#include <stddef.h>

/* ggml type ids */
enum {
    RX_F32 = 0, RX_F16 = 1, RX_Q4_0 = 2, RX_Q4_1 = 3, RX_Q5_0 = 6, RX_Q5_1 = 7, RX_Q8_0 = 8,
    RX_Q4_K = 12, RX_Q5_K = 13, RX_Q6_K = 14, RX_Q8_K = 15, RX_BF16 = 30,
    /* iq.c (rx_iq.h) */
    RX_IQ2_XXS = 16, RX_IQ2_XS = 17, RX_IQ3_XXS = 18, RX_IQ1_S = 19, RX_IQ4_NL = 20, RX_IQ3_S = 21,
    RX_IQ2_S = 22, RX_IQ4_XS = 23, RX_IQ1_M = 29, RX_TQ1_0 = 34, RX_TQ2_0 = 35, RX_MXFP4 = 39,
    RX_NTYPES = 40
};

/* activation formats */
enum { RX_ACT_NONE = 0, RX_ACT_F32 = 1, RX_ACT_A32 = 2, RX_ACT_A256 = 3 };

typedef struct { float d; float s; int8_t q[32]; } rx_a32;
typedef struct { float d; int16_t bsum[16]; int8_t q[256]; } rx_a256;

/* ggml blocks */
typedef uint16_t rx_half;
typedef struct { rx_half d; uint8_t qs[16]; } rx_q4_0;
typedef struct { rx_half d, m; uint8_t qs[16]; } rx_q4_1;
typedef struct { rx_half d; uint8_t qh[4]; uint8_t qs[16]; } rx_q5_0;
typedef struct { rx_half d, m; uint8_t qh[4]; uint8_t qs[16]; } rx_q5_1;
typedef struct { rx_half d; int8_t qs[32]; } rx_q8_0;
typedef struct { rx_half d, dmin; uint8_t scales[12]; uint8_t qs[128]; } rx_q4_k;
typedef struct { rx_half d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; } rx_q5_k;
typedef struct { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; rx_half d; } rx_q6_k;
typedef struct { float d; int8_t qs[256]; int16_t bsums[16]; } rx_q8_k;

/* a dot product of one weight row (n values) with one prepared activation row */
typedef float (*rx_dot_fn)(int64_t n, const void *w, const void *a);
/* the same weight row with two activation rows (its blocks unpacked once): s[0], s[1] */
typedef void (*rx_dot2_fn)(int64_t n, const void *w, const void *a0, const void *a1, float *s);

/* A tile of a matrix product (prompt passes, batches): RX_TILE_M consecutive weight rows (at
 * w, row_bytes apart) against RX_TILE_N prepared activation rows (at a, a_row bytes apart):
 * y[c * ldy + r] = dot(weight row r, activation row c). The weight blocks are unpacked once
 * for all the tile's activation rows, and each activation block loaded once for all its
 * weight rows. */
#define RX_TILE_M 4
#define RX_TILE_N 4
typedef void (*rx_tile_fn)(int64_t n, const uint8_t *w, int64_t row_bytes, const uint8_t *a, size_t a_row,
                           float *y, int64_t ldy);

/* Panels (prompt passes, N >= RX_PANEL_MIN_N activation rows): RX_PANEL_M consecutive weight
 * rows are unpacked once into an interleaved panel (pack: for each block, the rows' values as
 * unsigned bytes in groups of 4 — group g holds values 4g..4g+3 of row 0, then of row 1, ... —
 * then each format's per-row scales), which the product (panel) runs against every activation
 * row: one int8 multiply-add per group gives all the rows' partial sums in the vector's lanes,
 * so there is no per-block horizontal sum. Per (row, activation row) the float arithmetic is the
 * tile's, in the same order: the results equal the tiles' bit for bit.
 * pack(n, w, row_bytes, rows, panel): rows (1..panel_m) weight rows; missing rows are zeros.
 * panel(n, panel, a, a_row, ncols, y, ldy, rows, accumulate): y[c * ldy + r] (+)= dot(row r,
 * activation row c) for c < ncols, r < rows. panel_bytes: a panel's bytes per weight block. */
#define RX_PANEL_M 16 /* the most rows a panel holds (the table's panel_m: 8 or 16) */
#define RX_PANEL_MIN_N 8
typedef void (*rx_pack_fn)(int64_t n, const uint8_t *w, int64_t row_bytes, int rows, void *panel);
typedef void (*rx_panel_fn)(int64_t n, const void *panel, const uint8_t *a, size_t a_row, int64_t ncols, float *y,
                            int64_t ldy, int rows, int accumulate);

typedef struct {
    const char *name;
    rx_dot_fn dot[RX_NTYPES];
    rx_dot2_fn dot2[RX_NTYPES]; /* optional (NULL: two dot calls) */
    rx_tile_fn tile[RX_NTYPES]; /* optional (NULL: dot2 / dot) */
    rx_tile_fn tile8[RX_NTYPES]; /* optional: the same with 2 * RX_TILE_N activation rows */
    /* optional: the same with c = 1..RX_TILE_N - 1 activation rows (tile_c[c]): one-token steps
     * and the rows a batch leaves over go through the tiles' arithmetic too (x86: each output's
     * float steps are then the same whatever the batch) */
    rx_tile_fn tile_c[RX_TILE_N][RX_NTYPES];
    rx_pack_fn pack[RX_NTYPES];   /* optional, with panel and panel_bytes */
    rx_panel_fn panel[RX_NTYPES];
    int panel_bytes[RX_NTYPES];
    int panel_m; /* weight rows a panel */
    void (*quant_a32)(const float *x, rx_a32 *y, int64_t n);
    void (*quant_a256)(const float *x, rx_a256 *y, int64_t n);
    /* attention helpers: float32 or float16 rows */
    float (*dot_f32)(const float *a, const float *b, int64_t n);
    float (*dot_f32_f16)(const float *a, const uint16_t *b, int64_t n);
    void (*axpy_f32)(float *y, float a, const float *x, int64_t n);
    void (*axpy_f16)(float *y, float a, const uint16_t *x, int64_t n);
    void (*to_f16)(const float *x, uint16_t *y, int64_t n);
    /* optional: out[i * nq + h] = dot(q + h * ldq, k + i * ldk) for nq queries and nk (1, 2)
     * float16 keys, each key read once */
    void (*dotn_f32_f16)(const float *q, int64_t ldq, int nq, const uint16_t *k, int64_t ldk, int nk, int64_t n,
                         float *out);
    /* optional: y + h * ldy += sum over i < nx of a[i * ny + h] * (x + i * ldx) for ny rows and nx
     * (1, 2) float16 value rows, each read once */
    void (*axpyn_f16)(float *y, int64_t ldy, int ny, const float *a, const uint16_t *x, int64_t ldx, int nx,
                      int64_t n);
    /* optional, both or neither (attention over blocks of queries, prompt passes): s[i * lds + t] =
     * dot(q[i], k + t * ldk) for nq query rows and nk float16 key rows, dotn's arithmetic per
     * dot; o[i][d] += sum over t < nv of p[i * ldp + t] * (v + t * ldv)[d] for d < n, axpyn's
     * arithmetic per value (one multiply-add a value row, in row order) */
    void (*qk_f16)(const float *const *q, int nq, const uint16_t *k, int64_t ldk, int nk, int64_t n, float *s,
                   int64_t lds);
    void (*pv_f16)(float *const *o, int no, const float *p, int64_t ldp, const uint16_t *v, int64_t ldv, int nv,
                   int64_t n);
    /* optional: y = x / sqrt(mean(x^2) + eps) * w (w may be NULL) over D values, the sum of squares
     * in double (ops.c's rms_row, summed in another order) */
    void (*rms_row)(const float *x, float *y, const float *w, int64_t D, float eps);
    /* optional (the block attention's softmax): s[i] = exp(s[i] - mx) (0 where s[i] is -inf) for
     * i < n; returns their sum */
    float (*exp_sum)(float *s, int64_t n, float mx);
    /* optional: y[i] = act(g[i]) * u[i] (u NULL: act(g[i])), act silu (1) / gelu-tanh (2) */
    void (*act)(int mode, float *y, const float *g, const float *u, int64_t n);
} rx_isa;

void rx_fill_generic(rx_isa *t);
void rx_dequant_row(int type, const void *src, float *y, int64_t k);
#if defined(__x86_64__) || defined(_M_X64)
void rx_fill_avx2(rx_isa *t);
void rx_fill_avx512vnni(rx_isa *t);
#endif
#if defined(__aarch64__)
void rx_fill_neon(rx_isa *t);
void rx_fill_dotprod(rx_isa *t);
void rx_fill_i8mm(rx_isa *t);
#endif

/* scalar half <-> float (portable) */
static inline float rx_h2f(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalize */
            int e = -1;
            do { e++; man <<= 1; } while (!(man & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    union { uint32_t u; float f; } v = {bits};
    return v.f;
}

static inline uint16_t rx_f2h(float f) { /* round to nearest even */
    union { float f; uint32_t u; } v = {f};
    uint32_t x = v.u, sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* overflow -> inf */
    if (ax < 0x38800000u) { /* subnormal or zero in half */
        if (ax < 0x33000000u) return (uint16_t)sign;
        uint32_t e = ax >> 23, m = (ax & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((ax - 0x38000000u) >> 13), rem = ax & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
    return (uint16_t)(sign | r);
}

static inline float rx_bf2f(uint16_t h) {
    union { uint32_t u; float f; } v = {(uint32_t)h << 16};
    return v.f;
}

static inline void rx_k4_scale_min(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

#endif
