// Prefill attention on tensor cores (many queries over an f16 KV cache [Hkv, ctx, hd]): the
// same contract as attention_f16kv (attention.cuh: causal / sliding window / additive mask /
// softcap / GQA; a query with no visible key gets zeros), in flash-attention form.
//
// Rows: the queries of the G = Hq / Hkv heads that share one kv head are interleaved into
// N * G rows, r = n * G + (h % G), so one block's K/V tiles serve all of them. A block
// takes FLASH_BM = 16 * FLASH_WARPS consecutive rows of one kv head (grid (Hkv, ceil(N * G
// / FLASH_BM)), the last row tiles, the ones with the most keys under causal masking, first)
// and warp w the rows 16w..16w+15 of it. Each lane holds two rows (g and g + 8 of the
// warp's 16, g = lane >> 2), as the mma fragments do (mma.cuh's comment has the layout).
//
// Keys: the block walks tiles of BN keys from the tile holding the smallest visible key of
// any of its rows to the largest one (the union of the rows' [lo, hi] ranges); a warp whose
// 16 rows see nothing in a tile skips its math there (causal: the block's early rows at the
// last tiles). Per tile and warp:
//   S [16 x BN] = Q K^T by mma.m16n8k16 (Q scaled by `scale`, rounded to f16 once, kept in
//   registers as A fragments; K tile in shared memory [BN][HD + 8] read as B fragments);
//   per element: softcap, then hidden (-inf) outside the row's [lo, hi], else + mask;
//   online softmax in f32 (row max over the quad's 4 lanes, rescale of the O accumulator
//   and of the lane's partial row sum);
//   O [16 x HD] += P V with P rounded to f16 (the S accumulators are the A fragments of P
//   directly) and the V tile read transposed with ldmatrix.trans.
// K(t+1) is fetched (cp.async) while P V(t) runs and V(t+1) while S(t+1) runs: one K and
// one V buffer, 2 * BN * (HD + 8) halves of static shared memory (<= 34.8 KB).
// Keys of a tile outside the block's range load as zeros (never read past the range).
//
// Few row tiles over many keys (a short batch after a long context, system1's masked pass
// over every slot) would leave SMs idle: the host then splits the keys over gridDim.z blocks
// of `chunk` keys each, which write partial (max, sum, unnormalized O) rows in
// attention_split_f16kv's layout, and attention_combine merges them.
//
// sm_80+ only (mma.m16n8k16 f16, cp.async); older architectures trap, and the host
// (CudaOps.attention) never picks these kernels there. tests/test_flash_tiling.py models
// this tiling and the online softmax in numpy.
#pragma once
#include "attention.cuh"
#include "mma.cuh"

#define FLASH_WARPS 4
#define FLASH_BM (16 * FLASH_WARPS)  // rows per block
#define FLASH_PAD 8                  // shared row stride HD + 8 halves: ldmatrix / fragment loads hit 32 banks

// HD: the key (and query) width; HDV: the value (and output) width, HD but for the
// decompressed multi-head latent attention (192 / 128: mla.cuh).
template <int HD, int HDV = HD>
struct FlashCfg {
    static constexpr int BN = HD <= 128 ? 64 : 32;  // keys per tile
    static constexpr int LD = HD + FLASH_PAD;
    static constexpr int LDV = HDV + FLASH_PAD;
};

#if __CUDA_ARCH__ >= 800
__device__ __forceinline__ void flash_mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 16 bytes global -> shared, asynchronously; zeros when !pred (nothing is read then)
__device__ __forceinline__ void flash_cp16(__half* dst, const __half* src, bool pred) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(pred ? 16 : 0));
}

__device__ __forceinline__ void flash_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N>
__device__ __forceinline__ void flash_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// keys k0..k0+BN-1 of one head's K or V (base = head start, rows of D halves) into
// s[BN][D + FLASH_PAD]; keys outside [klo, khi] are zeros. Chunk c (of BN * D / 8) = key
// c / (D/8), 8 halves at (c % (D/8)) * 8; thread p copies chunks p, p + blockDim, ...
template <int D, int BN>
__device__ __forceinline__ void flash_load(__half* s, const __half* __restrict__ base, int k0, int klo, int khi) {
    constexpr int LD = D + FLASH_PAD, CPR = D / 8;
    static_assert(BN * CPR % (32 * FLASH_WARPS) == 0, "flash_load: whole chunks per thread");
#pragma unroll
    for (int i = 0; i < BN * CPR / (32 * FLASH_WARPS); i++) {
        const int c = threadIdx.x + i * 32 * FLASH_WARPS;
        const int r = c / CPR, col = (c % CPR) * 8;
        const int j = k0 + r;
        const bool in = j >= klo && j <= khi;
        flash_cp16(s + r * LD + col, in ? base + (long long)j * D + col : base, in);
    }
}
#endif

template <int HD, int HDV>
__device__ __forceinline__ void flash_body(const float* __restrict__ q, const __half* __restrict__ kc,
                                           const __half* __restrict__ vc, float* __restrict__ out,
                                           float* __restrict__ part_ml, float* __restrict__ part_acc,
                                           const int* __restrict__ pos, const float* __restrict__ mask,
                                           const float* __restrict__ sinks, int N, int Hq, int Hkv, int ctx,
                                           int n_kv, float scale, float softcap, int causal, int window,
                                           int chunk, int span) {
#if __CUDA_ARCH__ >= 800
    constexpr int BN = FlashCfg<HD, HDV>::BN, LD = FlashCfg<HD, HDV>::LD, LDV = FlashCfg<HD, HDV>::LDV;
    constexpr int KT = HD / 16;  // k steps of S = Q K^T
    constexpr int NT = BN / 8;   // 8-key column tiles of S
    constexpr int DT = HDV / 8;  // 8-dim column tiles of O
    constexpr float LOG2E = 1.4426950408889634f;
    __shared__ __align__(16) __half sk[BN * LD];
    __shared__ __align__(16) __half sv[BN * LDV];
    __shared__ int wrange[FLASH_WARPS][2];

    const int G = Hq / Hkv, kvh = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int tile = gridDim.y - 1 - blockIdx.y;  // the last rows (most keys) first
    const int rows = N * G;

    // this lane's two rows (i = 0: row g of the warp's 16, i = 1: row g + 8): query, head,
    // visible keys [lo, hi] (empty: lo = INT_MAX, hi = -1)
    int rn[2], rh[2], rlo[2], rhi[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = tile * FLASH_BM + warp * 16 + g + 8 * i;
        rn[i] = 0;
        rh[i] = 0;
        rlo[i] = 0x7fffffff;
        rhi[i] = -1;
        if (r < rows) {
            const int n = r / G, p = pos[n];
            rn[i] = n;
            rh[i] = kvh * G + r % G;
            const int hi = causal ? min(p, n_kv - 1) : n_kv - 1;
            const int lo = att_lo(p, window, span);
            if (lo <= hi) {
                rlo[i] = lo;
                rhi[i] = hi;
            }
        }
    }
    int wlo = min(rlo[0], rlo[1]), whi = max(rhi[0], rhi[1]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        wlo = min(wlo, __shfl_xor_sync(0xffffffffu, wlo, o));
        whi = max(whi, __shfl_xor_sync(0xffffffffu, whi, o));
    }
    if (lane == 0) {
        wrange[warp][0] = wlo;
        wrange[warp][1] = whi;
    }

    // Q as A fragments, scaled, f16: a[kt] = rows (g, g+8) x dims kt*16 + (2t, 2t+1, 2t+8, 2t+9)
    uint32_t a[KT][4];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const bool ok = tile * FLASH_BM + warp * 16 + g + 8 * i < rows;
        const float* qp = q + ((long long)rn[i] * Hq + rh[i]) * HD + 2 * t;
#pragma unroll
        for (int kt = 0; kt < KT; kt++) {
            float2 lo2 = make_float2(0.f, 0.f), hi2 = make_float2(0.f, 0.f);
            if (ok) {
                lo2 = *reinterpret_cast<const float2*>(qp + kt * 16);
                hi2 = *reinterpret_cast<const float2*>(qp + kt * 16 + 8);
            }
            a[kt][i] = pack_half2(lo2.x * scale, lo2.y * scale);
            a[kt][2 + i] = pack_half2(hi2.x * scale, hi2.y * scale);
        }
    }

    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    float o[DT][4];
#pragma unroll
    for (int d = 0; d < DT; d++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[d][e] = 0.f;

    __syncthreads();
    int blo = 0x7fffffff, bhi = -1;
#pragma unroll
    for (int w = 0; w < FLASH_WARPS; w++) {
        blo = min(blo, wrange[w][0]);
        bhi = max(bhi, wrange[w][1]);
    }
    if (part_ml) {  // split keys: this block's share [z * chunk, (z + 1) * chunk) of them
        const int z = blockIdx.z;
        blo = max(blo, z * chunk);
        bhi = min(bhi, z * chunk + chunk - 1);
        if (blo > bhi) bhi = -1;
    }
    const __half* kb = kc + (long long)kvh * ctx * HD;
    const __half* vb = vc + (long long)kvh * ctx * HDV;
    const float* mrow[2] = {mask ? mask + (long long)rn[0] * n_kv : nullptr,
                            mask ? mask + (long long)rn[1] * n_kv : nullptr};
    int k0 = bhi >= 0 ? blo / BN * BN : 1;  // nothing visible: no tile (k0 > bhi)
    if (k0 <= bhi) {
        flash_load<HD, BN>(sk, kb, k0, blo, bhi);
        flash_commit();
        flash_load<HDV, BN>(sv, vb, k0, blo, bhi);
        flash_commit();
    }
    for (; k0 <= bhi; k0 += BN) {
        const bool more = k0 + BN <= bhi;
        const bool active = k0 <= whi && k0 + BN - 1 >= wlo;  // warp-uniform
        flash_wait<1>();  // K(k0) landed (V(k0) may be in flight)
        __syncthreads();
        float s[NT][4];
        if (active) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[nt][e] = 0.f;
#pragma unroll
            for (int kt = 0; kt < KT; kt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const __half* kp = sk + (nt * 8 + g) * LD + kt * 16 + 2 * t;
                    flash_mma(s[nt], a[kt], *reinterpret_cast<const uint32_t*>(kp),
                              *reinterpret_cast<const uint32_t*>(kp + 8));
                }
            // s[nt][e]: row g + 8 * (e >> 1), key k0 + nt * 8 + 2t + (e & 1)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int i = e >> 1, j = k0 + nt * 8 + 2 * t + (e & 1);
                    float x = s[nt][e];
                    if (softcap > 0.f) x = softcap * tanhf(x / softcap);
                    if (j < rlo[i] || j > rhi[i])
                        x = -INFINITY;
                    else if (mask)
                        x += mrow[i][j];
                    s[nt][e] = x;
                }
#pragma unroll
            for (int i = 0; i < 2; i++) {
                float mx = -INFINITY;
#pragma unroll
                for (int nt = 0; nt < NT; nt++) mx = fmaxf(mx, fmaxf(s[nt][2 * i], s[nt][2 * i + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float mn = fmaxf(m[i], mx);
                const float mu = mn == -INFINITY ? 0.f : mn;  // nothing seen yet: exp of -inf = 0
                const float corr = exp2f((m[i] - mu) * LOG2E);
                m[i] = mn;
                float sum = 0.f;
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 2 * i; e < 2 * i + 2; e++) {
                        const float p = exp2f((s[nt][e] - mu) * LOG2E);
                        s[nt][e] = p;
                        sum += p;
                    }
                l[i] = l[i] * corr + sum;
#pragma unroll
                for (int d = 0; d < DT; d++) {
                    o[d][2 * i] *= corr;
                    o[d][2 * i + 1] *= corr;
                }
            }
        }
        __syncthreads();  // every warp is done with K(k0)
        if (more) {
            flash_load<HD, BN>(sk, kb, k0 + BN, blo, bhi);
            flash_commit();
            flash_wait<1>();  // V(k0) landed (K(k0 + BN) may be in flight)
        } else {
            flash_wait<0>();
        }
        __syncthreads();
        if (active) {
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) {
                // P's A fragment for keys kk*16..: the S accumulators of column tiles 2kk, 2kk+1
                uint32_t pa[4];
                pa[0] = pack_half2(s[2 * kk][0], s[2 * kk][1]);
                pa[1] = pack_half2(s[2 * kk][2], s[2 * kk][3]);
                pa[2] = pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                pa[3] = pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
                // V's B fragments, two 8-dim tiles per ldmatrix.x4.trans: lane L addresses
                // key kk*16 + (L & 7) + ((L >> 3) & 1) * 8, dims dp*16 + (L >> 4) * 8
                const __half* vp = sv + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDV + (lane >> 4) * 8;
#pragma unroll
                for (int dp = 0; dp < DT / 2; dp++) {
                    uint32_t b0, b1, b2, b3;
                    const unsigned addr = (unsigned)__cvta_generic_to_shared(vp + dp * 16);
                    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                                 : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3)
                                 : "r"(addr));
                    flash_mma(o[2 * dp], pa, b0, b1);
                    flash_mma(o[2 * dp + 1], pa, b2, b3);
                }
            }
        }
        __syncthreads();  // every warp is done with V(k0)
        if (more) {
            flash_load<HDV, BN>(sv, vb, k0 + BN, blo, bhi);
            flash_commit();
        }
    }

    // the row sums over the quad's 4 lanes, then out = O / l (0 when nothing was visible), or
    // with split keys the partial (m, l, O) at slot (n * Hq + h) * S + z, attention_split_f16kv's
    // layout, which attention_combine merges (m = -inf: nothing visible in this share)
#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = tile * FLASH_BM + warp * 16 + g + 8 * i;
        if (r >= rows) continue;
        const long long row = (long long)rn[i] * Hq + rh[i];
        if (part_ml) {
            const long long slot = row * gridDim.z + blockIdx.z;
            if (t == 0) {
                part_ml[2 * slot] = m[i];
                part_ml[2 * slot + 1] = l[i];
            }
            float* ap = part_acc + slot * HDV + 2 * t;
#pragma unroll
            for (int d = 0; d < DT; d++) *reinterpret_cast<float2*>(ap + d * 8) = make_float2(o[d][2 * i], o[d][2 * i + 1]);
            continue;
        }
        float f;  // an attention sink in the denominator (attention.cuh); with split keys attention_combine adds it
        const float L = att_sink(m[i], l[i], sinks, rh[i], &f);
        const float inv = L > 0.f ? f / L : 0.f;
        float* op = out + row * HDV + 2 * t;
#pragma unroll
        for (int d = 0; d < DT; d++)
            *reinterpret_cast<float2*>(op + d * 8) = make_float2(o[d][2 * i] * inv, o[d][2 * i + 1] * inv);
    }
#else
    __trap();  // no mma.m16n8k16 before sm_80: the host never launches this there
#endif
}

// out [N, Hq, HDV] = attention of q [N, Hq, HD] (float32) over the f16 caches kc [Hkv, ctx, HD]
// and vc [Hkv, ctx, HDV], as attention_f16kv. Grid (Hkv, ceil(N * Hq / Hkv / FLASH_BM), S),
// block 32 * FLASH_WARPS. part_ml null: S = 1, out written. Else (few row tiles over many
// keys) block z takes the keys [z * chunk, (z + 1) * chunk) (chunk a multiple of 64) and
// writes partials for attention_combine (grid (Hq, N), hd = HDV, the same sinks) instead of out.
// sinks (null: none) [Hq]: a logit per head in the denominator only, applied once: here, or
// by attention_combine when the keys are split. span > 0: chunked attention (att_lo).
#define RX_FLASH_KV(NAME, HD, HDV)                                                                      \
    RX_EXTERN void __launch_bounds__(32 * FLASH_WARPS)                                                 \
        flash_attention_f16kv_##NAME(const float* __restrict__ q, const __half* __restrict__ kc,       \
                                     const __half* __restrict__ vc, float* __restrict__ out,           \
                                     float* __restrict__ part_ml, float* __restrict__ part_acc,        \
                                     const int* __restrict__ pos, const float* __restrict__ mask,      \
                                     const float* __restrict__ sinks, int N, int Hq, int Hkv, int ctx, \
                                     int n_kv, float scale, float softcap, int causal, int window,     \
                                     int chunk, int span) {                                            \
        flash_body<HD, HDV>(q, kc, vc, out, part_ml, part_acc, pos, mask, sinks, N, Hq, Hkv, ctx, n_kv, \
                            scale, softcap, causal, window, chunk, span);                              \
    }
#define RX_FLASH(HD) RX_FLASH_KV(HD, HD, HD)

RX_FLASH(64)
RX_FLASH(128)
RX_FLASH(256)
RX_FLASH_KV(192_128, 192, 128)  // DeepSeek's decompressed heads: 128 + 64 (rope) keys, 128 values
