// Copies and fills of 4-D boxes of elements, each array read or written through element strides: how a
// transposed convolution of several stride phases (cupyconv/conv_transpose.py) cuts the window of y a
// phase reads, writes a phase's output to its rows and columns of the whole output (every stride-th
// row and column), and fills the phases no tap reaches with the bias or zeros.
//
//   strided_copy: dst[i0 t0 + i1 t1 + i2 t2 + i3 t3] = src[i0 s0 + i1 s1 + i2 s2 + i3 s3]
//   strided_fill: dst[i0 t0 + i1 t1 + i2 t2 + i3 t3] = bias[i_channel_dim] (has_bias) or 0
//
// for i < (d0, d1, d2, d3). The caller orders the dimensions so that d3 is the written array's
// innermost (unit stride), so a warp's writes are consecutive. Bits are copied, so 16-bit types
// travel as one type. One thread per element; grid ceil(d0 d1 d2 d3 / 256).
#include "dtypes.cuh"

namespace cupyconv {

struct BoxIndex {
    int i[4];
};

__device__ __forceinline__ bool box_index(int d0, int d1, int d2, int d3, BoxIndex& at) {
    const long long e = static_cast<long long>(blockIdx.x) * 256 + threadIdx.x;
    if (e >= static_cast<long long>(d0) * d1 * d2 * d3) return false;
    long long rest = e;
    at.i[3] = static_cast<int>(rest % d3);
    rest /= d3;
    at.i[2] = static_cast<int>(rest % d2);
    rest /= d2;
    at.i[1] = static_cast<int>(rest % d1);
    at.i[0] = static_cast<int>(rest / d1);
    return true;
}

__device__ __forceinline__ long long box_offset(const BoxIndex& at, int t0, int t1, int t2, int t3) {
    return static_cast<long long>(at.i[0]) * t0 + static_cast<long long>(at.i[1]) * t1 +
           static_cast<long long>(at.i[2]) * t2 + static_cast<long long>(at.i[3]) * t3;
}

template <typename T>
__global__ void __launch_bounds__(256)
strided_copy(const T* __restrict__ src, T* __restrict__ dst, int d0, int d1, int d2, int d3, int s0, int s1, int s2,
             int s3, int t0, int t1, int t2, int t3) {
    BoxIndex at;
    if (!box_index(d0, d1, d2, d3, at)) return;
    dst[box_offset(at, t0, t1, t2, t3)] = src[box_offset(at, s0, s1, s2, s3)];
}

template <typename T>
__global__ void __launch_bounds__(256)
strided_fill(const T* __restrict__ bias, T* __restrict__ dst, int has_bias, int channel_dim, int d0, int d1, int d2,
             int d3, int t0, int t1, int t2, int t3) {
    BoxIndex at;
    if (!box_index(d0, d1, d2, d3, at)) return;
    // (a register select, not at.i[channel_dim]: a dynamic index would put the index in local memory)
    const int channel = channel_dim == 1 ? at.i[1] : channel_dim == 3 ? at.i[3] : channel_dim == 2 ? at.i[2] : at.i[0];
    dst[box_offset(at, t0, t1, t2, t3)] = has_bias ? bias[channel] : T{};
}

}  // namespace cupyconv
