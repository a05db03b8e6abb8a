/* reflex-ipc CPU backend: the thread pool and the op drivers called from Python
 * (reflex_ipc/backends/cpu_ops.py, through ctypes).
 *
 * Thread pool: nth-1 workers plus the calling thread. A job is n_chunks
 * independent chunks; every thread claims chunks with one compare-and-swap on
 * a word holding (generation, n_chunks, next chunk), so a thread that the OS
 * deschedules (a busy neighbour on its core) simply claims fewer chunks instead
 * of holding everyone at a barrier. Workers spin briefly for the next job, then
 * sleep on a futex; the caller spins briefly for the last chunk, then sleeps, so
 * its core goes idle and the scheduler can move a preempted worker onto it.
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rx_cpu.h"
#include "rx_iq.h"
#define RX_ABI_REPLAY /* rx_replay_one: rx_run's dispatch of one recorded command */
#include "rx_abi.h"   /* generated from reflex_ipc/backends/cpu_abi.py: prototypes, replay codes */

#if defined(__aarch64__)
#include <sys/auxv.h>
#define RX_HWCAP_ASIMDDP (1ul << 20) /* asm/hwcap.h */
#define RX_HWCAP2_I8MM (1ul << 13)
#endif

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define RX_EXPORT __attribute__((visibility("default")))

static rx_isa T;
static int T_ready;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER; /* one op at a time */
static char g_isa_force[16]; /* rx_set_isa ($REFLEX_CPU_ISA): "" auto, "generic", "avx2", "neon", "dotprod" */

/* ------------------------------------------------------------------ cpu features */
static void init_isa(void) {
    if (T_ready) return;
    rx_fill_generic(&T);
#if defined(__x86_64__) || defined(_M_X64)
    void rx_fill_avx512vnni(rx_isa *t) __attribute__((weak));
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const char *force = g_isa_force; /* "generic" / "avx2": for tests */
    if (force && !strcmp(force, "generic")) avx2 = 0;
    if (avx2) {
        int vnni = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
                   __builtin_cpu_supports("avx512bw");
        if (force && !strcmp(force, "avx2")) vnni = 0;
#ifdef RX_NO_VNNI
        vnni = 0;
#endif
        if (vnni) rx_fill_avx512vnni(&T);
        else rx_fill_avx2(&T);
    }
#elif defined(__aarch64__)
    /* NEON is part of every aarch64 core; dotprod (SDOT) and i8mm (SMMLA) are read from
     * the kernel's hwcaps. The dotprod / i8mm objects are absent when the compiler could
     * not build them (weak symbols, then NULL). */
    void rx_fill_dotprod(rx_isa *t) __attribute__((weak));
    void rx_fill_i8mm(rx_isa *t) __attribute__((weak));
    unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    int dp = (hw & RX_HWCAP_ASIMDDP) && rx_fill_dotprod, mm = dp && (hw2 & RX_HWCAP2_I8MM) && rx_fill_i8mm;
    const char *force = g_isa_force; /* "generic" / "neon" / "dotprod": for tests */
    if (force && !strcmp(force, "neon")) dp = mm = 0;
    if (force && !strcmp(force, "dotprod")) mm = 0;
    if (!(force && !strcmp(force, "generic"))) {
        if (mm) rx_fill_i8mm(&T);
        else if (dp) rx_fill_dotprod(&T);
        else rx_fill_neon(&T);
    }
#endif
    T_ready = 1;
}

/* ------------------------------------------------------------------ futex / sleep */
static void wait_word(_Atomic uint32_t *w, uint32_t val) {
#if defined(__linux__)
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
#else
    (void)w; (void)val;
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
#endif
}

static void wake_word(_Atomic uint32_t *w) {
#if defined(__linux__)
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
#else
    (void)w;
#endif
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ------------------------------------------------------------------ thread pool */
typedef void (*chunk_fn)(void *ctx, int64_t chunk);

#define GEN_SHIFT 40
#define N_SHIFT 20
#define FIELD (((uint64_t)1 << 20) - 1)
#define MAX_CHUNKS ((int64_t)FIELD)

static _Atomic uint64_t g_job;        /* gen:24 | n_chunks:20 | next:20 */
static _Atomic uint32_t g_gen;        /* futex word: bumped once per job */
static _Atomic uint32_t g_done;       /* futex word: chunks finished in the current job */
static _Atomic int g_sleepers, g_main_waiting, g_quit;
static chunk_fn _Atomic g_fn;
static void *_Atomic g_ctx;
static int g_nth = 1;                 /* threads incl. the caller */
static pthread_t *g_workers;
static int g_n_workers;
static int64_t g_spin_ns = 150000;    /* workers: spin this long for the next job */
static int64_t g_wait_spin_ns = 30000; /* caller: spin this long for the last chunk */

/* Counters of the pool (rx_pool_stats), for profiles: where a pass's time goes between the
 * jobs. Relaxed atomic adds, a few per job. */
enum {
    POOL_STAT_JOBS,        /* jobs run on the pool */
    POOL_STAT_INLINE,      /* jobs run on the caller alone (small, solo, one chunk) */
    POOL_STAT_CALLER_WORK, /* ns the caller ran chunks of pool jobs */
    POOL_STAT_CALLER_WAIT, /* ns the caller waited after its last chunk for the others' */
    POOL_STAT_CALLER_SLEEPS,
    POOL_STAT_CALLER_CHUNKS,
    POOL_STAT_WORKER_CHUNKS,
    POOL_STAT_WORKER_WORK, /* ns workers ran chunks */
    POOL_STAT_WORKER_LATE, /* ns from a job's start to a worker's first look at it (wake-up) */
    POOL_STAT_WORKER_IDLE, /* ns workers spun or slept between jobs */
    POOL_STAT_WORKER_SLEEPS,
    POOL_STAT_WORKER_MISSED, /* jobs a worker arrived at with no chunk left */
    POOL_STAT_INLINE_NS,   /* ns of the inline jobs */
    POOL_STAT_N
};
static _Atomic int64_t g_stat[POOL_STAT_N];
static _Atomic int64_t g_job_t0; /* when the current job was published */

static inline void stat_add(int i, int64_t v) { atomic_fetch_add_explicit(&g_stat[i], v, memory_order_relaxed); }

/* out[0..n-1] = the counters (POOL_STAT_* order; fewer when n is smaller); reset: zero them
 * after. Returns how many there are. */
RX_EXPORT int64_t rx_pool_stats(int64_t *out, int64_t n, int64_t reset) {
    for (int64_t i = 0; i < n && i < POOL_STAT_N; i++)
        out[i] = reset ? atomic_exchange(&g_stat[i], 0) : atomic_load(&g_stat[i]);
    return POOL_STAT_N;
}

/* the chunks of job `gen` this thread claims; returns how many it ran */
static int64_t run_chunks(uint32_t gen) {
    uint64_t v = atomic_load(&g_job);
    int64_t ran = 0;
    for (;;) {
        if ((uint32_t)(v >> GEN_SHIFT) != (gen & 0xffffff)) return ran;
        uint64_t n = (v >> N_SHIFT) & FIELD, i = v & FIELD;
        if (i >= n) return ran;
        if (!atomic_compare_exchange_weak(&g_job, &v, v + 1)) continue;
        chunk_fn fn = atomic_load_explicit(&g_fn, memory_order_relaxed);
        void *ctx = atomic_load_explicit(&g_ctx, memory_order_relaxed);
        fn(ctx, (int64_t)i);
        ran++;
        uint32_t d = atomic_fetch_add(&g_done, 1) + 1;
        if (d == n && atomic_load(&g_main_waiting)) wake_word(&g_done);
        v = atomic_load(&g_job);
    }
}

static void *worker_main(void *arg) {
    (void)arg;
    uint32_t seen = atomic_load(&g_gen);
    for (;;) {
        uint32_t g;
        int64_t t0 = now_ns();
        int spins = 0;
        while ((g = atomic_load(&g_gen)) == seen) {
            cpu_relax();
            if (++spins == 256) {
                spins = 0;
                sched_yield(); /* a thread that shares this core (the caller, a neighbour) goes first */
                if (now_ns() - t0 > g_spin_ns) {
                    atomic_fetch_add(&g_sleepers, 1);
                    stat_add(POOL_STAT_WORKER_SLEEPS, 1);
                    while ((g = atomic_load(&g_gen)) == seen && !atomic_load(&g_quit)) wait_word(&g_gen, seen);
                    atomic_fetch_sub(&g_sleepers, 1);
                    break;
                }
            }
        }
        if (atomic_load(&g_quit)) return NULL;
        seen = g;
        int64_t t1 = now_ns(), pub = atomic_load_explicit(&g_job_t0, memory_order_relaxed);
        stat_add(POOL_STAT_WORKER_IDLE, t1 - t0);
        if (pub && t1 > pub) stat_add(POOL_STAT_WORKER_LATE, t1 - pub);
        int64_t ran = run_chunks(g);
        stat_add(POOL_STAT_WORKER_CHUNKS, ran);
        stat_add(POOL_STAT_WORKER_MISSED, ran == 0);
        stat_add(POOL_STAT_WORKER_WORK, now_ns() - t1);
    }
}

static void pool_stop(void) {
    if (!g_n_workers) return;
    atomic_store(&g_quit, 1);
    atomic_fetch_add(&g_gen, 1);
    wake_word(&g_gen);
    for (int i = 0; i < g_n_workers; i++) pthread_join(g_workers[i], NULL);
    free(g_workers);
    g_workers = NULL;
    g_n_workers = 0;
    atomic_store(&g_quit, 0);
}

static void pool_start(void) {
    if (g_n_workers == g_nth - 1) return;
    pool_stop();
    if (g_nth <= 1) return;
    g_workers = calloc((size_t)g_nth - 1, sizeof *g_workers);
    for (int i = 0; i < g_nth - 1; i++) {
        if (pthread_create(&g_workers[i], NULL, worker_main, NULL)) break;
        g_n_workers++;
    }
}

/* Contention: when the caller keeps waiting longer for other threads' last chunks than it
 * worked itself (their cores are taken by other processes), the next jobs run on the
 * caller alone for a while, then the pool is tried again. */
static int g_straggles;      /* consecutive jobs where waiting exceeded working */
static int64_t g_solo_jobs;  /* jobs left to run on the caller alone */
static int64_t g_solo_total; /* jobs run alone since load (reported) */

RX_EXPORT int64_t rx_solo_jobs(void) { return g_solo_total; }

/* Run fn(ctx, c) for c in [0, n): on the pool when parallel is set and n > 1. */
static void pool_run(chunk_fn fn, void *ctx, int64_t n, int parallel) {
    if (n <= 0) return;
    if (parallel && g_solo_jobs > 0) {
        g_solo_jobs--;
        g_solo_total++;
        parallel = 0;
    }
    if (!parallel || n == 1 || g_nth <= 1) {
        int64_t t = now_ns();
        for (int64_t c = 0; c < n; c++) fn(ctx, c);
        stat_add(POOL_STAT_INLINE, 1);
        stat_add(POOL_STAT_INLINE_NS, now_ns() - t);
        return;
    }
    pool_start();
    if (!g_n_workers) {
        for (int64_t c = 0; c < n; c++) fn(ctx, c);
        return;
    }
    if (n > MAX_CHUNKS) { /* beyond the job word's field: run inline (our drivers stay below) */
        for (int64_t c = 0; c < n; c++) fn(ctx, c);
        return;
    }
    atomic_store_explicit(&g_fn, fn, memory_order_relaxed);
    atomic_store_explicit(&g_ctx, ctx, memory_order_relaxed);
    atomic_store(&g_done, 0);
    uint32_t gen = atomic_load(&g_gen) + 1;
    int64_t t_start = now_ns();
    atomic_store_explicit(&g_job_t0, t_start, memory_order_relaxed);
    atomic_store(&g_job, ((uint64_t)(gen & 0xffffff) << GEN_SHIFT) | ((uint64_t)n << N_SHIFT));
    atomic_store(&g_gen, gen);
    if (atomic_load(&g_sleepers)) wake_word(&g_gen);
    stat_add(POOL_STAT_CALLER_CHUNKS, run_chunks(gen));
    /* wait for chunks other threads claimed */
    int64_t t0 = now_ns();
    int spins = 0;
    while (atomic_load(&g_done) < (uint32_t)n) {
        cpu_relax();
        if (++spins == 64) {
            spins = 0;
            sched_yield();
            if (now_ns() - t0 > g_wait_spin_ns) {
                atomic_store(&g_main_waiting, 1);
                stat_add(POOL_STAT_CALLER_SLEEPS, 1);
                uint32_t d;
                while ((d = atomic_load(&g_done)) < (uint32_t)n) wait_word(&g_done, d);
                atomic_store(&g_main_waiting, 0);
                break;
            }
        }
    }
    int64_t t_end = now_ns();
    stat_add(POOL_STAT_JOBS, 1);
    stat_add(POOL_STAT_CALLER_WORK, t0 - t_start);
    stat_add(POOL_STAT_CALLER_WAIT, t_end - t0);
    if (t_end - t0 > (t0 - t_start) + 20000) { /* waited more than worked (+20 us) */
        if (++g_straggles >= 4) {
            g_solo_jobs = 512; /* a few decode steps alone, then try the pool again */
            g_straggles = 0;
        }
    } else {
        g_straggles = 0;
    }
}

RX_EXPORT int rx_set_threads(int n) {
    pthread_mutex_lock(&g_lock);
    init_isa();
    if (n < 1) n = 1;
    if (n > 256) n = 256;
    if (n != g_nth) {
        pool_stop();
        g_nth = n;
    }
    pthread_mutex_unlock(&g_lock);
    return g_nth;
}

RX_EXPORT int rx_threads(void) { return g_nth; }

/* The kernel set: "auto" (the CPU's best), "generic" (portable C), "avx2" (no VNNI). Takes
 * effect at the next op. 0, or -1 for another name. */
RX_EXPORT int rx_set_isa(const char *name) {
    if (!name || (strcmp(name, "auto") && strcmp(name, "generic") && strcmp(name, "avx2") && strcmp(name, "neon") &&
                  strcmp(name, "dotprod")))
        return -1;
    pthread_mutex_lock(&g_lock);
    strcpy(g_isa_force, strcmp(name, "auto") ? name : "");
    T_ready = 0;
    pthread_mutex_unlock(&g_lock);
    return 0;
}

RX_EXPORT void rx_set_spin(int64_t worker_ns, int64_t wait_ns) {
    if (worker_ns >= 0) g_spin_ns = worker_ns;
    if (wait_ns >= 0) g_wait_spin_ns = wait_ns;
}

RX_EXPORT const char *rx_isa_name(void) {
    init_isa();
    return T.name;
}

RX_EXPORT int rx_abi_version(void) { return RX_ABI_VERSION; }

/* ------------------------------------------------------------------ scratch */
static void *g_scratch[3];
static size_t g_scratch_cap[3];

static void *scratch(int i, size_t bytes) {
    if (bytes > g_scratch_cap[i]) {
        free(g_scratch[i]);
        size_t cap = bytes + bytes / 2 + 4096;
        g_scratch[i] = aligned_alloc(64, (cap + 63) / 64 * 64);
        g_scratch_cap[i] = g_scratch[i] ? cap : 0;
    }
    return g_scratch[i];
}

static _Thread_local float *tl_buf;
static _Thread_local size_t tl_cap;

static float *thread_buf(size_t n) {
    if (n > tl_cap) {
        free(tl_buf);
        tl_cap = n + 1024;
        tl_buf = malloc(tl_cap * sizeof(float));
    }
    return tl_buf;
}

/* ------------------------------------------------------------------ matmul */
/* A weight (rx_weight, rx_abi.h): `M` rows of `K` values of ggml type `type`, row r at
 * data + r * row_bytes. */
static int act_format(int64_t type) {
    switch (type) {
    case RX_F32: case RX_F16: case RX_BF16: return RX_ACT_F32;
    case RX_Q4_0: case RX_Q4_1: case RX_Q5_0: case RX_Q5_1: case RX_Q8_0: return RX_ACT_A32;
    case RX_Q4_K: case RX_Q5_K: case RX_Q6_K: case RX_Q8_K: return RX_ACT_A256;
    default: return rx_iq_act_format((int)type); /* iq.c's formats, else RX_ACT_NONE */
    }
}

RX_EXPORT int rx_act_format(int64_t type) { return act_format(type); }

typedef struct {
    const float *x;
    int64_t N, K, ldx;
    int fmt;
    void *out;
    int64_t rows_per_chunk;
} quant_job;

static void quant_chunk(void *p, int64_t c) {
    quant_job *j = p;
    int64_t r0 = c * j->rows_per_chunk, r1 = r0 + j->rows_per_chunk;
    if (r1 > j->N) r1 = j->N;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = j->x + r * j->ldx;
        if (j->fmt == RX_ACT_A32) T.quant_a32(x, (rx_a32 *)j->out + r * (j->K / 32), j->K);
        else T.quant_a256(x, (rx_a256 *)j->out + r * (j->K / 256), j->K);
    }
}

static size_t act_row_bytes(int fmt, int64_t K) {
    if (fmt == RX_ACT_A32) return (size_t)(K / 32) * sizeof(rx_a32);
    if (fmt == RX_ACT_A256) return (size_t)(K / 256) * sizeof(rx_a256);
    return (size_t)K * sizeof(float);
}

/* the activations x [N, K] in `fmt`: x itself for F32 (when contiguous), else a scratch copy */
static const void *prepare(int slot, int fmt, const float *x, int64_t N, int64_t K, int64_t ldx) {
    if (fmt == RX_ACT_F32) {
        if (ldx == K) return x;
        float *y = scratch(slot, (size_t)N * K * sizeof(float));
        for (int64_t r = 0; r < N; r++) memcpy(y + r * K, x + r * ldx, (size_t)K * sizeof(float));
        return y;
    }
    void *y = scratch(slot, (size_t)N * act_row_bytes(fmt, K));
    quant_job j = {x, N, K, ldx, fmt, y, 1};
    int64_t work = N * K;
    j.rows_per_chunk = N >= 4 * g_nth ? (N + 4 * g_nth - 1) / (4 * g_nth) : 1;
    pool_run(quant_chunk, &j, (N + j.rows_per_chunk - 1) / j.rows_per_chunk, work >= 32768);
    return y;
}

typedef struct {
    int nw, mode, accumulate;
    int64_t N, K;
    const rx_weight *w[3];
    const void *a[3];
    size_t a_row[3];
    float *y[3];
    int64_t row0[4];      /* start of each weight in the concatenated row space */
    int64_t rows, rows_per_chunk;
} mm_job;

#define SQRT_2_OVER_PI 0.79788456080286535588f

static inline float act_silu(float g) { return g / (1.f + expf(-g)); }
static inline float act_gelu(float g) {
    return 0.5f * g * (1.f + tanhf(SQRT_2_OVER_PI * (g + 0.044715f * g * g * g)));
}

/* out[i] = act(g[i]) * u[i] (u NULL: act(g[i])), act silu (mode 1) or gelu (mode 2): the table's
 * vector version where it has one, else these scalar loops (the portable path's results) */
static void glu_apply(int mode, float *out, const float *g, const float *u, int64_t n) {
    if (T.act) {
        T.act(mode, out, g, u, n);
        return;
    }
    if (mode == 1) {
        if (u) for (int64_t i = 0; i < n; i++) out[i] = act_silu(g[i]) * u[i];
        else for (int64_t i = 0; i < n; i++) out[i] = act_silu(g[i]);
    } else {
        if (u) for (int64_t i = 0; i < n; i++) out[i] = act_gelu(g[i]) * u[i];
        else for (int64_t i = 0; i < n; i++) out[i] = act_gelu(g[i]);
    }
}

static _Thread_local float *tl_up;
static _Thread_local size_t tl_up_cap;

static float *up_buf(size_t n) { /* the up projections of a chunk's rows */
    if (n > tl_up_cap) {
        free(tl_up);
        tl_up_cap = n + 256;
        tl_up = malloc(tl_up_cap * sizeof(float));
    }
    return tl_up;
}

static _Thread_local uint8_t *tl_panel;
static _Thread_local size_t tl_panel_cap;

static uint8_t *panel_buf(size_t n) { /* a chunk's packed weight rows (two panels for a gated unit) */
    if (n > tl_panel_cap) {
        free(tl_panel);
        tl_panel_cap = n + 4096;
        tl_panel = aligned_alloc(64, (tl_panel_cap + 63) / 64 * 64);
        if (!tl_panel) tl_panel_cap = 0;
    }
    return tl_panel;
}

#define PANEL_COLS 32 /* activation rows per gated-unit step: the two panels' outputs stay in L1 */

/* rows [r0, r1) of weight w (row 0 at w->data) against all N activation rows, through panels
 * of RX_PANEL_M rows: y[n * ldy + r - r0] (+)= the products. 0, or -1 when there is no buffer. */
static int mm_panels(const rx_weight *w, int64_t K, const uint8_t *a, size_t a_row, int64_t N, int64_t r0,
                     int64_t r1, float *y, int64_t ldy, int accumulate) {
    int t = (int)w->type;
    uint8_t *pb = panel_buf((size_t)(K / (act_format(t) == RX_ACT_A32 ? 32 : 256)) * (size_t)T.panel_bytes[t]);
    if (!pb) return -1;
    int pm = T.panel_m;
    for (int64_t r = r0; r < r1; r += pm) {
        int rows = r1 - r < pm ? (int)(r1 - r) : pm;
        T.pack[t](K, w->data + r * w->row_bytes, w->row_bytes, rows, pb);
        T.panel[t](K, pb, a, a_row, N, y + (r - r0), ldy, rows, accumulate);
    }
    return 0;
}

/* the gated unit's rows [r0, r1) through panels: gate and up of PANEL_COLS activation rows,
 * then the unit, into y [N, M] */
static int glu_panels(const mm_job *j, int64_t r0, int64_t r1) {
    const rx_weight *wg = j->w[0], *wu = j->w[1];
    int tg = (int)wg->type, tu = (int)wu->type;
    size_t bg = (size_t)(j->K / (act_format(tg) == RX_ACT_A32 ? 32 : 256)) * (size_t)T.panel_bytes[tg];
    size_t bu = (size_t)(j->K / (act_format(tu) == RX_ACT_A32 ? 32 : 256)) * (size_t)T.panel_bytes[tu];
    uint8_t *pg = panel_buf(bg + bu);
    if (!pg) return -1;
    uint8_t *pu = pg + bg;
    float g[PANEL_COLS * RX_PANEL_M], u[PANEL_COLS * RX_PANEL_M];
    int pm = T.panel_m;
    for (int64_t r = r0; r < r1; r += pm) {
        int rows = r1 - r < pm ? (int)(r1 - r) : pm;
        T.pack[tg](j->K, wg->data + r * wg->row_bytes, wg->row_bytes, rows, pg);
        T.pack[tu](j->K, wu->data + r * wu->row_bytes, wu->row_bytes, rows, pu);
        for (int64_t n0 = 0; n0 < j->N; n0 += PANEL_COLS) {
            int64_t nc = j->N - n0 < PANEL_COLS ? j->N - n0 : PANEL_COLS;
            T.panel[tg](j->K, pg, (const uint8_t *)j->a[0] + n0 * j->a_row[0], j->a_row[0], nc, g, pm, pm, 0);
            T.panel[tu](j->K, pu, (const uint8_t *)j->a[1] + n0 * j->a_row[1], j->a_row[1], nc, u, pm, pm, 0);
            glu_apply(j->mode, g, g, u, nc * pm);
            for (int64_t c = 0; c < nc; c++)
                memcpy(j->y[0] + (n0 + c) * wg->M + r, g + c * pm, (size_t)rows * sizeof(float));
        }
    }
    return 0;
}

static void mm_chunk(void *p, int64_t c) {
    mm_job *j = p;
    int64_t r0 = c * j->rows_per_chunk, r1 = r0 + j->rows_per_chunk;
    if (r1 > j->rows) r1 = j->rows;
    if (j->mode && j->N >= RX_PANEL_MIN_N && T.panel[j->w[0]->type] && T.panel[j->w[1]->type] &&
        !glu_panels(j, r0, r1))
        return;
    if (j->mode) { /* gated unit: rows of gate and up together */
        const rx_weight *wg = j->w[0], *wu = j->w[1];
        rx_dot_fn dg = T.dot[wg->type], du = T.dot[wu->type];
        rx_dot2_fn dg2 = T.dot2[wg->type], du2 = T.dot2[wu->type];
        rx_tile_fn tg = T.tile[wg->type], tu = T.tile[wu->type];
        rx_tile_fn tg8 = T.tile8[wg->type], tu8 = T.tile8[wu->type];
        int64_t n0 = 0;
        if (tg && tu && j->N >= RX_TILE_N) { /* tiles of 8 or 4 activation rows x 4 weight rows */
            int64_t rt = r0 + (r1 - r0) / RX_TILE_M * RX_TILE_M;
            float g[2 * RX_TILE_N * RX_TILE_M], u[2 * RX_TILE_N * RX_TILE_M];
            for (int nc; n0 + RX_TILE_N <= j->N; n0 += nc) {
                int wide = tg8 && tu8 && n0 + 2 * RX_TILE_N <= j->N;
                rx_tile_fn fg = wide ? tg8 : tg, fu = wide ? tu8 : tu;
                nc = wide ? 2 * RX_TILE_N : RX_TILE_N;
                const uint8_t *ag = (const uint8_t *)j->a[0] + n0 * j->a_row[0];
                const uint8_t *au = (const uint8_t *)j->a[1] + n0 * j->a_row[1];
                float *y = j->y[0] + n0 * wg->M;
                for (int64_t r = r0; r < r1; r += RX_TILE_M) {
                    if (r < rt) {
                        fg(j->K, wg->data + r * wg->row_bytes, wg->row_bytes, ag, j->a_row[0], g, RX_TILE_M);
                        fu(j->K, wu->data + r * wu->row_bytes, wu->row_bytes, au, j->a_row[1], u, RX_TILE_M);
                        glu_apply(j->mode, g, g, u, (int64_t)nc * RX_TILE_M);
                        for (int c = 0; c < nc; c++)
                            memcpy(y + c * wg->M + r, g + c * RX_TILE_M, RX_TILE_M * sizeof(float));
                        continue;
                    }
                    for (int c = 0; c < nc; c++)
                        for (int64_t i = 0; r + i < r1; i++) {
                            float gv = dg(j->K, wg->data + (r + i) * wg->row_bytes, ag + c * j->a_row[0]);
                            float uv = du(j->K, wu->data + (r + i) * wu->row_bytes, au + c * j->a_row[1]);
                            glu_apply(j->mode, y + c * wg->M + r + i, &gv, &uv, 1);
                        }
                }
            }
        }
        int64_t nc = j->N - n0;
        if (nc > 0 && nc < RX_TILE_N && T.tile_c[nc][wg->type] && T.tile_c[nc][wu->type]) {
            /* the activation rows left (one-token steps: 1) in tiles of 4 weight rows: the gate
             * projections into y, the up ones into a buffer, then the unit over the rows */
            rx_tile_fn fg = T.tile_c[nc][wg->type], fu = T.tile_c[nc][wu->type];
            int64_t rt = r0 + (r1 - r0) / RX_TILE_M * RX_TILE_M, nr = r1 - r0;
            const uint8_t *ag = (const uint8_t *)j->a[0] + n0 * j->a_row[0];
            const uint8_t *au = (const uint8_t *)j->a[1] + n0 * j->a_row[1];
            float *y = j->y[0] + n0 * wg->M;
            float *ub = up_buf((size_t)(nc * nr));
            for (int64_t r = r0; r < rt; r += RX_TILE_M) {
                fg(j->K, wg->data + r * wg->row_bytes, wg->row_bytes, ag, j->a_row[0], y + r, wg->M);
                fu(j->K, wu->data + r * wu->row_bytes, wu->row_bytes, au, j->a_row[1], ub + (r - r0), nr);
            }
            for (int64_t c = 0; c < nc; c++) {
                for (int64_t r = rt; r < r1; r++) {
                    y[c * wg->M + r] = dg(j->K, wg->data + r * wg->row_bytes, ag + c * j->a_row[0]);
                    ub[c * nr + r - r0] = du(j->K, wu->data + r * wu->row_bytes, au + c * j->a_row[1]);
                }
                glu_apply(j->mode, y + c * wg->M + r0, y + c * wg->M + r0, ub + c * nr, nr);
            }
            return;
        }
        for (int64_t n = n0; n < j->N;) {
            const uint8_t *ag = (const uint8_t *)j->a[0] + n * j->a_row[0];
            const uint8_t *au = (const uint8_t *)j->a[1] + n * j->a_row[1];
            float *y = j->y[0] + n * wg->M;
            /* the gate projections into y, the up ones into a buffer, then the unit over the rows */
            float *ub = up_buf((size_t)(2 * (r1 - r0)));
            if (dg2 && du2 && n + 1 < j->N) { /* two rows of activations at a time */
                float g[2], u[2];
                for (int64_t r = r0; r < r1; r++) {
                    dg2(j->K, wg->data + r * wg->row_bytes, ag, ag + j->a_row[0], g);
                    du2(j->K, wu->data + r * wu->row_bytes, au, au + j->a_row[1], u);
                    y[r] = g[0];
                    y[wg->M + r] = g[1];
                    ub[r - r0] = u[0];
                    ub[r1 - r0 + r - r0] = u[1];
                }
                glu_apply(j->mode, y + r0, y + r0, ub, r1 - r0);
                glu_apply(j->mode, y + wg->M + r0, y + wg->M + r0, ub + (r1 - r0), r1 - r0);
                n += 2;
                continue;
            }
            for (int64_t r = r0; r < r1; r++) {
                y[r] = dg(j->K, wg->data + r * wg->row_bytes, ag);
                ub[r - r0] = du(j->K, wu->data + r * wu->row_bytes, au);
            }
            glu_apply(j->mode, y + r0, y + r0, ub, r1 - r0);
            n += 1;
        }
        return;
    }
    for (int i = 0; i < j->nw; i++) {
        int64_t a0 = r0 > j->row0[i] ? r0 : j->row0[i];
        int64_t a1 = r1 < j->row0[i + 1] ? r1 : j->row0[i + 1];
        if (a0 >= a1) continue;
        const rx_weight *w = j->w[i];
        rx_dot_fn dot = T.dot[w->type];
        rx_dot2_fn dot2 = T.dot2[w->type];
        rx_tile_fn tile = T.tile[w->type], tile8 = T.tile8[w->type];
        int64_t base = j->row0[i], n0 = 0;
        if (j->N >= RX_PANEL_MIN_N && T.panel[w->type] &&
            !mm_panels(w, j->K, j->a[i], j->a_row[i], j->N, a0 - base, a1 - base, j->y[i] + a0 - base, w->M,
                       j->accumulate))
            continue;
        if (tile && j->N >= RX_TILE_N) { /* tiles of 8 or 4 activation rows x 4 weight rows */
            int64_t rt = a0 + (a1 - a0) / RX_TILE_M * RX_TILE_M;
            float t[2 * RX_TILE_N * RX_TILE_M];
            for (int nc; n0 + RX_TILE_N <= j->N; n0 += nc) {
                int wide = tile8 && n0 + 2 * RX_TILE_N <= j->N;
                rx_tile_fn f = wide ? tile8 : tile;
                nc = wide ? 2 * RX_TILE_N : RX_TILE_N;
                const uint8_t *a = (const uint8_t *)j->a[i] + n0 * j->a_row[i];
                float *y = j->y[i] + n0 * w->M - base;
                for (int64_t r = a0; r < a1; r += RX_TILE_M) {
                    if (r < rt) f(j->K, w->data + (r - base) * w->row_bytes, w->row_bytes, a, j->a_row[i], t, RX_TILE_M);
                    for (int c = 0; c < nc; c++)
                        for (int64_t k = 0; k < RX_TILE_M && r + k < a1; k++) {
                            float v = r < rt ? t[c * RX_TILE_M + k]
                                             : dot(j->K, w->data + (r + k - base) * w->row_bytes, a + c * j->a_row[i]);
                            if (j->accumulate) y[c * w->M + r + k] += v;
                            else y[c * w->M + r + k] = v;
                        }
                }
            }
        }
        int64_t nc = j->N - n0;
        rx_tile_fn tc = nc > 0 && nc < RX_TILE_N ? T.tile_c[nc][w->type] : NULL;
        if (tc) { /* the activation rows left (one-token steps: 1) in tiles of 4 weight rows */
            int64_t rt = a0 + (a1 - a0) / RX_TILE_M * RX_TILE_M;
            const uint8_t *a = (const uint8_t *)j->a[i] + n0 * j->a_row[i];
            float *y = j->y[i] + n0 * w->M - base;
            float t[RX_TILE_N * RX_TILE_M];
            for (int64_t r = a0; r < a1; r += RX_TILE_M) {
                if (r < rt && !j->accumulate) { /* straight into y */
                    tc(j->K, w->data + (r - base) * w->row_bytes, w->row_bytes, a, j->a_row[i], y + r, w->M);
                    continue;
                }
                if (r < rt) tc(j->K, w->data + (r - base) * w->row_bytes, w->row_bytes, a, j->a_row[i], t, RX_TILE_M);
                for (int64_t c = 0; c < nc; c++)
                    for (int64_t k = 0; k < RX_TILE_M && r + k < a1; k++) {
                        float v = r < rt ? t[c * RX_TILE_M + k]
                                         : dot(j->K, w->data + (r + k - base) * w->row_bytes, a + c * j->a_row[i]);
                        if (j->accumulate) y[c * w->M + r + k] += v;
                        else y[c * w->M + r + k] = v;
                    }
            }
            continue;
        }
        for (int64_t n = n0; n < j->N;) {
            const uint8_t *a = (const uint8_t *)j->a[i] + n * j->a_row[i];
            float *y = j->y[i] + n * w->M - base;
            if (dot2 && n + 1 < j->N) {
                float s2[2];
                for (int64_t r = a0; r < a1; r++) {
                    dot2(j->K, w->data + (r - base) * w->row_bytes, a, a + j->a_row[i], s2);
                    if (j->accumulate) { y[r] += s2[0]; y[w->M + r] += s2[1]; }
                    else { y[r] = s2[0]; y[w->M + r] = s2[1]; }
                }
                n += 2;
                continue;
            }
            if (j->accumulate) {
                for (int64_t r = a0; r < a1; r++) y[r] += dot(j->K, w->data + (r - base) * w->row_bytes, a);
            } else {
                for (int64_t r = a0; r < a1; r++) y[r] = dot(j->K, w->data + (r - base) * w->row_bytes, a);
            }
            n += 1;
        }
    }
}

/* y_i [N, M_i] = x [N, K] (row stride ldx) times w_i^T for the nw (1..3) weights.
 * mode 1 / 2: a gated unit, y_0 = silu / gelu(x w_0^T) * (x w_1^T).
 * accumulate: y_i += the product (mode 0 only). Returns 0, or -1 for an unsupported type. */
RX_EXPORT int rx_matmul(int64_t N, int64_t K, const float *x, int64_t ldx, int64_t nw,
                        const rx_weight *w0, const rx_weight *w1, const rx_weight *w2,
                        float *y0, float *y1, float *y2, int64_t mode, int64_t accumulate) {
    pthread_mutex_lock(&g_lock);
    init_isa();
    mm_job j;
    memset(&j, 0, sizeof j);
    j.nw = (int)nw; j.mode = (int)mode; j.accumulate = (int)accumulate; j.N = N; j.K = K;
    j.w[0] = w0; j.w[1] = w1; j.w[2] = w2;
    j.y[0] = y0; j.y[1] = y1; j.y[2] = y2;
    int fmts[3], slot_of_fmt[4] = {-1, -1, -1, -1}, used = 0;
    for (int i = 0; i < j.nw; i++) {
        fmts[i] = act_format(j.w[i]->type);
        if (!fmts[i] || !T.dot[j.w[i]->type]) {
            pthread_mutex_unlock(&g_lock);
            return -1;
        }
        if (slot_of_fmt[fmts[i]] < 0) {
            slot_of_fmt[fmts[i]] = used;
            j.a[i] = prepare(used++, fmts[i], x, N, K, ldx);
            if (!j.a[i]) { pthread_mutex_unlock(&g_lock); return -2; }
        } else {
            for (int k = 0; k < i; k++) if (fmts[k] == fmts[i]) j.a[i] = j.a[k];
        }
        j.a_row[i] = fmts[i] == RX_ACT_F32 ? (size_t)K * sizeof(float) : act_row_bytes(fmts[i], K);
        j.row0[i + 1] = j.row0[i] + j.w[i]->M;
    }
    j.rows = j.mode ? j.w[0]->M : j.row0[j.nw];
    /* chunks: about 8 per thread for one row of activations; at least 4 rows each */
    int64_t per = (j.rows + 8 * g_nth - 1) / (8 * g_nth);
    if (N > 1) per = N >= 64 ? 8 : 16;
    if (per < 4) per = 4;
    if (N >= RX_PANEL_MIN_N && per < T.panel_m) per = T.panel_m; /* whole panels */
    per = (per + 3) & ~(int64_t)3;
    j.rows_per_chunk = per;
    int64_t n_chunks = (j.rows + per - 1) / per;
    /* small products are not worth waking the pool */
    double work = (double)N * (double)j.rows * (double)K;
    pool_run(mm_chunk, &j, n_chunks, work >= 65536.0);
    pthread_mutex_unlock(&g_lock);
    return 0;
}

/* One weight row dotted with one float32 activation row, through the same kernels
 * (activation quantization included): for the kernel tests. */
RX_EXPORT float rx_dot(const rx_weight *w, int64_t row, const float *x) {
    float y = 0.f;
    rx_weight sub = *w;
    sub.data = w->data + row * w->row_bytes;
    sub.M = 1;
    if (rx_matmul(1, w->K, x, w->K, 1, &sub, NULL, NULL, &y, NULL, NULL, 0, 0)) return NAN;
    return y;
}

/* ------------------------------------------------------------------ norms, rope */
typedef struct {
    int64_t N, H, hd, n_rot;
    const int32_t *pos;
    double base, freq_scale, mscale;
    const float *ff;
    int neox;
} rope_params;

static float *g_rope_tab;   /* [N, n_rot/2] cos, then sin */
static size_t g_rope_cap;
static rope_params g_rope_key;
static int32_t *g_rope_pos;
static size_t g_rope_pos_cap;
static int g_rope_valid;
static float g_rope_ff[512]; /* the frequency factors the table was made with */

static const float *rope_table(const rope_params *p) {
    int64_t half = p->n_rot / 2, N = p->N;
    if (g_rope_valid && g_rope_key.N == N && g_rope_key.n_rot == p->n_rot && g_rope_key.base == p->base &&
        g_rope_key.freq_scale == p->freq_scale && g_rope_key.mscale == p->mscale &&
        (g_rope_key.ff == NULL) == (p->ff == NULL) &&
        (p->ff == NULL || !memcmp(g_rope_ff, p->ff, (size_t)half * sizeof(float))) &&
        !memcmp(g_rope_pos, p->pos, (size_t)N * sizeof(int32_t)))
        return g_rope_tab;
    size_t need = (size_t)N * half * 2;
    if (need > g_rope_cap) {
        free(g_rope_tab);
        g_rope_tab = malloc(need * sizeof(float));
        g_rope_cap = need;
    }
    if ((size_t)N > g_rope_pos_cap) {
        free(g_rope_pos);
        g_rope_pos = malloc((size_t)N * sizeof(int32_t));
        g_rope_pos_cap = (size_t)N;
    }
    double inv[512];
    for (int64_t i = 0; i < half && i < 512; i++) {
        inv[i] = pow(p->base, -2.0 * (double)i / (double)p->n_rot) * p->freq_scale;
        if (p->ff) inv[i] /= (double)p->ff[i];
    }
    for (int64_t n = 0; n < N; n++) {
        float *c = g_rope_tab + (size_t)n * half * 2, *s = c + half;
        for (int64_t i = 0; i < half; i++) {
            double a = (double)p->pos[n] * inv[i];
            c[i] = (float)(cos(a) * p->mscale);
            s[i] = (float)(sin(a) * p->mscale);
        }
    }
    memcpy(g_rope_pos, p->pos, (size_t)N * sizeof(int32_t));
    if (p->ff) memcpy(g_rope_ff, p->ff, (size_t)half * sizeof(float));
    g_rope_key = *p;
    g_rope_valid = 1;
    return g_rope_tab;
}

static void rms_row(const float *x, float *y, const float *w, int64_t D, float eps) {
    if (T.rms_row) {
        T.rms_row(x, y, w, D, eps);
        return;
    }
    double ss = 0.0;
    for (int64_t i = 0; i < D; i++) ss += (double)x[i] * x[i];
    float ms = (float)(ss / (double)D) + eps;
    float r = 1.f / sqrtf(ms);
    if (w) for (int64_t i = 0; i < D; i++) y[i] = (x[i] * r) * w[i];
    else for (int64_t i = 0; i < D; i++) y[i] = x[i] * r;
}

/* Row-wise ops on the pool: a chunk is ROW_CHUNK rows (their results do not depend on the split) */
#define ROW_CHUNK 16
#define ROWS_PARALLEL 65536 /* values: fewer run on the caller alone */

typedef struct {
    const float *x, *w;
    float *y;
    int64_t R, D;
    float eps;
} rms_job;

static void rms_chunk(void *p, int64_t c) {
    const rms_job *j = p;
    int64_t r1 = (c + 1) * ROW_CHUNK < j->R ? (c + 1) * ROW_CHUNK : j->R;
    for (int64_t r = c * ROW_CHUNK; r < r1; r++) rms_row(j->x + r * j->D, j->y + r * j->D, j->w, j->D, j->eps);
}

/* y [R, D] = rms_norm(x [R, D]) * w (w may be NULL; y may be x) */
RX_EXPORT void rx_rms_norm(const float *x, float *y, const float *w, int64_t R, int64_t D, float eps) {
    pthread_mutex_lock(&g_lock);
    init_isa();
    rms_job j = {x, w, y, R, D, eps};
    pool_run(rms_chunk, &j, (R + ROW_CHUNK - 1) / ROW_CHUNK, R * D >= ROWS_PARALLEL);
    pthread_mutex_unlock(&g_lock);
}

static void rope_row(float *v, const float *c, const float *s, int64_t half, int neox) {
    for (int64_t i = 0; i < half; i++) {
        int64_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        float xa = v[a], xb = v[b];
        v[a] = xa * c[i] - xb * s[i];
        v[b] = xa * s[i] + xb * c[i];
    }
}

typedef struct {
    float *x;
    const float *tab, *w;
    int64_t N, H, hd, half;
    int neox, norm;
    float eps;
} rope_job;

static void rope_chunk(void *p, int64_t ch) {
    const rope_job *j = p;
    int64_t n1 = (ch + 1) * ROW_CHUNK < j->N ? (ch + 1) * ROW_CHUNK : j->N;
    for (int64_t n = ch * ROW_CHUNK; n < n1; n++) {
        const float *c = j->tab + (size_t)n * j->half * 2, *s = c + j->half;
        for (int64_t h = 0; h < j->H; h++) {
            float *v = j->x + (n * j->H + h) * j->hd;
            if (j->norm) rms_row(v, v, j->w, j->hd, j->eps);
            rope_row(v, c, s, j->half, j->neox);
        }
    }
}

/* In place on x [N, H, hd]: optional per-head RMSNorm (norm != 0; w may be NULL), then
 * rotary at pos [N] over the first n_rot dims of each head. */
RX_EXPORT void rx_norm_rope(float *x, int64_t N, int64_t H, int64_t hd, const int32_t *pos, int64_t n_rot,
                            double base, double freq_scale, const float *ff, int64_t neox, double mscale,
                            int64_t norm, const float *w, float eps) {
    pthread_mutex_lock(&g_lock);
    init_isa();
    rope_params p = {N, H, hd, n_rot, pos, base, freq_scale, mscale, ff, (int)neox};
    rope_job j = {x, rope_table(&p), w, N, H, hd, n_rot / 2, (int)neox, (int)norm, eps};
    pool_run(rope_chunk, &j, (N + ROW_CHUNK - 1) / ROW_CHUNK, N * H * hd >= ROWS_PARALLEL);
    pthread_mutex_unlock(&g_lock);
}

/* ------------------------------------------------------------------ KV cache, attention */
/* Write k [N, Hkv, hdk], v [N, Hkv, hdv] into kc [Hkv, n_slots, hdk], vc [Hkv, n_slots, hdv]
 * at slots[n]; f16: the caches hold float16. */
RX_EXPORT void rx_kv_store(void *kc, void *vc, const float *k, const float *v, const int32_t *slots,
                           int64_t N, int64_t Hkv, int64_t n_slots, int64_t hdk, int64_t hdv, int64_t f16) {
    init_isa();
    for (int64_t n = 0; n < N; n++) {
        int64_t s = slots[n];
        for (int64_t h = 0; h < Hkv; h++) {
            const float *ks = k + (n * Hkv + h) * hdk, *vs = v + (n * Hkv + h) * hdv;
            size_t kr = (size_t)(h * n_slots + s), vr = kr;
            if (f16) {
                T.to_f16(ks, (uint16_t *)kc + kr * hdk, hdk);
                T.to_f16(vs, (uint16_t *)vc + vr * hdv, hdv);
            } else {
                memcpy((float *)kc + kr * hdk, ks, (size_t)hdk * sizeof(float));
                memcpy((float *)vc + vr * hdv, vs, (size_t)hdv * sizeof(float));
            }
        }
    }
}

typedef struct {
    const float *q;
    const void *kc, *vc;
    float *out;
    const int32_t *pos;
    const float *mask;
    int64_t N, Hq, Hkv, n_slots, hdk, hdv, n_kv, window;
    float scale, softcap;
    int causal, f16;
    int64_t ldv; /* values: row t of kv head h at vc + ((h * n_slots) + t) * ldv */
    const float *sinks; /* [Hq] attention sinks, or NULL */
    int64_t chunk;      /* chunked attention: keys from the query's chunk start (0: none) */
} attn_job;

static void attn_chunk(void *p, int64_t c) {
    attn_job *j = p;
    int64_t n = c / j->Hq, h = c % j->Hq;
    int64_t g = j->Hq / j->Hkv, kvh = h / g;
    const float *q = j->q + (n * j->Hq + h) * j->hdk;
    float *o = j->out + (n * j->Hq + h) * j->hdv;
    int64_t hi = j->causal ? j->pos[n] : j->n_kv - 1;
    if (hi > j->n_kv - 1) hi = j->n_kv - 1;
    int64_t lo = j->window > 0 ? (int64_t)j->pos[n] - j->window + 1 : 0;
    if (j->chunk > 0 && lo < j->pos[n] - j->pos[n] % j->chunk) lo = j->pos[n] - j->pos[n] % j->chunk;
    if (lo < 0) lo = 0;
    memset(o, 0, (size_t)j->hdv * sizeof(float));
    if (hi < lo) return;
    float *s = thread_buf((size_t)(hi - lo + 1));
    const float *mrow = j->mask ? j->mask + n * j->n_kv : NULL;
    float mx = -INFINITY;
    size_t kbase = (size_t)kvh * j->n_slots;
    for (int64_t t = lo; t <= hi; t++) {
        float v;
        if (mrow && mrow[t] == -INFINITY) { s[t - lo] = -INFINITY; continue; } /* hidden: no dot */
        if (j->f16) v = T.dot_f32_f16(q, (const uint16_t *)j->kc + (kbase + t) * j->hdk, j->hdk);
        else v = T.dot_f32(q, (const float *)j->kc + (kbase + t) * j->hdk, j->hdk);
        v *= j->scale;
        if (j->softcap > 0.f) v = j->softcap * tanhf(v / j->softcap);
        if (mrow) v += mrow[t];
        s[t - lo] = v;
        if (v > mx) mx = v;
    }
    if (mx == -INFINITY) return; /* nothing visible: zeros */
    float sink = j->sinks ? j->sinks[h] : -INFINITY; /* a logit in the denominator only */
    if (sink > mx) mx = sink;
    float sum = j->sinks ? expf(sink - mx) : 0.f;
    for (int64_t t = lo; t <= hi; t++) {
        float e = s[t - lo] == -INFINITY ? 0.f : expf(s[t - lo] - mx);
        s[t - lo] = e;
        sum += e;
    }
    for (int64_t t = lo; t <= hi; t++) {
        float pw = s[t - lo];
        if (pw == 0.f) continue;
        if (j->f16) T.axpy_f16(o, pw, (const uint16_t *)j->vc + (kbase + t) * j->ldv, j->hdv);
        else T.axpy_f32(o, pw, (const float *)j->vc + (kbase + t) * j->ldv, j->hdv);
    }
    float inv = 1.f / sum;
    for (int64_t i = 0; i < j->hdv; i++) o[i] *= inv;
}

/* The g = Hq / Hkv query heads that share a KV head, for one query row: each float16 key and
 * value row is read (and converted) once for all of them (the table's dotn / axpyn; the
 * portable path calls its per-head functions, in the per-head order of attn_chunk: the same
 * results). */
#define ATTN_MAX_GROUP 64

static void dotn_f32_f16(const float *q, int64_t ldq, int nq, const uint16_t *k, int64_t ldk, int nk, int64_t n,
                         float *out) {
    if (T.dotn_f32_f16) {
        T.dotn_f32_f16(q, ldq, nq, k, ldk, nk, n, out);
        return;
    }
    for (int i = 0; i < nk; i++)
        for (int h = 0; h < nq; h++) out[i * nq + h] = T.dot_f32_f16(q + h * ldq, k + i * ldk, n);
}

static void axpyn_f16(float *y, int64_t ldy, int ny, const float *a, const uint16_t *x, int64_t ldx, int nx,
                      int64_t n) {
    if (T.axpyn_f16) {
        T.axpyn_f16(y, ldy, ny, a, x, ldx, nx, n);
        return;
    }
    for (int i = 0; i < nx; i++) /* value row after value row, as attn_chunk adds them */
        for (int h = 0; h < ny; h++)
            if (a[i * ny + h] != 0.f) T.axpy_f16(y + h * ldy, a[i * ny + h], x + i * ldx, n);
}

static void attn_group_chunk(void *p, int64_t c) {
    attn_job *j = p;
    int g = (int)(j->Hq / j->Hkv);
    int64_t n = c / j->Hkv, kvh = c % j->Hkv;
    const float *q = j->q + (n * j->Hq + kvh * g) * j->hdk;
    float *o = j->out + (n * j->Hq + kvh * g) * j->hdv;
    int64_t hi = j->causal ? j->pos[n] : j->n_kv - 1;
    if (hi > j->n_kv - 1) hi = j->n_kv - 1;
    int64_t lo = j->window > 0 ? (int64_t)j->pos[n] - j->window + 1 : 0;
    if (j->chunk > 0 && lo < j->pos[n] - j->pos[n] % j->chunk) lo = j->pos[n] - j->pos[n] % j->chunk;
    if (lo < 0) lo = 0;
    memset(o, 0, (size_t)g * j->hdv * sizeof(float));
    if (hi < lo) return;
    int64_t L = hi - lo + 1;
    float *s = thread_buf((size_t)(g * L)), mx[ATTN_MAX_GROUP], sum[ATTN_MAX_GROUP], v[2 * ATTN_MAX_GROUP];
    const float *mrow = j->mask ? j->mask + n * j->n_kv : NULL;
    size_t kbase = (size_t)kvh * j->n_slots;
    for (int h = 0; h < g; h++) mx[h] = -INFINITY;
    for (int64_t t = lo, nk; t <= hi; t += nk) {
        if (mrow && mrow[t] == -INFINITY) { /* hidden: no dot */
            for (int h = 0; h < g; h++) s[h * L + t - lo] = -INFINITY;
            nk = 1;
            continue;
        }
        nk = t < hi && !(mrow && mrow[t + 1] == -INFINITY) ? 2 : 1; /* two keys at a time */
        dotn_f32_f16(q, j->hdk, g, (const uint16_t *)j->kc + (kbase + t) * j->hdk, j->hdk, (int)nk, j->hdk, v);
        for (int64_t i = 0; i < nk; i++)
            for (int h = 0; h < g; h++) {
                float x = v[i * g + h] * j->scale;
                if (j->softcap > 0.f) x = j->softcap * tanhf(x / j->softcap);
                if (mrow) x += mrow[t + i];
                s[h * L + t + i - lo] = x;
                if (x > mx[h]) mx[h] = x;
            }
    }
    for (int h = 0; h < g; h++) {
        float *sh = s + h * L, su = 0.f;
        if (j->sinks && mx[h] != -INFINITY) { /* attention sinks: attn_chunk's */
            float sink = j->sinks[kvh * g + h];
            if (sink > mx[h]) mx[h] = sink;
            su = expf(sink - mx[h]);
        }
        for (int64_t i = 0; i < L; i++) {
            float e = mx[h] == -INFINITY || sh[i] == -INFINITY ? 0.f : expf(sh[i] - mx[h]);
            sh[i] = e;
            su += e;
        }
        sum[h] = su;
    }
    for (int64_t t = lo, nx; t <= hi; t += nx) {
        nx = t < hi ? 2 : 1; /* two value rows at a time */
        int any = 0;
        for (int64_t i = 0; i < nx; i++)
            for (int h = 0; h < g; h++) {
                v[i * g + h] = s[h * L + t + i - lo];
                any |= v[i * g + h] != 0.f;
            }
        if (any) axpyn_f16(o, j->hdv, g, v, (const uint16_t *)j->vc + (kbase + t) * j->ldv, j->ldv, (int)nx, j->hdv);
    }
    for (int h = 0; h < g; h++) {
        if (mx[h] == -INFINITY) continue; /* nothing visible: zeros */
        float inv = 1.f / sum[h];
        for (int64_t i = 0; i < j->hdv; i++) o[h * j->hdv + i] *= inv;
    }
}

/* Blocks of ATTN_QB queries (prompt passes, float16 cache; the table's qk_f16 / pv_f16): an
 * item is ATTN_QB consecutive queries x the g query heads of one KV head, whose scores are
 * computed in register tiles (each key and value row converted once for several queries); the
 * softmax is attn_group_chunk's, per (query, head) row; each dot and each output value is
 * computed as attn_group_chunk computes it, so the results are the same. Items are claimed
 * last query block first: under causal masking the largest come first, and the pool's tail
 * is a small item. */
#define ATTN_QB 4

static _Thread_local float *tl_scores;
static _Thread_local size_t tl_scores_cap;

/* whether key t is hidden from every query n0..n0+nq-1 by the mask */
static inline int masked_for_all(const attn_job *j, int64_t n0, int nq, int64_t t) {
    for (int i = 0; i < nq; i++)
        if (j->mask[(n0 + i) * j->n_kv + t] != -INFINITY) return 0;
    return 1;
}

static void attn_block_chunk(void *p, int64_t c) {
    attn_job *j = p;
    int g = (int)(j->Hq / j->Hkv);
    int64_t n_blk = (j->N + ATTN_QB - 1) / ATTN_QB, item = n_blk * j->Hkv - 1 - c;
    int64_t kvh = item % j->Hkv, n0 = item / j->Hkv * ATTN_QB;
    int nq = j->N - n0 < ATTN_QB ? (int)(j->N - n0) : ATTN_QB, nr = nq * g;
    int64_t lo[ATTN_QB], hi[ATTN_QB], lo_all = INT64_MAX, hi_all = -1;
    const float *qp[ATTN_QB * ATTN_MAX_GROUP];
    float *op[ATTN_QB * ATTN_MAX_GROUP], inv[ATTN_QB * ATTN_MAX_GROUP];
    for (int i = 0; i < nq; i++) {
        int64_t n = n0 + i;
        hi[i] = j->causal ? j->pos[n] : j->n_kv - 1;
        if (hi[i] > j->n_kv - 1) hi[i] = j->n_kv - 1;
        lo[i] = j->window > 0 ? (int64_t)j->pos[n] - j->window + 1 : 0;
        if (j->chunk > 0 && lo[i] < j->pos[n] - j->pos[n] % j->chunk) lo[i] = j->pos[n] - j->pos[n] % j->chunk;
        if (lo[i] < 0) lo[i] = 0;
        if (hi[i] >= lo[i]) {
            if (lo[i] < lo_all) lo_all = lo[i];
            if (hi[i] > hi_all) hi_all = hi[i];
        }
        for (int h = 0; h < g; h++) {
            qp[i * g + h] = j->q + (n * j->Hq + kvh * g + h) * j->hdk;
            op[i * g + h] = j->out + (n * j->Hq + kvh * g + h) * j->hdv;
            memset(op[i * g + h], 0, (size_t)j->hdv * sizeof(float));
        }
    }
    if (hi_all < lo_all) return; /* nothing visible: zeros */
    int64_t L = hi_all - lo_all + 1;
    size_t need = (size_t)nr * (size_t)L;
    if (need > tl_scores_cap) {
        free(tl_scores);
        tl_scores_cap = need + 4096;
        tl_scores = malloc(tl_scores_cap * sizeof(float));
        if (!tl_scores) {
            tl_scores_cap = 0;
            return;
        }
    }
    float *s = tl_scores;
    size_t kbase = (size_t)kvh * j->n_slots;
    const uint16_t *kc = (const uint16_t *)j->kc + (kbase + lo_all) * j->hdk;
    const uint16_t *vc = (const uint16_t *)j->vc + (kbase + lo_all) * j->ldv;
    /* the scores of the runs of keys some query may see (a key every query's mask hides: no dot) */
    for (int64_t t = 0; t < L;) {
        int64_t t1 = t;
        if (j->mask && masked_for_all(j, n0, nq, lo_all + t)) {
            while (t1 < L && masked_for_all(j, n0, nq, lo_all + t1)) t1++;
            for (int r = 0; r < nr; r++)
                for (int64_t u = t; u < t1; u++) s[r * L + u] = -INFINITY;
        } else {
            while (t1 < L && !(j->mask && masked_for_all(j, n0, nq, lo_all + t1))) t1++;
            T.qk_f16(qp, nr, kc + t * j->hdk, j->hdk, (int)(t1 - t), j->hdk, s + t, L);
        }
        t = t1;
    }
    /* each row's softmax, as attn_group_chunk's (keys outside the query's range: hidden) */
    for (int i = 0; i < nq; i++) {
        const float *mrow = j->mask ? j->mask + (n0 + i) * j->n_kv : NULL;
        for (int h = 0; h < g; h++) {
            float *sh = s + (i * g + h) * L, mx = -INFINITY, su = 0.f;
            for (int64_t t = 0; t < L; t++) {
                int64_t tt = lo_all + t;
                if (tt < lo[i] || tt > hi[i] || (mrow && mrow[tt] == -INFINITY) || sh[t] == -INFINITY) {
                    sh[t] = -INFINITY;
                    continue;
                }
                float x = sh[t] * j->scale;
                if (j->softcap > 0.f) x = j->softcap * tanhf(x / j->softcap);
                if (mrow) x += mrow[tt];
                sh[t] = x;
                if (x > mx) mx = x;
            }
            if (mx == -INFINITY) { /* nothing visible: zeros */
                for (int64_t t = 0; t < L; t++) sh[t] = 0.f;
                inv[i * g + h] = 0.f;
                continue;
            }
            if (j->sinks) { /* attention sinks: attn_group_chunk's, in its order */
                float sink = j->sinks[kvh * g + h];
                if (sink > mx) mx = sink;
                su = expf(sink - mx);
                for (int64_t t = 0; t < L; t++) {
                    float e = sh[t] == -INFINITY ? 0.f : expf(sh[t] - mx);
                    sh[t] = e;
                    su += e;
                }
            } else if (T.exp_sum) {
                su = T.exp_sum(sh, L, mx);
            } else {
                for (int64_t t = 0; t < L; t++) {
                    float e = sh[t] == -INFINITY ? 0.f : expf(sh[t] - mx);
                    sh[t] = e;
                    su += e;
                }
            }
            inv[i * g + h] = 1.f / su;
        }
    }
    T.pv_f16(op, nr, s, L, vc, j->ldv, (int)L, j->hdv);
    for (int r = 0; r < nr; r++)
        for (int64_t d = 0; d < j->hdv; d++) op[r][d] *= inv[r];
}

/* out [N, Hq, hdv] = attention of q [N, Hq, hdk] over slots 0..n_kv-1 (backends/base.py) */
RX_EXPORT void rx_attention(const float *q, const void *kc, const void *vc, float *out, const int32_t *pos,
                            const float *mask, int64_t N, int64_t Hq, int64_t Hkv, int64_t n_slots,
                            int64_t hdk, int64_t hdv, int64_t n_kv, float scale, float softcap,
                            int64_t causal, int64_t window, int64_t f16, const float *sinks, int64_t chunk) {
    pthread_mutex_lock(&g_lock);
    init_isa();
    attn_job j = {q, kc, vc, out, pos, mask, N, Hq, Hkv, n_slots, hdk, hdv, n_kv, window,
                  scale, softcap, (int)causal, (int)f16, hdv, sinks, chunk};
    double work = (double)N * (double)Hq * (double)n_kv * (double)(hdk + hdv);
    if (f16 && T.qk_f16 && T.pv_f16 && Hq / Hkv <= ATTN_MAX_GROUP && (N >= ATTN_QB || Hq > Hkv))
        pool_run(attn_block_chunk, &j, (N + ATTN_QB - 1) / ATTN_QB * Hkv, work >= 65536.0);
    else if (f16 && Hq > Hkv && Hq / Hkv <= ATTN_MAX_GROUP) /* grouped query heads: one pass per KV head */
        pool_run(attn_group_chunk, &j, N * Hkv, work >= 65536.0);
    else
        pool_run(attn_chunk, &j, N * Hq, work >= 65536.0);
    pthread_mutex_unlock(&g_lock);
}

/* Latent attention (base.py attention with v_cache None): one KV head whose values are the
 * first hdv dims of the keys, kc [n_slots, hdk]. */
RX_EXPORT void rx_attention_latent(const float *q, const void *kc, float *out, const int32_t *pos,
                                   const float *mask, int64_t N, int64_t Hq, int64_t n_slots, int64_t hdk,
                                   int64_t hdv, int64_t n_kv, float scale, float softcap, int64_t causal,
                                   int64_t window, int64_t f16) {
    if (hdv > hdk) return;
    pthread_mutex_lock(&g_lock);
    init_isa();
    attn_job j = {q, kc, kc, out, pos, mask, N, Hq, 1, n_slots, hdk, hdv, n_kv, window,
                  scale, softcap, (int)causal, (int)f16, hdk, NULL, 0};
    double work = (double)N * (double)Hq * (double)n_kv * (double)(hdk + hdv);
    pool_run(attn_chunk, &j, N * Hq, work >= 65536.0);
    pthread_mutex_unlock(&g_lock);
}

/* float32 -> float16 / float16 -> float32 (tests, host copies) */
RX_EXPORT void rx_to_f16(const float *x, uint16_t *y, int64_t n) {
    init_isa();
    T.to_f16(x, y, n);
}

/* ------------------------------------------------------------------ small ops */
/* out [N, K] = rows ids[n] of w, dequantized, times scale */
RX_EXPORT int rx_embed(const rx_weight *w, const int32_t *ids, int64_t N, float *out, float scale) {
    for (int64_t n = 0; n < N; n++) {
        if (ids[n] < 0 || ids[n] >= w->M) return -1;
        float *y = out + n * w->K;
        rx_dequant_row((int)w->type, w->data + (int64_t)ids[n] * w->row_bytes, y, w->K);
        if (scale != 1.f) for (int64_t i = 0; i < w->K; i++) y[i] *= scale;
    }
    return 0;
}

/* out[i] = a[i] op b[i % nb] (nb == n, or a row broadcast over the rows): 0 add, 1 mul */
RX_EXPORT void rx_binary(int64_t op, const float *a, const float *b, float *out, int64_t n, int64_t nb) {
    if (nb == n) {
        if (op == 0) for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
        else for (int64_t i = 0; i < n; i++) out[i] = a[i] * b[i];
        return;
    }
    for (int64_t r = 0; r < n; r += nb) {
        if (op == 0) for (int64_t i = 0; i < nb; i++) out[r + i] = a[r + i] + b[i];
        else for (int64_t i = 0; i < nb; i++) out[r + i] = a[r + i] * b[i];
    }
}

/* out = f(a): 0 scale (a * p), 1 softcap (p * tanh(a / p)), 2 silu, 3 gelu (tanh),
 * 4 swiglu silu(a) * b, 5 geglu gelu(a) * b */
RX_EXPORT void rx_unary(int64_t op, const float *a, const float *b, float *out, int64_t n, float p) {
    switch (op) {
    case 0: for (int64_t i = 0; i < n; i++) out[i] = a[i] * p; break;
    case 1: for (int64_t i = 0; i < n; i++) out[i] = tanhf(a[i] / p) * p; break;
    case 2: init_isa(); glu_apply(1, out, a, NULL, n); break;
    case 3: init_isa(); glu_apply(2, out, a, NULL, n); break;
    case 4: init_isa(); glu_apply(1, out, a, b, n); break;
    case 5: init_isa(); glu_apply(2, out, a, b, n); break;
    case 6: for (int64_t i = 0; i < n; i++) out[i] = 1.f / (1.f + expf(-a[i])); break;
    case 7: for (int64_t i = 0; i < n; i++) out[i] = a[i] > 20.f ? a[i] : log1pf(expf(a[i])); break;
    default: break;
    }
}

RX_EXPORT void rx_copy(const void *src, void *dst, int64_t bytes) { memmove(dst, src, (size_t)bytes); }

/* dst [rows, n] = columns start..start+n-1 of src [rows, cols] (float32) */
RX_EXPORT void rx_columns(const float *src, float *dst, int64_t rows, int64_t cols, int64_t start, int64_t n) {
    for (int64_t r = 0; r < rows; r++) memcpy(dst + r * n, src + r * cols + start, (size_t)n * sizeof(float));
}

/* out[r] = the first index of the largest value of row r of x [rows, V] (NaN never wins) */
RX_EXPORT void rx_argmax(const float *x, int64_t rows, int64_t V, int32_t *out) {
    for (int64_t r = 0; r < rows; r++) {
        const float *v = x + r * V;
        int64_t best = 0;
        float bv = v[0];
        for (int64_t i = 1; i < V; i++)
            if (v[i] > bv || (bv != bv && v[i] == v[i])) { bv = v[i]; best = i; }
        out[r] = (int32_t)best;
    }
}

/* ------------------------------------------------------------------ recurrent layers */
/* Sequence groups (backends.base.seq_group_table): tab[0..G] the starts of the groups in the
 * token order, tab[G+1..2G] their sequence ids, tab[2G+1..] the token indices grouped by
 * sequence (batch order within a group). Every kernel runs a group's tokens in order; the
 * rows of a state (a channel, a value row of a head) are independent, so chunks split them. */
#define REC_ROWS 16 /* state rows per chunk */

typedef struct {
    const float *x, *w;
    float *state, *out;
    const int32_t *tab;
    int64_t G, C, K, n_cb;
} conv_job;

static void conv_chunk(void *p, int64_t c) {
    const conv_job *j = p;
    int64_t g = c / j->n_cb, c0 = (c % j->n_cb) * REC_ROWS, c1 = c0 + REC_ROWS < j->C ? c0 + REC_ROWS : j->C;
    const int32_t *tab = j->tab;
    int64_t t0 = tab[g], t1 = tab[g + 1], s = tab[j->G + 1 + g], K = j->K, C = j->C;
    const int32_t *idx = tab + 2 * j->G + 1;
    float *st = j->state + s * (K - 1) * C;
    float win[64];
    for (int64_t ch = c0; ch < c1; ch++) {
        const float *w = j->w + ch * K;
        for (int64_t k = 0; k < K - 1; k++) win[k] = st[k * C + ch];
        for (int64_t t = t0; t < t1; t++) {
            int64_t n = idx[t];
            win[K - 1] = j->x[n * C + ch];
            float y = win[0] * w[0];
            for (int64_t k = 1; k < K; k++) y += win[k] * w[k];
            j->out[n * C + ch] = y;
            for (int64_t k = 0; k < K - 1; k++) win[k] = win[k + 1];
        }
        for (int64_t k = 0; k < K - 1; k++) st[k * C + ch] = win[k];
    }
}

/* out [N, C] = causal depthwise conv of x [N, C] with w [C, K] (K <= 64), state [n_seq, K-1, C] */
RX_EXPORT void rx_ssm_conv(const float *x, float *state, const float *w, float *out, const int32_t *tab,
                           int64_t G, int64_t N, int64_t C, int64_t K) {
    if (K < 1 || K > 64) return;
    pthread_mutex_lock(&g_lock);
    init_isa();
    int64_t n_cb = (C + REC_ROWS - 1) / REC_ROWS;
    conv_job j = {x, w, state, out, tab, G, C, K, n_cb};
    pool_run(conv_chunk, &j, G * n_cb, (double)N * C * K >= 65536.0);
    pthread_mutex_unlock(&g_lock);
}

typedef struct {
    const float *q, *k, *v, *g, *beta;
    float *state, *out;
    const int32_t *tab;
    int64_t G, Hk, Hv, D, n_rb;
    float scale;
} delta_job;

static void delta_chunk(void *p, int64_t c) {
    const delta_job *j = p;
    int64_t D = j->D, Hv = j->Hv, Hk = j->Hk, per = Hv * j->n_rb;
    int64_t g = c / per, h = (c % per) / j->n_rb, r0 = (c % j->n_rb) * REC_ROWS;
    int64_t r1 = r0 + REC_ROWS < D ? r0 + REC_ROWS : D, hk = h % Hk;
    const int32_t *tab = j->tab;
    const int32_t *idx = tab + 2 * j->G + 1;
    float *S = j->state + ((int64_t)tab[j->G + 1 + g] * Hv + h) * D * D;
    for (int64_t t = tab[g]; t < tab[g + 1]; t++) {
        int64_t n = idx[t];
        const float *q = j->q + (n * Hk + hk) * D, *k = j->k + (n * Hk + hk) * D;
        const float *v = j->v + (n * Hv + h) * D;
        float decay = expf(j->g[n * Hv + h]), b = j->beta[n * Hv + h];
        for (int64_t i = r0; i < r1; i++) {
            float *row = S + i * D;
            for (int64_t e = 0; e < D; e++) row[e] *= decay;
            float d = (v[i] - T.dot_f32(row, k, D)) * b;
            T.axpy_f32(row, d, k, D);
            j->out[(n * Hv + h) * D + i] = T.dot_f32(row, q, D) * j->scale;
        }
    }
}

/* The gated delta rule (base.py delta_net): q, k [N, Hk, D], v [N, Hv, D], g, beta [N, Hv],
 * state [n_seq, Hv, D, D] (value row i, key column e), out [N, Hv, D]. */
RX_EXPORT void rx_delta_net(const float *q, const float *k, const float *v, const float *g, const float *beta,
                            float *state, float *out, const int32_t *tab, int64_t G, int64_t N, int64_t Hk,
                            int64_t Hv, int64_t D, float scale) {
    pthread_mutex_lock(&g_lock);
    init_isa();
    int64_t n_rb = (D + REC_ROWS - 1) / REC_ROWS;
    delta_job j = {q, k, v, g, beta, state, out, tab, G, Hk, Hv, D, n_rb, scale};
    pool_run(delta_chunk, &j, G * Hv * n_rb, (double)N * Hv * D * D >= 65536.0);
    pthread_mutex_unlock(&g_lock);
}

typedef struct {
    const float *x, *dt, *A, *B, *C, *Dp;
    float *state, *out;
    const int32_t *tab;
    int64_t G, H, P, Ng, Ns, n_rb;
} scan_job;

static void scan_chunk(void *p, int64_t c) {
    const scan_job *j = p;
    int64_t H = j->H, P = j->P, Ns = j->Ns, Ng = j->Ng, per = H * j->n_rb;
    int64_t g = c / per, h = (c % per) / j->n_rb, r0 = (c % j->n_rb) * REC_ROWS;
    int64_t r1 = r0 + REC_ROWS < P ? r0 + REC_ROWS : P, grp = h / (H / Ng);
    const int32_t *tab = j->tab;
    const int32_t *idx = tab + 2 * j->G + 1;
    float *S = j->state + ((int64_t)tab[j->G + 1 + g] * H + h) * P * Ns;
    for (int64_t t = tab[g]; t < tab[g + 1]; t++) {
        int64_t n = idx[t];
        float dt = j->dt[n * H + h], decay = expf(dt * j->A[h]);
        const float *x = j->x + (n * H + h) * P;
        const float *B = j->B + (n * Ng + grp) * Ns, *Cv = j->C + (n * Ng + grp) * Ns;
        for (int64_t i = r0; i < r1; i++) {
            float *row = S + i * Ns, u = dt * x[i];
            for (int64_t e = 0; e < Ns; e++) row[e] = decay * row[e] + u * B[e];
            float y = T.dot_f32(row, Cv, Ns);
            if (j->Dp) y += j->Dp[h] * x[i];
            j->out[(n * H + h) * P + i] = y;
        }
    }
}

/* The Mamba-2 selective scan (base.py ssm_scan): x [N, H, P], dt [N, H], A [H], B, C [N, Ng, Ns],
 * state [n_seq, H, P, Ns], D [H] or NULL, out [N, H, P]. */
RX_EXPORT void rx_ssm_scan(const float *x, const float *dt, const float *A, const float *B, const float *C,
                           const float *Dp, float *state, float *out, const int32_t *tab, int64_t G, int64_t N,
                           int64_t H, int64_t P, int64_t Ng, int64_t Ns) {
    pthread_mutex_lock(&g_lock);
    init_isa();
    int64_t n_rb = (P + REC_ROWS - 1) / REC_ROWS;
    scan_job j = {x, dt, A, B, C, Dp, state, out, tab, G, H, P, Ng, Ns, n_rb};
    pool_run(scan_chunk, &j, G * H * n_rb, (double)N * H * P * Ns >= 65536.0);
    pthread_mutex_unlock(&g_lock);
}

/* ------------------------------------------------------------------ recorded graphs */
/* A captured op sequence: rows of `stride` int64, [replay code, args...] with the arguments of
 * that code's function (reflex_ipc/backends/cpu_abi.py; doubles stored as their bits). */
RX_EXPORT int rx_run(const int64_t *cmds, int64_t n, int64_t stride) {
    for (int64_t c = 0; c < n; c++) {
        int rc = rx_replay_one(cmds + c * stride);
        if (rc) return rc;
    }
    return 0;
}
