// Stream-K (a GEMM of too few tiles to spread evenly over the SMs): a fixed grid of persistent
// blocks divides the GEMM's tiles x k tiles ("units") into equal contiguous runs, so every SM does
// the same work whatever the tile count. A tile whose units two or more blocks share is finished by
// its owner, the block holding its first k tile; the others, each starting inside the tile, write
// their float32 sums to their block's slot of the workspace and raise their block's flag first
// thing, and the owner, which reaches its head of the tile last, adds those slots in block order
// before its epilogue: a fixed order, so the result is the same bits on every run (no atomics).
//
// Flags are ints, one per block, zero before a launch; the owner sets each flag it consumed back to
// zero, so they are zero after it too (executor.Workspaces keeps them per stream, zeroed once).
// A block raises its flag before it waits for anyone, and waits only for blocks after it, so the
// launch completes whether or not all its blocks are resident at once.
#pragma once

namespace cupyconv {

// Which units block `block` of `blocks` takes: [stream_k_start(block), stream_k_start(block + 1)).
__device__ __forceinline__ long long stream_k_start(long long units, int block, int blocks) {
    return units * block / blocks;
}

// One block's share of one tile: k tiles [k_begin, k_end) of tile (m, n, g). Where k_begin > 0 the
// block publishes to `slot`; where k_begin == 0 it owns the tile and, if k_end < the tile's k tiles,
// adds the slots of blocks [first_contributor, end_contributor) first.
struct StreamKSegment {
    int g, k_begin, k_end, slot, first_contributor, end_contributor;
    float* partials;
    int* flags;
};

// The THREADS threads that hold the sums meet: the whole block (BARRIER 0), or those of named barrier
// BARRIER alone (a block whose other warps copy and may have exited).
template <int THREADS, int BARRIER>
__device__ __forceinline__ void stream_k_sync() {
    if constexpr (BARRIER == 0)
        __syncthreads();
    else
        asm volatile("bar.sync %0, %1;\n" ::"n"(BARRIER), "n"(THREADS) : "memory");
}

// The block's ACC accumulators per thread as [ACC / 4][THREADS] float4s at `partial`, then its flag raised.
template <int THREADS, int ACC, int BARRIER = 0>
__device__ __forceinline__ void stream_k_publish(const float (&acc)[ACC], float* partial, int* flag) {
    static_assert(ACC % 4 == 0, "accumulators in float4s");
    float4* out = reinterpret_cast<float4*>(partial);
#pragma unroll
    for (int i = 0; i < ACC / 4; ++i)
        __stcg(out + i * THREADS + threadIdx.x,
               make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]));
    __threadfence();
    stream_k_sync<THREADS, BARRIER>();
    if (threadIdx.x == 0) asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(flag), "r"(1) : "memory");
}

// Once `flag` is raised, the partial sums at `partial` (stream_k_publish's layout) added to acc; the
// flag is lowered for the next launch.
template <int THREADS, int ACC, int BARRIER = 0>
__device__ __forceinline__ void stream_k_add(float (&acc)[ACC], const float* partial, int* flag) {
    if (threadIdx.x == 0) {
        int raised = 0;
        while (true) {
            asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(raised) : "l"(flag) : "memory");
            if (raised) break;
            __nanosleep(64);
        }
        *flag = 0;
    }
    stream_k_sync<THREADS, BARRIER>();
    const float4* in = reinterpret_cast<const float4*>(partial);
#pragma unroll
    for (int i = 0; i < ACC / 4; ++i) {
        const float4 v = __ldcg(in + i * THREADS + threadIdx.x);
        acc[4 * i] += v.x;
        acc[4 * i + 1] += v.y;
        acc[4 * i + 2] += v.z;
        acc[4 * i + 3] += v.w;
    }
}

}  // namespace cupyconv
