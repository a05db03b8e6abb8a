// The chunked (parallel) form of the recurrences of recurrent.cuh, for prefill: the gated delta
// rule (delta_net) and the Mamba-2 scan (ssm_scan) as one gated linear recurrence, as the numpy
// backend's _chunk_scan computes it. Per head, state S [Dv, Dk] (rows: value dim), per token t
// key k_t, query q_t [Dk], log decay g_t; the tokens of a sequence group are cut into chunks of
// CHUNK_L; inside a chunk, with G_t = g_0 + ... + g_t and S the state before the chunk:
//     u   = Wv - Wk S^T                                    (delta rule; Mamba-2: u_t = dt_t x_t)
//     out = exp(G) (q S^T) + Aqk u
//     S'  = exp(G_last) S + u^T (w k),   w_i = exp(G_last - G_i)
// with Aqk[t, i] = exp(G_t - G_i) q_t.k_i for i <= t (else 0), and for the delta rule, with the
// unit lower triangular M = I + strictly_lower(beta_t exp(G_t - G_i) k_t.k_i):
//     Wv = M^-1 (beta v),   Wk = M^-1 (beta exp(G) k).
// Nothing but u, out and S' depends on the state, and a row of S evolves independently of the
// others, so two kernels:
//   *_chunk_prep_f32, a block per (chunk, head, group): G, Aqk, and for the delta rule M, its
//       forward substitution applied to beta v and beta exp(G) k (a thread per column, the
//       column's CHUNK_L values in registers) -> Wv, Wk;
//   *_chunk_scan_f32, a block per (CHUNK_ROWS state rows, head, group): walks the group's chunks
//       in order with its rows of S in shared memory, FP32 FMA tiles over the key columns.
// Workspaces (from CudaOps' pool) are indexed by a token's position p in the group table's
// order (group start + t; the token index itself when sg is null), head h:
//     Aqk [N, H, CHUNK_L] (row p: the token's row of its chunk's Aqk), Gc [N, H] (G_t),
//     Wv [N, H, Dv], Wk [N, H, Dk].
// Head mapping as recurrent.cuh: delta_net value head h reads q/k head h % Hk; ssm_scan head h
// reads B/C group h / (H / G).
#pragma once
#include "recurrent.cuh"

#define CHUNK_L 64         // tokens per chunk (CHUNK_L in cuda_ops.py); the scans below assume 64
#define CHUNK_THREADS 256  // threads per block of both kernels
#define CHUNK_TJ 32        // key columns per shared tile
#define CHUNK_ROWS 16      // state rows per block of the scan kernel (CHUNK_ROWS in cuda_ops.py)

static_assert(CHUNK_L == 64 && CHUNK_THREADS == 256 && CHUNK_ROWS == 16, "the thread maps below");
static_assert(2 * (CHUNK_TJ + 1) >= CHUNK_L + 1, "Aqk [L][L+1] fits the two column tiles");

template <bool DELTA>
__device__ __forceinline__ int chunk_key_head(int h, int H, int Hq) {
    return DELTA ? h % Hq : h / (H / Hq);
}

// Gs[0..63] <- its inclusive prefix sum (warp 0; the caller synchronises before and after)
__device__ __forceinline__ void chunk_cumsum(float* Gs) {
    const int lane = threadIdx.x;
    if (lane >= 32) return;
    float a = Gs[lane], b = Gs[lane + 32];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const float x = __shfl_up_sync(0xffffffffu, a, o), y = __shfl_up_sync(0xffffffffu, b, o);
        if (lane >= o) {
            a += x;
            b += y;
        }
    }
    const float tot = __shfl_sync(0xffffffffu, a, 31);
    Gs[lane] = a;
    Gs[lane + 32] = b + tot;
}

// q, k [N, Hq, Dk]; delta rule: v [N, H, Dv], g, beta [N, H]; Mamba-2: dt [N, H], A [H] (g = dt A).
template <bool DELTA>
__device__ void chunk_prep(const float* q, const float* k, const float* v, const float* g, const float* beta,
                           const float* dt, const float* A, float* Aqk, float* Gc, float* Wv, float* Wk,
                           const int* sg, int n_groups, int N, int Hq, int H, int Dk, int Dv) {
    __shared__ float qs[CHUNK_L][CHUNK_TJ + 1], ks[CHUNK_L][CHUNK_TJ + 1];
    __shared__ float As[CHUNK_L][CHUNK_L + 1];  // strictly lower part of M (the delta rule)
    __shared__ float Gs[CHUNK_L], bs[CHUNK_L];
    __shared__ int tok[CHUNK_L];
    const SeqGroup grp = seq_group_at(sg, n_groups, N, blockIdx.z);
    const int c0 = blockIdx.x * CHUNK_L;
    if (c0 >= grp.count) return;  // the whole block: a shorter group has fewer chunks
    const int Lc = min(CHUNK_L, grp.count - c0);
    const long long p0 = (long long)grp.start + c0;  // position of the chunk's first token
    const int h = blockIdx.y, hq = chunk_key_head<DELTA>(h, H, Hq);
    const int tid = threadIdx.x;
    if (tid < CHUNK_L) {
        const int n = tid < Lc ? grp.token(c0 + tid) : 0;
        float gv = 0.f, bv = 0.f;  // past the chunk's end: no decay, no update
        if (tid < Lc) {
            if (DELTA) {
                gv = g[(long long)n * H + h];
                bv = beta[(long long)n * H + h];
            } else {
                gv = dt[(long long)n * H + h] * A[h];
            }
        }
        tok[tid] = n;
        Gs[tid] = gv;
        bs[tid] = bv;
    }
    __syncthreads();
    chunk_cumsum(Gs);
    __syncthreads();

    // q_t.k_i and k_t.k_i: thread (ty, tx) owns t = ty + 16 a, i = tx + 16 b (a, b < 4)
    const int ty = tid >> 4, tx = tid & 15;
    float qk[4][4], kk[4][4];
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int b = 0; b < 4; b++) qk[a][b] = kk[a][b] = 0.f;
    for (int j0 = 0; j0 < Dk; j0 += CHUNK_TJ) {
        for (int e = tid; e < CHUNK_L * CHUNK_TJ; e += CHUNK_THREADS) {
            const int t = e / CHUNK_TJ, jj = e % CHUNK_TJ, j = j0 + jj;
            const bool ok = t < Lc && j < Dk;
            const long long at = ((long long)tok[t] * Hq + hq) * Dk + j;
            qs[t][jj] = ok ? q[at] : 0.f;
            ks[t][jj] = ok ? k[at] : 0.f;
        }
        __syncthreads();
#pragma unroll 4
        for (int jj = 0; jj < CHUNK_TJ; jj++) {
            float qa[4], ka[4], kb[4];
#pragma unroll
            for (int a = 0; a < 4; a++) {
                qa[a] = qs[ty + 16 * a][jj];
                ka[a] = ks[ty + 16 * a][jj];
                kb[a] = ks[tx + 16 * a][jj];
            }
#pragma unroll
            for (int a = 0; a < 4; a++)
#pragma unroll
                for (int b = 0; b < 4; b++) {
                    qk[a][b] += qa[a] * kb[b];
                    kk[a][b] += ka[a] * kb[b];
                }
        }
        __syncthreads();
    }
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int b = 0; b < 4; b++) {
            const int t = ty + 16 * a, i = tx + 16 * b;
            const float dec = i <= t ? expf(Gs[t] - Gs[i]) : 0.f;
            if (t < Lc) Aqk[((p0 + t) * H + h) * CHUNK_L + i] = dec * qk[a][b];
            if (DELTA) As[t][i] = i < t ? bs[t] * dec * kk[a][b] : 0.f;  // bs[t] = 0 past the end
        }
    if (tid < Lc) Gc[(p0 + tid) * H + h] = Gs[tid];
    if (!DELTA) return;
    __syncthreads();

    // Wv = M^-1 (beta v), Wk = M^-1 (beta exp(G) k) by forward substitution, a thread per column
    // (c < Dv: of v, else of k); past the chunk's end M's rows and the right side are 0, so w is 0
    for (int c = tid; c < Dv + Dk; c += CHUNK_THREADS) {
        const bool isv = c < Dv;
        const int j = isv ? c : c - Dv;
        float w[CHUNK_L];
#pragma unroll
        for (int t = 0; t < CHUNK_L; t++) {
            float acc = 0.f;
            if (t < Lc) {
                const long long n = tok[t];
                acc = bs[t] * (isv ? v[(n * H + h) * Dv + j] : expf(Gs[t]) * k[(n * Hq + hq) * Dk + j]);
            }
            float part[4] = {0.f, 0.f, 0.f, 0.f};  // four chains: the sum is not one serial dependency
#pragma unroll
            for (int i = 0; i < t; i++) part[i & 3] += As[t][i] * w[i];
            acc -= (part[0] + part[1]) + (part[2] + part[3]);
            w[t] = acc;
            if (t < Lc) {
                if (isv)
                    Wv[((p0 + t) * H + h) * Dv + j] = acc;
                else
                    Wk[((p0 + t) * H + h) * Dk + j] = acc;
            }
        }
    }
}

// The walk over a group's chunks for state rows r0 .. r0 + CHUNK_ROWS - 1 of head h. Delta rule:
// out [N, H, Dv] = scale * (...), u from Wv, Wk; Mamba-2: x, y [N, H, Dv], u = dt x, y += D x.
template <bool DELTA>
__device__ void chunk_scan(const float* q, const float* k, const float* x, const float* dt, const float* Wv,
                           const float* Wk, const float* Aqk, const float* Gc, const float* Dskip, float* state,
                           float* out, const int* sg, int n_groups, int N, int Hq, int H, int Dk, int Dv,
                           float scale) {
    __shared__ float Ss[CHUNK_ROWS][32 * RECUR_MAX_PER_LANE + 1];       // the block's rows of S
    __shared__ float tile[2 * CHUNK_L * (CHUNK_TJ + 1)];       // two [L][TJ+1] tiles, or Aqk [L][L+1]
    __shared__ float us[CHUNK_L][CHUNK_ROWS + 1];              // u for the block's rows
    __shared__ float eG[CHUNK_L], wL[CHUNK_L];                 // exp(G_t), exp(G_last - G_t)
    __shared__ int tok[CHUNK_L];
    float(*t0s)[CHUNK_TJ + 1] = reinterpret_cast<float(*)[CHUNK_TJ + 1]>(tile);
    float(*t1s)[CHUNK_TJ + 1] = t0s + CHUNK_L;
    float(*as)[CHUNK_L + 1] = reinterpret_cast<float(*)[CHUNK_L + 1]>(tile);

    const SeqGroup grp = seq_group_at(sg, n_groups, N, blockIdx.z);
    const int h = blockIdx.y, hq = chunk_key_head<DELTA>(h, H, Hq), r0 = blockIdx.x * CHUNK_ROWS;
    const int tid = threadIdx.x;
    const int Dkp = (Dk + CHUNK_TJ - 1) / CHUNK_TJ * CHUNK_TJ;  // columns the tiles cover
    float* S = state + (((long long)grp.seq * H + h) * Dv + r0) * Dk;
    for (int e = tid; e < CHUNK_ROWS * Dkp; e += CHUNK_THREADS) {
        const int r = e / Dkp, j = e % Dkp;
        Ss[r][j] = r0 + r < Dv && j < Dk ? S[(long long)r * Dk + j] : 0.f;  // zeros stay zero
    }
    const float dsk = !DELTA && Dskip ? Dskip[h] : 0.f;
    const int rr = tid & 15, tq = tid >> 4;  // u / out: row r0 + rr, tokens tq + 16 a (a < 4)
    const int r = r0 + rr;
    for (int c0 = 0; c0 < grp.count; c0 += CHUNK_L) {
        const int Lc = min(CHUNK_L, grp.count - c0);
        const long long p0 = (long long)grp.start + c0;
        __syncthreads();  // the previous chunk is done with tok, eG, wL, the tiles and Ss
        if (tid < CHUNK_L) {
            tok[tid] = tid < Lc ? grp.token(c0 + tid) : 0;
            const float Gt = tid < Lc ? Gc[(p0 + tid) * H + h] : 0.f;
            const float Gl = Gc[(p0 + Lc - 1) * H + h];
            eG[tid] = tid < Lc ? expf(Gt) : 0.f;
            wL[tid] = tid < Lc ? expf(Gl - Gt) : 0.f;
        }
        __syncthreads();
        // q S^T and (delta rule) Wk S^T for (token, row) pairs, over tiles of key columns
        float qS[4] = {0.f, 0.f, 0.f, 0.f}, kS[4] = {0.f, 0.f, 0.f, 0.f};
        for (int j0 = 0; j0 < Dk; j0 += CHUNK_TJ) {
            for (int e = tid; e < CHUNK_L * CHUNK_TJ; e += CHUNK_THREADS) {
                const int t = e / CHUNK_TJ, jj = e % CHUNK_TJ, j = j0 + jj;
                const bool ok = t < Lc && j < Dk;
                t0s[t][jj] = ok ? q[((long long)tok[t] * Hq + hq) * Dk + j] : 0.f;
                if (DELTA) t1s[t][jj] = ok ? Wk[((p0 + t) * H + h) * Dk + j] : 0.f;
            }
            __syncthreads();
#pragma unroll 8
            for (int jj = 0; jj < CHUNK_TJ; jj++) {
                const float s = Ss[rr][j0 + jj];
#pragma unroll
                for (int a = 0; a < 4; a++) {
                    qS[a] += t0s[tq + 16 * a][jj] * s;
                    if (DELTA) kS[a] += t1s[tq + 16 * a][jj] * s;
                }
            }
            __syncthreads();
        }
#pragma unroll
        for (int a = 0; a < 4; a++) {
            const int t = tq + 16 * a;
            float u = 0.f;
            if (t < Lc && r < Dv) {
                if (DELTA) {
                    u = Wv[((p0 + t) * H + h) * Dv + r] - kS[a];
                } else {
                    const long long n = tok[t];
                    u = dt[n * H + h] * x[(n * H + h) * Dv + r];
                }
            }
            us[t][rr] = u;
        }
        for (int e = tid; e < CHUNK_L * CHUNK_L; e += CHUNK_THREADS) {
            const int t = e / CHUNK_L, i = e % CHUNK_L;
            as[t][i] = t < Lc ? Aqk[((p0 + t) * H + h) * CHUNK_L + i] : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int a = 0; a < 4; a++) {
            const int t = tq + 16 * a;
            if (t < Lc && r < Dv) {
                float acc = eG[t] * qS[a];
                for (int i = 0; i <= t; i++) acc += as[t][i] * us[i][rr];
                const long long o = ((long long)tok[t] * H + h) * Dv + r;
                out[o] = DELTA ? acc * scale : acc + dsk * x[o];
            }
        }
        __syncthreads();  // done with Aqk: the tiles take k
        // S = exp(G_last) S + u^T (w k) for the block's rows, a tile of key columns at a time
        const float eL = expf(Gc[(p0 + Lc - 1) * H + h]);
        for (int j0 = 0; j0 < Dk; j0 += CHUNK_TJ) {
            for (int e = tid; e < CHUNK_L * CHUNK_TJ; e += CHUNK_THREADS) {
                const int t = e / CHUNK_TJ, jj = e % CHUNK_TJ, j = j0 + jj;
                t0s[t][jj] = t < Lc && j < Dk ? wL[t] * k[((long long)tok[t] * Hq + hq) * Dk + j] : 0.f;
            }
            __syncthreads();
            for (int e = tid; e < CHUNK_ROWS * CHUNK_TJ; e += CHUNK_THREADS) {
                const int r2 = e / CHUNK_TJ, jj = e % CHUNK_TJ;
                float acc = 0.f;
                for (int i = 0; i < Lc; i++) acc += us[i][r2] * t0s[i][jj];
                Ss[r2][j0 + jj] = eL * Ss[r2][j0 + jj] + acc;
            }
            __syncthreads();
        }
    }
    __syncthreads();
    for (int e = tid; e < CHUNK_ROWS * Dk; e += CHUNK_THREADS) {
        const int r2 = e / Dk, j = e % Dk;
        if (r0 + r2 < Dv) S[(long long)r2 * Dk + j] = Ss[r2][j];
    }
}

// delta_net: q, k [N, Hk, D]; v, out [N, Hv, D]; g, beta [N, Hv]; state [n_seq, Hv, D, D].
// Grid (chunks of the longest group, Hv, groups).
RX_EXTERN void __launch_bounds__(CHUNK_THREADS)
delta_chunk_prep_f32(const float* q, const float* k, const float* v, const float* g, const float* beta,
                     float* Aqk, float* Gc, float* Wv, float* Wk, const int* sg, int n_groups, int N, int Hk,
                     int Hv, int D) {
    chunk_prep<true>(q, k, v, g, beta, nullptr, nullptr, Aqk, Gc, Wv, Wk, sg, n_groups, N, Hk, Hv, D, D);
}

// Grid (ceil(D / CHUNK_ROWS), Hv, groups).
RX_EXTERN void __launch_bounds__(CHUNK_THREADS)
delta_chunk_scan_f32(const float* q, const float* k, const float* Wv, const float* Wk, const float* Aqk,
                     const float* Gc, float* state, float* out, const int* sg, int n_groups, int N, int Hk,
                     int Hv, int D, float scale) {
    chunk_scan<true>(q, k, nullptr, nullptr, Wv, Wk, Aqk, Gc, nullptr, state, out, sg, n_groups, N, Hk, Hv, D, D,
                     scale);
}

// ssm_scan: C, B [N, G, Ns] (q = C, k = B); dt [N, H]; A [H]. Grid (chunks, H, groups).
RX_EXTERN void __launch_bounds__(CHUNK_THREADS)
ssm_chunk_prep_f32(const float* C, const float* B, const float* dt, const float* A, float* Aqk, float* Gc,
                   const int* sg, int n_groups, int N, int H, int G, int Ns) {
    chunk_prep<false>(C, B, nullptr, nullptr, nullptr, dt, A, Aqk, Gc, nullptr, nullptr, sg, n_groups, N, G, H, Ns,
                      0);
}

// x, y [N, H, P]; Dskip [H] or null; state [n_seq, H, P, Ns]. Grid (ceil(P / CHUNK_ROWS), H, groups).
RX_EXTERN void __launch_bounds__(CHUNK_THREADS)
ssm_chunk_scan_f32(const float* C, const float* B, const float* x, const float* dt, const float* Aqk,
                   const float* Gc, const float* Dskip, float* state, float* y, const int* sg, int n_groups, int N,
                   int H, int P, int G, int Ns) {
    chunk_scan<false>(C, B, x, dt, nullptr, nullptr, Aqk, Gc, Dskip, state, y, sg, n_groups, N, G, H, Ns, P, 1.f);
}
