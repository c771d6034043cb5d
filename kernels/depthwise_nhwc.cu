// Depthwise 2-D convolution on NHWC arrays (one channel per group, no multiplier: K == C == groups).
//
// Channels are innermost in NHWC, so a thread computes VEC consecutive channels of one output pixel
// with VEC-wide loads and stores (16 bytes where C allows): consecutive threads take consecutive
// channel vectors of a pixel, and a warp reads and writes whole contiguous runs of memory. For each
// tap the thread reads one input vector (zeros where the tap falls in the padding) and one weight
// vector; the weight comes prepared as [kh kw][C] (families/depthwise_nhwc.py), so it is a vector
// too. Neighbouring pixels read overlapping input, which L1 and L2 catch; there is no shared memory
// and no barrier. x and y must be aligned to a vector (the fronts copy operands that are not). Sums in the accumulator type (float, or double for double), rounded once.
// Arguments as every convolution kernel's (families/common.py conv_launch; K and groups are C).
// 1-D grid over N Ho Wo C / VEC threads, 256 per block.
#include "dtypes.cuh"
#include "epilogue.cuh"

namespace cupyconv {

template <typename T, int VEC> struct alignas(sizeof(T) * VEC) vec_t { T v[VEC]; };

template <typename T, typename Index, int VEC>
__global__ void __launch_bounds__(256)
depthwise_nhwc(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias, T* __restrict__ y,
               int has_bias, const T* __restrict__ residual, int has_residual, int activation,
               int N, int C, int H, int W, int K, int Ho, int Wo, int kh, int kw,
               int sh, int sw, int pt, int pl, int dh, int dw, int groups) {
    using Acc = typename accumulator<T>::type;
    using Vec = vec_t<T, VEC>;
    const int vectors = C / VEC;
    const Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;
    const Index pixels = static_cast<Index>(N) * Ho * Wo;
    if (i >= pixels * vectors) return;
    const Index pixel = i / vectors;
    const int c0 = static_cast<int>(i - pixel * vectors) * VEC;
    const int ow = static_cast<int>(pixel % Wo);
    const Index nh = pixel / Wo;
    const int oh = static_cast<int>(nh % Ho);
    const Index n = nh / Ho;
    const int ih0 = oh * sh - pt, iw0 = ow * sw - pl;

    Acc acc[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc[j] = Acc(0);
    const T* x_image = x + n * H * W * C + c0;
#pragma unroll 1
    for (int r = 0; r < kh; ++r) {
        const int ih = ih0 + r * dh;
        if (static_cast<unsigned>(ih) >= static_cast<unsigned>(H)) continue;
#pragma unroll 4
        for (int s = 0; s < kw; ++s) {
            const int iw = iw0 + s * dw;
            if (static_cast<unsigned>(iw) >= static_cast<unsigned>(W)) continue;
            const Vec xv = *reinterpret_cast<const Vec*>(x_image + (static_cast<Index>(ih) * W + iw) * C);
            const Vec wv = *reinterpret_cast<const Vec*>(w + (r * kw + s) * C + c0);
#pragma unroll
            for (int j = 0; j < VEC; ++j) acc[j] += to_acc<Acc>(xv.v[j]) * to_acc<Acc>(wv.v[j]);
        }
    }
    Vec out;
    if (has_bias) {  // element by element: the caller's bias need not be aligned to a vector
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc[j] += to_acc<Acc>(bias[c0 + j]);
    }
    const Index o = pixel * C + c0;
    with_epilogue<T>(residual, has_residual, activation, [&](auto finish) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) out.v[j] = finish(acc[j], o + j);
    });
    *reinterpret_cast<Vec*>(y + o) = out;
}

}  // namespace cupyconv
