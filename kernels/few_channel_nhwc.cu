// Convolution of channels-last inputs of a few channels -- a network's first layer on RGB images
// (MobileNetV2's and EfficientNet's 3 -> 32 3x3 stride 2) -- on the tensor cores, 16-bit.
//
// Such a layer is memory-bound: its reduction (C kh kw: 27) is one or two k steps of mma.sync, its
// output ten times its input. The GEMM tiles gather each pixel's 27 taps as 2-byte elements from
// global memory (the input's pixels are 6 bytes: no 16-byte pieces), and that gather, not the bytes,
// bounds them (H200, b32: 45-53 us against ~9 us of bytes). Here a block copies its output tile's
// input patch into shared memory once, rows of the image being contiguous in NHWC (coalesced 2-byte
// loads, zeros outside the image: the padding), and gathers the taps there.
//
// Block: FEW_THREADS threads, an output tile of FEW_TILE x FEW_TILE pixels of one image and all K output
// channels. An m16 tile of mma.sync is one row of the tile (16 consecutive pixels); warp w takes rows w,
// w + 4, ... Each lane holds its B fragments (the weight, [K][RP] in shared memory in the KHWC tap
// order k = (r kw + s) C + c, zeros past R = C kh kw) in registers for the block, and the patch offsets
// of its A fragments' four taps per k step; taps past R are masked to zero (never read as another
// tap's value, which could be an infinity times a zero weight).
// Epilogue in registers (bias, residual, activation: epilogue.cuh); each warp stages its 16 x K tile in
// shared memory and stores it as 16-byte vectors: 16 consecutive pixels are 16 K contiguous elements.
//
// The planner (families/few_channel_nhwc.py) asks: 16-bit, NHWC, one group, R <= 16 FEW_MAX_K_STEPS,
// K a multiple of 8 and at most 8 FEW_MAX_N_TILES, the output 16-byte aligned (the fronts copy one that
// is not); the weight in KHWC or KCHW (weight_khwc).
#include "dtypes.cuh"
#include "epilogue.cuh"
#include "mma.cuh"

namespace cupyconv {

constexpr int FEW_TILE = 16;
constexpr int FEW_THREADS = 128;
constexpr int FEW_WARPS = FEW_THREADS / 32;
constexpr int FEW_MAX_K_STEPS = 3;   // R <= 48
constexpr int FEW_MAX_N_TILES = 8;   // K <= 64

template <typename T, typename Index>
__global__ void __launch_bounds__(FEW_THREADS)
few_channel_nhwc(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias, T* __restrict__ y,
                 int has_bias, const T* __restrict__ residual, int has_residual, int activation,
                 int N, int C, int H, int W, int K, int Ho, int Wo, int kh, int kw,
                 int sh, int sw, int pt, int pl, int dh, int dw, int groups,
                 int tiles_w, int tiles_h, int weight_khwc) {
    static_assert(sizeof(T) == 2, "16-bit operands");
    using Bits = unsigned short;
    const int R = C * kh * kw, RP = (R + 15) / 16 * 16, k_steps = RP / 16, n_tiles = K / 8;
    const int w_pitch = RP + 8;                    // halves: B's rows 4 banks apart (conflict-free)
    const int out_pitch = K + 8;                   // halves, a staged pixel
    const int PR = (FEW_TILE - 1) * sh + (kh - 1) * dh + 1, PC = (FEW_TILE - 1) * sw + (kw - 1) * dw + 1;
    const int row_elements = PC * C;

    extern __shared__ __align__(16) unsigned char smem[];
    Bits* ws = reinterpret_cast<Bits*>(smem);                  // [K][w_pitch]
    Bits* staging = ws + K * w_pitch;                          // [FEW_WARPS][16][out_pitch]
    Bits* patch = staging + FEW_WARPS * 16 * out_pitch;        // [PR][PC][C]

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, quad = lane >> 2, tq = lane & 3;
    const int tiles = tiles_w * tiles_h;
    const int image = blockIdx.x / tiles, t = blockIdx.x - image * tiles;
    const int oh0 = t / tiles_w * FEW_TILE, ow0 = t % tiles_w * FEW_TILE;
    const int ih0 = oh0 * sh - pt, iw0 = ow0 * sw - pl;

    // The weight in the KHWC tap order, zeros past R.
    const Bits* w_bits = reinterpret_cast<const Bits*>(w);
    for (int e = tid; e < K * RP; e += FEW_THREADS) {
        const int n = e / RP, k = e - n * RP;
        Bits v = 0;
        if (k < R) {
            const int tap = k / C, c = k - tap * C;
            v = w_bits[static_cast<Index>(n) * R + (weight_khwc ? k : c * kh * kw + tap)];
        }
        ws[n * w_pitch + k] = v;
    }
    // The patch: row by row of the image (contiguous in NHWC), zeros outside it.
    const Bits* x_bits = reinterpret_cast<const Bits*>(x);
    const Index image_base = static_cast<Index>(image) * H * W * C;
    for (int rest = tid; rest < row_elements; rest += FEW_THREADS) {
        const int iw = iw0 + rest / C;
        const bool column_inside = iw >= 0 && iw < W;
        const Index at = image_base + static_cast<Index>(iw0) * C + rest;
#pragma unroll 4
        for (int row = 0; row < PR; ++row) {
            const int ih = ih0 + row;
            patch[row * row_elements + rest] =
                column_inside && ih >= 0 && ih < H ? x_bits[at + static_cast<Index>(ih) * W * C] : Bits(0);
        }
    }
    __syncthreads();

    // This lane's B fragments (b0: k 2tq, 2tq + 1; b1: 8 on; n = quad of each 8-channel tile) ...
    unsigned b[FEW_MAX_K_STEPS][FEW_MAX_N_TILES][2];
    // ... and its A fragments' taps (a0/a1: k 2tq, 2tq + 1; a2/a3: 8 on) as patch offsets, masked past R.
    int tap_at[FEW_MAX_K_STEPS][4];
    unsigned tap_mask[FEW_MAX_K_STEPS][2];
#pragma unroll
    for (int ks = 0; ks < FEW_MAX_K_STEPS; ++ks) {
#pragma unroll
        for (int nt = 0; nt < FEW_MAX_N_TILES; ++nt) {
            const bool used = ks < k_steps && nt < n_tiles;
            const Bits* p = ws + (nt * 8 + quad) * w_pitch + ks * 16 + 2 * tq;
            b[ks][nt][0] = used ? *reinterpret_cast<const unsigned*>(p) : 0u;
            b[ks][nt][1] = used ? *reinterpret_cast<const unsigned*>(p + 8) : 0u;
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int k = ks * 16 + 2 * tq + (j & 1) + (j >> 1) * 8;
            const int kk = k < R ? k : 0, tap = kk / C, c = kk - tap * C, r = tap / kw, s = tap - r * kw;
            tap_at[ks][j] = (r * dh * PC + s * dw) * C + c;
        }
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int k = ks * 16 + 2 * tq + half * 8;
            tap_mask[ks][half] = (k < R ? 0x0000ffffu : 0u) | (k + 1 < R ? 0xffff0000u : 0u);
        }
    }
    float bias_v[FEW_MAX_N_TILES][2];
#pragma unroll
    for (int nt = 0; nt < FEW_MAX_N_TILES; ++nt)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int n = nt * 8 + 2 * tq + j;
            bias_v[nt][j] = has_bias && n < K ? to_acc<float>(bias[n]) : 0.0f;
        }

    Bits* my_staging = staging + warp * 16 * out_pitch;
    const int vectors_per_pixel = K / 8;
    with_epilogue<T>(residual, has_residual, activation, [&](auto finish) {
#pragma unroll 1
        for (int row = warp; row < FEW_TILE; row += FEW_WARPS) {
            const int oh = oh0 + row;
            if (oh >= Ho) break;  // warp-uniform
            const int base0 = (row * sh * PC + quad * sw) * C, base1 = base0 + 8 * sw * C;
            float acc[FEW_MAX_N_TILES][4];
#pragma unroll
            for (int nt = 0; nt < FEW_MAX_N_TILES; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < FEW_MAX_K_STEPS; ++ks) {
                if (ks >= k_steps) break;
                unsigned a[4];
                a[0] = (patch[base0 + tap_at[ks][0]] | unsigned(patch[base0 + tap_at[ks][1]]) << 16) & tap_mask[ks][0];
                a[1] = (patch[base1 + tap_at[ks][0]] | unsigned(patch[base1 + tap_at[ks][1]]) << 16) & tap_mask[ks][0];
                a[2] = (patch[base0 + tap_at[ks][2]] | unsigned(patch[base0 + tap_at[ks][3]]) << 16) & tap_mask[ks][1];
                a[3] = (patch[base1 + tap_at[ks][2]] | unsigned(patch[base1 + tap_at[ks][3]]) << 16) & tap_mask[ks][1];
#pragma unroll
                for (int nt = 0; nt < FEW_MAX_N_TILES; ++nt)
                    if (nt < n_tiles) mma_op<T>::run(acc[nt], a, b[ks][nt]);
            }
            const Index pixel0 = (static_cast<Index>(image) * Ho + oh) * Wo + ow0;
#pragma unroll
            for (int nt = 0; nt < FEW_MAX_N_TILES; ++nt) {
                if (nt >= n_tiles) break;
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int p = quad + 8 * h, col = nt * 8 + 2 * tq;
                    const Index at = (pixel0 + p) * K + col;
                    const bool inside = ow0 + p < Wo;
                    T v0{}, v1{};
                    if (inside) {
                        v0 = finish(acc[nt][2 * h] + bias_v[nt][0], at);
                        v1 = finish(acc[nt][2 * h + 1] + bias_v[nt][1], at + 1);
                    }
                    *reinterpret_cast<unsigned*>(my_staging + p * out_pitch + col) = v0.bits | unsigned(v1.bits) << 16;
                }
            }
            __syncwarp();
            for (int v = lane; v < 16 * vectors_per_pixel; v += 32) {
                const int p = v / vectors_per_pixel, part = v - p * vectors_per_pixel;
                if (ow0 + p < Wo)
                    *reinterpret_cast<uint4*>(y + ((pixel0 + p) * K + part * 8)) =
                        *reinterpret_cast<const uint4*>(my_staging + p * out_pitch + part * 8);
            }
            __syncwarp();
        }
    });
}

}  // namespace cupyconv
