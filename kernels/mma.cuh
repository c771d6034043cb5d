// Inline-PTX wrappers for the tensor-core path (sm_80 and newer): asynchronous copies, ldmatrix,
// TF32 rounding and warp-level mma.sync.
//
// PTX rather than cuda_pipeline.h / mma.h because the kernels compile with no CUDA include path
// (see dtypes.cuh). Every wrapper that reads or writes shared memory clobbers "memory", so the
// compiler keeps it ordered with the ordinary shared-memory accesses and barriers around it.
#pragma once

#include "dtypes.cuh"

namespace cupyconv {

__device__ __forceinline__ unsigned shared_address(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Global -> shared copy of 4, 8 or 16 bytes that bypasses registers, cached in L1 (.ca): the
// convolution gathers read each input element once per kernel tap, and L1 catches many of those
// (16-byte copies through L2 only, .cg, made the 5x9 seed 1.5x slower on the H100). With valid ==
// false the source size is 0: nothing is read and the destination is zero-filled, which is how
// padding and out-of-range rows and columns become zeros. `src` must still be a global address;
// callers pass the tensor's base.
template <int Bytes> __device__ __forceinline__ void cp_async(void* dst, const void* src, bool valid) {
    static_assert(Bytes == 4 || Bytes == 8 || Bytes == 16, "cp.async moves 4, 8 or 16 bytes");
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n"
                 :: "r"(shared_address(dst)), "l"(src), "n"(Bytes), "r"(valid ? Bytes : 0) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Wait until at most `Pending` committed groups are still in flight.
template <int Pending> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(Pending) : "memory");
}

// mbarriers in shared memory (sm_80+), for pipelines whose producer and consumer threads differ: a
// phase completes when `count` arrivals have come; waiters name the parity of the phase they need.
__device__ __forceinline__ void mbarrier_init(void* barrier, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(shared_address(barrier)), "r"(count) : "memory");
}

__device__ __forceinline__ void mbarrier_arrive(void* barrier) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(shared_address(barrier)) : "memory");
}

__device__ __forceinline__ void mbarrier_wait(void* barrier, int parity) {
    asm volatile("{\n"
                 ".reg .pred done;\n"
                 "WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra WAIT;\n"
                 "}\n" :: "r"(shared_address(barrier)), "r"(parity) : "memory");
}

// The k loop of a STAGES-deep shared-memory pipeline. Tile t lives in buffer t % STAGES; the loads
// for tile t + STAGES - 1 are issued (load(tile, buffer): cp.async, or global -> registers) before
// the MMAs of tile t (compute(buffer)), into the buffer tile t - 1 used, free once every warp passed
// the barrier; store(buffer) then writes what load left in registers, if anything. Ends with all
// copies landed and a barrier, so the buffers can be reused (the epilogue's staging area).
// ASYNC_PROXY: the tensor cores read the buffers through the async proxy (wgmma), so each thread
// fences its landed copies before the barrier. LAG: compute may return with the MMAs of its last LAG
// tiles still reading their buffers (asynchronous wgmma), so loads run LAG tiles less far ahead,
// into the buffer of tile t - 1 - LAG; the caller waits for the MMAs before reusing the buffers.
// retire() waits for all but the last LAG tiles' MMAs (asynchronous MMAs: compute(buffer) only issues
// them), after compute and the loads in either order. ISSUE_FIRST: tile t's MMAs are issued before
// the loads of tile t + STAGES - 1 - LAG, so the tensor cores work while the threads compute the next
// addresses and copies.
// landed(buffer), where given, runs once this thread's copies of the tile in ``buffer`` have landed and
// before the barrier: a thread may rewrite what it copied itself (the NHWC GEMM rounds float32 to TF32).
template <int STAGES, bool ASYNC_PROXY = false, int LAG = 0, bool ISSUE_FIRST = false, typename Load,
          typename Compute, typename Store, typename Landed, typename Retire>
__device__ __forceinline__ void run_k_pipeline(int k_tiles, Load&& load, Compute&& compute, Store&& store,
                                               Landed&& landed, Retire&& retire) {
    constexpr int AHEAD = STAGES - 1 - LAG;  // tiles loaded ahead of the one computed
    static_assert(AHEAD >= 1, "a stage to load into while computing");
#pragma unroll 1
    for (int t = 0; t < AHEAD; ++t) {
        if (t < k_tiles) {
            load(t, t);
            store(t);
        }
        cp_async_commit();  // empty groups keep the wait count below uniform
    }
    int read_stage = 0, write_stage = AHEAD;
#pragma unroll 1
    for (int t = 0; t < k_tiles; ++t) {
        cp_async_wait<AHEAD - 1>();   // tile t has landed (this thread's copies) ...
        landed(read_stage);
        if constexpr (ASYNC_PROXY)  // sm_90: shared memory written by cp.async, read next by the tensor cores
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();              // ... everyone's, and tile t - 1 - LAG's buffer is no longer read
        const int next = t + AHEAD;
        if constexpr (ISSUE_FIRST) compute(read_stage);
        if (next < k_tiles) load(next, write_stage);
        cp_async_commit();
        if constexpr (!ISSUE_FIRST) compute(read_stage);
        // All but the last LAG tiles' MMAs retire before the next barrier, after which the loads refill
        // tile t - LAG's buffer (the wgmma tiles with a lag had lost this wait in a9406d3).
        retire();
        if (next < k_tiles) store(write_stage);
        read_stage = read_stage + 1 == STAGES ? 0 : read_stage + 1;
        write_stage = write_stage + 1 == STAGES ? 0 : write_stage + 1;
    }
    cp_async_wait<0>();
    __syncthreads();
}

template <int STAGES, bool ASYNC_PROXY = false, int LAG = 0, typename Load, typename Compute, typename Store,
          typename Landed>
__device__ __forceinline__ void run_k_pipeline(int k_tiles, Load&& load, Compute&& compute, Store&& store,
                                               Landed&& landed) {
    run_k_pipeline<STAGES, ASYNC_PROXY, LAG, false>(k_tiles, load, compute, store, landed, [] {});
}

template <int STAGES, bool ASYNC_PROXY = false, int LAG = 0, typename Load, typename Compute, typename Store>
__device__ __forceinline__ void run_k_pipeline(int k_tiles, Load&& load, Compute&& compute, Store&& store) {
    run_k_pipeline<STAGES, ASYNC_PROXY, LAG, false>(k_tiles, load, compute, store, [](int) {}, [] {});
}

__device__ __forceinline__ unsigned to_tf32(float v) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return r;
}

// The same TF32 value as to_tf32 for the tensor cores alone, in two instructions instead of cvt.rna's three:
// half a TF32 unit in the last place added to a finite float's bits (to its magnitude: ties away from zero),
// its 13 low bits left, which the tensor cores do not read (sm_90's mma.sync and wgmma take a TF32 operand's
// top 19 bits; benchmarks/profile/tf32_bits.py checked the products bit for bit against cvt.rna's).
__device__ __forceinline__ unsigned to_tf32_for_mma(float v) {
    const unsigned bits = __float_as_uint(v);
    return isfinite(v) ? bits + 0x1000u : bits;
}

// The float32 accumulators of a warp's MT x NT instruction tiles, zeroed.
template <int MT, int NT> __device__ __forceinline__ void zero_accumulators(float (&acc)[MT][NT][4]) {
#pragma unroll
    for (int a = 0; a < MT; ++a)
#pragma unroll
        for (int b = 0; b < NT; ++b)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[a][b][e] = 0.0f;
}

// The TF32 A fragments of MT 16-row instruction tiles, 16 rows apart, from a k-major tile of floats
// (rows of k, STRIDE floats apart; no ldmatrix for 32-bit transposes), rounded to TF32: a0 (m, k),
// a1 (m + 8, k), a2 (m, k + 4), a3 (m + 8, k + 4). `at` points at row k = tq (PTX's threadID_in_group),
// column m = quad (groupID) of the first tile.
template <int STRIDE, int MT>
__device__ __forceinline__ void tf32_a_from_k_major(unsigned (&a)[MT][4], const float* at) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        a[mt][0] = to_tf32(at[mt * 16]);
        a[mt][1] = to_tf32(at[mt * 16 + 8]);
        a[mt][2] = to_tf32(at[4 * STRIDE + mt * 16]);
        a[mt][3] = to_tf32(at[4 * STRIDE + mt * 16 + 8]);
    }
}

// Rounds N consecutive floats at p (aligned to N floats) to TF32 in place, in one vector load and store.
template <int N> __device__ __forceinline__ void round_tf32_in_place(void* p) {
    static_assert(N == 1 || N == 2 || N == 4, "vectors of 1, 2 or 4 floats");
    struct alignas(4 * N) Floats { float v[N]; };
    Floats& at = *reinterpret_cast<Floats*>(p);
    Floats f = at;
#pragma unroll
    for (int e = 0; e < N; ++e) f.v[e] = __uint_as_float(to_tf32(f.v[e]));
    at = f;
}

// Four 8x8 16-bit matrices: lane i gives the address of row i % 8 of matrix i / 8 (rows of 16 bytes,
// 16-byte aligned) and receives, of each matrix, row i / 4, elements 2 (i % 4) and 2 (i % 4) + 1
// packed low/high -- or, with TRANS, column i / 4, rows 2 (i % 4) and 2 (i % 4) + 1.
template <bool TRANS = false> __device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* row) {
    if constexpr (TRANS) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(shared_address(row)) : "memory");
    } else {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(shared_address(row)) : "memory");
    }
}

// D = A B + D on one warp, float32 accumulators. A is 16 x K row-major, B is K x 8 column-major,
// with the fragment layouts of the PTX ISA ("Matrix Fragments for mma.m16n8k8 / m16n8k16").
// The storage type picks the instruction: float -> tf32 m16n8k8, half_t / bfloat16_t -> m16n8k16.
template <typename T> struct mma_op;

template <> struct mma_op<float> {
    static constexpr int k = 8;
    static __device__ __forceinline__ void run(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};

template <> struct mma_op<half_t> {
    static constexpr int k = 16;
    static __device__ __forceinline__ void run(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};

template <> struct mma_op<bfloat16_t> {
    static constexpr int k = 16;
    static __device__ __forceinline__ void run(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};

}  // namespace cupyconv
