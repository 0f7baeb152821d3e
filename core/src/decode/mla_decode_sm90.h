// The wgmma (sm_90a) MLA decode kernel for 64-row query tiles, launched by
// mla_decode_launch.cu in front of the mma.sync kernel. CUDA builds only.
#pragma once

#include "gpu/compat.h"
#include "decode/mla_decode.h"

namespace mlacore {

// Launches the wgmma decode kernel (not the combine) for 64-row tiles on
// `stream`; false, launching nothing, when it cannot run here: the device is
// not compute capability 9.0, the library carries no sm_90a code for it, or
// the device's opt-in shared memory per block is too small. Throws only when
// a launch that should work fails.
template <class Idx>
bool launch_mla_decode_sm90(const DecodeParams<Idx>& p, bool bf16, gpuStream_t stream);

}  // namespace mlacore
