// Space-to-depth copies for the channels-last GEMM (kernels/implicit_gemm_nhwc.cu): a convolution of
// stride (bh, bw) on few input channels (an RGB stem) run as a stride-1 convolution on blocks of
// bh x bw pixels, each block's pixels and channels made one pixel of bh bw C channels:
//
//   y[n][i][j][(a bw + b) C + c] = x[n][c][i bh + a - pt][j bw + b - pl]     (0 outside x,
//                                                                             and in channels >= bh bw C)
//
// With the weight given the same form without padding, w'[k][r'][s'][(a bw + b) C + c] =
// w[k][c][r' bh + a][s' bw + b] (0 past kh, kw), output pixel (oh, ow) is the sum over taps (r', s')
// of ceil(kh / bh) x ceil(kw / bw) of w' . y[oh + r'][ow + s']: tap (r, s) = (r' bh + a, s' bw + b)
// reads x row oh sh + r - pt = (oh + r') bh + a - pt. Three channels at stride 2 become 12 (16 in
// 16 bits), a pixel of 16-byte pieces the GEMM copies whole, where it gathered 8 bytes (3 channels
// padded to 4) for every tap. ROUND_TF32 rounds float32 to TF32 on the way (the GEMM reads it as is).
//
// One thread per 16-byte vector of y (VEC elements, Cs a multiple of VEC): coalesced 16-byte stores.
// (Measured against two other forms on the H200, fp16: a block per 64 pixels of a row loading its
// input rows into shared memory first, and a thread per pixel writing all its vectors, were 1.1-1.2x
// slower on AlexNet's conv1 and no faster on ResNet-50's stem: benchmarks/NOTES.md.)
// SRC_NHWC: x is [N][H][W][C] (an NHWC input, a KHWC weight), else [N][C][H][W] (NCHW, KCHW).
#include "dtypes.cuh"

namespace cupyconv {

template <typename T, bool ROUND_TF32, bool SRC_NHWC>
__global__ void __launch_bounds__(256)
space_to_depth(const T* __restrict__ x, T* __restrict__ y, int N, int C, int H, int W, int Hs, int Ws, int Cs,
               int bh, int bw, int pt, int pl) {
    constexpr int VEC = 16 / sizeof(T);
    const int vectors = Cs / VEC;
    const long long t = static_cast<long long>(blockIdx.x) * 256 + threadIdx.x;
    const long long total = static_cast<long long>(N) * Hs * Ws * vectors;
    if (t >= total) return;
    long long pixel;
    int v;
    if (total <= 0xffffffffLL) {  // 32-bit divisions where they suffice
        pixel = static_cast<unsigned>(t) / static_cast<unsigned>(vectors);
    } else {
        pixel = t / vectors;
    }
    v = static_cast<int>(t - pixel * vectors);
    const long long row = pixel / Ws;
    const int j = static_cast<int>(pixel - row * Ws);
    const long long n = row / Hs;
    const int i = static_cast<int>(row - n * Hs);
    // Element e of the vector is channel ch = v VEC + e of y: (a, b, c) stepped in mixed radix.
    const int ch = v * VEC;
    int c = ch % C, ab = ch / C;
    int a = ab / bw, b = ab - a * bw;
    alignas(16) T values[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
        const int ih = i * bh + a - pt, iw = j * bw + b - pl;
        T value{};
        if (a < bh && static_cast<unsigned>(ih) < static_cast<unsigned>(H) &&
            static_cast<unsigned>(iw) < static_cast<unsigned>(W)) {
            const long long at = SRC_NHWC ? ((n * H + ih) * W + iw) * C + c : ((n * C + c) * H + ih) * W + iw;
            value = x[at];
            if constexpr (ROUND_TF32) {
                unsigned r;
                asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(value));
                value = __uint_as_float(r);
            }
        }
        values[e] = value;
        if (++c == C) {
            c = 0;
            if (++b == bw) { b = 0; ++a; }
        }
    }
    *reinterpret_cast<uint4*>(y + t * VEC) = *reinterpret_cast<const uint4*>(values);
}

}  // namespace cupyconv
