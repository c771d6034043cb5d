// The sliding-column step both depthwise kernels share: a thread computes RPT consecutive output rows
// of one column and reads each input row under them once; and its counterpart along a row of
// run-time length (depthwise_conv2d.cu's row runs).
#pragma once

#include "dtypes.cuh"  // to_acc

namespace cupyconv {

// Input row i of the window under the thread's RPT output rows (row stride SH, row dilation 1) feeds
// output row j through kernel row i - j SH: add its KW values `v` times that kernel row's weights to
// each such output. i is an unrolled loop index, so the tests resolve at compile time.
template <int RPT, int KH, int KW, int SH, typename Acc>
__device__ __forceinline__ void accumulate_input_row(Acc (&acc)[RPT], const Acc (&weights)[KH * KW],
                                                     const Acc (&v)[KW], int i) {
#pragma unroll
    for (int j = 0; j < RPT; ++j) {
        const int r = i - j * SH;
        if (r >= 0 && r < KH) {
#pragma unroll
            for (int s = 0; s < KW; ++s) acc[j] += weights[r * KW + s] * v[s];
        }
    }
}

// The taps 0 .. kw - 1 of a kernel row of run-time length, for a thread whose R consecutive outputs
// (column stride and dilation 1) read their inputs from a window of R registers rotated rather than
// shifted: during taps s0 .. s0 + R - 1, slot m holds input s0 + m until tap s0 + m has used it, then
// input s0 + m + R. tap(s, u) adds tap s, whose output j reads slot (u + j) % R, then (while taps
// remain) refills slot u with input s + R; the taps are unrolled R at a time, so that u is a
// compile-time constant and the window stays in registers. Both depthwise kernels' runs use it.
template <int R, typename Tap>
__device__ __forceinline__ void for_each_rotated_tap(int kw, Tap&& tap) {
    int s0 = 0;
#pragma unroll 1
    for (; s0 + R <= kw; s0 += R) {
#pragma unroll
        for (int u = 0; u < R; ++u) tap(s0 + u, u);
    }
#pragma unroll
    for (int u = 0; u + 1 < R; ++u)  // the last kw % R taps
        if (s0 + u < kw) tap(s0 + u, u);
}

// The run of R consecutive outputs of one row a thread computes for a kernel row of run-time length kw
// (column stride and dilation 1): acc[j] += sum_s wr[s] q[j + s], each input read from shared memory
// and widened once for all R outputs, each weight once per run.
template <int R, typename Acc, typename T>
__device__ __forceinline__ void accumulate_row_run(Acc (&acc)[R], const T* q, const T* wr, int kw) {
    Acc window[R];
#pragma unroll
    for (int m = 0; m < R; ++m) window[m] = to_acc<Acc>(q[m]);
    for_each_rotated_tap<R>(kw, [&](int s, int u) {
        const Acc wv = to_acc<Acc>(wr[s]);
#pragma unroll
        for (int j = 0; j < R; ++j) acc[j] += wv * window[(u + j) % R];
        if (s + 1 < kw) window[u] = to_acc<Acc>(q[s + R]);
    });
}

}  // namespace cupyconv
