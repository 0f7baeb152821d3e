// The MLA decode kernels' launchers, one per kernel file, called by the
// dispatch in mla_decode_launch.cu. Each launches one kernel on `stream` for
// a validated DecodeParams; none allocates or synchronizes.
#pragma once

#include <cstdint>

#include "gpu/compat.h"
#include "decode/mla_decode.h"

namespace mlacore {

#if defined(MLACORE_GPU_CUDA)
// mla_decode_mma.cu (CUDA only). The configuration that serves rows_cap query
// rows per request on `device`: 1 (one 16-row group, rows_cap <= 16), 4
// (64-row tiles), or 0 when the device's opt-in shared memory per block is
// too small for it.
int mla_decode_mma_groups(int64_t rows_cap, int device);
template <class Idx>
void launch_mla_decode_mma(const DecodeParams<Idx>& p, bool bf16, int groups, gpuStream_t stream);
#endif

// mla_decode_portable.cu: one block per (work item, query row).
template <class Idx>
void launch_mla_decode_portable(const DecodeParams<Idx>& p, bool bf16, gpuStream_t stream);

// mla_decode_combine.cu: merges the partials of split requests; returns at
// once for an empty batch.
template <class Idx>
void launch_mla_decode_combine(const DecodeParams<Idx>& p, bool bf16, gpuStream_t stream);

}  // namespace mlacore
