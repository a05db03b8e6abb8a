/* Portable C kernels: every dot product, the activation quantizers and the
 * attention helpers. Built for every target (the compiler vectorizes what it
 * can); x86 builds override the hot ones with AVX2 / AVX-512 VNNI versions,
 * aarch64 builds with NEON / dotprod / i8mm ones that return the same bits (neon.c:
 * so the order of the float sums here is part of the contract: per block, then
 * eight partial sums for float rows). */
#include <math.h>
#include <string.h>

#include "rx_cpu.h"
#include "rx_iq.h"

static void quant_a32(const float *x, rx_a32 *y, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++, x += 32) {
        float amax = 0.f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
        float d = amax / 127.f, id = d ? 1.f / d : 0.f;
        int s = 0;
        for (int i = 0; i < 32; i++) {
            int q = (int)lrintf(x[i] * id);
            y[b].q[i] = (int8_t)q;
            s += q;
        }
        y[b].d = d;
        y[b].s = d * (float)s;
    }
}

static void quant_a256(const float *x, rx_a256 *y, int64_t n) {
    for (int64_t b = 0; b < n / 256; b++, x += 256) {
        float amax = 0.f;
        for (int i = 0; i < 256; i++) amax = fmaxf(amax, fabsf(x[i]));
        float d = amax / 127.f, id = d ? 1.f / d : 0.f;
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int i = 16 * g; i < 16 * g + 16; i++) {
                int q = (int)lrintf(x[i] * id);
                y[b].q[i] = (int8_t)q;
                s += q;
            }
            y[b].bsum[g] = (int16_t)s;
        }
        y[b].d = d;
    }
}

static float dot_q4_0(int64_t n, const void *w, const void *a) {
    const rx_q4_0 *x = w; const rx_a32 *y = a;
    float acc = 0.f;
    for (int64_t b = 0; b < n / 32; b++) {
        int s = 0;
        for (int j = 0; j < 16; j++) {
            s += ((x[b].qs[j] & 15) - 8) * y[b].q[j] + ((x[b].qs[j] >> 4) - 8) * y[b].q[j + 16];
        }
        acc += rx_h2f(x[b].d) * y[b].d * (float)s;
    }
    return acc;
}

static float dot_q4_1(int64_t n, const void *w, const void *a) {
    const rx_q4_1 *x = w; const rx_a32 *y = a;
    float acc = 0.f;
    for (int64_t b = 0; b < n / 32; b++) {
        int s = 0;
        for (int j = 0; j < 16; j++) s += (x[b].qs[j] & 15) * y[b].q[j] + (x[b].qs[j] >> 4) * y[b].q[j + 16];
        acc += rx_h2f(x[b].d) * y[b].d * (float)s + rx_h2f(x[b].m) * y[b].s;
    }
    return acc;
}

static float dot_q5_0(int64_t n, const void *w, const void *a) {
    const rx_q5_0 *x = w; const rx_a32 *y = a;
    float acc = 0.f;
    for (int64_t b = 0; b < n / 32; b++) {
        uint32_t qh; memcpy(&qh, x[b].qh, 4);
        int s = 0;
        for (int j = 0; j < 16; j++) {
            int lo = (x[b].qs[j] & 15) | (((qh >> j) & 1) << 4);
            int hi = (x[b].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
            s += (lo - 16) * y[b].q[j] + (hi - 16) * y[b].q[j + 16];
        }
        acc += rx_h2f(x[b].d) * y[b].d * (float)s;
    }
    return acc;
}

static float dot_q5_1(int64_t n, const void *w, const void *a) {
    const rx_q5_1 *x = w; const rx_a32 *y = a;
    float acc = 0.f;
    for (int64_t b = 0; b < n / 32; b++) {
        uint32_t qh; memcpy(&qh, x[b].qh, 4);
        int s = 0;
        for (int j = 0; j < 16; j++) {
            int lo = (x[b].qs[j] & 15) | (((qh >> j) & 1) << 4);
            int hi = (x[b].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
            s += lo * y[b].q[j] + hi * y[b].q[j + 16];
        }
        acc += rx_h2f(x[b].d) * y[b].d * (float)s + rx_h2f(x[b].m) * y[b].s;
    }
    return acc;
}

static float dot_q8_0(int64_t n, const void *w, const void *a) {
    const rx_q8_0 *x = w; const rx_a32 *y = a;
    float acc = 0.f;
    for (int64_t b = 0; b < n / 32; b++) {
        int s = 0;
        for (int j = 0; j < 32; j++) s += x[b].qs[j] * y[b].q[j];
        acc += rx_h2f(x[b].d) * y[b].d * (float)s;
    }
    return acc;
}

static int k_mins(const uint8_t *scales, const int16_t *bsum, uint8_t *sc) {
    int summ = 0;
    for (int j = 0; j < 8; j++) {
        uint8_t d, m;
        rx_k4_scale_min(j, scales, &d, &m);
        sc[j] = d;
        summ += m * (bsum[2 * j] + bsum[2 * j + 1]);
    }
    return summ;
}

static float dot_q4_k(int64_t n, const void *w, const void *a) {
    const rx_q4_k *x = w; const rx_a256 *y = a;
    float acc = 0.f;
    for (int64_t b = 0; b < n / 256; b++) {
        uint8_t sc[8];
        int summ = k_mins(x[b].scales, y[b].bsum, sc);
        int sumi = 0;
        for (int j = 0; j < 4; j++) {
            const uint8_t *q = x[b].qs + 32 * j;
            const int8_t *p = y[b].q + 64 * j;
            int s0 = 0, s1 = 0;
            for (int l = 0; l < 32; l++) {
                s0 += (q[l] & 15) * p[l];
                s1 += (q[l] >> 4) * p[l + 32];
            }
            sumi += sc[2 * j] * s0 + sc[2 * j + 1] * s1;
        }
        acc += y[b].d * (rx_h2f(x[b].d) * (float)sumi - rx_h2f(x[b].dmin) * (float)summ);
    }
    return acc;
}

static float dot_q5_k(int64_t n, const void *w, const void *a) {
    const rx_q5_k *x = w; const rx_a256 *y = a;
    float acc = 0.f;
    for (int64_t b = 0; b < n / 256; b++) {
        uint8_t sc[8];
        int summ = k_mins(x[b].scales, y[b].bsum, sc);
        int sumi = 0;
        for (int j = 0; j < 4; j++) {
            const uint8_t *q = x[b].qs + 32 * j;
            const int8_t *p = y[b].q + 64 * j;
            int s0 = 0, s1 = 0;
            for (int l = 0; l < 32; l++) {
                int lo = (q[l] & 15) | (((x[b].qh[l] >> (2 * j)) & 1) << 4);
                int hi = (q[l] >> 4) | (((x[b].qh[l] >> (2 * j + 1)) & 1) << 4);
                s0 += lo * p[l];
                s1 += hi * p[l + 32];
            }
            sumi += sc[2 * j] * s0 + sc[2 * j + 1] * s1;
        }
        acc += y[b].d * (rx_h2f(x[b].d) * (float)sumi - rx_h2f(x[b].dmin) * (float)summ);
    }
    return acc;
}

static float dot_q6_k(int64_t n, const void *w, const void *a) {
    const rx_q6_k *x = w; const rx_a256 *y = a;
    float acc = 0.f;
    for (int64_t b = 0; b < n / 256; b++) {
        int sumi = 0;
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = x[b].ql + 64 * h, *qh = x[b].qh + 32 * h;
            const int8_t *sc = x[b].scales + 8 * h, *p = y[b].q + 128 * h;
            int s[8] = {0};
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = ((ql[l] & 15) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q2 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                s[is + 0] += q1 * p[l];
                s[is + 2] += q2 * p[l + 32];
                s[is + 4] += q3 * p[l + 64];
                s[is + 6] += q4 * p[l + 96];
            }
            for (int g = 0; g < 8; g++) sumi += sc[g] * s[g];
        }
        acc += rx_h2f(x[b].d) * y[b].d * (float)sumi;
    }
    return acc;
}

static float dot_q8_k(int64_t n, const void *w, const void *a) {
    const rx_q8_k *x = w; const rx_a256 *y = a;
    float acc = 0.f;
    for (int64_t b = 0; b < n / 256; b++) {
        int s = 0;
        for (int j = 0; j < 256; j++) s += x[b].qs[j] * y[b].q[j];
        acc += x[b].d * y[b].d * (float)s;
    }
    return acc;
}

static float dot_f32w(int64_t n, const void *w, const void *a) {
    const float *x = w, *y = a;
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) s[k] += x[i + k] * y[i + k];
    float acc = 0.f;
    for (; i < n; i++) acc += x[i] * y[i];
    for (int k = 0; k < 8; k++) acc += s[k];
    return acc;
}

static float dot_f16w(int64_t n, const void *w, const void *a) {
    const uint16_t *x = w; const float *y = a;
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) s[k] += rx_h2f(x[i + k]) * y[i + k];
    float acc = 0.f;
    for (; i < n; i++) acc += rx_h2f(x[i]) * y[i];
    for (int k = 0; k < 8; k++) acc += s[k];
    return acc;
}

static float dot_bf16w(int64_t n, const void *w, const void *a) {
    const uint16_t *x = w; const float *y = a;
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) s[k] += rx_bf2f(x[i + k]) * y[i + k];
    float acc = 0.f;
    for (; i < n; i++) acc += rx_bf2f(x[i]) * y[i];
    for (int k = 0; k < 8; k++) acc += s[k];
    return acc;
}

static float dot_f32(const float *a, const float *b, int64_t n) { return dot_f32w(n, a, b); }
static float dot_f32_f16(const float *a, const uint16_t *b, int64_t n) { return dot_f16w(n, b, a); }

static void axpy_f32(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

static void axpy_f16(float *y, float a, const uint16_t *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * rx_h2f(x[i]);
}

static void to_f16(const float *x, uint16_t *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = rx_f2h(x[i]);
}

void rx_fill_generic(rx_isa *t) {
    memset(t, 0, sizeof *t);
    t->name = "generic";
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
    t->quant_a32 = quant_a32;
    t->quant_a256 = quant_a256;
    t->dot_f32 = dot_f32;
    t->dot_f32_f16 = dot_f32_f16;
    t->axpy_f32 = axpy_f32;
    t->axpy_f16 = axpy_f16;
    t->to_f16 = to_f16;
    rx_fill_iq(t); /* the IQ / TQ / MXFP4 formats (iq.c) */
}

/* One row of k values of a natively read type -> float32 (the embedding lookup). */
void rx_dequant_row(int type, const void *src, float *y, int64_t k) {
    switch (type) {
    case RX_F32: memcpy(y, src, (size_t)k * sizeof(float)); return;
    case RX_F16: for (int64_t i = 0; i < k; i++) y[i] = rx_h2f(((const uint16_t *)src)[i]); return;
    case RX_BF16: for (int64_t i = 0; i < k; i++) y[i] = rx_bf2f(((const uint16_t *)src)[i]); return;
    default: break;
    }
    if (rx_iq_dequant_row(type, src, y, k)) return; /* iq.c's formats */
    if (type == RX_Q4_0 || type == RX_Q4_1 || type == RX_Q5_0 || type == RX_Q5_1 || type == RX_Q8_0) {
        for (int64_t b = 0; b < k / 32; b++, y += 32) {
            float d, m = 0.f;
            int q[32];
            if (type == RX_Q8_0) {
                const rx_q8_0 *x = (const rx_q8_0 *)src + b;
                d = rx_h2f(x->d);
                for (int j = 0; j < 32; j++) q[j] = x->qs[j];
            } else if (type == RX_Q4_0 || type == RX_Q4_1) {
                const uint8_t *qs;
                if (type == RX_Q4_0) { const rx_q4_0 *x = (const rx_q4_0 *)src + b; d = rx_h2f(x->d); qs = x->qs; }
                else { const rx_q4_1 *x = (const rx_q4_1 *)src + b; d = rx_h2f(x->d); m = rx_h2f(x->m); qs = x->qs; }
                for (int j = 0; j < 16; j++) { q[j] = qs[j] & 15; q[j + 16] = qs[j] >> 4; }
                if (type == RX_Q4_0) for (int j = 0; j < 32; j++) q[j] -= 8;
            } else {
                const uint8_t *qs, *qhp;
                if (type == RX_Q5_0) { const rx_q5_0 *x = (const rx_q5_0 *)src + b; d = rx_h2f(x->d); qs = x->qs; qhp = x->qh; }
                else { const rx_q5_1 *x = (const rx_q5_1 *)src + b; d = rx_h2f(x->d); m = rx_h2f(x->m); qs = x->qs; qhp = x->qh; }
                uint32_t qh; memcpy(&qh, qhp, 4);
                for (int j = 0; j < 16; j++) {
                    q[j] = (qs[j] & 15) | (((qh >> j) & 1) << 4);
                    q[j + 16] = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
                }
                if (type == RX_Q5_0) for (int j = 0; j < 32; j++) q[j] -= 16;
            }
            for (int j = 0; j < 32; j++) y[j] = d * (float)q[j] + m;
        }
        return;
    }
    for (int64_t b = 0; b < k / 256; b++, y += 256) {
        if (type == RX_Q8_K) {
            const rx_q8_k *x = (const rx_q8_k *)src + b;
            for (int j = 0; j < 256; j++) y[j] = x->d * (float)x->qs[j];
        } else if (type == RX_Q4_K || type == RX_Q5_K) {
            const uint8_t *scales, *qs, *qh = NULL;
            float d, dmin;
            if (type == RX_Q4_K) { const rx_q4_k *x = (const rx_q4_k *)src + b; d = rx_h2f(x->d); dmin = rx_h2f(x->dmin); scales = x->scales; qs = x->qs; }
            else { const rx_q5_k *x = (const rx_q5_k *)src + b; d = rx_h2f(x->d); dmin = rx_h2f(x->dmin); scales = x->scales; qs = x->qs; qh = x->qh; }
            for (int j = 0; j < 4; j++) {
                uint8_t s0, m0, s1, m1;
                rx_k4_scale_min(2 * j, scales, &s0, &m0);
                rx_k4_scale_min(2 * j + 1, scales, &s1, &m1);
                float d0 = d * s0, d1 = d * s1, n0 = dmin * m0, n1 = dmin * m1;
                for (int l = 0; l < 32; l++) {
                    int lo = qs[32 * j + l] & 15, hi = qs[32 * j + l] >> 4;
                    if (qh) { lo |= ((qh[l] >> (2 * j)) & 1) << 4; hi |= ((qh[l] >> (2 * j + 1)) & 1) << 4; }
                    y[64 * j + l] = d0 * (float)lo - n0;
                    y[64 * j + 32 + l] = d1 * (float)hi - n1;
                }
            }
        } else if (type == RX_Q6_K) {
            const rx_q6_k *x = (const rx_q6_k *)src + b;
            float d = rx_h2f(x->d);
            for (int h = 0; h < 2; h++) {
                const uint8_t *ql = x->ql + 64 * h, *qh = x->qh + 32 * h;
                const int8_t *sc = x->scales + 8 * h;
                float *o = y + 128 * h;
                for (int l = 0; l < 32; l++) {
                    int is = l / 16;
                    o[l] = d * sc[is] * (float)(((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32);
                    o[l + 32] = d * sc[is + 2] * (float)(((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32);
                    o[l + 64] = d * sc[is + 4] * (float)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                    o[l + 96] = d * sc[is + 6] * (float)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
                }
            }
        }
    }
}
