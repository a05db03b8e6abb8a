// kernels/iq_deq.cuh compiled on the host (tests/test_cuda_iq.py): reads a ggml type id, a
// block count and the blocks on stdin, writes every block's values (chunk by chunk, as the
// CUDA kernels read them) as float32 on stdout.
#include <stdio.h>
#include <stdlib.h>

#include "../../kernels/iq_deq.cuh"

int main() {
    int type, n;
    if (fread(&type, 4, 1, stdin) != 1 || fread(&n, 4, 1, stdin) != 1) return 2;
    int qk = 256, bytes;
    void (*chunk)(const uint8_t*, int, float*);
    switch (type) {
    case 16: chunk = iq_iq2_xxs; bytes = 66; break;
    case 17: chunk = iq_iq2_xs; bytes = 74; break;
    case 18: chunk = iq_iq3_xxs; bytes = 98; break;
    case 19: chunk = iq_iq1_s; bytes = 50; break;
    case 20: chunk = iq_iq4_nl; bytes = 18; qk = 32; break;
    case 21: chunk = iq_iq3_s; bytes = 110; break;
    case 22: chunk = iq_iq2_s; bytes = 82; break;
    case 23: chunk = iq_iq4_xs; bytes = 136; break;
    case 29: chunk = iq_iq1_m; bytes = 56; break;
    case 34: chunk = iq_tq1_0; bytes = 54; break;
    case 35: chunk = iq_tq2_0; bytes = 66; break;
    case 39: chunk = iq_mxfp4; bytes = 17; qk = 32; break;
    default: return 3;
    }
    uint8_t* blocks = (uint8_t*)malloc((size_t)n * bytes);
    float* out = (float*)malloc((size_t)n * qk * sizeof(float));
    if (fread(blocks, bytes, n, stdin) != (size_t)n) return 4;
    for (int b = 0; b < n; b++)
        for (int c = 0; c < qk / 8; c++) chunk(blocks + (size_t)b * bytes, c, out + (size_t)b * qk + 8 * c);
    fwrite(out, sizeof(float), (size_t)n * qk, stdout);
    return 0;
}
