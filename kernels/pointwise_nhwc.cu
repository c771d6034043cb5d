// 1x1, stride-1, unpadded convolution of channels-last tensors of few channels: the GEMM
//   y[m][n] = sum_c x[m][c] w[n][c]      m: the N H W pixels, n: the K output channels, c: C <= CB bytes
// with the whole reduction in shared memory at once, streamed over the pixels by persistent blocks.
//
// Such a layer (ResNet-50's 64 -> 256, MobileNetV2's 144 -> 24) is memory-bound: it reads x once and
// writes y once, and the GEMM of implicit_gemm_nhwc.cu spends its blocks loading, multiplying and
// storing in turn with nothing to overlap (one or two k tiles; H100 at 52-56 % of copy bandwidth). Here
// block (bx, by) keeps output channels by BN .. by BN + BN - 1 of the weight in shared memory for the
// whole launch and takes pixel tiles bx, bx + gridDim.x, ...: the copies of tile i + STAGES - 1 are
// in flight while tile i is multiplied and while its outputs are stored. The blocks of one pixel tile
// (one per channel tile) run it at about the same time, so x comes from DRAM once and from L2 after.
//
// Per pixel tile: BM pixels x all C channels in one stage, rows of CB + 16 bytes (an odd number of
// 16-byte units: ldmatrix is conflict-free); warps of (BM / WARPS_M) x (BN / WARPS_N) (BN need not be a power
// of two: tiles of 96 and 144 channels fit MobileNetV2's expansions without an idle last tile), mma.sync
// m16n8k16 (16-bit) or m16n8k8 (TF32) with float32 accumulators. Where a warp's weight fragments fit
// 32 registers (B_IN_REGISTERS), they are loaded once for the launch: the weight does not change from
// tile to tile, and its ldmatrix were half the shared-memory reads of a tile. A float32 x and weight
// are read in place and rounded to TF32 in their fragments (cvt.rna, as the other tensor-core kernels
// round).
// Epilogue in registers (bias, residual, activation: epilogue.cuh), the tile staged in the storage type
// and stored in 16-byte vectors of whole pixel rows. The residual is copied (cp.async) into the staging
// rows first, while the tile multiplies, and read there.
// With has_input_scale, x is multiplied by input_scale[image][channel] first (squeeze-and-excitation's
// gate, N x C in the storage type) and rounded to the storage type, as a separate x * scale would: each
// thread scales the pieces of a tile it copied, once they landed, before the block multiplies them.
//
// The planner (families/pointwise_nhwc.py) asks: C bytes a multiple of 16 and at most CB, K bytes a
// multiple of 16, operands 16-byte aligned (the fronts copy those that are not). Channels past C
// (to the 32 bytes of an instruction's k) are zero-filled in both operands.
#include "dtypes.cuh"
#include "epilogue.cuh"
#include "mma.cuh"

namespace cupyconv {

// A 16-byte piece of x times the same piece of the input scale, each product rounded once to T: two
// 16-bit values a packed multiply (their exact product is a float's, so the packed multiply's one
// rounding is that of x * s computed in float and rounded to T; bfloat16's as an fma with -0, which
// sm_80 has), four float32 values each a float multiply.
template <typename T> __device__ __forceinline__ uint4 scaled_piece(uint4 x, uint4 s);
template <> __device__ __forceinline__ uint4 scaled_piece<half_t>(uint4 x, uint4 s) {
    asm("mul.rn.f16x2 %0, %0, %4;\n\tmul.rn.f16x2 %1, %1, %5;\n\tmul.rn.f16x2 %2, %2, %6;\n\tmul.rn.f16x2 %3, %3, %7;"
        : "+r"(x.x), "+r"(x.y), "+r"(x.z), "+r"(x.w) : "r"(s.x), "r"(s.y), "r"(s.z), "r"(s.w));
    return x;
}
template <> __device__ __forceinline__ uint4 scaled_piece<bfloat16_t>(uint4 x, uint4 s) {
    const unsigned minus_zero = 0x80008000u;
    asm("fma.rn.bf16x2 %0, %0, %4, %8;\n\tfma.rn.bf16x2 %1, %1, %5, %8;\n\t"
        "fma.rn.bf16x2 %2, %2, %6, %8;\n\tfma.rn.bf16x2 %3, %3, %7, %8;"
        : "+r"(x.x), "+r"(x.y), "+r"(x.z), "+r"(x.w) : "r"(s.x), "r"(s.y), "r"(s.z), "r"(s.w), "r"(minus_zero));
    return x;
}
template <> __device__ __forceinline__ uint4 scaled_piece<float>(uint4 x, uint4 s) {
    return make_uint4(__float_as_uint(__uint_as_float(x.x) * __uint_as_float(s.x)),
                      __float_as_uint(__uint_as_float(x.y) * __uint_as_float(s.y)),
                      __float_as_uint(__uint_as_float(x.z) * __uint_as_float(s.z)),
                      __float_as_uint(__uint_as_float(x.w) * __uint_as_float(s.w)));
}

// Blocks per SM asked of the register allocator: MIN_BLOCKS, at most two with 64-bit indices (whose
// pixel offsets are register pairs: at three, the 64 x 128 tile spilled 188 bytes).
__host__ __device__ constexpr int pointwise_min_blocks(int min_blocks, int index_bytes) {
    return index_bytes == 8 && min_blocks > 2 ? 2 : min_blocks;
}

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

template <typename T, typename Index, int BM, int BN, int CB, int STAGES, int WARPS_M, int WARPS_N, int MIN_BLOCKS>
__global__ void __launch_bounds__(WARPS_M * WARPS_N * 32, pointwise_min_blocks(MIN_BLOCKS, sizeof(Index)))
pointwise_nhwc(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias, T* __restrict__ y,
               int has_bias, const T* __restrict__ residual, int has_residual, int activation,
               const T* __restrict__ input_scale, int has_input_scale, int N, int C, int H, int W, int K) {
    constexpr int NT = WARPS_M * WARPS_N * 32;
    constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;        // warp tile
    constexpr int MT = WM / 16, NTILES = WN / 8;               // instruction tiles per warp
    constexpr int ROW = CB + 16;                               // bytes per operand row in shared memory
    constexpr int PIECES = CB / 16;                            // 16-byte pieces per row
    constexpr int EPP = 16 / sizeof(T);                        // elements per piece
    constexpr int INST_BYTES = mma_op<T>::k * sizeof(T);       // 32 bytes of k per instruction
    constexpr int OUT_ROW = BN * sizeof(T) + 16;               // staged output row, bytes
    constexpr int VECTORS = BN * sizeof(T) / 16;               // 16-byte vectors per staged row
    constexpr int X_STAGE = BM * ROW;
    static_assert(CB % INST_BYTES == 0 && (CB / 16) % 2 == 0, "whole instructions of k; rows of odd 16-byte units");
    static_assert(NT % PIECES == 0 && NT >= VECTORS, "a loader a piece of a row; a row of vectors a pass at least");
    static_assert(WM % 16 == 0 && WN % 16 == 0 && STAGES >= 2, "x4 ldmatrix for A and B; a stage to load ahead");
    constexpr int K_STEPS = CB / INST_BYTES;
    // (32 registers at most, two blocks per SM at most, 32-bit indices: more spilled beside the
    // accumulators and the 64-bit pixel offsets.)
    constexpr bool B_IN_REGISTERS = NTILES * K_STEPS * 2 <= 32 && MIN_BLOCKS <= 2 && sizeof(Index) == 4;

    extern __shared__ __align__(16) unsigned char smem[];
    unsigned char* w_smem = smem;                              // [BN][ROW]
    unsigned char* x_smem = smem + BN * ROW;                   // [STAGES][BM][ROW]
    unsigned char* out_smem = x_smem + STAGES * X_STAGE;       // [BM][OUT_ROW]

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const Index M = static_cast<Index>(N) * H * W;
    const int tiles = static_cast<int>((M + BM - 1) / BM);
    const int n0 = blockIdx.y * BN;
    const int c_pieces = C * static_cast<int>(sizeof(T)) / 16;  // pieces of x's and w's rows that hold channels
    const int k_steps = (C * static_cast<int>(sizeof(T)) + INST_BYTES - 1) / INST_BYTES;
    const int used_pieces = k_steps * (INST_BYTES / 16);       // the rest of a row is never read
    // This block's pixel tiles: blockIdx.x + gridDim.x i, i < count.
    const int count = tiles > static_cast<int>(blockIdx.x) ? (tiles - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;

    const int piece = tid % PIECES, row0 = tid / PIECES;
    constexpr int ROWS_PER_PASS = NT / PIECES;
    // Whether pass r's row (row0 + r ROWS_PER_PASS) is one of a tile's ROWS: tiles of 96 or 144 channels, or
    // blocks of 6 warps, are not whole passes.
    auto in_tile = [&](int rows, int r) { return rows % ROWS_PER_PASS == 0 || row0 + r * ROWS_PER_PASS < rows; };
    auto load_x = [&](int i) {
        if (i < count && piece < used_pieces) {
            const Index m_first = static_cast<Index>(blockIdx.x + gridDim.x * i) * BM;
            unsigned char* dst = x_smem + (i % STAGES) * X_STAGE + row0 * ROW + piece * 16;
#pragma unroll
            for (int r = 0; r < ceil_div(BM, ROWS_PER_PASS); ++r) {
                if (!in_tile(BM, r)) break;
                const Index m = m_first + row0 + r * ROWS_PER_PASS;
                const bool ok = m < M && piece < c_pieces;
                cp_async<16>(dst + r * ROWS_PER_PASS * ROW, ok ? x + (m * C + piece * EPP) : x, ok);
            }
        }
        cp_async_commit();  // empty groups keep the wait count uniform
    };
    // The input scale of this thread's channels (its piece) for image n: 16 bytes from L2, as a tile's
    // rows are of one or two images, loaded per image (the first row's while the tile's copies land).
    const Index plane = static_cast<Index>(H) * W;
    auto scale_of = [&](Index n) {
        return *reinterpret_cast<const uint4*>(input_scale + (n * C + piece * EPP));
    };
    auto first_image = [&](int i) {
        return (static_cast<Index>(blockIdx.x + gridDim.x * i) * BM + row0) / plane;
    };
    // This thread's pieces of tile i (landed) times the input scale of their pixel's image and channels,
    // given the image of its first row and its scale. The rows' images follow from the first's (a
    // plane's end passed, the next image), not a division a row: this runs between the tile's landing
    // and the block's barrier, where every instruction delays the tile.
    auto scale_x = [&](int i, Index n, uint4 packed) {
        if (i >= count || piece >= c_pieces) return;
        const Index m_first = static_cast<Index>(blockIdx.x + gridDim.x * i) * BM;
        unsigned char* at = x_smem + (i % STAGES) * X_STAGE + row0 * ROW + piece * 16;
        Index next_image_at = (n + 1) * plane;  // the first pixel of image n + 1
#pragma unroll
        for (int r = 0; r < ceil_div(BM, ROWS_PER_PASS); ++r) {
            const Index m = m_first + row0 + r * ROWS_PER_PASS;
            if (in_tile(BM, r) && m < M) {
                if (m >= next_image_at) {
                    while (m >= next_image_at) {
                        ++n;
                        next_image_at += plane;
                    }
                    packed = scale_of(n);
                }
                uint4* piece_x = reinterpret_cast<uint4*>(at + r * ROWS_PER_PASS * ROW);
                *piece_x = scaled_piece<T>(*piece_x, packed);
            }
        }
    };
    // The weight's rows n0 .. n0 + BN - 1, with the first tile's copies.
    if (piece < used_pieces) {
#pragma unroll
        for (int r = 0; r < ceil_div(BN, ROWS_PER_PASS); ++r) {
            if (!in_tile(BN, r)) break;
            const int n = n0 + row0 + r * ROWS_PER_PASS;
            const bool ok = n < K && piece < c_pieces;
            cp_async<16>(w_smem + (row0 + r * ROWS_PER_PASS) * ROW + piece * 16,
                         ok ? w + (static_cast<Index>(n) * C + piece * EPP) : w, ok);
        }
    }
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) load_x(i);

    const int warp_m = warp % WARPS_M, warp_n = warp / WARPS_M;
    const int wm = warp_m * WM, wn = warp_n * WN;
    const int quad = lane >> 2, tq = lane & 3;                 // PTX's groupID and threadID_in_group
    // ldmatrix rows: A (x4 = a0..a3) lanes 0-15 pixel rows 0-15 at k, 16-31 the same 16 bytes on; B (x4
    // = b0, b1 of two 8-channel tiles) lanes 0-7 channels 0-7 at k, 8-15 the same 16 bytes on, 16-31
    // channels 8-15 likewise.
    const int a_lane = (wm + (lane & 15)) * ROW + (lane >> 4) * 16;
    const int b_lane = (wn + (lane & 7) + ((lane >> 4) << 3)) * ROW + ((lane >> 3) & 1) * 16;
    float b[NTILES][2];                                        // this thread's columns' bias
#pragma unroll
    for (int nt = 0; nt < NTILES; ++nt)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int n = n0 + wn + nt * 8 + 2 * tq + j;
            b[nt][j] = has_bias && n < K ? to_acc<float>(bias[n]) : 0.0f;
        }
    // The B fragments of k step kk (b0, b1 of each 8-channel tile), rounded to TF32 in float32.
    auto load_b = [&](int kk, unsigned (&bf)[NTILES][2]) {
#pragma unroll
        for (int nt = 0; nt < NTILES; nt += 2) {
            unsigned r[4];
            ldmatrix_x4(r, w_smem + b_lane + nt * 8 * ROW + kk * INST_BYTES);
            if constexpr (sizeof(T) == 4) {
#pragma unroll
                for (int e = 0; e < 4; ++e) r[e] = to_tf32(__uint_as_float(r[e]));
            }
            bf[nt][0] = r[0]; bf[nt][1] = r[1];
            bf[nt + 1][0] = r[2]; bf[nt + 1][1] = r[3];
        }
    };
    unsigned held[B_IN_REGISTERS ? K_STEPS : 1][NTILES][2];
    if constexpr (B_IN_REGISTERS) {
        cp_async_wait<STAGES - 2>();  // the weight (with the first tile) landed: this thread's copies ...
        __syncthreads();              // ... everyone's
#pragma unroll
        for (int kk = 0; kk < K_STEPS; ++kk) load_b(kk, held[kk]);  // past C: never multiplied
    }
    // The staged rows' vectors: V_ROWS_PER_PASS rows a pass, by the first V_ROWS_PER_PASS VECTORS threads (all of
    // them where VECTORS divides NT; 252 of 256 on the 96-channel tile).
    constexpr int V_ROWS_PER_PASS = NT / VECTORS, V_PASSES = ceil_div(BM, V_ROWS_PER_PASS);
    const int v_col = tid % VECTORS, v_row0 = tid / VECTORS;
    // Whether pass r has a row of the tile for this thread.
    auto v_in_tile = [&](int r) {
        return (NT % VECTORS == 0 || v_row0 < V_ROWS_PER_PASS) &&
               (BM % V_ROWS_PER_PASS == 0 || v_row0 + r * V_ROWS_PER_PASS < BM);
    };
    const bool v_ok = n0 + v_col * EPP < K;
    // The residual of tile i, copied into the staged output's rows (where the tile's outputs go) in
    // 16-byte vectors while the tile multiplies: read element by element after the multiply, its
    // latency was exposed (2-3x its bytes' time). Its own group, after the previous tile's stores.
    auto load_residual = [&](int i) {
        const Index m0 = static_cast<Index>(blockIdx.x + gridDim.x * i) * BM;
#pragma unroll
        for (int r = 0; r < V_PASSES; ++r) {
            if (!v_in_tile(r)) break;
            const int row = v_row0 + r * V_ROWS_PER_PASS;
            const bool ok = v_ok && m0 + row < M;
            cp_async<16>(out_smem + row * OUT_ROW + v_col * 16,
                         ok ? residual + ((m0 + row) * K + n0 + v_col * EPP) : residual, ok);
        }
        cp_async_commit();
    };
    constexpr int OUT_ELEMENTS = OUT_ROW / static_cast<int>(sizeof(T));  // a staged row, in elements

    // The epilogue reads the residual where it was staged: at the output's own place in out_smem.
    with_epilogue<T>(reinterpret_cast<const T*>(out_smem), [&](auto finish) {
#pragma unroll 1
        for (int i = 0; i < count; ++i) {
            Index n_first = 0;
            uint4 first_scale{};
            if (has_input_scale && piece < c_pieces && first_image(i) < N) {
                n_first = first_image(i);
                first_scale = scale_of(n_first);
            }
            cp_async_wait<STAGES - 2>();  // tile i (and the weight) landed: this thread's copies ...
            if (has_input_scale) scale_x(i, n_first, first_scale);
            __syncthreads();              // ... everyone's; tile i - 1's buffer and staged outputs are free
            if (has_residual) load_residual(i);
            load_x(i + STAGES - 1);
            const Index m0 = static_cast<Index>(blockIdx.x + gridDim.x * i) * BM;
            const unsigned char* a_buf = x_smem + (i % STAGES) * X_STAGE + a_lane;
            float acc[MT][NTILES][4];
            zero_accumulators(acc);
#pragma unroll
            for (int kk = 0; kk < K_STEPS; ++kk) {
                if (kk >= k_steps) break;
                unsigned a[MT][4], bf[NTILES][2];
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    ldmatrix_x4(a[mt], a_buf + mt * 16 * ROW + kk * INST_BYTES);
                    if constexpr (sizeof(T) == 4) {
#pragma unroll
                        for (int e = 0; e < 4; ++e) a[mt][e] = to_tf32(__uint_as_float(a[mt][e]));
                    }
                }
                if constexpr (!B_IN_REGISTERS) load_b(kk, bf);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int nt = 0; nt < NTILES; ++nt) {
                        if constexpr (B_IN_REGISTERS)
                            mma_op<T>::run(acc[mt][nt], a[mt], held[kk][nt]);
                        else
                            mma_op<T>::run(acc[mt][nt], a[mt], bf[nt]);
                    }
            }
            if (has_residual) {
                cp_async_wait<1>();  // the residual landed (tile i + STAGES - 1's copies may not have) ...
                __syncthreads();     // ... everyone's
            }
            // The epilogue in registers; pairs of adjacent channels staged as one 2-element store, over
            // the residual the same thread read there.
            using Pair = Pack<T, 2>;
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < NTILES; ++nt)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int row = wm + mt * 16 + quad + h * 8, col = wn + nt * 8 + 2 * tq;
                        const int at = row * OUT_ELEMENTS + col;
                        const bool ok = m0 + row < M && n0 + col < K;  // K is even: both channels or neither
                        Pair p;
                        p.v[0] = ok ? finish(acc[mt][nt][2 * h] + b[nt][0], at) : T{};
                        p.v[1] = ok ? finish(acc[mt][nt][2 * h + 1] + b[nt][1], at + 1) : T{};
                        *reinterpret_cast<Pair*>(out_smem + row * OUT_ROW + col * sizeof(T)) = p;
                    }
            __syncthreads();
#pragma unroll
            for (int r = 0; r < V_PASSES; ++r) {
                const int row = v_row0 + r * V_ROWS_PER_PASS;
                if (v_ok && v_in_tile(r) && m0 + row < M)
                    *reinterpret_cast<uint4*>(y + ((m0 + row) * K + n0 + v_col * EPP)) =
                        *reinterpret_cast<const uint4*>(out_smem + row * OUT_ROW + v_col * 16);
            }
        }
    });
    cp_async_wait<0>();  // no copy outlives the block
}

}  // namespace cupyconv
