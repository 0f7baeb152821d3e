// The MLA decode launcher: picks the kernel for the request shape and the
// device, launches it on the caller's stream, then the combine.
//  - up to 16 query rows per request: the mma.sync kernel, one 16-row group;
//  - 64-row tiles on sm_90a: where a request's rows fill four tiles or more
//    (two on devices of high DRAM bandwidth an SM) and the launch holds more
//    than one request (seesaw_by_shape), over pages of 64-token multiples,
//    the seesaw kernel (mla_decode_seesaw.cu);
//    otherwise the wgmma kernel (mla_decode_sm90.cu);
//    off sm_90a, the mma.sync kernel's 64-row configuration.
//    MLACORE_DECODE_KERNEL=wgmma, =seesaw or =mma puts every 64-row tile on
//    that kernel (seesaw where it serves the call, else wgmma);
//  - HIP, a device whose shared memory per block the tiled kernels do not
//    fit, or MLACORE_DECODE_PORTABLE: the portable kernel.
// All of them write the same outputs and partials; the combine merges the
// partials of split requests. No allocation, no synchronization.
// Design: docs/design/2026-11-30-decode-mma-portable-combine.md.
#include "gpu/compat.h"

#include <cstdint>

#include "decode/mla_decode.h"
#include "decode/mla_decode_kernels.h"
#include "plan/schedule.h"

#if defined(MLACORE_GPU_CUDA)
#include <cstdlib>
#include <cstring>

#include "decode/mla_decode_seesaw.h"
#include "decode/mla_decode_sm90.h"
#endif

namespace mlacore {
namespace {

#if defined(MLACORE_GPU_CUDA)
// MLACORE_DECODE_KERNEL for 64-row tiles on sm_90a: "mma" keeps them on the
// mma.sync kernel (A/B comparisons, a fallback in the field); "wgmma" on the
// wgmma kernel (mla_decode_sm90.cu); "seesaw" tries the seesaw kernel
// (mla_decode_seesaw.cu) first; unset or anything else, by shape (ByShape).
// Read once.
enum class TileKernel { ByShape, Wgmma, Mma, Seesaw };

TileKernel tile_kernel() {
  static const TileKernel kernel = [] {
    const char* v = std::getenv("MLACORE_DECODE_KERNEL");
    if (v && std::strcmp(v, "mma") == 0) return TileKernel::Mma;
    if (v && std::strcmp(v, "wgmma") == 0) return TileKernel::Wgmma;
    if (v && std::strcmp(v, "seesaw") == 0) return TileKernel::Seesaw;
    return TileKernel::ByShape;
  }();
  return kernel;
}

// By shape (ByShape), the seesaw kernel where a launch holds more than one
// request and a request's rows fill four 64-row tiles or more (heads x query
// tokens >= 256, as with several query tokens at 128 heads), or two tiles
// (one token at 128 heads) on a device with DRAM bandwidth of 30 GB/s or
// more an SM: there the tiles read each KV tile together (through L2), so
// the kernel's rate per tile decides, and the seesaw's steady loop is the
// faster one. Two-tile requests gain on an H200 (37 GB/s an SM) and lose on
// an H100 (25 GB/s an SM), four-tile requests gain on both. Elsewhere the
// wgmma kernel: a request of one 64-row tile shares no KV tile, and a single
// request is split into CTAs too short for the seesaw's longer code
// (docs/design/2026-12-03-decode-seesaw.md, "The choice by shape" and "Two
// tiles a request"). Every input is a shape the caller fixes (a captured
// graph's batch and max_qo_len are its capacities) or a property of the
// device, so the choice never changes under replay and reads nothing from
// the device's memory.
constexpr int64_t kSeesawTwoTileMbpsPerSm = 30000;

// Peak DRAM bandwidth of `device` an SM, MB/s: memory clock (kHz) x 2 (two
// transfers a clock) x bus width (bits) / 8, over the SMs; 0 where the
// runtime does not say.
int64_t dram_mbps_per_sm(int device) {
  const int64_t khz = gpu::device_attribute<cudaDevAttrMemoryClockRate>(device);
  const int64_t bits = gpu::device_attribute<cudaDevAttrGlobalMemoryBusWidth>(device);
  const int64_t sms = gpu::device_attribute<cudaDevAttrMultiProcessorCount>(device);
  return sms > 0 && khz > 0 && bits > 0 ? khz * bits / 4000 / sms : 0;
}

template <class Idx>
bool seesaw_by_shape(const DecodeParams<Idx>& p) {
  if (p.batch < 2) return false;
  const int64_t rows = decode_partial_rows(p.max_qo_len, p.num_heads);
  if (rows >= 4 * kDecodeTileRows) return true;
  return rows >= 2 * kDecodeTileRows && dram_mbps_per_sm(p.device) >= kSeesawTwoTileMbpsPerSm;
}

// The sm_90a kernels for 64-row tiles, in the order tile_kernel() asks; false
// when none of them serves the call (nothing launched).
template <class Idx>
bool launch_tiles_sm90(const DecodeParams<Idx>& p, bool bf16, gpuStream_t stream) {
  const TileKernel kernel = tile_kernel();
  if (kernel == TileKernel::Mma) return false;
  const bool seesaw = kernel == TileKernel::Seesaw || (kernel == TileKernel::ByShape && seesaw_by_shape(p));
  if (seesaw && launch_mla_decode_seesaw(p, bf16, stream)) return true;
  return launch_mla_decode_sm90(p, bf16, stream);
}
#endif

template <class Idx>
void launch_decode(const DecodeParams<Idx>& p, bool bf16, bool portable, gpuStream_t stream) {
  if (p.max_work > 0x7fffffff) runtime_error("mla_decode: max_work ", p.max_work, " exceeds the grid limit");
#if defined(MLACORE_GPU_CUDA)
  if (!portable) {
    const int groups = mla_decode_mma_groups(decode_partial_rows(p.max_qo_len, p.num_heads), p.device);
    if (groups == 0) {
      portable = true;
    } else if (!(groups == 4 && launch_tiles_sm90(p, bf16, stream))) {
      // The sm_90a kernels decline (launching nothing) off sm_90a.
      launch_mla_decode_mma(p, bf16, groups, stream);
    }
  }
#else
  portable = true;
#endif
  if (portable) launch_mla_decode_portable(p, bf16, stream);
  launch_mla_decode_combine(p, bf16, stream);
}

}  // namespace

template <class Idx>
void launch_mla_decode(const DecodeParams<Idx>& p, DecodeDType dtype, bool portable, void* stream) {
  gpu::DeviceGuard guard(p.device);
  launch_decode(p, dtype == DecodeDType::BF16, portable, gpu::as_stream(stream));
}

template void launch_mla_decode<int32_t>(const DecodeParams<int32_t>&, DecodeDType, bool, void*);
template void launch_mla_decode<int64_t>(const DecodeParams<int64_t>&, DecodeDType, bool, void*);

}  // namespace mlacore
