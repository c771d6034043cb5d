// The epilogue every convolution kernel ends with: y = activation(acc + bias + residual), computed in
// the accumulator type (float; double for float64) and rounded once to the storage type.
//
// The activation is a kernel argument, not a template parameter: seven activations would make seven
// copies of every tile specialisation (thousands of NVRTC instances, each compiled and checked for
// spills), and the branch it costs is uniform across the grid, taken once per output element in an
// epilogue whose time is its loads and stores. The codes are ACTIVATIONS' indices in
// cupyconv/arguments.py. The residual (has_residual) is an array of the output's shape and layout,
// read at the output element's own offset, so the caller's output may be the residual itself.
#pragma once

#include "dtypes.cuh"

namespace cupyconv {

enum Activation { ACT_NONE = 0, ACT_RELU = 1, ACT_RELU6 = 2, ACT_SILU = 3, ACT_GELU = 4, ACT_SIGMOID = 5, ACT_TANH = 6 };

__device__ __forceinline__ float exp_of(float v) { return expf(v); }
__device__ __forceinline__ double exp_of(double v) { return exp(v); }
__device__ __forceinline__ float erf_of(float v) { return erff(v); }
__device__ __forceinline__ double erf_of(double v) { return erf(v); }
__device__ __forceinline__ float tanh_of(float v) { return tanhf(v); }
__device__ __forceinline__ double tanh_of(double v) { return tanh(v); }

// torch's definitions: relu and relu6 keep NaN (a comparison with NaN is false); gelu is the exact
// (erf) form, torch's default.
template <typename Acc> __device__ __forceinline__ Acc activate(Acc v, int activation) {
    switch (activation) {
        case ACT_RELU: return v < Acc(0) ? Acc(0) : v;
        case ACT_RELU6: return v < Acc(0) ? Acc(0) : (v > Acc(6) ? Acc(6) : v);
        case ACT_SILU: return v / (Acc(1) + exp_of(-v));
        case ACT_GELU: return Acc(0.5) * v * (Acc(1) + erf_of(v * Acc(0.70710678118654752440)));
        case ACT_SIGMOID: return Acc(1) / (Acc(1) + exp_of(-v));
        case ACT_TANH: return tanh_of(v);
        default: return v;
    }
}

// The output element at offset i, of type Out (the storage type T, or float for split-K's partial
// sums, which pass has_residual 0 and ACT_NONE): ``v`` is the accumulated sum plus the bias.
template <typename Out, typename T, typename Acc, typename Index>
__device__ __forceinline__ Out epilogue(Acc v, const T* __restrict__ residual, int has_residual, int activation,
                                        Index i) {
    if (has_residual) v += to_acc<Acc>(residual[i]);
    return from_acc<Out>(activate(v, activation));
}

// Runs body(finish), finish(v, i) giving the output element at offset i of the sum v: the plain
// rounding where the call has no epilogue, else epilogue(). The choice is made once per thread,
// outside the stores: a per-element branch and switch made memory-bound GEMMs up to 1.7x slower
// (benchmarks/NOTES.md). Both paths are compiled into every instance.
template <typename Out, typename T, typename Body>
__device__ __forceinline__ void with_epilogue(const T* __restrict__ residual, int has_residual, int activation,
                                              Body&& body) {
    if (!has_residual && activation == ACT_NONE) {
        body([](auto v, auto) { return from_acc<Out>(v); });
    } else {
        body([=](auto v, auto i) { return epilogue<Out>(v, residual, has_residual, activation, i); });
    }
}

}  // namespace cupyconv
