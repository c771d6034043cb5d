// Convolution of channels-last inputs of a few channels -- a network's first layer on RGB images
// (MobileNetV2's and EfficientNet's 3 -> 32 3x3 stride 2) -- on the tensor cores, 16-bit.
//
// Such a layer is memory-bound: its reduction (C kh kw: 27) is one or two k steps of mma.sync, its
// output ten times its input. The GEMM tiles gather each pixel's 27 taps as 2-byte elements from
// global memory (the input's pixels are 6 bytes: no 16-byte pieces), and that gather, not the bytes,
// bounds them (H200, MobileNetV2's stem at b32: 45-54 us for 35 MB). Here a block copies each output
// tile's input patch into shared memory once, rows of the image being contiguous in NHWC, and gathers
// the taps there. Where a row holds whole 16-byte vectors (W C a multiple of 8: 224 x 3), the copy is
// cp.async of the vectors covering the patch's columns, from the one at or below its first element
// (Tile::shift elements before it); a vector lies wholly inside its row or wholly outside (zero-filled:
// the padding). Elsewhere 2-byte loads, zeros outside the image.
//
// Persistent blocks of FEW_THREADS threads take output tiles of FEW_TILE x FEW_TILE pixels of one image and
// all K output channels in turn, copying the next tile's patch into a second buffer while this one's is
// multiplied. An m16 tile of mma.sync is one row of the tile (16 consecutive pixels); warp w takes rows w,
// w + 4, ... Each lane holds its B fragments (the weight, [K][RP] in shared memory in the KHWC tap
// order k = (r kw + s) C + c, zeros past R = C kh kw) in registers for the block, and the patch offsets
// of its A fragments' four taps per k step; taps past R are masked to zero (never read as another
// tap's value, which could be an infinity times a zero weight).
// Epilogue in registers (bias, residual, activation: epilogue.cuh); each warp stages its 16 x K tile in
// shared memory and stores it as 16-byte vectors: 16 consecutive pixels are 16 K contiguous elements.
//
// The planner (families/few_channel_nhwc.py) asks: 16-bit, NHWC, one group, R <= 48 (K_STEPS),
// K a multiple of 8 and at most 8 FEW_MAX_N_TILES, x and the output 16-byte aligned (the fronts copy
// operands that are not); the weight in KHWC or KCHW (weight_khwc); vector_rows where W C % 8 == 0.
#include "dtypes.cuh"
#include "epilogue.cuh"
#include "mma.cuh"

namespace cupyconv {

constexpr int FEW_TILE = 16;
constexpr int FEW_THREADS = 128;
constexpr int FEW_WARPS = FEW_THREADS / 32;
constexpr int FEW_MAX_N_TILES = 8;   // K <= 64

// K_STEPS: the reduction's k steps of 16, ceil(R / 16) (1-3: R <= 48); each lane's B fragments and tap offsets
// are registers of that many steps. One block an SM asked of ptxas: left free, it held the one- and three-step
// instances to 128 and 168 registers and spilled (the two-step one, the stem's, takes 160 either way).
template <typename T, typename Index, int K_STEPS>
__global__ void __launch_bounds__(FEW_THREADS, 1)
few_channel_nhwc(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias, T* __restrict__ y,
                 int has_bias, const T* __restrict__ residual, int has_residual, int activation,
                 int N, int C, int H, int W, int K, int Ho, int Wo, int kh, int kw,
                 int sh, int sw, int pt, int pl, int dh, int dw, int groups,
                 int tiles_w, int tiles_h, int weight_khwc, int vector_rows) {
    static_assert(sizeof(T) == 2 && K_STEPS >= 1 && K_STEPS <= 3, "16-bit operands; R <= 48");
    using Bits = unsigned short;
    constexpr int RP = K_STEPS * 16;
    const int R = C * kh * kw, n_tiles = K / 8;
    const int w_pitch = RP + 8;                    // halves: B's rows 4 banks apart (conflict-free)
    const int out_pitch = K + 8;                   // halves, a staged pixel
    const int PR = (FEW_TILE - 1) * sh + (kh - 1) * dh + 1, PC = (FEW_TILE - 1) * sw + (kw - 1) * dw + 1;
    const int row_elements = PC * C;
    const int patch_pitch = (row_elements + 7 + 7) / 8 * 8;  // elements a patch row, room for the shift
    const int patch_elements = PR * patch_pitch;

    extern __shared__ __align__(16) unsigned char smem[];
    Bits* ws = reinterpret_cast<Bits*>(smem);                  // [K][w_pitch]
    Bits* staging = ws + K * w_pitch;                          // [FEW_WARPS][16][out_pitch]
    Bits* patches = staging + FEW_WARPS * 16 * out_pitch;      // [2][PR][patch_pitch]: shift, then [PC][C]

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, quad = lane >> 2, tq = lane & 3;
    const int tiles = tiles_w * tiles_h, all_tiles = N * tiles;
    const Bits* x_bits = reinterpret_cast<const Bits*>(x);
    // Output tile ``tile``: its image, first output row and column, and the elements its patch rows start
    // before their first column's (the vector copies' shift).
    struct Tile { int image, oh0, ow0, shift; };
    auto tile_of = [&](int tile) {
        const int image = tile / tiles, t = tile - image * tiles;
        const int ow0 = t % tiles_w * FEW_TILE, first = (ow0 * sw - pl) * C;
        const int shift = vector_rows ? first - (first >= 0 ? first : first - 7) / 8 * 8 : 0;  // floor to a vector
        return Tile{image, t / tiles_w * FEW_TILE, ow0, shift};
    };
    // Tile ``tile``'s patch into ``patch``: cp.async of 16-byte vectors (committed by the caller), or 2-byte
    // loads; zeros outside the image.
    auto copy_patch = [&](int tile, Bits* patch) {
        const Tile at = tile_of(tile);
        const int ih0 = at.oh0 * sh - pt, iw0 = at.ow0 * sw - pl, row_length = W * C;
        const Index image_base = static_cast<Index>(at.image) * H * row_length;
        if (vector_rows) {
            const int first = iw0 * C - at.shift, vectors = (at.shift + row_elements + 7) / 8;
            for (int e = tid; e < PR * vectors; e += FEW_THREADS) {
                const int row = e / vectors, v = e - row * vectors, ih = ih0 + row, column = first + v * 8;
                const bool inside = ih >= 0 && ih < H && column >= 0 && column < row_length;
                cp_async<16>(patch + row * patch_pitch + v * 8,
                             inside ? x_bits + image_base + static_cast<Index>(ih) * row_length + column : x_bits,
                             inside);
            }
            return;
        }
        for (int rest = tid; rest < row_elements; rest += FEW_THREADS) {
            const int iw = iw0 + rest / C;
            const bool column_inside = iw >= 0 && iw < W;
            const Index from = image_base + static_cast<Index>(iw0) * C + rest;
#pragma unroll 8
            for (int row = 0; row < PR; ++row) {
                const int ih = ih0 + row;
                patch[row * patch_pitch + rest] =
                    column_inside && ih >= 0 && ih < H ? x_bits[from + static_cast<Index>(ih) * row_length] : Bits(0);
            }
        }
    };
    const int first_tile = blockIdx.x, step = gridDim.x;
    if (first_tile < all_tiles) copy_patch(first_tile, patches);
    cp_async_commit();

    // The weight in the KHWC tap order, zeros past R (while the first patch lands).
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
    __syncthreads();

    // This lane's B fragments (b0: k 2tq, 2tq + 1; b1: 8 on; n = quad of each 8-channel tile) ...
    unsigned b[K_STEPS][FEW_MAX_N_TILES][2];
    // ... and its A fragments' taps (a0/a1: k 2tq, 2tq + 1; a2/a3: 8 on) as patch offsets, masked past R.
    int tap_at[K_STEPS][4];
    unsigned tap_mask[K_STEPS][2];
#pragma unroll
    for (int ks = 0; ks < K_STEPS; ++ks) {
#pragma unroll
        for (int nt = 0; nt < FEW_MAX_N_TILES; ++nt) {
            const bool used = nt < n_tiles;
            const Bits* p = ws + (nt * 8 + quad) * w_pitch + ks * 16 + 2 * tq;
            b[ks][nt][0] = used ? *reinterpret_cast<const unsigned*>(p) : 0u;
            b[ks][nt][1] = used ? *reinterpret_cast<const unsigned*>(p + 8) : 0u;
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int k = ks * 16 + 2 * tq + (j & 1) + (j >> 1) * 8;
            const int kk = k < R ? k : 0, tap = kk / C, c = kk - tap * C, r = tap / kw, s = tap - r * kw;
            tap_at[ks][j] = r * dh * patch_pitch + s * dw * C + c;
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
    with_epilogue<T>(residual, [&](auto finish) {
#pragma unroll 1
        for (int tile = first_tile, i = 0; tile < all_tiles; tile += step, ++i) {
            // The next tile's patch into the other buffer (free: the last tile's rows were read before the
            // barrier ending it) while this one's is multiplied.
            if (tile + step < all_tiles) copy_patch(tile + step, patches + ((i + 1) & 1) * patch_elements);
            cp_async_commit();
            cp_async_wait<1>();  // this tile's vectors landed (this thread's) ...
            __syncthreads();     // ... everyone's, and the 2-byte loads' stores
            const Bits* patch = patches + (i & 1) * patch_elements;
            const Tile at = tile_of(tile);
            const int image = at.image, oh0 = at.oh0, ow0 = at.ow0;
#pragma unroll 1
            for (int row = warp; row < FEW_TILE; row += FEW_WARPS) {
                const int oh = oh0 + row;
                if (oh >= Ho) break;  // warp-uniform
                const int base0 = row * sh * patch_pitch + at.shift + quad * sw * C, base1 = base0 + 8 * sw * C;
                float acc[FEW_MAX_N_TILES][4];
#pragma unroll
                for (int nt = 0; nt < FEW_MAX_N_TILES; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
#pragma unroll
                for (int ks = 0; ks < K_STEPS; ++ks) {
                    // Two taps of one pixel row (base), masked past R.
                    auto pair = [&](int base, int j) {
                        return (patch[base + tap_at[ks][j]] | unsigned(patch[base + tap_at[ks][j + 1]]) << 16) &
                               tap_mask[ks][j >> 1];
                    };
                    const unsigned a[4] = {pair(base0, 0), pair(base1, 0), pair(base0, 2), pair(base1, 2)};
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
                        const Index element = (pixel0 + p) * K + col;
                        T v0{}, v1{};
                        if (ow0 + p < Wo) {
                            v0 = finish(acc[nt][2 * h] + bias_v[nt][0], element);
                            v1 = finish(acc[nt][2 * h + 1] + bias_v[nt][1], element + 1);
                        }
                        *reinterpret_cast<unsigned*>(my_staging + p * out_pitch + col) =
                            v0.bits | unsigned(v1.bits) << 16;
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
            __syncthreads();  // this tile's patch read: the next iteration's copies may overwrite it
        }
    });
    cp_async_wait<0>();  // no copy outlives the block
}

}  // namespace cupyconv
