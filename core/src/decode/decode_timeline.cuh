// Attribution builds only (meson -Ddecode_timeline=true): a decode kernel
// records, per CTA, the moment it reaches each of its phases, so that a CTA's
// time splits into start-up, tiles and epilogue (research/decode/timeline.py).
// Slot s of CTA b holds %globaltimer (ns, one clock for the whole GPU) in
// [b][s][0] and clock64 (the SM's cycles) in [b][s][1]; slot kSmSlot holds
// %smid. The record lives in this translation unit and is read by the C
// function the kernel's file defines with MLACORE_TIMELINE_EXPORT. In every
// other build the marks compile to nothing.
#pragma once

#include "gpu/compat.h"

#if defined(MLACORE_DECODE_TIMELINE) && defined(MLACORE_GPU_CUDA)
#include <cstdint>

namespace mlacore {
namespace timeline {

constexpr int kSlots = 16;
constexpr int kSmSlot = kSlots - 1;
constexpr int kCtas = 1 << 15;  // CTAs past these are not recorded

static __device__ unsigned long long g_record[kCtas][kSlots][2];

__device__ __forceinline__ void mark(int slot) {
  if (blockIdx.x >= kCtas) return;
  unsigned long long gt, clk;
  unsigned sm;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(gt));
  asm volatile("mov.u64 %0, %%clock64;\n" : "=l"(clk));
  g_record[blockIdx.x][slot][0] = gt;
  g_record[blockIdx.x][slot][1] = clk;
  if (slot == 0) {
    asm volatile("mov.u32 %0, %%smid;\n" : "=r"(sm));
    g_record[blockIdx.x][kSmSlot][0] = sm;
  }
}

}  // namespace timeline
}  // namespace mlacore

#define MLACORE_TIMELINE(slot, cond) \
  do {                               \
    if (cond) ::mlacore::timeline::mark(slot); \
  } while (0)
// A number of the CTA's own (e.g. its tile count), in [b][kSmSlot][1].
#define MLACORE_TIMELINE_NOTE(value)                                                    \
  do {                                                                                  \
    if (blockIdx.x < ::mlacore::timeline::kCtas)                                        \
      ::mlacore::timeline::g_record[blockIdx.x][::mlacore::timeline::kSmSlot][1] = (value); \
  } while (0)

// Copies the record (kCtas x kSlots x 2 uint64, row-major) to `host`, after
// synchronizing the device; 0 on success.
#define MLACORE_TIMELINE_EXPORT(name)                                                                      \
  extern "C" __attribute__((visibility("default"))) int name(unsigned long long* host) {                    \
    if (cudaDeviceSynchronize() != cudaSuccess) return 1;                                                    \
    return cudaMemcpyFromSymbol(host, ::mlacore::timeline::g_record, sizeof(::mlacore::timeline::g_record)) \
                   == cudaSuccess                                                                            \
               ? 0                                                                                           \
               : 2;                                                                                          \
  }
#else
#define MLACORE_TIMELINE(slot, cond) \
  do {                               \
  } while (0)
#define MLACORE_TIMELINE_NOTE(value) \
  do {                               \
  } while (0)
#define MLACORE_TIMELINE_EXPORT(name)
#endif
