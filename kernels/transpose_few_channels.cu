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
// output pixels x CP channels in float32 registers (every storage type). K goes in chunks of 8 channels:
// the chunk's y tile (TH + TAPS - 1 rows, its taps' reach; NHWC pixels as 16-byte loads of 8 channels)
// and its phase's taps (a float4 of channels each, zeros past C) are loaded, widened to float and stored
// in shared memory, one plane of the tile a channel. Then, for each tap row u (a runtime loop), a thread
// holds the row's S taps and reads, for each of its pixel rows, the 4 + S - 1 values of y its 4 pixels'
// taps reach as float4s (lanes 16 bytes apart: no bank conflicts), for 4 x S x CP FMAs. S is a template
// (a switch on the phase's S): with the tap loops unrolled to TAPS and cut by a runtime S, every FMA of
// TAPS x TAPS taps was issued, predicated off past R and S (768 a channel where a 7x7 stride-2 stem's
// phases need 588 on average).
//
// Grid: x = column tiles x phases (phases fastest, so the blocks of a tile's phases, which read the
// same y, run together), y = row tiles, z = images (looped past gridDim.z). 32-bit offsets: the
// planner takes arrays of fewer than 2^31 elements.
#include "dtypes.cuh"

namespace cupyconv {

constexpr int FEW_THREADS = 64;
constexpr int FEW_KC = 8;
constexpr int FEW_MAX_AXIS_PHASES = 8;

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

// A thread's sums for one channel of y over a phase's R x S taps: acc[i][j][c] += y[i + u][j + v] w[u][v][c],
// y its rows of the tile (yk, `pitch` apart; float4 reads, 16-byte aligned), w the taps (wk, TAPS a row).
template <int CP, int TAPS, int S>
__device__ __forceinline__ void few_taps(float (&acc)[4][4][CP], const float* yk, const float4* wk, int pitch, int R) {
    constexpr int SEG = few_segment<S>();
    for (int u = 0; u < R; ++u) {
        float4 tap[S];
#pragma unroll
        for (int v = 0; v < S; ++v) tap[v] = wk[u * TAPS + v];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            float seg[SEG];
#pragma unroll
            for (int s = 0; s < SEG; s += 4) {
                const float4 four = *reinterpret_cast<const float4*>(yk + (i + u) * pitch + s);
                seg[s] = four.x;
                seg[s + 1] = four.y;
                seg[s + 2] = four.z;
                seg[s + 3] = four.w;
            }
#pragma unroll
            for (int v = 0; v < S; ++v) {
                const float wv[4] = {tap[v].x, tap[v].y, tap[v].z, tap[v].w};
#pragma unroll
                for (int j = 0; j < 4; ++j)
#pragma unroll
                    for (int c = 0; c < CP; ++c) acc[i][j][c] = fmaf(seg[j + v], wv[c], acc[i][j][c]);
            }
        }
    }
}

// few_taps for the phase's S (1 .. TAPS), a switch on a block-uniform value.
template <int CP, int TAPS, int S = 1>
__device__ __forceinline__ void few_taps_of_width(float (&acc)[4][4][CP], const float* yk, const float4* wk, int pitch,
                                                  int R, int width) {
    if (width == S) {
        few_taps<CP, TAPS, S>(acc, yk, wk, pitch, R);
    } else if constexpr (S < TAPS) {
        few_taps_of_width<CP, TAPS, S + 1>(acc, yk, wk, pitch, R, width);
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
    constexpr int SEG = few_segment<TAPS>();
    extern __shared__ __align__(16) float few_shared[];

    const int by = FEW_THREADS / bx, tile_h = 4 * by, tile_w = 4 * bx;
    const int rows = tile_h + TAPS - 1, pitch = tile_w + SEG - 4, plane = rows * pitch;
    float* const ys = few_shared;                                          // [KC][rows][pitch]
    float4* const ws = reinterpret_cast<float4*>(ys + FEW_KC * plane);     // [KC][TAPS][TAPS]

    const int phase_count = phases.rows.count * phases.cols.count;
    const int phase = blockIdx.x % phase_count, pr = phase / phases.cols.count, pc = phase % phases.cols.count;
    const int i0 = blockIdx.y * tile_h, j0 = (blockIdx.x / phase_count) * tile_w;
    const int size_i = phases.rows.size[pr], size_j = phases.cols.size[pc];
    if (i0 >= size_i || j0 >= size_j) return;  // a tile past this phase's outputs: the whole block
    const int R = phases.rows.taps[pr], S = phases.cols.taps[pc];
    const int y_row0 = i0 + phases.rows.offset[pr], y_col0 = j0 + phases.cols.offset[pc];
    const int first_r = phases.rows.first[pr], first_s = phases.cols.first[pc];
    const int tid = threadIdx.x, tx = tid % bx, ty = tid / bx;
    const int k_stride = NHWC ? 1 : Hy * Wy;

    for (int n = blockIdx.z; n < N; n += gridDim.z) {
        float acc[4][4][CP];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int c = 0; c < CP; ++c) acc[i][j][c] = 0.0f;

        for (int k0 = 0; R > 0 && S > 0 && k0 < K; k0 += FEW_KC) {  // a phase no tap reaches: the bias alone
            __syncthreads();  // the last chunk's reads are done
            // The chunk's y tile: a position (row, col) a step, its KC channels, two positions in flight.
            int row = tid / pitch, col = tid % pitch;
#pragma unroll 2
            for (int e = tid; e < plane; e += FEW_THREADS) {
                const int p = y_row0 + row, q = y_col0 + col;
                const bool inside = p >= 0 && p < Hy && q >= 0 && q < Wy;
                const T* const at = y + (NHWC ? ((n * Hy + p) * Wy + q) * K + k0 : ((n * K + k0) * Hy + p) * Wy + q);
                float v[FEW_KC];
                if (NHWC && vector_k && k0 + FEW_KC <= K) {
                    // 16-byte loads of 8 channels (K a whole number of 16-byte vectors)
                    constexpr int PER = 16 / sizeof(T);
                    struct alignas(16) Vec { T e[PER]; };
#pragma unroll
                    for (int part = 0; part < FEW_KC; part += PER) {
                        const Vec got = load_or_zero(reinterpret_cast<const Vec*>(at + part), inside);
#pragma unroll
                        for (int x = 0; x < PER; ++x) v[part + x] = to_acc<float>(got.e[x]);
                    }
                } else {
#pragma unroll
                    for (int kk = 0; kk < FEW_KC; ++kk)
                        v[kk] = inside && k0 + kk < K ? to_acc<float>(at[kk * k_stride]) : 0.0f;
                }
#pragma unroll
                for (int kk = 0; kk < FEW_KC; ++kk) ys[kk * plane + row * pitch + col] = v[kk];
                // The next position, FEW_THREADS on: pitch > FEW_THREADS / 2, so at most two rows on.
                col += FEW_THREADS;
                if (col >= pitch) col -= pitch, ++row;
                if (col >= pitch) col -= pitch, ++row;
            }
            // The chunk's taps of this phase: (kk, u, v) a float4 of channels, zeros past K, R, S and C.
            for (int e = tid; e < FEW_KC * TAPS * TAPS * 4; e += FEW_THREADS) {
                const int c = e % 4, v = e / 4 % TAPS, u = e / (4 * TAPS) % TAPS, k = k0 + e / (4 * TAPS * TAPS);
                float value = 0.0f;
                if (k < K && u < R && v < S && c < CP)
                    value = to_acc<float>(w[k * stride_k + c * stride_c + (first_r - u * tap_step_r) * stride_r +
                                            (first_s - v * tap_step_s) * stride_s]);
                reinterpret_cast<float*>(ws)[e] = value;
            }
            __syncthreads();

            for (int kk = 0; kk < FEW_KC; ++kk)
                few_taps_of_width<CP, TAPS>(acc, ys + kk * plane + ty * 4 * pitch + tx * 4, ws + kk * TAPS * TAPS,
                                            pitch, R, S);
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
