// The second step of a split-K GEMM (simt_gemm_conv2d.cu and implicit_gemm_nhwc.cu with splits > 1):
// y[i] = the splits' float32 partial sums partial[s][i] added in split order, plus the bias of i's
// channel ((i / plane) % K: plane = Ho Wo for an NCHW output, 1 for NHWC), through the epilogue
// (epilogue.cuh: residual, activation), rounded once to T. The
// fixed order makes the result the same bits on every run, unlike atomic accumulation. One thread per
// element; grid ceil(elements / 256).
#include "dtypes.cuh"
#include "epilogue.cuh"

namespace cupyconv {

template <typename T, typename Index>
__global__ void __launch_bounds__(256)
split_k_reduce(const float* __restrict__ partial, const T* __restrict__ bias, T* __restrict__ y,
               int has_bias, const T* __restrict__ residual, int has_residual, int activation, int splits,
               int elements, int K, int plane) {
    const Index i = static_cast<Index>(blockIdx.x) * 256 + threadIdx.x;
    if (i >= elements) return;
    float sum = partial[i];
    for (int s = 1; s < splits; ++s) sum += partial[static_cast<Index>(s) * elements + i];
    if (has_bias) sum += to_acc<float>(bias[(i / plane) % K]);
    with_epilogue<T>(residual, [&](auto finish) { y[i] = finish(sum, i); });
}

}  // namespace cupyconv
