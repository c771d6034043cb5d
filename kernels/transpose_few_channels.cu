// A transposed convolution of few output channels (at most 4, ungrouped) computed directly on the FMA
// units: the input gradient of a network's RGB stem, a generator's RGB layer
// (cupyconv/transpose_few_channels.py). The GEMM route widens such an output to 8 or more channels and
// copies each stride phase's window and output; here every stride phase runs in one launch on y in
// place. For y (N, K, Hy, Wy), the weight w (K, C, kh, kw) of the convolution it transposes, stride
// (sh, sw) and dilation (dh, dw) dividing it,
//
//   out[n, c, a + sh i, b + sw j] = bias[c] + sum over k, u < R_a, v < S_b of
//                                   y[n, k, i + o_a + u, j + o_b + v] w[k, c, r_a - u t_r, s_b - v t_s]
//
// where phase (a, b) has R_a x S_b taps, its first (largest) taps r_a and s_b, t = stride / dilation
// apart, and reads y from offsets (o_a, o_b) on (FewPhases; y outside its plane reads as zero).
//
// A block computes a TH x TW tile of one phase of one image: 64 threads as BX x (64 / BX), each 4 x 4
// output pixels x CP channels in registers. K goes in chunks of KC channels: the chunk's y tile (TH +
// TAPS - 1 rows, its taps' reach) and its phase's taps (zeros past R, S and C) are copied into shared
// memory as float, one plane of the tile per channel; then a thread, for each tap row u, holds that row's
// weights (a float4 of channels per tap) and reads, for each of its pixel rows, the 4 + TAPS - 1 values
// of y its 4 pixels' taps reach as float4s (lanes 16 bytes apart: no bank conflicts), for 4 x S x CP
// FMAs per pair. Accumulation in float32 for every storage type. float32 chunks go through a ring of
// two stages by cp.async, the next chunk's copies in flight while this one multiplies; 16-bit ones are
// loaded, widened and stored a chunk at a time.
//
// Grid: x = column tiles x phases (phases fastest, so the blocks of a tile's phases, which read the
// same y, run together), y = row tiles, z = images (looped past gridDim.z). 32-bit offsets: the
// planner takes arrays of fewer than 2^31 elements.
#include "dtypes.cuh"
#include "mma.cuh"

namespace cupyconv {

constexpr int FEW_THREADS = 64;
constexpr int FEW_MAX_AXIS_PHASES = 8;

// Channels of y a chunk and chunks in flight: float32 in a ring of two stages of 4, copied by cp.async while
// the other multiplies; 16-bit (no 2-byte cp.async) one stage of 8, whose NHWC pixels are 16-byte loads.
template <typename T> constexpr int few_chunk() { return sizeof(T) == 4 ? 4 : 8; }
template <typename T> constexpr int few_stages() { return sizeof(T) == 4 ? 2 : 1; }

// One axis's stride phases: phase p starts at output start[p], has size[p] outputs, taps[p] taps from
// first[p] down, and reads y from offset[p] (see the sum above).
struct FewAxis {
    int count;
    int start[FEW_MAX_AXIS_PHASES], size[FEW_MAX_AXIS_PHASES], taps[FEW_MAX_AXIS_PHASES],
        first[FEW_MAX_AXIS_PHASES], offset[FEW_MAX_AXIS_PHASES];
};
struct FewPhases {
    FewAxis rows, cols;
};

// Values of y the 4 pixels of a thread's row reach through TAPS taps, rounded up to whole float4s.
template <int TAPS> constexpr int few_segment() { return (4 + TAPS - 1 + 3) / 4 * 4; }

// SEG values of a row of the tile, as float4s (16-byte aligned: pitch and the thread's column are multiples of 4).
template <int SEG> __device__ __forceinline__ void few_row(float (&seg)[SEG], const float* at) {
#pragma unroll
    for (int s = 0; s < SEG; s += 4) {
        const float4 four = *reinterpret_cast<const float4*>(at + s);
        seg[s] = four.x;
        seg[s + 1] = four.y;
        seg[s + 2] = four.z;
        seg[s + 3] = four.w;
    }
}

// A pixel row's 4 x CP sums through a tap row's S taps: acc[j][c] += seg[j + v] tap[v].c.
template <int CP, int TAPS, int SEG>
__device__ __forceinline__ void few_row_taps(float (&acc)[4][CP], const float (&seg)[SEG], const float4 (&tap)[TAPS],
                                             int S) {
#pragma unroll
    for (int v = 0; v < TAPS; ++v) {
        if (v >= S) break;
        const float wv[4] = {tap[v].x, tap[v].y, tap[v].z, tap[v].w};
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int c = 0; c < CP; ++c) acc[j][c] = fmaf(seg[j + v], wv[c], acc[j][c]);
    }
}

// A thread's sums for one channel of y: acc[i][j][c] += y[i + u][j + v] w[u][v][c] over the phase's R x S
// taps, y its rows of the tile (yk, `pitch` apart), w the taps (wk, float4s of channels, TAPS a row).

// Every tap in registers (TAPS x TAPS float4s), each of the 4 + R - 1 rows of y read once and used by every
// (pixel row, tap row) pair it meets: 2 float4 reads a row where reading a row a pair took 2 x R.
template <int CP, int TAPS, int SEG>
__device__ __forceinline__ void few_taps_by_rows_of_y(float (&acc)[4][4][CP], const float* yk, const float4* wk,
                                                      int pitch, int R, int S) {
    float4 tap[TAPS][TAPS];
#pragma unroll
    for (int u = 0; u < TAPS; ++u)
#pragma unroll
        for (int v = 0; v < TAPS; ++v) tap[u][v] = wk[u * TAPS + v];
#pragma unroll
    for (int row = 0; row < 4 + TAPS - 1; ++row) {
        if (row >= 4 + R - 1) break;
        float seg[SEG];
        few_row<SEG>(seg, yk + row * pitch);
#pragma unroll
        for (int u = 0; u < TAPS; ++u) {
            const int i = row - u;
            if (i < 0 || i >= 4 || u >= R) continue;
            few_row_taps<CP, TAPS, SEG>(acc[i], seg, tap[u], S);
        }
    }
}

// One tap row in registers at a time (TAPS float4s), y's rows read for each (pixel row, tap row) pair: the
// registers of TAPS 8's 64 taps would not fit beside the sums.
template <int CP, int TAPS, int SEG>
__device__ __forceinline__ void few_taps_by_rows_of_taps(float (&acc)[4][4][CP], const float* yk, const float4* wk,
                                                         int pitch, int R, int S) {
#pragma unroll
    for (int u = 0; u < TAPS; ++u) {
        if (u >= R) break;
        float4 tap[TAPS];
#pragma unroll
        for (int v = 0; v < TAPS; ++v) tap[v] = wk[u * TAPS + v];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            float seg[SEG];
            few_row<SEG>(seg, yk + (i + u) * pitch);
            few_row_taps<CP, TAPS, SEG>(acc[i], seg, tap, S);
        }
    }
}

// Blocks an SM the shared memory allows: five of TAPS 4 (~43 KB), three of TAPS 8 (~61 KB).
template <typename T, int CP, int TAPS, bool NHWC>
__global__ void __launch_bounds__(FEW_THREADS, TAPS == 4 ? 5 : 3)
transpose_few_channels(const T* __restrict__ y, const T* __restrict__ w, const T* __restrict__ bias,
                       T* __restrict__ out, int N, int K, int Hy, int Wy, int H, int W, int sh, int sw,
                       int tap_step_r, int tap_step_s, int stride_k, int stride_c, int stride_r, int stride_s,
                       int has_bias, int bx, int vector_k, const __grid_constant__ FewPhases phases) {
    static_assert(CP >= 1 && CP <= 4, "at most 4 output channels: a float4 of weights a tap");
    constexpr bool ASYNC = sizeof(T) == 4;
    constexpr int KC = few_chunk<T>(), STAGES = few_stages<T>(), SEG = few_segment<TAPS>();
    extern __shared__ __align__(16) float few_shared[];

    const int by = FEW_THREADS / bx, tile_h = 4 * by, tile_w = 4 * bx;
    const int rows = tile_h + TAPS - 1, pitch = tile_w + SEG - 4, plane = rows * pitch;
    // A stage: y's tile [KC][rows][pitch], then the taps [KC][TAPS][TAPS] as float4s of channels.
    const int stage_floats = KC * plane + KC * TAPS * TAPS * 4;

    const int phase_count = phases.rows.count * phases.cols.count;
    const int phase = blockIdx.x % phase_count, pr = phase / phases.cols.count, pc = phase % phases.cols.count;
    const int i0 = blockIdx.y * tile_h, j0 = (blockIdx.x / phase_count) * tile_w;
    const int size_i = phases.rows.size[pr], size_j = phases.cols.size[pc];
    if (i0 >= size_i || j0 >= size_j) return;  // a tile past this phase's outputs: the whole block
    const int R = phases.rows.taps[pr], S = phases.cols.taps[pc];
    const int y_row0 = i0 + phases.rows.offset[pr], y_col0 = j0 + phases.cols.offset[pc];
    const int first_r = phases.rows.first[pr], first_s = phases.cols.first[pc];
    const int tid = threadIdx.x, tx = tid % bx, ty = tid / bx;
    const int chunks = R > 0 && S > 0 ? (K + KC - 1) / KC : 0;  // a phase no tap reaches: the bias alone
    const int k_stride = NHWC ? 1 : Hy * Wy;

    for (int n = blockIdx.z; n < N; n += gridDim.z) {
        // Chunk k0's y tile and taps into stage `stage`: float32 by 4-byte cp.async (zeros by a source size of 0),
        // 16-bit by loads widened to float and stored.
        auto copy_chunk = [&](int stage, int k0) {
            float* const ys = few_shared + stage * stage_floats;
            if constexpr (ASYNC && NHWC) {
                // KC lanes side by side take a pixel's KC channels (16 contiguous bytes), FEW_THREADS / KC pixels
                // a step: a warp's copies touch 8 sectors, where a pixel a lane touched 32.
                constexpr int STEP = FEW_THREADS / KC;
                const int kk = tid % KC;
                const bool k_inside = k0 + kk < K;
                int row = tid / KC / pitch, col = tid / KC % pitch;
#pragma unroll 4
                for (int e = tid / KC; e < plane; e += STEP) {
                    const int p = y_row0 + row, q = y_col0 + col;
                    const bool valid = k_inside && p >= 0 && p < Hy && q >= 0 && q < Wy;
                    const T* const at = valid ? y + ((n * Hy + p) * Wy + q) * K + k0 + kk : y;
                    cp_async<4>(ys + kk * plane + row * pitch + col, at, valid);
                    col += STEP;  // STEP < pitch: at most a row on
                    if (col >= pitch) col -= pitch, ++row;
                }
            } else {
                int row = tid / pitch, col = tid % pitch;
                // Positions in flight a thread: cp.async's cost no registers; 16-bit loads 8 each (more spill beside
                // 4 x 4 x 4 sums and 8 taps).
#pragma unroll(ASYNC ? 4 : 2)
                for (int e = tid; e < plane; e += FEW_THREADS) {
                    const int p = y_row0 + row, q = y_col0 + col;
                    const bool inside = p >= 0 && p < Hy && q >= 0 && q < Wy;
                    const T* const at = y + (NHWC ? ((n * Hy + p) * Wy + q) * K + k0 : ((n * K + k0) * Hy + p) * Wy + q);
                    float* const to = ys + row * pitch + col;
                    if constexpr (ASYNC) {
#pragma unroll
                        for (int kk = 0; kk < KC; ++kk) {
                            const bool valid = inside && k0 + kk < K;
                            cp_async<4>(to + kk * plane, valid ? at + kk * k_stride : y, valid);
                        }
                    } else {
                        float v[KC];
                        if (NHWC && vector_k && k0 + KC <= K) {
                            // 16-byte loads of 8 channels (K a whole number of 16-byte vectors)
                            constexpr int PER = 16 / sizeof(T);
                            struct alignas(16) Vec { T e[PER]; };
#pragma unroll
                            for (int part = 0; part < KC; part += PER) {
                                const Vec got = load_or_zero(reinterpret_cast<const Vec*>(at + part), inside);
#pragma unroll
                                for (int x = 0; x < PER; ++x) v[part + x] = to_acc<float>(got.e[x]);
                            }
                        } else {
#pragma unroll
                            for (int kk = 0; kk < KC; ++kk)
                                v[kk] = inside && k0 + kk < K ? to_acc<float>(at[kk * k_stride]) : 0.0f;
                        }
#pragma unroll
                        for (int kk = 0; kk < KC; ++kk) to[kk * plane] = v[kk];
                    }
                    // The next position, FEW_THREADS on: pitch > FEW_THREADS / 2, so at most two rows on.
                    col += FEW_THREADS;
                    if (col >= pitch) col -= pitch, ++row;
                    if (col >= pitch) col -= pitch, ++row;
                }
            }
            // The taps of this phase: (kk, u, v) a float4 of channels, zeros past K, R, S and C.
            float* const ws = ys + KC * plane;
            for (int e = tid; e < KC * TAPS * TAPS * 4; e += FEW_THREADS) {
                const int c = e % 4, v = e / 4 % TAPS, u = e / (4 * TAPS) % TAPS, k = k0 + e / (4 * TAPS * TAPS);
                const bool valid = k < K && u < R && v < S && c < CP;
                const T* const at = w + k * stride_k + c * stride_c + (first_r - u * tap_step_r) * stride_r +
                                    (first_s - v * tap_step_s) * stride_s;
                if constexpr (ASYNC)
                    cp_async<4>(ws + e, valid ? at : w, valid);
                else
                    ws[e] = valid ? to_acc<float>(*at) : 0.0f;
            }
        };

        float acc[4][4][CP];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int c = 0; c < CP; ++c) acc[i][j][c] = 0.0f;

        if (ASYNC && chunks > 0) {
            copy_chunk(0, 0);
            cp_async_commit();
        }
        for (int chunk = 0; chunk < chunks; ++chunk) {
            if constexpr (ASYNC) {
                // The next chunk's copies fly while this one multiplies.
                if (chunk + 1 < chunks) copy_chunk((chunk + 1) % STAGES, (chunk + 1) * KC);
                cp_async_commit();
                cp_async_wait<1>();
            } else {
                copy_chunk(0, chunk * KC);
            }
            __syncthreads();
            const float* const ys = few_shared + chunk % STAGES * stage_floats;
            const float4* const ws = reinterpret_cast<const float4*>(ys + KC * plane);
            for (int kk = 0; kk < KC; ++kk) {
                const float* const yk = ys + kk * plane + ty * 4 * pitch + tx * 4;
                const float4* const wk = ws + kk * TAPS * TAPS;
                if constexpr (TAPS == 4) {
                    few_taps_by_rows_of_y<CP, TAPS, SEG>(acc, yk, wk, pitch, R, S);
                } else {
                    few_taps_by_rows_of_taps<CP, TAPS, SEG>(acc, yk, wk, pitch, R, S);
                }
            }
            __syncthreads();  // this stage is read before it is copied into again
        }

        const int a = phases.rows.start[pr], b = phases.cols.start[pc];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int pi = i0 + ty * 4 + i;
            if (pi >= size_i) break;
            const int h = a + sh * pi;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int pj = j0 + tx * 4 + j;
                if (pj >= size_j) break;
                const int v = b + sw * pj;
#pragma unroll
                for (int c = 0; c < CP; ++c) {
                    const float value = acc[i][j][c] + (has_bias ? to_acc<float>(bias[c]) : 0.0f);
                    const int at = NHWC ? ((n * H + h) * W + v) * CP + c : ((n * CP + c) * H + h) * W + v;
                    out[at] = from_acc<T>(value);
                }
            }
        }
    }
}

}  // namespace cupyconv
