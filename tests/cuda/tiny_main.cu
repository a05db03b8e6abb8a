// A test-only translation unit for tests/test_kernels_build.py: kernels/build.py builds it (with
// tiny_other.cu) for two targets in seconds, where the real units take minutes a target.
extern "C" __global__ void tiny_add_f32(const float *a, const float *b, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a[i] + b[i];
}
