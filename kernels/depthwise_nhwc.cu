// Depthwise 2-D convolution on NHWC arrays (one channel per group, no multiplier: K == C == groups).
//
// Channels are innermost in NHWC, so a thread computes VEC consecutive channels with VEC-wide loads
// and stores (16 bytes where C allows): consecutive threads take consecutive channel vectors, and a
// warp reads and writes whole contiguous runs of memory. The weight comes prepared as [kh kw][C]
// (families/depthwise_nhwc.py), so it is read in vectors too. No shared memory, no barrier: what
// threads share, L1 and L2 catch. x and y must be aligned to a vector (the fronts copy operands that
// are not). Sums in the accumulator type (float, or double for double), rounded once.
//
// Two ways, by template:
// - KW == 0 (any kernel, stride, dilation): a thread per output pixel. Each tap is a load of x and
//   one of w, and a 16-bit element is widened once per tap: 2 loads and 2 conversions per tap and
//   output vector, which bind before HBM does.
// - KW > 0 (a kernel KW wide, column stride SW, no column dilation): a thread per run of PIX output
//   pixels along a row. Per kernel row, the thread widens the row's KW weight vectors once and then
//   walks the (PIX-1)*SW + KW input columns the run covers, loading and widening each once and
//   adding it to every pixel whose window holds it: for 3x3, stride 1 and 4 pixels, 6 + 3 loads per
//   row instead of 24.
// Arguments as every convolution kernel's (families/common.py conv_launch; K and groups are C).
// 1-D grid over N Ho ceil(Wo / PIX) C / VEC threads, 256 per block.
#include "dtypes.cuh"
#include "epilogue.cuh"

namespace cupyconv {

template <typename T, int VEC> struct alignas(sizeof(T) * VEC) vec_t { T v[VEC]; };

// Kernel row r's KW weight vectors at channel c0, widened once for a run's PIX pixels.
template <typename T, typename Acc, int VEC, int KW>
__device__ __forceinline__ void widen_row_weights(Acc (&wr)[KW][VEC], const T* __restrict__ w, int r, int C, int c0) {
#pragma unroll
    for (int s = 0; s < KW; ++s) {
        const vec_t<T, VEC> wv = *reinterpret_cast<const vec_t<T, VEC>*>(w + (r * KW + s) * C + c0);
#pragma unroll
        for (int j = 0; j < VEC; ++j) wr[s][j] = to_acc<Acc>(wv.v[j]);
    }
}

// Input column col of a run (widened, xf) into every pixel of the run whose window holds it.
template <typename Acc, int VEC, int KW, int SW, int PIX>
__device__ __forceinline__ void add_column(Acc (&acc)[PIX][VEC], const Acc (&xf)[VEC], const Acc (&wr)[KW][VEC],
                                           int col) {
#pragma unroll
    for (int p = 0; p < PIX; ++p) {
        const int s = col - p * SW;  // the tap of pixel p this column is (compile-time once unrolled)
        if (s >= 0 && s < KW) {
#pragma unroll
            for (int j = 0; j < VEC; ++j) acc[p][j] += xf[j] * wr[s][j];
        }
    }
}

// The run's sums plus bias through the epilogue, stored from y offset o0 (its first pixel, channel
// c0): the first `pixels` of the PIX, those inside the row.
template <typename T, typename Index, typename Acc, int VEC, int PIX>
__device__ __forceinline__ void store_run(Acc (&acc)[PIX][VEC], T* __restrict__ y, const T* __restrict__ bias,
                                          int has_bias, const T* __restrict__ residual, int has_residual,
                                          int activation, int c0, Index o0, int C, int pixels) {
    using Vec = vec_t<T, VEC>;
    if (has_bias) {  // element by element: the caller's bias need not be aligned to a vector
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
            const Acc b = to_acc<Acc>(bias[c0 + j]);
#pragma unroll
            for (int p = 0; p < PIX; ++p) acc[p][j] += b;
        }
    }
    with_epilogue<T>(residual, has_residual, activation, [&](auto finish) {
#pragma unroll
        for (int p = 0; p < PIX; ++p) {
            if (p >= pixels) continue;
            Vec out;
            const Index o = o0 + static_cast<Index>(p) * C;
#pragma unroll
            for (int j = 0; j < VEC; ++j) out.v[j] = finish(acc[p][j], o + j);
            *reinterpret_cast<Vec*>(y + o) = out;
        }
    });
}

// No __launch_bounds__: with one, ptxas spills a few bytes in some instances (as in depthwise_conv2d.cu).
template <typename T, typename Index, int VEC, int KW, int SW, int PIX>
__global__ void
depthwise_nhwc(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias, T* __restrict__ y,
               int has_bias, const T* __restrict__ residual, int has_residual, int activation,
               int N, int C, int H, int W, int K, int Ho, int Wo, int kh, int kw,
               int sh, int sw, int pt, int pl, int dh, int dw, int groups) {
    static_assert(KW > 0 || PIX == 1, "the per-pixel way computes one pixel per thread");
    using Acc = typename accumulator<T>::type;
    using Vec = vec_t<T, VEC>;
    const int vectors = C / VEC;
    const int runs = (Wo + PIX - 1) / PIX;  // runs of PIX output pixels per row
    const Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= static_cast<Index>(N) * Ho * runs * vectors) return;
    const Index run = i / vectors;
    const int c0 = static_cast<int>(i - run * vectors) * VEC;
    const int ow0 = static_cast<int>(run % runs) * PIX;
    const Index nh = run / runs;
    const int oh = static_cast<int>(nh % Ho);
    const Index n = nh / Ho;
    const int ih0 = oh * sh - pt;
    const T* x_image = x + n * H * W * C + c0;

    Acc acc[PIX][VEC];
#pragma unroll
    for (int p = 0; p < PIX; ++p)
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc[p][j] = Acc(0);
    if constexpr (KW == 0) {
        const int iw0 = ow0 * sw - pl;
#pragma unroll 1
        for (int r = 0; r < kh; ++r) {
            const int ih = ih0 + r * dh;
            if (static_cast<unsigned>(ih) >= static_cast<unsigned>(H)) continue;
#pragma unroll 4
            for (int s = 0; s < kw; ++s) {
                const int iw = iw0 + s * dw;
                if (static_cast<unsigned>(iw) >= static_cast<unsigned>(W)) continue;
                const Vec xv = *reinterpret_cast<const Vec*>(x_image + (static_cast<Index>(ih) * W + iw) * C);
                const Vec wv = *reinterpret_cast<const Vec*>(w + (r * kw + s) * C + c0);
#pragma unroll
                for (int j = 0; j < VEC; ++j) acc[0][j] += to_acc<Acc>(xv.v[j]) * to_acc<Acc>(wv.v[j]);
            }
        }
    } else {
        const int iw0 = ow0 * SW - pl;
#pragma unroll 1
        for (int r = 0; r < kh; ++r) {
            const int ih = ih0 + r * dh;
            if (static_cast<unsigned>(ih) >= static_cast<unsigned>(H)) continue;
            Acc wr[KW][VEC];
            widen_row_weights<T>(wr, w, r, C, c0);
            // The run's input columns, loaded before any is used: COLS loads in flight at once
            // (zeros where a column falls in the padding).
            constexpr int COLS = (PIX - 1) * SW + KW;
            const T* x_row = x_image + static_cast<Index>(ih) * W * C;
            Vec xs[COLS];
#pragma unroll
            for (int col = 0; col < COLS; ++col) {
                const int iw = iw0 + col;
                xs[col] = static_cast<unsigned>(iw) < static_cast<unsigned>(W)
                              ? *reinterpret_cast<const Vec*>(x_row + static_cast<Index>(iw) * C) : Vec{};
            }
#pragma unroll
            for (int col = 0; col < COLS; ++col) {
                Acc xf[VEC];
#pragma unroll
                for (int j = 0; j < VEC; ++j) xf[j] = to_acc<Acc>(xs[col].v[j]);
                add_column<Acc, VEC, KW, SW, PIX>(acc, xf, wr, col);
            }
        }
    }
    store_run<T, Index>(acc, y, bias, has_bias, residual, has_residual, activation, c0,
                        ((n * Ho + oh) * Wo + ow0) * C + c0, C, Wo - ow0);
}

// Tiled rows: a block computes a tile of tile_rows output rows x tile_runs runs of PIX pixels for
// blockDim.x channel vectors (threadIdx.x the vector, threadIdx.y the run). It first stages the
// input the tile reads in shared memory, widened to the accumulator type once per element, in
// batches of BATCH loads per thread; then each thread computes its run from there as the row way
// does from global memory, in the same order (padding is staged as zeros and adds 0 x w, which
// leaves every sum as skipping it does). What this saves over the row way: the 16-bit widening of
// each element per window it falls in (4.5 a 3x3 output at runs of 4), the checks and selects per
// load, and the L2 re-fetches of the rows other blocks' output rows share (benchmarks/NOTES.md).
// Shared memory: [in_rows][in_cols][VEC / CHUNK][blockDim.x][CHUNK] accumulators, so that the
// threads of a quarter-warp read consecutive 16-byte chunks. Arguments as depthwise_nhwc's, then the
// tile's rows and runs; grid x over N x the tiles of each image, y over slabs of blockDim.x vectors;
// dynamic shared memory in_rows x in_cols x blockDim.x x VEC accumulators (the planner's).
template <typename T, typename Index, int VEC, int KW, int SW, int PIX>
__global__ void
depthwise_nhwc_tiled(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias, T* __restrict__ y,
                     int has_bias, const T* __restrict__ residual, int has_residual, int activation,
                     int N, int C, int H, int W, int K, int Ho, int Wo, int kh, int kw,
                     int sh, int sw, int pt, int pl, int dh, int dw, int groups, int tile_rows, int tile_runs) {
    using Acc = typename accumulator<T>::type;
    using Vec = vec_t<T, VEC>;
    constexpr int CHUNK = 16 / sizeof(Acc), CHUNKS = VEC / CHUNK, BATCH = 4;
    constexpr int COLS = (PIX - 1) * SW + KW;  // input columns a run's windows cover in a row
    static_assert(VEC % CHUNK == 0, "vectors of whole 16-byte chunks of accumulators");
    using Chunk = vec_t<Acc, CHUNK>;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Chunk* tile = reinterpret_cast<Chunk*>(smem_raw);

    const int vb = blockDim.x, vectors = C / VEC, v0 = blockIdx.y * vb;
    const int runs = (Wo + PIX - 1) / PIX;
    const int tiles_w = (runs + tile_runs - 1) / tile_runs, tiles_h = (Ho + tile_rows - 1) / tile_rows;
    const Index image_tile = blockIdx.x / tiles_w;
    const int tw = static_cast<int>(blockIdx.x - image_tile * tiles_w);
    const Index n = image_tile / tiles_h;
    const int oh0 = static_cast<int>(image_tile - n * tiles_h) * tile_rows, ow00 = tw * tile_runs * PIX;
    const int ih_base = oh0 * sh - pt, iw_base = ow00 * SW - pl;
    const int in_rows = (tile_rows - 1) * sh + (kh - 1) * dh + 1, in_cols = (tile_runs * PIX - 1) * SW + KW;
    const int threads = vb * blockDim.y, tid = threadIdx.y * vb + threadIdx.x;
    const T* x_image = x + n * H * W * C;

    // Stage: item = (position, vector), consecutive threads consecutive vectors of a position.
    const int items = in_rows * in_cols * vb;
#pragma unroll 1
    for (int base = tid; base < items; base += BATCH * threads) {
        Vec xs[BATCH];
#pragma unroll
        for (int b = 0; b < BATCH; ++b) {
            const int item = base + b * threads, v = item % vb, position = item / vb;
            const int row = position / in_cols, ih = ih_base + row, iw = iw_base + position - row * in_cols;
            const bool ok = item < items && v0 + v < vectors && static_cast<unsigned>(ih) < static_cast<unsigned>(H) &&
                            static_cast<unsigned>(iw) < static_cast<unsigned>(W);
            xs[b] = ok ? *reinterpret_cast<const Vec*>(x_image + (static_cast<Index>(ih) * W + iw) * C + (v0 + v) * VEC)
                       : Vec{};
        }
#pragma unroll
        for (int b = 0; b < BATCH; ++b) {
            const int item = base + b * threads, v = item % vb, position = item / vb;
            if (item < items) {
#pragma unroll
                for (int c = 0; c < CHUNKS; ++c) {
                    Chunk chunk;
#pragma unroll
                    for (int j = 0; j < CHUNK; ++j) chunk.v[j] = to_acc<Acc>(xs[b].v[c * CHUNK + j]);
                    tile[(position * CHUNKS + c) * vb + v] = chunk;
                }
            }
        }
    }
    __syncthreads();

    const int v = threadIdx.x, lr = threadIdx.y / tile_runs, lc = threadIdx.y - lr * tile_runs;
    const int oh = oh0 + lr, ow0 = ow00 + lc * PIX;
    if (oh >= Ho || ow0 >= Wo || v0 + v >= vectors) return;
    const int c0 = (v0 + v) * VEC;
    Acc acc[PIX][VEC];
#pragma unroll
    for (int p = 0; p < PIX; ++p)
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc[p][j] = Acc(0);
#pragma unroll 1
    for (int r = 0; r < kh; ++r) {
        Acc wr[KW][VEC];
        widen_row_weights<T>(wr, w, r, C, c0);
        const Chunk* src = tile + ((lr * sh + r * dh) * in_cols + lc * PIX * SW) * CHUNKS * vb + v;
#pragma unroll
        for (int col = 0; col < COLS; ++col) {
            Acc xf[VEC];
#pragma unroll
            for (int c = 0; c < CHUNKS; ++c) {
                const Chunk chunk = src[(col * CHUNKS + c) * vb];
#pragma unroll
                for (int j = 0; j < CHUNK; ++j) xf[c * CHUNK + j] = chunk.v[j];
            }
            add_column<Acc, VEC, KW, SW, PIX>(acc, xf, wr, col);
        }
    }
    store_run<T, Index>(acc, y, bias, has_bias, residual, has_residual, activation, c0,
                        ((n * Ho + oh) * Wo + ow0) * C + c0, C, Wo - ow0);
}

}  // namespace cupyconv
