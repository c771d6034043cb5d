// Depthwise 2-D convolution (one input channel per group: groups == C, any K / groups), NCHW.
//
// A depthwise layer does kh kw multiply-adds per output element, so it is bound by memory traffic,
// not arithmetic: each block reads one input patch once (coalesced, along rows) into shared memory,
// in the accumulator type, and every output of its TH x TW tile is computed from there with the
// channel's kh x kw weights. Output channel k reads input channel k / (K / groups).
//
// Arguments as the other kernels' (N is the grid's z), then the tiles per output row.
// Grid: (tiles of the output plane, K, N), block TW x (TH / RPT) threads; a thread computes RPT
// outputs of one column, TH / RPT rows apart, so a warp's loads and stores run along a row.
// Dynamic shared memory: the patch, (TH - 1) sh + (kh - 1) dh + 1 rows of
// (TW - 1) sw + (kw - 1) dw + 1 values, then the kh kw weights.
#include "dtypes.cuh"

namespace cupyconv {

template <typename T, typename Index, int TH, int TW, int RPT>
__global__ void __launch_bounds__(TW * TH / RPT)
depthwise_conv2d(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                 T* __restrict__ y, int has_bias,
                 int N, int C, int H, int W, int K, int Ho, int Wo, int kh, int kw,
                 int sh, int sw, int pt, int pl, int dh, int dw, int groups, int tiles_w) {
    using Acc = typename accumulator<T>::type;
    constexpr int NT = TW * TH / RPT;
    constexpr int NWARPS = NT / 32;
    static_assert(TW % 32 == 0 || 32 % TW == 0, "warps cover whole rows or several rows");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Acc* patch = reinterpret_cast<Acc*>(smem_raw);

    const int k = blockIdx.y;
    const Index n = blockIdx.z;
    const int c = k / (K / groups);
    const int oh0 = blockIdx.x / tiles_w * TH, ow0 = blockIdx.x % tiles_w * TW;
    const int rows = (TH - 1) * sh + (kh - 1) * dh + 1, cols = (TW - 1) * sw + (kw - 1) * dw + 1;
    const int ih0 = oh0 * sh - pt, iw0 = ow0 * sw - pl;
    Acc* weights = patch + rows * cols;

    const T* plane = x + (n * C + c) * static_cast<Index>(H) * W;
    const int tid = threadIdx.y * TW + threadIdx.x, lane = tid & 31, warp = tid >> 5;
    // Row by row, a warp per row, lanes along it: coalesced, zeros outside the input.
    for (int r = warp; r < rows; r += NWARPS) {
        const int ih = ih0 + r;
        const bool row_ok = static_cast<unsigned>(ih) < static_cast<unsigned>(H);
        for (int col = lane; col < cols; col += 32) {
            const int iw = iw0 + col;
            Acc v = Acc(0);
            if (row_ok && static_cast<unsigned>(iw) < static_cast<unsigned>(W))
                v = to_acc<Acc>(plane[static_cast<Index>(ih) * W + iw]);
            patch[r * cols + col] = v;
        }
    }
    for (int i = tid; i < kh * kw; i += NT) weights[i] = to_acc<Acc>(w[static_cast<Index>(k) * kh * kw + i]);
    __syncthreads();

    const int ox = threadIdx.x, ow = ow0 + ox;
    const Acc b = has_bias ? to_acc<Acc>(bias[k]) : Acc(0);
    T* out = y + (n * K + k) * static_cast<Index>(Ho) * Wo;
#pragma unroll
    for (int j = 0; j < RPT; ++j) {
        const int oy = threadIdx.y + j * (TH / RPT), oh = oh0 + oy;
        if (oh >= Ho || ow >= Wo) continue;
        const Acc* p = patch + oy * sh * cols + ox * sw;
        Acc acc = b;
        for (int r = 0; r < kh; ++r)
            for (int s = 0; s < kw; ++s) acc += p[r * dh * cols + s * dw] * weights[r * kw + s];
        out[static_cast<Index>(oh) * Wo + ow] = from_acc<T>(acc);
    }
}

}  // namespace cupyconv
