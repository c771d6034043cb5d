// The second step of a split-K GEMM (kernels/simt_gemm_conv2d.cu with splits > 1): y[i] = the
// splits' partial sums partial[s][i] added in split order, plus the bias of i's channel
// ((i / plane) % K) where has_bias. The fixed order makes the result the same bits on every run,
// unlike atomic accumulation. One thread per element; grid ceil(elements / 256).
namespace cupyconv {

template <typename Index>
__global__ void __launch_bounds__(256)
split_k_reduce(const float* __restrict__ partial, const float* __restrict__ bias, float* __restrict__ y,
               int has_bias, int splits, int elements, int K, int plane) {
    const Index i = static_cast<Index>(blockIdx.x) * 256 + threadIdx.x;
    if (i >= elements) return;
    float sum = partial[i];
    for (int s = 1; s < splits; ++s) sum += partial[static_cast<Index>(s) * elements + i];
    y[i] = has_bias ? sum + bias[(i / plane) % K] : sum;
}

}  // namespace cupyconv
