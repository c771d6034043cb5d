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
// A block copies SPACE_TO_DEPTH_PIXELS pixels of one row i of y: it loads the bh input rows those pixels
// read (their bw SPACE_TO_DEPTH_PIXELS columns, every channel) into shared memory, coalesced along x's
// memory, zeros where they lie outside x, then writes the pixels' Cs channels as 16-byte vectors,
// contiguous in y. Grid (ceil(Ws / SPACE_TO_DEPTH_PIXELS), Hs, N), 256 threads; bh bw C <= 64 (the
// planner's SPACE_TO_DEPTH_MAX_CHANNELS). SRC_NHWC: x is [N][H][W][C] (an NHWC input, a KHWC weight),
// else [N][C][H][W] (NCHW, KCHW).
#include "dtypes.cuh"

namespace cupyconv {

constexpr int SPACE_TO_DEPTH_PIXELS = 64;

template <typename T, bool ROUND_TF32, bool SRC_NHWC>
__global__ void __launch_bounds__(256)
space_to_depth(const T* __restrict__ x, T* __restrict__ y, int C, int H, int W, int Hs, int Ws, int Cs,
               int bh, int bw, int pt, int pl) {
    constexpr int VEC = 16 / sizeof(T);
    __shared__ T rows[SPACE_TO_DEPTH_PIXELS * 64];  // [bh][bw SPACE_TO_DEPTH_PIXELS columns][C]
    const int j0 = blockIdx.x * SPACE_TO_DEPTH_PIXELS, i = blockIdx.y;
    const long long n = blockIdx.z;
    const int columns = bw * SPACE_TO_DEPTH_PIXELS, iw0 = j0 * bw - pl;
    auto tf32 = [](T v) {
        if constexpr (ROUND_TF32) {
            unsigned r;
            asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
            return __uint_as_float(r);
        } else {
            return v;
        }
    };
    for (int a = 0; a < bh; ++a) {
        const int ih = i * bh + a - pt;
        const bool row_in = static_cast<unsigned>(ih) < static_cast<unsigned>(H);
        T* row = rows + a * columns * C;
        if constexpr (SRC_NHWC) {  // the row's columns x channels are contiguous in x
            const long long base = ((n * H + ih) * W + iw0) * C;
            for (int e = threadIdx.x; e < columns * C; e += 256) {
                const bool in = row_in && static_cast<unsigned>(iw0 * C + e) < static_cast<unsigned>(W * C);
                row[e] = in ? tf32(x[base + e]) : T{};
            }
        } else {
            for (int c = 0; c < C; ++c) {
                const long long base = ((n * C + c) * H + ih) * W + iw0;
                for (int col = threadIdx.x; col < columns; col += 256) {
                    const bool in = row_in && static_cast<unsigned>(iw0 + col) < static_cast<unsigned>(W);
                    row[col * C + c] = in ? tf32(x[base + col]) : T{};
                }
            }
        }
    }
    __syncthreads();
    const int vectors = Cs / VEC, pixels = min(SPACE_TO_DEPTH_PIXELS, Ws - j0);
    T* out = y + ((n * Hs + i) * Ws + j0) * Cs;
    for (int t = threadIdx.x; t < pixels * vectors; t += 256) {
        const int jj = t / vectors, v = t - jj * vectors;
        // Element e of the vector is channel v VEC + e: (a, b, c) stepped in mixed radix.
        const int ch = v * VEC;
        int c = ch % C, ab = ch / C;
        int a = ab / bw, b = ab - a * bw;
        alignas(16) T values[VEC];
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
            values[e] = a < bh ? rows[(a * columns + jj * bw + b) * C + c] : T{};
            if (++c == C) {
                c = 0;
                if (++b == bw) { b = 0; ++a; }
            }
        }
        *reinterpret_cast<uint4*>(out + static_cast<long long>(t) * VEC) = *reinterpret_cast<const uint4*>(values);
    }
}

}  // namespace cupyconv
