// The rows of an implicit-GEMM convolution: output pixel m = (image, oh, ow), and where in the input
// its receptive field starts. One definition for the three GEMM kernels' gathers.
#pragma once

namespace cupyconv {

// How the kernel reads the input: NCHW planes (also NCHW_A's A^T rows, pixels contiguous) or a
// channels-last copy [N][H][W][C].
enum class GatherLayout { nchw, nhwc };

// Gather state of one output pixel: the input offset `base` of its tap (0, 0), channel 0 of group g,
// and that tap's position (ih0, iw0), which may lie in the padding. Pixels past M keep base 0 and
// ih0 = -2^30, so every tap is out of range and loads zeros.
template <typename Index> struct GatherPixel {
    Index base = 0;
    int ih0 = -(1 << 30), iw0 = 0;
};

template <GatherLayout LAYOUT, typename Index>
__device__ __forceinline__ GatherPixel<Index> gather_pixel(Index m, Index M, Index HoWo, int Wo, int C, int H, int W,
                                                           int sh, int sw, int pt, int pl, int g, int Cg) {
    GatherPixel<Index> px;
    if (m < M) {
        const Index image = m / HoWo, p = m - image * HoWo;
        const int oh = static_cast<int>(p / Wo), ow = static_cast<int>(p - static_cast<Index>(oh) * Wo);
        px.ih0 = oh * sh - pt;
        px.iw0 = ow * sw - pl;
        const Index group_channel0 = image * C + static_cast<Index>(g) * Cg;
        if constexpr (LAYOUT == GatherLayout::nchw)
            px.base = group_channel0 * (static_cast<Index>(H) * W) + static_cast<Index>(px.ih0) * W + px.iw0;
        else
            px.base = ((image * H + px.ih0) * W + px.iw0) * C + static_cast<Index>(g) * Cg;
    }
    return px;
}

}  // namespace cupyconv
