// The second unit of tests/test_kernels_build.py's two-target build (see tiny_main.cu).
extern "C" __global__ void tiny_scale_f32(const float *x, float *y, float s, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * s;
}
