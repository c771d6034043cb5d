// The weight gradient of a depthwise convolution (one input channel per group; K = m C with a
// channel multiplier m): dW[k][r][s] = sum over n, p, q of dy[n][k][p][q] x[n][k / m][p sh + r dh - pt][q sw + s dw - pl].
//
// A GEMM of 1 x kh kw per channel wastes the tiles of wgrad_gemm.cu, so here each thread keeps the
// KH x KW sums of its channels in registers and walks output pixels, a memory-bound kernel:
//   NCHW (wgrad_depthwise)       block = one channel k (grid x), its 256 threads over pixels
//        l = (n, p, q), l += 256: per pixel one dy value and the taps' x values (mostly from L1).
//   NHWC (wgrad_depthwise_nhwc)  block = `vectors` lanes of V consecutive channels (grid x) x 256 /
//        vectors row lanes. A row lane takes segments of output rows (n, p, q0 .. q1) and walks them
//        TQ pixels a step: it loads dy's TQ pixels and, for each tap row, the span of input columns
//        the TQ windows cover, once (at stride 1, 6 columns for 4 pixels of a 3x3 window, against 12
//        loads a pixel at a time), converts them once and multiplies from registers. Loads are V
//        channels (8 bytes at most) of one pixel, so a warp reads whole rows of channels.
// Grid y: runs of the reduction (pixels, or row segments; a partition fixed by the problem). Each
// block adds its lanes' sums in a fixed order (NCHW: a tree; NHWC: row lane 0, 1, ...) and writes
// ws[run][k][tap] in the accumulator type; wgrad_reduce (wgrad_gemm.cu) adds the runs in order and
// rounds once: the same bits on every run.
#include "dtypes.cuh"

namespace cupyconv {

// V elements loaded as one vector.
template <typename T, int V> struct alignas(V * sizeof(T)) WgradPack {
    T v[V];
};

// Two blocks per SM asked of the register allocator (at most 128 registers a thread) for float sums:
// without it ptxas gave the 7x7 instances 80 registers and spilled. One for double's 49 sums of two
// registers each.
template <typename T> constexpr int wgrad_depthwise_min_blocks() {
    return sizeof(typename accumulator<T>::type) == 8 ? 1 : 2;
}

// NCHW: one channel a block, its threads over the channel's output pixels.
template <typename T, int KH, int KW>
__global__ void __launch_bounds__(256, wgrad_depthwise_min_blocks<T>())
wgrad_depthwise(const T* __restrict__ x, const T* __restrict__ dy, typename accumulator<T>::type* __restrict__ ws,
                int N, int C, int H, int W, int K, int Ho, int Wo, int sh, int sw, int pt, int pl, int dh, int dw) {
    using Acc = typename accumulator<T>::type;
    constexpr int TAPS = KH * KW;
    __shared__ Acc sums[256];
    const int tid = threadIdx.x, k = blockIdx.x, c = k / (K / C);
    const long long plane = static_cast<long long>(Ho) * Wo, pixels = N * plane;
    const long long begin = pixels * blockIdx.y / gridDim.y, end = pixels * (blockIdx.y + 1) / gridDim.y;
    Acc acc[TAPS];
#pragma unroll
    for (int t = 0; t < TAPS; ++t) acc[t] = Acc(0);
    if (begin + tid < end) {
        // The pixel's image and place in it, advanced by 256 per step: one 64-bit division per
        // thread, not one per pixel (emulated, it cost more than the pixel's loads and FMAs).
        long long n = (begin + tid) / plane;
        int pq = static_cast<int>(begin + tid - n * plane);
        for (long long l = begin + tid; l < end; l += 256) {
            const int p = pq / Wo, q = pq - p * Wo;
            const Acc g = to_acc<Acc>(dy[(n * K + k) * plane + pq]);
            const T* image = x + (n * C + c) * H * W;
            const int ih0 = p * sh - pt, iw0 = q * sw - pl;
#pragma unroll
            for (int r = 0; r < KH; ++r) {
                const int ih = ih0 + r * dh;
                if (static_cast<unsigned>(ih) >= static_cast<unsigned>(H)) continue;
#pragma unroll
                for (int s = 0; s < KW; ++s) {
                    const int iw = iw0 + s * dw;
                    if (static_cast<unsigned>(iw) >= static_cast<unsigned>(W)) continue;
                    acc[r * KW + s] += g * to_acc<Acc>(image[static_cast<long long>(ih) * W + iw]);
                }
            }
            for (pq += 256; pq >= plane; pq -= static_cast<int>(plane)) ++n;
        }
    }
    // The 256 threads' sums, tap by tap, in a fixed tree order.
    Acc* out = ws + static_cast<long long>(blockIdx.y) * K * TAPS;
#pragma unroll
    for (int t = 0; t < TAPS; ++t) {
        sums[tid] = acc[t];
        __syncthreads();
        for (int half = 128; half > 0; half /= 2) {
            if (tid < half) sums[tid] += sums[tid + half];
            __syncthreads();
        }
        if (tid == 0) out[static_cast<long long>(k) * TAPS + t] = sums[0];
        __syncthreads();
    }
}

// A step's shape: TQ output pixels, their input columns a tap row (COLUMNS: the span the windows
// cover where the column stride and dilation are compiled, each pixel's taps at run time), loaded
// ROWS tap rows at a time before any is multiplied. The most pixels (4 at stride 1, 2 at stride 2,
// 1 at run time) whose loads of every tap row fit the register budget beside the sums, else the
// most pixels and as many rows as fit: at two blocks of 256 threads an SM (128 registers), about 32
// go to addresses and counters.
template <typename T, int KH, int KW, int V, int SW, int DW> struct WgradStep {
    static constexpr int ACC_REGS = sizeof(typename accumulator<T>::type) / 4;
    static constexpr int WORD_REGS = (V * sizeof(T) + 3) / 4;  // a vector's registers as loaded
    // Budgets that ptxas's reports bear out (no spills at 128 registers): 112 for 3x3 windows (their
    // 4-pixel steps estimate 112 and were fastest on the H100: benchmarks/NOTES.md), 80 for larger
    // ones (5x5 at 112 spilled), 64 for one channel a thread (a register per 16-bit value; 69 spilled
    // on sm_80).
    static constexpr int BUDGET = ACC_REGS == 2 ? 200 : V == 1 ? 64 : KH * KW <= 9 ? 112 : 80;
    static constexpr int columns(int tq) { return SW > 0 ? (tq - 1) * SW + (KW - 1) * DW + 1 : tq * KW; }
    static constexpr int registers(int tq, int rows) {  // sums, dy, one row converted, raw rows
        return (KH * KW * V + tq * V + columns(tq) * V) * ACC_REGS + rows * columns(tq) * WORD_REGS;
    }
    static constexpr int MOST = SW == 1 ? 4 : SW == 2 ? 2 : 1;
    static constexpr int TQ = registers(MOST, KH) <= BUDGET ? MOST
                              : MOST >= 2 && registers(MOST / 2, KH) <= BUDGET ? MOST / 2 : 1;
    static constexpr int rows_fitting(int rows) {
        return rows <= 1 || registers(TQ, rows) <= BUDGET ? rows : rows_fitting(rows - 1);
    }
    static constexpr int ROWS = rows_fitting(KH);
    static constexpr int COLUMNS = columns(TQ);
};

// NHWC: row lanes walk segments of output rows (see the top of the file). SW and DW are the column
// stride and dilation, compiled so that the span of input columns of a step is loaded once; SW = 0
// takes them (sw, dw) at run time and loads each tap's column for each pixel.
template <typename T, int KH, int KW, int V, int SW, int DW>
__global__ void __launch_bounds__(256, wgrad_depthwise_min_blocks<T>())
wgrad_depthwise_nhwc(const T* __restrict__ x, const T* __restrict__ dy, typename accumulator<T>::type* __restrict__ ws,
                     int N, int C, int H, int W, int K, int Ho, int Wo, int sh, int sw, int pt, int pl, int dh, int dw,
                     int vectors, int segment) {
    using Acc = typename accumulator<T>::type;
    using Step = WgradStep<T, KH, KW, V, SW, DW>;
    constexpr int TAPS = KH * KW, TQ = Step::TQ, COLUMNS = Step::COLUMNS, ROWS = Step::ROWS;
    static_assert(SW > 0 || DW == 0, "column stride and dilation: both compiled or both at run time");
    __shared__ Acc sums[256 * V];
    const int LANES = 256 / vectors;  // row lanes
    const int tid = threadIdx.x, lane = tid / vectors;
    const int k = (blockIdx.x * vectors + tid % vectors) * V;  // the first of V channels
    const bool active = k < K && lane < LANES;  // all V of them (K is a multiple of V)
    const int c = (active ? k : 0) / (K / C);
    const int segments = (Wo + segment - 1) / segment;  // a row's
    const long long items = static_cast<long long>(N) * Ho * segments;
    const long long begin = items * blockIdx.y / gridDim.y, end = items * (blockIdx.y + 1) / gridDim.y;
    Acc acc[TAPS][V];
#pragma unroll
    for (int t = 0; t < TAPS; ++t)
#pragma unroll
        for (int v = 0; v < V; ++v) acc[t][v] = Acc(0);
    // Addresses advance by pointer steps and 32-bit offsets: a 64-bit product per load cost more
    // instructions than the load's conversions and FMAs together.
    const long long tap_row_pitch = static_cast<long long>(dh) * W * C;  // elements between tap rows
    const int col_stride = SW > 0 ? SW : sw;
    for (long long item = begin + lane; active && item < end; item += LANES) {
        const long long row = item / segments;  // n Ho + p
        const int n = static_cast<int>(row / Ho), p = static_cast<int>(row - static_cast<long long>(n) * Ho);
        const int q0 = static_cast<int>(item - row * segments) * segment, q1 = min(Wo, q0 + segment);
        const int ih0 = p * sh - pt, iw_first = q0 * col_stride - pl;
        unsigned rows_inside = 0;  // bit r: tap row r lies in the image
#pragma unroll
        for (int r = 0; r < KH; ++r)
            rows_inside |= static_cast<unsigned>(static_cast<unsigned>(ih0 + r * dh) < static_cast<unsigned>(H)) << r;
        const T* dy_at = dy + (row * Wo + q0) * K + k;
        // The step's first window's top-left tap (outside the image where padded; only read inside).
        const T* x_at = x + ((static_cast<long long>(n) * H + ih0) * W + iw_first) * C + c;
        for (int qc = q0, iw0 = iw_first; qc < q1;
             qc += TQ, iw0 += TQ * col_stride, dy_at += TQ * K, x_at += TQ * col_stride * C) {
            // The step's loads first, ROWS tap rows at a time, rows outside the image predicated off
            // load by load rather than branched around, so that they are in flight at once; then the
            // conversions and FMAs.
            using Pack = WgradPack<T, V>;
            Pack dy_raw[TQ];
#pragma unroll
            for (int j = 0; j < TQ; ++j) dy_raw[j] = load_or_zero(reinterpret_cast<const Pack*>(dy_at + j * K), qc + j < q1);
            Acc g[TQ][V];
            const T* x_row = x_at;  // the batch's first tap row
#pragma unroll
            for (int first = 0; first < KH; first += ROWS, x_row += ROWS * tap_row_pitch) {
                if (first == 0) {
#pragma unroll
                    for (int j = 0; j < TQ; ++j) widen(g[j], dy_raw[j].v);
                }
                // A batch of rows all outside the image is branched around: the branch also keeps
                // the compiler from hoisting the next batch's loads into this one's registers.
                if (!(rows_inside >> first & ((1u << ROWS) - 1u))) continue;
                Pack x_raw[ROWS][COLUMNS];
                const T* batch_row = x_row;
#pragma unroll
                for (int b = 0; b < ROWS && first + b < KH; ++b, batch_row += tap_row_pitch) {
#pragma unroll
                    for (int i = 0; i < COLUMNS; ++i) {
                        // Compiled walks: the span's column i; at run time: pixel i / KW's tap i % KW.
                        const int column = SW > 0 ? i : i / KW * sw + i % KW * dw;
                        x_raw[b][i] = load_or_zero(reinterpret_cast<const Pack*>(batch_row + column * C),
                                                   (rows_inside >> (first + b) & 1u) &&
                                                       static_cast<unsigned>(iw0 + column) < static_cast<unsigned>(W));
                    }
                }
#pragma unroll
                for (int b = 0; b < ROWS && first + b < KH; ++b) {
                    Acc cols[COLUMNS][V];
#pragma unroll
                    for (int i = 0; i < COLUMNS; ++i) widen(cols[i], x_raw[b][i].v);
#pragma unroll
                    for (int j = 0; j < TQ; ++j)
#pragma unroll
                        for (int s = 0; s < KW; ++s)
#pragma unroll
                            for (int v = 0; v < V; ++v)
                                acc[(first + b) * KW + s][v] += g[j][v] * cols[SW > 0 ? j * SW + s * DW : j * KW + s][v];
                }
            }
        }
    }
    // The row lanes' sums, tap by tap: staged as [row lane][vectors V channels], then each of the
    // block's channels added over the lanes in order by one thread.
    Acc* out = ws + static_cast<long long>(blockIdx.y) * K * TAPS;
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
            for (int row_lane = 1; row_lane < LANES; ++row_lane) sum += sums[row_lane * width + o];
            if (first + o < K) out[static_cast<long long>(first + o) * TAPS + t] = sum;
        }
        __syncthreads();
    }
}

}  // namespace cupyconv
