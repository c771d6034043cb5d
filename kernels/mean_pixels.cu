// The mean over the pixels of each image and channel of a channels-last tensor:
//   y[n][c] = (1 / P) sum_p x[n][p][c]        x [N][P][C] (P = H W), y [N][C]
// squeeze-and-excitation's pooling (cupyconv/pooling.py), where torch's mean over the non-contiguous
// (H, W) of a channels_last tensor reads at about a third of the copy bandwidth.
//
// mean_pixels: block (256) of image blockIdx.y, channel vectors blockIdx.x * LANES_C ..; its threads are
// lanes_c vectors (VEC channels, 16 bytes) x 256 / lanes_c pixel lanes, so that a warp reads whole
// contiguous pixel rows even where C is small. Each block sums the pixels of its split (blockIdx.z),
// its lanes' float sums added in shared memory in a fixed order. One split: the block writes the mean.
// Several: it writes partial[split][n][c], and the last block of its (image, channel block) to arrive
// (flags[n][blockIdx.x] counts them: the FLAGS operand, zero before, reset to zero by that block) adds
// the splits in order and writes the mean: the same bits every run, whichever block is last.
#include "dtypes.cuh"

namespace cupyconv {

template <typename T, int VEC>
__global__ void __launch_bounds__(256)
mean_pixels(const T* __restrict__ x, float* __restrict__ partial, T* __restrict__ y, int* __restrict__ flags, int N,
            int P, int C, int lanes_c, int pixels_per_split) {
    struct alignas(VEC * sizeof(T)) Vec { T v[VEC]; };
    __shared__ float sums[256][VEC + 1];  // +1: the lanes' rows fall in different banks
    __shared__ int last;
    const int tid = threadIdx.x, lanes_p = 256 / lanes_c;
    const int lane_c = tid % lanes_c, lane_p = tid / lanes_c;
    const int vectors = C / VEC, vector = blockIdx.x * lanes_c + lane_c;
    const int n = blockIdx.y, first = blockIdx.z * pixels_per_split;
    const int end = min(P, first + pixels_per_split);
    float acc[VEC] = {};
    if (lane_p < lanes_p && vector < vectors) {
        const Vec* row = reinterpret_cast<const Vec*>(x + static_cast<long long>(n) * P * C) + vector;
        const long long step = static_cast<long long>(lanes_p) * vectors;
        int p = first + lane_p;
        // Four rows' loads in flight before their sums (the sums' order is fixed either way).
        for (; p + 3 * lanes_p < end; p += 4 * lanes_p) {
            const Vec* at = row + static_cast<long long>(p) * vectors;
            const Vec a = at[0], b = at[step], c = at[2 * step], d = at[3 * step];
#pragma unroll
            for (int e = 0; e < VEC; ++e)
                acc[e] += to_acc<float>(a.v[e]) + to_acc<float>(b.v[e]) + to_acc<float>(c.v[e]) + to_acc<float>(d.v[e]);
        }
        for (; p < end; p += lanes_p) {
            const Vec a = row[static_cast<long long>(p) * vectors];
#pragma unroll
            for (int e = 0; e < VEC; ++e) acc[e] += to_acc<float>(a.v[e]);
        }
    }
#pragma unroll
    for (int e = 0; e < VEC; ++e) sums[tid][e] = acc[e];
    __syncthreads();
    const bool owner = lane_p == 0 && vector < vectors;  // a thread of each of the block's vectors
    if (owner) {
        for (int l = 1; l < lanes_p; ++l)
#pragma unroll
            for (int e = 0; e < VEC; ++e) acc[e] += sums[lane_c + l * lanes_c][e];
    }
    const long long at = static_cast<long long>(n) * C + vector * VEC;
    if (gridDim.z == 1) {
        if (owner)
#pragma unroll
            for (int e = 0; e < VEC; ++e) y[at + e] = from_acc<T>(acc[e] / static_cast<float>(P));
        return;
    }
    if (owner)
#pragma unroll
        for (int e = 0; e < VEC; ++e) __stcg(partial + static_cast<long long>(blockIdx.z) * N * C + at + e, acc[e]);
    __threadfence();  // the partial sums visible before the count
    __syncthreads();
    int* count = flags + n * gridDim.x + blockIdx.x;
    if (tid == 0) last = atomicAdd(count, 1) == static_cast<int>(gridDim.z) - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (owner) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[e] = 0.0f;
        for (int split = 0; split < static_cast<int>(gridDim.z); ++split)
#pragma unroll
            for (int e = 0; e < VEC; ++e) acc[e] += __ldcg(partial + static_cast<long long>(split) * N * C + at + e);
#pragma unroll
        for (int e = 0; e < VEC; ++e) y[at + e] = from_acc<T>(acc[e] / static_cast<float>(P));
    }
    if (tid == 0) *count = 0;  // zero again for the next launch
}

}  // namespace cupyconv
