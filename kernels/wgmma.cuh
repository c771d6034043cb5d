// Inline-PTX wrappers for Hopper's warpgroup MMA (wgmma), which exists only on the sm_90a target:
// kernels that include this header are compiled for sm_90a alone (compiler.py, WGMMA_ARCH in
// families/implicit_gemm_nhwc.py).
//
// A warpgroup (4 consecutive warps, the first at a warp index divisible by 4) multiplies a 64 x K
// tile of A by a K x N tile of B, both read by the tensor cores straight from shared memory, into
// float32 accumulators spread over its 128 threads as mma.sync's m16n8 fragments are: warp w of
// the group holds rows 16 w + lane / 4 and 16 w + lane / 4 + 8, and d[4 j + e] is column
// 8 j + 2 (lane % 4) + (e & 1) of the first (e < 2) or second row. The instructions are
// asynchronous: fence, issue, commit, then wait before the accumulators or the operands' shared
// memory are touched again.
//
// Operand layout ("K-major, 128-byte swizzle", the layout TMA's SWIZZLE_128B writes): each row (one
// pixel of A, one output channel of B) is 128 bytes of k, and the 16-byte piece j of row r is stored
// in slot j ^ (r % 8) of it, so the eight rows the tensor cores read together hit eight different
// bank groups. Rows follow each other; a tile starts on a 1024-byte boundary.
#pragma once

#include "dtypes.cuh"
#include "mma.cuh"  // shared_address

namespace cupyconv {

// Slot of 16-byte piece `piece` of row `row` in a 128-byte-swizzled tile.
__host__ __device__ constexpr int swizzle128_slot(int piece, int row) { return piece ^ (row & 7); }

// Shared-memory matrix descriptor of a K-major tile of ROW_BYTES-byte rows (128 or 64), swizzled across
// its row (TMA's swizzle of the same width), starting at shared address `address` (+ 32 k-bytes per
// instruction, or whole rows into the swizzle's 8-row pattern, a pixel strip's taps: the hardware swizzles
// by the address's bits, as TMA does; the base offset stays 0, and its documented (address >> 7) & 7 gave
// wrong sums, H200): start address / 16 in bits 0-13, leading-dimension offset 1 (unused for swizzled
// K-major), 8 rows' bytes between groups of 8 rows (bits 32-45, / 16), swizzle mode in bits 62-63 (1: 128
// bytes, 2: 64).
template <int ROW_BYTES = 128>
__device__ __forceinline__ unsigned long long wgmma_descriptor(unsigned address) {
    static_assert(ROW_BYTES == 128 || ROW_BYTES == 64, "128- or 64-byte swizzled rows");
    return static_cast<unsigned long long>((address & 0x3FFFF) >> 4) | (1ull << 16) |
           (static_cast<unsigned long long>(8 * ROW_BYTES >> 4) << 32) | ((ROW_BYTES == 128 ? 1ull : 2ull) << 62);
}

// Descriptor of an MN-major tile, 128-byte swizzled (wgmma's transposed operands, 16-bit types
// only): each row is 128 bytes of 64 consecutive m (or n) at one k, 16-byte piece j of row k stored
// in slot j ^ (k % 8); groups of 8 k rows are 1024 bytes apart (the stride offset), and 64-wide
// panels of m (or n) are ``panel_bytes`` apart (the leading offset). + 2048 bytes per instruction
// (16 k rows).
__device__ __forceinline__ unsigned long long wgmma_descriptor_mn(unsigned address, unsigned panel_bytes) {
    return static_cast<unsigned long long>((address & 0x3FFFF) >> 4) |
           (static_cast<unsigned long long>((panel_bytes & 0x3FFFF) >> 4) << 16) | ((1024ull >> 4) << 32) |
           (1ull << 62);
}

// Before the first wgmma of a tile: orders this thread's earlier accumulator accesses before it.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Wait until at most `Pending` committed wgmma groups are still running.
template <int Pending> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(Pending) : "memory");
}

// A CUtensorMap (the driver's TMA descriptor: 128 opaque bytes, 64-byte aligned), passed by value as a
// __grid_constant__ kernel parameter.
struct alignas(64) TensorMap {
    unsigned long long bits[16];
};

// Once `bytes` more bytes are expected on `barrier`, this thread's arrival on it.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(void* barrier, int bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
                 :: "r"(shared_address(barrier)), "r"(bytes) : "memory");
}

// The box of `map` at (column c0, row c1) into shared memory at `dst` (1024-byte aligned for the
// 128-byte swizzle) by the TMA unit, its bytes counted on `barrier` as they land.
__device__ __forceinline__ void tma_load_2d(void* dst, const TensorMap* map, int c0, int c1, void* barrier) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
                 :: "r"(shared_address(dst)), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1),
                    "r"(shared_address(barrier)) : "memory");
}

// The box of the 4-D tiled `map` at (c0, c1, c2, c3), innermost first, into `dst`, counted on `barrier`.
__device__ __forceinline__ void tma_load_4d(void* dst, const TensorMap* map, int c0, int c1, int c2, int c3,
                                            void* barrier) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3, %4, %5}], [%6];\n"
                 :: "r"(shared_address(dst)), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1),
                    "r"(c2), "r"(c3), "r"(shared_address(barrier)) : "memory");
}

// The im2col box of the 4-D (N, H, W, C) `map`: pixels from the window corner (w, h) of image n on,
// channels c.., the tap at (offset_w, offset_h) from each corner, into `dst`, counted on `barrier`.
__device__ __forceinline__ void tma_load_im2col_4d(void* dst, const TensorMap* map, int c, int w, int h, int n,
                                                   int offset_w, int offset_h, void* barrier) {
    const unsigned short ow = static_cast<unsigned short>(offset_w), oh = static_cast<unsigned short>(offset_h);
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3, %4, %5}], [%6], {%7, %8};\n"
                 :: "r"(shared_address(dst)), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c), "r"(w), "r"(h),
                    "r"(n), "r"(shared_address(barrier)), "h"(ow), "h"(oh) : "memory");
}

// The same box copied once and written, with its bytes counted, at the same shared-memory offsets
// (dst and barrier) in every block of this one's cluster named in `blocks` (bit r: cluster rank r).
__device__ __forceinline__ void tma_load_im2col_4d_multicast(void* dst, const TensorMap* map, int c, int w, int h,
                                                             int n, int offset_w, int offset_h, void* barrier,
                                                             unsigned short blocks) {
    const unsigned short ow = static_cast<unsigned short>(offset_w), oh = static_cast<unsigned short>(offset_h);
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes.multicast::cluster "
                 "[%0], [%1, {%2, %3, %4, %5}], [%6], {%7, %8}, %9;\n"
                 :: "r"(shared_address(dst)), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c), "r"(w), "r"(h),
                    "r"(n), "r"(shared_address(barrier)), "h"(ow), "h"(oh), "h"(blocks) : "memory");
}

// Clusters (sm_90): this block's rank in its cluster; every thread of every block of the cluster
// meeting (release/acquire: shared-memory writes before it are seen by the cluster after it); the
// barrier initialisations of this thread made visible to the cluster (before such a meeting).
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
    return rank;
}
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void mbarrier_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// Distributed shared memory (sm_90 clusters). An arrival on the mbarrier at `barrier`'s offset in the shared memory
// of cluster block `rank` (this one's included), ordered after this thread's earlier reads of shared memory.
__device__ __forceinline__ void mbarrier_arrive_cluster(void* barrier, unsigned rank) {
    asm volatile("{\n"
                 ".reg .b32 remote;\n"
                 "mapa.shared::cluster.u32 remote, %0, %1;\n"
                 "mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
                 "}\n" :: "r"(shared_address(barrier)), "r"(rank) : "memory");
}
// The cluster barrier in two halves: each thread's arrival (relaxed: nothing ordered by it), and its wait until
// every thread of the cluster that has not exited arrived.
__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory"); }
// This thread's writes to shared memory made visible to the async proxy (the TMA unit's copies out of it).
__device__ __forceinline__ void fence_proxy_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// `bytes` (a multiple of 16) of this block's shared memory at `src` copied by the TMA unit to cluster block
// `rank`'s at `dst`'s offset, counted there as transaction bytes on the mbarrier at `barrier`'s offset. Only that
// barrier says when the copy is done: this block must not exit before (cluster_wait after the owner's arrival).
__device__ __forceinline__ void bulk_copy_to_cluster(void* dst, const void* src, unsigned bytes, void* barrier,
                                                     unsigned rank) {
    asm volatile("{\n"
                 ".reg .b32 to, at;\n"
                 "mapa.shared::cluster.u32 to, %0, %3;\n"
                 "mapa.shared::cluster.u32 at, %2, %3;\n"
                 "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [to], [%1], %4, [at];\n"
                 "}\n" :: "r"(shared_address(dst)), "r"(shared_address(src)), "r"(shared_address(barrier)), "r"(rank),
                 "r"(bytes) : "memory");
}

// d (64 x N, float32) += A (64 x k) B (k x N) for one instruction's k: 16 of half_t / bfloat16_t,
// 8 of TF32 (float storage), i.e. 32 bytes of each row. a and b are wgmma_descriptor()s.
// MN_MAJOR: both operands MN-major (wgmma_descriptor_mn), transposed by the tensor cores.
template <typename T, int N, bool MN_MAJOR = false> struct wgmma_op;

// The accumulator operand lists: "%0, %1, ..." for N / 2 registers; the descriptors follow them.
#define CUPYCONV_WGMMA_D32 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
    "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define CUPYCONV_WGMMA_D64 \
    CUPYCONV_WGMMA_D32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define CUPYCONV_WGMMA_D128 \
    CUPYCONV_WGMMA_D64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define CUPYCONV_ACC8(i) \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
        "+f"(d[i + 7])
#define CUPYCONV_ACC32 CUPYCONV_ACC8(0), CUPYCONV_ACC8(8), CUPYCONV_ACC8(16), CUPYCONV_ACC8(24)
#define CUPYCONV_ACC64 CUPYCONV_ACC32, CUPYCONV_ACC8(32), CUPYCONV_ACC8(40), CUPYCONV_ACC8(48), CUPYCONV_ACC8(56)
#define CUPYCONV_ACC128 CUPYCONV_ACC64, CUPYCONV_ACC8(64), CUPYCONV_ACC8(72), CUPYCONV_ACC8(80), CUPYCONV_ACC8(88), \
    CUPYCONV_ACC8(96), CUPYCONV_ACC8(104), CUPYCONV_ACC8(112), CUPYCONV_ACC8(120)

// One specialisation per (type, N, majorness): the PTX names the shape and types, and the operand
// list is as long as the accumulators. Scale-d is 1 (accumulate); A and B are not scaled, and
// transposed (MN-major) or not (K-major; TF32 has no transpose operands).
#define CUPYCONV_WGMMA(TYPE, N, REGS, SHAPE_TYPES, MN_MAJOR, MODIFIERS)                                     \
    template <> struct wgmma_op<TYPE, N, MN_MAJOR> {                                                        \
        static __device__ __forceinline__ void run(float (&d)[N / 2], unsigned long long a,                 \
                                                   unsigned long long b) {                                  \
            asm volatile("wgmma.mma_async.sync.aligned.m64n" #N SHAPE_TYPES " {" CUPYCONV_WGMMA_D##REGS     \
                         "}, %" #REGS ", %" CUPYCONV_NEXT_##REGS ", 1, 1, 1" MODIFIERS ";\n"                \
                         : CUPYCONV_ACC##REGS : "l"(a), "l"(b) : "memory");                                 \
        }                                                                                                   \
    };
#define CUPYCONV_NEXT_32 "33"
#define CUPYCONV_NEXT_64 "65"
#define CUPYCONV_NEXT_128 "129"
#define CUPYCONV_WGMMA_ALL_N(TYPE, SHAPE_TYPES_K, MN_MAJOR, MODIFIERS) \
    CUPYCONV_WGMMA(TYPE, 64, 32, SHAPE_TYPES_K, MN_MAJOR, MODIFIERS)   \
    CUPYCONV_WGMMA(TYPE, 128, 64, SHAPE_TYPES_K, MN_MAJOR, MODIFIERS)

CUPYCONV_WGMMA_ALL_N(half_t, "k16.f32.f16.f16", false, ", 0, 0")
CUPYCONV_WGMMA_ALL_N(bfloat16_t, "k16.f32.bf16.bf16", false, ", 0, 0")
CUPYCONV_WGMMA_ALL_N(half_t, "k16.f32.f16.f16", true, ", 1, 1")
CUPYCONV_WGMMA_ALL_N(bfloat16_t, "k16.f32.bf16.bf16", true, ", 1, 1")
CUPYCONV_WGMMA_ALL_N(float, "k8.f32.tf32.tf32", false, "")
// 256 columns (the weight gradient's 64 x 256 warpgroup tiles): 16-bit operands, transposed (channels-last x
// and dy) or not (NCHW's, read in place).
CUPYCONV_WGMMA(half_t, 256, 128, "k16.f32.f16.f16", true, ", 1, 1")
CUPYCONV_WGMMA(bfloat16_t, 256, 128, "k16.f32.bf16.bf16", true, ", 1, 1")
CUPYCONV_WGMMA(half_t, 256, 128, "k16.f32.f16.f16", false, ", 0, 0")
CUPYCONV_WGMMA(bfloat16_t, 256, 128, "k16.f32.bf16.bf16", false, ", 0, 0")

// d (64 x N, float32) += A (64 x k) B (k x N) with A in registers, for one instruction's k (8 of TF32,
// 16 of half_t / bfloat16_t): a thread's four 32-bit registers, each warp's 16 rows in mma.sync's A
// layout (m16n8k8 for TF32, m16n8k16 for 16 bits); b a K-major wgmma_descriptor(). The tensor cores
// read `a` after the call returns: write it again only after the wait that retires it.
template <typename T, int N> struct wgmma_rs;
#define CUPYCONV_WGMMA_RS(TYPE, N, REGS, SHAPE_TYPES, OPERANDS, MODIFIERS)                                \
    template <> struct wgmma_rs<TYPE, N> {                                                                \
        static __device__ __forceinline__ void run(float (&d)[N / 2], const unsigned (&a)[4],             \
                                                   unsigned long long b) {                                \
            asm volatile("wgmma.mma_async.sync.aligned.m64n" #N SHAPE_TYPES " {" CUPYCONV_WGMMA_D##REGS   \
                         "}, " OPERANDS ", 1, 1, 1" MODIFIERS ";\n"                                       \
                         : CUPYCONV_ACC##REGS : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b) : "memory"); \
        }                                                                                                 \
    };
// TF32 has no transpose operand; the 16-bit types' imm-trans-b is 0 (B K-major).
#define CUPYCONV_WGMMA_RS_ALL_N(TYPE, SHAPE_TYPES, MODIFIERS)                                                   \
    CUPYCONV_WGMMA_RS(TYPE, 64, 32, SHAPE_TYPES, "{%32, %33, %34, %35}, %36", MODIFIERS)                        \
    CUPYCONV_WGMMA_RS(TYPE, 128, 64, SHAPE_TYPES, "{%64, %65, %66, %67}, %68", MODIFIERS)
CUPYCONV_WGMMA_RS_ALL_N(float, "k8.f32.tf32.tf32", "")
CUPYCONV_WGMMA_RS_ALL_N(half_t, "k16.f32.f16.f16", ", 0")
CUPYCONV_WGMMA_RS_ALL_N(bfloat16_t, "k16.f32.bf16.bf16", ", 0")

}  // namespace cupyconv
