// The weight gradient of conv2d on the tensor cores (float16, bfloat16; float32 as TF32), reading
// channels-last x and dy in place.
//
//   dW[o][j] = sum over l of dy[l][o] X[l][j]
//   o = output channel (M = K), j = (r, s, c) tap and input channel, c last (J = kh kw Cp),
//   l = (n, p, q) output pixel (the reduction, L = N Ho Wo),
//   X[l][(r, s, c)] = x[n][p sh + r dh - pt][q sw + s dw - pl][c] (zero outside the input).
// In NHWC both operands are l-major: a dy row (one pixel) holds its K channels contiguously and an X
// row, for one tap, its C channels. So a tile of either is copied by cp.async in VEC-byte pieces of
// one row, and the tensor cores read both transposed from shared memory: ldmatrix.trans turns an
// l-major [BL][BM] tile into the row-major A fragment (o x l) and an l-major [BL][BJ] tile into the
// column-major B fragment (l x j) that mma.sync wants; TF32 fragments are loaded as scalars and
// rounded (cvt.rna) on the way. No transposed copy of x or dy is made, unlike a weight gradient
// computed as a forward convolution.
//
// Levels:
//   grid    x: j tiles of BJ, y: o tiles of BM, z: runs of the reduction. The l tiles are cut into
//           gridDim.z runs of whole tiles, a partition fixed by the problem; run z writes float32
//           partial sums to ws[z][K][J], and wgrad_reduce (wgrad_gemm.cu) adds the runs in run
//           order and rounds once into the weight's layout: the same bits on every run.
//   block   BM x BJ outputs, a STAGES-deep cp.async pipeline (mma.cuh) over l tiles of BL.
//   warp    (BM / WARPS_M) x (BJ / WARPS_J), a grid of 16 x 8 instruction tiles (m16n8k16, or
//           m16n8k8 for TF32), float32 accumulators.
// A j tile may span several taps (layers of few channels: the stem's 3 channels make 147 columns);
// each A_VEC/B_VEC piece lies in one tap because Cp is a multiple of the piece, so a thread finds its
// piece's tap once and only its pixels move from tile to tile.
// Shared rows are BM (or BJ) elements + 8: 16 bytes more for 16-bit types, an odd number of 16-byte
// units, so an ldmatrix phase's 8 rows hit 8 bank groups; 32 bytes more for float, so the scalar
// TF32 fragment loads (rows tq, columns quad) hit 32 different banks.
//
// WGMMA (Hopper, sm_90a only: see wgmma.cuh; 16-bit types, 16-byte pieces): warpgroups of 64 output
// channels x all BJ columns multiply with wgmma, reading both operands MN-major (transposed) straight
// from shared memory. Tiles are 64-wide panels of rows of 128 bytes (64 channels or columns at one l),
// 128-byte swizzled instead of padded; the accumulators are laid out as the mma.sync path's, with one
// 16-row instruction tile per warp (WARPS_M = BM / 16, WARPS_J = 1), and share its epilogue.
#include "dtypes.cuh"
#include "mma.cuh"
#include "stream_k.cuh"
#include "wgmma.cuh"

namespace cupyconv {

template <typename T, typename Index, int BM, int BJ, int BL, int WARPS_M, int WARPS_J, int STAGES, int B_VEC,
          bool WGMMA>
__global__ void __launch_bounds__(WARPS_M * WARPS_J * 32, WARPS_M * WARPS_J >= 16 ? 1 : 2)  // two blocks an SM up to 256 threads
wgrad_tensor_cores(const T* __restrict__ x, const T* __restrict__ dy, float* __restrict__ ws,
                   int N, int C, int H, int W, int K, int Ho, int Wo, int kh, int kw,
                   int sh, int sw, int pt, int pl, int dh, int dw) {
    constexpr int NT = WARPS_M * WARPS_J * 32;
    constexpr int WM = BM / WARPS_M, WJ = BJ / WARPS_J;       // warp tile
    constexpr int MT = WM / 16, JT = WJ / 8;                  // instruction tiles per warp
    constexpr int INST_L = mma_op<T>::k;
    constexpr int A_VEC = 16;                                 // dy: K is a multiple of 16 bytes
    constexpr int A_EV = A_VEC / sizeof(T), B_EV = B_VEC / sizeof(T);
    constexpr int A_STRIDE = BM + 8, B_STRIDE = BJ + 8;       // elements per shared row (mma.sync)
    constexpr int PANEL = 64;                                 // WGMMA: elements per 128-byte row
    constexpr int A_STAGE = WGMMA ? BL * BM : BL * A_STRIDE, B_STAGE = WGMMA ? BL * BJ : BL * B_STRIDE;
    constexpr int WGMMA_LAG = WGMMA && STAGES >= 4 ? 1 : 0;  // wgmma tiles left running past the next barrier
    constexpr int A_PIECES = BM / A_EV, A_ROWS_PER_PASS = NT / A_PIECES, A_PASSES = BL / A_ROWS_PER_PASS;
    constexpr int B_PIECES = BJ / B_EV, B_ROWS_PER_PASS = NT / B_PIECES, B_PASSES = BL / B_ROWS_PER_PASS;
    static_assert(sizeof(T) == 4 || sizeof(T) == 2, "float (TF32), half_t or bfloat16_t");
    static_assert(B_VEC == 4 || B_VEC == 8 || B_VEC == 16, "cp.async moves 4, 8 or 16 bytes");
    static_assert(NT % A_PIECES == 0 && BL % A_ROWS_PER_PASS == 0, "the dy loader covers the tile");
    static_assert(NT % B_PIECES == 0 && BL % B_ROWS_PER_PASS == 0, "the x loader covers the tile");
    static_assert(WM % 16 == 0 && WJ % 16 == 0 && BL % INST_L == 0, "whole instruction tiles, B in pairs");
    static_assert(sizeof(T) == 4 || BL % 16 == 0, "ldmatrix.trans reads 16 l rows per instruction");
    static_assert(!WGMMA || (sizeof(T) == 2 && B_VEC == 16 && BM % PANEL == 0 && BJ % PANEL == 0 && WARPS_J == 1 &&
                             WARPS_M == BM / 16 && WARPS_M % 4 == 0 && A_ROWS_PER_PASS % 8 == 0 &&
                             B_ROWS_PER_PASS % 8 == 0 && (BJ == 64 || BJ == 128)),
                  "wgmma: 16-bit panels of 64 in 16-byte pieces, warpgroups of 64 channels x BJ columns, loader rows "
                  "a multiple of 8 apart (one swizzle slot per thread)");

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    // wgmma tiles start on 1024-byte boundaries (the swizzle repeats every 8 rows); the plan adds the
    // 1 KB this may skip.
    unsigned char* smem = WGMMA ? smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023) : smem_raw;
    T* a_smem = reinterpret_cast<T*>(smem);                  // [STAGES][BL][A_STRIDE]: dy, o contiguous
    T* b_smem = a_smem + STAGES * A_STAGE;                   // [STAGES][BL][B_STRIDE]: X, j contiguous

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int J = kh * kw * C;
    const int j0 = blockIdx.x * BJ, o0 = blockIdx.y * BM;
    const int HoWo = Ho * Wo;
    const Index L = static_cast<Index>(N) * HoWo;
    const int all_tiles = static_cast<int>((L + BL - 1) / BL);
    const int run_tiles = (all_tiles + gridDim.z - 1) / gridDim.z;
    const int kt0 = blockIdx.z * run_tiles;
    const int k_tiles = max(0, min(all_tiles - kt0, run_tiles));

    // dy loader: piece a_piece of rows a_row0 + A_ROWS_PER_PASS i.
    const int a_piece = tid % A_PIECES, a_row0 = tid / A_PIECES;
    const bool a_ok = o0 + a_piece * A_EV < K;
    const T* a_src = dy + o0 + a_piece * A_EV;
    // x loader: piece b_piece (one tap, B_EV channels: fixed for the run) of rows b_row0 + B_ROWS_PER_PASS i,
    // whose pixels (n, p, q) step by BL per tile.
    const int b_piece = tid % B_PIECES, b_row0 = tid / B_PIECES;
    const int jp = j0 + b_piece * B_EV;
    const bool j_ok = jp < J;
    const int tap = jp / C, b_c = jp - tap * C;
    const int r_off = (tap / kw) * dh - pt, s_off = (tap % kw) * dw - pl;
    int b_n[B_PASSES], b_p[B_PASSES], b_q[B_PASSES];
#pragma unroll
    for (int i = 0; i < B_PASSES; ++i) {
        const Index l = static_cast<Index>(kt0) * BL + b_row0 + B_ROWS_PER_PASS * i;
        const Index n = l / HoWo;
        const int pq = static_cast<int>(l - n * HoWo);
        b_n[i] = static_cast<int>(min(n, static_cast<Index>(N)));
        b_p[i] = pq / Wo;
        b_q[i] = pq - b_p[i] * Wo;
    }
    const int step_n = BL / HoWo, step_p = (BL / Wo) % Ho, step_q = BL % Wo;

    // Where a thread's piece lands in a tile: row `row`, piece `piece` (padded rows; WGMMA: the panel's
    // swizzled slot, the same for all of a thread's rows, which are a multiple of 8 apart).
    auto shared_offset = [&](int row, int piece, int stride, int ev) {
        if constexpr (WGMMA) {
            constexpr int SLOTS = PANEL * sizeof(T) / 16;
            return (piece / SLOTS) * BL * PANEL + row * PANEL + swizzle128_slot(piece % SLOTS, row) * ev;
        }
        return row * stride + piece * ev;
    };
    const int a_offset = shared_offset(a_row0, a_piece, A_STRIDE, A_EV);
    const int b_offset = shared_offset(b_row0, b_piece, B_STRIDE, B_EV);
    constexpr int A_PASS = (WGMMA ? PANEL : A_STRIDE) * A_ROWS_PER_PASS;  // elements between a thread's rows
    constexpr int B_PASS = (WGMMA ? PANEL : B_STRIDE) * B_ROWS_PER_PASS;

    auto load_tile = [&](int kt, int stage) {
        T* a_dst = a_smem + stage * A_STAGE + a_offset;
#pragma unroll
        for (int i = 0; i < A_PASSES; ++i) {
            const Index l = static_cast<Index>(kt) * BL + a_row0 + A_ROWS_PER_PASS * i;
            const bool ok = a_ok && l < L;
            cp_async<A_VEC>(a_dst + A_PASS * i, ok ? a_src + l * K : dy, ok);
        }
        T* b_dst = b_smem + stage * B_STAGE + b_offset;
#pragma unroll
        for (int i = 0; i < B_PASSES; ++i) {
            const int ih = b_p[i] * sh + r_off, iw = b_q[i] * sw + s_off;
            const bool ok = j_ok && b_n[i] < N && static_cast<unsigned>(ih) < static_cast<unsigned>(H) &&
                            static_cast<unsigned>(iw) < static_cast<unsigned>(W);
            cp_async<B_VEC>(b_dst + B_PASS * i,
                            ok ? x + ((static_cast<Index>(b_n[i]) * H + ih) * W + iw) * C + b_c : x, ok);
            // Next tile: l + BL in the mixed radix (n, p, q).
            b_q[i] += step_q;
            b_p[i] += step_p;
            b_n[i] += step_n;
            if (b_q[i] >= Wo) { b_q[i] -= Wo; ++b_p[i]; }
            if (b_p[i] >= Ho) { b_p[i] -= Ho; ++b_n[i]; }
        }
    };

    const int warp_m = warp % WARPS_M, warp_j = warp / WARPS_M;
    const int wm = warp_m * WM, wj = warp_j * WJ;
    const int quad = lane >> 2, tq = lane & 3;               // PTX's groupID and threadID_in_group
    float acc[MT][JT][4];
    zero_accumulators(acc);

    // ldmatrix.trans row addresses. A (x4 = a0..a3): lanes 0-7 give l rows 0-7 at o + 0, 8-15 the
    // same rows at o + 8, 16-31 l rows 8-15 likewise. B (x4 = b0, b1 of two 8-column tiles): lanes
    // 0-7 l rows 0-7 at j + 0, 8-15 l rows 8-15, 16-31 the same at j + 8.
    const int a_lane = ((lane >> 4) * 8 + (lane & 7)) * A_STRIDE + wm + ((lane >> 3) & 1) * 8;
    const int b_lane = ((lane & 7) + ((lane >> 3) & 1) * 8) * B_STRIDE + wj + (lane >> 4) * 8;

    auto compute_tile = [&](int stage) {
        if constexpr (WGMMA) {
            const unsigned a_tile = shared_address(a_smem + stage * A_STAGE) + (warp / 4) * BL * 128;
            const unsigned b_tile = shared_address(b_smem + stage * B_STAGE);
            float (&d)[BJ / 2] = reinterpret_cast<float (&)[BJ / 2]>(acc);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BL / INST_L; ++kk)
                wgmma_op<T, BJ, true>::run(d, wgmma_descriptor_mn(a_tile + kk * 2048, BL * 128),
                                           wgmma_descriptor_mn(b_tile + kk * 2048, BL * 128));
            wgmma_commit();
            wgmma_wait<WGMMA_LAG>();  // this tile's MMAs may still run; the buffer of the one before is free
            return;
        }
        const T* a_buf = a_smem + stage * A_STAGE;
        const T* b_buf = b_smem + stage * B_STAGE;
#pragma unroll
        for (int kk = 0; kk < BL / INST_L; ++kk) {
            unsigned a_frag[MT][4], b_frag[JT][2];
            if constexpr (sizeof(T) == 2) {
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
                    ldmatrix_x4<true>(a_frag[mt], a_buf + a_lane + kk * INST_L * A_STRIDE + mt * 16);
#pragma unroll
                for (int jt = 0; jt < JT; jt += 2) {
                    unsigned r[4];
                    ldmatrix_x4<true>(r, b_buf + b_lane + kk * INST_L * B_STRIDE + jt * 8);
                    b_frag[jt][0] = r[0]; b_frag[jt][1] = r[1];
                    b_frag[jt + 1][0] = r[2]; b_frag[jt + 1][1] = r[3];
                }
            } else {  // TF32: A from its l-major tile; b0 (l, j), b1 (l + 4, j)
                tf32_a_from_k_major<A_STRIDE>(a_frag, reinterpret_cast<const float*>(a_buf) +
                                                          (kk * INST_L + tq) * A_STRIDE + wm + quad);
                const float* bf = reinterpret_cast<const float*>(b_buf) + (kk * INST_L + tq) * B_STRIDE + wj + quad;
#pragma unroll
                for (int jt = 0; jt < JT; ++jt) {
                    b_frag[jt][0] = to_tf32(bf[jt * 8]);
                    b_frag[jt][1] = to_tf32(bf[4 * B_STRIDE + jt * 8]);
                }
            }
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int jt = 0; jt < JT; ++jt) mma_op<T>::run(acc[mt][jt], a_frag[mt], b_frag[jt]);
        }
    };

    run_k_pipeline<STAGES, WGMMA, WGMMA_LAG>(k_tiles, [&](int t, int stage) { load_tile(kt0 + t, stage); },
                                             compute_tile, [](int) {});
    if constexpr (WGMMA_LAG > 0) wgmma_wait<0>();  // the last tile's MMAs still write the accumulators

    // Partial sums straight from the fragments: each is one output of one run, written once.
    float* out = ws + static_cast<Index>(blockIdx.z) * K * J;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int jt = 0; jt < JT; ++jt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int o = o0 + wm + mt * 16 + quad + (e >> 1) * 8, j = j0 + wj + jt * 8 + 2 * tq + (e & 1);
                if (o < K && j < J) out[static_cast<Index>(o) * J + j] = acc[mt][jt][e];
            }
}

// --- The tiles fed by TMA (Hopper, sm_90a): helpers of both kernels below.

// The x panels of a column tile: panel b (columns j0 + WIDTH b .., one tap (r, s)) read through the im2col map
// from channel `channel[b]` at the tap's offsets; `bytes`: those inside J (the others are not copied, and their
// columns' sums not written).
template <int PANELS, int WIDTH> struct XPanels {
    int channel[PANELS], offset_w[PANELS], offset_h[PANELS], bytes;

    __device__ __forceinline__ XPanels(int j0, int J, int C, int kw, int dh, int dw, int panel_bytes) : bytes(0) {
#pragma unroll
        for (int b = 0; b < PANELS; ++b) {
            const int jp = j0 + WIDTH * b, tap = jp / C;
            channel[b] = jp - tap * C;
            offset_h[b] = tap / kw * dh;
            offset_w[b] = tap % kw * dw;
            bytes += jp < J ? panel_bytes : 0;
        }
    }
};

// An l tile's first output pixel (image, p, q): where its window corners start. Counted along BL pixels a tile,
// by steps divided out once (a division a tile on the copying thread made the 16-bit tiles 10-20 % slower).
template <int BL> struct LTileCorner {
    int image, p, q, step_n, step_p, step_q;

    __device__ __forceinline__ LTileCorner(int tile, int Ho, int Wo)
        : step_n(BL / (Ho * Wo)), step_p(BL / Wo % Ho), step_q(BL % Wo) {
        const int first = tile * BL;
        image = first / (Ho * Wo);
        p = (first - image * Ho * Wo) / Wo;
        q = first % Wo;
    }
    __device__ __forceinline__ void next(int Ho, int Wo) {
        q += step_q;
        p += step_p;
        image += step_n;
        if (q >= Wo) { q -= Wo; ++p; }
        if (p >= Ho) { p -= Ho; ++image; }
    }
};

// The TMA tiles' named barrier of their warpgroups alone (stream-K's fix-up; the copying warp's idle lanes have
// returned). 0 is __syncthreads'.
constexpr int CONSUMER_BARRIER = 1;

// A TMA tile's share of the weight gradient's units (tile t = o tile x j_tiles + j tile, l tile; all_tiles l tiles
// a tile): in stream-K (kernels/stream_k.cuh) units [begin, end) of `blocks` blocks' wave; else the block's tile
// (blockIdx.x, blockIdx.y) and run blockIdx.z's l tiles.
template <bool STREAM_K, int BM, int BJ> struct WgradShare {
    int all_tiles, j_tiles, blocks;
    long long units, begin, end;

    __device__ __forceinline__ WgradShare(int all_tiles_, int J, int K, int blocks_)
        : all_tiles(all_tiles_), j_tiles((J + BJ - 1) / BJ), blocks(blocks_),
          units(static_cast<long long>(j_tiles) * ((K + BM - 1) / BM) * all_tiles_),
          begin(STREAM_K ? stream_k_start(units, blockIdx.x, blocks_) : 0),
          end(STREAM_K ? stream_k_start(units, blockIdx.x + 1, blocks_) : 0) {}

    // body(tile, j0, o0, first l tile, end l tile) for each of the block's segments, in order.
    template <typename Body> __device__ __forceinline__ void segments(Body&& body) const {
        if constexpr (!STREAM_K) {
            const int run_tiles = (all_tiles + gridDim.z - 1) / gridDim.z, kt0 = blockIdx.z * run_tiles;
            body(0, blockIdx.x * BJ, blockIdx.y * BM, kt0, kt0 + max(0, min(all_tiles - kt0, run_tiles)));
        } else {
            for (long long u = begin; u < end;) {
                const int tile = static_cast<int>(u / all_tiles);
                const int k_begin = static_cast<int>(u - tile * static_cast<long long>(all_tiles));
                const int k_end = static_cast<int>(min(static_cast<long long>(all_tiles), k_begin + (end - u)));
                body(tile, tile % j_tiles * BJ, tile / j_tiles * BM, k_begin, k_end);
                u += k_end - k_begin;
            }
        }
    }

    // After a segment's MMAs (stream-K): a block that does not hold the tile's first l tile publishes its sums to
    // its slot and returns false; the owner adds the slots of the blocks holding the tile's later l tiles, in block
    // order, and returns true (it writes the tile). THREADS: the warpgroups', meeting at named barrier BARRIER.
    template <int THREADS, int ACC, int BARRIER>
    __device__ __forceinline__ bool settle(float (&acc)[ACC], int tile, int k_begin, float* slots, int* flags) const {
        if (k_begin > 0) {
            stream_k_publish<THREADS, ACC, BARRIER>(acc, slots + static_cast<long long>(blockIdx.x) * ACC * THREADS,
                                                    flags + blockIdx.x);
            return false;
        }
        const long long tile_end = (tile + 1) * static_cast<long long>(all_tiles);
        for (int b = blockIdx.x + 1; b < blocks && stream_k_start(units, b, blocks) < tile_end; ++b)
            stream_k_add<THREADS, ACC, BARRIER>(acc, slots + static_cast<long long>(b) * ACC * THREADS, flags + b);
        return true;
    }
};

// One l tile's copies, their bytes counted on `landed`: dy's A_PANELS boxes [BL pixels][WIDTH channels] (channels
// o0 + WIDTH a .. of pixels tile BL ..) to a_dst + a PANEL, and x's panels inside J through the im2col map to
// b_dst + b PANEL.
template <int A_PANELS, int B_PANELS, int WIDTH, int PANEL, int BL>
__device__ __forceinline__ void copy_l_tile(unsigned char* a_dst, unsigned char* b_dst, unsigned long long* landed,
                                            const TensorMap* dy_map, const TensorMap* x_map, int o0, int j0, int J,
                                            int tile, const XPanels<B_PANELS, WIDTH>& panels,
                                            const LTileCorner<BL>& corner, int sh, int sw, int pt, int pl) {
    mbarrier_arrive_expect_tx(landed, A_PANELS * PANEL + panels.bytes);
#pragma unroll
    for (int a = 0; a < A_PANELS; ++a) tma_load_2d(a_dst + a * PANEL, dy_map, o0 + WIDTH * a, tile * BL, landed);
#pragma unroll
    for (int b = 0; b < B_PANELS; ++b)
        if (j0 + WIDTH * b < J)
            tma_load_im2col_4d(b_dst + b * PANEL, x_map, panels.channel[b], corner.q * sw - pl, corner.p * sh - pt,
                               corner.image, panels.offset_w[b], panels.offset_h[b], landed);
}

// A warpgroup's 64 x BJ sums (output channels o_first .., columns j0 ..) written straight from its fragments: a
// quad's four pairs make a 32-byte sector (16 bytes in T) of a row. Into `sums` (a run's float32 [K][J]), or,
// where `direct`, rounded into the weight `out` itself.
template <typename T, int BJ>
__device__ __forceinline__ void store_warpgroup_sums(const float (&acc)[BJ / 2], float* sums, T* out, int direct,
                                                     int o_first, int j0, int K, int J) {
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, quad = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int jb = 0; jb < BJ / 8; ++jb) {
        const int j = j0 + jb * 8 + 2 * tq;  // and j + 1 (J is even)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int o = o_first + warp * 16 + quad + half * 8;
            if (o >= K || j >= J) continue;
            const float lo = acc[4 * jb + 2 * half], hi = acc[4 * jb + 2 * half + 1];
            const long long at = static_cast<long long>(o) * J + j;
            if (direct) {
                struct alignas(2 * sizeof(T)) Pair { T lo, hi; };
                *reinterpret_cast<Pair*>(out + at) = Pair{from_acc<T>(lo), from_acc<T>(hi)};
            } else {
                *reinterpret_cast<float2*>(sums + at) = make_float2(lo, hi);
            }
        }
    }
}

// 16-bit types, channels-last x whose 64-channel panels lie in one tap: the same GEMM with both tiles of every
// l tile copied by the TMA unit, one thread of an extra warp issuing them, while BM / 64 warpgroups only
// multiply. Each side waits for the other on per-stage mbarriers ("full": the copies' bytes landed; "empty":
// the MMAs reading the stage retired) instead of every thread meeting at a barrier between its cp.async copies
// and its MMAs. dy is read as the matrix [L][Kp] in boxes of BL pixels x 64 channels; X, for a panel of 64
// columns (one tap (r, s), channels c..c + 63), through x's im2col map: BL window corners from the l tile's
// first pixel on, the tap's offset from each, zeros outside x (and past L, where dy's rows are zeros as well).
// Both land as the MN-major panels the cp.async wgmma tile builds. Warpgroup g multiplies output channels
// o0 + 64 g.. by all BJ columns. Run z writes its float32 sums to ws[z][Kp][J] (the other instances' layout)
// or, where `direct` (one run, and the weight is [K][J] itself: KHWC, no zero channels), the 16-bit weight
// into `out`: no partial sums through memory and no reduction launch. BLOCKS: the blocks an SM is to hold
// (registers asked of the allocator accordingly).
//
// Stream-K (STREAM_K, with `stream_k` blocks, a grid of that many; kernels/stream_k.cuh; the other
// instances keep their registers without its code): the tiles x l tiles are cut into equal contiguous
// shares, one a block, so that a GEMM of fewer tiles than the SMs hold still fills them without runs of
// partial sums and their reduction. The block holding a tile's first l tile
// writes it (to `out` where direct, else as the one run ws[0]) after adding, in block order, the float32
// sums the blocks holding the rest of its l tiles left in their `slots` (BM x BJ floats a block): the
// same bits on every run. The copying thread and the warpgroups walk the same segments (tile, l tiles)
// through one ring of stages.
//
// K_MAJOR: NCHW x and dy of a 1x1 layer at stride 1 without padding, whose planes are whole 16-byte rows: an
// image's channel rows are K-major already (a channel's pixels contiguous), so dy is read as the matrix
// [N K][Ho Wo] in boxes of BM channels x BL pixels and x as [N C][H W] in boxes of 64 channels (the argument C:
// x's channels an image; K: dy's), an l tile BL pixels of one image (its last zero-filled past Ho Wo by the
// maps). They land as the K-major 128-byte-swizzled rows wgmma reads untransposed: no channels-last copies. Rows
// of a box past an image's channels hold the next image's, which reach only sums past K or J, never written or
// cut by the reduction.
template <typename T, int BM, int BJ, int STAGES, int BLOCKS, bool STREAM_K, bool K_MAJOR>
__global__ void __launch_bounds__(BM / 64 * 128 + 32, BLOCKS)
wgrad_tensor_cores_tma(float* __restrict__ ws, T* __restrict__ out, int direct, int stream_k, float* __restrict__ slots,
                       int* __restrict__ flags, int L, int C, int J, int K, int Ho, int Wo, int kw, int sh, int sw,
                       int pt, int pl, int dh, int dw, const __grid_constant__ TensorMap dy_map,
                       const __grid_constant__ TensorMap x_map) {
    constexpr int BL = 64, PANEL = BL * 128;  // bytes of one l tile's 64-wide panel
    constexpr int A_PANELS = BM / 64, B_PANELS = BJ / 64, A_STAGE = A_PANELS * PANEL, B_STAGE = B_PANELS * PANEL;
    constexpr int INST_L = mma_op<T>::k, CONSUMERS = 128 * A_PANELS, ACC = BJ / 2;
    static_assert(sizeof(T) == 2 && BM % 64 == 0 && (BJ == 64 || BJ == 128 || BJ == 256), "16-bit, whole panels");
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023);
    unsigned char* a_smem = smem;
    unsigned char* b_smem = smem + STAGES * A_STAGE;
    unsigned long long* full = reinterpret_cast<unsigned long long*>(b_smem + STAGES * B_STAGE);
    unsigned long long* empty = full + STAGES;

    const int tid = threadIdx.x, warpgroup = tid >> 7;
    const int plane = Ho * Wo, plane_tiles = (plane + BL - 1) / BL;  // K_MAJOR: an image's pixels and l tiles
    const WgradShare<STREAM_K, BM, BJ> share(K_MAJOR ? L / plane * plane_tiles : (L + BL - 1) / BL, J, K, stream_k);
    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbarrier_init(full + s, 1);              // the copying thread's expect-tx arrival
            mbarrier_init(empty + s, 4 * A_PANELS);  // the lane 0s of the multiplying warps
        }
    }
    __syncthreads();

    if (warpgroup == A_PANELS) {  // the copying warp
        if (tid != CONSUMERS) return;
        int it = 0;  // l tiles copied so far, over all segments: the ring's position
        share.segments([&](int, int j0, int o0, int k_begin, int k_end) {
            const XPanels<B_PANELS, 64> panels(j0, J, C, kw, dh, dw, PANEL);
            if constexpr (K_MAJOR) {
                int image = k_begin / plane_tiles, pixel = (k_begin - image * plane_tiles) * BL;
#pragma unroll 1
                for (int t = k_begin; t < k_end; ++t, ++it) {
                    const int stage = it % STAGES;
                    if (it >= STAGES) mbarrier_wait(empty + stage, (it / STAGES - 1) & 1);
                    mbarrier_arrive_expect_tx(full + stage, A_STAGE + panels.bytes);
                    tma_load_2d(a_smem + stage * A_STAGE, &dy_map, pixel, image * K + o0, full + stage);
#pragma unroll
                    for (int b = 0; b < B_PANELS; ++b)
                        if (j0 + 64 * b < J)
                            tma_load_2d(b_smem + stage * B_STAGE + b * PANEL, &x_map, pixel, image * C + j0 + 64 * b,
                                        full + stage);
                    pixel += BL;
                    if (pixel >= plane) { pixel = 0; ++image; }
                }
            } else {
                LTileCorner<BL> corner(k_begin, Ho, Wo);
#pragma unroll 1
                for (int t = k_begin; t < k_end; ++t, ++it) {
                    const int stage = it % STAGES;
                    if (it >= STAGES) mbarrier_wait(empty + stage, (it / STAGES - 1) & 1);
                    copy_l_tile<A_PANELS, B_PANELS, 64, PANEL>(a_smem + stage * A_STAGE, b_smem + stage * B_STAGE,
                                                               full + stage, &dy_map, &x_map, o0, j0, J, t, panels,
                                                               corner, sh, sw, pt, pl);
                    corner.next(Ho, Wo);
                }
            }
        });
        return;
    }

    const int lane = tid & 31;
    int it = 0;
    share.segments([&](int tile, int j0, int o0, int k_begin, int k_end) {
        float acc[ACC];
#pragma unroll
        for (int j = 0; j < ACC; ++j) acc[j] = 0.0f;
#pragma unroll 1
        for (int t = k_begin; t < k_end; ++t, ++it) {
            const int stage = it % STAGES;
            mbarrier_wait(full + stage, (it / STAGES) & 1);
            const unsigned a_tile = shared_address(a_smem + stage * A_STAGE + warpgroup * PANEL);
            const unsigned b_tile = shared_address(b_smem + stage * B_STAGE);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BL / INST_L; ++kk) {
                if constexpr (K_MAJOR)  // + 32 bytes (16 l) of each K-major row per instruction
                    wgmma_op<T, BJ, false>::run(acc, wgmma_descriptor(a_tile) + 2 * kk,
                                                wgmma_descriptor(b_tile) + 2 * kk);
                else  // + 16 l rows of 128 bytes per instruction
                    wgmma_op<T, BJ, true>::run(acc, wgmma_descriptor_mn(a_tile + kk * 2048, PANEL),
                                               wgmma_descriptor_mn(b_tile + kk * 2048, PANEL));
            }
            wgmma_commit();
            wgmma_wait<1>();  // l tile t - 1's MMAs retired: its stage may be refilled
            if (t > k_begin && lane == 0) mbarrier_arrive(empty + (it - 1) % STAGES);
        }
        wgmma_wait<0>();
        if (k_end > k_begin && lane == 0) mbarrier_arrive(empty + (it - 1) % STAGES);

        if constexpr (STREAM_K) {
            if (!share.template settle<CONSUMERS, ACC, CONSUMER_BARRIER>(acc, tile, k_begin, slots, flags)) return;
        }
        store_warpgroup_sums<T, BJ>(acc, ws + static_cast<long long>(blockIdx.z) * K * J, out, direct,
                                    o0 + warpgroup * 64, j0, K, J);
    });
}

// The K-major weight gradient's x row of a tile (wgrad_tensor_cores_tma_tf32, LANDING 0): the 128-byte row at
// `row_at` (row `row` of its swizzled panel) holds the tile's pixels SKEW places on, `tail` the 4 pixels past it.
// Written back in place: pixel p = x[p + SKEW] rounded to TF32 where bit p of `keep` is set, else zero.
template <int SKEW>
__device__ __forceinline__ void take_skewed_row(unsigned char* row_at, const float* tail, unsigned keep, int row) {
    float w[36];
#pragma unroll
    for (int c = 0; c < 8; ++c)
        *reinterpret_cast<float4*>(w + 4 * c) = *reinterpret_cast<const float4*>(row_at + (swizzle128_slot(c, row) << 4));
    if constexpr (SKEW > 0) *reinterpret_cast<float4*>(w + 32) = *reinterpret_cast<const float4*>(tail);
#pragma unroll
    for (int c = 0; c < 8; ++c) {
        unsigned r[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) r[e] = keep >> (4 * c + e) & 1 ? to_tf32_for_mma(w[4 * c + e + SKEW]) : 0u;
        *reinterpret_cast<uint4*>(row_at + (swizzle128_slot(c, row) << 4)) = make_uint4(r[0], r[1], r[2], r[3]);
    }
}

// TF32 (float storage): TF32's wgmma reads K-major operands only (no transposed 32-bit operands), and in NHWC
// both of the weight gradient's are l-major. So the TMA copies land in a ring of their own, LANDING stages
// deep, as panels [BL = 32 pixels][32 channels] (128-byte rows, swizzled), copied as above (dy as the
// matrix [L][Kp], x's panels of one tap each through the im2col map) by one thread of the last warp; the
// TRANSPOSERS warps before it rewrite each of x's panels as 32 K-major rows [channel][32 pixels], rounded to TF32
// on the way (to_tf32_for_mma), into the STAGES-deep ring the warpgroups' wgmma reads as B (the forward's operand
// layout: a row of 128 bytes a channel, 16-byte piece i of row r in slot i ^ (r % 8)); the warpgroups take dy's
// fragments (A) from its landed panels into registers, rounded there (wgmma_rs: a pass over shared memory fewer
// than transposing dy too; H200, TF32 channels_last wgrad 1.03x -> 1.06x). Barriers: "landed" (the copies'
// bytes) and "taken" (the transposers and the warpgroups are done reading a landing stage) between the copying
// thread and the rest; "full" and "empty" between the transposers and the warpgroups. Runs, `direct`
// and STREAM_K as above: every role walks the block's segments with one `it` across them (the rings' positions);
// the K-major tiles (LANDING 0) have runs alone (stream-K's segments beside their rounders' state spilled). The
// copying thread has a warp of its own: issued by a transposing warp, the copies waited on every transposer and
// held up the next tile's transposes (tiles up to 2x slower, H200).
// Four transposing warps (three ran the 128 x 128 tile up to 1.15x slower), beside at most two warpgroups: a
// 256 x 128 tile's 21 warps would leave 80 registers a thread, too few for a warpgroup's accumulators and its
// wgmma, and with three transposers it lost to 128 x 128 once the transposes' loads were batched.
// A quarter warp (t = lane % 8) moves, per step, the 4 x 4 blocks (pixels 4 t.., channels 4 ((t + d) % 8)..)
// of a panel's diagonal d, each thread by four 16-byte loads (its 4 pixels' rows) and four 16-byte stores
// (its 4 channels' rows): the 8 loads of an instruction land in slots (t + d) % 8 ^ (4 t + k) % 8 of their
// rows and the stores in slots t ^ (4 (t + d) + e) % 8, both a permutation of 0..7 over t, so neither
// conflicts.
// LANDING == 0: NCHW x and dy of a stride-1 layer whose output rows are as wide as the input's (Wo == W), whose
// rows (a channel's pixels) are already K-major: dy as the matrix [N K][Ho Wo], x as [N C][H W] (the argument C:
// x's channels an image; K: dy's, and the partial sums' rows), an l tile 32 pixels of one image (an image's last
// tile zero-filled past Ho Wo). With Wo == W a tap (r, s) moves every pixel of x's plane by the same amount, so
// x's panel of a tap is a box of the same 32 pixels shifted by (r dh - pt) W + s dw - pl: rows of x's plane
// above or below it fall outside [0, H W) and the map gives zeros; a column outside the row instead wraps to the
// row next to it, and the rounding warps zero those pixels (and those past the plane, whose dy is zero). A box
// must start on a 16-byte piece (elsewhere the copy stops the kernel with an illegal instruction, H200), so x's
// box starts at the piece holding the shifted pixel, and where the shift is not a whole piece a tail box of the
// 4 pixels past it lands beside the stage. Each copy lands as its stage's rows in wgmma's layout; eight middle
// warps, in two groups taking turns by l tile, move x's pixels back by their skew, rounded and masked, and the
// warpgroups take dy's fragments into registers, rounded there: no landing ring, no transposes, no pass over dy.
// x's panels lie in one tap (C a multiple of 32, or a 1x1 kernel); a 1x1 layer's rows of a panel past an image's
// channels hold the next image's, which only reach sums past K or J, never written or cut by the reduction.
template <int BM, int BJ, int LANDING, int STAGES, bool STREAM_K>
__global__ void __launch_bounds__(BM / 64 * 128 + 32 + (LANDING == 0 ? 256 : 128), 1)
wgrad_tensor_cores_tma_tf32(float* __restrict__ ws, float* __restrict__ out, int direct, int stream_k,
                            float* __restrict__ slots, int* __restrict__ flags, int L, int C, int J, int K,
                            int Ho, int Wo, int kw, int sh, int sw, int pt, int pl, int dh, int dw,
                            const __grid_constant__ TensorMap dy_map, const __grid_constant__ TensorMap x_map,
                            const __grid_constant__ TensorMap x_tail_map) {
    constexpr bool K_MAJOR = LANDING == 0;
    constexpr int BL = 32, PANEL = BL * 128;  // a landed panel: BL pixels x 32 channels; 32 rows of BL pixels
    constexpr int A_PANELS = BM / 32, B_PANELS = BJ / 32, PANELS = A_PANELS + B_PANELS;
    constexpr int LAND_STAGE = PANELS * PANEL, A_STAGE = A_PANELS * PANEL, B_STAGE = B_PANELS * PANEL;
    constexpr int TAIL = 32 * 16, TAIL_STAGE = B_PANELS * TAIL;  // K_MAJOR: a panel's 4 pixels past its box
    constexpr int CONSUMERS = BM / 64 * 128, ACC = BJ / 2, INST_L = 8;
    // dy's landing stage is given back by every multiplying thread once its fragments are in its registers: lane 0's
    // arrival alone, a branch between the loads and the MMAs, made ptxas serialize the wgmma (C7520). But for the
    // 128 x 128 stream-K tile: its MMAs in flight beside two register sets spill at the 128 registers a thread of
    // 416 leaves (warps take registers four at a time: 16 x 32 x 128 = 64 K), so it keeps lane 0's (serialized).
    constexpr bool EVERY_THREAD_GIVES_BACK = !(STREAM_K && BM == 128 && BJ == 128);
    constexpr int GIVERS = EVERY_THREAD_GIVES_BACK ? CONSUMERS : CONSUMERS / 32;
    constexpr int TRANSPOSERS = 4, QUARTERS = 4 * TRANSPOSERS;  // warps (K_MAJOR: rounding), and their quarters
    constexpr int GROUPS = K_MAJOR ? 2 : 1;  // K_MAJOR: two groups of rounding warps, taking turns by l tile
    constexpr int LANDED = K_MAJOR ? STAGES : LANDING;          // the ring the copies land in
    static_assert((BM == 64 || BM == 128) && (BJ == 64 || BJ == 128), "one or two warpgroups, wgmma's widths");
    static_assert(!(K_MAJOR && STREAM_K), "the K-major tiles run in runs: their rounders take one segment");
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023);
    unsigned char* landing = smem;                                 // [LANDING][PANELS][BL][32]: dy's, then x's
    unsigned char* a_smem = landing + LANDING * LAND_STAGE;        // K_MAJOR: [STAGES][BM][BL] (else dy stays landed)
    unsigned char* b_smem = a_smem + (K_MAJOR ? STAGES * A_STAGE : 0);  // [STAGES][BJ][BL]
    unsigned char* tails = b_smem + STAGES * B_STAGE;              // K_MAJOR: [STAGES][B_PANELS][32 channels][4]
    unsigned long long* landed = reinterpret_cast<unsigned long long*>(tails + (K_MAJOR ? STAGES * TAIL_STAGE : 0));
    unsigned long long* taken = landed + LANDED;
    unsigned long long* full = taken + LANDING;
    unsigned long long* empty = full + STAGES;

    const int tid = threadIdx.x, lane = tid & 31;
    const int plane_tiles = (Ho * Wo + BL - 1) / BL;  // K_MAJOR: an image's l tiles
    // The block's segments: (tile, j0, o0, l tiles [k_begin, k_end)); `it` counts l tiles over all of them (the
    // rings' positions).
    const WgradShare<STREAM_K, BM, BJ> share(K_MAJOR ? L / (Ho * Wo) * plane_tiles : (L + BL - 1) / BL, J, K, stream_k);
    if (tid == 0) {
        for (int s = 0; s < LANDED; ++s) mbarrier_init(landed + s, 1);  // the copying thread's expect-tx arrival
        for (int s = 0; s < LANDING; ++s)  // transposing warps' lane 0s (x's), the multiplying warps' GIVERS (dy's)
            mbarrier_init(taken + s, TRANSPOSERS + GIVERS);
        for (int s = 0; s < STAGES; ++s) {
            mbarrier_init(full + s, TRANSPOSERS);      // the transposing (rounding) warps' lane 0s
            mbarrier_init(empty + s, CONSUMERS / 32);  // the lane 0s of the multiplying warps
        }
    }
    __syncthreads();

    if (tid >= CONSUMERS + 32 * TRANSPOSERS * GROUPS) {  // the copying warp
        if (tid != CONSUMERS + 32 * TRANSPOSERS * GROUPS) return;
        int it = 0;
        if constexpr (K_MAJOR) {
            share.segments([&](int, int j0, int o0, int k_begin, int k_end) {
                const XPanels<B_PANELS, 32> panels(j0, J, C, kw, dh, dw, PANEL);
                int shift[B_PANELS], bytes = A_STAGE + panels.bytes;  // a panel's tap: how far x's pixels lie from dy's
#pragma unroll
                for (int b = 0; b < B_PANELS; ++b) {
                    shift[b] = (panels.offset_h[b] - pt) * Wo + panels.offset_w[b] - pl;
                    bytes += j0 + 32 * b < J && (shift[b] & 3) ? TAIL : 0;
                }
                int image = k_begin / plane_tiles, pixel = (k_begin - image * plane_tiles) * BL;
#pragma unroll 1
                for (int t = k_begin; t < k_end; ++t, ++it) {
                    const int stage = it % STAGES;
                    if (it >= STAGES) mbarrier_wait(empty + stage, (it / STAGES - 1) & 1);
                    mbarrier_arrive_expect_tx(landed + stage, bytes);
                    tma_load_2d(a_smem + stage * A_STAGE, &dy_map, pixel, image * K + o0, landed + stage);
#pragma unroll
                    for (int b = 0; b < B_PANELS; ++b) {
                        if (j0 + 32 * b >= J) continue;
                        // A box starts on a 16-byte piece: from the shifted pixel's piece, and the 4 pixels past it
                        // where the shift leaves the piece.
                        const int from = pixel + (shift[b] & ~3), row = image * C + panels.channel[b];
                        tma_load_2d(b_smem + stage * B_STAGE + b * PANEL, &x_map, from, row, landed + stage);
                        if (shift[b] & 3)
                            tma_load_2d(tails + stage * TAIL_STAGE + b * TAIL, &x_tail_map, from + BL, row,
                                        landed + stage);
                    }
                    pixel += BL;
                    if (pixel >= Ho * Wo) { pixel = 0; ++image; }
                }
            });
        } else {
            share.segments([&](int, int j0, int o0, int k_begin, int k_end) {
                const XPanels<B_PANELS, 32> panels(j0, J, C, kw, dh, dw, PANEL);
                LTileCorner<BL> corner(k_begin, Ho, Wo);
#pragma unroll 1
                for (int t = k_begin; t < k_end; ++t, ++it) {
                    const int stage = it % LANDING;
                    if (it >= LANDING) mbarrier_wait(taken + stage, (it / LANDING - 1) & 1);
                    unsigned char* to = landing + stage * LAND_STAGE;
                    copy_l_tile<A_PANELS, B_PANELS, 32, PANEL>(to, to + A_STAGE, landed + stage, &dy_map, &x_map, o0,
                                                               j0, J, t, panels, corner, sh, sw, pt, pl);
                    corner.next(Ho, Wo);
                }
            });
        }
        return;
    }

    if (tid >= CONSUMERS) {  // the transposing warps (K_MAJOR: rounding in place)
        if constexpr (K_MAJOR) {
            constexpr int UNITS = 32 * TRANSPOSERS;
            static_assert(B_PANELS <= TRANSPOSERS, "a warp a panel");
            const int unit = (tid - CONSUMERS) % UNITS, group = (tid - CONSUMERS) / UNITS, panel = unit / 32;
            // x only (the warpgroups take dy's fragments in registers): warp w takes panel w, each lane one of its
            // rows (a channel), whose box (from the 16-byte piece holding the tap's first pixel; landed swizzled)
            // holds the tile's pixels `skew` places on, the last ones in the tail box: its 8 pieces and the tail in
            // registers, then the 8 pieces of pixels skew .. written back, rounded, where the tap's column leaves
            // the row (or the pixel the plane) zero. The warp's skew is one (a branch taken alike by all lanes); the
            // zeros are a mask of the tile's 32 pixels, lane l's bit from pixel l's column (q, counted along the
            // tiles without a division), by a ballot. One lane a row: x's reads are 9 pieces for 8 written, none
            // across lanes (two pieces a thread across lanes and selects by the skew ran 2.8x slower, H200).
            // One segment: the K-major tiles run in runs alone (see the kernel's note).
            share.segments([&](int, int j0, int, int k_begin, int k_end) {
                const int plane = Ho * Wo, step = BL % Wo;
                const bool x_panel = panel < B_PANELS && j0 + 32 * panel < J;
                const int tap = (j0 + 32 * panel) / C;  // the warp's panel's
                const int s_off = tap % kw * dw - pl, skew = ((tap / kw * dh - pt) * Wo + s_off) & 3;
                const int first_q = lane % Wo;
                int pixel = 0, q = first_q;
                auto next_tile = [&] {
                    pixel += BL;
                    q += step;
                    if (q >= Wo) q -= Wo;
                    if (pixel >= plane) { pixel = 0; q = first_q; }
                };
                if (group < k_end - k_begin) {  // the group's first l tile
                    pixel = (k_begin + group) % plane_tiles * BL;
                    q = (pixel + lane) % Wo;
                }
#pragma unroll 1
                for (int it = group; it < k_end - k_begin; it += GROUPS) {
                    const int stage = it % STAGES;
                    const bool kept =
                        pixel + lane < plane && static_cast<unsigned>(q + s_off) < static_cast<unsigned>(Wo);
                    const unsigned keep = __ballot_sync(0xffffffffu, kept);
                    mbarrier_wait(landed + stage, (it / STAGES) & 1);
                    if (x_panel) {
                        unsigned char* row_at = b_smem + stage * B_STAGE + panel * PANEL + lane * 128;
                        const float* tail =
                            reinterpret_cast<const float*>(tails + stage * TAIL_STAGE + panel * TAIL) + 4 * lane;
                        switch (skew) {
                            case 0: take_skewed_row<0>(row_at, tail, keep, lane); break;
                            case 1: take_skewed_row<1>(row_at, tail, keep, lane); break;
                            case 2: take_skewed_row<2>(row_at, tail, keep, lane); break;
                            default: take_skewed_row<3>(row_at, tail, keep, lane); break;
                        }
                    }
                    fence_proxy_async_shared();  // the rounded rows, to wgmma
                    __syncwarp();
                    if (lane == 0) mbarrier_arrive(full + stage);
#pragma unroll
                    for (int g = 0; g < GROUPS; ++g) next_tile();
                }
            });
        } else {
            // A quarter's units (panel, diagonal) per l tile, all in registers at once (16 floats a unit, within the
            // 128 a thread of four warps a scheduler).
            constexpr int UNITS = B_PANELS * 8 / QUARTERS;  // x's panels (the warpgroups take dy's)
            static_assert(B_PANELS * 8 % QUARTERS == 0 && UNITS <= 4, "whole diagonals, a quarter's units in registers");
            const int t = lane & 7, quarter = (tid - CONSUMERS) >> 3;
            int it = 0;
            share.segments([&](int, int j0, int, int k_begin, int k_end) {
#pragma unroll 1
                for (int l_tile = k_begin; l_tile < k_end; ++l_tile, ++it) {
                    const int from_stage = it % LANDING, stage = it % STAGES;
                    mbarrier_wait(landed + from_stage, (it / LANDING) & 1);
                    if (it >= STAGES) mbarrier_wait(empty + stage, (it / STAGES - 1) & 1);
                    const unsigned char* from = landing + from_stage * LAND_STAGE;
                    // Every unit's loads issued before any of its stores: the compiler may not move a load from shared
                    // memory above a store to it, so one unit at a time waited out every load's latency (ncu: the
                    // transposers stalled on shared-memory loads for 2/3 of their cycles).
                    float4 v[UNITS][4];  // unit u: pixels 4 t + k, channels 4 c ..
#pragma unroll
                    for (int u = 0; u < UNITS; ++u) {
                        const int unit = quarter + QUARTERS * u, panel = A_PANELS + (unit >> 3), c = (t + unit) & 7;
                        if (j0 + 32 * (panel - A_PANELS) >= J) continue;  // a panel not copied
#pragma unroll
                        for (int k = 0; k < 4; ++k) {
                            const int row = 4 * t + k;
                            v[u][k] = *reinterpret_cast<const float4*>(from + panel * PANEL + row * 128 +
                                                                       (swizzle128_slot(c, row) << 4));
                        }
                    }
#pragma unroll
                    for (int u = 0; u < UNITS; ++u) {
                        const int unit = quarter + QUARTERS * u, panel = A_PANELS + (unit >> 3), c = (t + unit) & 7;
                        if (j0 + 32 * (panel - A_PANELS) >= J) continue;
                        unsigned char* to = b_smem + stage * B_STAGE + (panel - A_PANELS) * PANEL;
#pragma unroll
                        for (int e = 0; e < 4; ++e) {  // channel 4 c + e: pixels 4 t ..
                            const int row = 4 * c + e;
                            const float* f[4] = {&v[u][0].x, &v[u][1].x, &v[u][2].x, &v[u][3].x};
                            *reinterpret_cast<uint4*>(to + row * 128 + (swizzle128_slot(t, row) << 4)) =
                                make_uint4(to_tf32_for_mma(f[0][e]), to_tf32_for_mma(f[1][e]), to_tf32_for_mma(f[2][e]),
                                           to_tf32_for_mma(f[3][e]));
                        }
                    }
                    fence_proxy_async_shared();  // the rows written, to wgmma
                    __syncwarp();
                    if (lane == 0) {
                        mbarrier_arrive(taken + from_stage);
                        mbarrier_arrive(full + stage);
                    }
                }
            });
        }
        return;
    }

    const int warpgroup = tid >> 7;
    // dy's fragments from its landed (unrounded) copy into registers, rounded there: mma.sync's m16n8k8 A layout, the
    // warp's 16 rows (a0: output channel `row`, pixel tq; a1: row + 8; a2, a3: pixel + 4), a scalar load each. K_MAJOR:
    // from the stage's K-major rows (the 8 quads' rows in 8 swizzle slots: no bank conflicts); else from the landing
    // stage's l-major panels, which are then free to the copies once the transposers have taken x's (`taken`).
    // Two register sets, taken by l tile in turn: the tensor cores read a set until the wait after the next tile's
    // MMAs are issued.
    constexpr int KK = BL / INST_L;
    const int row = warpgroup * 64 + ((tid >> 5) & 3) * 16 + (lane >> 2), tq = lane & 3;
    float acc[ACC];
    auto tile = [&](unsigned (&a)[KK][4], int it) {
        const int stage = it % STAGES, from_stage = K_MAJOR ? stage : it % LANDING;
        mbarrier_wait(landed + from_stage, (it / LANDED) & 1);  // dy's copy, read here
        mbarrier_wait(full + stage, (it / STAGES) & 1);
#pragma unroll
        for (int kk = 0; kk < KK; ++kk)
#pragma unroll
            for (int f = 0; f < 4; ++f) {
                const int o = row + 8 * (f & 1), l = 8 * kk + tq + 4 * (f >> 1);
                const unsigned char* at =
                    K_MAJOR ? a_smem + stage * A_STAGE + o * 128 + (swizzle128_slot(l >> 2, o) << 4) + 4 * (l & 3)
                            : landing + from_stage * LAND_STAGE + (o >> 5) * PANEL + l * 128 +
                                  (swizzle128_slot((o & 31) >> 2, l) << 4) + 4 * (o & 3);
                a[kk][f] = to_tf32_for_mma(*reinterpret_cast<const float*>(at));
            }
        if constexpr (!K_MAJOR && EVERY_THREAD_GIVES_BACK) {
            mbarrier_arrive(taken + from_stage);
        } else if constexpr (!K_MAJOR) {
            __syncwarp();
            if (lane == 0) mbarrier_arrive(taken + from_stage);
        }
        const unsigned long long b = wgmma_descriptor(shared_address(b_smem + stage * B_STAGE));
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KK; ++kk) wgmma_rs<float, BJ>::run(acc, a[kk], b + kk * 2);
        wgmma_commit();
        wgmma_wait<1>();  // l tile it - 1's MMAs retired: its stage and register set may be reused
        if (it > 0 && lane == 0) mbarrier_arrive(empty + (it - 1) % STAGES);
    };
    unsigned a0[KK][4], a1[KK][4];
    int it = 0;  // l tiles taken so far, over all segments: the rings' positions
    share.segments([&](int tile_index, int j0, int o0, int k_begin, int k_end) {
#pragma unroll
        for (int j = 0; j < ACC; ++j) acc[j] = 0.0f;
        // Two l tiles a step, a register set each by position (a branch on `it` choosing the set cost the runs ~7 %).
        const int first = it, tiles = k_end - k_begin;
#pragma unroll 1
        for (int t = 0; t < tiles; t += 2) {
            tile(a0, first + t);
            if (t + 1 < tiles) tile(a1, first + t + 1);
        }
        it += tiles;
        wgmma_wait<0>();
        if constexpr (STREAM_K) {
            if (!share.template settle<CONSUMERS, ACC, CONSUMER_BARRIER>(acc, tile_index, k_begin, slots, flags))
                return;  // published: the tile's owner writes it
        }
        store_warpgroup_sums<float, BJ>(acc, ws + static_cast<long long>(blockIdx.z) * K * J, out, direct,
                                        o0 + warpgroup * 64, j0, K, J);
    });
}

}  // namespace cupyconv
