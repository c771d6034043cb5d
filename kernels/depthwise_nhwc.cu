// Depthwise 2-D convolution on NHWC arrays (one channel per group, no multiplier: K == C == groups).
//
// Channels are innermost in NHWC, so a thread computes VEC consecutive channels with VEC-wide loads
// and stores (16 bytes where C allows): consecutive threads take consecutive channel vectors, and a
// warp reads and writes whole contiguous runs of memory. The weight comes prepared as [kh kw][C]
// (families/depthwise_nhwc.py), so it is read in vectors too, except where a walk stages it (STAGED,
// below). Otherwise no shared memory, no barrier: what threads share, L1 and L2 catch. x and y must be
// aligned to a vector (the fronts copy operands that are not). Sums in the accumulator type (float, or
// double for double), rounded once.
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
//   With ROWS > 1 (a square kernel, row stride SW, no row dilation) the thread also walks down ROWS output
//   rows: it loads and widens each of the (ROWS-1)*SW + KW input rows they cover once and adds it to
//   every output row whose window holds it, so an input row is fetched from L2 by one thread of a
//   column, not by KW threads of KW output rows. The sums keep the per-pixel order (kernel rows, then
//   taps), and all ROWS rows are stored at the end.
//   With STAGED (walks only), the weight is read in place, in the caller's order [C][KW KW], not prepared:
//   a block's threads take consecutive channel vectors, so the block copies the rows of its at most
//   blockDim.x vectors (all C where there are fewer), contiguous in w but for one wrap past C, into shared
//   memory once, and each thread reads its VEC channels' taps there (KW KW elements apart). No launch
//   prepares the weight, which a CUDA graph would otherwise replay before every call.
// - KW < 0 (a kernel of run-time width, column stride 1, no column dilation: conv1d's long kernels): a
//   thread per run of PIX pixels, the PIX input columns a tap reads rotated through registers
//   (depthwise_rows.cuh for_each_rotated_tap): each column loaded and widened once, each weight vector
//   once per run.
// Arguments as every convolution kernel's (families/common.py conv_launch; K and groups are C).
// 1-D grid over N ceil(Ho / ROWS) ceil(Wo / PIX) C / VEC threads; STAGED: min(blockDim.x, C / VEC) VEC KW KW
// elements of dynamic shared memory.
#include "depthwise_rows.cuh"
#include "dtypes.cuh"
#include "epilogue.cuh"
#include "mma.cuh"  // cp_async

namespace cupyconv {

// No __launch_bounds__: with one, ptxas spills a few bytes in some instances (as in depthwise_conv2d.cu).
template <typename T, typename Index, int VEC, int KW, int SW, int PIX, int ROWS, bool STAGED>
__global__ void
depthwise_nhwc(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias, T* __restrict__ y,
               int has_bias, const T* __restrict__ residual, int has_residual, int activation,
               int N, int C, int H, int W, int K, int Ho, int Wo, int kh, int kw,
               int sh, int sw, int pt, int pl, int dh, int dw, int groups) {
    static_assert(KW != 0 || PIX == 1, "the per-pixel way computes one pixel per thread");
    static_assert(KW >= 0 || SW == 1, "run-time widths: column stride 1");
    static_assert(ROWS == 1 || KW > 0, "walks down rows: compiled kernel widths");
    static_assert(!STAGED || (ROWS > 1 && VEC * sizeof(T) % 8 == 0),
                  "staged: walks, a vector's taps whole 8-byte pieces");
    using Acc = typename accumulator<T>::type;
    using Vec = Pack<T, VEC>;
    const int vectors = C / VEC;
    const int runs = (Wo + PIX - 1) / PIX;  // runs of PIX output pixels per row
    const Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;
    const bool active = i < static_cast<Index>(N) * ((Ho + ROWS - 1) / ROWS) * runs * vectors;
    const Index run = i / vectors;
    const int c0 = static_cast<int>(i - run * vectors) * VEC;
    const int ow0 = static_cast<int>(run % runs) * PIX;
    const int row_groups = (Ho + ROWS - 1) / ROWS;
    const Index nh = run / runs;
    const int oh = static_cast<int>(nh % row_groups) * ROWS;
    const Index n = nh / row_groups;
    const int ih0 = oh * sh - pt;
    const T* x_image = x + n * H * W * C + c0;
    // A run's input columns in one row from column iw0 (compiled widths), loaded before any is used: COLS loads
    // in flight at once (zeros where a column falls in the padding).
    constexpr int COLS = KW > 0 ? (PIX - 1) * SW + KW : 1;
    auto load_columns = [&](const T* x_row, int iw0, Vec (&xs)[COLS]) {
#pragma unroll
        for (int col = 0; col < COLS; ++col) {
            const int iw = iw0 + col;
            xs[col] = static_cast<unsigned>(iw) < static_cast<unsigned>(W)
                          ? *reinterpret_cast<const Vec*>(x_row + static_cast<Index>(iw) * C) : Vec{};
        }
    };

    constexpr int TAPS = KW * KW;  // a walk's square kernel (STAGED)
    // STAGED: a walk's first EARLY_ROWS input rows, loaded while the weight's copies land (zeros in the padding).
    // Two: all four rows of a 3x3 walk down 2 rows ran slower (more registers) on large and small planes alike.
    constexpr int EARLY_ROWS = STAGED ? 2 : 1;
    Vec early[EARLY_ROWS][COLS];
    extern __shared__ __align__(16) unsigned char staged_weight[];
    int slot = 0;  // STAGED: the row of staged_weight that holds this thread's channels
    if constexpr (STAGED) {
        // In 8-byte pieces (a vector's taps are VEC KW KW 16-bit elements, VEC even), all in flight at once.
        const int block = blockDim.x;
        const bool wide = vectors >= block;
        const int v_first = wide ? static_cast<int>(static_cast<Index>(blockIdx.x) * block % vectors) : 0;
        constexpr int ROW_PIECES = VEC * TAPS * static_cast<int>(sizeof(T)) / 8;  // a vector's taps
        const int pieces = (wide ? block : vectors) * ROW_PIECES, all_pieces = vectors * ROW_PIECES;
        for (int q = threadIdx.x; q < pieces; q += block) {
            int g = v_first * ROW_PIECES + q;
            if (g >= all_pieces) g -= all_pieces;
            cp_async<8>(staged_weight + 8 * q, reinterpret_cast<const uint2*>(w) + g, true);
        }
#pragma unroll
        for (int t = 0; t < EARLY_ROWS; ++t) {
            const int ih = ih0 + t;
            if (active && static_cast<unsigned>(ih) < static_cast<unsigned>(H)) {
                load_columns(x_image + static_cast<Index>(ih) * W * C, ow0 * SW - pl, early[t]);
            }
        }
        cp_async_commit();  // wait_group waits for committed groups alone
        cp_async_wait<0>();
        __syncthreads();  // before any thread returns
        slot = wide ? static_cast<int>(threadIdx.x) : static_cast<int>(i % vectors);
    }
    if (!active) return;

    Acc sums[ROWS][PIX][VEC];
#pragma unroll
    for (int o = 0; o < ROWS; ++o)
#pragma unroll
        for (int p = 0; p < PIX; ++p)
#pragma unroll
            for (int j = 0; j < VEC; ++j) sums[o][p][j] = Acc(0);
    Acc (&acc)[PIX][VEC] = sums[0];  // the first (for ROWS 1 the only) output row
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
    } else if constexpr (KW < 0) {
        const int iw0 = ow0 - pl;
#pragma unroll 1
        for (int r = 0; r < kh; ++r) {
            const int ih = ih0 + r * dh;
            if (static_cast<unsigned>(ih) >= static_cast<unsigned>(H)) continue;
            const T* x_row = x_image + static_cast<Index>(ih) * W * C;
            const T* w_row = w + r * kw * C + c0;
            auto load_column = [&](int col, Acc (&xf)[VEC]) {  // zeros where it falls in the padding
                const int iw = iw0 + col;
                const Vec v = static_cast<unsigned>(iw) < static_cast<unsigned>(W)
                                  ? *reinterpret_cast<const Vec*>(x_row + static_cast<Index>(iw) * C) : Vec{};
                widen(xf, v.v);
            };
            Acc window[PIX][VEC];
#pragma unroll
            for (int m = 0; m < PIX; ++m) load_column(m, window[m]);
            for_each_rotated_tap<PIX>(kw, [&](int s, int u) {
                const Vec wv = *reinterpret_cast<const Vec*>(w_row + s * C);
                Acc wf[VEC];
                widen(wf, wv.v);
#pragma unroll
                for (int p = 0; p < PIX; ++p)
#pragma unroll
                    for (int j = 0; j < VEC; ++j) acc[p][j] += window[(u + p) % PIX][j] * wf[j];
                if (s + 1 < kw) load_column(s + PIX, window[u]);
            });
        }
    } else if constexpr (ROWS > 1) {
        // The weights of tap `tap` of this thread's channels, widened: from the staged rows or a prepared
        // [kh kw][C] vector.
        auto tap_weights = [&](int tap, Acc (&wf)[VEC]) {
            if constexpr (STAGED) {
                const T* row = reinterpret_cast<const T*>(staged_weight) + slot * VEC * TAPS + tap;
#pragma unroll
                for (int j = 0; j < VEC; ++j) wf[j] = to_acc<Acc>(row[j * TAPS]);
            } else {
                const Vec wv = *reinterpret_cast<const Vec*>(w + tap * C + c0);
                widen(wf, wv.v);
            }
        };
        const int iw0 = ow0 * SW - pl;
#pragma unroll
        for (int t = 0; t < (ROWS - 1) * SW + KW; ++t) {
            const int ih = ih0 + t;
            if (static_cast<unsigned>(ih) >= static_cast<unsigned>(H)) continue;
            Vec xs[COLS];
            if (STAGED && t < EARLY_ROWS) {
#pragma unroll
                for (int col = 0; col < COLS; ++col) xs[col] = early[t < EARLY_ROWS ? t : 0][col];
            } else {
                load_columns(x_image + static_cast<Index>(ih) * W * C, iw0, xs);
            }
            Acc xf[COLS][VEC];
#pragma unroll
            for (int col = 0; col < COLS; ++col) widen(xf[col], xs[col].v);
#pragma unroll
            for (int o = 0; o < ROWS; ++o) {
                const int r = t - o * SW;  // the kernel row input row t is for output row o (compile-time)
                if (r < 0 || r >= KW) continue;
#pragma unroll
                for (int s = 0; s < KW; ++s) {
                    Acc wf[VEC];
                    tap_weights(r * KW + s, wf);
#pragma unroll
                    for (int p = 0; p < PIX; ++p)
#pragma unroll
                        for (int j = 0; j < VEC; ++j) sums[o][p][j] += xf[p * SW + s][j] * wf[j];
                }
            }
        }
    } else {
        const int iw0 = ow0 * SW - pl;
#pragma unroll 1
        for (int r = 0; r < kh; ++r) {
            const int ih = ih0 + r * dh;
            if (static_cast<unsigned>(ih) >= static_cast<unsigned>(H)) continue;
            Acc wr[KW][VEC];  // the row's weights, widened once for the run's PIX pixels
#pragma unroll
            for (int s = 0; s < KW; ++s) {
                const Vec wv = *reinterpret_cast<const Vec*>(w + (r * KW + s) * C + c0);
                widen(wr[s], wv.v);
            }
            Vec xs[COLS];
            load_columns(x_image + static_cast<Index>(ih) * W * C, iw0, xs);
#pragma unroll
            for (int col = 0; col < COLS; ++col) {
                Acc xf[VEC];
                widen(xf, xs[col].v);
#pragma unroll
                for (int p = 0; p < PIX; ++p) {
                    const int s = col - p * SW;  // the tap of pixel p this column is (compile-time)
                    if (s >= 0 && s < KW) {
#pragma unroll
                        for (int j = 0; j < VEC; ++j) acc[p][j] += xf[j] * wr[s][j];
                    }
                }
            }
        }
    }
    if (has_bias) {  // element by element: the caller's bias need not be aligned to a vector
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
            const Acc b = to_acc<Acc>(bias[c0 + j]);
#pragma unroll
            for (int o = 0; o < ROWS; ++o)
#pragma unroll
                for (int p = 0; p < PIX; ++p) sums[o][p][j] += b;
        }
    }
    const int pixels = Wo - ow0;  // of the run's PIX, those inside the row
    with_epilogue<T>(residual, [&](auto finish) {
#pragma unroll
        for (int o = 0; o < ROWS; ++o) {
            if (oh + o >= Ho) continue;
            const Index o0 = ((n * Ho + oh + o) * Wo + ow0) * C + c0;
#pragma unroll
            for (int p = 0; p < PIX; ++p) {
                if (p >= pixels) continue;
                Vec out;
                const Index at = o0 + static_cast<Index>(p) * C;
#pragma unroll
                for (int j = 0; j < VEC; ++j) out.v[j] = finish(sums[o][p][j], at + j);
                *reinterpret_cast<Vec*>(y + at) = out;
            }
        }
    });
}

}  // namespace cupyconv
