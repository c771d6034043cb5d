// Storage types and their conversion to the accumulator type.
//
// The kernels are compiled by NVRTC with no CUDA include directory on the search path (a machine
// without the CUDA toolkit must still be able to compile them), so the 16-bit float types are
// plain 16-bit storage structs converted with PTX `cvt`, not cuda_fp16.h / cuda_bf16.h.
#pragma once

namespace cupyconv {

struct half_t { unsigned short bits; };
struct bfloat16_t { unsigned short bits; };

// A where Cond, else B (std::conditional; the kernels compile without standard headers).
template <bool Cond, typename A, typename B> struct select_type { using type = A; };
template <typename A, typename B> struct select_type<false, A, B> { using type = B; };

// Accumulator type: float for every storage type but double.
template <typename T> struct accumulator { using type = float; };
template <> struct accumulator<double> { using type = double; };

template <typename Acc, typename T> __device__ __forceinline__ Acc to_acc(T v) { return static_cast<Acc>(v); }
template <> __device__ __forceinline__ float to_acc<float, half_t>(half_t v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
    return f;
}
template <> __device__ __forceinline__ float to_acc<float, bfloat16_t>(bfloat16_t v) {
    return __uint_as_float(static_cast<unsigned>(v.bits) << 16);
}

template <typename T, typename Acc> __device__ __forceinline__ T from_acc(Acc v) { return static_cast<T>(v); }
template <> __device__ __forceinline__ half_t from_acc<half_t, float>(float v) {
    half_t h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(v));
    return h;
}
template <> __device__ __forceinline__ bfloat16_t from_acc<bfloat16_t, float>(float v) {
    bfloat16_t h;  // cvt.rn.bf16.f32 needs sm_80; cupyconv targets sm_80 and newer.
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.bits) : "f"(v));
    return h;
}

}  // namespace cupyconv
