// The input scale of a convolution whose kernel does not apply it (cupyconv/input_scale.py):
//   y[i] = x[i] * scale[n][c]        x and y [N][C][H W] (NCHW) or [N][H W][C] (NHWC), scale [N][C]
// computed in the accumulator type and rounded once to the storage type, as torch's x * scale rounds:
// every family then convolves the same scaled input as the kernels that scale it in their loads.
// Each thread takes VEC consecutive elements, one vector load and store (VEC divides C in NHWC, H W in
// NCHW: they share one image and, in NCHW, one channel).
#include "dtypes.cuh"

namespace cupyconv {

template <typename T, typename Index, bool NHWC, int VEC>
__global__ void __launch_bounds__(256)
scale_channels(const T* __restrict__ x, const T* __restrict__ scale, T* __restrict__ y, int N, int C, int HW) {
    using Acc = typename accumulator<T>::type;
    using Vec = Pack<T, VEC>;
    const Index vectors = static_cast<Index>(N) * C * HW / VEC;
    for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < vectors;
         i += static_cast<Index>(gridDim.x) * blockDim.x) {
        const Index first = i * VEC;
        const Index n = first / (static_cast<Index>(C) * HW);
        const int c = NHWC ? static_cast<int>(first % C) : static_cast<int>((first / HW) % C);
        Vec v = reinterpret_cast<const Vec*>(x)[i];
#pragma unroll
        for (int e = 0; e < VEC; ++e)
            v.v[e] = from_acc<T>(to_acc<Acc>(v.v[e]) * to_acc<Acc>(scale[n * C + c + (NHWC ? e : 0)]));
        reinterpret_cast<Vec*>(y)[i] = v;
    }
}

}  // namespace cupyconv
