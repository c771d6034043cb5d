// Implicit-GEMM 2-D convolution on the tensor cores, NCHW (or NHWC: below).
//
// Per group g (gridDim.z), the convolution is the GEMM  Y[m][n] = sum_k A[m][k] B[k][n]  with
//   m = (image, oh, ow)        output pixels,                  M = N Ho Wo
//   n = output channel of g,                                   Kg = K / groups
//   k = (c, r, s)              input channel of g, kernel tap, Kgemm = C / groups * kh * kw
// A[m][k] = x[image][g Cg + c][oh sh - pt + r dh][ow sw - pl + s dw] (zero outside the input) is never
// formed in global memory: each thread block gathers its BM x BK slice of A straight into shared
// memory, next to the BK x BN slice of B = weight (whose rows are already k-contiguous).
//
// Levels, as in CUTLASS:
//   thread block  BM pixels x BN channels, a pipeline of STAGES shared-memory buffers over k;
//   warp          (BM / WARPS_M) x (BN / WARPS_N), a grid of 16 x 8 instruction tiles;
//   instruction   mma.sync m16n8k8 (TF32, from float) or m16n8k16 (f16, bf16), float32 accumulators.
//
// Loading. Lane l of warp v gathers pixels m = l + 32 i (consecutive lanes read consecutive output
// columns: coalesced) for tile rows k = v + NWARPS j. The (c, r, s) of each of those rows is stepped
// from tile to tile by additions instead of being recomputed with divisions.
//   float:        4-byte cp.async with zero-fill straight into the stage STAGES - 1 tiles ahead.
//   16-bit types: cp.async moves 4, 8 or 16 bytes, and two neighbouring A elements are contiguous in
//                 global memory only for some strides, paddings and parities, so these go through
//                 registers: loaded for tile t + STAGES - 1 before the MMAs of tile t, stored after.
//
// Shared layouts (padding chosen so that fragment reads are free of bank conflicts):
//   A: [BK][BM + 8], pixels contiguous (the gather writes rows; f16/bf16 fragments via ldmatrix.trans)
//   B: [BN][BK + pad], k contiguous (a B fragment column is a contiguous pair for 16-bit types)
// Epilogue: accumulators + bias -> storage type -> shared memory (one warp column of channels at a
// time, reusing the pipeline buffers) -> global, 32 lanes on 32 consecutive pixels of one channel.
//
// NHWC (a channels-last problem read and written in place, no transposes around the kernel): element
// (c, r, s) of a pixel's row of A is gathered from the NHWC input (lanes still on consecutive output
// pixels, C elements apart), and the epilogue stages pixel-major and stores 32 lanes on consecutive
// channels of one pixel. The k order, and so every sum, is the NCHW instance's.
#include "dtypes.cuh"
#include "epilogue.cuh"
#include "gather_pixel.cuh"
#include "mma.cuh"

namespace cupyconv {

// Two blocks per SM where the accumulators (BM BN / threads per thread) leave room for it; the
// 64-accumulator tiles would spill under that register cap, so they get one, as do the 64-bit index
// instances (their addresses and the fused epilogue's copies of the stores spilled under it on sm_80).
template <typename T, typename Index, int BM, int BN, int BK, int WARPS_M, int WARPS_N, int STAGES,
          bool NHWC = false>
__global__ void __launch_bounds__(WARPS_M * WARPS_N * 32,
                                  (BM * BN) / (WARPS_M * WARPS_N * 32) <= 32 && sizeof(Index) == 4 ? 2 : 1)
implicit_gemm_conv2d(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                     T* __restrict__ y, int has_bias, const T* __restrict__ residual, int has_residual, int activation,
                     int N, int C, int H, int W, int K, int Ho, int Wo, int kh, int kw,
                     int sh, int sw, int pt, int pl, int dh, int dw, int groups) {
    constexpr bool kAsync = sizeof(T) == 4;                  // float: cp.async; 16-bit: via registers
    constexpr int NWARPS = WARPS_M * WARPS_N;
    constexpr int NT = NWARPS * 32;
    constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;      // warp tile
    constexpr int MT = WM / 16, NTILES = WN / 8;             // instruction tiles per warp
    constexpr int INST_K = mma_op<T>::k;
    constexpr int A_STRIDE = BM + 8;
    constexpr int B_STRIDE = BK + (sizeof(T) == 4 ? 4 : 8);
    constexpr int A_STAGE = BK * A_STRIDE, B_STAGE = BN * B_STRIDE;
    constexpr int A_PIXELS = BM / 32;                        // pixels per thread in the gather
    constexpr int A_ROWS = BK / NWARPS;                      // k rows per thread per tile
    constexpr int B_ROWS_PER_PASS = NT / BK;
    constexpr int B_PASSES = BN / B_ROWS_PER_PASS;
    constexpr int C_STRIDE = BM + 8;                         // epilogue staging [WN][C_STRIDE]
    constexpr int C_NHWC_STRIDE = WN + 4;                    // ... or, NHWC, [BM][C_NHWC_STRIDE]
    static_assert(sizeof(T) == 4 || sizeof(T) == 2, "float, half_t or bfloat16_t");
    static_assert(BM % 32 == 0 && BM % WARPS_M == 0 && WM % 16 == 0, "warp tile rows: multiples of 16");
    static_assert(BN % WARPS_N == 0 && WN % 8 == 0, "warp tile columns: multiples of 8");
    static_assert(BK % NWARPS == 0 && BK % INST_K == 0 && NT % BK == 0 && BN % B_ROWS_PER_PASS == 0,
                  "BK must split over the warps, the instruction and the B loader");
    static_assert(STAGES >= 2, "at least double buffering");
    static_assert(WN * C_STRIDE * 4 <= STAGES * (A_STAGE + B_STAGE) * static_cast<int>(sizeof(T)) &&
                  BM * C_NHWC_STRIDE * 4 <= STAGES * (A_STAGE + B_STAGE) * static_cast<int>(sizeof(T)),
                  "epilogue staging (float) fits in the pipeline buffers");

    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* a_smem = reinterpret_cast<T*>(smem_raw);              // [STAGES][BK][A_STRIDE]
    T* b_smem = a_smem + STAGES * A_STAGE;                   // [STAGES][BN][B_STRIDE]

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = blockIdx.z;
    const int Cg = C / groups, Kg = K / groups;
    const int khw = kh * kw;
    const int Kgemm = Cg * khw;
    const Index HW = static_cast<Index>(H) * W;
    const Index HoWo = static_cast<Index>(Ho) * Wo;
    const Index M = static_cast<Index>(N) * HoWo;
    const Index m0 = static_cast<Index>(blockIdx.x) * BM;
    const int n0 = blockIdx.y * BN;
    const int k_tiles = (Kgemm + BK - 1) / BK;

    // --- A gather state: per pixel, the offset of tap (c, r, s) = (0, 0, 0) and its top-left corner.
    Index a_base[A_PIXELS];
    int a_ih0[A_PIXELS], a_iw0[A_PIXELS];
#pragma unroll
    for (int i = 0; i < A_PIXELS; ++i) {
        constexpr GatherLayout LAYOUT = NHWC ? GatherLayout::nhwc : GatherLayout::nchw;
        const GatherPixel<Index> px = gather_pixel<LAYOUT>(m0 + lane + 32 * i, M, HoWo, Wo, C, H, W, sh, sw, pt, pl,
                                                           g, Cg);
        a_base[i] = px.base;
        a_ih0[i] = px.ih0;
        a_iw0[i] = px.iw0;
    }
    // Per gathered k row: its (c, r, s), advanced by BK = (dc, dr, ds) in mixed radix per tile.
    int a_c[A_ROWS], a_r[A_ROWS], a_s[A_ROWS];
#pragma unroll
    for (int j = 0; j < A_ROWS; ++j) {
        const int k = warp + NWARPS * j;
        a_c[j] = k / khw;
        a_r[j] = (k - a_c[j] * khw) / kw;
        a_s[j] = k - a_c[j] * khw - a_r[j] * kw;
    }
    const int step_c = BK / khw, step_r = (BK - step_c * khw) / kw, step_s = BK - step_c * khw - step_r * kw;

    // --- B loader: thread column b_k of rows b_n + B_ROWS_PER_PASS i.
    const int b_k = tid % BK, b_n = tid / BK;
    const T* b_src = w + (static_cast<Index>(g) * Kg + n0 + b_n) * Kgemm + b_k;

    // Register staging for the 16-bit path (unused, and removed by the compiler, for float).
    unsigned short a_stage_regs[kAsync ? 1 : A_ROWS][kAsync ? 1 : A_PIXELS];
    unsigned short b_stage_regs[kAsync ? 1 : B_PASSES];

    // Issue the loads of k tile `kt` into shared buffer `stage` (float) or into registers (16-bit).
    auto load_tile = [&](int kt, int stage) {
        T* a_dst = a_smem + stage * A_STAGE + lane;
#pragma unroll
        for (int j = 0; j < A_ROWS; ++j) {
            const bool k_ok = a_c[j] < Cg;
            const int rd = a_r[j] * dh, sd = a_s[j] * dw;
            Index k_off;
            if constexpr (NHWC)
                k_off = (static_cast<Index>(rd) * W + sd) * C + a_c[j];
            else
                k_off = static_cast<Index>(a_c[j]) * HW + static_cast<Index>(rd) * W + sd;
#pragma unroll
            for (int i = 0; i < A_PIXELS; ++i) {
                const int ih = a_ih0[i] + rd, iw = a_iw0[i] + sd;
                const bool ok = k_ok && static_cast<unsigned>(ih) < static_cast<unsigned>(H) &&
                                static_cast<unsigned>(iw) < static_cast<unsigned>(W);
                const T* src = x + (a_base[i] + k_off);
                if constexpr (kAsync) {
                    cp_async<4>(a_dst + (warp + NWARPS * j) * A_STRIDE + 32 * i, ok ? src : x, ok);
                } else {
                    a_stage_regs[kAsync ? 0 : j][kAsync ? 0 : i] =
                        ok ? reinterpret_cast<const unsigned short*>(src)[0] : static_cast<unsigned short>(0);
                }
            }
            // Next tile's row j: k + BK.
            a_s[j] += step_s; a_r[j] += step_r; a_c[j] += step_c;
            if (a_s[j] >= kw) { a_s[j] -= kw; ++a_r[j]; }
            if (a_r[j] >= kh) { a_r[j] -= kh; ++a_c[j]; }
        }
        const int k = kt * BK + b_k;
        T* b_dst = b_smem + stage * B_STAGE + b_n * B_STRIDE + b_k;
#pragma unroll
        for (int i = 0; i < B_PASSES; ++i) {
            const bool ok = k < Kgemm && n0 + b_n + B_ROWS_PER_PASS * i < Kg;
            const T* src = b_src + static_cast<Index>(B_ROWS_PER_PASS * i) * Kgemm + kt * BK;
            if constexpr (kAsync) {
                cp_async<4>(b_dst + B_ROWS_PER_PASS * i * B_STRIDE, ok ? src : w, ok);
            } else {
                b_stage_regs[kAsync ? 0 : i] =
                    ok ? reinterpret_cast<const unsigned short*>(src)[0] : static_cast<unsigned short>(0);
            }
        }
    };

    // 16-bit path: write the registers loaded by load_tile into shared buffer `stage`.
    auto store_tile = [&](int stage) {
        if constexpr (!kAsync) {
            unsigned short* a_dst = reinterpret_cast<unsigned short*>(a_smem + stage * A_STAGE) + lane;
#pragma unroll
            for (int j = 0; j < A_ROWS; ++j)
#pragma unroll
                for (int i = 0; i < A_PIXELS; ++i)
                    a_dst[(warp + NWARPS * j) * A_STRIDE + 32 * i] = a_stage_regs[j][i];
            unsigned short* b_dst = reinterpret_cast<unsigned short*>(b_smem + stage * B_STAGE) + b_n * B_STRIDE + b_k;
#pragma unroll
            for (int i = 0; i < B_PASSES; ++i) b_dst[B_ROWS_PER_PASS * i * B_STRIDE] = b_stage_regs[i];
        }
    };

    // --- Warp tile and accumulators.
    const int warp_m = warp % WARPS_M, warp_n = warp / WARPS_M;
    const int wm = warp_m * WM, wn = warp_n * WN;
    const int quad = lane >> 2, tq = lane & 3;  // PTX's groupID and threadID_in_group
    float acc[MT][NTILES][4];
    zero_accumulators(acc);

    auto compute_tile = [&](int stage) {
        const T* a_buf = a_smem + stage * A_STAGE;
        const T* b_buf = b_smem + stage * B_STAGE;
#pragma unroll
        for (int kk = 0; kk < BK; kk += INST_K) {
            unsigned a_frag[MT][4], b_frag[NTILES][2];
            if constexpr (sizeof(T) == 4) {
                const float* af = reinterpret_cast<const float*>(a_buf);
                const float* bf = reinterpret_cast<const float*>(b_buf);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    const float* p = af + (kk + tq) * A_STRIDE + wm + mt * 16 + quad;
                    a_frag[mt][0] = to_tf32(p[0]);
                    a_frag[mt][1] = to_tf32(p[8]);
                    a_frag[mt][2] = to_tf32(p[4 * A_STRIDE]);
                    a_frag[mt][3] = to_tf32(p[4 * A_STRIDE + 8]);
                }
#pragma unroll
                for (int nt = 0; nt < NTILES; ++nt) {
                    const float* p = bf + (wn + nt * 8 + quad) * B_STRIDE + kk + tq;
                    b_frag[nt][0] = to_tf32(p[0]);
                    b_frag[nt][1] = to_tf32(p[4]);
                }
            } else {
                // Matrix q = lane / 8 of the x4 load: pixels + 8 (q & 1), k + 8 (q >> 1) -> a0..a3.
                const int row = kk + ((lane >> 4) << 3) + (lane & 7);
                const int col = wm + ((lane >> 3) & 1) * 8;
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) ldmatrix_x4<true>(a_frag[mt], a_buf + row * A_STRIDE + col + mt * 16);
#pragma unroll
                for (int nt = 0; nt < NTILES; ++nt) {
                    const unsigned* p = reinterpret_cast<const unsigned*>(b_buf + (wn + nt * 8 + quad) * B_STRIDE + kk + 2 * tq);
                    b_frag[nt][0] = p[0];
                    b_frag[nt][1] = p[4];
                }
            }
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < NTILES; ++nt) mma_op<T>::run(acc[mt][nt], a_frag[mt], b_frag[nt]);
        }
    };

    // --- Main loop (mma.cuh); then the pipeline buffers become the epilogue's staging area.
    run_k_pipeline<STAGES>(k_tiles, load_tile, compute_tile, store_tile);

    // --- Epilogue, one warp column (WN channels) at a time: acc + bias staged in float, then the fused
    // epilogue (epilogue.cuh) and the one rounding as each element is stored.
    float* c_smem = reinterpret_cast<float*>(smem_raw);  // [WN][C_STRIDE], or [BM][C_NHWC_STRIDE]
    Index y_pixel[A_PIXELS];  // image * K * HoWo + p for the pixels this lane stores
#pragma unroll
    for (int i = 0; i < A_PIXELS; ++i) {
        const Index m = m0 + lane + 32 * i;
        const Index image = m / HoWo;
        y_pixel[i] = image * K * HoWo + (m - image * HoWo);
    }
#pragma unroll 1
    for (int column = 0; column < WARPS_N; ++column) {
        const int n_col = n0 + column * WN;  // first channel (within the group) of this column
        if (warp_n == column) {
#pragma unroll
            for (int nt = 0; nt < NTILES; ++nt) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int n = nt * 8 + 2 * tq + e;
                    const float b = has_bias && n_col + n < Kg ? to_acc<float>(bias[g * Kg + n_col + n]) : 0.0f;
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
                        const int m = wm + mt * 16 + quad;
                        if constexpr (NHWC) {  // two spelled-out indexings: NCHW's address arithmetic as it was
                            c_smem[m * C_NHWC_STRIDE + n] = acc[mt][nt][e] + b;
                            c_smem[(m + 8) * C_NHWC_STRIDE + n] = acc[mt][nt][2 + e] + b;
                        } else {
                            c_smem[n * C_STRIDE + m] = acc[mt][nt][e] + b;
                            c_smem[n * C_STRIDE + m + 8] = acc[mt][nt][2 + e] + b;
                        }
                    }
                }
            }
        }
        __syncthreads();
        with_epilogue<T>(residual, [&](auto finish) {
            if constexpr (NHWC) {  // y[m][g Kg + n]: lanes on consecutive channels of pixel m
#pragma unroll 1
                for (int p = warp; p < BM && m0 + p < M; p += NWARPS) {
                    const Index pixel_offset = (m0 + p) * K + g * Kg + n_col;
                    for (int n = lane; n < WN && n_col + n < Kg; n += 32) {
                        const Index o = pixel_offset + n;
                        y[o] = finish(c_smem[p * C_NHWC_STRIDE + n], o);
                    }
                }
            } else {
#pragma unroll 1
                for (int n = warp; n < WN; n += NWARPS) {
                    if (n_col + n >= Kg) break;
                    const Index channel_offset = static_cast<Index>(g * Kg + n_col + n) * HoWo;
#pragma unroll
                    for (int i = 0; i < A_PIXELS; ++i) {
                        const Index o = y_pixel[i] + channel_offset;
                        if (m0 + lane + 32 * i < M) y[o] = finish(c_smem[n * C_STRIDE + lane + 32 * i], o);
                    }
                }
            }
        });
        __syncthreads();
    }
}

}  // namespace cupyconv
