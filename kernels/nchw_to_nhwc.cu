// Channels-last copies for the NHWC implicit GEMM (kernels/implicit_gemm_nhwc.cu), and the
// transposes that let the NCHW kernels run NHWC arrays (cupyconv/layouts.py).
//
//   y[n][p][c] = x[n][c][p] for c < C, 0 for C <= c < Cp        (p = h W + w, or a kernel tap r kw + s)
//
// The same transpose repacks an input [N][C][H][W] into [N][H][W][Cp] and a weight [K][Cg][kh][kw]
// into [K][kh][kw][Cgp]: the GEMM then reads whole 16-, 8- or 4-byte vectors of channels. Padding
// channels are zeros on both sides, so they add nothing to the sums. With the roles of c and p
// swapped (C = H W, P = channels, Cp = C) it turns [N][H][W][C] back into [N][C][H][W].
// pad_channels does the NHWC input's and KHWC weight's share: y[p][c] = x[p][c], zeros past C.
//
// ROUND_TF32 rounds float32 to TF32 (cvt.rna) on the way, once per element, so the GEMM can feed
// shared-memory words straight to mma.sync .tf32 instead of rounding every fragment it loads.
#include "dtypes.cuh"

namespace cupyconv {

// Many channels: a 32 x 32 (channel, position) tile through shared memory, so that both the reads
// (along p) and the writes (along c) are coalesced. Block (32, 8), grid (ceil(P / 32), ceil(Cp / 32), N).
template <typename T, bool ROUND_TF32>
__global__ void __launch_bounds__(256)
nchw_to_nhwc_tiled(const T* __restrict__ x, T* __restrict__ y, int C, int P, int Cp) {
    __shared__ T tile[32][33];  // +1 column: the transposed read is conflict-free
    const long long n = blockIdx.z;
    const int p0 = blockIdx.x * 32, c0 = blockIdx.y * 32;
    const int tx = threadIdx.x, ty = threadIdx.y;
    const T* src = x + n * C * P;
    T* dst = y + n * Cp * P;
#pragma unroll
    for (int j = 0; j < 32; j += 8) {
        const int c = c0 + ty + j, p = p0 + tx;
        T v{};
        if (c < C && p < P) v = tf32_rounded_if<ROUND_TF32>(src[static_cast<long long>(c) * P + p]);
        tile[ty + j][tx] = v;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < 32; j += 8) {
        const int p = p0 + ty + j, c = c0 + tx;
        if (p < P && c < Cp) dst[static_cast<long long>(p) * Cp + c] = tile[tx][ty + j];
    }
}

// The same for 16-bit types where P and Cp are even: a 64 x 64 tile moved in pairs, so that a warp reads and
// writes 128 contiguous bytes (the element-wise tile above moves 64 and ran float16 at 1.3-1.9x a plain copy's
// time, H200). Thread (tx, ty) loads positions 2 tx, 2 tx + 1 of channels 2 r and 2 r + 1 (two 4-byte loads),
// swaps them into one word a position (the two channels' values), and, after the barrier, stores the words of
// channels 2 tx, 2 tx + 1 at its positions. Words [p][r] padded to 33 a row: the stores to shared memory hit 2
// banks a pair of lanes at most, the loads from it none. Block (32, 8), grid (ceil(P / 64), ceil(Cp / 64), N).
template <typename T>
__global__ void __launch_bounds__(256)
nchw_to_nhwc_pairs(const T* __restrict__ x, T* __restrict__ y, int C, int P, int Cp) {
    static_assert(sizeof(T) == 2, "pairs of 16-bit values in a word");
    __shared__ unsigned tile[64][33];  // [position][channel pair]
    const long long n = blockIdx.z;
    const int p0 = blockIdx.x * 64, c0 = blockIdx.y * 64;
    const int tx = threadIdx.x, ty = threadIdx.y, p = p0 + 2 * tx;
    const T* src = x + n * C * P;
#pragma unroll
    for (int r = ty; r < 32; r += 8) {
        const int c = c0 + 2 * r;
        unsigned even = 0, odd = 0;  // channels c and c + 1 at positions p, p + 1 (P is even: both or neither)
        if (p < P && c < C) even = *reinterpret_cast<const unsigned*>(src + static_cast<long long>(c) * P + p);
        if (p < P && c + 1 < C) odd = *reinterpret_cast<const unsigned*>(src + static_cast<long long>(c + 1) * P + p);
        tile[2 * tx][r] = __byte_perm(even, odd, 0x5410);      // position p: (c, c + 1)
        tile[2 * tx + 1][r] = __byte_perm(even, odd, 0x7632);  // position p + 1
    }
    __syncthreads();
    T* dst = y + n * Cp * P;
    const int c = c0 + 2 * tx;  // and c + 1 (Cp is even)
#pragma unroll
    for (int q = ty; q < 64; q += 8)
        if (p0 + q < P && c < Cp)
            *reinterpret_cast<unsigned*>(dst + static_cast<long long>(p0 + q) * Cp + c) = tile[q][tx];
}

// Few channels (Cp <= 8, AlexNet's 3 padded to 4): one thread per position reads its C values
// (coalesced across the warp) and writes its Cp contiguous ones, as one 8- or 16-byte store where
// Cp fills one. Grid (ceil(P / 256), N), block 256.
template <typename T, bool ROUND_TF32>
__global__ void __launch_bounds__(256)
nchw_to_nhwc_narrow(const T* __restrict__ x, T* __restrict__ y, int C, int P, int Cp) {
    const long long n = blockIdx.y;
    const int p = blockIdx.x * 256 + threadIdx.x;
    if (p >= P) return;
    const T* src = x + n * C * P + p;
    T* dst = y + (n * P + p) * Cp;
    alignas(16) T values[8];
#pragma unroll
    for (int c = 0; c < 8; ++c) {
        values[c] = T{};
        if (c < C) values[c] = tf32_rounded_if<ROUND_TF32>(src[static_cast<long long>(c) * P]);
    }
    const int bytes = Cp * static_cast<int>(sizeof(T));  // dst is aligned to it: it is p times that
    if (bytes == 16) {
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(values);
    } else if (bytes == 8) {
        *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(values);
    } else {
#pragma unroll
        for (int c = 0; c < 8; ++c)
            if (c < Cp) dst[c] = values[c];
    }
}

// y[p][c] = x[p][c] for c < C, 0 for C <= c < Cp, over P rows: the NHWC input or KHWC weight given
// the zero channels (and TF32 rounding) the GEMM's pieces need. One thread per element of y
// (coalesced writes; reads coalesced but for the row ends). 1-D grid of ceil(P Cp / 256) blocks.
template <typename T, bool ROUND_TF32>
__global__ void __launch_bounds__(256)
pad_channels(const T* __restrict__ x, T* __restrict__ y, int C, int P, int Cp) {
    const long long i = static_cast<long long>(blockIdx.x) * 256 + threadIdx.x, total = static_cast<long long>(P) * Cp;
    if (i >= total) return;
    long long p;
    if (total <= 0xffffffffLL) {  // 32-bit division where it suffices: a 64-bit one per element is slow
        p = static_cast<unsigned>(i) / static_cast<unsigned>(Cp);
    } else {
        p = i / Cp;
    }
    const int c = static_cast<int>(i - p * Cp);
    y[i] = c < C ? tf32_rounded_if<ROUND_TF32>(x[p * C + c]) : T{};
}

}  // namespace cupyconv
