// The weight of one stride phase of a transposed convolution (cupyconv/conv_transpose.py): the forward
// weight w (K, C/groups, kh, kw) with K and C swapped in each group and the phase's taps picked, in
// the order the phase's forward convolution reads them (descending: a flip for stride 1):
//
//   out[g Cg + c][kg][i][j] = w[g Kg + kg][c][r0 + i dr][s0 + j ds]
//
// out is (C, Kg, th, tw) KCHW, or (C, th, tw, Kg) where out_khwc (what the channels-last GEMM reads in
// place). Channels from c_read on are zeros (an ungrouped output of few channels, widened so that the
// GEMMs have work). w is read through element strides (stride_k, stride_c, stride_r, stride_s), so a KHWC
// weight is read in place too. A copy of the weight's bits, so 16-bit types travel as one type. One
// thread per output element; grid ceil(C Kg th tw / 256).
#include "dtypes.cuh"

namespace cupyconv {

template <typename T>
__global__ void __launch_bounds__(256)
phase_weight(const T* __restrict__ w, T* __restrict__ out, int C, int c_read, int Kg, int Cg, int th, int tw, int r0,
             int dr, int s0, int ds, int stride_k, int stride_c, int stride_r, int stride_s, int out_khwc) {
    const long long e = static_cast<long long>(blockIdx.x) * 256 + threadIdx.x;
    if (e >= static_cast<long long>(C) * Kg * th * tw) return;
    // The output's last three axes, innermost first: (kg, j, i) for KHWC, (j, i, kg) for KCHW.
    const int d0 = out_khwc ? Kg : tw, d1 = out_khwc ? tw : th, d2 = out_khwc ? th : Kg;
    long long rest = e;
    const int i0 = static_cast<int>(rest % d0);
    rest /= d0;
    const int i1 = static_cast<int>(rest % d1);
    rest /= d1;
    const int i2 = static_cast<int>(rest % d2);
    rest /= d2;
    const int kg = out_khwc ? i0 : i2, j = out_khwc ? i1 : i0, i = out_khwc ? i2 : i1;
    const int channel = static_cast<int>(rest), g = channel / Cg, c = channel - g * Cg;
    if (channel >= c_read) {
        out[e] = T{};
        return;
    }
    out[e] = w[static_cast<long long>(g * Kg + kg) * stride_k + static_cast<long long>(c) * stride_c +
               static_cast<long long>(r0 + i * dr) * stride_r + static_cast<long long>(s0 + j * ds) * stride_s];
}

}  // namespace cupyconv
