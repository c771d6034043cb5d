// Implicit-GEMM 2-D convolution on the tensor cores, reading a channels-last copy of the input.
//
// Per group g (gridDim.z), the convolution is the GEMM  Y[m][n] = sum_k A[m][k] B[k][n]  with
//   m = (image, oh, ow)        output pixels,                        M = N Ho Wo
//   n = output channel of g,                                         Kg = K / groups
//   k = (r, s, c)              kernel tap, input channel of g (last), Kgemm = kh kw Cg
// where Cg counts the (zero-)padded channels of the channels-last copies that launch.py makes with
// kernels/nchw_to_nhwc.cu: x as [N][H][W][C] and the weight as [K][kh][kw][Cg]. Channel-last order
// makes every VEC-byte piece of an A row (one pixel, one tap, VEC / sizeof(T) channels) contiguous
// in global memory, so the gather is one cp.async per piece with zero-fill for padding, and a B row
// (one output channel) is contiguous over all of k. The NCHW gather of implicit_gemm_conv2d.cu moves
// one element per instruction instead.
//
// Levels, as in CUTLASS:
//   thread block  BM pixels x BN channels, a STAGES-deep cp.async pipeline over k tiles of BK;
//   warp          (BM / WARPS_M) x (BN / WARPS_N), a grid of 16 x 8 instruction tiles;
//   instruction   mma.sync m16n8k8 (TF32) or m16n8k16 (f16, bf16), float32 accumulators.
// Shared memory: A [BM][BK + pad] and B [BN][BK + pad], both k-contiguous, rows of BK elements + 16
// bytes (an odd number of 16-byte units), so the 8 rows one ldmatrix phase reads fall in 8 different
// 16-byte bank groups. Fragments
// come by ldmatrix (non-transposed) for every type: for TF32 a "b16 pair" is one float, and the
// 8x8 b16 matrix is the 8 x 4 float block the m16n8k8 fragment wants. Floats arrive TF32-rounded
// (nchw_to_nhwc's ROUND_TF32), so no per-fragment conversion is needed; an NHWC input read in place
// is rounded in its fragments (ROUND_A; in shared memory where wgmma reads it from there).
// Epilogue: accumulators -> shared memory (float) -> + bias, storage type -> y. NCHW output: staged
// [BN][BM + pad], a warp stores consecutive pixels of one channel (runs of them per lane where planes
// allow; a stride phase's pixels: strided); NHWC_OUT (the NHWC layout, x read in place or from a
// padded copy): staged [BM][BN + pad], each thread stores vectors of 4 consecutive channels of a
// pixel, a warp runs of whole pixel rows.
//
// WGMMA (Hopper, sm_90a only: see wgmma.cuh): the warpgroups multiply with wgmma, the tensor cores
// reading A and B straight from shared memory, where rows are 128 bytes of k, 128-byte swizzled
// instead of padded. WGMMA_PIXEL_ROWS: each warpgroup takes 64 pixels x all BN channels (WARPS_M =
// BM / 16 warps in one column, so the accumulators are laid out as the mma.sync path's and share its
// epilogue). WGMMA_CHANNEL_ROWS: the operands swap roles -- each warpgroup takes the 64 channels
// (BN = 64) x 128 pixels of its own, the weight tile as wgmma's A, so each instruction reads a
// 64-row weight tile and a 128-row pixel tile instead of two 64-row tiles per 64 x 64 product.
//
// WGMMA_PIXEL_ROWS_PRODUCER (implicit_gemm_nhwc_tma): the pixel-row tile with a warpgroup more, one
// of whose threads copies both tiles of every stage by TMA -- the input through an im2col tensor map
// (BM window corners, 128 bytes of channels of one tap each, zeros outside x), the weight through a
// 2-D one -- into the same swizzled rows, while the others (BM / 64 of them) multiply. Each side waits
// for the other on per-stage mbarriers ("full": the copies' bytes landed; "empty": the MMAs reading it
// retired) instead of all threads at a __syncthreads per k tile; the multiplying warps run the epilogue
// alone.
//
// SPLIT_K (problems of too few tiles to fill the GPU; the other instances compile as if it did not
// exist): gridDim.z = groups x splits, block z = split groups + g takes the split-th run of
// ceil(k tiles / splits) k tiles and writes its float32 partial sums, without bias, to
// y + split split_elements, in the output's layout (the host passes a workspace and has_bias = 0);
// kernels/split_k_reduce.cu adds the runs in order, so the result is the same bits on every run.
//
// NCHW_A: 1x1, stride-1, unpadded convolutions need no copies at all. The NCHW input of an image
// is already the matrix A^T [C][pixels], pixels contiguous, and the weight [K][C] is B: A is then
// copied in VEC-byte pieces of consecutive pixels of one channel into a k-major tile [BK][BM + pad]
// (1-D convolutions with taps too, on mma.sync: row (c, s) of A^T is channel c's pixels shifted by
// tap s, and the KCHW weight [K][C][1][kw] read in place is B; the planner picks pieces that the
// shifts keep aligned, whole and within the row)
// (fragments by ldmatrix.trans; TF32 by scalar loads), B in 16-byte pieces, and float32 operands
// are rounded to TF32 as fragments are loaded. On wgmma's pixel rows (no lag) A^T cannot be read by
// the tensor cores from shared memory (TF32 has no transposed operand), so each warp loads its 16
// pixel rows' fragments into registers as mma.sync's path does (rounded to TF32 there) and wgmma reads
// them there; the weight tile is read from 128-byte swizzled rows, a float32 one rounded to TF32 in
// shared memory by the threads that copied it, after their copies landed and before the barrier.
#include "dtypes.cuh"
#include "epilogue.cuh"
#include "gather_pixel.cuh"
#include "mma.cuh"
#include "stream_k.cuh"
#include "wgmma.cuh"

namespace cupyconv {

// The NCHW_A template argument (NCHW_A_POINTWISE / NCHW_A_ROW_TAPS in families/implicit_gemm_nhwc.py):
// A gathered from channels-last x, or the NCHW input read in place as A^T -- rows that are channels
// (1x1), or rows (c, s) shifted by their tap (1-D), whose decomposition a 1x1 layer's short reduction
// would pay for in registers and issue slots (its own instance, then).
enum NchwA { NHWC_GATHER = 0, NCHW_A_POINTWISE = 1, NCHW_A_ROW_TAPS = 2 };

// The WGMMA_ROWS template argument (WGMMA_PIXEL_ROWS / WGMMA_CHANNEL_ROWS in
// families/implicit_gemm_nhwc.py; 0: mma.sync).
// WGMMA_PIXEL_ROWS_PRODUCER: the pixel-row tile fed by a third warpgroup of its own (below).
enum WgmmaRows { NO_WGMMA = 0, WGMMA_PIXEL_ROWS = 1, WGMMA_CHANNEL_ROWS = 2, WGMMA_PIXEL_ROWS_PRODUCER = 3 };

// Threads of a block: the warps that multiply, and the producer warpgroup where there is one.
__host__ __device__ constexpr int nhwc_threads(int warps, int wgmma_rows) {
    return warps * 32 + (wgmma_rows == WGMMA_PIXEL_ROWS_PRODUCER ? 128 : 0);
}

// Blocks per SM asked of the register allocator: as many (at most 3) as 64K registers hold at the
// accumulators plus ~48 registers of fragments and addresses (16 more with 64-bit indices, whose
// pixel bases and output offsets are pairs: at 128, three 128 x 96 tiles spilled on sm_90) plus, per
// piece copied per tile, 2 and the registers of one index.
__host__ __device__ constexpr int nhwc_min_blocks(int threads, int accumulators, int pieces, int index_registers) {
    const int blocks =
        65536 / (threads * (accumulators + 48 + 16 * (index_registers - 1) + (2 + 2 * index_registers) * pieces));
    return blocks < 1 ? 1 : (blocks > 3 ? 3 : blocks);
}

// The stride phases of a transposed convolution (cupyconv/conv_transpose.py) as one launch: phase p is a
// stride-1 convolution of the whole of y with kh[p] x kw[p] taps dh[p], dw[p] apart, padding pt[p],
// pl[p] (negative where it starts inside y), writing ho[p] x wo[p] pixels per image placed at
// y + out_offset[p] + image image_stride + oh row_stride + ow column_stride + channel channel_stride
// of an output of `channels` channels (the GEMM's first ones: K may have zero channels added; NHWC's
// channel_stride is 1, NCHW's a plane), its weight at w + weight_offset[p]. Its pixel tiles are
// blocks first_tile[p] to first_tile[p + 1] - 1 along x; or, where every phase has as many
// (`interleaved`), blocks p, p + count, p + 2 count, ...: the phases' tiles over the same rows of y run
// together, so that y comes from memory once rather than once a phase.
constexpr int MAX_PHASES = 16;
struct PhaseTable {
    int count, channels, image_stride, row_stride, column_stride, channel_stride, interleaved;
    int first_tile[MAX_PHASES + 1];
    int ho[MAX_PHASES], wo[MAX_PHASES], kh[MAX_PHASES], kw[MAX_PHASES], pt[MAX_PHASES], pl[MAX_PHASES];
    int dh[MAX_PHASES], dw[MAX_PHASES], weight_offset[MAX_PHASES], out_offset[MAX_PHASES];
};

// The TMA producers' walk over the k tiles of a run from k tile kt0 on, k tiles of BK channels of one tap at a
// time: tap (r, s) and channel c (from `first`, a group's first channel). Counted along: divisions a k tile held
// back the copies of 3x3 layers (benchmarks/NOTES.md, "The ping-pong tile's fixed cost; split-K in clusters run;
// the producers count taps").
struct TapWalk {
    int r = 0, s = 0, c;
    __device__ __forceinline__ TapWalk(int kt0, int chunks, int kw, int bk, int first) : c(first) {
        if (kt0 > 0) {
            const int tap = kt0 / chunks;
            r = tap / kw;
            s = tap - r * kw;
            c += (kt0 - tap * chunks) * bk;
        }
    }
    __device__ __forceinline__ void next(int chunks, int kw, int bk, int first) {
        if ((c += bk) == first + chunks * bk) {
            c = first;
            if (++s == kw) {
                s = 0;
                ++r;
            }
        }
    }
};

#define NHWC_GEMM_LAUNCH_BOUNDS                                                                        \
    __launch_bounds__(nhwc_threads(WARPS_M * WARPS_N, WGMMA_ROWS),                                     \
                      nhwc_min_blocks(nhwc_threads(WARPS_M * WARPS_N, WGMMA_ROWS),                     \
                                      BM * BN / (WARPS_M * WARPS_N * 32),                              \
                                      BM * BK * sizeof(T) / (VEC * WARPS_M * WARPS_N * 32), sizeof(Index) / 4))

// One block's tile: pixel tile `tile` and channel tile `tile_n` (blockIdx.x and blockIdx.y but in a
// phase launch and NCHW_A's order), group and split blockIdx.z -- or (STREAM_K) group and run of k tiles as `segment`
// says, the run's sums published or, by the tile's owner, added to before the epilogue (stream_k.cuh).
// Its output pixel m = (image, oh, ow) goes to y + m K, or (PHASED) where
// `phases` places phase `phase`'s pixels: the table is read in the epilogue alone, and cp.async's
// zero-fills point at x, so that the main loop holds no more registers than one convolution's
// (the phase's weight pointer, kept for them, made four instances spill).
template <typename T, typename Index, int BM, int BN, int BK, int WARPS_M, int WARPS_N, int STAGES, int VEC,
          int NCHW_A, int WGMMA_ROWS, bool NHWC_OUT, bool ROUND_A, bool SPLIT_K, bool PHASED, bool STREAM_K = false,
          int CLUSTER = 1>
__device__ __forceinline__ void
nhwc_gemm_tile(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
               void* __restrict__ y_out, int has_bias, const T* __restrict__ residual, int has_residual, int activation,
               int N, int C, int H, int W, int K, int Ho, int Wo, int kh, int kw,
               int sh, int sw, int pt, int pl, int dh, int dw, int groups, int splits, int split_elements,
               int tile, int tile_n, const PhaseTable* __restrict__ phases, int phase,
               const StreamKSegment* segment = nullptr,
               const TensorMap* b_map = nullptr, const TensorMap* a_map = nullptr, bool a_map_is_matrix = false) {
    constexpr int NWARPS = WARPS_M * WARPS_N;
    constexpr bool WGMMA = WGMMA_ROWS != NO_WGMMA;
    constexpr int NT = NWARPS * 32;                          // threads that multiply
    // PRODUCER: a warpgroup more, one of whose threads copies both tiles of every stage by TMA (the input
    // in im2col mode, the weight as a matrix), while the NT threads multiply, each side waiting for the
    // other on mbarriers rather than all at a __syncthreads per k tile.
    constexpr bool PRODUCER = WGMMA_ROWS == WGMMA_PIXEL_ROWS_PRODUCER;
    constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;      // warp tile
    constexpr int MT = WM / 16, NTILES = WN / 8;             // instruction tiles per warp
    constexpr int EV = VEC / sizeof(T);                      // elements per A piece (channels, or pixels)
    constexpr int B_VEC = NCHW_A ? 16 : VEC;
    constexpr int B_EV = B_VEC / sizeof(T);                  // channels per B piece
    constexpr int ROW_BYTES = BK * sizeof(T) + (WGMMA ? 0 : 16);  // k-contiguous rows (B, and A unless NCHW_A)
    constexpr int STRIDE = ROW_BYTES / sizeof(T);
    constexpr int A_T_STRIDE = BM + 8;                       // NCHW_A: A^T rows [BK][A_T_STRIDE]
    constexpr int A_STAGE = NCHW_A ? BK * A_T_STRIDE : BM * STRIDE, B_STAGE = BN * STRIDE;
    // A loader: pieces per tile row, rows filled per pass of all threads, passes per tile.
    constexpr int A_PIECES = NCHW_A ? BM / EV : BK / EV;
    constexpr int A_ROWS_PER_PASS = NT / A_PIECES;
    constexpr int A_PASSES = (NCHW_A ? BK : BM) / A_ROWS_PER_PASS;
    constexpr int B_PIECES = BK / B_EV;
    constexpr int B_ROWS_PER_PASS = NT / B_PIECES;
    constexpr int B_PASSES = (BN + B_ROWS_PER_PASS - 1) / B_ROWS_PER_PASS;
    constexpr int C_STRIDE = BM + 4;                         // epilogue staging [BN][C_STRIDE] floats
    // NHWC_OUT: staging [BM][D_STRIDE] floats. Pixel-row fragments store channel pairs (8-byte stores):
    // at BN + 8 words a warp's 8 rows x 4 pairs fill each half-warp's 32 banks once, where BN + 4 made
    // two-way conflicts. Channel-row fragments store single channels of pixel pairs (BN + 4 spreads
    // them), and 16-bit outputs of 32 channels read two rows a quarter-warp (BN + 4 keeps them apart).
    constexpr int D_STRIDE =
        BN + (WGMMA_ROWS != WGMMA_CHANNEL_ROWS && (SPLIT_K || sizeof(T) == 4 || BN >= 64) ? 8 : 4);
    constexpr int INST_K = mma_op<T>::k;
    // float32 operands read in place as NCHW_A (no copy rounded them) are rounded to TF32 in registers,
    // as A's fragments are loaded (each warp loads its own rows on wgmma: each value once), and the
    // weight's: on mma.sync in its fragments, where rounding in shared memory, between each tile's wait
    // and barrier, made the 128 x 64 tile 1.3x slower (H200, ResNet-50's TF32 1x1 layers); on wgmma,
    // which reads the weight from shared memory, there, by the threads that copied it, once per block,
    // in 16-byte vectors. The wgmma tile is bound by shared-memory wavefronts: A^T rounded in place too
    // cost a load and a store of every A value more, 1.03-1.13x of its time (benchmarks/NOTES.md, "TF32
    // NCHW_A on wgmma: A rounded in its fragments again").
    constexpr bool ROUND_NCHW_A_WEIGHT_IN_SHARED = NCHW_A && WGMMA && sizeof(T) == 4;
    constexpr bool ROUND_NCHW_A_FRAGMENTS = NCHW_A && !WGMMA && sizeof(T) == 4;
    // ROUND_A: a float32 NHWC input read in place, unrounded (the planner takes it for 1x1 problems and
    // the tiles that round in registers; others come rounded by a copy, implicit_gemm_nhwc.py _x_copied),
    // rounded to TF32 on its way to the tensor cores (below). Rounding in shared memory, between the
    // wait and the barrier, stalls every k tile and costs a many-tap reduction more than the copy
    // does; in registers it costs a conversion per value (benchmarks/NOTES.md).
    static_assert(!ROUND_A || (!NCHW_A && sizeof(T) == 4), "ROUND_A: float32 NHWC inputs read in place");
    // wgmma tiles left running while the next barrier is reached and the next loads are issued: one,
    // where four stages leave two tiles of loads ahead.
    constexpr int WGMMA_LAG = WGMMA && STAGES >= 4 && !PRODUCER ? 1 : 0;
    // ROUND_A in registers where A reaches the tensor cores through them: mma.sync's fragments, and
    // wgmma's pixel rows (A from registers) where each tile's MMAs retire before the next tile's
    // registers are written (no lag; ptxas serialises wgmma whose registers are written while others
    // are in flight). wgmma's channel rows read the input as B, from shared memory: rounded there, as
    // in stream-K's blocks (whose sums and segment left no registers: 12 bytes spilled at 128). The
    // planner copies many-tap inputs for the tiles that round in shared memory (_x_copied, whose
    // rule follows this one).
    constexpr bool ROUND_IN_SHARED =
        ROUND_A && WGMMA && (WGMMA_ROWS == WGMMA_CHANNEL_ROWS || WGMMA_LAG > 0 || STREAM_K);
    constexpr bool ROUND_IN_REGISTERS = ROUND_A && !ROUND_IN_SHARED;
    constexpr int WG_PIXELS = WGMMA_ROWS == WGMMA_CHANNEL_ROWS ? 128 : 64;  // pixels per warpgroup
    static_assert(sizeof(T) == 4 || sizeof(T) == 2, "float, half_t or bfloat16_t");
    static_assert(BK * sizeof(T) % 32 == 0, "rows of an odd number of 16-byte units: ldmatrix is conflict-free");
    static_assert(!WGMMA || (BK * sizeof(T) == 128 && (NCHW_A ? WGMMA_ROWS == WGMMA_PIXEL_ROWS && WGMMA_LAG == 0
                                                             : VEC == 16) && WARPS_N == 1 &&
                             BM == WG_PIXELS * (NWARPS / 4) && NWARPS % 4 == 0 && (NT / 8) % 8 == 0 &&
                             (WGMMA_ROWS != WGMMA_CHANNEL_ROWS || BN == 64)),
                  "wgmma: 128-byte swizzled rows of 16-byte pieces (NCHW_A: the weight's; A in registers, on pixel "
                  "rows without a lag), whole warpgroups of 64 pixels x BN channels or 64 channels x 128 pixels, "
                  "loader rows a multiple of 8 apart (one swizzle slot per thread)");
    static_assert(VEC == 4 || VEC == 8 || VEC == 16, "cp.async moves 4, 8 or 16 bytes");
    static_assert(NT % A_PIECES == 0 && (NCHW_A ? BK : BM) % A_ROWS_PER_PASS == 0, "the A loader covers the tile");
    static_assert(NT % B_PIECES == 0, "the B loader covers whole rows");
    static_assert(!PRODUCER || !(STREAM_K || NCHW_A || (PHASED && (SPLIT_K || CLUSTER > 1))),
                  "the producer warpgroup's tile: one convolution of channels-last operands copied by TMA (phases "
                  "only as one GEMM: implicit_gemm_nhwc_tma_stacked)");
    static_assert(CLUSTER == 1 || (PRODUCER && CLUSTER == 2 && (BM / CLUSTER) % 8 == 0),
                  "clusters: pairs of producer tiles, each copying whole 8-row swizzle groups of the input tile");
    static_assert(WM % 16 == 0 && WN % 16 == 0, "warp tiles of 16 x 16 multiples (x4 ldmatrix for B)");
    static_assert((NHWC_OUT ? BM * D_STRIDE : BN * C_STRIDE) * 4 <=
                  STAGES * (A_STAGE + B_STAGE) * static_cast<int>(sizeof(T)),
                  "epilogue staging fits in the pipeline buffers");
    static_assert(!(NHWC_OUT && NCHW_A), "NCHW_A reads an NCHW input, whose output is NCHW");
    static_assert(NCHW_A != NCHW_A_ROW_TAPS || !WGMMA, "1-D rows read in place run on mma.sync's tiles");
    static_assert(!STREAM_K || !(SPLIT_K || PHASED), "stream-K finishes its tiles itself, one convolution");

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    // wgmma tiles start on 1024-byte boundaries (the swizzle repeats every 8 rows); the planner adds
    // the 1 KB this may skip.
    unsigned char* smem = WGMMA ? smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023) : smem_raw;
    T* a_smem = reinterpret_cast<T*>(smem);                  // [STAGES][BM][STRIDE] or [STAGES][BK][A_T_STRIDE]
    T* b_smem = a_smem + STAGES * A_STAGE;                   // [STAGES][BN][STRIDE]

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = STREAM_K ? segment->g : (SPLIT_K ? blockIdx.z % groups : blockIdx.z);
    const int split = SPLIT_K ? blockIdx.z / groups : 0;
    // Runtime divisions cost ~20 instructions each, and a block of a short reduction (a 1x1 layer) spends
    // as many issue slots setting up its gather as in its main loop: the common cases skip them.
    const int Cg = groups == 1 ? C : C / groups, Kg = groups == 1 ? K : K / groups;
    const int Kgemm = kh * kw * Cg;
    const Index HoWo = static_cast<Index>(Ho) * Wo;
    const Index M = static_cast<Index>(N) * HoWo;
    const Index m0 = static_cast<Index>(tile) * BM;
    const int n0 = tile_n * BN;
    const int all_tiles = (Kgemm + BK - 1) / BK;
    const int split_tiles = SPLIT_K ? (all_tiles + splits - 1) / splits : all_tiles;
    const int kt0 = STREAM_K ? segment->k_begin : split * split_tiles;  // this split's (run's) first k tile
    const int k_tiles = STREAM_K ? segment->k_end - segment->k_begin
                                 : (SPLIT_K ? max(0, min(all_tiles - kt0, split_tiles)) : all_tiles);
    using Y = typename select_type<SPLIT_K, float, T>::type;  // partial sums, or the output
    Y* y = static_cast<Y*>(y_out) + (SPLIT_K ? static_cast<Index>(split) * split_elements : 0);

    // --- A loader: thread tid copies piece `a_piece` of tile rows a_row0 + A_ROWS_PER_PASS i: rows are
    // pixels and pieces channels, or (NCHW_A) rows are channels and pieces pixels.
    const int a_piece = tid % A_PIECES, a_row0 = tid / A_PIECES;
    constexpr int A_PIXELS = NCHW_A ? 1 : A_PASSES;          // pixels whose gather state a thread keeps
    Index a_base[A_PIXELS];   // x offset of the pixel's tap (0, 0), channel 0 of group g
    int a_ih0[A_PIXELS], a_iw0[A_PIXELS];
    // NHWC pointwise (1x1, stride 1, unpadded): output pixel m reads input pixel m, no (image, oh, ow).
    const bool pointwise = !NCHW_A && kh == 1 && kw == 1 && sh == 1 && sw == 1 && pt == 0 && pl == 0 && Ho == H &&
                           Wo == W;
#pragma unroll
    for (int i = 0; i < A_PIXELS; ++i) {
        constexpr GatherLayout LAYOUT = NCHW_A ? GatherLayout::nchw : GatherLayout::nhwc;
        const Index m = m0 + (NCHW_A ? a_piece * EV : a_row0 + A_ROWS_PER_PASS * i);
        GatherPixel<Index> px;
        if (pointwise) {
            if (m < M) px = GatherPixel<Index>{m * C + static_cast<Index>(g) * Cg, 0, 0};
        } else {
            px = gather_pixel<LAYOUT>(m, M, HoWo, Wo, C, H, W, sh, sw, pt, pl, g, Cg);
        }
        a_base[i] = px.base;
        a_ih0[i] = px.ih0;
        a_iw0[i] = px.iw0;
    }
    // NHWC: the (r, s, c) of this thread's piece in the next tile to load, stepped by BK per tile.
    const int k_first = kt0 * BK + a_piece * EV;
    int tap_c = k_first < Cg ? k_first : k_first % Cg, tap_rs = k_first < Cg ? 0 : k_first / Cg;
    int tap_r = tap_rs < kw ? 0 : tap_rs / kw, tap_s = tap_rs < kw ? tap_rs : tap_rs % kw;
    const int step_c = BK < Cg ? BK : BK % Cg, step_rs = BK < Cg ? 0 : BK / Cg;
    // B loader: piece b_piece of rows (output channels) b_row0 + B_ROWS_PER_PASS i.
    const int b_piece = tid % B_PIECES, b_row0 = tid / B_PIECES;
    const T* b_src = w + (static_cast<Index>(g) * Kg + n0 + b_row0) * Kgemm + b_piece * B_EV;
    // Where this thread's pieces lie in a stage (pass i: A_ROWS_PER_PASS i rows of A_ROW further, B_ROWS_PER_PASS
    // i of STRIDE): load_tile copies them there, round_landed rounds those of x read in place or of
    // NCHW_A's weight there.
    constexpr int A_ROW = NCHW_A ? A_T_STRIDE : STRIDE;
    auto a_piece_at = [&](int stage) {
        return a_smem + stage * A_STAGE + a_row0 * A_ROW + (WGMMA && !NCHW_A ? swizzle128_slot(a_piece, a_row0) : a_piece) * EV;
    };
    auto b_piece_at = [&](int stage) {
        return b_smem + stage * B_STAGE + b_row0 * STRIDE + (WGMMA ? swizzle128_slot(b_piece, b_row0) : b_piece) * B_EV;
    };

    auto load_tile = [&](int kt, int stage) {
        T* a_dst = a_piece_at(stage);
        if constexpr (NCHW_A) {
#pragma unroll
            for (int i = 0; i < A_PASSES; ++i) {
                const int k = kt * BK + a_row0 + A_ROWS_PER_PASS * i;
                T* dst = a_dst + A_ROWS_PER_PASS * i * A_ROW;
                if constexpr (NCHW_A == NCHW_A_POINTWISE) {  // row k is channel k
                    const bool ok = a_ih0[0] >= 0 && k < Cg;
                    cp_async<VEC>(dst, ok ? x + (a_base[0] + k * HoWo) : x, ok);
                } else {
                    // 1-D (H = kh = 1): row k = (c, s), channel-major as the KCHW weight read in place. The
                    // planner keeps each tap's shift a whole number of pieces: a piece lies wholly inside
                    // x's row or wholly in its padding.
                    const int c = k / kw, s = k - c * kw, iw = a_iw0[0] + s * dw;
                    const bool ok = a_ih0[0] >= 0 && c < Cg && static_cast<unsigned>(iw) < static_cast<unsigned>(W);
                    cp_async<VEC>(dst, ok ? x + (a_base[0] + static_cast<Index>(c) * W + s * dw) : x, ok);
                }
            }
        } else {
            const bool k_ok = tap_r < kh;
            const int ih_off = tap_r * dh, iw_off = tap_s * dw;
            const Index tap_off = (static_cast<Index>(ih_off) * W + iw_off) * C + tap_c;
#pragma unroll
            for (int i = 0; i < A_PASSES; ++i) {
                const bool ok = k_ok && static_cast<unsigned>(a_ih0[i] + ih_off) < static_cast<unsigned>(H) &&
                                static_cast<unsigned>(a_iw0[i] + iw_off) < static_cast<unsigned>(W);
                cp_async<VEC>(a_dst + A_ROWS_PER_PASS * i * A_ROW, ok ? x + (a_base[i] + tap_off) : x, ok);
            }
            // Next tile: k + BK in the mixed radix (r, s, c).
            tap_c += step_c;
            tap_s += step_rs;
            if (tap_c >= Cg) { tap_c -= Cg; ++tap_s; }
            while (tap_s >= kw) { tap_s -= kw; ++tap_r; }
        }
        const int k = kt * BK + b_piece * B_EV;
        T* b_dst = b_piece_at(stage);
#pragma unroll
        for (int i = 0; i < B_PASSES; ++i) {
            const int row = b_row0 + B_ROWS_PER_PASS * i;
            if (BN % B_ROWS_PER_PASS == 0 || row < BN) {
                const bool ok = k < Kgemm && n0 + row < Kg;
                cp_async<B_VEC>(b_dst + B_ROWS_PER_PASS * i * STRIDE,
                                ok ? b_src + static_cast<Index>(B_ROWS_PER_PASS * i) * Kgemm + kt * BK : x, ok);
            }
        }
    };

    // --- Warp tile and accumulators.
    const int warp_m = warp % WARPS_M, warp_n = warp / WARPS_M;
    const int wm = warp_m * WM, wn = warp_n * WN;
    float acc[MT][NTILES][4];
    zero_accumulators(acc);

    // ldmatrix row addresses. A (x4 = a0..a3): lanes 0-15 give rows 0-15 at k + 0, lanes 16-31 the
    // same rows 16 bytes further; NCHW_A (.trans): lanes 0-7 k rows 0-7 at pixel 0, 8-15 the same rows
    // at pixel 8, 16-31 k rows 8-15 likewise. B (x4 = b0, b1 of two 8-channel tiles): lanes 0-7
    // channels 0-7 at k + 0, 8-15 the same 16 bytes further, 16-31 channels 8-15 likewise.
    const int a_lane_off = NCHW_A ? ((((lane >> 4) << 3) + (lane & 7)) * A_T_STRIDE + wm + ((lane >> 3) & 1) * 8) *
                                        static_cast<int>(sizeof(T))
                                  : (wm + (lane & 15)) * ROW_BYTES + (lane >> 4) * 16;
    const int b_lane_off = (wn + (lane & 7) + ((lane >> 4) << 3)) * ROW_BYTES + ((lane >> 3) & 1) * 16;
    constexpr int INST_BYTES = INST_K * sizeof(T);           // 32 bytes of k per instruction
    const int quad = lane >> 2, tq = lane & 3;               // PTX's groupID and threadID_in_group

    // wgmma descriptors of stage 0's tiles, made once: a stage's and an instruction's are these plus their
    // byte offset / 16 (the start address field: shared addresses stay below 2^18, so the sum never
    // carries out of it), two integer adds where the descriptor was rebuilt each time (~20 % of a
    // lone 128 x 128 block's main-loop instructions).
    const unsigned long long pixels0 =
        WGMMA && !NCHW_A ? wgmma_descriptor(shared_address(a_smem) + (warp / 4) * WG_PIXELS * ROW_BYTES) : 0;
    const unsigned long long channels0 = WGMMA ? wgmma_descriptor(shared_address(b_smem)) : 0;
    // ROUND_IN_REGISTERS' wgmma: this lane's ldmatrix row of its warpgroup's pixels, and where it starts.
    const int a_row_in_group = (warp & 3) * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
    const unsigned char* a_row = reinterpret_cast<const unsigned char*>(a_smem) +
                                 ((warp >> 2) * WG_PIXELS + a_row_in_group) * ROW_BYTES;
    auto compute_tile = [&](int stage) {
        if constexpr (WGMMA) {
            const unsigned long long pixels = pixels0 + stage * (A_STAGE * sizeof(T) / 16);
            const unsigned long long channels = channels0 + stage * (B_STAGE * sizeof(T) / 16);
            constexpr bool SWAP = WGMMA_ROWS == WGMMA_CHANNEL_ROWS;
            constexpr int N = SWAP ? WG_PIXELS : BN;     // wgmma's n: the columns of each warpgroup's tile
            float (&d)[N / 2] = reinterpret_cast<float (&)[N / 2]>(acc);
            if constexpr (ROUND_IN_REGISTERS || NCHW_A) {
                // Each warp's 16 pixel rows in registers (mma.sync's A layout, as wgmma reads A from
                // registers), multiplied with the weight tile in shared memory: by ldmatrix from the
                // swizzled rows, rounded to TF32 -- or (NCHW_A) from the k-major A^T tile as the
                // mma.sync path loads (and rounds) them (wm: this warp's 16 rows).
                unsigned a[BK / INST_K][4];
#pragma unroll
                for (int kk = 0; kk < BK / INST_K; ++kk) {
                    if constexpr (!NCHW_A) {
                        ldmatrix_x4(a[kk], a_row + stage * A_STAGE * sizeof(T) +
                                               swizzle128_slot(2 * kk + (lane >> 4), a_row_in_group) * 16);
#pragma unroll
                        for (int e = 0; e < 4; ++e) a[kk][e] = to_tf32(__uint_as_float(a[kk][e]));
                    } else if constexpr (sizeof(T) == 2) {
                        ldmatrix_x4<true>(a[kk], reinterpret_cast<const unsigned char*>(a_smem + stage * A_STAGE) +
                                                     a_lane_off + kk * INST_K * A_T_STRIDE * 2);
                    } else {
                        tf32_a_from_k_major<A_T_STRIDE, 1>(reinterpret_cast<unsigned (&)[1][4]>(a[kk]),
                                                        reinterpret_cast<const float*>(a_smem + stage * A_STAGE) +
                                                            (kk * INST_K + tq) * A_T_STRIDE + wm + quad);
                    }
                }
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < BK / INST_K; ++kk)
                    wgmma_rs<T, BN>::run(d, a[kk], channels + kk * (INST_BYTES / 16));
            } else {
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < BK / INST_K; ++kk)
                    wgmma_op<T, N>::run(d, (SWAP ? channels : pixels) + kk * (INST_BYTES / 16),
                                        (SWAP ? pixels : channels) + kk * (INST_BYTES / 16));
            }
            wgmma_commit();  // retired by run_k_pipeline (after the next tile's copies are issued, ISSUE_FIRST)
            return;
        }
        const unsigned char* a_buf = reinterpret_cast<const unsigned char*>(a_smem + stage * A_STAGE) + a_lane_off;
        const unsigned char* b_buf = reinterpret_cast<const unsigned char*>(b_smem + stage * B_STAGE) + b_lane_off;
#pragma unroll
        for (int kk = 0; kk < BK / INST_K; ++kk) {
            unsigned a_frag[MT][4], b_frag[NTILES][2];
            if constexpr (!NCHW_A) {
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    ldmatrix_x4(a_frag[mt], a_buf + mt * 16 * ROW_BYTES + kk * INST_BYTES);
                    if constexpr (ROUND_IN_REGISTERS) {
#pragma unroll
                        for (int e = 0; e < 4; ++e) a_frag[mt][e] = to_tf32(__uint_as_float(a_frag[mt][e]));
                    }
                }
            } else if constexpr (sizeof(T) == 2) {
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
                    ldmatrix_x4<true>(a_frag[mt], a_buf + (kk * INST_K * A_T_STRIDE + mt * 16) * 2);
            } else {  // TF32 from A^T
                tf32_a_from_k_major<A_T_STRIDE, MT>(a_frag, reinterpret_cast<const float*>(a_smem + stage * A_STAGE) +
                                                            (kk * INST_K + tq) * A_T_STRIDE + wm + quad);
            }
#pragma unroll
            for (int nt = 0; nt < NTILES; nt += 2) {
                unsigned r[4];
                ldmatrix_x4(r, b_buf + nt * 8 * ROW_BYTES + kk * INST_BYTES);
                if constexpr (ROUND_NCHW_A_FRAGMENTS) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) r[e] = to_tf32(__uint_as_float(r[e]));
                }
                b_frag[nt][0] = r[0]; b_frag[nt][1] = r[1];
                b_frag[nt + 1][0] = r[2]; b_frag[nt + 1][1] = r[3];
            }
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < NTILES; ++nt) mma_op<T>::run(acc[mt][nt], a_frag[mt], b_frag[nt]);
        }
    };

    // --- Main loop (mma.cuh; every copy is a cp.async, nothing to store from registers); then the
    // pipeline buffers become the epilogue's staging area.
    // Where the tensor cores read unrounded float32 from shared memory, the threads that copied it round
    // it there once their copies landed, before the barrier: x read in place (ROUND_IN_SHARED: A's
    // rows), or NCHW_A's weight on wgmma.
    auto round_landed = [&](int stage) {
        if constexpr (ROUND_IN_SHARED) {
            T* a_dst = a_piece_at(stage);
#pragma unroll
            for (int i = 0; i < A_PASSES; ++i) round_tf32_in_place<EV>(a_dst + A_ROWS_PER_PASS * i * A_ROW);
        }
        if constexpr (ROUND_NCHW_A_WEIGHT_IN_SHARED) {
            T* b_dst = b_piece_at(stage);
#pragma unroll
            for (int i = 0; i < B_PASSES; ++i)
                if (BN % B_ROWS_PER_PASS == 0 || b_row0 + B_ROWS_PER_PASS * i < BN)
                    round_tf32_in_place<B_EV>(b_dst + B_ROWS_PER_PASS * i * STRIDE);
        }
    };
    // wgmma: all but WGMMA_LAG tiles' MMAs retire after each tile (this tile's may still run; the buffer
    // of the one before is free). Without a lag, the next tile's copies are issued while this tile's
    // MMAs run (ISSUE_FIRST): H100, fp16 channels_last, dilated_3x3_d2 1.26x, r50_l3_3x3_256 1.07x; with
    // a lag (the 4-stage channel-row tiles) that order was slower (r50_l4_3x3_512 0.92x) and is not used.
    constexpr bool ISSUE_FIRST = WGMMA && WGMMA_LAG == 0;
    if constexpr (PRODUCER) {
        // Stage s is full once both TMA copies into it landed, and empty once all NWARPS multiplying
        // warps' MMAs reading it retired -- in every block of the cluster (CLUSTER > 1), whose
        // producers write their share of the input tile into this block's stage too; the barriers
        // follow the pipeline buffers.
        unsigned long long* full = reinterpret_cast<unsigned long long*>(b_smem + STAGES * B_STAGE);
        unsigned long long* empty = full + STAGES;
        if (tid == 0) {
            for (int s = 0; s < STAGES; ++s) {
                mbarrier_init(full + s, 1);  // the copying thread's expect-tx arrival
                mbarrier_init(empty + s, NWARPS * CLUSTER);
            }
            if constexpr (CLUSTER > 1) mbarrier_init_fence();
        }
        if constexpr (CLUSTER > 1)
            cluster_sync();  // no block's copies or arrivals reach another's barriers before they exist
        else
            __syncthreads();
        // CLUSTER > 1: the cluster's blocks (channel tiles n0, n0 + BN, ..) share the pixel tile, and
        // block `rank` copies rows rank A_ROWS .. of its input tile once, multicast into every block's
        // stage: each block's copies read 1 / CLUSTER of the input tile from L2, and its weight tile.
        constexpr int A_ROWS = BM / CLUSTER;
        const unsigned rank = CLUSTER > 1 ? cluster_rank() : 0;
        if (tid == NT) {
            // One thread of the producer warpgroup copies both tiles of every stage by TMA. The input's:
            // A_ROWS output pixels from m0 + rank A_ROWS on, each the BK channels at this k tile's tap
            // and channel offset, by the im2col map (the pixels' windows start at (oh sh - pt, ow sw -
            // pl); the map's box and strides walk the rest, zeros outside x). The weight's: rows g Kg +
            // n0 .., columns kt BK ..
            const int chunks = Cg / BK;  // k tiles per tap (the planner asks Cg % BK == 0)
            const Index m_first = m0 + rank * A_ROWS;
            // The first window corner (not for a matrix), and the k tiles' taps counted along (TapWalk).
            int image = 0, h0 = 0, w0 = 0;
            if (!(CLUSTER == 1 && a_map_is_matrix)) {
                image = static_cast<int>(m_first / HoWo);
                const int p = static_cast<int>(m_first - static_cast<Index>(image) * HoWo);
                h0 = (p / Wo) * sh - pt;
                w0 = (p % Wo) * sw - pl;
            }
            TapWalk tap(kt0, chunks, kw, BK, g * Cg);
            T* const a_share = a_smem + rank * A_ROWS * STRIDE;
#pragma unroll 1
            for (int t = 0; t < k_tiles; ++t) {
                const int stage = t % STAGES, kt = kt0 + t;
                if (t >= STAGES) mbarrier_wait(empty + stage, (t / STAGES - 1) & 1);
                mbarrier_arrive_expect_tx(full + stage, (BM + BN) * BK * static_cast<int>(sizeof(T)));
                if (CLUSTER == 1 && a_map_is_matrix)  // a 1x1 layer's x as the matrix [N H W][C]
                    tma_load_2d(a_share + stage * A_STAGE, a_map, tap.c, static_cast<int>(m_first), full + stage);
                else if constexpr (CLUSTER > 1)
                    tma_load_im2col_4d_multicast(a_share + stage * A_STAGE, a_map, tap.c, w0, h0, image, tap.s * dw,
                                                 tap.r * dh, full + stage, (1 << CLUSTER) - 1);
                else
                    tma_load_im2col_4d(a_share + stage * A_STAGE, a_map, tap.c, w0, h0, image, tap.s * dw, tap.r * dh,
                                       full + stage);
                tma_load_2d(b_smem + stage * B_STAGE, b_map, kt * BK, g * Kg + n0, full + stage);
                tap.next(chunks, kw, BK, g * Cg);
            }
        } else if (warp < NWARPS) {
            auto release = [&](int stage) {  // the MMAs reading `stage` retired: every producer may refill it
                if (lane == 0) {
                    if constexpr (CLUSTER > 1) {
#pragma unroll
                        for (int r = 0; r < CLUSTER; ++r) mbarrier_arrive_cluster(empty + stage, r);
                    } else {
                        mbarrier_arrive(empty + stage);
                    }
                }
            };
#pragma unroll 1
            for (int t = 0; t < k_tiles; ++t) {
                const int stage = t % STAGES;
                mbarrier_wait(full + stage, (t / STAGES) & 1);
                compute_tile(stage);
                if constexpr (ROUND_A) {  // A in registers: they are written again next tile
                    wgmma_wait<0>();
                    release(stage);
                } else {
                    wgmma_wait<1>();  // tile t - 1's MMAs retired: its stage may be refilled
                    if (t > 0) release((t - 1) % STAGES);
                }
            }
            wgmma_wait<0>();
            if (CLUSTER > 1 && !ROUND_A && k_tiles > 0) release((k_tiles - 1) % STAGES);  // for the exit below
        }
        __syncthreads();  // every MMA retired: the buffers become the epilogue's staging
        if (warp >= NWARPS) {
            // A block leaves only once no other block of its cluster may still arrive on its barriers:
            // every block's MMAs released the stages of its last tiles (the epilogue does not touch them).
            if (CLUSTER > 1 && tid == NT)
                for (int t = max(0, k_tiles - STAGES); t < k_tiles; ++t) mbarrier_wait(empty + t % STAGES, (t / STAGES) & 1);
            return;
        }
    } else {
        run_k_pipeline<STAGES, WGMMA, WGMMA_LAG, ISSUE_FIRST>(
            k_tiles, [&](int t, int stage) { load_tile(kt0 + t, stage); }, compute_tile, [](int) {}, round_landed,
            [] { if constexpr (WGMMA) wgmma_wait<WGMMA_LAG>(); });
    }
    if constexpr (WGMMA_LAG > 0) {  // the last tile's MMAs read the buffers the epilogue overwrites
        wgmma_wait<0>();
        __syncthreads();
    }
    if constexpr (STREAM_K) {
        constexpr int ACC = MT * NTILES * 4;
        float (&sums)[ACC] = reinterpret_cast<float (&)[ACC]>(acc);
        if (segment->k_begin > 0) {  // the tile's tail: its owner finishes it
            stream_k_publish<NT, ACC>(sums, segment->partials + static_cast<long long>(segment->slot) * ACC * NT,
                                      segment->flags + segment->slot);
            return;
        }
        for (int b = segment->first_contributor; b < segment->end_contributor; ++b)
            stream_k_add<NT, ACC>(sums, segment->partials + static_cast<long long>(b) * ACC * NT, segment->flags + b);
    }

    // --- Epilogue: the whole BM x BN tile through shared memory, then stores along pixels (NCHW) or
    // channels (NHWC_OUT).
    float* c_smem = reinterpret_cast<float*>(smem);
    const int out_channels = PHASED ? phases->channels : K;  // a phase launch may store fewer than K
    auto aligned_to = [&](int cv) {
        return out_channels % cv == 0 && Kg % cv == 0 &&
               reinterpret_cast<unsigned long long>(y) % (cv * sizeof(Y)) == 0;
    };
    // NHWC outputs stored as 16-byte vectors (WIDE), each thread on the same channels of every
    // (NT / WIDE_VECTORS)-th pixel, where the channels and addresses allow it.
    constexpr int WIDE = 16 / sizeof(Y), WIDE_VECTORS = BN / WIDE;
    constexpr bool WIDE_TILE = NHWC_OUT && BN % WIDE == 0 && NT % WIDE_VECTORS == 0;
    const bool wide = WIDE_TILE && aligned_to(WIDE) &&
                      (!has_residual || reinterpret_cast<unsigned long long>(residual) % 16 == 0);
    // 16-bit outputs without a residual, unactivated or ReLU'd (which commutes with rounding), are
    // staged as their 16-bit values, the bias added: half the staging's bytes, in half2 stores that a
    // warp's 8 rows x 4 column pairs spread over the 32 banks (H_STRIDE), and read back as the
    // 16-byte vectors stored. The same values as float staging (bit for bit but a ReLU'd output that
    // rounds to -0, which stays -0 where float staging stored +0). Residuals and other activations
    // keep it (they apply before the one rounding), and so do phase launches (their wgmma instances
    // spilled with both stagings).
    constexpr int H_STRIDE = BN + 8;
    constexpr bool STAGE_16_TILE = WIDE_TILE && sizeof(Y) == 2 && WGMMA_ROWS != WGMMA_CHANNEL_ROWS && !PHASED;
    const bool staged_16 = STAGE_16_TILE && wide && !has_residual && (activation == ACT_NONE || activation == ACT_RELU);
    Y* h_smem = reinterpret_cast<Y*>(smem);
    if constexpr (STAGE_16_TILE) {
        if (staged_16) {
#pragma unroll
            for (int nt = 0; nt < NTILES; ++nt) {
                const int col = wn + nt * 8 + 2 * tq;  // and col + 1 (Kg % 8 == 0: both inside or both past)
                const bool inside = has_bias && n0 + col < Kg;
                const float b0 = inside ? to_acc<float>(bias[g * Kg + n0 + col]) : 0.0f;
                const float b1 = inside ? to_acc<float>(bias[g * Kg + n0 + col + 1]) : 0.0f;
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int half = 0; half < 2; ++half) {
                        struct alignas(4) Pair { Y lo, hi; };
                        const Pair pair{from_acc<Y>(acc[mt][nt][2 * half] + b0),
                                        from_acc<Y>(acc[mt][nt][2 * half + 1] + b1)};
                        *reinterpret_cast<Pair*>(h_smem + (wm + mt * 16 + quad + half * 8) * H_STRIDE + col) = pair;
                    }
            }
        }
    }
    if (!staged_16) {
        auto stage_value = [&](int m, int n, float v) {
            c_smem[NHWC_OUT ? m * D_STRIDE + n : n * C_STRIDE + m] = v;
        };
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NTILES; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int row = quad + (e >> 1) * 8, col = 2 * tq + (e & 1);
                    if constexpr (WGMMA_ROWS == WGMMA_CHANNEL_ROWS)  // rows: channels; columns: the group's pixels
                        stage_value((warp >> 2) * WG_PIXELS + (mt * NTILES + nt) * 8 + col, (warp & 3) * 16 + row,
                                    acc[mt][nt][e]);
                    else
                        stage_value(wm + mt * 16 + row, wn + nt * 8 + col, acc[mt][nt][e]);
                }
    }
    if constexpr (PRODUCER)  // the multiplying threads alone: the producer's have returned
        asm volatile("bar.sync 1, %0;\n" :: "n"(NT) : "memory");
    else
        __syncthreads();
    // Where output pixel m's channel 0 is (its channels 1 apart in NHWC, a plane apart in NCHW).
    auto pixel_offset = [&](Index m) -> Index {
        if constexpr (PHASED) {
            const Index image = m / HoWo, p = m - image * HoWo;
            const Index oh = p / Wo, ow = p - oh * Wo;
            return phases->out_offset[phase] + image * phases->image_stride + oh * phases->row_stride +
                   ow * phases->column_stride;
        } else if constexpr (NHWC_OUT) {
            return m * K;
        } else {
            const Index image = m / HoWo;
            return image * K * HoWo + (m - image * HoWo);
        }
    };
    if constexpr (NHWC_OUT) {
        // Vectors of 4 consecutive channels per thread (8 bytes in 16 bits, 16 in float), the block's
        // threads over the tile's pixels x BN / 4 vectors, so that a warp stores whole runs of a
        // pixel row (and of the next: NHWC rows of K channels follow each other) where a lane per
        // channel stored 2 bytes per instruction. Where the output's channels or address do not
        // allow a vector (K or K / groups not a multiple of 4), a channel per thread as before.
        // 16-byte vectors (WIDE): each thread's bias and bounds are read once, and the rows' iterations
        // are unrolled. A memory-bound 1x1 layer spent a third of its issue slots in the loop below,
        // with a division, bounds checks and four bias loads for each 8 bytes stored, one shared-memory
        // load at a time.
        if constexpr (WIDE_TILE) {
            if (wide) {
                constexpr int ROW_STEP = NT / WIDE_VECTORS, ROWS = BM / ROW_STEP;
                const int n = (tid % WIDE_VECTORS) * WIDE, row0 = tid / WIDE_VECTORS;
                const int channel = g * Kg + n0 + n;
                if (n0 + n >= Kg || (PHASED && channel >= out_channels)) return;
                struct alignas(16) YVec { Y v[WIDE]; };
                if (staged_16) {  // the staged vectors as they are, or ReLU'd
                    auto store_rows = [&](auto finish) {
#pragma unroll 4
                        for (int r = 0; r < ROWS; ++r) {
                            const int m = row0 + r * ROW_STEP;
                            const YVec staged = *reinterpret_cast<const YVec*>(h_smem + m * H_STRIDE + n);
                            if (m0 + m >= M) return;
                            *reinterpret_cast<YVec*>(y + pixel_offset(m0 + m) + channel) = finish(staged);
                        }
                    };
                    if (activation == ACT_RELU)
                        store_rows([](YVec v) {
#pragma unroll
                            for (int i = 0; i < WIDE; ++i)
                                v.v[i] = from_acc<Y>(activate<ACT_RELU>(to_acc<float>(v.v[i])));
                            return v;
                        });
                    else
                        store_rows([](YVec v) { return v; });
                    return;
                }
                float b[WIDE];
#pragma unroll
                for (int j = 0; j < WIDE; ++j) b[j] = has_bias ? to_acc<float>(bias[channel + j]) : 0.0f;
                // Calls with a residual read it as one 16-byte vector a row, the vectors of CHUNK rows
                // loaded before their staged values: the 8 (or 4) element loads after each row's
                // staged values doubled a residual layer's time for 1.8x its bytes. Not in stream-K
                // (its persistent loop leaves no registers for them: its 128 x 128 tiles spilled),
                // split-K's runs (no residual: the reduction adds it) or phase launches (costly
                // pixel offsets): these read the residual's elements.
                constexpr bool VECTOR_RESIDUAL = !(STREAM_K || SPLIT_K || PHASED);
                with_epilogue<Y, VECTOR_RESIDUAL>(residual, [&](auto finish) {
                    // Two float4s per 16-bit vector: threads 32 channels apart read their halves in opposite
                    // orders, so that the 8 threads of a 128-bit shared-memory phase hit 8 different bank groups.
                    const int flip = WIDE == 8 ? (n >> 5) & 1 : 0;
                    // The residual's loads are unconditional (a row past M loads the residual's first): a
                    // predicated load made ptxas reload the gather's parameters from the constant bank
                    // in the main loop (a 1-wave layer 7.0 -> 8.2 us, with no residual at all).
                    constexpr bool VECTORS = decltype(finish)::MAY_READ_RESIDUAL;
                    constexpr int CHUNK = VECTORS ? (ROWS < 4 ? ROWS : 4) : 1;
                    static_assert(ROWS % CHUNK == 0, "whole chunks of rows");
                    // (A phase launch's pixel offsets hold more registers: one row at a time, or they spill.)
#pragma unroll(VECTORS || PHASED ? 1 : 4)
                    for (int r0 = 0; r0 < ROWS; r0 += CHUNK) {
                        YVec res[CHUNK];
                        if constexpr (VECTORS) {
#pragma unroll
                            for (int j = 0; j < CHUNK; ++j) {
                                const int m = row0 + (r0 + j) * ROW_STEP;
                                const Index at = m0 + m < M ? pixel_offset(m0 + m) + channel : Index(0);
                                res[j] = load_vector_here<YVec>(residual + at);
                            }
                        }
#pragma unroll
                        for (int j = 0; j < CHUNK; ++j) {
                            const int m = row0 + (r0 + j) * ROW_STEP;
                            // Staged rows exist past M too: loaded before the bound check, the unrolled
                            // rows' loads issue together instead of one row's latency at a time.
                            const float4* staged = reinterpret_cast<const float4*>(c_smem + m * D_STRIDE + n);
                            float4 v[WIDE / 4];
                            v[0] = staged[flip];
                            if constexpr (WIDE == 8) {
                                v[1] = staged[1 - flip];
                                if (flip) {
                                    const float4 first = v[1];
                                    v[1] = v[0];
                                    v[0] = first;
                                }
                            }
                            if (m0 + m >= M) return;
                            const Index at = pixel_offset(m0 + m) + channel;
                            // Channel i's output from its sum s: the residual from its vector, or read.
                            auto element = [&](float s, int i) {
                                if constexpr (VECTORS)
                                    return finish.with_residual(s, res[j].v[i]);
                                else
                                    return finish(s, at + i);
                            };
                            YVec out;
#pragma unroll
                            for (int q = 0; q < WIDE / 4; ++q) {
                                out.v[4 * q] = element(v[q].x + b[4 * q], 4 * q);
                                out.v[4 * q + 1] = element(v[q].y + b[4 * q + 1], 4 * q + 1);
                                out.v[4 * q + 2] = element(v[q].z + b[4 * q + 2], 4 * q + 2);
                                out.v[4 * q + 3] = element(v[q].w + b[4 * q + 3], 4 * q + 3);
                            }
                            *reinterpret_cast<YVec*>(y + at) = out;
                        }
                    }
                });
                return;
            }
        }
        constexpr int CV = 4, VECTORS = BN / CV;
        const bool vectors = aligned_to(CV);
        with_epilogue<Y>(residual, [&](auto finish) {
            if (vectors) {
                struct alignas(CV * sizeof(Y)) YVec { Y v[CV]; };
#pragma unroll 1
                for (int i = tid; i < BM * VECTORS; i += NT) {
                    const int m = i / VECTORS, n = (i % VECTORS) * CV;
                    if (m0 + m >= M || n0 + n >= Kg || (PHASED && g * Kg + n0 + n >= out_channels)) continue;
                    const Index at = pixel_offset(m0 + m) + g * Kg + n0 + n;
                    YVec out;
#pragma unroll
                    for (int j = 0; j < CV; ++j) {
                        const float b = has_bias ? to_acc<float>(bias[g * Kg + n0 + n + j]) : 0.0f;
                        out.v[j] = finish(c_smem[m * D_STRIDE + n + j] + b, at + j);
                    }
                    *reinterpret_cast<YVec*>(y + at) = out;
                }
                return;
            }
            // A phase launch of a widened output stores a few of the tile's columns: loop over those alone.
            const int columns = PHASED ? max(0, min(BN, min(Kg - n0, out_channels - g * Kg - n0))) : BN;
#pragma unroll 1
            for (int i = tid; i < BM * columns; i += NT) {
                const int m = i / columns, n = i % columns;
                if (m0 + m >= M || n0 + n >= Kg || (PHASED && g * Kg + n0 + n >= out_channels)) continue;
                const Index at = pixel_offset(m0 + m) + g * Kg + n0 + n;
                const float b = has_bias ? to_acc<float>(bias[g * Kg + n0 + n]) : 0.0f;
                y[at] = finish(c_smem[m * D_STRIDE + n] + b, at);
            }
        });
        return;
    }
    constexpr int PIXELS = BM / 32;                         // pixels per lane
    // A phase launch's output is the whole transposed convolution's: its planes, not the phase's.
    const Index plane = PHASED ? static_cast<Index>(phases->channel_stride) : HoWo;
    // Where planes hold whole runs of RUN pixels (and the output is aligned to them), each lane stores RUNS
    // runs of RUN consecutive pixels of a channel, each as one vector, a warp 32 runs in a row; a lane's pixels 32
    // apart took an element store each, most of a short reduction's NCHW epilogue (benchmarks/NOTES.md,
    // "Runs of pixels in the NCHW epilogue"). A phase's pixels lie stride columns apart: elements.
    constexpr int RUN = PIXELS % 4 == 0 ? 4 : (PIXELS % 2 == 0 ? 2 : 1), RUNS = PIXELS / RUN;  // 192: runs of 2
    if constexpr (!PHASED) {
        if (HoWo % RUN == 0 && reinterpret_cast<unsigned long long>(y) % (RUN * sizeof(Y)) == 0) {
            struct alignas(RUN * sizeof(Y)) YRun { Y v[RUN]; };
            struct alignas(RUN * sizeof(float)) Staged { float v[RUN]; };
            Index y_run[RUNS];                              // pixel_offset of a run's first pixel, or -1 past M
#pragma unroll
            for (int q = 0; q < RUNS; ++q) {
                const Index m = m0 + (q * 32 + lane) * RUN;
                y_run[q] = m < M ? pixel_offset(m) : Index(-1);
            }
            with_epilogue<Y>(residual, [&](auto finish) {
#pragma unroll 1
                for (int n = warp; n < BN && n0 + n < Kg; n += NWARPS) {
                    const int channel = g * Kg + n0 + n;
                    const float b = has_bias ? to_acc<float>(bias[channel]) : 0.0f;
                    const Index channel_offset = static_cast<Index>(channel) * plane;
#pragma unroll
                    for (int q = 0; q < RUNS; ++q) {
                        if (y_run[q] < 0) continue;
                        const Staged staged =
                            *reinterpret_cast<const Staged*>(c_smem + n * C_STRIDE + (q * 32 + lane) * RUN);
                        const Index at = y_run[q] + channel_offset;
                        YRun out;
#pragma unroll
                        for (int j = 0; j < RUN; ++j) out.v[j] = finish(staged.v[j] + b, at + j);
                        *reinterpret_cast<YRun*>(y + at) = out;
                    }
                }
            });
            return;
        }
    }
    Index y_pixel[PIXELS];                                  // pixel_offset, or -1 past M
#pragma unroll
    for (int i = 0; i < PIXELS; ++i) {
        const Index m = m0 + lane + 32 * i;
        y_pixel[i] = m < M ? pixel_offset(m) : Index(-1);
    }
    with_epilogue<Y>(residual, [&](auto finish) {
#pragma unroll 1
        for (int n = warp; n < BN && n0 + n < Kg && (!PHASED || g * Kg + n0 + n < out_channels); n += NWARPS) {
            const int channel = g * Kg + n0 + n;
            const float b = has_bias ? to_acc<float>(bias[channel]) : 0.0f;
            const Index channel_offset = static_cast<Index>(channel) * plane;
#pragma unroll
            for (int i = 0; i < PIXELS; ++i)
                if (y_pixel[i] >= 0)
                    y[y_pixel[i] + channel_offset] = finish(c_smem[n * C_STRIDE + lane + 32 * i] + b,
                                                            y_pixel[i] + channel_offset);
        }
    });
}

template <typename T, typename Index, int BM, int BN, int BK, int WARPS_M, int WARPS_N, int STAGES, int VEC,
          int NCHW_A, int WGMMA_ROWS, bool NHWC_OUT, bool ROUND_A, bool SPLIT_K>
__global__ void NHWC_GEMM_LAUNCH_BOUNDS
implicit_gemm_nhwc(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                   void* __restrict__ y_out, int has_bias, const T* __restrict__ residual, int has_residual, int activation,
                   int N, int C, int H, int W, int K, int Ho, int Wo, int kh, int kw,
                   int sh, int sw, int pt, int pl, int dh, int dw, int groups, int splits, int split_elements) {
    int tile = blockIdx.x, tile_n = blockIdx.y;
    if constexpr (NCHW_A) {
        // Every channel tile of a pixel tile reads the same input columns: launched one after another
        // (channel tiles fastest), they run together and all but the first read the columns from L2, where
        // in grid order (pixel tiles fastest) a large layer read its whole input again from DRAM for each.
        const int linear = blockIdx.x + gridDim.x * blockIdx.y;
        tile = linear / gridDim.y;
        tile_n = linear - tile * gridDim.y;
    }
    nhwc_gemm_tile<T, Index, BM, BN, BK, WARPS_M, WARPS_N, STAGES, VEC, NCHW_A, WGMMA_ROWS, NHWC_OUT, ROUND_A, SPLIT_K,
                   false>(x, w, bias, y_out, has_bias, residual, has_residual, activation, N, C, H, W, K, Ho, Wo, kh, kw,
                          sh, sw, pt, pl, dh, dw, groups, splits, split_elements, tile, tile_n, nullptr, 0);
}

// The producer warpgroup's tile, both its tiles of each stage copied by TMA with the 128-byte swizzle
// the wgmma descriptors read; the maps are made by the host for the operands' addresses
// (cupyconv/tensor_map.py): `weight_map` describes w as rows of K output channels by kh kw C columns,
// read in BK x BN boxes; `x_map` is x's im2col map (BM window corners of BK channels a copy, the
// corners bounded by the padding, the convolution's strides apart), or, where `x_is_matrix` (1x1,
// stride-1, unpadded layers), the 2-D map of x as the matrix [N H W][C] read in BK x BM boxes, whose
// copies ran up to 1.09x faster on the 128- and 192-pixel tiles (H200). One group, C % BK == 0. ROUND_A: x
// is a float32 NHWC input read in place, rounded to TF32 by the multiplying warpgroups. SPLIT_K: run
// blockIdx.z of `splits` of the reduction, its float32 sums written as the other instances' are.
template <typename T, typename Index, int BM, int BN, int BK, int WARPS_M, int WARPS_N, int STAGES, int VEC,
          int WGMMA_ROWS, bool NHWC_OUT, bool ROUND_A, bool SPLIT_K>
__global__ void NHWC_GEMM_LAUNCH_BOUNDS
implicit_gemm_nhwc_tma(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                       void* __restrict__ y_out, int has_bias, const T* __restrict__ residual, int has_residual,
                       int activation, int N, int C, int H, int W, int K, int Ho, int Wo, int kh, int kw,
                       int sh, int sw, int pt, int pl, int dh, int dw, int groups, int splits, int split_elements,
                       const __grid_constant__ TensorMap weight_map, const __grid_constant__ TensorMap x_map,
                       int x_is_matrix) {
    nhwc_gemm_tile<T, Index, BM, BN, BK, WARPS_M, WARPS_N, STAGES, VEC, false, WGMMA_ROWS, NHWC_OUT, ROUND_A, SPLIT_K,
                   false, false>(x, w, bias, y_out, has_bias, residual, has_residual, activation, N, C, H, W, K, Ho,
                                 Wo, kh, kw, sh, sw, pt, pl, dh, dw, groups, splits, split_elements, blockIdx.x,
                                 blockIdx.y, nullptr, 0, nullptr, &weight_map, &x_map, x_is_matrix != 0);
}

// The stride phases of a transposed convolution whose kernel is its stride (every phase one tap, a 1x1
// convolution of the whole of y) as one GEMM of the producer warpgroup's tile, launched as
// implicit_gemm_nhwc_tma is for the 1x1 problem y [N Hy Wy][C] times the phases' weights stacked
// [count K / count][C]^T, with a PhaseTable more. Channel tile blockIdx.y lies in one phase (K / count a
// multiple of BN), which places its pixels as implicit_gemm_nhwc_phases does (out_offset less the phase's
// first GEMM channel, so that the GEMM's channel n lands on channel n - p K / count of phase p).
template <typename T, typename Index, int BM, int BN, int BK, int WARPS_M, int WARPS_N, int STAGES, int VEC,
          int WGMMA_ROWS, bool ROUND_A>
__global__ void NHWC_GEMM_LAUNCH_BOUNDS
implicit_gemm_nhwc_tma_stacked(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                               void* __restrict__ y_out, int has_bias, const T* __restrict__ residual,
                               int has_residual, int activation, int N, int C, int H, int W, int K, int Ho, int Wo,
                               int kh, int kw, int sh, int sw, int pt, int pl, int dh, int dw, int groups, int splits,
                               int split_elements, const __grid_constant__ TensorMap weight_map,
                               const __grid_constant__ TensorMap x_map, int x_is_matrix,
                               const __grid_constant__ PhaseTable phases) {
    const int phase = static_cast<int>(blockIdx.y) * BN / (K / phases.count);
    nhwc_gemm_tile<T, Index, BM, BN, BK, WARPS_M, WARPS_N, STAGES, VEC, false, WGMMA_ROWS, true, ROUND_A, false,
                   true>(x, w, bias, y_out, has_bias, residual, has_residual, activation, N, C, H, W, K, Ho, Wo, kh,
                         kw, sh, sw, pt, pl, dh, dw, groups, 1, 0, blockIdx.x, blockIdx.y, &phases, phase, nullptr,
                         &weight_map, &x_map, x_is_matrix != 0);
}

// Pairs of the producer warpgroup's tiles: the clusters of two blocks along y (channel tiles n0 and n0 +
// BN of one pixel tile; gridDim.y even) each copy half of the input tile once by TMA and multicast it
// into both blocks' shared memory, so that a block reads 3/4 (128 pixels) to 2/3 (256) of the L2 bytes
// it reads alone. Clusters exist from sm_90 on: other targets (this file's mma.sync tiles) never see it.
#if __CUDA_ARCH__ >= 900
template <typename T, typename Index, int BM, int BN, int BK, int WARPS_M, int WARPS_N, int STAGES, int VEC,
          int WGMMA_ROWS, bool NHWC_OUT, bool ROUND_A, bool SPLIT_K>
__global__ void NHWC_GEMM_LAUNCH_BOUNDS __cluster_dims__(1, 2, 1)
implicit_gemm_nhwc_tma_pair(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                            void* __restrict__ y_out, int has_bias, const T* __restrict__ residual, int has_residual,
                            int activation, int N, int C, int H, int W, int K, int Ho, int Wo, int kh, int kw,
                            int sh, int sw, int pt, int pl, int dh, int dw, int groups, int splits, int split_elements,
                            const __grid_constant__ TensorMap weight_map, const __grid_constant__ TensorMap x_map) {
    nhwc_gemm_tile<T, Index, BM, BN, BK, WARPS_M, WARPS_N, STAGES, VEC, false, WGMMA_ROWS, NHWC_OUT, ROUND_A, SPLIT_K,
                   false, false, 2>(x, w, bias, y_out, has_bias, residual, has_residual, activation, N, C, H, W, K, Ho,
                                    Wo, kh, kw, sh, sw, pt, pl, dh, dw, groups, splits, split_elements, blockIdx.x,
                                    blockIdx.y, nullptr, 0, nullptr, &weight_map, &x_map);
}
#endif

// PINGPONG (implicit_gemm_nhwc_pingpong; 16-bit or TF32 layers of one group, NHWC in and out; x read as the matrix
// [N H W][C] for 1x1, stride-1, unpadded layers (x_is_matrix), elsewhere by the im2col map in whole k tiles of
// one tap): the GEMM y [M][K] = x [M][kh kw C] w [K][kh kw C]^T on persistent blocks (gridDim.x, at most one per
// SM) of a producer warpgroup and two consumer warpgroups. Block b's tiles are b, b + gridDim.x, .. (channel tiles
// fastest, so that the blocks on one pixel tile read its pixels from L2), and consumer c takes every other
// one of them (c, c + 2, ..), each a whole BM x BN tile: while one multiplies, the other runs its
// epilogue, which on one warpgroup's tiles (the producer tiles) left the tensor cores idle for a third of
// a 1x1 layer's time (benchmarks/NOTES.md, "What a 1x1 channels-last tile's time is made of").
// One thread of the producer copies both tiles of every k tile of the block's tiles, in order, into one
// ring of STAGES stages by TMA (x and w as matrices; zeros past M, K and C); "full" and "empty"
// mbarriers per stage. The consumers take their turns at the ring in tile order: one starts its tile's
// MMAs once the other has waited for all of its own tile's copies (named barriers 1 and 2), so that no
// consumer waits on a stage whose previous fill has not landed (a full barrier a phase behind its waiter
// reads as complete: parities alternate). Each consumer stages its tile's outputs in its own shared
// memory ([BM][BN + 8] 16-bit values: a warp's 8 rows x 4 column pairs hit 32 banks; RESIDUAL and float32:
// float sums of 64 rows at a time), rounded once after bias, residual and activation, and stores them as 16-
// or 32-byte vectors of 8 channels along rows (K % 8 == 0). 32-bit indices. float32 (TF32): the weight
// comes rounded (the prepared weight), and x either as a copy rounded to TF32 (multiplied from shared memory, as
// 16 bits are) or, ROUND_A, read in place and rounded on its way to the tensor cores as the producer tiles round
// it: each warp's A rows loaded from the stage into registers (ldmatrix), rounded, and multiplied from there
// (wgmma's A in registers), a k tile's instructions in two groups, each group's registers loaded while the
// other group's MMAs run. From registers the MMAs ran 1.2x longer than from shared memory on
// 3x3 layers (H200; rounding in the ring by the producer's idle warps instead was 1.6x slower still:
// benchmarks/NOTES.md), so the planner copies x where a layer's taps make the copy's pass small beside them. RESIDUAL: calls with a residual (has_residual), whose epilogue is an
// instance of its own (one body with both spilled registers). SPLIT_K (layers of too few tiles for two a
// block): the block's work items are (run, tile) pairs, runs outermost, run r taking k tiles [r ceil(k_tiles
// / splits), ..) of its tile, its float32 sums written from the fragments, without bias, to y + r split_elements
// ([M][K]; kernels/split_k_reduce.cu adds the runs in order: the same bits every run).
// CLUSTER > 1 (implicit_gemm_nhwc_pingpong_cluster): split-K without the workspace and the reduction's launch.
// The grid is tiles x CLUSTER blocks, one work item each, in clusters of CLUSTER: block rank r of a cluster
// takes run r of the cluster's tile and stages its float32 sums of rows [q BM / CLUSTER, ..) in its own shared
// memory (its staging for its own rows, the idle ring for block q's); one thread copies each of block q's
// regions into block q's staging by the TMA unit (cp.async.bulk, distributed shared memory; the staging is
// free, one item a block), the bytes counted on q's `ready`. Once every run's sums are there, block r finishes
// its rows: the runs' sums read from its own shared memory and added in run order (the same bits every run),
// bias, residual and activation, 16-byte stores. A block leaves only after every block has its rows (the
// cluster barrier), as its copies out read its shared memory until then.
// TAPS 2 (16-bit layers of 32 channels, im2col copies): a k tile holds two taps' pixels, each tap's BM x 64 bytes a
// copy of its own, 64-byte swizzled, in its half of the stage (the weight's 128-byte k rows hold the same two taps'
// channels side by side), where one tap a k tile multiplied zeros half the time. An odd last tap's k tile holds that
// tap in both halves, the second against the weight's zero columns past kh kw C: a stale half (an earlier tile's
// pixels) could hold an inf that those zeros would make NaN in outputs that never saw it, and multiplying the first
// half alone (a break out of the instruction loop) made ptxas serialize every wgmma of the tile (its C7520).
// STRIP_BYTES 64 or 128, PIXEL_STRIPS (implicit_gemm_nhwc_pingpong_strips: 16-bit layers of 32 or 64 channels, a
// pixel's STRIP_BYTES, stride 1 and no dilation along w): a k tile is a whole kernel row r. Its pixels are not copied
// tap by tap: each 64-pixel half of the tile is one strip of 64 + kw - 1 input pixels (a 4-D tiled copy, swizzled
// across the pixel's bytes, zeros outside x), and tap s's A rows are that strip from pixel s on, a descriptor s rows
// further (inside the swizzle's pattern: see wgmma_descriptor). The im2col copies read every pixel kw times from L2,
// in rows of 64 bytes for 32 channels, whose count bounded the two-taps tile (benchmarks/NOTES.md, "Pixel strips").
// The pixel's bytes are a template argument so that the tap loop's instructions take one descriptor form, unrolled
// (a select between forms, or a trip count that changes from k tile to k tile, made ptxas serialize the wgmma). A
// half is one output row's 64-pixel segment (image, oh, 64 b ..), so its pixels are found by segment, not m0 + row.
template <typename T, int BM, int BN, int STAGES, int TAPS, bool RESIDUAL, bool SPLIT_K, int CLUSTER, bool ROUND_A,
          int STRIP_BYTES = 0>
__device__ __forceinline__ void
pingpong_tiles(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
               void* __restrict__ y_out, int has_bias, const T* __restrict__ residual, int has_residual,
               int activation, int N, int C, int H, int W, int K, int Ho, int Wo, int kh, int kw,
               int sh, int sw, int pt, int pl, int dh, int dw, int groups, int splits, int split_elements,
               const TensorMap& weight_map, const TensorMap& x_map, int x_is_matrix) {
    static_assert((BM == 64 || BM == 128) && (BN == 64 || BN == 128), "one or two 64-row halves; 64 or 128 channels");
    static_assert(!(SPLIT_K && RESIDUAL), "split runs' sums are finished by the reduction");
    static_assert(!ROUND_A || sizeof(T) == 4, "ROUND_A: a float32 x read in place, unrounded");
    static_assert(TAPS <= 1 || (TAPS == 2 && sizeof(T) == 2 && !ROUND_A), "two taps a k tile: 16-bit, 32 channels");
    constexpr bool PIXEL_STRIPS = STRIP_BYTES > 0, CLUSTER_SUMS = CLUSTER > 1;
    static_assert(!PIXEL_STRIPS || (sizeof(T) == 2 && TAPS == 1 && !ROUND_A && !SPLIT_K && !CLUSTER_SUMS &&
                                    (STRIP_BYTES == 64 || STRIP_BYTES == 128)),
                  "pixel strips: 16-bit pixels of 32 or 64 channels, whole reductions");
    static_assert(!(CLUSTER_SUMS && (SPLIT_K || RESIDUAL)) && BM % (8 * CLUSTER) == 0,
                  "a cluster's runs finish their tile themselves, in whole passes of rows");
    constexpr int BK = 128 / sizeof(T), INST_K = mma_op<T>::k;   // a k tile: 128-byte rows
    constexpr int A_STAGE = BM * 128, B_STAGE = BN * 128;        // bytes
    constexpr int TAP_BYTES = PIXEL_STRIPS ? STRIP_BYTES : 128 / TAPS;  // a tap's pixel rows
    constexpr int A_TAP = A_STAGE / TAPS;                                // a tap's copy in a stage
    constexpr int HALVES = BM / 64, H_STRIDE = BN + 8;
    // PIXEL_STRIPS: a stage holds HALVES strips of strip_rows pixels (whole 8-row swizzle patterns) and kernel row
    // r's weight, its kw taps' STRIP_BYTES a channel in 128-byte k rows (32 channels: an odd kw's last half is
    // never multiplied).
    const int strip_rows = PIXEL_STRIPS ? (64 + kw - 1 + 7) / 8 * 8 : 0, strip_bytes = strip_rows * TAP_BYTES;
    const int weight_blocks = PIXEL_STRIPS ? (kw * TAP_BYTES + 127) / 128 : 1;
    const int a_stage_bytes = PIXEL_STRIPS ? HALVES * strip_bytes : A_STAGE, b_stage_bytes = weight_blocks * B_STAGE;
    constexpr int ORDER_0_TO_1 = 1, ORDER_1_TO_0 = 2, STAGING = 3;  // named barriers (0: __syncthreads)
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023);
    unsigned char* a_smem = smem;
    unsigned char* b_smem = smem + STAGES * a_stage_bytes;
    // A consumer's: [BM][H_STRIDE] 16-bit values, or (float32) a 64-row half's float sums.
    constexpr int STAGING_BYTES = (sizeof(T) == 4 ? 64 * 4 : BM * 2) * H_STRIDE;
    unsigned char* staging = b_smem + STAGES * b_stage_bytes;                       // [2][STAGING_BYTES]
    unsigned long long* full = reinterpret_cast<unsigned long long*>(staging + 2 * STAGING_BYTES);
    unsigned long long* empty = full + STAGES;
    unsigned long long* ready = empty + STAGES;  // CLUSTER_SUMS: every run's sums of this block's rows here

    const int HoWo = Ho * Wo, M = N * HoWo;
    // PIXEL_STRIPS: a pixel tile is HALVES segments of 64 pixels of an output row, segments_w of them a row.
    const int segments_w = (Wo + 63) / 64, segments = N * Ho * segments_w;
    const int tiles_n = (K + BN - 1) / BN;
    const int tiles = (PIXEL_STRIPS ? (segments + HALVES - 1) / HALVES : (M + BM - 1) / BM) * tiles_n;
    // k tiles per tap (whole ones past 1x1), or (TAPS 2) taps per k tile, or (PIXEL_STRIPS) kernel rows
    const int chunks = TAPS == 1 ? (C + BK - 1) / BK : 1, taps = kh * kw;
    const int k_tiles = PIXEL_STRIPS ? kh : TAPS == 1 ? taps * chunks : (taps + 1) / 2;
    const bool odd_last = TAPS == 2 && (taps & 1);  // the last k tile holds one tap
    const int runs = SPLIT_K ? splits : CLUSTER, items = tiles * runs, run_tiles = (k_tiles + runs - 1) / runs;
    // Work item -> its tile, its run and the run's k tiles [kt0, kt1): runs outermost, or (CLUSTER_SUMS)
    // innermost, a cluster's blocks on one tile.
    auto item_of = [&](int item, int& tile, int& run, int& kt0, int& kt1) {
        run = SPLIT_K ? item / tiles : (CLUSTER_SUMS ? item % CLUSTER : 0);
        tile = CLUSTER_SUMS ? item / CLUSTER : item - run * tiles;
        kt0 = min(run * run_tiles, k_tiles);
        kt1 = min(kt0 + run_tiles, k_tiles);
    };
    const int tid = threadIdx.x, warpgroup = tid >> 7;
    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbarrier_init(full + s, 1);   // the copying thread's expect-tx arrival
            mbarrier_init(empty + s, 4);  // the lane 0s of the consumer warpgroup that read it
        }
        if constexpr (CLUSTER_SUMS) {
            mbarrier_init(ready, 128);  // this block's consumer threads, once; the other runs' copies as bytes
            mbarrier_init_fence();
        }
    }
    if constexpr (CLUSTER_SUMS) {
        if (gridDim.x != items) __trap();  // the host launches one block a work item
        cluster_sync();  // no block arrives on another's barriers before they exist
    } else {
        __syncthreads();
    }
    // Registers moved from the producer (copies and counters alone) to the consumers (128 accumulators
    // a thread): 384 threads x 168 at launch, 128 x 40 + 256 x 232 after.
    if (warpgroup == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (tid == 0) {
            int seq = 0;  // k tiles copied so far, over the block's items
#pragma unroll 1
            for (int item = blockIdx.x; item < items; item += gridDim.x) {
                int tile, run, kt0, kt1;
                item_of(item, tile, run, kt0, kt1);
                const int m0 = tile / tiles_n * BM, n0 = tile % tiles_n * BN;
                if constexpr (PIXEL_STRIPS) {
                    // Each half's strip: image, output row and first input column (zeros past x, and past the last
                    // segment: its image is N).
                    int image_of[HALVES], oh_of[HALVES], w_of[HALVES];
#pragma unroll
                    for (int h = 0; h < HALVES; ++h) {
                        const int segment = tile / tiles_n * HALVES + h, row = segment / segments_w;
                        image_of[h] = row / Ho;
                        oh_of[h] = (row - image_of[h] * Ho) * sh - pt;
                        w_of[h] = (segment - row * segments_w) * 64 - pl;
                    }
#pragma unroll 1
                    for (int kt = kt0; kt < kt1; ++kt, ++seq) {
                        const int stage = seq % STAGES;
                        if (seq >= STAGES) mbarrier_wait(empty + stage, (seq / STAGES - 1) & 1);
                        mbarrier_arrive_expect_tx(full + stage, a_stage_bytes + b_stage_bytes);
#pragma unroll
                        for (int h = 0; h < HALVES; ++h)
                            tma_load_4d(a_smem + stage * a_stage_bytes + h * strip_bytes, &x_map, 0, w_of[h],
                                        oh_of[h] + kt * dh, image_of[h], full + stage);
#pragma unroll 1
                        for (int j = 0; j < weight_blocks; ++j)
                            tma_load_2d(b_smem + stage * b_stage_bytes + j * B_STAGE, &weight_map, kt * kw * C + j * BK,
                                        n0, full + stage);
                    }
                    continue;
                }
                // im2col: the tile's first window corner (image, h0, w0); the map walks the others. The k tiles'
                // taps counted along (TapWalk): the integer divisions before a block's first copy took ~0.4 us
                // of its ~7 (H200, a 1x1 layer at batch 8).
                int image = 0, h0 = 0, w0 = 0;
                if (!x_is_matrix) {
                    image = m0 / HoWo;
                    const int p = m0 - image * HoWo;
                    h0 = p / Wo * sh - pt;
                    w0 = p % Wo * sw - pl;
                }
                TapWalk tap(kt0 * TAPS, chunks, kw, BK / TAPS, 0);
#pragma unroll 1
                for (int kt = kt0; kt < kt1; ++kt, ++seq) {
                    const int stage = seq % STAGES;
                    const bool repeated = odd_last && kt == k_tiles - 1;  // its one tap in both halves
                    if (seq >= STAGES) mbarrier_wait(empty + stage, (seq / STAGES - 1) & 1);
                    mbarrier_arrive_expect_tx(full + stage, TAPS * A_TAP + B_STAGE);
#pragma unroll 1
                    for (int t = 0; t < TAPS; ++t) {
                        unsigned char* a_dst = a_smem + stage * A_STAGE + t * A_TAP;
                        if (x_is_matrix)
                            tma_load_2d(a_dst, &x_map, tap.c, m0, full + stage);
                        else
                            tma_load_im2col_4d(a_dst, &x_map, tap.c, w0, h0, image, tap.s * dw, tap.r * dh,
                                               full + stage);
                        if (!repeated) tap.next(chunks, kw, BK / TAPS, 0);
                    }
                    tma_load_2d(b_smem + stage * B_STAGE, &weight_map, kt * BK, n0, full + stage);
                }
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const int consumer = warpgroup - 1, ctid = tid & 127, warp = ctid >> 5, lane = tid & 31;
    unsigned char* out_stage = staging + consumer * STAGING_BYTES;
    T* y = static_cast<T*>(y_out);
    // float32: this lane's ldmatrix row of a 64-row half (its warp's 16 rows), and its row's swizzle.
    const int a_row_in_half = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
    int base = 0;  // k tiles of the block's items before item i, both consumers'
#pragma unroll 1
    for (int i = 0, item = blockIdx.x; item < items; ++i, item += gridDim.x) {
        int tile, run, kt0, kt1;
        item_of(item, tile, run, kt0, kt1);
        const int length = kt1 - kt0;
        if ((i & 1) != consumer) {  // the other consumer's item
            base += length;
            continue;
        }
        const int m0 = tile / tiles_n * BM, n0 = tile % tiles_n * BN;
        // Half h's first output pixel and how many of its 64 rows are pixels: m0 + 64 h and up to M, or
        // (PIXEL_STRIPS) its segment's, up to the end of its output row.
        int half_m[HALVES], half_rows[HALVES];
#pragma unroll
        for (int h = 0; h < HALVES; ++h) {
            if constexpr (PIXEL_STRIPS) {
                const int segment = tile / tiles_n * HALVES + h, row = segment / segments_w;
                const int ow = (segment - row * segments_w) * 64;
                half_m[h] = row * Wo + ow;
                half_rows[h] = segment < segments ? min(64, Wo - ow) : 0;
            } else {
                half_m[h] = m0 + h * 64;
                half_rows[h] = min(64, M - half_m[h]);
            }
        }
        if (i > 0)  // the other consumer has waited for all of item i - 1's copies
            asm volatile("bar.sync %0, 256;\n" :: "r"(consumer ? ORDER_0_TO_1 : ORDER_1_TO_0) : "memory");
        float acc[HALVES][BN / 2];
#pragma unroll
        for (int h = 0; h < HALVES; ++h)
#pragma unroll
            for (int j = 0; j < BN / 2; ++j) acc[h][j] = 0.0f;
        constexpr int GROUP = BK / INST_K / 2;  // ROUND_A: a group's instructions' k, two groups a k tile
        unsigned a[2][GROUP][HALVES][4];       // ROUND_A: A's rounded fragments, a set a group
#pragma unroll 1
        for (int kt = 0; kt < length; ++kt) {
            const int seq = base + kt, stage = seq % STAGES;
            mbarrier_wait(full + stage, (seq / STAGES) & 1);
            const unsigned long long channels = wgmma_descriptor(shared_address(b_smem + stage * B_STAGE));
            if constexpr (ROUND_A) {
                const unsigned char* a_stage = a_smem + stage * A_STAGE;
#pragma unroll
                for (int g = 0; g < 2; ++g) {
                    // The group before last, which read set g, retired; at g 1 that is tile kt - 1's last. (Four
                    // groups of one instruction's k, three in flight, ran 1.1-1.2x slower: H200.)
                    wgmma_wait<1>();
                    if (g == 1 && kt > 0 && lane == 0) mbarrier_arrive(empty + (seq - 1) % STAGES);
#pragma unroll
                    for (int j = 0; j < GROUP; ++j)
#pragma unroll
                        for (int h = 0; h < HALVES; ++h) {
                            const int row = h * 64 + a_row_in_half;  // 16-byte pieces of 4 channels, swizzled
                            ldmatrix_x4(a[g][j][h], a_stage + row * 128 +
                                                        swizzle128_slot(2 * (g * GROUP + j) + (lane >> 4), row) * 16);
#pragma unroll
                            for (int e = 0; e < 4; ++e) a[g][j][h][e] = to_tf32_for_mma(__uint_as_float(a[g][j][h][e]));
                        }
                    wgmma_fence();
#pragma unroll
                    for (int j = 0; j < GROUP; ++j)
#pragma unroll
                        for (int h = 0; h < HALVES; ++h)
                            wgmma_rs<T, BN>::run(acc[h], a[g][j][h], channels + (g * GROUP + j) * 2);
                    wgmma_commit();
                }
            } else if constexpr (PIXEL_STRIPS) {
                // Tap s, INST_K channels j: the strips from pixel s on, the weight's k rows from s C + INST_K j on.
                constexpr int STRIP_CHANNELS = STRIP_BYTES / static_cast<int>(sizeof(T));
                const unsigned strips = shared_address(a_smem + stage * a_stage_bytes);
                const unsigned weights = shared_address(b_smem + stage * b_stage_bytes);
                wgmma_fence();
#pragma unroll 1
                for (int s = 0; s < kw; ++s)
#pragma unroll
                    for (int j = 0; j < STRIP_CHANNELS / INST_K; ++j) {
                        const int k = s * STRIP_CHANNELS + j * INST_K;
                        const unsigned long long channels_k =
                            wgmma_descriptor(weights + k / BK * B_STAGE + k % BK * static_cast<int>(sizeof(T)));
#pragma unroll
                        for (int h = 0; h < HALVES; ++h)
                            wgmma_op<T, BN>::run(acc[h],
                                                 wgmma_descriptor<TAP_BYTES>(strips + h * strip_bytes +
                                                                             s * TAP_BYTES + j * INST_K *
                                                                             static_cast<int>(sizeof(T))),
                                                 channels_k);
                    }
                wgmma_commit();
                wgmma_wait<1>();  // tile kt - 1's MMAs retired: its stage may be refilled
                if (kt > 0 && lane == 0) mbarrier_arrive(empty + (seq - 1) % STAGES);
            } else {
                const unsigned long long pixels = wgmma_descriptor<TAP_BYTES>(shared_address(a_smem + stage * A_STAGE));
                constexpr int TAP_K = BK / INST_K / TAPS;  // instructions a tap
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < BK / INST_K; ++kk) {
#pragma unroll
                    for (int h = 0; h < HALVES; ++h)  // + a tap's copy; + 64 rows; + 32 bytes of k per instruction
                        wgmma_op<T, BN>::run(acc[h], pixels + (kk / TAP_K * A_TAP + h * 64 * TAP_BYTES) / 16 +
                                                         kk % TAP_K * 2, channels + kk * 2);
                }
                wgmma_commit();
                wgmma_wait<1>();  // tile kt - 1's MMAs retired: its stage may be refilled
                if (kt > 0 && lane == 0) mbarrier_arrive(empty + (seq - 1) % STAGES);
            }
        }
        if (item + gridDim.x < items)  // the other consumer's next item may start
            asm volatile("bar.arrive %0, 256;\n" :: "r"(consumer ? ORDER_1_TO_0 : ORDER_0_TO_1) : "memory");
        wgmma_wait<0>();
        if (length > 0 && lane == 0) mbarrier_arrive(empty + (base + length - 1) % STAGES);
        base += length;

        // Epilogue. Without a residual, the tile's finished 16-bit outputs (bias and activation applied,
        // rounded once) are staged and stored as they are. With one, each 64-row half's float sums are
        // staged (the same bytes) and the stores add the bias and the residual, read as 16-byte vectors,
        // before the one rounding. Each staging is written only after this consumer's stores of the last
        // one read it (named barrier STAGING + consumer).
        const int quad = lane >> 2, tq = lane & 3;
        constexpr int VECTORS = BN / 8, ROW_STEP = 128 / VECTORS;  // 16-byte vectors of a row
        struct alignas(16) Vec { T v[8]; };
        const int n = ctid % VECTORS * 8, row0 = ctid / VECTORS;  // this thread's 8 channels, first row
        auto load_vector = [](const T* p) {  // 8 channels of the residual in 16-byte pieces, loaded here
            Vec v;
#pragma unroll
            for (int q = 0; q < static_cast<int>(sizeof(Vec)) / 16; ++q)
                reinterpret_cast<uint4*>(&v)[q] = load_vector_here<uint4>(p + q * (16 / static_cast<int>(sizeof(T))));
            return v;
        };
        if constexpr (CLUSTER_SUMS) {
            // Block r of the cluster finishes rows [r ROWS, (r + 1) ROWS) of the tile. Each block stages its run's
            // sums of its own rows in its staging at [run], and of block q's rows in the idle ring at [q], each
            // [ROWS][F_STRIDE] as block q's staging holds them; one thread then copies each such region by the TMA
            // unit into block q's staging at [run], the bytes counted on q's `ready`. Block r reads its rows' runs
            // from its own shared memory in run order once they are all there: the same bits every run.
            constexpr int F_STRIDE = BN + 8, ROWS = BM / CLUSTER, REGION = ROWS * F_STRIDE;  // floats
            static_assert(BM * F_STRIDE * 4 == 2 * STAGING_BYTES,
                          "every run's sums of a block's rows fill its staging");
            static_assert(CLUSTER * REGION * 4 <= STAGES * (A_STAGE + B_STAGE), "the outgoing sums fit the ring");
            float* sums = reinterpret_cast<float*>(staging);     // [run][ROWS][F_STRIDE]: this block's rows
            float* outgoing = reinterpret_cast<float*>(a_smem);  // [owner][ROWS][F_STRIDE]: this run's, theirs
            // A lane pair swaps values so that each stores 4 columns of one row (the even lane row quad's, the
            // odd one row quad + 8's): float4 stores.
            const int odd = tq & 1;
#pragma unroll
            for (int h = 0; h < HALVES; ++h) {
                const int row = h * 64 + warp * 16 + quad + odd * 8, owner = row / ROWS;  // one owner a warp
                float* to = (owner == run ? sums + run * REGION : outgoing + owner * REGION) +
                            (row - owner * ROWS) * F_STRIDE + (tq >> 1) * 4;
#pragma unroll
                for (int nb = 0; nb < BN / 8; ++nb) {
                    const float a0 = acc[h][4 * nb], a1 = acc[h][4 * nb + 1];      // row quad
                    const float b0 = acc[h][4 * nb + 2], b1 = acc[h][4 * nb + 3];  // row quad + 8
                    const float r0 = __shfl_xor_sync(0xffffffffu, odd ? a0 : b0, 1);
                    const float r1 = __shfl_xor_sync(0xffffffffu, odd ? a1 : b1, 1);
                    *reinterpret_cast<float4*>(to + nb * 8) =
                        odd ? make_float4(r0, r1, b0, b1) : make_float4(a0, a1, r0, r1);
                }
            }
            fence_proxy_async_shared();  // the outgoing sums, to the TMA unit
            asm volatile("bar.sync %0, 128;\n" :: "r"(STAGING + consumer) : "memory");
            if (ctid == 0) {
#pragma unroll 1
                for (int q = 0; q < CLUSTER; ++q)
                    if (q != run) bulk_copy_to_cluster(sums + run * REGION, outgoing + q * REGION, REGION * 4, ready, q);
                mbarrier_arrive_expect_tx(ready, (CLUSTER - 1) * REGION * 4);
            } else {
                mbarrier_arrive(ready);  // this thread's own rows stored
            }
            mbarrier_wait(ready, 0);
            // This block's rows are all here, so every copy into it is done; once every block has arrived here,
            // every copy out of this block is too, and it may exit (cluster_wait below).
            __syncwarp();
            cluster_arrive_relaxed();
            if (n0 + n < K) {
                float b[8];
#pragma unroll
                for (int j = 0; j < 8; ++j) b[j] = has_bias ? to_acc<float>(bias[n0 + n + j]) : 0.0f;
                with_epilogue<T, true>(residual, [&](auto finish) {
                    constexpr bool VECTOR_RESIDUAL = decltype(finish)::MAY_READ_RESIDUAL;
#pragma unroll
                    for (int row = row0; row < ROWS; row += ROW_STEP) {
                        const int m = m0 + run * ROWS + row;
                        if (m >= M) break;
                        const int at = m * K + n0 + n;
                        Vec res;
                        if constexpr (VECTOR_RESIDUAL) res = load_vector(residual + at);
                        float v[8] = {};
#pragma unroll
                        for (int q = 0; q < CLUSTER; ++q) {
                            const float4* from =
                                reinterpret_cast<const float4*>(sums + (q * ROWS + row) * F_STRIDE + n);
                            const float4 lo = from[0], hi = from[1];
                            const float add[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
                            for (int j = 0; j < 8; ++j) v[j] += add[j];
                        }
                        Vec out;
#pragma unroll
                        for (int j = 0; j < 8; ++j) {
                            if constexpr (VECTOR_RESIDUAL)
                                out.v[j] = finish.with_residual(v[j] + b[j], res.v[j]);
                            else
                                out.v[j] = finish(v[j] + b[j], at + j);
                        }
                        *reinterpret_cast<Vec*>(y + at) = out;
                    }
                });
            }
            __syncwarp();
            cluster_wait();
        } else if constexpr (SPLIT_K) {  // a quad's 4 float2s make a 32-byte sector of a row
            float* sums = static_cast<float*>(y_out) + run * split_elements;
#pragma unroll
            for (int nb = 0; nb < BN / 8; ++nb) {
                const int channel = n0 + nb * 8 + 2 * tq;  // and channel + 1 (K % 8 == 0)
#pragma unroll
                for (int h = 0; h < HALVES; ++h)
#pragma unroll
                    for (int half = 0; half < 2; ++half) {
                        const int m = m0 + h * 64 + warp * 16 + quad + half * 8;
                        if (m < M && channel < K)
                            *reinterpret_cast<float2*>(sums + m * K + channel) =
                                make_float2(acc[h][4 * nb + 2 * half], acc[h][4 * nb + 2 * half + 1]);
                    }
            }
        } else if constexpr (!RESIDUAL && sizeof(T) == 2 && !(CUPYCONV_ACTIVATION == ACT_GELU && BM == 128)) {
            // (gelu's erf on a 128-pixel tile's sums, all live at once, spilled at the 168 registers ptxas gives
            // 384 threads: its calls stage float sums a 64-row half at a time, below.)
            T* staged = reinterpret_cast<T*>(out_stage);
            asm volatile("bar.sync %0, 128;\n" :: "r"(STAGING + consumer) : "memory");
            with_epilogue<T>(residual, [&](auto finish) {  // has_residual: 0 here
#pragma unroll
                for (int nb = 0; nb < BN / 8; ++nb) {
                    const int col = nb * 8 + 2 * tq, channel = n0 + col;  // and channel + 1 (K % 8 == 0)
                    const bool inside = has_bias && channel < K;
                    const float b0 = inside ? to_acc<float>(bias[channel]) : 0.0f;
                    const float b1 = inside ? to_acc<float>(bias[channel + 1]) : 0.0f;
#pragma unroll
                    for (int h = 0; h < HALVES; ++h)
#pragma unroll
                        for (int half = 0; half < 2; ++half) {
                            const int row = h * 64 + warp * 16 + quad + half * 8;
                            struct alignas(4) Pair { T lo, hi; };
                            *reinterpret_cast<Pair*>(staged + row * H_STRIDE + col) =
                                Pair{finish(acc[h][4 * nb + 2 * half] + b0, 0), finish(acc[h][4 * nb + 2 * half + 1] + b1, 0)};
                        }
                }
            });
            asm volatile("bar.sync %0, 128;\n" :: "r"(STAGING + consumer) : "memory");
            if (n0 + n < K) {
#pragma unroll 4
                for (int row = row0; row < BM; row += ROW_STEP) {
                    const bool second = HALVES > 1 && row >= 64;  // (selected, not indexed: no local memory)
                    if (row % 64 >= (second ? half_rows[HALVES - 1] : half_rows[0])) continue;
                    *reinterpret_cast<Vec*>(y + ((second ? half_m[HALVES - 1] : half_m[0]) + row % 64) * K + n0 + n) =
                        *reinterpret_cast<const Vec*>(staged + row * H_STRIDE + n);
                }
            }
        } else {
            // A half's sums [64][F_STRIDE]: channel pairs of a warp's 8 rows x 4 lanes hit 32 banks a half-warp.
            constexpr int F_STRIDE = BN + 8;
            static_assert(64 * F_STRIDE * 4 <= STAGING_BYTES, "a half's float sums fit a consumer's staging");
            float* sums = reinterpret_cast<float*>(out_stage);
            float b[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) b[j] = has_bias && n0 + n < K ? to_acc<float>(bias[n0 + n + j]) : 0.0f;
            // Threads 32 channels apart read their two float4s in opposite orders: 8 threads a phase, 8 bank groups.
            const int flip = (n >> 5) & 1;
#pragma unroll  // acc[h] stays in registers
            for (int h = 0; h < HALVES; ++h) {
                asm volatile("bar.sync %0, 128;\n" :: "r"(STAGING + consumer) : "memory");
#pragma unroll
                for (int nb = 0; nb < BN / 8; ++nb)
#pragma unroll
                    for (int half = 0; half < 2; ++half)
                        *reinterpret_cast<float2*>(sums + (warp * 16 + quad + half * 8) * F_STRIDE + nb * 8 + 2 * tq) =
                            make_float2(acc[h][4 * nb + 2 * half], acc[h][4 * nb + 2 * half + 1]);
                asm volatile("bar.sync %0, 128;\n" :: "r"(STAGING + consumer) : "memory");
                if (n0 + n >= K) continue;
                with_epilogue<T, RESIDUAL>(residual, [&](auto finish) {
                    constexpr bool VECTOR_RESIDUAL = decltype(finish)::MAY_READ_RESIDUAL;
                    // CHUNK rows' residual vectors loaded before their sums: one row's latency at a time made
                    // the stores of a fused expansion slower than its MMAs. Rows past M read the first row's.
                    constexpr int ROWS = 64 / ROW_STEP, CHUNK = VECTOR_RESIDUAL ? 4 : 1;
#pragma unroll 1
                    for (int r0 = 0; r0 < ROWS; r0 += CHUNK) {
                        Vec res[CHUNK];
                        if constexpr (VECTOR_RESIDUAL) {
#pragma unroll
                            for (int c = 0; c < CHUNK; ++c) {
                                const int row = row0 + (r0 + c) * ROW_STEP;
                                res[c] = load_vector(residual + (row < half_rows[h] ? (half_m[h] + row) * K + n0 + n : 0));
                            }
                        }
#pragma unroll
                        for (int c = 0; c < CHUNK; ++c) {
                            const int row = row0 + (r0 + c) * ROW_STEP, m = half_m[h] + row;
                            if (row >= half_rows[h]) break;
                            const int at = m * K + n0 + n;
                            const float4* staged = reinterpret_cast<const float4*>(sums + row * F_STRIDE + n);
                            const float4 first = staged[flip], second = staged[1 - flip];
                            const float4 lo = flip ? second : first, hi = flip ? first : second;
                            const float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
                            Vec out;
#pragma unroll
                            for (int j = 0; j < 8; ++j) {
                                if constexpr (VECTOR_RESIDUAL)
                                    out.v[j] = finish.with_residual(v[j] + b[j], res[c].v[j]);
                                else
                                    out.v[j] = finish(v[j] + b[j], at + j);
                            }
                            *reinterpret_cast<Vec*>(y + at) = out;
                        }
                    }
                });
            }
        }
    }
}

template <typename T, int BM, int BN, int STAGES, int TAPS, bool RESIDUAL, bool SPLIT_K, bool ROUND_A>
__global__ void __launch_bounds__(384, 1)
implicit_gemm_nhwc_pingpong(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                            void* __restrict__ y_out, int has_bias, const T* __restrict__ residual, int has_residual,
                            int activation, int N, int C, int H, int W, int K, int Ho, int Wo, int kh, int kw,
                            int sh, int sw, int pt, int pl, int dh, int dw, int groups, int splits, int split_elements,
                            const __grid_constant__ TensorMap weight_map, const __grid_constant__ TensorMap x_map,
                            int x_is_matrix) {
    pingpong_tiles<T, BM, BN, STAGES, TAPS, RESIDUAL, SPLIT_K, 1, ROUND_A>(
        x, w, bias, y_out, has_bias, residual, has_residual, activation, N, C, H, W, K, Ho, Wo, kh, kw, sh, sw, pt, pl,
        dh, dw, groups, splits, split_elements, weight_map, x_map, x_is_matrix);
}

// The pixel strips (PIXEL_STRIPS above): pixels of STRIP_BYTES (32 or 64 16-bit channels), whole reductions.
template <typename T, int BM, int BN, int STAGES, int STRIP_BYTES, bool RESIDUAL>
__global__ void __launch_bounds__(384, 1)
implicit_gemm_nhwc_pingpong_strips(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                                   void* __restrict__ y_out, int has_bias, const T* __restrict__ residual,
                                   int has_residual, int activation, int N, int C, int H, int W, int K, int Ho, int Wo,
                                   int kh, int kw, int sh, int sw, int pt, int pl, int dh, int dw, int groups,
                                   int splits, int split_elements, const __grid_constant__ TensorMap weight_map,
                                   const __grid_constant__ TensorMap x_map, int x_is_matrix) {
    pingpong_tiles<T, BM, BN, STAGES, 1, RESIDUAL, false, 1, false, STRIP_BYTES>(
        x, w, bias, y_out, has_bias, residual, has_residual, activation, N, C, H, W, K, Ho, Wo, kh, kw, sh, sw, pt, pl,
        dh, dw, groups, splits, split_elements, weight_map, x_map, x_is_matrix);
}

// Clusters exist from sm_90 on (as implicit_gemm_nhwc_tma_pair's).
#if __CUDA_ARCH__ >= 900
template <typename T, int BM, int BN, int STAGES, int CLUSTER, bool ROUND_A>
__global__ void __launch_bounds__(384, 1) __cluster_dims__(CLUSTER, 1, 1)
implicit_gemm_nhwc_pingpong_cluster(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                                    void* __restrict__ y_out, int has_bias, const T* __restrict__ residual,
                                    int has_residual, int activation, int N, int C, int H, int W, int K, int Ho, int Wo,
                                    int kh, int kw, int sh, int sw, int pt, int pl, int dh, int dw, int groups,
                                    int splits, int split_elements, const __grid_constant__ TensorMap weight_map,
                                    const __grid_constant__ TensorMap x_map, int x_is_matrix) {
    pingpong_tiles<T, BM, BN, STAGES, 1, false, false, CLUSTER, ROUND_A>(
        x, w, bias, y_out, has_bias, residual, has_residual, activation, N, C, H, W, K, Ho, Wo, kh, kw, sh, sw, pt, pl,
        dh, dw, groups, splits, split_elements, weight_map, x_map, x_is_matrix);
}
#endif

// Stream-K (stream_k.cuh): gridDim.x persistent blocks share the tiles_m x tiles_n x groups tiles'
// k_tiles k tiles each; block b takes units [stream_k_start(b), stream_k_start(b + 1)) in tile order
// (pixel tiles fastest, then channel tiles, then groups), one segment per tile it touches. partials:
// gridDim.x slots of BM x BN floats (workspace); flags: gridDim.x ints, zero.
template <typename T, typename Index, int BM, int BN, int BK, int WARPS_M, int WARPS_N, int STAGES, int VEC,
          int WGMMA_ROWS, bool NHWC_OUT, bool ROUND_A>
__global__ void NHWC_GEMM_LAUNCH_BOUNDS
implicit_gemm_nhwc_stream_k(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                            void* __restrict__ y_out, int has_bias, const T* __restrict__ residual, int has_residual,
                            int activation, int N, int C, int H, int W, int K, int Ho, int Wo, int kh, int kw,
                            int sh, int sw, int pt, int pl, int dh, int dw, int groups, int tiles_m, int tiles_n,
                            int k_tiles, float* __restrict__ partials, int* __restrict__ flags) {
    const int blocks = gridDim.x, block = blockIdx.x;
    const long long units = static_cast<long long>(tiles_m) * tiles_n * groups * k_tiles;
    const long long end = stream_k_start(units, block + 1, blocks);
#pragma unroll 1
    for (long long unit = stream_k_start(units, block, blocks); unit < end;) {
        const int tile = static_cast<int>(unit / k_tiles);
        StreamKSegment segment;
        segment.k_begin = static_cast<int>(unit - static_cast<long long>(tile) * k_tiles);
        segment.k_end = static_cast<int>(min(static_cast<long long>(k_tiles), segment.k_begin + (end - unit)));
        segment.g = tile / tiles_m / tiles_n;
        segment.slot = block;
        // Where this block owns the tile but not all of it: the blocks after it that start inside the
        // tile hold its other segments, in k order (no block is scanned for a whole or a published one).
        segment.first_contributor = segment.end_contributor = block + 1;
        if (segment.k_begin == 0 && segment.k_end < k_tiles) {
            const long long tile_end = static_cast<long long>(tile + 1) * k_tiles;
            while (segment.end_contributor < blocks &&
                   stream_k_start(units, segment.end_contributor, blocks) < tile_end)
                ++segment.end_contributor;
        }
        segment.partials = partials;
        segment.flags = flags;
        __syncthreads();  // the last segment's epilogue read the shared memory this one's loads write
        nhwc_gemm_tile<T, Index, BM, BN, BK, WARPS_M, WARPS_N, STAGES, VEC, false, WGMMA_ROWS, NHWC_OUT, ROUND_A, false,
                       false, true>(x, w, bias, y_out, has_bias, residual, has_residual, activation, N, C, H, W, K, Ho,
                                    Wo, kh, kw, sh, sw, pt, pl, dh, dw, groups, 1, 0, tile % tiles_m,
                                    (tile / tiles_m) % tiles_n, nullptr, 0, &segment);
        unit += segment.k_end - segment.k_begin;
    }
}

// Every stride phase of a transposed convolution with taps (PhaseTable), y NHWC, in one launch: the
// phases' tiles fill the GPU together, and each writes its rows and columns of the output (NHWC, or
// NCHW unless NHWC_OUT) in place (no temporary per phase, no window of y cut first). split_elements:
// the whole output's.
template <typename T, typename Index, int BM, int BN, int BK, int WARPS_M, int WARPS_N, int STAGES, int VEC,
          int WGMMA_ROWS, bool NHWC_OUT, bool ROUND_A, bool SPLIT_K>
__global__ void NHWC_GEMM_LAUNCH_BOUNDS
implicit_gemm_nhwc_phases(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                          void* __restrict__ y_out, int has_bias, const T* __restrict__ residual, int has_residual,
                          int activation, int N, int C, int H, int W, int K, int groups, int splits, int split_elements,
                          const __grid_constant__ PhaseTable phases) {
    int p = 0, tile;
    if (phases.interleaved) {
        p = blockIdx.x % phases.count;
        tile = blockIdx.x / phases.count;
    } else {
        while (p + 1 < phases.count && static_cast<int>(blockIdx.x) >= phases.first_tile[p + 1]) ++p;
        tile = blockIdx.x - phases.first_tile[p];
    }
    nhwc_gemm_tile<T, Index, BM, BN, BK, WARPS_M, WARPS_N, STAGES, VEC, false, WGMMA_ROWS, NHWC_OUT, ROUND_A,
                   SPLIT_K, true>(x, w + phases.weight_offset[p], bias, y_out, has_bias, residual, has_residual,
                                  activation, N, C, H, W, K, phases.ho[p], phases.wo[p], phases.kh[p], phases.kw[p], 1,
                                  1, phases.pt[p], phases.pl[p], phases.dh[p], phases.dw[p], groups, splits,
                                  split_elements, tile, blockIdx.y, &phases, p);
}

}  // namespace cupyconv
