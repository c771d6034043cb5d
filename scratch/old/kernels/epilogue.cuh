// The epilogue every convolution kernel ends with: y = activation(acc + bias + residual), computed in
// the accumulator type (float; double for float64) and rounded once to the storage type.
//
// The activation is a kernel argument that with_epilogue turns into a template parameter of the
// stores (one copy of them per activation inside each instance), not a template parameter of the
// kernels: seven activations would make seven copies of every tile specialisation (thousands of NVRTC
// instances, each compiled and checked for spills). The codes are ACTIVATIONS' indices in
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
// (erf) form, torch's default. ACT is a compile-time constant: with_epilogue picks the instance once
// per thread, so the stores never carry the other activations' code.
template <int ACT, typename Acc> __device__ __forceinline__ Acc activate(Acc v) {
    if constexpr (ACT == ACT_RELU) return v < Acc(0) ? Acc(0) : v;
    else if constexpr (ACT == ACT_RELU6) return v < Acc(0) ? Acc(0) : (v > Acc(6) ? Acc(6) : v);
    else if constexpr (ACT == ACT_SILU) return v / (Acc(1) + exp_of(-v));
    else if constexpr (ACT == ACT_GELU) return Acc(0.5) * v * (Acc(1) + erf_of(v * Acc(0.70710678118654752440)));
    else if constexpr (ACT == ACT_SIGMOID) return Acc(1) / (Acc(1) + exp_of(-v));
    else if constexpr (ACT == ACT_TANH) return tanh_of(v);
    else return v;
}

// The output element at offset i, of type Out, from the sum v (accumulators plus bias): plainly
// rounded, or through the epilogue with activation ACT.
//
// VECTOR_RESIDUAL: the finish of a call with a residual, for stores of 16-byte vectors that read
// the residual as vectors themselves and hand each element to with_residual(v, e) (MAY_READ_RESIDUAL).
template <typename Out> struct plain_finish {
    static constexpr bool MAY_READ_RESIDUAL = false;
    template <typename Acc, typename Index> __device__ __forceinline__ Out operator()(Acc v, Index) const {
        return from_acc<Out>(v);
    }
};

template <typename Out, int ACT, typename T, bool VECTOR_RESIDUAL = false> struct fused_finish {
    static constexpr bool MAY_READ_RESIDUAL = VECTOR_RESIDUAL;
    const T* __restrict__ residual;
    int has_residual;
    template <typename Acc, typename Index> __device__ __forceinline__ Out operator()(Acc v, Index i) const {
        if (has_residual) v += to_acc<Acc>(residual[i]);
        return from_acc<Out>(activate<ACT>(v));
    }
    template <typename Acc, typename R> __device__ __forceinline__ Out with_residual(Acc v, R e) const {
        static_assert(VECTOR_RESIDUAL, "the finish of a call with a residual");
        return from_acc<Out>(activate<ACT>(v + to_acc<Acc>(e)));
    }
};

// The 16 bytes at p (16-byte aligned) as a V, loaded where the call stands: the compiler sinks a
// plain load towards its use, past the bound checks and stores between (several rows' residual
// vectors, loaded together, became one row's load at a time), but not an asm volatile one.
template <typename V> __device__ __forceinline__ V load_vector_here(const void* p) {
    static_assert(sizeof(V) == 16, "16-byte vectors");
    V v;
    unsigned* u = reinterpret_cast<unsigned*>(&v);
    asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(u[0]), "=r"(u[1]), "=r"(u[2]), "=r"(u[3]) : "l"(p));
    return v;
}

// Runs body(finish) with the finish (above) of this call's epilogue, chosen once per thread outside
// the stores: Out is the storage type T, or float for split-K's partial sums (which pass
// has_residual 0 and ACT_NONE). A per-element switch made the memory-bound GEMMs up to 1.7x slower
// without an epilogue and 5x with one (every activation's code issued, predicated off;
// benchmarks/NOTES.md). Each activation is its own copy of the body's stores in every instance.
// VECTOR_RESIDUAL: calls with a residual and no activation (inverted residual blocks' projections)
// or relu (ResNet's) take finishes of their own, whose stores may read it as vectors, while the
// others keep stores that read its elements: two more copies of the stores, not seven (a float32 TMA
// instance has 5.8 thousand instructions without them, 6.0 with two, 8.0 with seven).
template <typename Out, bool VECTOR_RESIDUAL = false, typename T, typename Body>
__device__ __forceinline__ void with_epilogue(const T* __restrict__ residual, int has_residual, int activation,
                                              Body&& body) {
    if (!has_residual && activation == ACT_NONE) {
        body(plain_finish<Out>{});
        return;
    }
    if constexpr (VECTOR_RESIDUAL) {
        if (has_residual && activation == ACT_NONE) {
            body(fused_finish<Out, ACT_NONE, T, true>{residual, has_residual});
            return;
        }
        if (has_residual && activation == ACT_RELU) {
            body(fused_finish<Out, ACT_RELU, T, true>{residual, has_residual});
            return;
        }
    }
    switch (activation) {
        case ACT_RELU: body(fused_finish<Out, ACT_RELU, T>{residual, has_residual}); break;
        case ACT_RELU6: body(fused_finish<Out, ACT_RELU6, T>{residual, has_residual}); break;
        case ACT_SILU: body(fused_finish<Out, ACT_SILU, T>{residual, has_residual}); break;
        case ACT_GELU: body(fused_finish<Out, ACT_GELU, T>{residual, has_residual}); break;
        case ACT_SIGMOID: body(fused_finish<Out, ACT_SIGMOID, T>{residual, has_residual}); break;
        case ACT_TANH: body(fused_finish<Out, ACT_TANH, T>{residual, has_residual}); break;
        default: body(fused_finish<Out, ACT_NONE, T>{residual, has_residual}); break;
    }
}

}  // namespace cupyconv
