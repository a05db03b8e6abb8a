// The second translation unit: the kernels of the IQ formats, TQ1_0 / TQ2_0 and MXFP4
// (reflex_kernels_iq.fatbin, built beside reflex_kernels.fatbin by build.py). The CUDA backend
// loads it only when a model holds weights of these formats (cuda/core.py), so the main
// fatbin, which every start reads and loads, does not grow with them.
//
// The kernels are the families' own (matmul.cuh, mma.cuh with its grouped MoE GEMMs,
// matvec_nt.cuh, fused.cuh, mla.cuh with attn_k_b's transpose, moe.cuh: their templates over
// deq8, with iq.cuh's block readers): their headers are included with RX_EXTERN turned into
// an unused template, so that nothing they define as a kernel is emitted here (their formats
// stay in the main fatbin), then RX_EXTERN is restored and each family's instantiation macro
// is applied to RX_IQ_FORMATS.
#include "common.cuh"

#undef RX_EXTERN
#define RX_EXTERN template <int RX_IN_THE_MAIN_FATBIN = 0> __global__
#include "quants.cuh"
#include "iq.cuh"
#include "matmul.cuh"
#include "mma.cuh"
#include "matvec_nt.cuh"
#include "fused.cuh"
#include "mla.cuh"
#include "moe.cuh"
#undef RX_EXTERN
#define RX_EXTERN extern "C" __global__

RX_IQ_FORMATS(RX_MM)
RX_IQ_FORMATS(RX_MMA)
RX_IQ_FORMATS(RX_MMA_MOE)
RX_IQ_FORMATS(RX_MMT)
RX_IQ_FORMATS(RX_MMNORM)
RX_IQ_FORMATS(RX_HMM)
RX_IQ_FORMATS(RX_MLA_KB_T)
RX_IQ_FORMATS(RX_MOE)
