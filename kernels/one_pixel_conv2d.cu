// 1x1 convolution of one-pixel planes, (N, C, 1, 1) -> (N, K, 1, 1): a matrix-vector product per image,
//   y[n][k] = sum_c x[n][c] w[k][c]
// squeeze-and-excitation's layers after their pooling (EfficientNet, MobileNetV3, RegNet). NCHW and NHWC
// are the same memory here, and so are KCHW and KHWC weights: x is [N][C], w [K][C], y [N][K].
//
// The GEMM kernels run such a layer as one pixel tile of mostly padding, and a long reduction (1152 -> 48)
// on the few channel tiles as split-K: a second launch adds the partial sums. Here one warp computes one
// output channel for IMAGES images in one launch: its lanes stride over the channels in pieces of VEC
// elements (16 bytes where C and the operands allow, else one element), UNROLL pieces' loads in flight,
// each lane's products summed in float (double for float64) in channel order, then the lanes' sums by a
// butterfly of shuffles: a fixed order, so the result is the same bits on every run. Strict float32 is
// IEEE fmaf; float32 in TF32 mode runs the same (more exact than TF32). Grid (ceil(K / WARPS), ceil(N /
// IMAGES)); lane i stores image i's output through the epilogue (epilogue.cuh: bias, residual, activation).
#include "epilogue.cuh"

namespace cupyconv {

constexpr int ONE_PIXEL_WARPS = 4;

template <typename T, int IMAGES, int VEC>
__global__ void __launch_bounds__(ONE_PIXEL_WARPS * 32)
one_pixel_conv2d(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias, T* __restrict__ y,
                 int has_bias, const T* __restrict__ residual, int has_residual, int activation,
                 int N, int C, int H, int W, int K, int Ho, int Wo, int kh, int kw,
                 int sh, int sw, int pt, int pl, int dh, int dw, int groups) {
    using Acc = typename accumulator<T>::type;
    using Piece = Pack<T, VEC>;
    // Loads in flight per lane: UNROLL pieces of w and of each image's x, within ~64 registers of pieces.
    constexpr int PIECE_WORDS = (int)sizeof(Piece) / 4 > 0 ? (int)sizeof(Piece) / 4 : 1;
    constexpr int UNROLL_BY_REGISTERS = 64 / (PIECE_WORDS * (IMAGES + 1));
    constexpr int UNROLL = UNROLL_BY_REGISTERS < 1 ? 1 : (UNROLL_BY_REGISTERS > 8 ? 8 : UNROLL_BY_REGISTERS);
    const int lane = threadIdx.x % 32;
    const int k = blockIdx.x * ONE_PIXEL_WARPS + threadIdx.x / 32;
    const int n0 = blockIdx.y * IMAGES;
    if (k >= K) return;  // whole warps: the shuffles below see every lane of a warp that passes
    const int pieces = C / VEC;
    const Piece* wk = reinterpret_cast<const Piece*>(w + static_cast<long long>(k) * C);
    const Piece* xn = reinterpret_cast<const Piece*>(x + static_cast<long long>(n0) * C);

    Acc acc[IMAGES];
#pragma unroll
    for (int i = 0; i < IMAGES; ++i) acc[i] = Acc(0);
    for (int base = lane; base < pieces; base += 32 * UNROLL) {
        Piece wp[UNROLL], xp[UNROLL][IMAGES];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int p = base + 32 * u;
            wp[u] = load_or_zero(wk + p, p < pieces);
#pragma unroll
            for (int i = 0; i < IMAGES; ++i)
                xp[u][i] = load_or_zero(xn + static_cast<long long>(i) * pieces + p, p < pieces && n0 + i < N);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                const Acc wv = to_acc<Acc>(wp[u].v[e]);
#pragma unroll
                for (int i = 0; i < IMAGES; ++i) acc[i] = fma(wv, to_acc<Acc>(xp[u][i].v[e]), acc[i]);
            }
    }
#pragma unroll
    for (int i = 0; i < IMAGES; ++i)
#pragma unroll
        for (int offset = 16; offset > 0; offset /= 2) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], offset);

    Acc sum = acc[0];
#pragma unroll
    for (int i = 1; i < IMAGES; ++i)
        if (lane == i) sum = acc[i];
    if (lane >= IMAGES || n0 + lane >= N) return;
    if (has_bias) sum += to_acc<Acc>(bias[k]);
    const long long at = static_cast<long long>(n0 + lane) * K + k;
    with_epilogue<T>(residual, [&](auto finish) { y[at] = finish(sum, at); });
}

}  // namespace cupyconv
