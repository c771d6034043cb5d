// The weight gradient of conv2d (torch.nn.grad.conv2d_weight) as an implicit GEMM on the FMA units,
// deterministic: no atomics, the same bits on every run.
//
// Per group g the gradient is the GEMM  dW_g[m][j] = sum_l A[m][l] B[l][j]  with
//   m = output channel of g                                          Kg = K / groups
//   j = (c, r, s): input channel of g and kernel tap                  J  = Cg kh kw
//   l = (n, p, q): image and output pixel                             L  = N Ho Wo
//   A[m][l] = dy[n][g Kg + m][p][q],  B[l][j] = x[n][g Cg + c][p sh + r dh - pt][q sw + s dw - pl]
// (zero outside the input). CHANNELS_LAST (x and dy NHWC) orders the columns j = (r, s, c) instead,
// so that the threads of a warp read consecutive channels of one pixel; the NCHW kernel puts the
// threads along l (consecutive q of a row). The workspace keeps the kernel's column order;
// wgrad_reduce writes the weight layout asked for.
//
// Levels:
//   grid    x: (j tile, m tile, group), y: run of the reduction. The reduction's l tiles are cut into
//           gridDim.y runs of whole tiles, a partition fixed by the problem alone; run s writes its
//           partial sums to ws[s][g][Kg][J] in the accumulator type, and wgrad_reduce adds the runs in
//           run order and rounds once to T.
//   block   BM x BJ outputs, l tiles of BL through two shared-memory buffers (registers prefetch the
//           next tile during the FMAs of this one; T is converted to Acc on the way to shared memory);
//           LS slices of threads each take BL / LS of a tile's l, and their sums are added in slice
//           order at the end (small tiles have too few outputs to give every thread its own TT x TT).
//   thread  TT x TT outputs, TT = 4 or 8: runs of 4 rows BM / (TT / 4) apart times runs of 4 columns
//           BJ / (TT / 4) apart, so each l costs TT / 2 float4 shared loads that a warp serves without
//           conflicts. 8 x 8 does 64 FMAs for 4 loads (4 x 4: 16 for 2), which the FMA rate needs:
//           at 4 x 4 the shared-memory loads and the global loads' arithmetic held the tile near a
//           third of it.
// Precision: each thread sums WGRAD_CHUNK products (a whole number of tiles) into an inner accumulator
// and then adds it to an outer one (blocked summation), so the rounding error grows with the chunk's
// length plus the number of chunks, slices and runs, not with L as a serial sum's does.
// Indices: Index (int, or long long where x, dy or the workspace pass 2^31 elements) for tensor offsets;
// int for a plane (H W and Ho Wo below 2^31, which the planner checks).
#include "dtypes.cuh"

namespace cupyconv {

// Products a thread adds into its inner accumulator before folding it into the outer one.
constexpr int WGRAD_CHUNK = 256;
// Shared rows are padded by 4 elements: the l-major stores of the NCHW mapping would otherwise hit one
// bank 16 ways; 4 keeps every thread's 4 outputs one 16-byte vector.
constexpr int WGRAD_PAD = 4;
// ih0 of an l past L: any tap's row is then negative, so B reads as zero.
constexpr int WGRAD_NO_ROW = -(1 << 30);

// One l of the tile being loaded: its image's offsets in x and dy, and its window's top-left corner.
template <typename Index> struct WgradPixel {
    Index x_base;   // n C H W
    Index dy_base;  // n K Ho Wo + p Wo + q (NCHW) or l K (NHWC); -1 past L
    int ih0, iw0;   // p sh - pt, q sw - pl
};

__device__ __forceinline__ float wgrad_fma(float a, float b, float c) { return fmaf(a, b, c); }
__device__ __forceinline__ double wgrad_fma(double a, double b, double c) { return fma(a, b, c); }

// Four consecutive accumulators from shared memory as 16-byte loads.
__device__ __forceinline__ void wgrad_load4(const float* p, float* v) {
    const float4 t = *reinterpret_cast<const float4*>(p);
    v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
}
__device__ __forceinline__ void wgrad_load4(const double* p, double* v) {
    const double2 t = *reinterpret_cast<const double2*>(p), u = *reinterpret_cast<const double2*>(p + 2);
    v[0] = t.x; v[1] = t.y; v[2] = u.x; v[3] = u.y;
}

// Four consecutive sums to global memory as 16-byte stores (p 16-byte aligned).
__device__ __forceinline__ void wgrad_store4(float* p, const float* v) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void wgrad_store4(double* p, const double* v) {
    *reinterpret_cast<double2*>(p) = make_double2(v[0], v[1]);
    *reinterpret_cast<double2*>(p + 2) = make_double2(v[2], v[3]);
}

// Blocks per SM asked of the register allocator: 2 (at most 128 registers a thread) for 4 x 4 thread
// tiles of float accumulators and 32-bit indices; 1 for double's (32 accumulators of two registers),
// for 64-bit indices (the NCHW 16 x 64 tile spilled at 128) and for 8 x 8 thread tiles (128
// accumulators: the inner and outer sums). Without an explicit minimum, ptxas gave some 64-bit tiles 80
// registers and spilled.
template <typename T, typename Index, int TT> __host__ __device__ constexpr int wgrad_min_blocks() {
    return sizeof(typename accumulator<T>::type) == 4 && sizeof(Index) == 4 && TT == 4 ? 2 : 1;
}

template <typename T, bool CHANNELS_LAST, typename Index, int BM, int BJ, int BL, int LS, int TT>
__global__ void __launch_bounds__((BM / TT) * (BJ / TT) * LS, wgrad_min_blocks<T, Index, TT>())
wgrad_gemm(const T* __restrict__ x, const T* __restrict__ dy, typename accumulator<T>::type* __restrict__ ws,
           int N, int C, int H, int W, int K, int Ho, int Wo, int kh, int kw, int sh, int sw, int pt, int pl,
           int dh, int dw, int groups, int splits) {
    using Acc = typename accumulator<T>::type;
    constexpr int TM = BM / TT, TJ = BJ / TT, NT = TM * TJ * LS;
    constexpr int RUNS = TT / 4, RUN_M = BM / RUNS, RUN_J = BJ / RUNS;  // a thread's runs of 4 and their spacing
    constexpr int LPS = BL / LS;                       // l of a tile per slice
    constexpr int CHUNK_TILES = WGRAD_CHUNK / LPS > 0 ? WGRAD_CHUNK / LPS : 1;
    constexpr int SA = BM + WGRAD_PAD, SB = BJ + WGRAD_PAD;  // shared row strides of A [BL][BM], B [BL][BJ]
    constexpr int STAGE = BL * (SA + SB);
    // VEC: channels a load. The 8 x 8 NHWC tile (float32; Kg and Cg multiples of 4, which the planner checks)
    // reads 4 consecutive channels of a pixel as one 16-byte load and stores them as one.
    constexpr int VEC = TT == 8 && CHANNELS_LAST ? 4 : 1;
    constexpr int A_PER = BM * BL / (NT * VEC), B_PER = BJ * BL / (NT * VEC);  // loads each thread makes per tile
    // NCHW: a thread keeps one l (tid % BL) and A_PER / B_PER rows; NHWC: one row (tid % BM or BJ) and
    // A_PER / B_PER l. Either way the per-row offsets are computed once, before the loop.
    constexpr int A_ROWS = CHANNELS_LAST ? 1 : A_PER, B_ROWS = CHANNELS_LAST ? 1 : B_PER;
    constexpr int SLICE_SUMS = LS > 1 ? LS * BM * BJ : 0;  // one slice writes from its registers
    static_assert((TT == 4 || TT == 8) && BM % TT == 0 && BJ % TT == 0 && BL % LS == 0,
                  "4 x 4 or 8 x 8 thread tiles, whole slices");
    static_assert(TT == 4 || sizeof(Acc) == 4, "8 x 8 tiles of double accumulators would not fit in registers");
    static_assert(NT % BL == 0 && NT % (BM / VEC) == 0 && NT % (BJ / VEC) == 0, "a thread keeps its l or its row");
    static_assert(A_PER >= 1 && B_PER >= 1 && A_PER * NT * VEC == BM * BL && B_PER * NT * VEC == BJ * BL,
                  "whole tiles");
    static_assert(VEC == 1 || sizeof(T) == 4, "16-byte loads of float32");

    __shared__ __align__(16) Acc smem[2 * STAGE > SLICE_SUMS ? 2 * STAGE : SLICE_SUMS];
    __shared__ WgradPixel<Index> pixels[2][BL];

    const int tid = threadIdx.x;
    const int Cg = C / groups, Kg = K / groups, taps = kh * kw, J = Cg * taps;
    const int j_tiles = (J + BJ - 1) / BJ, m_tiles = (Kg + BM - 1) / BM;
    const int tile_j = blockIdx.x % j_tiles, tile_m = blockIdx.x / j_tiles % m_tiles;
    const int g = blockIdx.x / j_tiles / m_tiles, split = blockIdx.y;
    const int m0 = tile_m * BM, j0 = tile_j * BJ;
    const Index HoWo = static_cast<Index>(Ho) * Wo, L = static_cast<Index>(N) * HoWo;
    const Index HW = static_cast<Index>(H) * W, CHW = C * HW;
    // This run's l tiles: [all s / splits, all (s + 1) / splits), balanced and fixed by the problem.
    const long long all_tiles = (static_cast<long long>(L) + BL - 1) / BL;
    const Index tile_begin = static_cast<Index>(all_tiles * split / splits);
    const Index n_tiles = static_cast<Index>(all_tiles * (split + 1) / splits) - tile_begin;

    auto pixel_of = [&](Index tile, int i) {
        WgradPixel<Index> px;
        const Index l = tile * BL + i;
        if (l < L) {
            const Index n = l / HoWo;
            const int pq = static_cast<int>(l - n * HoWo), p = pq / Wo, q = pq - p * Wo;
            px.x_base = n * CHW;
            px.dy_base = CHANNELS_LAST ? l * K : n * K * HoWo + pq;
            px.ih0 = p * sh - pt;
            px.iw0 = q * sw - pl;
        } else {
            px.x_base = 0;
            px.dy_base = -1;
            px.ih0 = WGRAD_NO_ROW;
            px.iw0 = 0;
        }
        return px;
    };

    // --- Loader: (first) row and l of each load a thread makes (rows within the tile, l within the tile).
    constexpr int A_LINE = BM / VEC, B_LINE = BJ / VEC;  // NHWC: the threads along a tile's row
    auto a_row = [&](int i) { return CHANNELS_LAST ? tid % A_LINE * VEC : tid / BL + (NT / BL) * i; };
    auto a_l = [&](int i) { return CHANNELS_LAST ? tid / A_LINE + (NT / A_LINE) * i : tid % BL; };
    auto b_row = [&](int i) { return CHANNELS_LAST ? tid % B_LINE * VEC : tid / BL + (NT / BL) * i; };
    auto b_l = [&](int i) { return CHANNELS_LAST ? tid / B_LINE + (NT / B_LINE) * i : tid % BL; };
    // Rows past Kg or J read rows Kg - VEC or J - VEC on (a legal address); their outputs are never written.
    Index a_off[A_ROWS];              // dy offset of channel g Kg + m, less the pixel's
    int b_chan[B_ROWS];               // channel g Cg + c of x (an int: 8 NCHW rows of 64-bit offsets spilled)
    int b_r[B_ROWS], b_s[B_ROWS];     // r dh, s dw
#pragma unroll
    for (int i = 0; i < A_ROWS; ++i) {
        const int m = g * Kg + min(m0 + a_row(i), Kg - VEC);
        a_off[i] = CHANNELS_LAST ? static_cast<Index>(m) : m * HoWo;
    }
#pragma unroll
    for (int i = 0; i < B_ROWS; ++i) {
        const int j = min(j0 + b_row(i), J - VEC);
        const int c = CHANNELS_LAST ? j % Cg : j / taps, tap = CHANNELS_LAST ? j / Cg : j % taps;
        const int r = tap / kw, s = tap - r * kw;
        b_chan[i] = g * Cg + c;
        b_r[i] = r * dh;
        b_s[i] = s * dw;
    }

    Acc a_reg[A_PER][VEC], b_reg[B_PER][VEC];
    auto fetch = [&](const T* src, bool ok, Acc (&v)[VEC]) {  // VEC channels from src, zeros where not ok
        if constexpr (VEC == 4) {
            const float4 f = ok ? *reinterpret_cast<const float4*>(src) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            v[0] = f.x; v[1] = f.y; v[2] = f.z; v[3] = f.w;
        } else {
            v[0] = ok ? to_acc<Acc>(*src) : Acc(0);
        }
    };
    auto load = [&](int buf) {  // the tile pixels[buf] describes, into registers
#pragma unroll
        for (int i = 0; i < A_PER; ++i) {
            const Index base = pixels[buf][a_l(i)].dy_base;
            fetch(dy + (base >= 0 ? base + a_off[CHANNELS_LAST ? 0 : i] : Index(0)), base >= 0, a_reg[i]);
        }
#pragma unroll
        for (int i = 0; i < B_PER; ++i) {
            const WgradPixel<Index> px = pixels[buf][b_l(i)];
            const int ri = CHANNELS_LAST ? 0 : i;
            const int ih = px.ih0 + b_r[ri], iw = px.iw0 + b_s[ri];
            const bool ok = static_cast<unsigned>(ih) < static_cast<unsigned>(H) &&
                            static_cast<unsigned>(iw) < static_cast<unsigned>(W);
            const Index pixel = ok ? static_cast<Index>(ih * W + iw) : Index(0), chan = b_chan[ri];
            const Index at = ok ? px.x_base + (CHANNELS_LAST ? pixel * C + chan : chan * HW + pixel) : Index(0);
            fetch(x + at, ok, b_reg[i]);
        }
    };
    auto put = [&](Acc* dst, const Acc (&v)[VEC]) {
        if constexpr (VEC == 4)
            *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
        else
            *dst = v[0];
    };
    auto store = [&](int stage) {
        Acc* a_smem = smem + stage * STAGE;
        Acc* b_smem = a_smem + BL * SA;
#pragma unroll
        for (int i = 0; i < A_PER; ++i) put(a_smem + a_l(i) * SA + a_row(i), a_reg[i]);
#pragma unroll
        for (int i = 0; i < B_PER; ++i) put(b_smem + b_l(i) * SB + b_row(i), b_reg[i]);
    };

    // --- Thread tile: slice `slice` takes l [slice LPS, (slice + 1) LPS) of each tile; outputs
    // m0 + tm 4 + RUN_M u + {0..3} x j0 + tj 4 + RUN_J v + {0..3} for runs u, v < RUNS (tm fastest: a
    // warp's A loads are distinct vectors).
    const int slice = tid / (TM * TJ), tm = tid % TM, tj = tid / TM % TJ;
    auto row_of = [&](int i) { return i / 4 * RUN_M + tm * 4 + i % 4; };  // of the tile, for output row i < TT
    auto col_of = [&](int j) { return j / 4 * RUN_J + tj * 4 + j % 4; };
    Acc outer[TT][TT], inner[TT][TT];
#pragma unroll
    for (int i = 0; i < TT; ++i)
#pragma unroll
        for (int j = 0; j < TT; ++j) outer[i][j] = inner[i][j] = Acc(0);

    auto compute = [&](int stage) {
        const Acc* a_smem = smem + stage * STAGE + slice * LPS * SA + tm * 4;
        const Acc* b_smem = smem + stage * STAGE + BL * SA + slice * LPS * SB + tj * 4;
#pragma unroll
        for (int l = 0; l < LPS; ++l) {
            Acc a[TT], b[TT];
#pragma unroll
            for (int u = 0; u < RUNS; ++u) {
                wgrad_load4(a_smem + l * SA + u * RUN_M, a + 4 * u);
                wgrad_load4(b_smem + l * SB + u * RUN_J, b + 4 * u);
            }
#pragma unroll
            for (int i = 0; i < TT; ++i)
#pragma unroll
                for (int j = 0; j < TT; ++j) inner[i][j] = wgrad_fma(a[i], b[j], inner[i][j]);
        }
    };
    auto fold = [&]() {
#pragma unroll
        for (int i = 0; i < TT; ++i)
#pragma unroll
            for (int j = 0; j < TT; ++j) {
                outer[i][j] += inner[i][j];
                inner[i][j] = Acc(0);
            }
    };

    // --- Main loop, one barrier per tile. In iteration t: registers load tile t + 1 (pixels[t + 1 & 1],
    // written in iteration t - 1), the first BL threads describe tile t + 2 in pixels[t & 1] (whose
    // tile t was loaded in iteration t - 1), everyone computes tile t from stage t & 1, and the
    // registers go to the other stage (last read in iteration t - 1).
    if (tid < BL) {
        pixels[0][tid] = pixel_of(tile_begin, tid);
        pixels[1][tid] = pixel_of(tile_begin + 1, tid);
    }
    __syncthreads();
    if (n_tiles > 0) {
        load(0);
        store(0);
    }
    __syncthreads();
    int chunk_tiles = 0;
#pragma unroll 1
    for (Index t = 0; t < n_tiles; ++t) {
        const int cur = static_cast<int>(t & 1);
        if (t + 1 < n_tiles) load(cur ^ 1);
        if (tid < BL) pixels[cur][tid] = pixel_of(tile_begin + t + 2, tid);
        compute(cur);
        if (++chunk_tiles == CHUNK_TILES) {
            fold();
            chunk_tiles = 0;
        }
        if (t + 1 < n_tiles) store(cur ^ 1);
        __syncthreads();
    }
    fold();

    Acc* ws_run = ws + (static_cast<Index>(split) * K + g * Kg) * J;  // [Kg][J] of run `split`, group g
    if constexpr (LS == 1) {  // no slices to add: straight from the registers, 4 columns a store where
                              // rows are whole 16-byte pieces
        const bool vector = J % 4 == 0;
#pragma unroll
        for (int i = 0; i < TT; ++i) {
            const int m = m0 + row_of(i);
            if (m >= Kg) continue;
            Acc* row = ws_run + static_cast<Index>(m) * J;
#pragma unroll
            for (int u = 0; u < RUNS; ++u) {
                const int col = j0 + col_of(4 * u);
                if (vector && col < J) {
                    wgrad_store4(row + col, outer[i] + 4 * u);
                    continue;
                }
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    if (col + j < J) row[col + j] = outer[i][4 * u + j];
            }
        }
        return;
    }
    // --- The slices' sums, added in slice order through shared memory (the stages are free after the
    // last barrier), then written to this run's workspace tile row by row (coalesced along j).
    Acc* sums = smem;  // [LS][BM][BJ]
#pragma unroll
    for (int i = 0; i < TT; ++i)
#pragma unroll
        for (int j = 0; j < TT; ++j) sums[(slice * BM + row_of(i)) * BJ + col_of(j)] = outer[i][j];
    __syncthreads();
    for (int e = tid; e < BM * BJ; e += NT) {
        const int m = m0 + e / BJ, j = j0 + e % BJ;
        if (m >= Kg || j >= J) continue;
        Acc sum = sums[e];
#pragma unroll
        for (int s = 1; s < LS; ++s) sum += sums[s * BM * BJ + e];
        ws_run[static_cast<Index>(m) * J + j] = sum;
    }
}

// dW[e] = the runs' partial sums ws[s][k][j] added in a fixed order, rounded once to T. e runs over the
// weight's layout, KCHW (k, c, r, s) or KHWC (k, r, s, c) where weight_khwc; j is in the GEMM's column
// order, (c, r, s), or (r, s, c) where ws_channels_last. The partial sums may hold zero channels past
// Cg (ws_Cg of them per tap) and zero rows past the weight's; a run holds ws_elements.
// Block (256 / S, S): threadIdx.x an element, threadIdx.y one of S slices of the runs. Slice t adds
// runs t, t + S, ... in order and the slices' sums are added in slice order, so the result depends on
// the problem alone (S is chosen from it). S > 1 where many runs of few elements (a depthwise weight:
// 1296 elements from 264 runs) would leave each thread a long chain of dependent loads and adds.
template <typename T, typename Acc>
__global__ void __launch_bounds__(256)
wgrad_reduce(const Acc* __restrict__ ws, T* __restrict__ dw, int splits, int elements, int Cg, int taps,
             int ws_channels_last, int weight_khwc, int ws_Cg, int ws_elements) {
    __shared__ Acc slice_sums[256];
    const int S = blockDim.y, slice = threadIdx.y, e = blockIdx.x * blockDim.x + threadIdx.x;
    Acc sum = Acc(0);
    if (e < elements) {
        int source = e;
        if (ws_channels_last != weight_khwc || ws_Cg != Cg) {  // another order of (c, tap), or padded channels
            const int J = Cg * taps, k = e / J, rest = e - k * J;
            const int c = weight_khwc ? rest % Cg : rest / taps, tap = weight_khwc ? rest / Cg : rest % taps;
            source = k * ws_Cg * taps + (ws_channels_last ? tap * ws_Cg + c : c * taps + tap);
        }
        if (slice < splits) sum = ws[static_cast<long long>(slice) * ws_elements + source];
        for (int s = slice + S; s < splits; s += S) sum += ws[static_cast<long long>(s) * ws_elements + source];
    }
    if (S > 1) {
        slice_sums[slice * blockDim.x + threadIdx.x] = sum;
        __syncthreads();
        if (slice != 0) return;
        for (int t = 1; t < S; ++t) sum += slice_sums[t * blockDim.x + threadIdx.x];
    }
    if (e < elements) dw[e] = from_acc<T>(sum);
}

}  // namespace cupyconv
