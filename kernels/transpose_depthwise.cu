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
    using Vec = Pack<T, VEC>;
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

// transpose_depthwise_cells: NCHW, stride S on both axes, KS x KS taps, dilation 1 (MobileNet's and
// EfficientNet's stride-2 3x3 and 5x5), compiled with the paddings' residues PT = pt mod S, PL = pl mod S.
// A thread computes cells of S x S outputs, one output of every stride phase: cell (a, c) holds rows
// S a .. S a + S - 1 and columns S c .. S c + S - 1. Output row S a + rho reads y rows a + qt + (rho + PT - r) / S
// for its taps r = rho + PT (mod S) (qt = pt div S), so every cell of a thread reads y at the same offsets from
// (a + qt, c + ql): a warp's lanes take one cell column each and the same taps, with no per-lane tap search and
// no divergence between phases. A thread takes CELL_ROWS cells down a column; it loads the span of y rows and
// columns they read once, multiplies from registers, and stores each output row's S columns together (a 4-byte
// pair for 16-bit S = 2 where rows have even lengths).
//
// Block (32, 8): 32 cell columns x 8 groups of CELL_ROWS cell rows of one channel; grid (column tiles x
// ceil(ceil(ceil(H / S) / CELL_ROWS) / 8), C, min(N, 65535)).
constexpr int CELL_ROWS = 4;

// Along an axis of padding residue P: the lowest and highest (o + P - t) / S over the cells' offsets o < S and
// the taps t < KS that reach them ((o + P - t) a multiple of S): the span of y positions a cell reads.
template <int S, int KS, int P> struct CellSpan {
    static constexpr bool reaches(int o, int t) { return ((o + P - t) % S + S) % S == 0; }
    static constexpr int lowest(int o = 0, int t = 0, int best = 1 << 20) {
        return o == S ? best : t == KS ? lowest(o + 1, 0, best)
               : lowest(o, t + 1, reaches(o, t) && (o + P - t) / S < best ? (o + P - t) / S : best);
    }
    static constexpr int highest(int o = 0, int t = 0, int best = -(1 << 20)) {
        return o == S ? best : t == KS ? highest(o + 1, 0, best)
               : highest(o, t + 1, reaches(o, t) && (o + P - t) / S > best ? (o + P - t) / S : best);
    }
    static constexpr int LO = lowest(), COUNT = highest() - LO + 1;
};

template <typename T, int KS, int S, int PT, int PL>
__global__ void __launch_bounds__(256)
transpose_depthwise_cells(const T* __restrict__ y, const T* __restrict__ w, const T* __restrict__ bias,
                          T* __restrict__ out, int N, int C, int M, int Hy, int Wy, int H, int W, int qt, int ql,
                          int stride_k, int stride_r, int stride_s, int has_bias, int column_tiles) {
    using Acc = typename accumulator<T>::type;
    using Rows = CellSpan<S, KS, PT>;
    using Cols = CellSpan<S, KS, PL>;
    constexpr int YR = Rows::COUNT + CELL_ROWS - 1, YC = Cols::COUNT;  // the y a thread loads
    const int tile_row = blockIdx.x / column_tiles;
    const int c = (blockIdx.x - tile_row * column_tiles) * 32 + threadIdx.x;  // cell column
    const int a0 = (tile_row * 8 + threadIdx.y) * CELL_ROWS;                  // first cell row
    const int channel = blockIdx.y;
    if (c * S >= W || a0 * S >= H) return;
    const int iy0 = a0 + qt + Rows::LO, ix0 = c + ql + Cols::LO;  // y's first row and column loaded
    unsigned cols_inside = 0;  // bit e: y column ix0 + e lies in y
#pragma unroll
    for (int e = 0; e < YC; ++e)
        cols_inside |= static_cast<unsigned>(static_cast<unsigned>(ix0 + e) < static_cast<unsigned>(Wy)) << e;
    const Acc b = has_bias ? to_acc<Acc>(bias[channel]) : Acc(0);
    // 32-bit offsets: the rules take arrays of fewer than 2^31 elements.
    const int plane = Hy * Wy, K = C * M;
    const T* w_group = w + channel * M * stride_k;
    // Pairs stored as one word: S = 2, 16-bit or float, rows of even length (a cell's columns aligned).
    constexpr bool PAIRS = S == 2 && sizeof(T) <= 4;
    const bool pairs = PAIRS && W % 2 == 0;
    for (int n = blockIdx.z; n < N; n += gridDim.z) {
        Acc acc[CELL_ROWS][S][S];
#pragma unroll
        for (int i = 0; i < CELL_ROWS; ++i)
#pragma unroll
            for (int rho = 0; rho < S; ++rho)
#pragma unroll
                for (int sigma = 0; sigma < S; ++sigma) acc[i][rho][sigma] = b;
#pragma unroll 1
        for (int j = 0; j < M; ++j) {
            const T* y_at = y + (n * K + channel * M + j) * plane + iy0 * Wy + ix0;
            T yv[YR][YC];  // every load first, then the weights, then the multiplies
#pragma unroll
            for (int i = 0; i < YR; ++i)
#pragma unroll
                for (int e = 0; e < YC; ++e)
                    yv[i][e] = load_or_zero(y_at + i * Wy + e,
                                            (cols_inside >> e & 1u) &&
                                                static_cast<unsigned>(iy0 + i) < static_cast<unsigned>(Hy));
            Acc wv[KS * KS];
            const T* w_at = w_group + j * stride_k;
#pragma unroll
            for (int r = 0; r < KS; ++r)
#pragma unroll
                for (int s = 0; s < KS; ++s) wv[r * KS + s] = to_acc<Acc>(w_at[r * stride_r + s * stride_s]);
#pragma unroll
            for (int i = 0; i < YR; ++i)
#pragma unroll
                for (int e = 0; e < YC; ++e) {
                    const Acc v = to_acc<Acc>(yv[i][e]);
                    // y at (row i, column e) of the window feeds cell i - row offset's outputs (rho, sigma)
                    // through tap r = rho + PT - S (row offset), s = sigma + PL - S (column offset).
#pragma unroll
                    for (int rho = 0; rho < S; ++rho)
#pragma unroll
                        for (int r = 0; r < KS; ++r) {
                            if (!Rows::reaches(rho, r)) continue;
                            const int cell = i - ((rho + PT - r) / S - Rows::LO);
                            if (cell < 0 || cell >= CELL_ROWS) continue;
#pragma unroll
                            for (int sigma = 0; sigma < S; ++sigma)
#pragma unroll
                                for (int s = 0; s < KS; ++s)
                                    if (Cols::reaches(sigma, s) && (sigma + PL - s) / S - Cols::LO == e)
                                        acc[cell][rho][sigma] += v * wv[r * KS + s];
                        }
                }
        }
        T* out_plane = out + (n * C + channel) * H * W;
#pragma unroll
        for (int i = 0; i < CELL_ROWS; ++i)
#pragma unroll
            for (int rho = 0; rho < S; ++rho) {
                const int row = (a0 + i) * S + rho, column = c * S;
                if (row >= H) continue;
                T* o = out_plane + row * W + column;
                if constexpr (PAIRS) {
                    if (pairs) {  // W even: both columns inside, the pair 2-element aligned
                        const Pack<T, 2> pair{{from_acc<T>(acc[i][rho][0]), from_acc<T>(acc[i][rho][1])}};
                        *reinterpret_cast<Pack<T, 2>*>(o) = pair;
                        continue;
                    }
                }
#pragma unroll
                for (int sigma = 0; sigma < S; ++sigma)
                    if (column + sigma < W) o[sigma] = from_acc<T>(acc[i][rho][sigma]);
            }
    }
}

}  // namespace cupyconv
