// The weight gradient of a depthwise convolution (one input channel per group; K = m C with a
// channel multiplier m): dW[k][r][s] = sum over n, p, q of dy[n][k][p][q] x[n][k / m][p sh + r dh - pt][q sw + s dw - pl].
//
// A GEMM of 1 x kh kw per channel wastes the tiles of wgrad_gemm.cu, so here each thread keeps the
// KH x KW sums of its channels in registers and walks output pixels, a memory-bound kernel. A lane
// takes segments of output pixels along one axis of the plane (the walk) and steps TQ pixels at a
// time: it loads dy's TQ pixels and, for each tap along the other axis (across), the span of input
// positions along the walk that the TQ windows cover, once (at stride 1, 6 for 4 pixels of a 3x3
// window, against 12 a pixel at a time), widens each once and multiplies from registers; a step's
// loads are all issued before its FMAs.
//   NHWC (wgrad_depthwise_nhwc)  the walk runs along output rows (q), across is the taps' rows.
//        block = `across` lanes of V consecutive channels (grid x) x 256 / across row lanes; loads
//        are V channels (8 bytes at most) of one pixel, so a warp reads whole rows of channels.
//   NCHW (wgrad_depthwise)       the walk runs down output columns (p), across is the taps'
//        columns. block = one channel k and `across` consecutive output columns (grid x: channel,
//        column tile) x 256 / across lanes; a warp reads consecutive elements of a row. Where rows
//        have even lengths and the walks along both axes are the same compiled one, a lane takes two
//        output columns and loads pairs of elements (ColumnPairs): twice the bytes a load, and 16-bit
//        lanes no longer load one 2-byte element at a time.
// Grid y: runs of the reduction (segments; a partition fixed by the problem). Each block adds its
// lanes' sums in a fixed order (NCHW: a tree; NHWC: lane 0, 1, ...) and writes ws[run][k][tap]
// (NCHW: ws[run][column tile][k][tap]) in the accumulator type; wgrad_reduce (wgrad_gemm.cu) adds the
// runs in order and rounds once: the same bits on every run. An NCHW grid of one run and one column
// tile writes the weight gradient (dw_out) directly.
#include "dtypes.cuh"

namespace cupyconv {

// Two blocks per SM asked of the register allocator (at most 128 registers a thread) for float sums:
// without it ptxas gave the 7x7 instances 80 registers and spilled. One for double's 49 sums of two
// registers each, and for the NCHW walk of 7x7 windows (its loop-invariant column taps let ptxas
// overlap steps: 168 registers, spilling at 128).
template <typename T, int TAPS = 9, bool NCHW = false> constexpr int wgrad_depthwise_min_blocks() {
    return sizeof(typename accumulator<T>::type) == 8 || (NCHW && TAPS > 25) ? 1 : 2;
}

// What a lane reads across the walk, one kind of load at a time (LOADS a step's position along the
// walk, WIDTH elements each), and where each tap across s and each of WIDTH dy values v takes its input:
// element(s, v) of the loads laid end to end; its product adds to sum(v) of the tap's sums (SUMS a tap).
//   TapsAcross   a load per tap across, of V consecutive channels (NHWC) or one element (NCHW); a sum per
//                tap and channel.
//   ColumnPairs  NCHW lanes of two output columns (q, q + 1), dy's pair in one word: their windows' input
//                columns from q SC - pl on, loaded as the aligned pairs that cover them (ODD: pl is odd,
//                so the first column is the second of its pair); one sum a tap for both columns.
template <int KC, int V> struct TapsAcross {
    static constexpr int TAPS = KC, LOADS = KC, WIDTH = V, SUMS = V;
    static constexpr int element(int s, int v) { return s * V + v; }
    static constexpr int sum(int v) { return v; }
    // Pixels a step at most: 4 at stride 1, 8 for one element a thread; 2 at stride 2; 1 at run time.
    static constexpr int most(int sa) { return sa == 1 ? (V == 1 ? 8 : 4) : sa == 2 ? 2 : 1; }
};
template <int KC, int SC, int DC, int ODD> struct ColumnPairs {
    static_assert(SC > 0 && (ODD == 0 || ODD == 1), "pairs of columns: the columns' stride compiled");
    static constexpr int TAPS = KC, LOADS = (ODD + SC + (KC - 1) * DC) / 2 + 1, WIDTH = 2, SUMS = 1;
    static constexpr int element(int s, int v) { return ODD + v * SC + s * DC; }
    static constexpr int sum(int) { return 0; }
    static constexpr int most(int sa) { return sa == 1 ? 8 : sa == 2 ? 4 : 1; }
};

// A step's shape: TQ output pixels along the walk, the input positions along the walk they read for
// each load across (SPAN: the span their windows cover where the walk's stride SA and dilation DA are
// compiled, each pixel's taps at run time), loaded BATCH loads across at a time before any is
// multiplied. Across::most pixels, halved until the loads across fit the register budget beside the
// sums (down to 1), and as many loads across a batch as then fit: at two blocks of 256 threads an SM
// (128 registers), about 32 go to addresses and counters.
template <typename T, int KA, class Across, int SA, int DA> struct WgradStep {
    static constexpr int KC = Across::TAPS, WIDTH = Across::WIDTH, LOADS = Across::LOADS;
    static constexpr int ACC_REGS = sizeof(typename accumulator<T>::type) / 4;
    static constexpr int WORD_REGS = (WIDTH * sizeof(T) + 3) / 4;  // a load's registers as loaded
    // Budgets that ptxas's reports bear out (no spills at 128 registers): 112 for 3x3 windows (their
    // 4-pixel steps estimate 112 and were fastest on the H100: benchmarks/NOTES.md), 80 for larger
    // ones (5x5 at 112 spilled), 60 for one element a thread (a register per 16-bit value; 5x5
    // steps estimating 63 and 69 spilled on sm_80).
    static constexpr int BUDGET = ACC_REGS == 2 ? 200 : WIDTH == 1 ? 60 : KC * KA <= 9 ? 112 : 80;
    static constexpr int span(int tq) { return SA > 0 ? (tq - 1) * SA + (KA - 1) * DA + 1 : tq * KA; }
    static constexpr int registers(int tq, int batch) {  // sums, dy, one load widened, loaded positions
        return (KC * KA * Across::SUMS + tq * WIDTH + span(tq) * WIDTH) * ACC_REGS + batch * span(tq) * WORD_REGS;
    }
    static constexpr int fewer(int tq) { return tq <= 1 || registers(tq, LOADS) <= BUDGET ? tq : fewer(tq / 2); }
    static constexpr int TQ = fewer(Across::most(SA));
    static constexpr int batch_fitting(int batch) {
        return batch <= 1 || registers(TQ, batch) <= BUDGET ? batch : batch_fitting(batch - 1);
    }
    static constexpr int BATCH = batch_fitting(LOADS);
    static constexpr int SPAN = span(TQ);
};

// One step of a lane's walk: TQ output pixels from dy at `dy_at`, dy_pitch elements apart (`valid`
// of them inside the segment), against the input at `x_at`, the first load's first position:
// positions along the walk walk_pitch elements apart (`a0` the first's coordinate, inside
// [0, walk_extent)), loads across cross_pitch apart (bit b of `cross_inside`: load b inside the image).
// Sums go to acc[tap][Across::sum(v)] with tap = r KW + s: r is the tap across where CROSS_ROWS (NHWC),
// the walk's otherwise.
template <typename T, int KA, class Across, int SA, int DA, bool CROSS_ROWS>
__device__ __forceinline__ void wgrad_walk_step(typename accumulator<T>::type (&acc)[KA * Across::TAPS][Across::SUMS],
                                                const T* dy_at, int dy_pitch, int valid, const T* x_at, int walk_pitch,
                                                long long cross_pitch, unsigned cross_inside, int a0, int walk_extent,
                                                int sa, int da) {
    using Acc = typename accumulator<T>::type;
    using Step = WgradStep<T, KA, Across, SA, DA>;
    constexpr int KC = Across::TAPS, V = Across::WIDTH, LOADS = Across::LOADS;
    using Load = Pack<T, V>;
    constexpr int TQ = Step::TQ, SPAN = Step::SPAN, BATCH = Step::BATCH;
    // The step's loads first, BATCH loads across at a time, those outside the image predicated off load
    // by load rather than branched around, so that they are in flight at once; then the widening and
    // the FMAs.
    Load dy_raw[TQ];
#pragma unroll
    for (int j = 0; j < TQ; ++j) dy_raw[j] = load_or_zero(reinterpret_cast<const Load*>(dy_at + j * dy_pitch), j < valid);
    Acc g[TQ][V];
    const T* batch_at = x_at;  // the batch's first load across
#pragma unroll
    for (int first = 0; first < LOADS; first += BATCH, batch_at += BATCH * cross_pitch) {
        if (first == 0) {  // widened here, not before the loop, so as not to wait on dy before x's loads
#pragma unroll
            for (int j = 0; j < TQ; ++j) widen(g[j], dy_raw[j].v);
        }
        // A batch all outside the image is branched around: the branch also keeps the compiler from
        // hoisting the next batch's loads into this one's registers.
        if (!(cross_inside >> first & ((1u << BATCH) - 1u))) continue;
        Load x_raw[BATCH][SPAN];
        const T* load_at = batch_at;
#pragma unroll
        for (int b = 0; b < BATCH && first + b < LOADS; ++b, load_at += cross_pitch) {
#pragma unroll
            for (int i = 0; i < SPAN; ++i) {
                // Compiled walks: the span's position i; at run time: pixel i / KA's tap i % KA.
                const int at = SA > 0 ? i : i / KA * sa + i % KA * da;
                x_raw[b][i] = load_or_zero(reinterpret_cast<const Load*>(load_at + at * walk_pitch),
                                           (cross_inside >> (first + b) & 1u) &&
                                               static_cast<unsigned>(a0 + at) < static_cast<unsigned>(walk_extent));
            }
        }
#pragma unroll
        for (int b = 0; b < BATCH && first + b < LOADS; ++b) {
            Acc xs[SPAN][V];
#pragma unroll
            for (int i = 0; i < SPAN; ++i) widen(xs[i], x_raw[b][i].v);
#pragma unroll
            for (int j = 0; j < TQ; ++j)
#pragma unroll
                for (int a = 0; a < KA; ++a)
#pragma unroll
                    for (int s = 0; s < KC; ++s)
#pragma unroll
                        for (int v = 0; v < V; ++v) {
                            const int e = Across::element(s, v);
                            if (e / V != first + b) continue;  // resolved at compile time: unrolled
                            const int tap = CROSS_ROWS ? s * KA + a : a * KC + s;
                            acc[tap][Across::sum(v)] += g[j][v] * xs[SA > 0 ? j * SA + a * DA : j * KA + a][e % V];
                        }
        }
    }
}

// NCHW: lanes of a block's output columns walk segments of output columns (n, p0 .. p1) down the
// rows (see the top of the file). SH and DH are the row stride and dilation, compiled so that a step's
// span of input rows is loaded once; SH = 0 takes them (sh, dh) at run time. PAIR_ODD < 0: a lane
// takes one output column, a load per tap column; PAIR_ODD 0 or 1 (pl's parity): a lane takes two,
// loaded as pairs (ColumnPairs), the columns' stride and dilation those of the rows (W and Wo even).
template <int KW, int SC, int DC, int PAIR_ODD> struct NchwAcross {
    using type = ColumnPairs<KW, SC, DC, PAIR_ODD>;
};
template <int KW, int SC, int DC> struct NchwAcross<KW, SC, DC, -1> {
    using type = TapsAcross<KW, 1>;
};

template <typename T, int KH, int KW, int SH, int DH, int PAIR_ODD>
__global__ void __launch_bounds__(256, wgrad_depthwise_min_blocks<T, KH * KW, true>())
wgrad_depthwise(const T* __restrict__ x, const T* __restrict__ dy, typename accumulator<T>::type* __restrict__ ws,
                T* __restrict__ dw_out, int N, int C, int H, int W, int K, int Ho, int Wo, int sh, int sw, int pt, int pl, int dh, int dw,
                int across, int segment) {
    using Acc = typename accumulator<T>::type;
    using Across = typename NchwAcross<KW, SH, DH, PAIR_ODD>::type;
    constexpr int TAPS = KH * KW, TQ = WgradStep<T, KH, Across, SH, DH>::TQ, COLUMNS = Across::WIDTH;
    static_assert(SH > 0 || DH == 0, "row stride and dilation: both compiled or both at run time");
    __shared__ Acc sums[256];
    const int tiles = (Wo + across * COLUMNS - 1) / (across * COLUMNS);  // column tiles
    const int k = blockIdx.x / tiles, tile = blockIdx.x - k * tiles, c = k / (K / C);
    const int LANES = 256 / across;
    const int tid = threadIdx.x, lane = tid / across, q = (tile * across + tid % across) * COLUMNS;
    const bool active = q < Wo && lane < LANES;
    const int segments = (Ho + segment - 1) / segment;  // a column's
    const long long items = static_cast<long long>(N) * segments;
    const long long begin = items * blockIdx.y / gridDim.y, end = items * (blockIdx.y + 1) / gridDim.y;
    Acc acc[TAPS][1];
#pragma unroll
    for (int t = 0; t < TAPS; ++t) acc[t][0] = Acc(0);
    const int row_stride = SH > 0 ? SH : sh;
    // The first load's input column and the columns between loads: the first window's first tap and
    // the tap columns; for pairs the even column before it, and the next pair.
    const int iw0 = q * (PAIR_ODD < 0 ? sw : SH) - pl - (PAIR_ODD < 0 ? 0 : PAIR_ODD);
    const int load_pitch = PAIR_ODD < 0 ? dw : 2;
    unsigned cols_inside = 0;  // bit b: load b's columns lie in the image (a pair all in or all out)
#pragma unroll
    for (int b = 0; b < Across::LOADS; ++b)
        cols_inside |= static_cast<unsigned>(static_cast<unsigned>(iw0 + b * load_pitch) < static_cast<unsigned>(W)) << b;
    for (long long item = begin + lane; active && item < end; item += LANES) {
        const int n = static_cast<int>(item / segments);
        const int p0 = static_cast<int>(item - static_cast<long long>(n) * segments) * segment, p1 = min(Ho, p0 + segment);
        int ih0 = p0 * row_stride - pt;
        const T* dy_at = dy + ((static_cast<long long>(n) * K + k) * Ho + p0) * Wo + q;
        // The step's first load's top row (outside the image where padded; only read inside).
        const T* x_at = x + ((static_cast<long long>(n) * C + c) * H + ih0) * W + iw0;
        for (int p = p0; p < p1; p += TQ, ih0 += TQ * row_stride, dy_at += TQ * Wo, x_at += TQ * row_stride * W)
            wgrad_walk_step<T, KH, Across, SH, DH, false>(acc, dy_at, Wo, p1 - p, x_at, W, load_pitch, cols_inside,
                                                          ih0, H, sh, dh);
    }
    // The 256 threads' sums, tap by tap, in a fixed tree order. A block that is the whole reduction of
    // its channel (one run, one column tile) writes the weight gradient itself, rounded once as
    // wgrad_reduce would, and the call has no second launch.
    const bool whole = gridDim.y == 1 && tiles == 1;
    Acc* out = ws + (static_cast<long long>(blockIdx.y) * tiles + tile) * K * TAPS;
#pragma unroll
    for (int t = 0; t < TAPS; ++t) {
        sums[tid] = acc[t][0];
        __syncthreads();
        for (int half = 128; half > 0; half /= 2) {
            if (tid < half) sums[tid] += sums[tid + half];
            __syncthreads();
        }
        if (tid == 0) {
            if (whole) dw_out[static_cast<long long>(k) * TAPS + t] = from_acc<T>(sums[0]);
            else out[static_cast<long long>(k) * TAPS + t] = sums[0];
        }
        __syncthreads();
    }
}

// NHWC: row lanes walk segments of output rows (n, p, q0 .. q1) (see the top of the file). SW and DW
// are the column stride and dilation, compiled so that a step's span of input columns is loaded once;
// SW = 0 takes them (sw, dw) at run time.
template <typename T, int KH, int KW, int V, int SW, int DW>
__global__ void __launch_bounds__(256, wgrad_depthwise_min_blocks<T>())
wgrad_depthwise_nhwc(const T* __restrict__ x, const T* __restrict__ dy, typename accumulator<T>::type* __restrict__ ws,
                     int N, int C, int H, int W, int K, int Ho, int Wo, int sh, int sw, int pt, int pl, int dh, int dw,
                     int across, int segment) {
    using Acc = typename accumulator<T>::type;
    constexpr int TAPS = KH * KW, TQ = WgradStep<T, KW, TapsAcross<KH, V>, SW, DW>::TQ;
    static_assert(SW > 0 || DW == 0, "column stride and dilation: both compiled or both at run time");
    __shared__ Acc sums[256 * V];
    const int vectors = across, LANES = 256 / vectors;  // row lanes
    const int tid = threadIdx.x, lane = tid / vectors;
    const int k = (blockIdx.x * vectors + tid % vectors) * V;  // the first of V channels
    const bool active = k < K && lane < LANES;  // all V of them (K is a multiple of V)
    const int c = (active ? k : 0) / (K / C);
    const int segments = (Wo + segment - 1) / segment;  // a row's
    const long long items = static_cast<long long>(N) * Ho * segments;
    const long long begin = items * blockIdx.y / gridDim.y, end = items * (blockIdx.y + 1) / gridDim.y;
    Acc acc[TAPS][V];
#pragma unroll
    for (int t = 0; t < TAPS; ++t)
#pragma unroll
        for (int v = 0; v < V; ++v) acc[t][v] = Acc(0);
    // Addresses advance by pointer steps and 32-bit offsets: a 64-bit product per load cost more
    // instructions than the load's conversions and FMAs together.
    const long long tap_row_pitch = static_cast<long long>(dh) * W * C;  // elements between tap rows
    const int col_stride = SW > 0 ? SW : sw;
    for (long long item = begin + lane; active && item < end; item += LANES) {
        const long long row = item / segments;  // n Ho + p
        const int n = static_cast<int>(row / Ho), p = static_cast<int>(row - static_cast<long long>(n) * Ho);
        const int q0 = static_cast<int>(item - row * segments) * segment, q1 = min(Wo, q0 + segment);
        const int ih0 = p * sh - pt;
        int iw0 = q0 * col_stride - pl;
        unsigned rows_inside = 0;  // bit r: tap row r lies in the image
#pragma unroll
        for (int r = 0; r < KH; ++r)
            rows_inside |= static_cast<unsigned>(static_cast<unsigned>(ih0 + r * dh) < static_cast<unsigned>(H)) << r;
        const T* dy_at = dy + (row * Wo + q0) * K + k;
        // The step's first window's top-left tap (outside the image where padded; only read inside).
        const T* x_at = x + ((static_cast<long long>(n) * H + ih0) * W + iw0) * C + c;
        for (int qc = q0; qc < q1; qc += TQ, iw0 += TQ * col_stride, dy_at += TQ * K, x_at += TQ * col_stride * C)
            wgrad_walk_step<T, KW, TapsAcross<KH, V>, SW, DW, true>(acc, dy_at, K, q1 - qc, x_at, C, tap_row_pitch,
                                                                    rows_inside, iw0, W, sw, dw);
    }
    // The row lanes' sums, tap by tap: staged as [row lane][vectors V channels], then each of the
    // block's channels added over the lanes in order by one thread.
    Acc* out = ws + static_cast<long long>(blockIdx.y) * K * TAPS;
    const int first = blockIdx.x * vectors * V, width = vectors * V;
#pragma unroll  // the sums stay in registers only where every index is a constant
    for (int t = 0; t < TAPS; ++t) {
        if (lane < LANES) {
#pragma unroll
            for (int v = 0; v < V; ++v) sums[lane * width + (tid % vectors) * V + v] = acc[t][v];
        }
        __syncthreads();
        for (int o = tid; o < width; o += 256) {
            Acc sum = sums[o];
            for (int row_lane = 1; row_lane < LANES; ++row_lane) sum += sums[row_lane * width + o];
            if (first + o < K) out[static_cast<long long>(first + o) * TAPS + t] = sum;
        }
        __syncthreads();
    }
}

}  // namespace cupyconv
