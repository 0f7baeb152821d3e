// The seesaw wgmma (sm_90a) MLA decode kernel for 64-row query tiles over
// caches whose page size is a multiple of 64 (mla_decode_seesaw.cu),
// launched by mla_decode_launch.cu when MLACORE_DECODE_KERNEL=seesaw asks
// for it. CUDA builds only.
#pragma once

#include "gpu/compat.h"
#include "decode/mla_decode.h"

namespace mlacore {

// Launches the seesaw decode kernel (not the combine) for 64-row tiles on
// `stream`; false, launching nothing, when it cannot serve the call: the
// device is not compute capability 9.0, the library carries no sm_90a code,
// the page size is not a multiple of 64, or the caches' addresses or strides
// are not what TMA reads. Throws only when a launch that should work fails.
template <class Idx>
bool launch_mla_decode_seesaw(const DecodeParams<Idx>& p, bool bf16, gpuStream_t stream);

}  // namespace mlacore
