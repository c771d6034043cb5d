// Depthwise 2-D convolution (one input channel per group: groups == C, any K / groups), NCHW.
//
// A depthwise layer does kh kw multiply-adds per output element, so it is bound by memory traffic,
// not arithmetic: each block reads one input patch once (coalesced, along rows) into shared memory,
// in the accumulator type, and every output of its TH x TW tile is computed from there with the
// channel's kh x kw weights. Output channel k reads input channel k / (K / groups).
//
// Arguments as the other kernels' (N is the grid's z), then the tiles per output row and the output
// channels per block (several, one after another, so that small planes still make blocks worth
// scheduling). Grid: (tiles of the output plane, ceil(K / channels per block), N), block
// TW x (TH / RPT) threads; a thread computes RPT outputs of one column, TH / RPT rows apart, so a
// warp's loads and stores run along a row.
// Dynamic shared memory: the patch, (TH - 1) sh + (kh - 1) dh + 1 rows of
// (TW - 1) sw + (kw - 1) dw + 1 values, then the kh kw weights.
#include "dtypes.cuh"

namespace cupyconv {

template <typename T, typename Index, int TH, int TW, int RPT>
__global__ void __launch_bounds__(TW * TH / RPT)
depthwise_conv2d(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                 T* __restrict__ y, int has_bias,
                 int N, int C, int H, int W, int K, int Ho, int Wo, int kh, int kw,
                 int sh, int sw, int pt, int pl, int dh, int dw, int groups, int tiles_w, int channels_per_block) {
    using Acc = typename accumulator<T>::type;
    constexpr int NT = TW * TH / RPT;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Acc* patch = reinterpret_cast<Acc*>(smem_raw);

    const Index n = blockIdx.z;
    const int oh0 = blockIdx.x / tiles_w * TH, ow0 = blockIdx.x % tiles_w * TW;
    const int rows = (TH - 1) * sh + (kh - 1) * dh + 1, cols = (TW - 1) * sw + (kw - 1) * dw + 1;
    const int ih0 = oh0 * sh - pt, iw0 = ow0 * sw - pl;
    Acc* weights = patch + rows * cols;
    const int tid = threadIdx.y * TW + threadIdx.x;
    const int ox = threadIdx.x, ow = ow0 + ox;
    const int k_end = min(K, (static_cast<int>(blockIdx.y) + 1) * channels_per_block);

#pragma unroll 1
    for (int k = blockIdx.y * channels_per_block; k < k_end; ++k) {
        const int c = k / (K / groups);
        const T* plane = x + (n * C + c) * static_cast<Index>(H) * W;
        // Consecutive threads on consecutive columns of a row: coalesced; zeros outside the input.
        for (int i = tid; i < rows * cols; i += NT) {
            const int r = i / cols, col = i - r * cols;
            const int ih = ih0 + r, iw = iw0 + col;
            Acc v = Acc(0);
            if (static_cast<unsigned>(ih) < static_cast<unsigned>(H) && static_cast<unsigned>(iw) < static_cast<unsigned>(W))
                v = to_acc<Acc>(plane[static_cast<Index>(ih) * W + iw]);
            patch[i] = v;
        }
        for (int i = tid; i < kh * kw; i += NT) weights[i] = to_acc<Acc>(w[static_cast<Index>(k) * kh * kw + i]);
        __syncthreads();

        const Acc b = has_bias ? to_acc<Acc>(bias[k]) : Acc(0);
        T* out = y + (n * K + k) * static_cast<Index>(Ho) * Wo;
#pragma unroll 1
        for (int j = 0; j < RPT; ++j) {
            const int oy = threadIdx.y + j * (TH / RPT), oh = oh0 + oy;
            if (oh >= Ho || ow >= Wo) continue;
            const Acc* p = patch + oy * sh * cols + ox * sw;
            Acc acc = b;
            for (int r = 0; r < kh; ++r)
                for (int s = 0; s < kw; ++s) acc += p[r * dh * cols + s * dw] * weights[r * kw + s];
            out[static_cast<Index>(oh) * Wo + ow] = from_acc<T>(acc);
        }
        __syncthreads();  // the next channel overwrites the patch
    }
}

}  // namespace cupyconv
