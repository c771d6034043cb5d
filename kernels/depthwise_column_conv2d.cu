// Depthwise 2-D convolution for small planes, and for planes of even rows up to 224 wide in pairs of
// columns (one input channel per group: groups == C, any K / groups), NCHW, with no shared memory.
//
// depthwise_conv2d copies a patch per output tile into shared memory and synchronises its block once
// per channel. On MobileNet's 14 x 14 and 7 x 7 planes a channel is a few hundred instructions of
// work, so those barriers and the copy's latency are most of the time, and a 16 x 16 tile leaves a
// quarter of the threads idle (benchmarks/NOTES.md). Here a thread computes RPT consecutive rows of
// one output column of one channel and reads the (RPT - 1) SH + KH input rows they need straight
// from global memory (L1 catches the reads that neighbouring columns and row segments share): no
// barrier, and every load independent of the others, so a thread has all of them in flight at once.
// A block holds whole output rows of P channels side by side (threadIdx.x the column, threadIdx.y
// the channel), so a warp's loads run along rows, and every index comes from the thread and block
// numbers without a division (ncu on an earlier, flattened numbering: the integer pipe was the
// busiest, with five run-time divisions per thread). Only the last row segment of a column may
// compute rows past Ho, which it does not store. In pairs (PAIR_ODD >= 0, below) a thread takes two
// adjacent columns: on 56 x 56 to 224 x 224 outputs that beat depthwise_conv2d's tiles 1.3-2.2x in 16 bits.
//
// Unrolled taps only (KH x KW at row stride SH, row dilation 1: DEPTHWISE_TAPS in
// families/depthwise_conv2d.py); the column stride, dilation and padding are run-time. Arguments as
// depthwise_conv2d's problem arguments (kh, kw, sh and dh are unused: the template has them).
// Grid (ceil(K / P), ceil(Ho / RPT), N), block (Wo, P), or (Wo / 2, P) in pairs.
#include "depthwise_rows.cuh"
#include "dtypes.cuh"
#include "epilogue.cuh"

namespace cupyconv {

// PAIR_ODD 0 or 1 (the left padding's parity): a thread computes two adjacent output columns (2 threadIdx.x and the
// next), the column stride that of the rows (SH) and dilation 1, rows and output rows of even lengths: it loads
// each input row's aligned pairs of elements that cover both windows (a 16-bit thread one element at a time
// had half a float thread's bytes in flight) and stores each output row's pair as one word. -1: one column.
template <typename T, typename Index, int RPT, int KH, int KW, int SH, int PAIR_ODD = -1>
__global__ void depthwise_column_conv2d(const T* __restrict__ x, const T* __restrict__ w,
                                        const T* __restrict__ bias, T* __restrict__ y, int has_bias,
                                        const T* __restrict__ residual, int has_residual, int activation,
                                        int N, int C, int H, int W, int K, int Ho, int Wo, int kh, int kw,
                                        int sh, int sw, int pt, int pl, int dh, int dw, int groups) {
    using Acc = typename accumulator<T>::type;
    constexpr int TAPS = KH * KW;
    constexpr int ROWS = (RPT - 1) * SH + KH;  // input rows under the thread's RPT output rows
    constexpr int COLUMNS = PAIR_ODD < 0 ? 1 : 2;  // output columns a thread
    // Input elements a row loads: one a tap, or the pairs from iw_first covering both windows.
    constexpr int LOADS = PAIR_ODD < 0 ? KW : (PAIR_ODD + SH + KW - 1) / 2 + 1, WIDTH = PAIR_ODD < 0 ? 1 : 2;
    using Load = Pack<T, WIDTH>;

    const int ow = threadIdx.x * COLUMNS, k = blockIdx.x * blockDim.y + threadIdx.y, oh0 = blockIdx.y * RPT;
    if (k >= K) return;
    const Index n = blockIdx.z;
    const int c = groups == K ? k : k / (K / groups);  // the input channel (a division only for multipliers)
    const T* xp = x + (n * C + c) * static_cast<Index>(H) * W;

    Acc weights[TAPS], acc[COLUMNS][RPT];
#pragma unroll
    for (int i = 0; i < TAPS; ++i) weights[i] = to_acc<Acc>(w[static_cast<Index>(k) * TAPS + i]);
    const Acc b = has_bias ? to_acc<Acc>(bias[k]) : Acc(0);
#pragma unroll
    for (int o = 0; o < COLUMNS; ++o)
#pragma unroll
        for (int j = 0; j < RPT; ++j) acc[o][j] = b;
    // Load l's first input column: tap column l (one column), or pair l from the even column at or before
    // the first window's first tap.
    const int iw_first = ow * (PAIR_ODD < 0 ? sw : SH) - pl - (PAIR_ODD < 0 ? 0 : PAIR_ODD);
    int iw[LOADS];
    bool column_valid[LOADS];  // a pair (W even, its column even) lies all inside or all outside
#pragma unroll
    for (int l = 0; l < LOADS; ++l) {
        iw[l] = iw_first + l * (PAIR_ODD < 0 ? dw : 2);
        column_valid[l] = static_cast<unsigned>(iw[l]) < static_cast<unsigned>(W);
    }
    // Slide down the column, reading each input row once.
    const int ih0 = oh0 * SH - pt;
#pragma unroll
    for (int i = 0; i < ROWS; ++i) {
        const int ih = ih0 + i;
        const bool row_valid = static_cast<unsigned>(ih) < static_cast<unsigned>(H);
        Load raw[LOADS];
#pragma unroll
        for (int l = 0; l < LOADS; ++l)
            raw[l] = load_or_zero(reinterpret_cast<const Load*>(xp + static_cast<Index>(ih) * W + iw[l]),
                                  row_valid && column_valid[l]);
        Acc e[LOADS * WIDTH];  // the row's loaded elements, widened once
#pragma unroll
        for (int l = 0; l < LOADS; ++l) {
            Acc pair[WIDTH];
            widen(pair, raw[l].v);
#pragma unroll
            for (int u = 0; u < WIDTH; ++u) e[l * WIDTH + u] = pair[u];
        }
#pragma unroll
        for (int o = 0; o < COLUMNS; ++o) {
            Acc v[KW];  // column o's window: element ODD + o SH + s of the pairs, or tap s's own load
#pragma unroll
            for (int s = 0; s < KW; ++s) v[s] = e[PAIR_ODD < 0 ? s : PAIR_ODD + o * SH + s];
            accumulate_input_row<RPT, KH, KW, SH>(acc[o], weights, v, i);
        }
    }
    const Index plane = (n * K + k) * static_cast<Index>(Ho) * Wo + ow;
    with_epilogue<T>(residual, [&](auto finish) {
#pragma unroll
        for (int j = 0; j < RPT; ++j) {
            const Index o = plane + static_cast<Index>(oh0 + j) * Wo;
            if (oh0 + j < Ho) {
                Load out;
#pragma unroll
                for (int u = 0; u < COLUMNS; ++u) out.v[u] = finish(acc[u][j], o + u);
                *reinterpret_cast<Load*>(y + o) = out;  // pairs: Wo even, ow even
            }
        }
    });
}

}  // namespace cupyconv
