// The input scale of a convolution whose kernel does not apply it (cupyconv/input_scale.py):
//   y[i] = x[i] * scale[n][c]        x and y [N][C][H W] (NCHW) or [N][H W][C] (NHWC), scale [N][C]
// computed in the accumulator type and rounded once to the storage type, as torch's x * scale rounds:
// every family then convolves the same scaled input as the kernels that scale it in their loads.
#include "dtypes.cuh"

namespace cupyconv {

template <typename T, typename Index, bool NHWC>
__global__ void __launch_bounds__(256)
scale_channels(const T* __restrict__ x, const T* __restrict__ scale, T* __restrict__ y, int N, int C, int HW) {
    using Acc = typename accumulator<T>::type;
    const Index total = static_cast<Index>(N) * C * HW;
    for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += static_cast<Index>(gridDim.x) * blockDim.x) {
        const Index n = i / (static_cast<Index>(C) * HW);
        const int c = NHWC ? static_cast<int>(i % C) : static_cast<int>((i / HW) % C);
        y[i] = from_acc<T>(to_acc<Acc>(x[i]) * to_acc<Acc>(scale[n * C + c]));
    }
}

}  // namespace cupyconv
