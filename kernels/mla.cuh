// Multi-head latent attention (deepseek2): column copies (split / concat), a matmul with one
// weight per head, YaRN rope, and attention over the latent cache (one KV head whose values
// are the first dv dims of the keys).
#pragma once
#include "matmul.cuh"  // MM_ROWS, and quants.cuh

// y[r*ys + yo + c] = x[r*xs + xo + c] for r < rows, c < n: one slice of columns of a row-major
// x into a slice of columns of y (split: yo = 0, ys = n; concat: xo = 0, xs = n).
RX_EXTERN void copy_cols_f32(const float* __restrict__ x, float* __restrict__ y, long long rows, int n,
                             int xs, int xo, int ys, int yo) {
    GRID_STRIDE(i, rows * n) {
        const long long r = i / n;
        const int c = (int)(i - r * n);
        y[r * ys + yo + c] = x[r * xs + xo + c];
    }
}

// y[n, h, m] = sum_k W[h*M + m, k] * x[n, h, k]: x [N, H, K], W [H*M, K] in its block format,
// y [N, H, M]. Row `row` = h*M + m of W is also column `row` of y's [N, H*M] rows, so this is
// mm's row loop with token t of head h at x + t*H*K + h*K. One warp per row, MM_ROWS rows a
// block, NT tokens per block: grid (ceil(H*M / MM_ROWS), ceil(N / NT)), block 32*MM_ROWS.
template <int T, int NT>
__device__ __forceinline__ void hmm_body(const uint8_t* __restrict__ W, const float* __restrict__ X,
                                         float* __restrict__ Y, int K, int M, int H, int N,
                                         long long row_bytes) {
    const int row = blockIdx.x * MM_ROWS + (threadIdx.x >> 5);
    if (row >= H * M) return;
    const int lane = threadIdx.x & 31;
    const int h = row / M;
    const int n0 = blockIdx.y * NT;
    const int nt = min(NT, N - n0);
    const long long xs = (long long)H * K;  // token stride of x
    const float* xb = X + (long long)n0 * xs + (long long)h * K;
    const uint8_t* wr = W + (long long)row * row_bytes;
    constexpr int CPB = QT<T>::QK / 8;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.f;
    for (int ch = lane; ch < (K >> 3); ch += 32) {
        float w[8];
        deq8<T>(wr + (ch / CPB) * QT<T>::BYTES, ch % CPB, w);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t < nt) {
                const float4* xp = reinterpret_cast<const float4*>(xb + t * xs + ch * 8);
                const float4 a = __ldg(xp), c = __ldg(xp + 1);
                acc[t] += w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * c.x + w[5] * c.y +
                          w[6] * c.z + w[7] * c.w;
            }
        }
    }
    const long long HM = (long long)H * M;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float s = warp_sum(acc[t]);
        if (lane == 0 && t < nt) Y[(long long)(n0 + t) * HM + row] = s;
    }
}

#define RX_HMM_NT(NAME, T, NT)                                                                      \
    RX_EXTERN void __launch_bounds__(128) hmm##NT##_##NAME(const uint8_t* W, const float* X, float* Y, \
                                                           int K, int M, int H, int N, long long rb) { \
        hmm_body<T, NT>(W, X, Y, K, M, H, N, rb);                                                   \
    }
#define RX_HMM(NAME, T) RX_HMM_NT(NAME, T, 1) RX_HMM_NT(NAME, T, 8)

RX_HMM(f32, T_F32)
RX_HMM(f16, T_F16)
RX_HMM(bf16, T_BF16)
RX_HMM(q4_0, T_Q4_0)
RX_HMM(q4_1, T_Q4_1)
RX_HMM(q5_0, T_Q5_0)
RX_HMM(q5_1, T_Q5_1)
RX_HMM(q8_0, T_Q8_0)
RX_HMM(q4_k, T_Q4_K)
RX_HMM(q5_k, T_Q5_K)
RX_HMM(q6_k, T_Q6_K)

// Prefill of the latent attention on tensor cores (CudaOps.mla_attention, many queries): the
// keys and values of every head decompressed from the latents, then flash.cuh's kernel over
// them (192-wide keys: 128 from the latent + the 64 shared rope dims; 128-wide values).
//
// y (f16) [rows, n] = columns xo..xo+n-1 of x (f16, row stride xs) at column yo of y (row
// stride ys): the latents c [n_kv, R] out of the cache rows [c, k_pe], the GEMMs' X operand.
RX_EXTERN void copy_cols_f16(const __half* __restrict__ x, __half* __restrict__ y, long long rows, int n, int xs,
                             int xo, int ys, int yo) {
    GRID_STRIDE(i, rows * n) {
        const long long r = i / n;
        const int c = (int)(i - r * n);
        y[r * ys + yo + c] = x[r * xs + xo + c];
    }
}

// The same from a float32 x (the exact latent cache, SlotSpec(exact=True)), rounded to f16.
RX_EXTERN void copy_cols_f32_f16(const float* __restrict__ x, __half* __restrict__ y, long long rows, int n,
                                 int xs, int xo, int ys, int yo) {
    GRID_STRIDE(i, rows * n) {
        const long long r = i / n;
        const int c = (int)(i - r * n);
        y[r * ys + yo + c] = __float2half_rn(x[r * xs + xo + c]);
    }
}

// attn_k_b [H * R, nope] (head h's rows h*R.., in its block format) transposed per head into
// f16 y [H * nope, R]: y[h*nope + d][r] = W[h*R + r][d], a weight whose rows are the
// decompressed key dims (decompressing k_nope = W_h^T c is then a plain GEMM, mma.cuh). Once
// per layer, on the first long prefill. Thread i: chunk i of 8 columns of one W row.
template <int T>
__device__ __forceinline__ void mla_kb_t_body(const uint8_t* __restrict__ W, __half* __restrict__ y, int H, int R,
                                              int nope, long long rb) {
    constexpr int CPB = QT<T>::QK / 8;
    const int cpr = nope >> 3;
    GRID_STRIDE(i, (long long)H * R * cpr) {
        const long long row = i / cpr;  // h * R + r
        const int ch = (int)(i - row * cpr);
        const int h = (int)(row / R), r = (int)(row - (long long)h * R);
        float w[8];
        deq8<T>(W + row * rb + (ch / CPB) * QT<T>::BYTES, ch % CPB, w);
#pragma unroll
        for (int j = 0; j < 8; j++) y[((long long)h * nope + ch * 8 + j) * R + r] = __float2half_rn(w[j]);
    }
}

#define RX_MLA_KB_T(NAME, T)                                                                      \
    RX_EXTERN void mla_kb_t_##NAME(const uint8_t* W, __half* y, int H, int R, int nope, long long rb) { \
        mla_kb_t_body<T>(W, y, H, R, nope, rb);                                                   \
    }
RX_MLA_KB_T(f32, T_F32)
RX_MLA_KB_T(f16, T_F16)
RX_MLA_KB_T(bf16, T_BF16)
RX_MLA_KB_T(q4_0, T_Q4_0)
RX_MLA_KB_T(q4_1, T_Q4_1)
RX_MLA_KB_T(q5_0, T_Q5_0)
RX_MLA_KB_T(q5_1, T_Q5_1)
RX_MLA_KB_T(q8_0, T_Q8_0)
RX_MLA_KB_T(q4_k, T_Q4_K)
RX_MLA_KB_T(q5_k, T_Q5_K)
RX_MLA_KB_T(q6_k, T_Q6_K)

// The flash kernel's K and V caches from the decompressed heads: kn [n, H * nope] and
// v [n, H * dv] (float32, the GEMMs' outputs) and the rope keys k_pe at columns R..R+r-1 of
// the latent cache rows kc [n, R + r] (f16, or float32 when kc32: the exact latent) ->
//   K [H, n, nope + r] f16: K[h, j] = [kn[j, h*nope ..], kc[j, R ..]] (the rope key shared by
//   every head), V [H, n, dv] f16: V[h, j] = v[j, h*dv ..].
RX_EXTERN void mla_pack_kv_f32(const float* __restrict__ kn, const float* __restrict__ v,
                               const void* __restrict__ kc, __half* __restrict__ K, __half* __restrict__ V,
                               int n, int H, int nope, int r, int R, int dv, int kc32) {
    const int dk = nope + r;
    const long long nk = (long long)H * n * dk;
    GRID_STRIDE(i, nk + (long long)H * n * dv) {
        if (i < nk) {
            const int d = (int)(i % dk);
            const long long hj = i / dk;
            const int j = (int)(hj % n), h = (int)(hj / n);
            const long long e = (long long)j * (R + r) + R + d - nope;  // the rope key's element
            K[i] = d < nope ? __float2half_rn(kn[(long long)j * H * nope + h * nope + d])
                            : (kc32 ? __float2half_rn(static_cast<const float*>(kc)[e])
                                    : static_cast<const __half*>(kc)[e]);
        } else {
            const long long e = i - nk;
            const int d = (int)(e % dv);
            const long long hj = e / dv;
            const int j = (int)(hj % n), h = (int)(hj / n);
            V[e] = __float2half_rn(v[(long long)j * H * dv + h * dv + d]);
        }
    }
}

// rope_f32 with YaRN: for pair i the extrapolated inverse frequency te = base^(-2i/n_rot) / ff[i]
// and the interpolated one te * freq_scale are blended by
//     ramp = (1 - clamp((i - lo) / max(0.001, hi - lo), 0, 1)) * ext_factor
// as inv = ti * (1 - ramp) + te * ramp; lo, hi (the correction dims) and mscale (already
// multiplied by YaRN's 1 + 0.1 ln(1/freq_scale)) come from the host. In place on x[N, H, hd].
RX_EXTERN void rope_yarn_f32(float* x, const int* pos, int N, int H, int hd, int n_rot, float base,
                             float freq_scale, const float* ff, int neox, float mscale, float ext_factor,
                             float lo, float hi) {
    const int half_rot = n_rot >> 1;
    const long long total = (long long)N * H * half_rot;
    GRID_STRIDE(t, total) {
        const int i = t % half_rot;
        const long long nh = t / half_rot;
        const int n = nh / H;
        double te = pow((double)base, -2.0 * i / n_rot);
        if (ff) te /= ff[i];
        double y = ((double)i - lo) / fmax(0.001, (double)hi - lo);
        y = fmin(1.0, fmax(0.0, y));
        const double ramp = (1.0 - y) * ext_factor;
        const double inv = te * freq_scale * (1.0 - ramp) + te * ramp;
        const double ang = fmod((double)pos[n] * inv, 6.283185307179586);
        float s, c;
        sincosf((float)ang, &s, &c);
        float* v = x + nh * hd;
        const int a = neox ? i : 2 * i, b = neox ? i + half_rot : 2 * i + 1;
        const float x0 = v[a], x1 = v[b];
        v[a] = (x0 * c - x1 * s) * mscale;
        v[b] = (x0 * s + x1 * c) * mscale;
    }
}

// Attention over a latent cache kc [ctx, dk] (f16; one KV head shared by all query heads):
// s[j] = scale * q[n, h] . kc[j] (then softcap, mask, the causal / window range as in
// attention_f16kv), values = kc[j][0:dv]. Block (h, n, s) takes the keys [s*chunk, (s+1)*chunk)
// and writes its partial max / sum to part_ml[2*slot ..] and its unnormalized values to
// part_acc[slot*dv ..], slot = (n*H + h)*S + s; attention_combine (hd = dv) merges them. Each
// warp walks a strided subset of the keys with an online softmax; a lane holds dims
// lane + 32t, t < MLA_MAXD, of q and of the key row (read once for the score and the value).
#define MLA_WARPS 8
#define MLA_MAXD 20  // dk <= 640 (DeepSeek: kv_lora_rank 512 + rope 64 = 576)
__device__ __forceinline__ float mla_load(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ float mla_load(const float* p) { return *p; }

// The latent cache in float32 (CudaOps.exact_kv_dtype, runtime.state.SlotSpec(exact=True)): the
// f16 cache rounds the latent, which both keys and values are made of, to 11 bits (issue 32 item
// 18: up to 7e-4 per token of system1 log-probs on a DeepSeek-V3-like model, where the numpy
// backend is within 1e-6 of llama.cpp). kc[pos[n] * dk + d] = k[n * dk + d], k [N, 1, dk].
RX_EXTERN void kv_store_latent_f32(const float* __restrict__ k, float* __restrict__ kc,
                                   const int* __restrict__ pos, int N, int dk) {
    GRID_STRIDE(i, (long long)N * dk) {
        const int n = (int)(i / dk);
        kc[(long long)pos[n] * dk + (i - (long long)n * dk)] = k[i];
    }
}

template <typename KT>
__device__ __forceinline__ void mla_split_body(
    const float* __restrict__ q, const KT* __restrict__ kc, float* __restrict__ part_ml,
    float* __restrict__ part_acc, const int* __restrict__ pos, const float* __restrict__ mask,
    int H, int dk, int dv, int n_kv, float scale, float softcap, int causal, int window, int chunk) {
    const int h = blockIdx.x, n = blockIdx.y, sidx = blockIdx.z, S = gridDim.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long slot = ((long long)n * H + h) * S + sidx;
    const int p = pos[n];
    const int hi = min(causal ? min(p, n_kv - 1) : n_kv - 1, (int)min((long long)n_kv - 1,
                                                                        (long long)(sidx + 1) * chunk - 1));
    const int lo = max(window > 0 ? max(0, p - window + 1) : 0, sidx * chunk);
    if (lo > hi) {  // nothing visible in this block's keys
        if (threadIdx.x == 0) { part_ml[2 * slot] = -INFINITY; part_ml[2 * slot + 1] = 0.f; }
        for (int d = threadIdx.x; d < dv; d += blockDim.x) part_acc[slot * dv + d] = 0.f;
        return;
    }
    float qr[MLA_MAXD], acc[MLA_MAXD];
    const float* qp = q + ((long long)n * H + h) * dk;
#pragma unroll
    for (int t = 0; t < MLA_MAXD; t++) {
        const int d = lane + 32 * t;
        qr[t] = d < dk ? qp[d] * scale : 0.f;
        acc[t] = 0.f;
    }
    float m = -INFINITY, l = 0.f;
    const float* mrow = mask ? mask + (long long)n * n_kv : nullptr;
    for (int j = lo + warp; j <= hi; j += MLA_WARPS) {
        if (mrow && mrow[j] == -INFINITY) continue;
        const KT* kr = kc + (long long)j * dk;
        float kv[MLA_MAXD];
        float s = 0.f;
#pragma unroll
        for (int t = 0; t < MLA_MAXD; t++) {
            const int d = lane + 32 * t;
            kv[t] = d < dk ? mla_load(kr + d) : 0.f;
            s += qr[t] * kv[t];
        }
        s = warp_sum(s);
        if (softcap > 0.f) s = softcap * tanhf(s / softcap);
        if (mrow) s += mrow[j];
        if (s == -INFINITY) continue;
        const float mn = fmaxf(m, s);
        const float corr = expf(m - mn), e = expf(s - mn);
        l = l * corr + e;
#pragma unroll
        for (int t = 0; t < MLA_MAXD; t++) acc[t] = acc[t] * corr + e * kv[t];
        m = mn;
    }
    __shared__ float sm[MLA_WARPS], sl[MLA_WARPS];
    __shared__ float sacc[MLA_WARPS][32 * MLA_MAXD];
    if (lane == 0) { sm[warp] = m; sl[warp] = l; }
#pragma unroll
    for (int t = 0; t < MLA_MAXD; t++) sacc[warp][lane + 32 * t] = acc[t];
    __syncthreads();
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < MLA_WARPS; w++) M = fmaxf(M, sm[w]);
    float L = 0.f, f[MLA_WARPS];
#pragma unroll
    for (int w = 0; w < MLA_WARPS; w++) {
        f[w] = sm[w] == -INFINITY ? 0.f : expf(sm[w] - M);
        L += sl[w] * f[w];
    }
    for (int d = threadIdx.x; d < dv; d += blockDim.x) {
        float a = 0.f;
#pragma unroll
        for (int w = 0; w < MLA_WARPS; w++) a += sacc[w][d] * f[w];
        part_acc[slot * dv + d] = a;
    }
    if (threadIdx.x == 0) { part_ml[2 * slot] = M; part_ml[2 * slot + 1] = L; }
}

// mla_attention_split over an f16 latent cache (kc) and over a float32 one (the _f32 kernel).
#define RX_MLA_SPLIT(NAME, KT)                                                                        \
    RX_EXTERN void __launch_bounds__(32 * MLA_WARPS) NAME(                                           \
        const float* __restrict__ q, const KT* __restrict__ kc, float* __restrict__ part_ml,          \
        float* __restrict__ part_acc, const int* __restrict__ pos, const float* __restrict__ mask,    \
        int H, int dk, int dv, int n_kv, float scale, float softcap, int causal, int window, int chunk) { \
        mla_split_body<KT>(q, kc, part_ml, part_acc, pos, mask, H, dk, dv, n_kv, scale, softcap, causal,  \
                           window, chunk);                                                            \
    }
RX_MLA_SPLIT(mla_attention_split, __half)
RX_MLA_SPLIT(mla_attention_split_f32, float)
