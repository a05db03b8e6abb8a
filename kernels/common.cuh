// Shared helpers for the reflex kernels: half/bf16 loads, warp and block reductions.
#pragma once
#include <cuda_fp16.h>
#include <stdint.h>

#define RX_EXTERN extern "C" __global__

#define GRID_STRIDE(i, n) \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (n); \
         i += (long long)gridDim.x * blockDim.x)

__device__ __forceinline__ float ld_f16(const uint8_t* p) {
    return __half2float(*reinterpret_cast<const __half*>(p));
}

__device__ __forceinline__ float bf16_to_f32(uint16_t v) {
    return __uint_as_float(((uint32_t)v) << 16);
}

// 8 bytes from a 2-byte aligned address
__device__ __forceinline__ void ld8_a2(const uint8_t* p, uint8_t out[8]) {
    const uint16_t* q = reinterpret_cast<const uint16_t*>(p);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint16_t v = __ldg(q + i);
        out[2 * i] = v & 0xff;
        out[2 * i + 1] = v >> 8;
    }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// sum over the block; every thread gets the result. blockDim.x a multiple of 32, <= 1024.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float part[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    v = lane < nw ? part[lane] : 0.f;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v) {
    __shared__ float part[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    v = lane < nw ? part[lane] : -INFINITY;
    return warp_max(v);
}

// Accurate transcendental helpers (the build does not use --use_fast_math: parity with
// the CPU backend matters more than a few cycles in these element-wise kernels).
__device__ __forceinline__ float gelu_tanh(float x) {
    const float c = 0.7978845608028654f;  // sqrt(2/pi)
    return 0.5f * x * (1.f + tanhf(c * (x + 0.044715f * x * x * x)));
}

__device__ __forceinline__ float silu(float x) { return x / (1.f + expf(-x)); }
// gpt-oss's clamped SwiGLU of a gate g and up u (llama.cpp's swiglu_oai): x = min(g, limit),
// y = clamp(u, -limit, limit), x / (1 + exp(-alpha x)) * (y + 1).
__device__ __forceinline__ float swiglu_oai(float g, float u, float alpha, float limit) {
    const float x = fminf(g, limit), y = fminf(fmaxf(u, -limit), limit);
    return x / (1.f + expf(alpha * (-x))) * (y + 1.f);
}
