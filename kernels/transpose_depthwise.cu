// Depthwise transposed convolution (cupyconv/transpose_depthwise.py): the input gradient of a strided
// depthwise layer, every stride phase in one launch, y read in place.
//
//   out[n][g][h][w] = bias[g] + sum over j < M, taps (r, s) with h + pt - r dh = iy sh, w + pl - s dw = ix sw
//                     (iy, ix inside y) of y[n][g M + j][iy][ix] w[g M + j][0][r][s]
//
// for G = C groups of one output channel each and M = K / C channels of y a group (the forward's channel
// multiplier). It is bound by memory: each output reads about (kh / sh) (kw / sw) M values of y, which
// neighbouring outputs share through the caches. A thread owns one output column (NCHW) or one column's
// VEC channels (NHWC) and DEPTHWISE_T_ROWS consecutive rows of it, so the column's taps are found once:
// the first tap whose residue fits, then steps of sw / gcd(sw, dw) taps and dw / gcd(sw, dw) columns of y
// (col_tap_step, col_y_step; likewise along rows, found again for each row). Sums in float32 (double for
// double).
//
// NCHW: block (32, 8), a tile of 32 columns x 8 DEPTHWISE_T_ROWS rows of one channel; grid (column tiles x row
// tiles, C, min(N, 65535)). NHWC: block 256, each thread VEC channels of one pixel column: grid
// (ceil(W C / VEC / 256), row tiles, min(N, 65535)). The weight is read through element strides
// (stride_k, stride_r, stride_s), so KCHW and KHWC are read in place.
#include "dtypes.cuh"

namespace cupyconv {

constexpr int DEPTHWISE_T_ROWS = 4;

// The first tap of an axis reaching output position `at` (its residue (at + pad - tap dilation) mod
// stride zero), and the position of y it reads; tap = taps where none does.
struct FirstTap {
    int tap, in;
};
__device__ __forceinline__ FirstTap first_tap(int at, int pad, int dilation, int stride, int tap_step, int taps) {
    for (int tap = 0; tap < tap_step && tap < taps; ++tap) {
        const int q = at + pad - tap * dilation;
        // q may be negative: a floor division that is exact where the residue is zero
        const int in = q >= 0 ? q / stride : -((-q + stride - 1) / stride);
        if (in * stride == q) return {tap, in};
    }
    return {taps, 0};
}

// Four blocks an SM (64 registers): without a minimum ptxas held the float32 instances at 32 registers and
// spilled.
template <typename T, bool NHWC, int VEC>
__global__ void __launch_bounds__(256, 4)
transpose_depthwise(const T* __restrict__ y, const T* __restrict__ w, const T* __restrict__ bias, T* __restrict__ out,
                    int N, int C, int M, int Hy, int Wy, int H, int W, int kh, int kw, int sh, int sw, int dh, int dw,
                    int row_tap_step, int row_y_step, int col_tap_step, int col_y_step, int pt, int pl, int stride_k,
                    int stride_r, int stride_s, int has_bias, int column_tiles) {
    using Acc = typename accumulator<T>::type;
    static_assert(NHWC || VEC == 1, "NCHW: one channel a block");
    int column, channel, row0;
    if constexpr (NHWC) {
        const int vector = blockIdx.x * 256 + threadIdx.x, vectors = C / VEC;
        column = vector / vectors;
        channel = (vector - column * vectors) * VEC;
        row0 = blockIdx.y * DEPTHWISE_T_ROWS;
        if (column >= W) return;
    } else {
        const int tile_row = blockIdx.x / column_tiles;
        column = (blockIdx.x - tile_row * column_tiles) * 32 + threadIdx.x;
        channel = blockIdx.y;
        row0 = (tile_row * 8 + threadIdx.y) * DEPTHWISE_T_ROWS;
        if (column >= W) return;
    }
    const int K = C * M;
    const FirstTap first_col = first_tap(column, pl, dw, sw, col_tap_step, kw);
    Acc b[VEC];
#pragma unroll
    for (int v = 0; v < VEC; ++v) b[v] = has_bias ? to_acc<Acc>(bias[channel + v]) : Acc(0);
    for (int n = blockIdx.z; n < N; n += gridDim.z) {
        for (int row = row0; row < row0 + DEPTHWISE_T_ROWS && row < H; ++row) {
            Acc acc[VEC];
#pragma unroll
            for (int v = 0; v < VEC; ++v) acc[v] = b[v];
            const FirstTap first_row = first_tap(row, pt, dh, sh, row_tap_step, kh);
            for (int r = first_row.tap, iy = first_row.in; r < kh; r += row_tap_step, iy -= row_y_step) {
                if (static_cast<unsigned>(iy) >= static_cast<unsigned>(Hy)) continue;
                for (int s = first_col.tap, ix = first_col.in; s < kw; s += col_tap_step, ix -= col_y_step) {
                    if (static_cast<unsigned>(ix) >= static_cast<unsigned>(Wy)) continue;
                    for (int j = 0; j < M; ++j) {
                        if constexpr (NHWC) {
                            // VEC > 1 only where M == 1: the group's channels of y are the vector's
                            struct alignas(sizeof(T) * VEC) Vec { T v[VEC]; };
                            const long long pixel = (static_cast<long long>(n) * Hy + iy) * Wy + ix;
                            const Vec yv = *reinterpret_cast<const Vec*>(y + pixel * K + channel * M + j);
#pragma unroll
                            for (int v = 0; v < VEC; ++v) {
                                const int k = (channel + v) * M + j;
                                acc[v] += to_acc<Acc>(yv.v[v]) * to_acc<Acc>(w[k * stride_k + r * stride_r + s * stride_s]);
                            }
                        } else {
                            const int k = channel * M + j;
                            const T yv = y[((static_cast<long long>(n) * K + k) * Hy + iy) * Wy + ix];
                            acc[0] += to_acc<Acc>(yv) * to_acc<Acc>(w[k * stride_k + r * stride_r + s * stride_s]);
                        }
                    }
                }
            }
            if constexpr (NHWC) {
                struct alignas(sizeof(T) * VEC) Vec { T v[VEC]; };
                Vec result;
#pragma unroll
                for (int v = 0; v < VEC; ++v) result.v[v] = from_acc<T>(acc[v]);
                *reinterpret_cast<Vec*>(out + ((static_cast<long long>(n) * H + row) * W + column) * C + channel) = result;
            } else {
                out[((static_cast<long long>(n) * C + channel) * H + row) * W + column] = from_acc<T>(acc[0]);
            }
        }
    }
}

}  // namespace cupyconv
