// Depthwise 2-D convolution (one input channel per group: groups == C, any K / groups), NCHW.
//
// A depthwise layer does kh kw multiply-adds per output element, so it is bound by memory traffic,
// not arithmetic, and the kernel's job is to keep enough bytes in flight. A block runs channel lanes
// side by side (block z); a lane computes one TH x TW output tile of its channels, one
// after another. Each channel's input patch is copied into shared memory with cp.async (in the
// storage type, zero-filled outside the input) in the widest pieces the rows' alignment allows, so a
// thread has its whole share of the patch in flight at once. A lane keeps a ring of B patch buffers
// (B = 1 to 4): the copies of the next B - 1 channels are in flight while one is computed, so a
// long-lived block waits out one memory latency at its start rather than one per channel.
//
// A thread computes RPT consecutive rows of one output column, so a warp's loads and stores run
// along a row -- or, in a tile one row high (TH == 1, RPT > 1: ROW_RUNS, conv1d's outputs), RPT
// consecutive outputs of the row, their inputs rotated through registers (depthwise_rows.cuh
// accumulate_row_run) and stored as vectors. For the common tap counts and row strides (KH, KW, SH > 0; row dilation 1) the taps
// are unrolled, the channel's weights sit in registers, and the thread slides down the patch: each
// of the (RPT - 1) SH + KH patch rows it needs is read once (KW values) for every output that uses
// it, instead of kh kw reads per output. KH == 0 is the generic instance: run-time taps, row stride
// and dilation, one shared-memory read per multiply-add.
//
// Arguments as the other kernels' (N is the grid's z), then: the tiles per output row; the output
// channels per block (lanes x channels per lane); the bytes per copy piece (16, 8 or 4; 2 is plain
// 16-bit loads, for rows that are not 4-byte aligned), narrowed here if x is less aligned; the
// patch's row pitch in elements; the patch buffers per lane (1 to 4).
// Grid (output tiles, channel blocks, N); block (TW, TH / RPT, lanes), or (TW / RPT, 1, lanes) for ROW_RUNS.
// Dynamic shared memory: lanes x buffers x ((TH - 1) sh + (kh - 1) dh + 1) rows x pitch elements.
#include "depthwise_rows.cuh"
#include "epilogue.cuh"
#include "mma.cuh"

namespace cupyconv {

// Where one channel's input patch comes from and how this thread's share of it is copied: pieces of
// a fixed size, aligned in the input row (the planner makes W a multiple of the piece), so that a
// piece lies wholly inside the input or wholly in the padding; rows x pieces of them, the first at
// column iw_first. The thread's pieces start at (row r0, piece c0) and step by the lane's thread
// count, (step_r, step_c): worked out once per block, so no division per element.
struct PatchCopy {
    int H, W, ih0, iw_first, rows, pieces, pitch, r0, c0, step_r, step_c;
};

template <int BYTES, typename T, typename Index>
__device__ __forceinline__ void copy_patch(const PatchCopy& g, T* patch, const T* plane) {
    constexpr int E = BYTES / sizeof(T);  // elements per piece
    for (int r = g.r0, c = g.c0; r < g.rows; r += g.step_r) {
        const int ih = g.ih0 + r, iw = g.iw_first + c * E;
        const bool valid = static_cast<unsigned>(ih) < static_cast<unsigned>(g.H) &&
                           static_cast<unsigned>(iw) < static_cast<unsigned>(g.W);
        const T* src = valid ? plane + static_cast<Index>(ih) * g.W + iw : plane;
        T* dst = patch + r * g.pitch + c * E;
        if constexpr (BYTES >= 4) cp_async<BYTES>(dst, src, valid);
        else *dst = valid ? *src : T{};  // 2-byte pieces: cp.async moves 4 bytes at least
        c += g.step_c;
        if (c >= g.pieces) {
            c -= g.pieces;
            ++r;
        }
    }
}

// copy_patch with the run-time piece size `bytes`: 16 or 8, 4 for 4- and 2-byte T, 2 for 2-byte T.
template <typename T, typename Index>
__device__ __forceinline__ void copy_patch(int bytes, const PatchCopy& g, T* patch, const T* plane) {
    if (bytes == 16) copy_patch<16, T, Index>(g, patch, plane);
    else if (bytes == 8) copy_patch<8, T, Index>(g, patch, plane);
    else if constexpr (sizeof(T) <= 4) {
        if (bytes == 4) copy_patch<4, T, Index>(g, patch, plane);
        else if constexpr (sizeof(T) == 2) copy_patch<2, T, Index>(g, patch, plane);
    }
}

// Waits until the copy of the channel about to be computed has landed. The ring keeps the groups of
// the next B - 2 channels in flight behind it (none for B <= 2); cp.async.wait_group takes that
// count as an immediate, so the run-time B picks the instruction.
__device__ __forceinline__ void cp_async_wait_ring(int buffers) {
    if (buffers == 4) cp_async_wait<2>();
    else if (buffers == 3) cp_async_wait<1>();
    else cp_async_wait<0>();
}

// No __launch_bounds__: with one, ptxas spills a few bytes in about a third of the instances to stay
// under a register count of its choosing; without, none spills, and the planner's blocks of 128
// threads fit at up to 255 registers each.
template <typename T, typename Index, int TH, int TW, int RPT, int KH, int KW, int SH>
__global__ void depthwise_conv2d(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                                 T* __restrict__ y, int has_bias, const T* __restrict__ residual, int has_residual, int activation,
                                 int N, int C, int H, int W, int K, int Ho, int Wo, int kh, int kw,
                                 int sh, int sw, int pt, int pl, int dh, int dw, int groups,
                                 int tiles_w, int channels_per_block, int vec, int pitch, int buffers) {
    constexpr bool ROW_RUNS = TH == 1 && RPT > 1;
    static_assert(ROW_RUNS ? TW % RPT == 0 && KH == 0 : TH % RPT == 0,
                  "a thread computes RPT rows of the tile, or RPT outputs of its one row (run-time taps)");
    static_assert((KH > 0) == (KW > 0) && (KH > 0) == (SH > 0), "unrolled taps need KH, KW and SH; 0 = generic");
    using Acc = typename accumulator<T>::type;
    constexpr int NT = TW * TH / RPT;  // threads per lane
    constexpr int TAPS = KH * KW;
    extern __shared__ __align__(16) unsigned char smem_raw[];

    const Index n = blockIdx.z;
    const int lane = threadIdx.z, lanes = blockDim.z, tid = threadIdx.y * blockDim.x + threadIdx.x;
    const int oh0 = blockIdx.x / tiles_w * TH, ow0 = blockIdx.x % tiles_w * TW;
    const int rows = (TH - 1) * sh + (kh - 1) * dh + 1, cols = (TW - 1) * sw + (kw - 1) * dw + 1;
    const int ih0 = oh0 * sh - pt, iw0 = ow0 * sw - pl;
    T* const lane_patches = reinterpret_cast<T*>(smem_raw) + lane * buffers * rows * pitch;

    // Pieces start at an aligned column at or left of iw0; the patch's column 0 is `offset` in.
    while (vec > static_cast<int>(sizeof(T)) && reinterpret_cast<unsigned long long>(x) % vec) vec >>= 1;
    const int elems = max(1, vec / static_cast<int>(sizeof(T)));
    const int iw_first = iw0 & -elems, offset = iw0 - iw_first;
    const int pieces = (offset + cols + elems - 1) / elems;
    const int r0 = tid / pieces, step_r = NT / pieces;
    const PatchCopy geometry{H, W, ih0, iw_first, rows, pieces, pitch,
                             r0, tid - r0 * pieces, step_r, NT - step_r * pieces};

    const int per_lane = (channels_per_block + lanes - 1) / lanes;
    const int k_first = blockIdx.y * channels_per_block + lane;
    const int k_end = min(K, (static_cast<int>(blockIdx.y) + 1) * channels_per_block);
    const int multiplier = K / groups;
    // Issues the copy of this lane's t-th channel into ring buffer `buffer`: one cp.async group, empty
    // past the lane's channels so that the wait count stays the same to the end.
    auto stage = [&](int t, int buffer) {
        const int k = k_first + t * lanes;
        if (k < k_end)
            copy_patch<T, Index>(vec, geometry, lane_patches + buffer * rows * pitch,
                                 x + (n * C + k / multiplier) * static_cast<Index>(H) * W);
        cp_async_commit();
    };

    const int ow = ow0 + threadIdx.x * (ROW_RUNS ? RPT : 1);  // (the first of ROW_RUNS' outputs)
#pragma unroll 1
    for (int t = 0; t + 1 < buffers; ++t) stage(t, t);  // the first B - 1 channels
    int current = 0;  // ring buffer of channel t: t % buffers
#pragma unroll 1
    for (int t = 0; t < per_lane; ++t) {
        cp_async_wait_ring(buffers);
        __syncthreads();  // every lane's patch t has landed, and channel t - 1's buffer is no longer read
        stage(t + buffers - 1, current == 0 ? buffers - 1 : current - 1);
        if (buffers == 1) {  // ... which with one buffer is channel t's own: wait for it at once
            cp_async_wait<0>();
            __syncthreads();
        }

        const int k = k_first + t * lanes;
        const bool active = k < k_end;
        if (active) {
            Acc weights[TAPS > 0 ? TAPS : 1], acc[RPT];
#pragma unroll
            for (int i = 0; i < TAPS; ++i) weights[i] = to_acc<Acc>(w[static_cast<Index>(k) * TAPS + i]);
            const Acc b = has_bias ? to_acc<Acc>(bias[k]) : Acc(0);
#pragma unroll
            for (int j = 0; j < RPT; ++j) acc[j] = b;
            const T* patch = lane_patches + current * rows * pitch + offset + (ow - ow0) * sw;
            if constexpr (ROW_RUNS) {
                const T* wk = w + static_cast<Index>(k) * kh * kw;
                for (int r = 0; r < kh; ++r) {
                    const T* q = patch + r * dh * pitch;
                    if (sw == 1 && dw == 1) {
                        accumulate_row_run<RPT>(acc, q, wk + r * kw, kw);
                    } else {
                        for (int s = 0; s < kw; ++s) {
                            const Acc wv = to_acc<Acc>(wk[r * kw + s]);
#pragma unroll
                            for (int j = 0; j < RPT; ++j) acc[j] += wv * to_acc<Acc>(q[j * sw + s * dw]);
                        }
                    }
                }
            } else if constexpr (KH > 0) {
                // Slide down the column, reading each patch row once.
                const T* p = patch + threadIdx.y * (RPT * SH) * pitch;
#pragma unroll
                for (int i = 0; i < (RPT - 1) * SH + KH; ++i) {
                    Acc v[KW];
#pragma unroll
                    for (int s = 0; s < KW; ++s) v[s] = to_acc<Acc>(p[i * pitch + s * dw]);
                    accumulate_input_row<RPT, KH, KW, SH>(acc, weights, v, i);
                }
            } else {
                const T* p = patch + threadIdx.y * RPT * sh * pitch;
                const T* wk = w + static_cast<Index>(k) * kh * kw;
                for (int r = 0; r < kh; ++r)
                    for (int s = 0; s < kw; ++s) {
                        const Acc wv = to_acc<Acc>(wk[r * kw + s]);
                        const T* q = p + r * dh * pitch + s * dw;
#pragma unroll
                        for (int j = 0; j < RPT; ++j) acc[j] += wv * to_acc<Acc>(q[j * sh * pitch]);
                    }
            }
            const Index plane = (n * K + k) * static_cast<Index>(Ho) * Wo;
            with_epilogue<T>(residual, [&](auto finish) {
                if constexpr (ROW_RUNS) {
                    // The run's RPT outputs as 16-byte vectors where the row holds them all and they are
                    // aligned (a lane per output RPT elements apart would store RPT times the sectors).
                    const Index o = plane + static_cast<Index>(oh0) * Wo + ow;
                    alignas(16) T out[RPT];
#pragma unroll
                    for (int j = 0; j < RPT; ++j) out[j] = ow + j < Wo ? finish(acc[j], o + j) : T{};
                    constexpr int VECTORS = RPT * static_cast<int>(sizeof(T)) / 16;
                    if (VECTORS * 16 == RPT * static_cast<int>(sizeof(T)) && ow + RPT <= Wo &&
                        reinterpret_cast<unsigned long long>(y + o) % 16 == 0) {
#pragma unroll
                        for (int v = 0; v < VECTORS; ++v)
                            reinterpret_cast<uint4*>(y + o)[v] = reinterpret_cast<const uint4*>(out)[v];
                    } else {
#pragma unroll
                        for (int j = 0; j < RPT; ++j)
                            if (ow + j < Wo) y[o + j] = out[j];
                    }
                } else {
#pragma unroll
                    for (int j = 0; j < RPT; ++j) {
                        const int oh = oh0 + threadIdx.y * RPT + j;
                        const Index o = plane + static_cast<Index>(oh) * Wo + ow;
                        if (oh < Ho && ow < Wo) y[o] = finish(acc[j], o);
                    }
                }
            });
        }
        current = current + 1 == buffers ? 0 : current + 1;
    }
}

}  // namespace cupyconv
