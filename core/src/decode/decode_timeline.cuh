// Attribution builds only (meson -Ddecode_timeline=true): a decode kernel
// records, per CTA, the moment it reaches each of its phases, so that a CTA's
// time splits into start-up, tiles and epilogue (research/decode/timeline.py);
// the seesaw also records, for its first kPairCtas CTAs, the clock at each
// hand-off of each pair of tiles (research/decode/pair_timeline.py).
// Slot s of CTA b holds %globaltimer (ns, one clock for the whole GPU) in
// [b][s][0] and clock64 (the SM's cycles) in [b][s][1]; slot kSmSlot holds
// %smid. The record lives in this translation unit and is read by the C
// function the kernel's file defines with MLACORE_TIMELINE_EXPORT. In every
// other build the marks compile to nothing.
#pragma once

#include "gpu/compat.h"

#if defined(MLACORE_DECODE_TIMELINE) && defined(MLACORE_GPU_CUDA)
#include <cstddef>
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

// Pair marks: clock64 of CTA b (< kPairCtas) at point `slot` of its pair
// `pair` (< kPairs) in g_pairs[b][pair][slot]; 0 where never reached.
constexpr int kPairCtas = 8;
constexpr int kPairs = 64;
constexpr int kPairSlots = 20;

constexpr size_t kPairBytes = sizeof(unsigned long long) * kPairCtas * kPairs * kPairSlots;

static __device__ unsigned long long g_pairs[kPairCtas][kPairs][kPairSlots];

__device__ __forceinline__ void pair_mark(int pair, int slot) {
  if (blockIdx.x >= kPairCtas || pair < 0 || pair >= kPairs) return;
  unsigned long long clk;
  asm volatile("mov.u64 %0, %%clock64;\n" : "=l"(clk));
  g_pairs[blockIdx.x][pair][slot] = clk;
}

}  // namespace timeline
}  // namespace mlacore

#define MLACORE_PAIR_MARK(pair, slot, cond) \
  do {                                      \
    if (cond) ::mlacore::timeline::pair_mark(pair, slot); \
  } while (0)
// Copies the pair record (kPairCtas x kPairs x kPairSlots uint64) to `host`
// after synchronizing the device and clears it; 0 on success.
#define MLACORE_PAIRS_EXPORT(name)                                                                          \
  extern "C" __attribute__((visibility("default"))) int name(unsigned long long* host) {                     \
    if (cudaDeviceSynchronize() != cudaSuccess) return 1;                                                     \
    if (cudaMemcpyFromSymbol(host, ::mlacore::timeline::g_pairs, ::mlacore::timeline::kPairBytes) !=          \
        cudaSuccess)                                                                                          \
      return 2;                                                                                               \
    void* dev = nullptr;                                                                                      \
    if (cudaGetSymbolAddress(&dev, ::mlacore::timeline::g_pairs) != cudaSuccess) return 3;                    \
    return cudaMemset(dev, 0, ::mlacore::timeline::kPairBytes) == cudaSuccess &&                              \
                   cudaDeviceSynchronize() == cudaSuccess                                                     \
               ? 0                                                                                            \
               : 4;                                                                                           \
  }

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
#define MLACORE_PAIR_MARK(pair, slot, cond) \
  do {                                      \
  } while (0)
#define MLACORE_PAIRS_EXPORT(name)
#endif
