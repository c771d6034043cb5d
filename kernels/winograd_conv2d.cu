// Winograd F(2x2, 3x3) for strict float32: 3x3, stride-1, undilated, ungrouped convolutions with 2.25x
// fewer multiplies than the direct sum (Lavin and Gray, "Fast Algorithms for Convolutional Neural
// Networks", 2016). Every 2x2 output tile is  Y = A^T [ sum_c (G g G^T) .* (B^T d B) ] A  with d the
// tile's 4x4 input patch and g the 3x3 filter; the sum over c, for each of the 16 positions xi of the
// 4x4 transformed tile, is a GEMM  M[xi] = V[xi] U[xi]  ([tiles x C] x [C x K]).
//
// Three kernels here, and simt_gemm_conv2d.cu between them:
//   winograd_weight_transform  w [K][C][3][3]          -> U [16][C][Kp]   (G g G^T; Kp = K rounded up to 4)
//   winograd_input_transform   x [N][C][H][W]          -> V [16][C][T]    (B^T d B; T = N tiles_h tiles_w)
//   simt_gemm_conv2d           V as a 16-group 1x1 convolution of one image of 1 x T pixels, U as its
//                              transposed weight      -> M [16][K][T]
//   winograd_output_transform  M                       -> y [N][K][Ho][Wo] (A^T m A + bias)
// V and M are laid out tile-contiguous so that the GEMM's gather is the 1x1 case (a warp reads 128
// contiguous bytes) and each transform reads and writes along tiles, coalesced. They cost 4x the
// input and 4x the output in memory traffic: the planner takes this path only where the multiplies
// saved outweigh it (many channels).
// The transforms' coefficients are 0, +-1 and 1/2: exact in float32, so the error stays near the
// direct sum's (~1e-6 relative on random data).
#include "dtypes.cuh"

namespace cupyconv {

// One thread per (c, k) pair, k fastest: U[xi][c][k] = (G g G^T)[xi], zero for k >= K.
//   G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1]
template <typename Index>
__global__ void __launch_bounds__(256)
winograd_weight_transform(const float* __restrict__ w, float* __restrict__ u, int C, int K, int Kp) {
    const Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= static_cast<Index>(C) * Kp) return;
    const int c = static_cast<int>(i / Kp), k = static_cast<int>(i - static_cast<Index>(c) * Kp);
    float g[3][3];
#pragma unroll
    for (int r = 0; r < 3; ++r)
#pragma unroll
        for (int s = 0; s < 3; ++s) g[r][s] = k < K ? w[(static_cast<Index>(k) * C + c) * 9 + r * 3 + s] : 0.0f;
    float t[4][3];  // G g
#pragma unroll
    for (int s = 0; s < 3; ++s) {
        t[0][s] = g[0][s];
        t[1][s] = 0.5f * (g[0][s] + g[1][s] + g[2][s]);
        t[2][s] = 0.5f * (g[0][s] - g[1][s] + g[2][s]);
        t[3][s] = g[2][s];
    }
    const Index plane = static_cast<Index>(C) * Kp;
#pragma unroll
    for (int r = 0; r < 4; ++r) {  // (G g) G^T
        const float row[4] = {t[r][0], 0.5f * (t[r][0] + t[r][1] + t[r][2]), 0.5f * (t[r][0] - t[r][1] + t[r][2]),
                              t[r][2]};
#pragma unroll
        for (int q = 0; q < 4; ++q) u[(r * 4 + q) * plane + i] = row[q];
    }
}

// One thread per (c, tile), tile fastest (tiles of one row are neighbours, so a warp's reads overlap
// in L1): V[xi][c][t] = (B^T d B)[xi] with d the 4x4 patch at (2 th - pt, 2 tw - pl), zeros outside.
//   B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]
template <typename Index>
__global__ void __launch_bounds__(256)
winograd_input_transform(const float* __restrict__ x, float* __restrict__ v, int N, int C, int H, int W,
                         int pt, int pl, int tiles_h, int tiles_w) {
    const Index T = static_cast<Index>(N) * tiles_h * tiles_w;
    const Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= T * C) return;
    const Index c = i / T, t = i - c * T;
    const Index image_row = t / tiles_w;
    const int tw = static_cast<int>(t - image_row * tiles_w);
    const Index image = image_row / tiles_h;
    const int th = static_cast<int>(image_row - image * tiles_h);
    const float* plane = x + (image * C + c) * H * W;
    const int ih0 = 2 * th - pt, iw0 = 2 * tw - pl;
    float d[4][4];
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            const int ih = ih0 + r, iw = iw0 + s;
            d[r][s] = static_cast<unsigned>(ih) < static_cast<unsigned>(H) && static_cast<unsigned>(iw) < static_cast<unsigned>(W)
                          ? plane[static_cast<Index>(ih) * W + iw] : 0.0f;
        }
    float b[4][4];  // B^T d
#pragma unroll
    for (int s = 0; s < 4; ++s) {
        b[0][s] = d[0][s] - d[2][s];
        b[1][s] = d[1][s] + d[2][s];
        b[2][s] = d[2][s] - d[1][s];
        b[3][s] = d[1][s] - d[3][s];
    }
    const Index plane_v = T * C;
#pragma unroll
    for (int r = 0; r < 4; ++r) {  // (B^T d) B
        const float row[4] = {b[r][0] - b[r][2], b[r][1] + b[r][2], b[r][2] - b[r][1], b[r][1] - b[r][3]};
#pragma unroll
        for (int q = 0; q < 4; ++q) v[(r * 4 + q) * plane_v + i] = row[q];
    }
}

// One thread per (k, tile), tile fastest: the 2x2 outputs A^T m A (+ bias) of the 16 M[xi][k][t].
//   A^T = [1 1 1 0; 0 1 -1 -1]
template <typename Index>
__global__ void __launch_bounds__(256)
winograd_output_transform(const float* __restrict__ m, const float* __restrict__ bias, float* __restrict__ y,
                          int has_bias, int N, int K, int Ho, int Wo, int tiles_h, int tiles_w) {
    const Index T = static_cast<Index>(N) * tiles_h * tiles_w;
    const Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= T * K) return;
    const Index k = i / T, t = i - k * T;
    const Index image_row = t / tiles_w;
    const int tw = static_cast<int>(t - image_row * tiles_w);
    const Index image = image_row / tiles_h;
    const int th = static_cast<int>(image_row - image * tiles_h);
    const Index plane_m = T * K;
    float a[4][4];
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int q = 0; q < 4; ++q) a[r][q] = m[(r * 4 + q) * plane_m + i];
    float s[2][4];  // A^T m
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        s[0][q] = a[0][q] + a[1][q] + a[2][q];
        s[1][q] = a[1][q] - a[2][q] - a[3][q];
    }
    const float b = has_bias ? bias[k] : 0.0f;
    float* out = y + (image * K + k) * Ho * Wo;
#pragma unroll
    for (int r = 0; r < 2; ++r) {  // (A^T m) A
        const int oh = 2 * th + r;
        const float row[2] = {s[r][0] + s[r][1] + s[r][2] + b, s[r][1] - s[r][2] - s[r][3] + b};
#pragma unroll
        for (int q = 0; q < 2; ++q) {
            const int ow = 2 * tw + q;
            if (oh < Ho && ow < Wo) out[static_cast<Index>(oh) * Wo + ow] = row[q];
        }
    }
}

}  // namespace cupyconv
