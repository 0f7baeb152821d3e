// wgmma (sm_90a) building blocks shared by the MLA decode kernel
// (mla_decode_sm90.cu) and its standalone check (tests/cpp/test_wgmma_sm90.cu),
// so the probe exercises exactly the descriptors, swizzle and fragment
// mapping the kernel relies on.
//
// Shared-memory operands use the 128-byte-swizzle canonical layout (PTX ISA
// "Shared Memory Matrix Layout", CUTLASS Layout_{K,MN}_SW128_Atom): a matrix
// of R rows x C 16-bit elements (C a multiple of 64) is stored as C/64 column
// blocks of R rows x 128 bytes; 16-byte chunk c of row r of a block sits at
// r * 128 + ((c ^ (r % 8)) * 16). Every block starts on a 1024-byte boundary,
// so the descriptors' base-offset field stays 0. The XOR uses the address
// bits [7,10) the hardware itself uses (Swizzle<3,4,3>), which is why a
// descriptor may start 32/64/96 bytes into a row to select a k16 slice.
//
// The wgmma instructions exist only in sm_90a code: the mma_* wrappers are
// defined only where MLACORE_WGMMA_ENABLED is, and callers use them only
// under the same macro (an sm_80 pass compiles a body without them).
#pragma once

#include <cstdint>

#include "gpu/pack2.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MLACORE_WGMMA_ENABLED 1
#endif

namespace mlacore::wgmma {

// Byte offset of 16-byte chunk `chunk` (0..7) of row `row` inside one
// 64-element column block.
__host__ __device__ __forceinline__ uint32_t sw128(uint32_t row, uint32_t chunk) {
  return row * 128u + ((chunk ^ (row & 7u)) << 4);
}

// Byte offset of 16-byte chunk `chunk` (any) of row `row` in a matrix of
// `rows` rows stored as consecutive 64-element column blocks.
__host__ __device__ __forceinline__ uint32_t sw128_tile(uint32_t row, uint32_t chunk, uint32_t rows) {
  return (chunk >> 3) * rows * 128u + sw128(row, chunk & 7u);
}

// Byte offset of k16 step `kk` of a K-major operand of `rows` rows: four
// steps of 32 bytes inside a column block, then the next block.
__host__ __device__ __forceinline__ uint32_t k_major_step(int kk, uint32_t rows) {
  return static_cast<uint32_t>(kk >> 2) * rows * 128u + static_cast<uint32_t>(kk & 3) * 32u;
}
// Byte offset of k16 step `kt` of an MN-major operand: 16 rows of 128 bytes.
__host__ __device__ __forceinline__ uint32_t mn_major_step(int kt) { return static_cast<uint32_t>(kt) * 16u * 128u; }

// Matrix descriptor (PTX ISA "Matrix Descriptor Format"): start address,
// leading and stride byte offsets, all encoded as (x & 0x3FFFF) >> 4, in bits
// [0,14), [16,30), [32,46); base offset [49,52) = 0; swizzle mode [62,64),
// 1 = 128-byte swizzle.
__host__ __device__ __forceinline__ uint64_t make_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFFu) >> 4) | (static_cast<uint64_t>((lbo & 0x3FFFFu) >> 4) << 16) |
         (static_cast<uint64_t>((sbo & 0x3FFFFu) >> 4) << 32) | (1ull << 62);
}

// A descriptor `byte_off` bytes further into shared memory. The start
// address field is the low word's bits [0,14), and a shared-memory address
// (< 2^18 bytes) leaves it below 2^14, so the sum never carries out of the
// low word. Adding there leaves the high word (SBO, swizzle) a constant; a
// 64-bit add compiled to a carry chain and a rebuilt high word, eight uniform
// instructions a wgmma against four (nvcc 13.0).
__host__ __device__ __forceinline__ uint64_t desc_at(uint64_t desc, uint32_t byte_off) {
  return (desc & 0xFFFFFFFF00000000ull) | static_cast<uint32_t>(static_cast<uint32_t>(desc) + (byte_off >> 4));
}

// K-major operand (rows = M or N, 64 K elements per 128-byte row): groups of
// 8 rows are 1024 bytes apart (SBO); LBO is unused by swizzled K-major
// layouts and set to 1 as the ISA says it is assumed. A k16 slice k of a
// column block starts at block + 32 * k.
__host__ __device__ __forceinline__ uint64_t desc_k_sw128(uint32_t addr) { return make_desc(addr, 16, 1024); }

// MN-major operand (rows = K, 64 N elements per 128-byte row, used with the
// transpose immediate): LBO = bytes between consecutive 64-element N blocks,
// SBO = bytes between consecutive groups of 8 K rows (1024 when the rows are
// dense). A k16 slice starts 16 rows (2048 bytes) further.
__host__ __device__ __forceinline__ uint64_t desc_mn_sw128(uint32_t addr, uint32_t n_block_bytes) {
  return make_desc(addr, n_block_bytes, 1024);
}

// Accumulator fragment of m64nNk16 (f32 D), per thread of the warpgroup
// (PTX ISA figure "WGMMA .m64nNk16 register fragment layout for accumulator
// matrix D"): element e of the N/2 registers lies at row
// 16 * warp + lane / 4 + 8 * ((e / 2) % 2) and column 8 * (e / 4) + 2 * (lane % 4) + e % 2,
// warp and lane taken inside the warpgroup. The A register fragment of
// m64nNk16 has the same shape for k = 16: registers 0..3 of a k-step are the
// pairs (row, k 0-7), (row + 8, k 0-7), (row, k 8-15), (row + 8, k 8-15).
__host__ __device__ __forceinline__ int acc_row(int wg_tid, int e) {
  return 16 * (wg_tid >> 5) + ((wg_tid & 31) >> 2) + 8 * ((e >> 1) & 1);
}
__host__ __device__ __forceinline__ int acc_col(int wg_tid, int e) {
  return 8 * (e >> 2) + 2 * (wg_tid & 3) + (e & 1);
}

#if defined(__CUDACC__)

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Generic-proxy shared-memory writes (st.shared, stmatrix, cp.async) become visible to
// wgmma (async proxy) only through this fence by the writing thread, before
// the barrier that publishes them.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Named barriers (ids 1..15; 0 is __syncthreads): `count` threads, a
// multiple of 32, meet. bar.sync waits; bar.arrive counts this thread in
// and goes on. Both order the shared-memory accesses made before them
// (generic proxy) for the threads that wait on the same barrier.
__device__ __forceinline__ void bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// Shared-memory mbarriers (CTA scope): init by one thread before a barrier
// that publishes it; each phase completes after `count` arrivals (release);
// a waiter spins on the parity of the phase it needs (acquire).
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred p;\n MBAR_WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra MBAR_WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity) : "memory");
}

// Whether the phase of `parity` has completed, without waiting (acquire when it has).
__device__ __forceinline__ bool mbar_test(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

// The register A operand of four k16 steps over one 64-column K-major block
// at `block` (64 rows): a[4 kt + m] holds row acc_row + 8 (m & 1), columns
// 16 kt + 8 (m >> 1) + 2 (lane % 4) + {0, 1}, the layout acc_to_a builds.
__device__ __forceinline__ void load_a_block(uint32_t block, int wg_tid, uint32_t (&a)[16]) {
  const int row = acc_row(wg_tid, 0), c2 = 2 * (wg_tid & 3);
#pragma unroll
  for (int kt = 0; kt < 4; ++kt) {
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int r = row + 8 * (m & 1), col = 16 * kt + 8 * (m >> 1) + c2;
      const uint32_t addr = block + sw128(static_cast<uint32_t>(r), static_cast<uint32_t>(col) >> 3) + (col & 7) * 2;
      asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(a[4 * kt + m]) : "r"(addr) : "memory");
    }
  }
}

// Pins an accumulator register at this point of the program: the compiler
// must not move reads of wgmma results above the wait that makes them valid,
// nor writes below the wgmma that consumes them.
template <int N>
__device__ __forceinline__ void fence_regs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&a)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(a[i])::"memory");
}

// Register A operand of m64nNk16 from an f32 accumulator of m64n(16 * K)
// (the decode kernel's P = exp(S) after the softmax): register i is the pair
// (acc[2i], acc[2i + 1]) rounded to 16 bits, the lower column in the low half,
// and k-step kt of the A operand is registers 4kt .. 4kt + 3. With the
// accumulator map above, register 4kt + m holds row r + 8 (m & 1), columns
// 16kt + 8 (m >> 1) + 2 (lane % 4) + {0, 1}: exactly the A fragment
// (a0..a7) of the PTX ISA figure "WGMMA .m64nNk16 register fragment layout
// for matrix A" (CUTLASS ALayout_64x16 = CLayout_64x16). The same packed
// register is what store_a_block stores for the shared-memory copy of P.
template <bool kBf16, int N>
__device__ __forceinline__ void acc_to_a(const float (&acc)[N], uint32_t (&a)[N / 2]) {
#pragma unroll
  for (int i = 0; i < N / 2; ++i) a[i] = pack2<kBf16>(acc[2 * i], acc[2 * i + 1]);
}

#if defined(MLACORE_WGMMA_ENABLED)

// The inverse of load_a_block: the register A operand of four k16 steps
// (the layout acc_to_a builds) into the 64-column K-major block at `block`
// (64 rows), one stmatrix a k-step. Its four 8 x 8 matrices are registers
// 4 kt + m, rows + 8 (m & 1) and columns + 8 (m >> 1) of the step; lanes
// 8 m .. 8 m + 7 give matrix m's row addresses.
__device__ __forceinline__ void store_a_block(uint32_t block, int wg_tid, const uint32_t (&a)[16]) {
  const int lane = wg_tid & 31, m = lane >> 3;
  const uint32_t row = 16u * static_cast<uint32_t>(wg_tid >> 5) + 8u * (m & 1) + (lane & 7);
#pragma unroll
  for (int kt = 0; kt < 4; ++kt) {
    const uint32_t addr = block + sw128(row, 2u * kt + static_cast<uint32_t>(m >> 1));
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(a[4 * kt]),
                 "r"(a[4 * kt + 1]), "r"(a[4 * kt + 2]), "r"(a[4 * kt + 3])
                 : "memory");
  }
}

// The accumulators go to wgmma as N/2 scalar "+f" operands, eight at a time.
#define MLACORE_WGMMA_ACC8(b)                                                                        \
  "+f"(d[b]), "+f"(d[b + 1]), "+f"(d[b + 2]), "+f"(d[b + 3]), "+f"(d[b + 4]), "+f"(d[b + 5]), "+f"(d[b + 6]), \
      "+f"(d[b + 7])

// D[64x64] += A[64x16] * B[16x64]: A and B both K-major in shared memory
// (the decode kernel's S = Q K^T over a whole 64-token tile). AB is the
// operand type, "bf16" or "f16".
#define MLACORE_WGMMA_M64N64K16_SS(AB, ACC)                                                          \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                          \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." AB "." AB " {"                          \
               "%0, %1, %2, %3, %4, %5, %6, %7, "                                                    \
               "%8, %9, %10, %11, %12, %13, %14, %15, "                                              \
               "%16, %17, %18, %19, %20, %21, %22, %23, "                                            \
               "%24, %25, %26, %27, %28, %29, %30, %31"                                              \
               "}, %32, %33, p, 1, 1, 0, 0;\n}\n"                                                    \
               : MLACORE_WGMMA_ACC8(0), MLACORE_WGMMA_ACC8(8), MLACORE_WGMMA_ACC8(16), MLACORE_WGMMA_ACC8(24) \
               : "l"(desc_a), "l"(desc_b), "n"(ACC)                                                  \
               : "memory")

// D[64x64] += A[64x16] * B[16x64]: A from registers (a[0..3], the fragment
// load_a_block reads), B K-major in shared memory (the seesaw decode kernel's
// S over Q's rope block, which it holds in registers).
#define MLACORE_WGMMA_M64N64K16_RS(AB, ACC)                                                          \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                          \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." AB "." AB " {"                          \
               "%0, %1, %2, %3, %4, %5, %6, %7, "                                                    \
               "%8, %9, %10, %11, %12, %13, %14, %15, "                                              \
               "%16, %17, %18, %19, %20, %21, %22, %23, "                                            \
               "%24, %25, %26, %27, %28, %29, %30, %31"                                              \
               "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"                                     \
               : MLACORE_WGMMA_ACC8(0), MLACORE_WGMMA_ACC8(8), MLACORE_WGMMA_ACC8(16), MLACORE_WGMMA_ACC8(24) \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(ACC)                    \
               : "memory")

// The 128 accumulator operands of an m64n256 wgmma as asm text (%0..%127).
#define MLACORE_WGMMA_D128_TEXT \
  "%0, %1, %2, %3, %4, %5, %6, %7, " \
  "%8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, " \
  "%40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, " \
  "%56, %57, %58, %59, %60, %61, %62, %63, " \
  "%64, %65, %66, %67, %68, %69, %70, %71, " \
  "%72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, " \
  "%88, %89, %90, %91, %92, %93, %94, %95, " \
  "%96, %97, %98, %99, %100, %101, %102, %103, " \
  "%104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, " \
  "%120, %121, %122, %123, %124, %125, %126, %127"

// Their 128 accumulators as operands %0..%127.
#define MLACORE_WGMMA_ACC128                                                                          \
  MLACORE_WGMMA_ACC8(0), MLACORE_WGMMA_ACC8(8), MLACORE_WGMMA_ACC8(16), MLACORE_WGMMA_ACC8(24),         \
      MLACORE_WGMMA_ACC8(32), MLACORE_WGMMA_ACC8(40), MLACORE_WGMMA_ACC8(48), MLACORE_WGMMA_ACC8(56),   \
      MLACORE_WGMMA_ACC8(64), MLACORE_WGMMA_ACC8(72), MLACORE_WGMMA_ACC8(80), MLACORE_WGMMA_ACC8(88),   \
      MLACORE_WGMMA_ACC8(96), MLACORE_WGMMA_ACC8(104), MLACORE_WGMMA_ACC8(112), MLACORE_WGMMA_ACC8(120)

// D[64x256] += A[64x16] * B[16x256]: A K-major, B MN-major (transpose-B
// immediate = 1), both in shared memory.
#define MLACORE_WGMMA_M64N256K16_SS_TB(AB)                                                           \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                                         \
               "wgmma.mma_async.sync.aligned.m64n256k16.f32." AB "." AB " {"                         \
               MLACORE_WGMMA_D128_TEXT                                                               \
               "}, %128, %129, p, 1, 1, 0, 1;\n}\n"                                                  \
               : MLACORE_WGMMA_ACC128                                                                  \
               : "l"(desc_a), "l"(desc_b), "r"(1)                                                    \
               : "memory")

// D[64x256] += A[64x16] * B[16x256]: A from registers (a[0..3], the
// fragment acc_to_a builds), B MN-major in shared memory (transpose-B
// immediate = 1). The A registers, like D, belong to the wgmma until a
// wait_group covers it: the caller keeps them unmodified (fence_regs after
// that wait) and issues wgmma.fence after writing them.
#define MLACORE_WGMMA_M64N256K16_RS_TB(AB)                                                           \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"                                         \
               "wgmma.mma_async.sync.aligned.m64n256k16.f32." AB "." AB " {"                         \
               MLACORE_WGMMA_D128_TEXT                                                               \
               "}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"                                  \
               : MLACORE_WGMMA_ACC128                                                                  \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1)                      \
               : "memory")

template <bool kBf16>
__device__ __forceinline__ void mma_m64n64k16_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b) {
  if constexpr (kBf16) MLACORE_WGMMA_M64N64K16_SS("bf16", 1);
  else MLACORE_WGMMA_M64N64K16_SS("f16", 1);
}
// The same, D = A * B: D's old contents are not read (the first k-step of a product).
template <bool kBf16>
__device__ __forceinline__ void mma_m64n64k16_ss_first(float (&d)[32], uint64_t desc_a, uint64_t desc_b) {
  if constexpr (kBf16) MLACORE_WGMMA_M64N64K16_SS("bf16", 0);
  else MLACORE_WGMMA_M64N64K16_SS("f16", 0);
}

template <bool kBf16>
__device__ __forceinline__ void mma_m64n64k16_rs(float (&d)[32], const uint32_t* a, uint64_t desc_b) {
  if constexpr (kBf16) MLACORE_WGMMA_M64N64K16_RS("bf16", 1);
  else MLACORE_WGMMA_M64N64K16_RS("f16", 1);
}
template <bool kBf16>
__device__ __forceinline__ void mma_m64n64k16_rs_first(float (&d)[32], const uint32_t* a, uint64_t desc_b) {
  if constexpr (kBf16) MLACORE_WGMMA_M64N64K16_RS("bf16", 0);
  else MLACORE_WGMMA_M64N64K16_RS("f16", 0);
}

template <bool kBf16>
__device__ __forceinline__ void mma_m64n256k16_ss_tb(float (&d)[128], uint64_t desc_a, uint64_t desc_b) {
  if constexpr (kBf16) MLACORE_WGMMA_M64N256K16_SS_TB("bf16");
  else MLACORE_WGMMA_M64N256K16_SS_TB("f16");
}

template <bool kBf16>
__device__ __forceinline__ void mma_m64n256k16_rs_tb(float (&d)[128], const uint32_t* a, uint64_t desc_b) {
  if constexpr (kBf16) MLACORE_WGMMA_M64N256K16_RS_TB("bf16");
  else MLACORE_WGMMA_M64N256K16_RS_TB("f16");
}

#undef MLACORE_WGMMA_M64N256K16_RS_TB
#undef MLACORE_WGMMA_M64N256K16_SS_TB
#undef MLACORE_WGMMA_D128_TEXT
#undef MLACORE_WGMMA_ACC128
#undef MLACORE_WGMMA_M64N64K16_RS
#undef MLACORE_WGMMA_M64N64K16_SS
#undef MLACORE_WGMMA_ACC8

#endif  // MLACORE_WGMMA_ENABLED
#endif  // __CUDACC__

}  // namespace mlacore::wgmma
