// The MLA decode launcher: picks the kernel for the request shape and the
// device, launches it on the caller's stream, then the combine.
//  - up to 16 query rows per request: the mma.sync kernel, one 16-row group;
//  - 64-row tiles: the wgmma kernel on sm_90a (mla_decode_sm90.cu), else the
//    mma.sync kernel's 64-row configuration (MLACORE_DECODE_KERNEL=mma keeps
//    them there on sm_90a too);
//  - HIP, a device whose shared memory per block the tiled kernels do not
//    fit, or MLACORE_DECODE_PORTABLE: the portable kernel.
// All of them write the same outputs and partials; the combine merges the
// partials of split requests. No allocation, no synchronization.
// Design: docs/design/2026-11-30-decode-mma-portable-combine.md.
#include "gpu/compat.h"

#include <cstdint>

#include "decode/mla_decode.h"
#include "decode/mla_decode_kernels.h"

#if defined(MLACORE_GPU_CUDA)
#include <cstdlib>
#include <cstring>

#include "decode/mla_decode_sm90.h"
#endif

namespace mlacore {
namespace {

#if defined(MLACORE_GPU_CUDA)
// MLACORE_DECODE_KERNEL=mma keeps 64-row tiles on the mma.sync kernel on
// sm_90a too (A/B comparisons, a fallback in the field); unset or "wgmma",
// the wgmma kernel (mla_decode_sm90.cu) is tried first. Read once.
bool wgmma_decode_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("MLACORE_DECODE_KERNEL");
    return !(v && std::strcmp(v, "mma") == 0);
  }();
  return enabled;
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
    } else if (!(groups == 4 && wgmma_decode_enabled() && launch_mla_decode_sm90(p, bf16, stream))) {
      // The wgmma kernel declines (launching nothing) off sm_90a.
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
