// Direct 2-D convolution, NCHW, tiled through shared memory.
//
// A thread block computes a tile of BK output channels x (BH x BW) output pixels of one group of one
// image. For each stage (CC input channels x KR kernel rows x KS kernel columns) it stages the input
// patch those outputs read, halo included, and the matching weight slice in shared memory; each
// thread then accumulates an RK x RP register block (RK channels x RP pixels). The whole kernel
// (KR = kh, KS = kw) is one stage whenever the patch fits, so each input element is read from global
// memory once per tile; the stage split exists so that any kernel size, stride and dilation fits.
//
// Thread layout: tid = tk * TP + tp. The TP threads of a channel row take pixels tp, tp + TP, ...
// (consecutive lanes -> consecutive output columns: coalesced stores), and thread row tk takes the RK
// consecutive channels tk * RK ... (a warp shares tk when TP >= 32, so its weight reads are one
// vector broadcast).
//
// Shared-memory layout of the patch: a patch column pc is stored at (pc % sw) * PCS + pc / sw, so the
// columns one kernel tap reads for consecutive output columns (pc = ow * sw + s * dw) are consecutive
// words whatever the stride: no bank conflicts. Rows are `pitch` words apart; the planner pads the
// pitch so that the two output rows one warp covers land in different banks.
#include "dtypes.cuh"
#include "epilogue.cuh"

namespace cupyconv {

// N consecutive values from shared memory, as 16-byte loads where N and the type allow (the caller
// keeps the address aligned to N elements).
template <int N, typename Acc>
__device__ __forceinline__ void load_vector(Acc (&v)[N], const Acc* p) {
    if constexpr (sizeof(Acc) == 4 && N % 4 == 0) {
#pragma unroll
        for (int j = 0; j < N; j += 4) {
            const float4 q = *reinterpret_cast<const float4*>(p + j);
            v[j] = q.x; v[j + 1] = q.y; v[j + 2] = q.z; v[j + 3] = q.w;
        }
    } else if constexpr (sizeof(Acc) * N % 16 == 0) {
#pragma unroll
        for (int j = 0; j < N; j += 2) {
            const double2 q = *reinterpret_cast<const double2*>(p + j);
            v[j] = q.x; v[j + 1] = q.y;
        }
    } else {
#pragma unroll
        for (int j = 0; j < N; ++j) v[j] = p[j];
    }
}

template <typename T, typename Index, int BK, int BH, int BW, int RK, int RP>
// Two blocks per SM where the accumulators are 4 bytes and indices 32-bit (the register cap, 128,
// holds them unspilled; 64-bit addresses and the fused epilogue's copies of the stores spilled under it).
__global__ void __launch_bounds__((BK / RK) * (BH * BW / RP), sizeof(T) == 8 || sizeof(Index) == 8 ? 1 : 2)
direct_conv2d(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
              T* __restrict__ y, int has_bias, const T* __restrict__ residual, int has_residual, int activation,
              int N, int C, int H, int W, int K, int Ho, int Wo, int kh, int kw,
              int sh, int sw, int pt, int pl, int dh, int dw, int groups,
              int CC, int KR, int KS, int pitch, int tiles_w, int tiles, int ktiles) {
    using Acc = typename accumulator<T>::type;
    constexpr int TP = BH * BW / RP;   // threads along pixels
    constexpr int TK = BK / RK;        // threads along output channels
    constexpr int NT = TP * TK;
    constexpr int NWARPS = NT / 32;
    static_assert(TP * RP == BH * BW && TK * RK == BK, "tile must split evenly over threads");
    static_assert(NT % 32 == 0, "staging assigns whole warps to rows");
    // Weight staging layout: a tap's BK channels are WP words apart (weight_pitch in
    // families/direct_conv2d.py must agree), padded by 4 so that 8 taps x 4 channels stored by one
    // warp fall in 32 distinct banks.
    constexpr int WP = BK % 8 == 0 ? BK + 4 : BK;
    constexpr int KL = BK >= 4 ? 4 : 1, TL = 32 / KL;
    static_assert(BK % KL == 0, "weight staging lanes must divide the channel tile");

    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int PR = (BH - 1) * sh + (KR - 1) * dh + 1;  // patch rows per stage
    const int PC = (BW - 1) * sw + (KS - 1) * dw + 1;  // patch columns per stage
    const int PCS = (PC + sw - 1) / sw;                  // stored columns of one stride phase
    const int plane = (CC * PR * pitch + 3) / 4 * 4;     // keeps ws 16-byte aligned
    Acc* xs = reinterpret_cast<Acc*>(smem_raw);          // [CC][PR][pitch], columns permuted
    Acc* ws = xs + plane;                                // [CC][KR][KS][WP]

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int tp = tid % TP, tk = tid / TP;
    const int Cg = C / groups, Kg = K / groups;
    const int tile = blockIdx.x % tiles;
    const int kt = (blockIdx.x / tiles) % ktiles;
    const int g = blockIdx.x / tiles / ktiles;
    const int oh0 = (tile / tiles_w) * BH, ow0 = (tile % tiles_w) * BW;
    const int k0 = kt * BK;

    int poff[RP];  // each pixel's offset in the patch for kernel tap (0, 0)
#pragma unroll
    for (int i = 0; i < RP; ++i) {
        const int p = tp + i * TP;
        poff[i] = (p / BW) * sh * pitch + p % BW;
    }
    const int tap_step = dw / sw, phase_step = dw % sw;  // how a tap's permuted column moves with s

    for (int n = blockIdx.y; n < N; n += gridDim.y) {
        const T* xg = x + (static_cast<Index>(n) * C + static_cast<Index>(g) * Cg) * H * W;
        Acc acc[RK][RP];
#pragma unroll
        for (int j = 0; j < RK; ++j)
#pragma unroll
            for (int i = 0; i < RP; ++i) acc[j][i] = Acc(0);

        for (int c0 = 0; c0 < Cg; c0 += CC) {
            const int cn = min(CC, Cg - c0);
            for (int r0 = 0; r0 < kh; r0 += KR) {
                const int rn = min(KR, kh - r0);
                for (int s0 = 0; s0 < kw; s0 += KS) {
                    const int sn = min(KS, kw - s0);
                    __syncthreads();  // the previous stage's reads are done before it is overwritten
                    // Staging: one warp per patch row or weight row, lanes along it, so global
                    // reads are coalesced and index divisions happen once per row, not per element.
                    const int ih0 = oh0 * sh - pt + r0 * dh, iw0 = ow0 * sw - pl + s0 * dw;
#pragma unroll 1
                    for (int row = warp; row < cn * PR; row += NWARPS) {
                        const int c = row / PR, ih = ih0 + row % PR;
                        const bool inside = ih >= 0 && ih < H;  // rows outside are zero padding
                        const T* src = xg + (static_cast<Index>(c0 + c) * H + (inside ? ih : 0)) * W;
                        Acc* dst = xs + row * pitch;
                        for (int phase = 0; phase < sw; ++phase) {
#pragma unroll 1
                            for (int q = lane; q < PCS; q += 32) {
                                const int pc = q * sw + phase, iw = iw0 + pc;
                                Acc v = Acc(0);
                                if (inside && pc < PC && iw >= 0 && iw < W) v = to_acc<Acc>(src[iw]);
                                dst[phase * PCS + q] = v;
                            }
                        }
                    }
                    // Weights: KL lanes along channels x TL lanes along taps, so a warp reads
                    // KL runs of TL consecutive taps and, with the WP pitch, stores to 32 banks.
#pragma unroll 1
                    for (int row = warp; row < BK / KL * cn; row += NWARPS) {
                        const int kk = row / cn * KL + lane % KL, c = row % cn, k = k0 + kk;
                        const T* src = w + ((static_cast<Index>(g) * Kg + k) * Cg + c0 + c) * kh * kw;
#pragma unroll 1
                        for (int t = lane / KL; t < rn * sn; t += TL) {
                            const int r = t / sn, s = t % sn;
                            // Channels past Kg stay zero: every thread reads RK channels.
                            ws[((c * KR + r) * KS + s) * WP + kk] =
                                k < Kg ? to_acc<Acc>(src[(r0 + r) * kw + s0 + s]) : Acc(0);
                        }
                    }
                    __syncthreads();
                    for (int c = 0; c < cn; ++c) {
                        for (int r = 0; r < rn; ++r) {
                            const Acc* xrow = xs + (c * PR + r * dh) * pitch;
                            const Acc* wrow = ws + (c * KR + r) * KS * WP + tk * RK;
                            int tap = 0, phase = 0;  // tap s reads permuted column phase * PCS + tap
                            for (int s = 0; s < sn; ++s) {
                                Acc xv[RP], wv[RK];
#pragma unroll
                                for (int i = 0; i < RP; ++i) xv[i] = xrow[poff[i] + phase * PCS + tap];
                                load_vector<RK>(wv, wrow + s * WP);
                                tap += tap_step;
                                phase += phase_step;
                                if (phase >= sw) { phase -= sw; ++tap; }
#pragma unroll
                                for (int j = 0; j < RK; ++j)
#pragma unroll
                                    for (int i = 0; i < RP; ++i) acc[j][i] = fma(wv[j], xv[i], acc[j][i]);
                            }
                        }
                    }
                }
            }
        }

        // Epilogue: bias, the fused epilogue, conversion to the storage type, stores coalesced along
        // output columns.
        with_epilogue<T>(residual, [&](auto finish) {
#pragma unroll
            for (int j = 0; j < RK; ++j) {
                const int k = k0 + tk * RK + j;
                if (k >= Kg) continue;
                const int ko = g * Kg + k;
                const Acc b = has_bias ? to_acc<Acc>(bias[ko]) : Acc(0);
                const Index plane = (static_cast<Index>(n) * K + ko) * Ho * Wo;
#pragma unroll
                for (int i = 0; i < RP; ++i) {
                    const int p = tp + i * TP;
                    const int oh = oh0 + p / BW, ow = ow0 + p % BW;
                    const Index o = plane + static_cast<Index>(oh) * Wo + ow;
                    if (oh < Ho && ow < Wo) y[o] = finish(acc[j][i] + b, o);
                }
            }
        });
    }
}

}  // namespace cupyconv
