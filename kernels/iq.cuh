// The IQ formats, TQ1_0 / TQ2_0 and MXFP4 in the kernels' format switch (quants.cuh): their
// ggml type ids, block sizes and deq8 readers (iq_deq.cuh), and RX_IQ_FORMATS(X), which each
// kernel family (matmul.cuh, matvec_nt.cuh, mma.cuh, fused.cuh, mla.cuh, moe.cuh) applies to
// its instantiation macro: X(name, T) for every one of them. The kernels are the families'
// own (deq8 on the fly, never a dequantized copy); only the block reader is new.
#pragma once
#include "iq_deq.cuh"

enum {
    T_IQ2_XXS = 16, T_IQ2_XS = 17, T_IQ3_XXS = 18, T_IQ1_S = 19, T_IQ4_NL = 20, T_IQ3_S = 21, T_IQ2_S = 22,
    T_IQ4_XS = 23, T_IQ1_M = 29, T_TQ1_0 = 34, T_TQ2_0 = 35, T_MXFP4 = 39
};

#define RX_IQ_TYPE(NAME, T, QK_, BYTES_)                                                       \
    template <> struct QT<T> { enum { QK = QK_, BYTES = BYTES_ }; };                            \
    template <> __device__ __forceinline__ void deq8<T>(const uint8_t* b, int c, float w[8]) { \
        iq_##NAME(b, c, w);                                                                     \
    }

RX_IQ_TYPE(iq2_xxs, T_IQ2_XXS, 256, 66)
RX_IQ_TYPE(iq2_xs, T_IQ2_XS, 256, 74)
RX_IQ_TYPE(iq2_s, T_IQ2_S, 256, 82)
RX_IQ_TYPE(iq3_xxs, T_IQ3_XXS, 256, 98)
RX_IQ_TYPE(iq3_s, T_IQ3_S, 256, 110)
RX_IQ_TYPE(iq1_s, T_IQ1_S, 256, 50)
RX_IQ_TYPE(iq1_m, T_IQ1_M, 256, 56)
RX_IQ_TYPE(iq4_nl, T_IQ4_NL, 32, 18)
RX_IQ_TYPE(iq4_xs, T_IQ4_XS, 256, 136)
RX_IQ_TYPE(tq1_0, T_TQ1_0, 256, 54)
RX_IQ_TYPE(tq2_0, T_TQ2_0, 256, 66)
RX_IQ_TYPE(mxfp4, T_MXFP4, 32, 17)

// X(kernel name suffix, type) for every format above (the backend's MM_KERNEL names them alike)
#define RX_IQ_FORMATS(X)                                                                        \
    X(iq2_xxs, T_IQ2_XXS) X(iq2_xs, T_IQ2_XS) X(iq2_s, T_IQ2_S) X(iq3_xxs, T_IQ3_XXS)            \
    X(iq3_s, T_IQ3_S) X(iq1_s, T_IQ1_S) X(iq1_m, T_IQ1_M) X(iq4_nl, T_IQ4_NL) X(iq4_xs, T_IQ4_XS) \
    X(tq1_0, T_TQ1_0) X(tq2_0, T_TQ2_0) X(mxfp4, T_MXFP4)
