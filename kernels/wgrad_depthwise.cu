// The weight gradient of a depthwise convolution (one input channel per group; K = m C with a
// channel multiplier m): dW[k][r][s] = sum over n, p, q of dy[n][k][p][q] x[n][k / m][p sh + r dh - pt][q sw + s dw - pl].
//
// A GEMM of 1 x kh kw per channel wastes the tiles of wgrad_gemm.cu, so here each thread walks output
// pixels of one channel and keeps the KH x KW sums in registers: per pixel one dy value and the
// taps' x values (neighbours, mostly from L1), a memory-bound kernel. Layouts:
//   NCHW  block = one channel k (grid x), its 256 threads over pixels l = (n, p, q), l += 256;
//   NHWC  block = 32 consecutive channels (grid x) x 8 pixel lanes: a warp reads 32 channels of a pixel.
// Grid y: runs of the N Ho Wo pixels (a partition fixed by the problem). Each block adds its lanes'
// sums in a fixed tree order and writes ws[run][k][tap] in the accumulator type; wgrad_reduce
// (wgrad_gemm.cu) adds the runs in order and rounds once: the same bits on every run.
#include "dtypes.cuh"

namespace cupyconv {

// Two blocks per SM asked of the register allocator (at most 128 registers a thread) for float sums:
// without it ptxas gave the 7x7 NHWC instances 80 registers and spilled. One for double's 49 sums of
// two registers each.
template <typename T, bool CHANNELS_LAST, int KH, int KW>
__global__ void __launch_bounds__(256, sizeof(typename accumulator<T>::type) == 8 ? 1 : 2)
wgrad_depthwise(const T* __restrict__ x, const T* __restrict__ dy, typename accumulator<T>::type* __restrict__ ws,
                int N, int C, int H, int W, int K, int Ho, int Wo, int sh, int sw, int pt, int pl, int dh, int dw) {
    using Acc = typename accumulator<T>::type;
    constexpr int TAPS = KH * KW, LANES = CHANNELS_LAST ? 8 : 256, CHANNELS = CHANNELS_LAST ? 32 : 1;
    __shared__ Acc sums[256];
    const int tid = threadIdx.x, lane = CHANNELS_LAST ? tid / 32 : tid;
    const int k = CHANNELS_LAST ? blockIdx.x * 32 + tid % 32 : blockIdx.x;
    const bool active = k < K;
    const int c = (active ? k : 0) / (K / C);
    const long long plane = static_cast<long long>(Ho) * Wo, pixels = N * plane;
    const long long begin = pixels * blockIdx.y / gridDim.y, end = pixels * (blockIdx.y + 1) / gridDim.y;
    Acc acc[TAPS];
#pragma unroll
    for (int t = 0; t < TAPS; ++t) acc[t] = Acc(0);
    if (active && begin + lane < end) {
        // The pixel's image and place in it, advanced by LANES per step: one 64-bit division per
        // thread, not one per pixel (emulated, it cost more than the pixel's loads and FMAs).
        long long n = (begin + lane) / plane;
        int pq = static_cast<int>(begin + lane - n * plane);
        for (long long l = begin + lane; l < end; l += LANES) {
            const int p = pq / Wo, q = pq - p * Wo;
            const Acc g = to_acc<Acc>(dy[CHANNELS_LAST ? l * K + k : (n * K + k) * plane + pq]);
            const T* image = CHANNELS_LAST ? x + n * H * W * C + c : x + (n * C + c) * H * W;
            const int ih0 = p * sh - pt, iw0 = q * sw - pl;
#pragma unroll
            for (int r = 0; r < KH; ++r) {
                const int ih = ih0 + r * dh;
                if (static_cast<unsigned>(ih) >= static_cast<unsigned>(H)) continue;
#pragma unroll
                for (int s = 0; s < KW; ++s) {
                    const int iw = iw0 + s * dw;
                    if (static_cast<unsigned>(iw) >= static_cast<unsigned>(W)) continue;
                    const long long at = static_cast<long long>(ih) * W + iw;
                    acc[r * KW + s] += g * to_acc<Acc>(image[CHANNELS_LAST ? at * C : at]);
                }
            }
            for (pq += LANES; pq >= plane; pq -= static_cast<int>(plane)) ++n;
        }
    }
    // The lanes' sums, tap by tap, in a fixed tree order.
    Acc* out = ws + (static_cast<long long>(blockIdx.y) * K + k) * TAPS;
#pragma unroll
    for (int t = 0; t < TAPS; ++t) {
        sums[tid] = acc[t];
        __syncthreads();
        for (int half = LANES / 2; half > 0; half /= 2) {
            if (lane < half) sums[tid] += sums[tid + half * CHANNELS];
            __syncthreads();
        }
        if (lane == 0 && active) out[t] = sums[tid];
        __syncthreads();
    }
}

}  // namespace cupyconv
