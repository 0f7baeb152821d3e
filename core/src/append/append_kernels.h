// The paged append's kernel entry points, one per kernel file, as the
// launcher (append_launch.cu, launch_gpu) calls them once it has picked the
// kernel for a call. Each launches on `stream` with no allocation and no
// synchronization; `p` is the call's KParams (append_device.cuh) with
// `width`-byte accesses.
#pragma once

#include "append/append_device.cuh"

namespace mlacore::append {

// append_rows.cu: the rows kernel (small appends, every slot-mapped one).
// Sets p's lanes and grid; false when the call is past one launch of it.
bool rows_shape(KParams& p, dim3& grid);
// A page-table append, 16-byte accesses, batch_indices and positions of one dtype.
void launch_rows_by_table(const Job& job, const KParams& p, dim3 grid, gpuStream_t stream);
// A slot-mapped append (concat_and_cache_mla): flat rows, any access width.
void launch_rows_by_slot(const Job& job, const KParams& p, int width, dim3 grid, gpuStream_t stream);

// append_classic.cu: the portable kernel, a persistent grid of equal shares.
void launch_classic(const Job& job, KParams& p, int width, int device, gpuStream_t stream);

#if defined(MLACORE_GPU_CUDA)
// append_sm90.cu: the sm_90 warp and bulk kernels for the row shapes they
// serve (16-byte accesses); false when none applies or the device has no
// sm_90 code for them, and nothing was launched.
bool launch_sm90(const Job& job, const KParams& p, int device, gpuStream_t stream);
#endif

}  // namespace mlacore::append
