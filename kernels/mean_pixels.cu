// The mean over the pixels of each image and channel of a channels-last tensor:
//   y[n][c] = (1 / P) sum_p x[n][p][c]        x [N][P][C] (P = H W), y [N][C]
// squeeze-and-excitation's pooling (cupyconv/pooling.py), where torch's mean over the non-contiguous
// (H, W) of a channels_last tensor reads at about a third of the copy bandwidth.
//
// mean_pixels_partial: block (256) of image blockIdx.y, channel vectors blockIdx.x * LANES_C ..; its
// threads are LANES_C vectors (VEC channels, 16 bytes) x 256 / LANES_C pixel lanes, so that a warp reads
// whole contiguous pixel rows even where C is small. Each block sums the pixels of its split
// (blockIdx.z), its lanes' float sums added in shared memory in a fixed order, into
// partial[split][n][c]. mean_pixels_finish adds the splits in order and divides: the same bits every
// run (no atomics).
#include "dtypes.cuh"

namespace cupyconv {

template <typename T, int VEC>
__global__ void __launch_bounds__(256)
mean_pixels_partial(const T* __restrict__ x, float* __restrict__ partial, int N, int P, int C, int lanes_c,
                    int pixels_per_split) {
    using Vec = Pack<T, VEC>;
    __shared__ float sums[256][VEC + 1];  // +1: the lanes' rows fall in different banks
    const int tid = threadIdx.x, lanes_p = 256 / lanes_c;
    const int lane_c = tid % lanes_c, lane_p = tid / lanes_c;
    const int vectors = C / VEC, vector = blockIdx.x * lanes_c + lane_c;
    const int n = blockIdx.y, first = blockIdx.z * pixels_per_split;
    const int last = min(P, first + pixels_per_split);
    float acc[VEC] = {};
    if (lane_p < lanes_p && vector < vectors) {
        const Vec* row = reinterpret_cast<const Vec*>(x + static_cast<long long>(n) * P * C) + vector;
        for (int p = first + lane_p; p < last; p += lanes_p) {
            const Vec v = row[static_cast<long long>(p) * vectors];
#pragma unroll
            for (int e = 0; e < VEC; ++e) acc[e] += to_acc<float>(v.v[e]);
        }
    }
#pragma unroll
    for (int e = 0; e < VEC; ++e) sums[tid][e] = acc[e];
    __syncthreads();
    if (lane_p == 0 && vector < vectors) {
        for (int l = 1; l < lanes_p; ++l)
#pragma unroll
            for (int e = 0; e < VEC; ++e) acc[e] += sums[lane_c + l * lanes_c][e];
        float* out = partial + (static_cast<long long>(blockIdx.z) * N + n) * C + vector * VEC;
#pragma unroll
        for (int e = 0; e < VEC; ++e) out[e] = acc[e];
    }
}

template <typename T>
__global__ void __launch_bounds__(256)
mean_pixels_finish(const float* __restrict__ partial, T* __restrict__ y, int N, int P, int C, int splits) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N * C) return;
    float sum = 0.0f;
    for (int s = 0; s < splits; ++s) sum += partial[static_cast<long long>(s) * N * C + i];
    y[i] = from_acc<T>(sum / static_cast<float>(P));
}

}  // namespace cupyconv
