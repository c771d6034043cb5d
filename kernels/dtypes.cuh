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

// v rounded to TF32 (cvt.rna) where ROUND_TF32, else v: float32 operands of the TF32 tensor cores
// rounded once where they are copied, so that the GEMM feeds their words to the mma unchanged.
template <bool ROUND_TF32, typename T> __device__ __forceinline__ T tf32_rounded_if(T v) {
    if constexpr (ROUND_TF32) {
        unsigned r;
        asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
        return __uint_as_float(r);
    } else {
        return v;
    }
}

// N values of T loaded or stored as one vector (aligned to its N sizeof(T) bytes).
template <typename T, int N> struct alignas(N * sizeof(T)) Pack {
    T v[N];
};

// The vector at `at`, or zeros where `inside` is false, as one predicated load of whole words: a
// select of 16-bit fields costs a PRMT apiece. Vec is at most 16 bytes, aligned to its size.
template <int BYTES> struct alignas(BYTES) storage_words { unsigned w[BYTES / 4]; };
template <> struct alignas(2) storage_words<2> { unsigned short w[1]; };
template <typename Vec> __device__ __forceinline__ Vec load_or_zero(const Vec* at, bool inside) {
    using Words = storage_words<sizeof(Vec)>;
    union {
        Words words;
        Vec vec;
    } u;
    u.words = inside ? *reinterpret_cast<const Words*>(at) : Words{};
    return u.vec;
}

// N storage values widened to the accumulator type. Pairs of 16-bit values widen from the 32-bit word
// that holds them (fp16: a cvt of each half, which ptxas reads in place; bf16: a shift and a mask):
// value by value, ptxas first moved each into a register of its own, a PRMT apiece.
template <typename Acc, typename T, int N>
__device__ __forceinline__ void widen(Acc (&out)[N], const T (&in)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_acc<Acc>(in[i]);
}
template <int N> __device__ __forceinline__ void widen(float (&out)[N], const half_t (&in)[N]) {
#pragma unroll
    for (int i = 0; i + 1 < N; i += 2) {
        const unsigned word = *reinterpret_cast<const unsigned*>(&in[i]);  // 4-byte aligned: i even, in vectors
        asm("{.reg .b16 lo, hi;\n mov.b32 {lo, hi}, %2;\n cvt.f32.f16 %0, lo;\n cvt.f32.f16 %1, hi;}"
            : "=f"(out[i]), "=f"(out[i + 1]) : "r"(word));
    }
    if constexpr (N % 2 == 1) out[N - 1] = to_acc<float>(in[N - 1]);
}
template <int N> __device__ __forceinline__ void widen(float (&out)[N], const bfloat16_t (&in)[N]) {
#pragma unroll
    for (int i = 0; i + 1 < N; i += 2) {
        const unsigned word = *reinterpret_cast<const unsigned*>(&in[i]);  // 4-byte aligned: i even, in vectors
        out[i] = __uint_as_float(word << 16);
        out[i + 1] = __uint_as_float(word & 0xffff0000u);
    }
    if constexpr (N % 2 == 1) out[N - 1] = to_acc<float>(in[N - 1]);
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
