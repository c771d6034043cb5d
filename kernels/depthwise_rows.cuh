// The sliding-column step both depthwise kernels share: a thread computes RPT consecutive output rows
// of one column and reads each input row under them once.
#pragma once

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

}  // namespace cupyconv
