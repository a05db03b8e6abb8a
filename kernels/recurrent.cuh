// Kernels of recurrent layers (base.RECURRENT_OPS): sigmoid, softplus, a column slice, the
// causal depthwise conv with per-sequence state, the gated delta rule (Gated DeltaNet) and the
// Mamba-2 selective scan.
//
// Sequences: a batch may hold the tokens of several sequences, each with its own state (system1
// scores every candidate in its own sequence). `sg` describes them (built by CudaOps on the
// host), int32:
//     sg[0 .. G]            start of each group in `order` (G+1 entries, sg[G] = N)
//     sg[G+1 .. 2G]         the group's sequence (its state index)
//     sg[2G+1 .. 2G+N]      token indices, grouped by sequence, in batch order within a group
// sg null: one group, sequence 0, tokens 0..N-1 in order (the decode step; no buffer to write
// before a graph replay). blockIdx.y is the group.
//
// The recurrences run sequentially in time with the state resident in registers: a warp owns
// one row of a head's state (32 lanes x up to RECUR_MAX_PER_LANE columns), so a row's update
// needs only two warp reductions per token and no block synchronisation. These kernels serve
// decode (T = 1) and short prefills; longer prefills run the chunked form (chunked.cuh).
#pragma once
#include "common.cuh"

#define RECUR_MAX_PER_LANE 8  // state rows of up to 32 * 8 = 256 columns (RECUR_MAX_COLS in cuda_ops.py)

struct SeqGroup {
    int start, count, seq;
    const int* order;
    __device__ __forceinline__ int token(int t) const { return order ? order[start + t] : t; }
};

// group g's tokens (seq_group below: the group of blockIdx.y)
__device__ __forceinline__ SeqGroup seq_group_at(const int* sg, int n_groups, int N, int g) {
    SeqGroup r;
    if (!sg) {
        r.start = 0; r.count = N; r.seq = 0; r.order = nullptr;
    } else {
        r.start = sg[g];
        r.count = sg[g + 1] - sg[g];
        r.seq = sg[n_groups + 1 + g];
        r.order = sg + 2 * n_groups + 1;
    }
    return r;
}

__device__ __forceinline__ SeqGroup seq_group(const int* sg, int n_groups, int N) {
    return seq_group_at(sg, n_groups, N, blockIdx.y);
}

RX_EXTERN void sigmoid_f32(const float* a, float* y, long long n) {
    GRID_STRIDE(i, n) y[i] = 1.f / (1.f + expf(-a[i]));
}

// ggml's softplus: a itself above 20
RX_EXTERN void softplus_f32(const float* a, float* y, long long n) {
    GRID_STRIDE(i, n) {
        const float v = a[i];
        y[i] = v > 20.f ? v : log1pf(expf(v));
    }
}

// y[r, c] = a[r, c] * v[r]: a per-row (per-token) gate, v [rows] (ops.mul with b [rows, 1])
RX_EXTERN void mul_col_f32(const float* a, const float* v, float* y, long long n, int ncol) {
    GRID_STRIDE(i, n) y[i] = a[i] * v[i / ncol];
}

// y[r, c] = x[r, start + c] for rows of width W, c < ncol (total = rows * ncol)
RX_EXTERN void columns_f32(const float* x, float* y, long long total, int W, int start, int ncol) {
    GRID_STRIDE(i, total) {
        const long long r = i / ncol, c = i % ncol;
        y[i] = x[r * W + start + c];
    }
}

// Causal depthwise conv over each sequence's tokens, with its last K-1 inputs as state:
// with xx = concat(state[s], x[tokens of s]) ([K-1+T, C]),
//     y[t, c] = sum_k w[c, k] xx[t + k, c],   then state[s] = xx[T .. T+K-2].
// x, y [N, C]; state [n_seq, K-1, C]; w [C, K]. A thread computes channel c of the tokens
// t = blockIdx.z, blockIdx.z + gridDim.z, ... of its group. With gridDim.z == 1 (decode) it
// then updates its channel's state itself; otherwise ssm_conv_state_f32 does, launched after
// (every output must have read the old state first).
__device__ __forceinline__ float conv_xx(const float* st, const float* x, const SeqGroup& grp, int j, int c,
                                         int C, int K) {
    return j < K - 1 ? st[(long long)j * C + c] : x[(long long)grp.token(j - (K - 1)) * C + c];
}

__device__ __forceinline__ void conv_state_update(float* st, const float* x, const SeqGroup& grp, int c,
                                                  int C, int K) {
    // state[j] = xx[T + j], j ascending: a state row read here (T + j < K - 1) is later than j,
    // so not yet overwritten
    for (int j = 0; j < K - 1; j++) st[(long long)j * C + c] = conv_xx(st, x, grp, grp.count + j, c, C, K);
}

RX_EXTERN void ssm_conv_f32(const float* x, float* state, const float* w, float* y, const int* sg,
                            int n_groups, int N, int C, int K) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const SeqGroup grp = seq_group(sg, n_groups, N);
    float* st = state + (long long)grp.seq * (K - 1) * C;
    const float* wc = w + (long long)c * K;
    for (int t = blockIdx.z; t < grp.count; t += gridDim.z) {
        float acc = 0.f;
        for (int k = 0; k < K; k++) acc += wc[k] * conv_xx(st, x, grp, t + k, c, C, K);
        y[(long long)grp.token(t) * C + c] = acc;
    }
    if (gridDim.z == 1) conv_state_update(st, x, grp, c, C, K);
}

// The state update of ssm_conv_f32 when its tokens ran over several blocks (gridDim.z > 1).
RX_EXTERN void ssm_conv_state_f32(const float* x, float* state, const int* sg, int n_groups, int N, int C,
                                  int K) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const SeqGroup grp = seq_group(sg, n_groups, N);
    conv_state_update(state + (long long)grp.seq * (K - 1) * C, x, grp, c, C, K);
}

// The gated delta rule. q, k [N, Hk, D]; v, out [N, Hv, D]; g, beta [N, Hv]; state
// [n_seq, Hv, D, D] (row i: value dim, column j: key dim). Value head h reads q/k head h % Hk.
// Per token, for row i of S = state[s, h]:
//     S_i *= exp(g);  d = beta (v_i - S_i . k);  S_i += d k;  out_i = scale S_i . q
// A warp per row; rows of all heads along blockIdx.x, sequence groups along blockIdx.y.
RX_EXTERN void delta_net_f32(const float* q, const float* k, const float* v, const float* g,
                             const float* beta, float* state, float* out, const int* sg, int n_groups,
                             int N, int Hk, int Hv, int D, float scale) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= Hv * D) return;  // the whole warp: no block-level synchronisation follows
    const int h = row / D, i = row % D, hk = h % Hk;
    const SeqGroup grp = seq_group(sg, n_groups, N);
    float* S = state + (((long long)grp.seq * Hv + h) * D + i) * D;
    float s[RECUR_MAX_PER_LANE];
#pragma unroll
    for (int e = 0; e < RECUR_MAX_PER_LANE; e++) {
        const int col = lane + 32 * e;
        s[e] = col < D ? S[col] : 0.f;
    }
    for (int t = 0; t < grp.count; t++) {
        const long long n = grp.token(t);
        const float decay = expf(g[n * Hv + h]);
        const float b = beta[n * Hv + h];
        const float* kp = k + (n * Hk + hk) * D;
        const float* qp = q + (n * Hk + hk) * D;
        float kk[RECUR_MAX_PER_LANE];
        float dot = 0.f;
#pragma unroll
        for (int e = 0; e < RECUR_MAX_PER_LANE; e++) {
            const int col = lane + 32 * e;
            kk[e] = col < D ? kp[col] : 0.f;
            s[e] *= decay;
            dot += s[e] * kk[e];
        }
        dot = warp_sum(dot);
        const float d = (v[(n * Hv + h) * D + i] - dot) * b;
        float o = 0.f;
#pragma unroll
        for (int e = 0; e < RECUR_MAX_PER_LANE; e++) {
            const int col = lane + 32 * e;
            s[e] += d * kk[e];
            o += s[e] * (col < D ? qp[col] : 0.f);
        }
        o = warp_sum(o);
        if (lane == 0) out[(n * Hv + h) * D + i] = o * scale;
    }
#pragma unroll
    for (int e = 0; e < RECUR_MAX_PER_LANE; e++) {
        const int col = lane + 32 * e;
        if (col < D) S[col] = s[e];
    }
}

// The Mamba-2 selective scan. x, y [N, H, P]; dt [N, H] (already softplus'd); A [H]; B, C
// [N, G, Ns]; D [H] or null; state [n_seq, H, P, Ns]; head h reads group h / (H / G).
// Per token, for row p of S = state[s, h]:
//     S_p = exp(dt A) S_p + dt x_p B;  y_p = S_p . C (+ D x_p)
// A warp per row, as delta_net_f32.
RX_EXTERN void ssm_scan_f32(const float* x, const float* dt, const float* A, const float* B, const float* C,
                            const float* Dskip, float* state, float* y, const int* sg, int n_groups, int N,
                            int H, int P, int G, int Ns) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= H * P) return;
    const int h = row / P, p = row % P, gi = h / (H / G);
    const SeqGroup grp = seq_group(sg, n_groups, N);
    float* S = state + (((long long)grp.seq * H + h) * P + p) * Ns;
    const float a = A[h];
    const float dskip = Dskip ? Dskip[h] : 0.f;
    float s[RECUR_MAX_PER_LANE];
#pragma unroll
    for (int e = 0; e < RECUR_MAX_PER_LANE; e++) {
        const int col = lane + 32 * e;
        s[e] = col < Ns ? S[col] : 0.f;
    }
    for (int t = 0; t < grp.count; t++) {
        const long long n = grp.token(t);
        const float dtv = dt[n * H + h];
        const float dA = expf(dtv * a);
        const float xv = x[(n * H + h) * P + p];
        const float u = xv * dtv;
        const float* Bp = B + (n * G + gi) * Ns;
        const float* Cp = C + (n * G + gi) * Ns;
        float acc = 0.f;
#pragma unroll
        for (int e = 0; e < RECUR_MAX_PER_LANE; e++) {
            const int col = lane + 32 * e;
            if (col < Ns) {
                s[e] = s[e] * dA + u * Bp[col];
                acc += s[e] * Cp[col];
            }
        }
        acc = warp_sum(acc);
        if (lane == 0) y[(n * H + h) * P + p] = acc + dskip * xv;
    }
#pragma unroll
    for (int e = 0; e < RECUR_MAX_PER_LANE; e++) {
        const int col = lane + 32 * e;
        if (col < Ns) S[col] = s[e];
    }
}
