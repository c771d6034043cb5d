// Depthwise transposed convolution (cupyconv/transpose_depthwise.py): the input gradient of a strided
// depthwise layer, every stride phase in one launch, y read in place.
//
//   out[n][g][h][w] = bias[g] + sum over j < M, taps (r, s) with h + pt - r dh = iy sh, w + pl - s dw = ix sw
//                     (iy, ix inside y) of y[n][g M + j][iy][ix] w[g M + j][0][r][s]
//
// for G = C groups of one output channel each and M = K / C channels of y a group (the forward's channel
// multiplier). Each output reads about (kh / sh) (kw / sw) M values of y, which neighbouring outputs share
// through the caches; the bytes are few, and what bounds the kernel is its integer work per output. So a
// thread owns one output column (NCHW) or one column's VEC channels (NHWC), and DEPTHWISE_T_ROWS rows of
// it sh apart -- rows of one stride phase, whose taps are the same and whose rows of y follow each other:
// the first reaching tap (its residue (at + pad - tap dilation) mod stride zero) is found once a thread
// along each axis, then steps of sh / gcd(sh, dh) taps and dh / gcd(sh, dh) rows of y (row_tap_step,
// row_y_step; likewise along columns), and for each tap the thread's rows of y are loaded together.
// Sums in float32 (double for double).
//
// A row group g holds rows a + (i0 + t) sh, t < DEPTHWISE_T_ROWS, for phase a = g mod sh and i0 =
// (g / sh) DEPTHWISE_T_ROWS; there are sh ceil(ceil(H / sh) / DEPTHWISE_T_ROWS) of them (row_groups).
// NCHW: block (32, 8), 32 columns x 8 row groups of one channel; grid (column tiles x ceil(row_groups /
// 8), C, min(N, 65535)). NHWC: block 256, each thread VEC channels of one pixel column: grid
// (ceil(W C / VEC / 256), row_groups, min(N, 65535)). The weight is read through element strides
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

// At most 85 registers (three blocks an SM): the 16-byte-vector instances hold 4 rows x VEC sums and 4 rows of
// y (80 registers; at 64 the 16-bit ones spilled), the scalar ones take 45-56. The tap loops are not unrolled
// (unrolled, the instances took every register allowed).
template <typename T, bool NHWC, int VEC>
__global__ void __launch_bounds__(256, 3)
transpose_depthwise(const T* __restrict__ y, const T* __restrict__ w, const T* __restrict__ bias, T* __restrict__ out,
                    int N, int C, int M, int Hy, int Wy, int H, int W, int kh, int kw, int sh, int sw, int dh, int dw,
                    int row_tap_step, int row_y_step, int col_tap_step, int col_y_step, int pt, int pl, int stride_k,
                    int stride_r, int stride_s, int has_bias, int column_tiles) {
    using Acc = typename accumulator<T>::type;
    static_assert(NHWC || VEC == 1, "NCHW: one channel a block");
    int column, channel, group;
    if constexpr (NHWC) {
        const int vector = blockIdx.x * 256 + threadIdx.x, vectors = C / VEC;
        column = vector / vectors;
        channel = (vector - column * vectors) * VEC;
        group = blockIdx.y;
    } else {
        const int tile_row = blockIdx.x / column_tiles;
        column = (blockIdx.x - tile_row * column_tiles) * 32 + threadIdx.x;
        channel = blockIdx.y;
        group = tile_row * 8 + threadIdx.y;
    }
    const int phase = group % sh, row0 = phase + (group / sh) * DEPTHWISE_T_ROWS * sh;
    if (column >= W || row0 >= H) return;
    const int K = C * M;
    const FirstTap first_col = first_tap(column, pl, dw, sw, col_tap_step, kw);
    const FirstTap first_row = first_tap(row0, pt, dh, sh, row_tap_step, kh);
    Acc b[VEC];
#pragma unroll
    for (int v = 0; v < VEC; ++v) b[v] = has_bias ? to_acc<Acc>(bias[channel + v]) : Acc(0);
    // 32-bit offsets: the rules take arrays of fewer than 2^31 elements. y's and the weight's first
    // channel of this thread's group; the group's j-th channel of y is j (NHWC) or j planes further.
    const int plane = Hy * Wy, y_pixel = NHWC ? K : 1, y_channel = NHWC ? 1 : plane;
    const T* w_group = w + channel * M * stride_k;
    struct alignas(sizeof(T) * VEC) Vec { T v[VEC]; };
    for (int n = blockIdx.z; n < N; n += gridDim.z) {
        const T* y_group = y + n * plane * K + channel * M * y_channel;
        // Every row's sums at once, each tap's weights loaded once for them and its rows of y loaded
        // together: one thread's loads in flight at a time left the kernel waiting on latency.
        Acc acc[DEPTHWISE_T_ROWS][VEC];
#pragma unroll
        for (int t = 0; t < DEPTHWISE_T_ROWS; ++t)
#pragma unroll
            for (int v = 0; v < VEC; ++v) acc[t][v] = b[v];
#pragma unroll 1
        for (int r = first_row.tap, iy = first_row.in; r < kh; r += row_tap_step, iy -= row_y_step) {
#pragma unroll 1
            for (int s = first_col.tap, ix = first_col.in; s < kw; s += col_tap_step, ix -= col_y_step) {
                if (static_cast<unsigned>(ix) >= static_cast<unsigned>(Wy)) continue;
                const T* w_at = w_group + r * stride_r + s * stride_s;
#pragma unroll 1
                for (int j = 0; j < M; ++j) {
                    // VEC > 1 only where M == 1 (NHWC): the group's channels of y are the vector's
                    Acc wv[VEC];
#pragma unroll
                    for (int v = 0; v < VEC; ++v) wv[v] = to_acc<Acc>(w_at[(v * M + j) * stride_k]);
                    Vec yv[DEPTHWISE_T_ROWS];
#pragma unroll
                    for (int t = 0; t < DEPTHWISE_T_ROWS; ++t) {
                        const bool inside = static_cast<unsigned>(iy + t) < static_cast<unsigned>(Hy) &&
                                            row0 + t * sh < H;
                        yv[t] = load_or_zero(
                            reinterpret_cast<const Vec*>(y_group + ((iy + t) * Wy + ix) * y_pixel + j * y_channel),
                            inside);
                    }
#pragma unroll
                    for (int t = 0; t < DEPTHWISE_T_ROWS; ++t)
#pragma unroll
                        for (int v = 0; v < VEC; ++v) acc[t][v] += to_acc<Acc>(yv[t].v[v]) * wv[v];
                }
            }
        }
#pragma unroll
        for (int t = 0; t < DEPTHWISE_T_ROWS; ++t) {
            const int row = row0 + t * sh;
            if (row >= H) break;
            if constexpr (NHWC) {
                Vec result;
#pragma unroll
                for (int v = 0; v < VEC; ++v) result.v[v] = from_acc<T>(acc[t][v]);
                *reinterpret_cast<Vec*>(out + ((n * H + row) * W + column) * C + channel) = result;
            } else {
                out[((n * C + channel) * H + row) * W + column] = from_acc<T>(acc[t][0]);
            }
        }
    }
}

}  // namespace cupyconv
