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

// Every phase's weight at once, KHWC, for the phase launch of the channels-last GEMM
// (implicit_gemm_nhwc_phases): w seen as a matrix of K rows (input channels of y, groups included) by
// Cg kh kw columns in w's memory order ((c, r, s) for KCHW; (r, s, c) where w_khwc), and each column
// a row of K / groups contiguous elements in its phase's weight:
//
//   out[offset[p] + ((g Cg + c) th[p] + i) tw[p] + j) Kg + kg] = w[g Kg + kg][c][r][s]
//
// with p = row_phase[r] cols + col_phase[s], and i, j the positions of taps r and s in their phases
// (PhaseTaps; a tap no phase reads has phase -1). A 32 x 32 tile through shared memory, so that the
// reads run along w's columns and the writes along Kg: one pass at copy speed where phase_weight,
// a phase at a time, read w with a stride of Cg kh kw elements. ROUND_TF32: float32 rounded to TF32
// (cvt.rna) on the way, as the forward's weight preparation rounds its copies, for the TF32 phase
// launch (which rounds y itself). Block (32, 8); grid (ceil(columns / 32), ceil(K / 32)).
constexpr int MAX_PHASE_TAPS = 32;
constexpr int MAX_WEIGHT_PHASES = 16;
struct PhaseTaps {
    int cols;
    int row_phase[MAX_PHASE_TAPS], row_index[MAX_PHASE_TAPS], col_phase[MAX_PHASE_TAPS], col_index[MAX_PHASE_TAPS];
    int th[MAX_WEIGHT_PHASES], tw[MAX_WEIGHT_PHASES], offset[MAX_WEIGHT_PHASES];
};

template <typename T, bool ROUND_TF32>
__global__ void __launch_bounds__(256)
phase_weights(const T* __restrict__ w, T* __restrict__ out, int K, int Kg, int Cg, int kh, int kw, int stride_k,
              int stride_c, int stride_r, int stride_s, int w_khwc, const __grid_constant__ PhaseTaps taps) {
    // 32-bit offsets: the one-launch route takes arrays of fewer than 2^31 elements. The kernel is
    // bound by its integer work, so a thread splits one column into (c, r, s) by division and steps
    // to its next columns (8 apart) by carries.
    __shared__ T tile[32][33];
    const int columns = Cg * kh * kw;
    const int col0 = blockIdx.x * 32, k0 = blockIdx.y * 32;
    // Column col in w's memory order: the digits (c, r, s) of radices (Cg, kh, kw) for KCHW, (r, s, c)
    // of (kh, kw, Cg) for KHWC.
    struct Column {
        int c, r, s;
    };
    auto position = [&](int col) {
        Column at;
        if (w_khwc) {
            at.c = col % Cg;
            at.s = (col / Cg) % kw;
            at.r = col / (Cg * kw);
        } else {
            at.s = col % kw;
            at.r = (col / kw) % kh;
            at.c = col / (kh * kw);
        }
        return at;
    };
    auto advance = [&](Column& at, int steps) {  // col += steps, carried digit by digit
        if (w_khwc) {
            at.c += steps;
            while (at.c >= Cg) { at.c -= Cg; if (++at.s == kw) { at.s = 0; ++at.r; } }
        } else {
            at.s += steps;
            while (at.s >= kw) { at.s -= kw; if (++at.r == kh) { at.r = 0; ++at.c; } }
        }
    };
    {
        const int col = col0 + threadIdx.x;
        if (col < columns) {
            const Column at = position(col);
            const T* source = w + at.c * stride_c + at.r * stride_r + at.s * stride_s;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int k = k0 + threadIdx.y + 8 * i;
                if (k < K)
                    tile[threadIdx.y + 8 * i][threadIdx.x] = tf32_rounded_if<ROUND_TF32>(source[k * stride_k]);
            }
        }
    }
    __syncthreads();
    const int k = k0 + threadIdx.x;
    if (k >= K || col0 + threadIdx.y >= columns) return;
    const int g = k / Kg, kg = k - g * Kg;
    Column at = position(col0 + threadIdx.y);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if (col0 + threadIdx.y + 8 * i >= columns) break;
        if (i > 0) advance(at, 8);
        const int pr = taps.row_phase[at.r], pc = taps.col_phase[at.s];
        if (pr < 0 || pc < 0) continue;
        const int p = pr * taps.cols + pc;
        out[taps.offset[p] + (((g * Cg + at.c) * taps.th[p] + taps.row_index[at.r]) * taps.tw[p] +
                              taps.col_index[at.s]) * Kg + kg] = tile[threadIdx.x][threadIdx.y + 8 * i];
    }
}

}  // namespace cupyconv
