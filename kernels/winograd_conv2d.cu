// Winograd F(m x m, 3x3), m = 2 or 4, for strict float32: undilated, ungrouped convolutions (3x3 at
// stride 1 as it stands; AlexNet's 11x11 at stride 4 and larger kernels through the splits below), with
// fewer multiplies than the direct sum (Lavin and Gray, "Fast Algorithms for Convolutional Neural
// Networks", 2016): 2.25x fewer for m = 2, 4x for m = 4. With a = m + 2, every m x m output tile is
//   Y = A^T [ sum_c (G g G^T) .* (B^T d B) ] A
// with d the tile's a x a input patch and g the 3x3 filter; the sum over c, for each of the a^2
// positions xi of the transformed tile, is a GEMM  M[xi] = V[xi] U[xi]  ([tiles x C'] x [C' x K]).
//
// Other kernels become a stride-1 3x3 convolution of more channels by two splits. With x padded,
// output (oh, ow) sums x[sh oh + r][sw ow + s] w[r][s] over the taps; write
//   r = sh (3 u + i) + p,   s = sw (3 v + j) + q   (p < sh, q < sw, i, j < 3, u < bh, v < bw),
// bh = ceil(ceil(kh / sh) / 3) blocks of 3 strides down the kernel, bw across. Then the "phase"
// (u, v, p, q) of channel c, x_uvpq[i'][j'] = x[sh (i' + 3 u) + p][sw (j' + 3 v) + q], is one of
// C' = C bh bw sh sw input channels of a stride-1 3x3 convolution with filter
// w_uvpq[i][j] = w[sh (3 u + i) + p][sw (3 v + j) + q], zero past the kernel: the polyphase split for
// strides, the block split for kernels past 3 strides (the 5x9 at stride 1: 2 x 3 blocks). The
// transforms read x and w through them; a 3x3 stride-1 layer is the phase (0, 0, 0, 0) alone.
//
// Three kernels here, and simt_gemm_conv2d.cu between them:
//   winograd_weight_transform  w [K][C][kh][kw] -> U [a^2][C'][Kp]  (G g G^T; Kp = K rounded up to 4)
//   winograd_input_transform   x [N][C][H][W]   -> V [a^2][C'][T]   (B^T d B; T = N tiles_h tiles_w)
//   simt_gemm_conv2d           V as an a^2-group 1x1 convolution of one image of 1 x T pixels, U as
//                              its transposed weight                -> M [a^2][K][T]
//   winograd_output_transform  M                 -> y [N][K][Ho][Wo] (A^T m A + bias; with split-K
//                              it adds the GEMM's partial sums of M itself, in run order)
// V and M are laid out tile-contiguous so that the GEMM's gather is the 1x1 case (a warp reads 128
// contiguous bytes) and each transform reads and writes along tiles, coalesced. They are a^2 / m^2
// times the phases and the output (4x for m = 2, 2.25x for m = 4) and cross memory twice each: the
// planner takes this path only where the multiplies saved outweigh that.
// The weight gradient (cupyconv/wgrad_winograd.py) runs the same algebra backwards. The forward's
// per-tile M = U .* V and Y = A^T M A give dL/dM = A dY A^T and dL/dU = sum over tiles of dL/dM .* V,
// so per position xi a GEMM reduces over the T tiles: dU[xi][k][c'] = sum_t dM[xi][k][t] V[xi][c'][t],
// and the filter's gradient is dg = G^T dU G:
//   winograd_input_transform            x  -> V  (as above; CHANNELS_LAST: x NHWC, V [T][a^2][C'])
//   winograd_output_gradient_transform  dy -> dM [a^2][K][T] (A dY A^T; CHANNELS_LAST: dy NHWC, dM
//                                       [T][a^2][K])
//   wgrad_gemm                          the a^2-group weight gradient of a 1x1 convolution of one image
//                                       of 1 x T pixels, in runs of the reduction -> dU's partial sums
//   winograd_weight_gradient_transform  the runs added in run order, G^T dU G -> dW (KCHW or KHWC)
// Rounding: m = 2's coefficients (0, +-1, 1/2) are exact; m = 4's (1/6, 1/24, 8, ...) are not, and its
// error on random data is ~10x the direct sum's (2-3e-6 relative up to 512 channels, against 2e-7),
// still well inside strict float32's 1e-5; the planner keeps m = 4 to at most 512 channels C'.
#include "dtypes.cuh"
#include "epilogue.cuh"

namespace cupyconv {

// The transform matrices of F(M x M, 3x3): B^T (a x a), G (a x 3), A^T (M x a), points 0, +-1, +-2.
template <int M> struct winograd;
template <> struct winograd<2> {
    static constexpr float BT[4][4] = {{1, 0, -1, 0}, {0, 1, 1, 0}, {0, -1, 1, 0}, {0, 1, 0, -1}};
    static constexpr float G[4][3] = {{1, 0, 0}, {0.5f, 0.5f, 0.5f}, {0.5f, -0.5f, 0.5f}, {0, 0, 1}};
    static constexpr float AT[2][4] = {{1, 1, 1, 0}, {0, 1, -1, -1}};
};
template <> struct winograd<4> {
    static constexpr float BT[6][6] = {{4, 0, -5, 0, 1, 0},  {0, -4, -4, 1, 1, 0}, {0, 4, -4, -1, 1, 0},
                                       {0, -2, -1, 2, 1, 0}, {0, 2, -1, -2, 1, 0}, {0, 4, 0, -5, 0, 1}};
    static constexpr float G[6][3] = {{1.0f / 4, 0, 0},
                                      {-1.0f / 6, -1.0f / 6, -1.0f / 6},
                                      {-1.0f / 6, 1.0f / 6, -1.0f / 6},
                                      {1.0f / 24, 1.0f / 12, 1.0f / 6},
                                      {1.0f / 24, -1.0f / 12, 1.0f / 6},
                                      {0, 0, 1}};
    static constexpr float AT[4][6] = {{1, 1, 1, 1, 1, 0}, {0, 1, -1, 2, -2, 0}, {0, 1, 1, 4, 4, 0}, {0, 1, -1, 8, -8, 1}};
};

// The transposes the weight gradient's transforms need: A (a x M) and G^T (3 x a).
template <int R, int C> struct Matrix {
    float v[R][C];
};
template <int R, int C> constexpr Matrix<C, R> transposed(const float (&m)[R][C]) {
    Matrix<C, R> t{};
    for (int i = 0; i < R; ++i)
        for (int j = 0; j < C; ++j) t.v[j][i] = m[i][j];
    return t;
}
template <int M> struct winograd_transposes {
    static constexpr Matrix<M + 2, M> A = transposed(winograd<M>::AT);
    static constexpr Matrix<3, M + 2> GT = transposed(winograd<M>::G);
};

// out = L in R^T for constant matrices L and R, as two products with the zero terms left out at
// compile time (the loops unroll; x * 0 would otherwise stay, since IEEE float may not drop it).
template <int ROWS, int INNER, int COLS, int IN_COLS>
__device__ __forceinline__ void sandwich(const float (&L)[ROWS][INNER], const float (&in)[INNER][IN_COLS],
                                         const float (&R)[COLS][IN_COLS], float (&out)[ROWS][COLS]) {
    float t[ROWS][IN_COLS];
#pragma unroll
    for (int i = 0; i < ROWS; ++i)
#pragma unroll
        for (int j = 0; j < IN_COLS; ++j) {
            t[i][j] = 0.0f;
#pragma unroll
            for (int k = 0; k < INNER; ++k)
                if (L[i][k] != 0.0f) t[i][j] += L[i][k] * in[k][j];
        }
#pragma unroll
    for (int i = 0; i < ROWS; ++i)
#pragma unroll
        for (int j = 0; j < COLS; ++j) {
            out[i][j] = 0.0f;
#pragma unroll
            for (int k = 0; k < IN_COLS; ++k)
                if (R[j][k] != 0.0f) out[i][j] += t[i][k] * R[j][k];
        }
}

// Tile t of T = N tiles_h tiles_w, in (image, tile row, tile column) order.
template <typename Index> struct Tile {
    Index image;
    int th, tw;
    __device__ __forceinline__ Tile(Index t, int tiles_h, int tiles_w) {
        const Index image_row = t / tiles_w;
        tw = static_cast<int>(t - image_row * tiles_w);
        image = image_row / tiles_h;
        th = static_cast<int>(image_row - image * tiles_h);
    }
};

// The transformed tiles live as [a^2][rows][positions]: element (r, q) of a thread's a x a tile is in
// plane r a + q (planes `plane` apart), at the thread's position i, so neighbouring threads touch
// neighbouring words.
template <int A, typename Index>
__device__ __forceinline__ void store_planes(const float (&t)[A][A], float* __restrict__ dst, Index plane, Index i) {
#pragma unroll
    for (int r = 0; r < A; ++r)
#pragma unroll
        for (int q = 0; q < A; ++q) dst[(r * A + q) * plane + i] = t[r][q];
}

template <int A, typename Index>
__device__ __forceinline__ void load_planes(float (&t)[A][A], const float* __restrict__ src, Index plane, Index i) {
#pragma unroll
    for (int r = 0; r < A; ++r)
#pragma unroll
        for (int q = 0; q < A; ++q) t[r][q] = src[(r * A + q) * plane + i];
}

// load_planes of the sum of ``splits`` runs of split-K's partial sums, ``run`` floats apart, added in
// run order as split_k_reduce.cu adds them (the same bits, without its launch and its pass over M).
template <int A, typename Index>
__device__ __forceinline__ void load_split_planes(float (&t)[A][A], const float* __restrict__ src, Index plane,
                                                  Index i, int splits, int run) {
    load_planes(t, src, plane, i);
    // splits x run < 2^31 (common.split_k_runs): 32-bit offsets, whatever Index is.
    for (int offset = run; offset < splits * run; offset += run) {
        float more[A][A];
        load_planes(more, src + offset, plane, i);
#pragma unroll
        for (int r = 0; r < A; ++r)
#pragma unroll
            for (int q = 0; q < A; ++q) t[r][q] += more[r][q];
    }
}

// Phase ph of bh bw sh sw, in (u, v, p, q) order: the tap or input offset of its (0, 0) element.
struct Phase {
    int row, col;
    __device__ __forceinline__ Phase(int ph, int sh, int sw, int bw) {
        const int q = ph % sw, p = ph / sw % sh, v = ph / (sw * sh) % bw, u = ph / (sw * sh * bw);
        row = 3 * sh * u + p;
        col = 3 * sw * v + q;
    }
};

// One thread per (c', k) pair, k fastest: U[xi][c'][k] = (G g G^T)[xi] for c' = (c, phase), g that
// phase's 3x3 filter (taps past the kernel and channels k >= K are zeros).
template <int M, typename Index>
__global__ void __launch_bounds__(256)
winograd_weight_transform(const float* __restrict__ w, float* __restrict__ u, int C, int K, int Kp, int kh, int kw,
                          int sh, int sw, int bh, int bw) {
    constexpr int A = M + 2;
    const Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;
    const int phases = bh * bw * sh * sw;
    if (i >= static_cast<Index>(C) * phases * Kp) return;
    const int cp = static_cast<int>(i / Kp), k = static_cast<int>(i - static_cast<Index>(cp) * Kp);
    const int c = cp / phases;
    const Phase phase(cp - c * phases, sh, sw, bw);
    const float* filter = w + (static_cast<Index>(k) * C + c) * kh * kw;
    float g[3][3], out[A][A];
#pragma unroll
    for (int r = 0; r < 3; ++r)
#pragma unroll
        for (int s = 0; s < 3; ++s) {
            const int tap_h = phase.row + sh * r, tap_w = phase.col + sw * s;
            g[r][s] = k < K && tap_h < kh && tap_w < kw ? filter[tap_h * kw + tap_w] : 0.0f;
        }
    sandwich(winograd<M>::G, g, winograd<M>::G, out);
    store_planes(out, u, static_cast<Index>(C) * phases * Kp, i);
}

// V[xi][c'][t] = (B^T d B)[xi] for phase channel c' = (c, phase) and tile t, d the a x a patch of that
// phase at (M th, M tw), that is of x from (sh M th + phase.row - pt, sw M tw + phase.col - pl) with rows
// sh and columns sw apart, zeros outside.
// NCHW: one block of 256 tiles (a row of tiles are neighbours, so a warp's reads overlap in L1) for one
// phase channel. Blocks run phase-fastest, so the bh bw sh sw blocks that read one stretch of x run
// together and share it in L2 (channel-major, each phase would read all N images of c again).
// CHANNELS_LAST (x NHWC, V as [T][a^2][C']): one thread per (t, c'), c' fastest, so that a warp reads
// and writes consecutive channels.
template <int M, typename Index, bool CHANNELS_LAST>
__global__ void __launch_bounds__(256)
winograd_input_transform(const float* __restrict__ x, float* __restrict__ v, int N, int C, int H, int W,
                         int pt, int pl, int sh, int sw, int bh, int bw, int tiles_h, int tiles_w) {
    constexpr int A = M + 2;
    const Index T = static_cast<Index>(N) * tiles_h * tiles_w;
    const int phases = bh * bw * sh * sw;
    Index c, t;
    int ph;
    if constexpr (CHANNELS_LAST) {
        const Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;
        const Index channels = static_cast<Index>(C) * phases;
        t = i / channels;
        if (t >= T) return;
        const int cp = static_cast<int>(i - t * channels);
        c = cp / phases;
        ph = cp - static_cast<int>(c) * phases;
    } else {
        const Index chunks = (T + blockDim.x - 1) / blockDim.x;
        const Index block = blockIdx.x;
        ph = static_cast<int>(block % phases);
        const Index c_chunk = block / phases;
        c = c_chunk / chunks;
        t = (c_chunk - c * chunks) * blockDim.x + threadIdx.x;
        if (t >= T) return;
    }
    const Phase phase(ph, sh, sw, bw);
    const Tile<Index> tile(t, tiles_h, tiles_w);
    // Element (ih, iw) of channel c of the tile's image is at image + ih row + iw col.
    const float* image = x + (CHANNELS_LAST ? tile.image * H * W * C + c : (tile.image * C + c) * H * W);
    const Index row = CHANNELS_LAST ? static_cast<Index>(W) * C : W, col = CHANNELS_LAST ? C : 1;
    const int ih0 = sh * M * tile.th + phase.row - pt, iw0 = sw * M * tile.tw + phase.col - pl;
    float d[A][A], out[A][A];
#pragma unroll
    for (int r = 0; r < A; ++r)
#pragma unroll
        for (int s = 0; s < A; ++s) {
            const int ih = ih0 + sh * r, iw = iw0 + sw * s;
            d[r][s] = static_cast<unsigned>(ih) < static_cast<unsigned>(H) && static_cast<unsigned>(iw) < static_cast<unsigned>(W)
                          ? image[ih * row + iw * col] : 0.0f;
        }
    sandwich(winograd<M>::BT, d, winograd<M>::BT, out);
    const Index channels = static_cast<Index>(C) * phases, cp = c * phases + ph;
    if constexpr (CHANNELS_LAST)
        store_planes(out, v, channels, t * A * A * channels + cp);
    else
        store_planes(out, v, T * channels, cp * T + t);
}

// One thread per (k, tile), tile fastest: the M x M outputs A^T m A (+ bias, through the epilogue) of
// the a^2 M[xi][k][t]; with SPLIT_K, m holds the GEMM's ``splits`` runs of partial sums of M, one
// after another, and their sum is M (a template flag: holding a whole run's values costs registers the
// unsplit instance, which batches of many images run, keeps for more blocks per SM).
template <int M, typename Index, bool SPLIT_K>
__global__ void __launch_bounds__(256)
winograd_output_transform(const float* __restrict__ m, const float* __restrict__ bias, float* __restrict__ y,
                          int has_bias, const float* __restrict__ residual, int has_residual, int activation,
                          int splits, int N, int K, int Ho, int Wo, int tiles_h, int tiles_w) {
    constexpr int A = M + 2;
    const Index T = static_cast<Index>(N) * tiles_h * tiles_w;
    const Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= T * K) return;
    const Index k = i / T;
    const Tile<Index> tile(i - k * T, tiles_h, tiles_w);
    float a[A][A], out[M][M];
    if constexpr (SPLIT_K)
        load_split_planes(a, m, T * K, i, splits, static_cast<int>(T * K * A * A));
    else
        load_planes(a, m, T * K, i);
    sandwich(winograd<M>::AT, a, winograd<M>::AT, out);
    const float b = has_bias ? bias[k] : 0.0f;
    const Index plane = (tile.image * K + k) * Ho * Wo;
    with_epilogue<float>(residual, [&](auto finish) {
#pragma unroll
        for (int r = 0; r < M; ++r)
#pragma unroll
            for (int q = 0; q < M; ++q) {
                const int oh = M * tile.th + r, ow = M * tile.tw + q;
                const Index o = plane + static_cast<Index>(oh) * Wo + ow;
                if (oh < Ho && ow < Wo) y[o] = finish(out[r][q] + b, o);
            }
    });
}

// One thread per (k, tile): dM[xi] = (A e A^T)[xi], e the M x M block of dy at (M th, M tw) (zeros past
// Ho x Wo). NCHW: tile fastest, dM [a^2][K][T]; CHANNELS_LAST (dy NHWC): k fastest, dM [T][a^2][K].
template <int M, typename Index, bool CHANNELS_LAST>
__global__ void __launch_bounds__(256)
winograd_output_gradient_transform(const float* __restrict__ dy, float* __restrict__ dm, int N, int K, int Ho,
                                   int Wo, int tiles_h, int tiles_w) {
    constexpr int A = M + 2;
    const Index T = static_cast<Index>(N) * tiles_h * tiles_w;
    const Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= T * K) return;
    const Index k = CHANNELS_LAST ? i % K : i / T, t = CHANNELS_LAST ? i / K : i - k * T;
    const Tile<Index> tile(t, tiles_h, tiles_w);
    const float* image = dy + (CHANNELS_LAST ? tile.image * Ho * Wo * K + k : (tile.image * K + k) * Ho * Wo);
    const Index row = CHANNELS_LAST ? static_cast<Index>(Wo) * K : Wo, col = CHANNELS_LAST ? K : 1;
    float e[M][M], out[A][A];
#pragma unroll
    for (int r = 0; r < M; ++r)
#pragma unroll
        for (int q = 0; q < M; ++q) {
            const int oh = M * tile.th + r, ow = M * tile.tw + q;
            e[r][q] = oh < Ho && ow < Wo ? image[oh * row + ow * col] : 0.0f;
        }
    sandwich(winograd_transposes<M>::A.v, e, winograd_transposes<M>::A.v, out);
    if constexpr (CHANNELS_LAST)
        store_planes(out, dm, static_cast<Index>(K), t * A * A * K + k);
    else
        store_planes(out, dm, T * K, i);
}

// One thread per (k, c), c fastest: dW[k][c] = G^T dU G (3 x 3) with dU[xi][k][c] the sum of ``splits``
// runs of the GEMM's partial sums (each a^2 K C floats), added in run order; written KCHW, or KHWC where
// weight_khwc.
template <int M, typename Index>
__global__ void __launch_bounds__(256)
winograd_weight_gradient_transform(const float* __restrict__ du, float* __restrict__ dw, int K, int C,
                                   int splits, int weight_khwc) {
    constexpr int A = M + 2;
    const Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;
    const Index KC = static_cast<Index>(K) * C;
    if (i >= KC) return;
    float u[A][A], g[3][3];
    load_split_planes(u, du, KC, i, splits, static_cast<int>(KC * A * A));
    sandwich(winograd_transposes<M>::GT.v, u, winograd_transposes<M>::GT.v, g);
    const Index k = i / C, c = i - k * C;
#pragma unroll
    for (int r = 0; r < 3; ++r)
#pragma unroll
        for (int s = 0; s < 3; ++s) dw[weight_khwc ? ((k * 3 + r) * 3 + s) * C + c : i * 9 + r * 3 + s] = g[r][s];
}

}  // namespace cupyconv
