// The AITER cache-write route of the paged appends (paged_append.cpp routes,
// aiter_cache_write.cpp runs, aiter_cache_write.cu holds the HIP pieces):
// concat_and_cache_mla for a combined MLA cache, reshape_and_cache_flash for
// NHD K/V caches, reached through a shim's optional C entry points
// (aiter_abi.h). Both take a vLLM slot mapping (int64, < 0 = skip), which
// the route computes from the append's page table into a buffer it keeps per
// stream, and device scale tensors, which it keeps per device.
#pragma once

#include <cstdint>

#include "backends/aiter/aiter_abi.h"
#include "append/append_job.h"

namespace mlacore {

// Slot of append token i: what the native kernel writes it to, -1 where it
// writes nothing (bad batch index, position or page id), which AITER skips.
MLACORE_HD int64_t append_slot(const append::Job& job, int64_t i) {
  const int64_t b = job.batch.at(i), pos = job.pos.at(i);
  return job.table64 ? job.t64.slot(b, pos) : job.t32.slot(b, pos);
}

// One append as AITER's cache writes take it, validated by paged_append.cpp.
struct AiterCacheWrite {
  int32_t op;              // MLACORE_ROUTE_APPEND_MLA or MLACORE_ROUTE_APPEND_KV
  aiter_tensor_t src[2];   // kv_c [nnz, 512], k_pe [nnz, 64] | key, value [nnz, H, D]
  aiter_tensor_t cache[2]; // kv_cache [P, S, 576] (cache[1] unused) | key_cache, value_cache [P, S, H, D]
  bool on_cpu;             // CPU tensors: the contract test's fake AITER
  int device;
};

// Computes the slots and calls the shim's entry point on `stream`.
void run_aiter_cache_write(const char* op, const AiterCacheWrite& w, const append::Job& job, void* stream);

#if defined(MLACORE_WITH_HIP)
// aiter_cache_write.cu: the slot kernel and the device memory the route
// keeps for the life of the process.
void launch_append_slots(const append::Job& job, int64_t* slots, int device, void* stream);
void* aiter_device_alloc(int64_t bytes, int device);
void aiter_device_upload(void* dst, const void* src, int64_t bytes, int device);
#endif

}  // namespace mlacore
