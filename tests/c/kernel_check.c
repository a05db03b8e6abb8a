/* The aarch64 kernel tables (kernels/cpu/neon.c: neon, dotprod, i8mm) against the portable
 * C path (generic.c), bit for bit, on random blocks of every format: the activation
 * quantizers' bytes, every dot product (one and two activation rows), the float rows and
 * the attention / recurrence helpers. Then the library's own choice (ops.c) for the CPU it
 * runs on, and a whole rx_matmul per format against generic.c's dot products.
 *
 * Built and run by scripts/aarch64-check under qemu-aarch64 (one run per emulated CPU):
 *   kernel_check EXPECTED_ISA
 * Prints one line per table and format, then "N passed, N failed"; exits 1 on a failure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>

#include "../../kernels/cpu/rx_abi.h" /* ops.c's exports */
#include "../../kernels/cpu/rx_cpu.h"

static int passed, failed;
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static float uniform(void) { return (float)((rnd() >> 11) * (1.0 / 9007199254740992.0)); }

static float normal(void) {
    float u = uniform() + 1e-7f, v = uniform();
    return sqrtf(-2.f * logf(u)) * cosf(6.2831853f * v);
}

struct fmt { const char *name; int type, blk, bsize, act; int f16[2]; };
static const struct fmt FMTS[] = {
    {"Q4_0", RX_Q4_0, 32, sizeof(rx_q4_0), RX_ACT_A32, {0, -1}},
    {"Q4_1", RX_Q4_1, 32, sizeof(rx_q4_1), RX_ACT_A32, {0, 2}},
    {"Q5_0", RX_Q5_0, 32, sizeof(rx_q5_0), RX_ACT_A32, {0, -1}},
    {"Q5_1", RX_Q5_1, 32, sizeof(rx_q5_1), RX_ACT_A32, {0, 2}},
    {"Q8_0", RX_Q8_0, 32, sizeof(rx_q8_0), RX_ACT_A32, {0, -1}},
    {"Q4_K", RX_Q4_K, 256, sizeof(rx_q4_k), RX_ACT_A256, {0, 2}},
    {"Q5_K", RX_Q5_K, 256, sizeof(rx_q5_k), RX_ACT_A256, {0, 2}},
    {"Q6_K", RX_Q6_K, 256, sizeof(rx_q6_k), RX_ACT_A256, {208, -1}},
    {"Q8_K", RX_Q8_K, 256, sizeof(rx_q8_k), RX_ACT_A256, {-1, -1}},
    {"F32", RX_F32, 1, 4, RX_ACT_F32, {-1, -1}},
    {"F16", RX_F16, 1, 2, RX_ACT_F32, {-1, -1}},
    {"BF16", RX_BF16, 1, 2, RX_ACT_F32, {-1, -1}},
};
#define NFMT (int)(sizeof FMTS / sizeof FMTS[0])

/* n values of format f: random bytes with sane scales (as tests/test_cpu_ops.py makes them) */
static void random_row(const struct fmt *f, int64_t n, uint8_t *out) {
    if (f->type == RX_F32) { for (int64_t i = 0; i < n; i++) ((float *)out)[i] = normal() * 0.05f; return; }
    if (f->type == RX_F16) { for (int64_t i = 0; i < n; i++) ((uint16_t *)out)[i] = rx_f2h(normal() * 0.05f); return; }
    if (f->type == RX_BF16) {
        for (int64_t i = 0; i < n; i++) {
            float v = normal() * 0.05f;
            uint32_t u; memcpy(&u, &v, 4);
            ((uint16_t *)out)[i] = (uint16_t)(u >> 16);
        }
        return;
    }
    int64_t nb = n / f->blk;
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *blk = out + b * f->bsize;
        for (int i = 0; i < f->bsize; i++) blk[i] = (uint8_t)rnd();
        for (int k = 0; k < 2; k++) {
            if (f->f16[k] < 0) continue;
            float s = (0.2f + 0.8f * uniform()) * 0.01f * ((rnd() & 1) ? 1.f : -1.f);
            uint16_t h = rx_f2h(s);
            memcpy(blk + f->f16[k], &h, 2);
        }
        if (f->type == RX_Q8_K) { float d = (0.2f + 0.8f * uniform()) * 0.01f; memcpy(blk, &d, 4); }
    }
}

/* activations: normal values, now and then a block of zeros or a large outlier */
static void random_x(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = normal();
    if (rnd() % 4 == 0) { int64_t s = (int64_t)(rnd() % (uint64_t)(n / 32)) * 32; memset(x + s, 0, 32 * sizeof(float)); }
    if (rnd() % 3 == 0) x[rnd() % (uint64_t)n] = 40.f * normal();
}

static void report(const char *isa, const char *what, int bad, int64_t cases) {
    if (bad) failed++;
    else passed++;
    printf("%-8s %-14s %s (%lld cases)\n", isa, what, bad ? "FAILED: not bit-identical to generic" : "ok",
           (long long)cases);
}

static int same_f(float a, float b) { return !memcmp(&a, &b, sizeof a); }

static size_t act_bytes(int act, int64_t n) {
    return act == RX_ACT_A32 ? (size_t)(n / 32) * sizeof(rx_a32)
         : act == RX_ACT_A256 ? (size_t)(n / 256) * sizeof(rx_a256) : (size_t)n * sizeof(float);
}

static void prep(const rx_isa *t, int act, const float *x, void *a, int64_t n) {
    if (act == RX_ACT_A32) t->quant_a32(x, a, n);
    else if (act == RX_ACT_A256) t->quant_a256(x, a, n);
    else memcpy(a, x, (size_t)n * sizeof(float));
}

static void check_table(const rx_isa *g, const rx_isa *t) {
    enum { TRIALS = 60 };
    const int64_t sizes[3] = {256, 768, 2304};
    const int64_t fsizes[4] = {64, 77, 256, 1000};
    uint8_t *w = malloc(2304 * 4);
    float *x0 = malloc(2304 * sizeof(float)), *x1 = malloc(2304 * sizeof(float));
    void *ga0 = malloc(2304 * 4 + 4096), *ga1 = malloc(2304 * 4 + 4096);
    void *ta0 = malloc(2304 * 4 + 4096), *ta1 = malloc(2304 * 4 + 4096);
    for (int fi = 0; fi < NFMT; fi++) {
        const struct fmt *f = &FMTS[fi];
        int bad = 0, bad2 = 0, badq = 0;
        int64_t cases = 0;
        for (int trial = 0; trial < TRIALS; trial++) {
            int64_t n = f->blk == 1 ? fsizes[trial % 4] : sizes[trial % 3];
            random_row(f, n, w);
            random_x(x0, n);
            random_x(x1, n);
            prep(g, f->act, x0, ga0, n);
            prep(g, f->act, x1, ga1, n);
            prep(t, f->act, x0, ta0, n);
            prep(t, f->act, x1, ta1, n);
            if (memcmp(ga0, ta0, act_bytes(f->act, n)) || memcmp(ga1, ta1, act_bytes(f->act, n))) badq++;
            float want0 = g->dot[f->type](n, w, ga0), want1 = g->dot[f->type](n, w, ga1);
            if (!same_f(t->dot[f->type](n, w, ga0), want0)) bad++;
            if (t->dot2[f->type]) {
                float s[2];
                t->dot2[f->type](n, w, ga0, ga1, s);
                if (!same_f(s[0], want0) || !same_f(s[1], want1)) bad2++;
            }
            cases++;
        }
        char what[32];
        snprintf(what, sizeof what, "dot %s", f->name);
        report(t->name, what, bad, cases);
        if (t->dot2[f->type]) {
            snprintf(what, sizeof what, "dot2 %s", f->name);
            report(t->name, what, bad2, cases);
        }
        if (f->act != RX_ACT_F32) {
            snprintf(what, sizeof what, "quant %s", f->act == RX_ACT_A32 ? "a32" : "a256");
            if (f->type == RX_Q4_0 || f->type == RX_Q4_K) report(t->name, what, badq, cases);
        }
    }
    /* tiles: 4 weight rows x 4 / 8 activation rows against 32 single dots of the portable path */
    for (int fi = 0; fi < NFMT; fi++) {
        const struct fmt *f = &FMTS[fi];
        if (!t->tile[f->type] && !t->tile8[f->type]) continue;
        int bad = 0;
        const int64_t n = 768;
        size_t rb = (size_t)(n / f->blk) * f->bsize, ab = act_bytes(f->act, n);
        uint8_t *wt = malloc(4 * rb), *at = malloc(8 * ab);
        float *xs = malloc(n * sizeof(float)), yt[64];
        for (int trial = 0; trial < 20; trial++) {
            for (int r = 0; r < 4; r++) random_row(f, n, wt + r * rb);
            for (int c = 0; c < 8; c++) { random_x(xs, n); prep(g, f->act, xs, at + c * ab, n); }
            for (int wide = 0; wide < 2; wide++) {
                rx_tile_fn fn = wide ? t->tile8[f->type] : t->tile[f->type];
                int nc = wide ? 8 : 4;
                if (!fn) continue;
                fn(n, wt, (int64_t)rb, at, ab, yt, 4);
                for (int c = 0; c < nc; c++)
                    for (int r = 0; r < 4; r++)
                        if (!same_f(yt[c * 4 + r], g->dot[f->type](n, wt + r * rb, at + c * ab))) bad++;
            }
        }
        char what[32];
        snprintf(what, sizeof what, "tiles %s", f->name);
        report(t->name, what, bad, 20);
        free(wt); free(at); free(xs);
    }
    /* attention and recurrence helpers */
    int bd = 0, bh = 0, ba = 0, bah = 0, bf = 0;
    float *y0 = malloc(1100 * sizeof(float)), *y1 = malloc(1100 * sizeof(float));
    uint16_t *h = malloc(1100 * 2), *h1 = malloc(1100 * 2);
    for (int trial = 0; trial < 200; trial++) {
        int64_t n = fsizes[trial % 4] + (int64_t)(rnd() % 9);
        random_x(x0, n);
        random_x(x1, n);
        for (int64_t i = 0; i < n; i++) h[i] = rx_f2h(x1[i]);
        if (!same_f(g->dot_f32(x0, x1, n), t->dot_f32(x0, x1, n))) bd++;
        if (!same_f(g->dot_f32_f16(x0, h, n), t->dot_f32_f16(x0, h, n))) bh++;
        float a = normal();
        memcpy(y0, x0, (size_t)n * 4);
        memcpy(y1, x0, (size_t)n * 4);
        g->axpy_f32(y0, a, x1, n);
        t->axpy_f32(y1, a, x1, n);
        if (memcmp(y0, y1, (size_t)n * 4)) ba++;
        g->axpy_f16(y0, a, h, n);
        t->axpy_f16(y1, a, h, n);
        if (memcmp(y0, y1, (size_t)n * 4)) bah++;
        g->to_f16(x0, h, n);
        t->to_f16(x0, h1, n);
        if (memcmp(h, h1, (size_t)n * 2)) bf++;
    }
    report(t->name, "dot_f32", bd, 200);
    report(t->name, "dot_f32_f16", bh, 200);
    report(t->name, "axpy_f32", ba, 200);
    report(t->name, "axpy_f16", bah, 200);
    report(t->name, "to_f16", bf, 200);
    free(w); free(x0); free(x1); free(ga0); free(ga1); free(ta0); free(ta1);
    free(y0); free(y1); free(h); free(h1);
}

/* rx_matmul (ops.c: the table it chose, its chunking, dot2 pairs) against generic.c's dot of
 * every row with every activation row */
static void check_matmul(const rx_isa *g) {
    const int64_t M = 37, N = 7, K = 768;
    for (int fi = 0; fi < NFMT; fi++) {
        const struct fmt *f = &FMTS[fi];
        size_t rb = (size_t)(K / f->blk) * f->bsize;
        uint8_t *w = malloc(rb * M);
        for (int64_t r = 0; r < M; r++) random_row(f, K, w + r * rb);
        float *x = malloc(N * K * sizeof(float)), *y = malloc(N * M * sizeof(float));
        for (int64_t r = 0; r < N; r++) random_x(x + r * K, K);
        rx_weight wd = {f->type, w, M, K, (int64_t)rb};
        int bad = rx_matmul(N, K, x, K, 1, &wd, NULL, NULL, y, NULL, NULL, 0, 0) != 0;
        void *a = malloc(act_bytes(f->act, K));
        for (int64_t n = 0; n < N && !bad; n++) {
            prep(g, f->act, x + n * K, a, K);
            for (int64_t r = 0; r < M; r++)
                if (!same_f(y[n * M + r], g->dot[f->type](K, w + r * rb, a))) bad++;
        }
        char what[32];
        snprintf(what, sizeof what, "matmul %s", f->name);
        report(rx_isa_name(), what, bad, N * M);
        free(w); free(x); free(y); free(a);
    }
}

int main(int argc, char **argv) {
    const char *expected = argc > 1 ? argv[1] : NULL;
    rx_isa g, t;
    rx_fill_generic(&g);
    unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    int dp = (hw & (1ul << 20)) != 0, mm = dp && (hw2 & (1ul << 13)) != 0;
    printf("hwcaps: asimddp %d, i8mm %d\n", dp, mm);
    t = g;
    rx_fill_neon(&t);
    check_table(&g, &t);
    if (dp) { t = g; rx_fill_dotprod(&t); check_table(&g, &t); }
    if (mm) { t = g; rx_fill_i8mm(&t); check_table(&g, &t); }
    rx_set_threads(2);
    const char *isa = rx_isa_name();
    int pick_ok = !expected || !strcmp(isa, expected);
    if (pick_ok) passed++;
    else failed++;
    printf("ops.c picks %s%s%s\n", isa, expected ? ", expected " : "", expected ? expected : "");
    check_matmul(&g);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
