// Tensor-memory-access (TMA, sm_90) building blocks of the seesaw decode
// kernel (mla_decode_seesaw.cu): 3-D tiled loads of one box onto an
// mbarrier, and the arrival that tells the mbarrier how many bytes to wait
// for. The tensor maps are built on the host (gpu/tma_map.h) and reach the
// kernel as __grid_constant__ parameters. CUDA only.
#pragma once

#include <cstdint>

namespace mlacore::tma {

#if defined(__CUDACC__)

// Makes this thread's mbarrier.init visible to the asynchronous proxy (the
// TMA unit's completions), before the barrier that publishes the mbarriers.
__device__ __forceinline__ void fence_barrier_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// One arrival on `bar` that also raises the bytes its phase waits for.
__device__ __forceinline__ void arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// Box (c0, c1, c2) of the tensor map `map` (a __grid_constant__ parameter)
// into shared memory at `dst`; its bytes count down `bar`'s phase when they
// land. Coordinates past the tensor's bounds read as zeros.
__device__ __forceinline__ void load_3d(uint32_t dst, const void* map, int c0, int c1, int c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

#endif  // __CUDACC__

}  // namespace mlacore::tma
