// The one translation unit that build.py compiles: every reflex kernel, extern "C" so the
// CUDA backend finds them by name in the fatbin.
#include "common.cuh"
#include "quants.cuh"
#include "matmul.cuh"
#include "mma.cuh"
#include "elementwise.cuh"
#include "attention.cuh"
#include "mla.cuh"
#include "sampling.cuh"
#include "moe.cuh"
#include "recurrent.cuh"
#include "fused.cuh"
#include "flash.cuh"
