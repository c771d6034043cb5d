// Strict float32 implicit-GEMM convolution on the FMA units (IEEE fmaf, no tensor cores, no TF32),
// reading the NCHW input in place.
//
// Per group g (gridDim.z), the convolution is the GEMM  Y[m][n] = sum_k A[m][k] B[k][n]  with
//   m = (image, oh, ow)   output pixels,                     M = N Ho Wo
//   n = output channel of g,                                Kg = K / groups
//   k = (c, r, s)         input channel of g, kernel tap,  Kgemm = Cg kh kw (the weight's own order)
// B is read from a transposed copy of the weight, wt [groups][Kgemm][Kgp] (Kgp = Kg rounded up to 4
// with zero columns), made by kernels/nchw_to_nhwc.cu, so that a row of a B tile is 16-byte pieces.
// A is gathered straight from the NCHW input, one 4-byte cp.async per element with zero-fill for
// padding: a warp's lanes take consecutive pixels at one k, so with stride 1 a warp reads 128
// contiguous bytes, and neighbouring taps re-read the same lines from L1. No input copy is made (an
// FMA kernel does 64 FMAs per element it stages, so the gather is cheap), and small channel counts
// such as AlexNet's 3 need no zero channels.
//
// Levels:
//   thread block  BM pixels x BN channels, a STAGES-deep cp.async pipeline over k tiles of BK;
//   warp          WM x WN, lanes as (WM / TM) x (WN / TN);
//   thread        TM x TN outputs (8 or 4 each): TM / 4 4-pixel runs WM / 2 apart times TN / 4 4-channel
//                 runs WN / 2 apart, so each k costs (TM + TN) / 4 float4 shared loads that a warp serves
//                 conflict-free. 8 x 8 does the most multiply-adds per load; 4 x 4 makes four times the
//                 threads of a tile's outputs, for short reductions on few tiles (batch 1), which wait on
//                 each thread's chain of multiply-adds rather than on issue.
// Shared memory: per stage A [BK][BM] and B [BK][BN], k-major (a thread's 4 pixels or 4 channels at
// one k are one float4); after the stages a table of the kernel taps (offset in an input plane, row
// and column offsets), so that a k costs one lookup instead of two divisions.
//
// Split-K (the SPLIT_K instances, for problems of too few tiles to fill the GPU; the others compile as
// if it did not exist, at their old register counts): gridDim.z = groups x splits,
// block z = split groups + g takes the split-th run of ceil(k tiles / splits) k tiles and writes its
// partial sums, without bias, to y + split split_elements (the host passes a workspace and
// has_bias = 0); kernels/split_k_reduce.cu then adds the splits in order, so the result is the same
// bits on every run.
#include "epilogue.cuh"
#include "gather_pixel.cuh"
#include "mma.cuh"

namespace cupyconv {

// Blocks per SM asked of the register allocator: enough that each thread may keep its accumulators
// plus 96 registers (operands, addresses and the gather state) without spilling: 160 for 8 x 8.
__host__ __device__ constexpr int simt_min_blocks(int threads, int outputs) {
    const int blocks = 65536 / (threads * (outputs + 96));
    return blocks < 1 ? 1 : (blocks > 8 ? 8 : blocks);
}

template <typename Index, int BM, int BN, int BK, int WM, int WN, int TM, int TN, int STAGES, bool SPLIT_K>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * 32, simt_min_blocks((BM / WM) * (BN / WN) * 32, TM * TN))
simt_gemm_conv2d(const float* __restrict__ x, const float* __restrict__ wt, const float* __restrict__ bias,
                 float* __restrict__ y, int has_bias, const float* __restrict__ residual, int has_residual,
                 int activation,
                 int N, int C, int H, int W, int K, int Ho, int Wo, int kh, int kw,
                 int sh, int sw, int pt, int pl, int dh, int dw, int groups, int Kgp, int splits,
                 int split_elements) {
    constexpr int WARPS_M = BM / WM, WARPS_N = BN / WN, NT = WARPS_M * WARPS_N * 32;
    constexpr int LM = WM / TM, LN = WN / TN;                // lanes along pixels and along channels
    constexpr int A_STAGE = BK * BM, B_STAGE = BK * BN;
    // A loader: each thread keeps A_PIXELS pixels and copies KPT consecutive k of each per tile; where
    // NT is not a multiple of BM, the last NT % BM threads copy only B.
    constexpr int A_PIXELS = BM > NT ? BM / NT : 1;
    constexpr int K_GROUPS = NT > BM ? NT / BM : 1;
    constexpr int A_LOADERS = NT > BM ? K_GROUPS * BM : NT;
    constexpr int KPT = BK / K_GROUPS;
    // B loader: 16-byte pieces of BN / 4 channels per tile row.
    constexpr int B_PIECES = BK * BN / 4;
    constexpr int B_PASSES = (B_PIECES + NT - 1) / NT;
    static_assert(LM * LN == 32, "a warp tile of 32 threads of TM x TN");
    static_assert((TM == 4 || TM == 8) && (TN == 4 || TN == 8), "one or two 4-wide runs each way");
    static_assert(BM % WM == 0 && BN % WN == 0, "whole warp tiles");
    static_assert(NT >= BM || BM % NT == 0, "the A loader covers whole pixels");
    static_assert(KPT >= 1 && BK % K_GROUPS == 0, "the A loader covers the k tile");

    extern __shared__ __align__(16) unsigned char smem_raw[];
    float* a_smem = reinterpret_cast<float*>(smem_raw);     // [STAGES][BK][BM]
    float* b_smem = a_smem + STAGES * A_STAGE;                // [STAGES][BK][BN]
    int4* taps = reinterpret_cast<int4*>(b_smem + STAGES * B_STAGE);  // [kh kw]: {r dh W + s dw, r dh, s dw}

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = SPLIT_K ? blockIdx.z % groups : blockIdx.z, split = SPLIT_K ? blockIdx.z / groups : 0;
    const int Cg = C / groups, Kg = K / groups;
    const int taps_per_c = kh * kw;
    const int Kgemm = Cg * taps_per_c;
    const Index HW = static_cast<Index>(H) * W;
    const Index HoWo = static_cast<Index>(Ho) * Wo;
    const Index M = static_cast<Index>(N) * HoWo;
    const Index m0 = static_cast<Index>(blockIdx.x) * BM;
    const int n0 = blockIdx.y * BN;
    const int all_tiles = (Kgemm + BK - 1) / BK;
    const int split_tiles = SPLIT_K ? (all_tiles + splits - 1) / splits : all_tiles;
    const int kt0 = split * split_tiles;  // this split's first k tile
    const int k_tiles = SPLIT_K ? max(0, min(all_tiles - kt0, split_tiles)) : all_tiles;
    if (SPLIT_K) y += static_cast<Index>(split) * split_elements;

    for (int t = tid; t < taps_per_c; t += NT) {
        const int r = t / kw, s = t - r * kw;
        taps[t] = make_int4(r * dh * W + s * dw, r * dh, s * dw, 0);
    }

    // --- A loader state: pixels a_m + NT i, k from a_k0 on (the thread's k group within a tile).
    const int a_m = tid % BM, a_k0 = (tid / BM) * KPT;
    Index a_base[A_PIXELS];   // input offset of the pixel's tap (0, 0), channel 0 of group g
    int a_ih0[A_PIXELS], a_iw0[A_PIXELS];
#pragma unroll
    for (int i = 0; i < A_PIXELS; ++i) {
        const GatherPixel<Index> px = gather_pixel<GatherLayout::nchw>(m0 + a_m + NT * i, M, HoWo, Wo, C, H, W, sh,
                                                                        sw, pt, pl, g, Cg);
        a_base[i] = px.base;
        a_ih0[i] = px.ih0;
        a_iw0[i] = px.iw0;
    }
    // The (c, tap) of the thread's next k, in the mixed radix (Cg, kh kw); after its KPT elements a
    // tile moves on by the other k groups' BK - KPT.
    int a_c = (kt0 * BK + a_k0) / taps_per_c, a_tap = kt0 * BK + a_k0 - a_c * taps_per_c;
    Index a_c_off = static_cast<Index>(a_c) * HW;
    const int skip_c = (BK - KPT) / taps_per_c, skip_tap = (BK - KPT) - skip_c * taps_per_c;

    const float* wt_g = wt + static_cast<Index>(g) * Kgemm * Kgp;

    auto load_tile = [&](int kt, int stage) {
        if (A_LOADERS == NT || tid < A_LOADERS) {
            float* a_dst = a_smem + stage * A_STAGE + a_k0 * BM + a_m;
#pragma unroll
            for (int j = 0; j < KPT; ++j) {
                const int4 tap = taps[a_tap];
#pragma unroll
                for (int i = 0; i < A_PIXELS; ++i) {
                    const bool ok = a_c < Cg && static_cast<unsigned>(a_ih0[i] + tap.y) < static_cast<unsigned>(H) &&
                                    static_cast<unsigned>(a_iw0[i] + tap.z) < static_cast<unsigned>(W);
                    cp_async<4>(a_dst + j * BM + NT * i, ok ? x + (a_base[i] + a_c_off + tap.x) : x, ok);
                }
                if (++a_tap == taps_per_c) { a_tap = 0; ++a_c; a_c_off += HW; }
            }
            if constexpr (KPT < BK) {
                a_tap += skip_tap;
                a_c += skip_c;
                a_c_off += skip_c * HW;
                if (a_tap >= taps_per_c) { a_tap -= taps_per_c; ++a_c; a_c_off += HW; }
            }
        }
#pragma unroll
        for (int i = 0; i < B_PASSES; ++i) {
            const int piece = tid + NT * i;
            if (B_PIECES % NT == 0 || piece < B_PIECES) {
                const int row = piece / (BN / 4), col = piece % (BN / 4) * 4;
                const int k = (kt0 + kt) * BK + row, n = n0 + col;
                const bool ok = k < Kgemm && n < Kgp;
                cp_async<16>(b_smem + stage * B_STAGE + row * BN + col, ok ? wt_g + static_cast<Index>(k) * Kgp + n : wt,
                             ok);
            }
        }
    };

    // --- Thread tile: pixels wm + tm 4 + {0..3} (and + WM / 2 where TM is 8); channels wn + tn 4 + {0..3}
    // (and + WN / 2 where TN is 8).
    const int warp_m = warp % WARPS_M, warp_n = warp / WARPS_M;
    const int tm = lane % LM, tn = lane / LM;
    const int a_frag_off = warp_m * WM + tm * 4, b_frag_off = warp_n * WN + tn * 4;
    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;

    auto compute_tile = [&](int stage) {
        const float* a_buf = a_smem + stage * A_STAGE + a_frag_off;
        const float* b_buf = b_smem + stage * B_STAGE + b_frag_off;
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            float a[TM], b[TN];
#pragma unroll
            for (int run = 0; run < TM / 4; ++run) {
                const float4 v = *reinterpret_cast<const float4*>(a_buf + k * BM + run * (WM / 2));
                a[4 * run] = v.x, a[4 * run + 1] = v.y, a[4 * run + 2] = v.z, a[4 * run + 3] = v.w;
            }
#pragma unroll
            for (int run = 0; run < TN / 4; ++run) {
                const float4 v = *reinterpret_cast<const float4*>(b_buf + k * BN + run * (WN / 2));
                b[4 * run] = v.x, b[4 * run + 1] = v.y, b[4 * run + 2] = v.z, b[4 * run + 3] = v.w;
            }
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
    };

    __syncthreads();  // the tap table is written
    run_k_pipeline<STAGES>(k_tiles, load_tile, compute_tile, [](int) {});

    // --- Epilogue, from registers: + bias, NCHW stores; 4 consecutive pixels as one float4 where the
    // planes are a multiple of 4 pixels (a run then never crosses an image) and y is 16-byte aligned.
    const bool vector_store = HoWo % 4 == 0 && (reinterpret_cast<unsigned long long>(y) & 15) == 0;
    float b[TN];
#pragma unroll
    for (int j = 0; j < TN; ++j) {
        const int n = n0 + b_frag_off + (j >> 2) * (WN / 2) + (j & 3);
        b[j] = has_bias && n < Kg ? bias[g * Kg + n] : 0.0f;
    }
    with_epilogue<float>(residual, [&](auto finish) {
#pragma unroll
        for (int half = 0; half < TM / 4; ++half) {
            const Index m = m0 + a_frag_off + half * (WM / 2);  // first of the run's 4 pixels
            if (m >= M) continue;
            Index y_pixel[4];  // image K HoWo + p of each pixel of the run, or -1 past M
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const Index image = (m + e) / HoWo;
                y_pixel[e] = m + e < M ? image * K * HoWo + (m + e - image * HoWo) : Index(-1);
            }
#pragma unroll
            for (int j = 0; j < TN; ++j) {
                const int n = n0 + b_frag_off + (j >> 2) * (WN / 2) + (j & 3);
                if (n >= Kg) continue;
                const Index channel_offset = static_cast<Index>(g * Kg + n) * HoWo;
                if (vector_store && y_pixel[3] >= 0) {
                    const Index o = y_pixel[0] + channel_offset;
                    *reinterpret_cast<float4*>(y + o) =
                        make_float4(finish(acc[half * 4][j] + b[j], o), finish(acc[half * 4 + 1][j] + b[j], o + 1),
                                    finish(acc[half * 4 + 2][j] + b[j], o + 2), finish(acc[half * 4 + 3][j] + b[j], o + 3));
                } else {
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        if (y_pixel[e] >= 0)
                            y[y_pixel[e] + channel_offset] = finish(acc[half * 4 + e][j] + b[j], y_pixel[e] + channel_offset);
                }
            }
        }
    });
}

}  // namespace cupyconv
