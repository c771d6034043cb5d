// The weight gradient of a depthwise convolution (one input channel per group; K = m C with a
// channel multiplier m): dW[k][r][s] = sum over n, p, q of dy[n][k][p][q] x[n][k / m][p sh + r dh - pt][q sw + s dw - pl].
//
// A GEMM of 1 x kh kw per channel wastes the tiles of wgrad_gemm.cu, so here each thread walks output
// pixels of one channel and keeps the KH x KW sums in registers: per pixel one dy value and the
// taps' x values (neighbours, mostly from L1), a memory-bound kernel. Layouts:
//   NCHW  block = one channel k (grid x), its 256 threads over pixels l = (n, p, q), l += 256;
//   NHWC  block = `vectors` lanes of V consecutive channels (grid x) x 256 / vectors pixel lanes: a
//         thread loads its V channels of a pixel as one vector (V > 1 only with one output channel per
//         input channel), 16 bytes for 16-bit types with V = 8; a layer of 144 channels is 18 lanes x
//         14 pixels, so every thread but 4 has channels to sum.
// Grid y: runs of the N Ho Wo pixels (a partition fixed by the problem). Each block adds its lanes'
// sums in a fixed order (NCHW: a tree; NHWC: pixel lane 0, 1, ...) and writes ws[run][k][tap] in the
// accumulator type; wgrad_reduce (wgrad_gemm.cu) adds the runs in order and rounds once: the same
// bits on every run.
#include "dtypes.cuh"

namespace cupyconv {

// V elements loaded as one vector.
template <typename T, int V> struct alignas(V * sizeof(T)) WgradPack {
    T v[V];
};

// Two blocks per SM asked of the register allocator (at most 128 registers a thread) for float sums:
// without it ptxas gave the 7x7 NHWC instances 80 registers and spilled. One for double's 49 sums of
// two registers each.
template <typename T, bool CHANNELS_LAST, int KH, int KW, int V>
__global__ void __launch_bounds__(256, sizeof(typename accumulator<T>::type) == 8 ? 1 : 2)
wgrad_depthwise(const T* __restrict__ x, const T* __restrict__ dy, typename accumulator<T>::type* __restrict__ ws,
                int N, int C, int H, int W, int K, int Ho, int Wo, int sh, int sw, int pt, int pl, int dh, int dw,
                int vectors) {
    using Acc = typename accumulator<T>::type;
    constexpr int TAPS = KH * KW;
    static_assert(CHANNELS_LAST || V == 1, "NCHW: one channel a block");
    using Pack = WgradPack<T, V>;
    __shared__ Acc sums[256 * V];
    const int LANES = CHANNELS_LAST ? 256 / vectors : 256;  // pixel lanes
    const int tid = threadIdx.x, lane = CHANNELS_LAST ? tid / vectors : tid;
    const int k = CHANNELS_LAST ? (blockIdx.x * vectors + tid % vectors) * V : blockIdx.x;  // the first of V channels
    const bool active = k < K && lane < LANES;  // all V of them (K is a multiple of V)
    const int c = (active ? k : 0) / (K / C);
    const long long plane = static_cast<long long>(Ho) * Wo, pixels = N * plane;
    const long long begin = pixels * blockIdx.y / gridDim.y, end = pixels * (blockIdx.y + 1) / gridDim.y;
    Acc acc[TAPS][V];
#pragma unroll
    for (int t = 0; t < TAPS; ++t)
#pragma unroll
        for (int v = 0; v < V; ++v) acc[t][v] = Acc(0);
    if (active && begin + lane < end) {
        // The pixel's image and place in it, advanced by LANES per step: one 64-bit division per
        // thread, not one per pixel (emulated, it cost more than the pixel's loads and FMAs).
        long long n = (begin + lane) / plane;
        int pq = static_cast<int>(begin + lane - n * plane);
        for (long long l = begin + lane; l < end; l += LANES) {
            const int p = pq / Wo, q = pq - p * Wo;
            const Pack gp = *reinterpret_cast<const Pack*>(dy + (CHANNELS_LAST ? l * K + k : (n * K + k) * plane + pq));
            Acc g[V];
#pragma unroll
            for (int v = 0; v < V; ++v) g[v] = to_acc<Acc>(gp.v[v]);
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
                    const Pack xp = *reinterpret_cast<const Pack*>(image + (CHANNELS_LAST ? at * C : at));
#pragma unroll
                    for (int v = 0; v < V; ++v) acc[r * KW + s][v] += g[v] * to_acc<Acc>(xp.v[v]);
                }
            }
            for (pq += LANES; pq >= plane; pq -= static_cast<int>(plane)) ++n;
        }
    }
    Acc* out = ws + static_cast<long long>(blockIdx.y) * K * TAPS;
    if constexpr (CHANNELS_LAST) {
        // The pixel lanes' sums, tap by tap: staged as [pixel lane][vectors V channels], then each of
        // the block's channels added over the lanes in order by one thread.
        const int first = blockIdx.x * vectors * V, width = vectors * V;
#pragma unroll  // the sums stay in registers only where every index is a constant
        for (int t = 0; t < TAPS; ++t) {
            if (lane < LANES) {
#pragma unroll
                for (int v = 0; v < V; ++v) sums[lane * width + (tid % vectors) * V + v] = acc[t][v];
            }
            __syncthreads();
            for (int o = tid; o < width; o += 256) {
                Acc sum = sums[o];
                for (int pixel_lane = 1; pixel_lane < LANES; ++pixel_lane) sum += sums[pixel_lane * width + o];
                if (first + o < K) out[static_cast<long long>(first + o) * TAPS + t] = sum;
            }
            __syncthreads();
        }
    } else {  // the 256 lanes' sums, tap by tap, in a fixed tree order
#pragma unroll
        for (int t = 0; t < TAPS; ++t) {
            sums[tid] = acc[t][0];
            __syncthreads();
            for (int half = LANES / 2; half > 0; half /= 2) {
                if (lane < half) sums[tid] += sums[tid + half];
                __syncthreads();
            }
            if (lane == 0) out[static_cast<long long>(k) * TAPS + t] = sums[0];
            __syncthreads();
        }
    }
}

}  // namespace cupyconv
