// The wgmma (sm_90a) MLA decode kernel for 64-row query tiles, launched by
// mla_decode_launch.cu in front of the mma.sync kernel. CUDA builds only.
#pragma once

#include "gpu/compat.h"
#include "decode/mla_decode.h"

namespace mlacore {

// Whether the library holds sm_90a code for the sm_90a decode kernels: meson
// defines MLACORE_HAVE_SM90A when sm_targets lists 90a and not plain 90 (with
// both, which of the two cubins the driver loads is not ours to know, and the
// sm_90 one is the trapping body).
constexpr bool kBuiltForSm90a =
#if defined(MLACORE_HAVE_SM90A)
    true;
#else
    false;
#endif

// Whether an sm_90a decode kernel can run on `device` with `smem` bytes of
// dynamic shared memory: built for sm_90a, compute capability 9.0 (the only
// one sm_90a code runs on), enough opt-in shared memory, and the cubin the
// runtime picked for this device is the sm_90 one (binaryVersion 90: fixed
// for the process, so asked once per device; no image at all, -1, is asked
// again next time, as negative answers are not cached).
template <class Kernel>
bool sm90a_kernel_runs(Kernel kernel, int device, int smem) {
  if (!kBuiltForSm90a) return false;
  if (gpu::device_attribute<cudaDevAttrComputeCapabilityMajor>(device) != 9 ||
      gpu::device_attribute<cudaDevAttrComputeCapabilityMinor>(device) != 0 ||
      gpu::device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(device) < smem)
    return false;
  return gpu::once_per_device(device, [kernel] { return gpu::binary_version(kernel); }) == 90;
}

// Launches the wgmma decode kernel (not the combine) for 64-row tiles on
// `stream`; false, launching nothing, when it cannot run here: the device is
// not compute capability 9.0, the library carries no sm_90a code for it, or
// the device's opt-in shared memory per block is too small. Throws only when
// a launch that should work fails.
template <class Idx>
bool launch_mla_decode_sm90(const DecodeParams<Idx>& p, bool bf16, gpuStream_t stream);

}  // namespace mlacore
