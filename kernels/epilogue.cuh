// The epilogue every convolution kernel ends with: y = activation(acc + bias + residual), computed in
// the accumulator type (float; double for float64) and rounded once to the storage type.
//
// Each module is compiled for one epilogue: CUPYCONV_ACTIVATION (ACTIVATIONS' index in
// cupyconv/arguments.py) and CUPYCONV_RESIDUAL (0 or 1), NVRTC -D options that cupyconv/compiler.py
// takes from the launch's own epilogue arguments (program.Launch.epilogue). A kernel carrying every
// activation's copy of its stores was up to 20x larger (the 128 x 128 ping-pong tile: 520 KB of code,
// 25 KB with one), and when a model's other layers had pushed that code out of L2, fetching it again
// cost ~2 us a launch (benchmarks/NOTES.md, "One epilogue a module"). The kernels keep the runtime
// arguments (has_residual, activation), which equal the module's. The residual (has_residual) is an array
// of the output's shape and layout, read at the output element's own offset, so the caller's output
// may be the residual itself.
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

#if !defined(CUPYCONV_ACTIVATION) || !defined(CUPYCONV_RESIDUAL)
#error "compile with -DCUPYCONV_ACTIVATION=<code> -DCUPYCONV_RESIDUAL=<0|1> (cupyconv/compiler.py does)"
#endif

// Runs body(finish) with the finish (above) of the module's epilogue: Out is the storage type T, or
// float for split-K's partial sums (whose launches pass has_residual 0 and ACT_NONE, and are compiled
// for them). The kernels' runtime has_residual and activation equal the module's by construction: the
// compiled epilogue is read off the launch's arguments, and tests/test_programs.py checks that every
// family's launches carry them typed (a check here made the float32 ping-pong cluster tile and a
// stream-K tile spill). VECTOR_RESIDUAL: with a residual and no activation (inverted residual blocks'
// projections) or relu (ResNet's), the body's stores may read the residual as 16-byte vectors
// (finish.with_residual); with the others they read its elements (with gelu the vector stores
// spilled in the float32 ping-pong cluster tile).
template <typename Out, bool VECTOR_RESIDUAL = false, typename T, typename Body>
__device__ __forceinline__ void with_epilogue(const T* __restrict__ residual, Body&& body) {
    constexpr int ACT = CUPYCONV_ACTIVATION;
    constexpr bool RESIDUAL = CUPYCONV_RESIDUAL != 0;
    if constexpr (!RESIDUAL && ACT == ACT_NONE)
        body(plain_finish<Out>{});
    else if constexpr (RESIDUAL && VECTOR_RESIDUAL && (ACT == ACT_NONE || ACT == ACT_RELU))
        body(fused_finish<Out, ACT, T, true>{residual, 1});
    else
        body(fused_finish<Out, ACT, T>{residual, RESIDUAL});
}

}  // namespace cupyconv
