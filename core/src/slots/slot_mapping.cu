// GPU kernels of the slot-mapping ops: slot_mapping (FlashInfer's batch
// indices and positions to vLLM slots, -1 for a token to skip),
// page_indices_from_block_table (a [B, max_blocks] table of any strides to
// kv_indices) and batch_indices_positions. Each is one launch on the caller's
// stream with no allocation and no sync, hence CUDA-graph capturable; the
// element work is the MLACORE_HD code the CPU loops run too, and every
// page-table read is bounds-checked there.
#include "gpu/compat.h"
#include "slots/slot_mapping.h"

namespace mlacore {
namespace {

constexpr int kTokenThreads = 256;
constexpr int kRowThreads = 128;

// One thread per token, grid-stride so any nnz fits the capped grid. The
// index reads are gathers through strided views, so there is no contiguous
// run to vectorize; consecutive threads still touch consecutive elements of
// contiguous inputs and outputs, which coalesces.
template <class Args>
__global__ void __launch_bounds__(kTokenThreads) per_token_kernel(Args args) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < args.nnz; t += step) args.run(t);
}

// One block per row (grid-stride over rows), threads across the row's
// entries: rows are short (max_blocks), so a block per row keeps every
// thread's cu reads on one broadcast address.
template <class T, class Cu>
__global__ void __launch_bounds__(kRowThreads) block_table_kernel(BlockTableArgs<T, Cu> args) {
  for (int64_t r = blockIdx.x; r < args.rows; r += gridDim.x) {
    int64_t dst = 0, count = 0;
    if (!args.row_range(r, dst, count)) continue;
    for (int64_t j = threadIdx.x; j < count; j += blockDim.x) args.copy(r, dst, j);
  }
}

}  // namespace

template <class Tok, class Idx>
void launch_slot_mapping(const SlotMappingArgs<Tok, Idx>& args, int device, void* stream) {
  gpu::DeviceGuard guard(device);
  per_token_kernel<<<gpu::blocks_for(args.nnz, kTokenThreads), kTokenThreads, 0, gpu::as_stream(stream)>>>(args);
  gpu::check_launch("slot_mapping");
}

template <class T, class Cu>
void launch_block_table(const BlockTableArgs<T, Cu>& args, int device, void* stream) {
  gpu::DeviceGuard guard(device);
  block_table_kernel<<<gpu::blocks_for(args.rows, 1), kRowThreads, 0, gpu::as_stream(stream)>>>(args);
  gpu::check_launch("page_indices_from_block_table");
}

template <class Idx, class Out>
void launch_batch_positions(const BatchPositionsArgs<Idx, Out>& args, int device, void* stream) {
  gpu::DeviceGuard guard(device);
  per_token_kernel<<<gpu::blocks_for(args.nnz, kTokenThreads), kTokenThreads, 0, gpu::as_stream(stream)>>>(args);
  gpu::check_launch("get_batch_indices_positions");
}

#define MLACORE_INSTANTIATE(A, B)                                                               \
  template void launch_slot_mapping<A, B>(const SlotMappingArgs<A, B>&, int, void*);            \
  template void launch_block_table<A, B>(const BlockTableArgs<A, B>&, int, void*);              \
  template void launch_batch_positions<A, B>(const BatchPositionsArgs<A, B>&, int, void*);
MLACORE_INSTANTIATE(int32_t, int32_t)
MLACORE_INSTANTIATE(int32_t, int64_t)
MLACORE_INSTANTIATE(int64_t, int32_t)
MLACORE_INSTANTIATE(int64_t, int64_t)
#undef MLACORE_INSTANTIATE

}  // namespace mlacore
