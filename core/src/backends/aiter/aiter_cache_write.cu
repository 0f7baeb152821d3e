// The AITER cache-write route's device side (HIP builds only): the slot
// kernel, which runs the same append_slot() as the CPU loop and the native
// append's page-table lookup, and the device memory the route keeps.
#include "gpu/compat.h"

#include "backends/aiter/aiter_cache_write.h"

namespace mlacore {
namespace {

constexpr int kSlotThreads = 256;

__global__ void append_slots_kernel(append::Job job, int64_t* slots) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < job.nnz; i += step)
    slots[i] = append_slot(job, i);
}

}  // namespace

void launch_append_slots(const append::Job& job, int64_t* slots, int device, void* stream) {
  if (job.nnz == 0) return;
  gpu::DeviceGuard guard(device);
  append_slots_kernel<<<gpu::blocks_for(job.nnz, kSlotThreads), kSlotThreads, 0, gpu::as_stream(stream)>>>(job,
                                                                                                          slots);
  gpu::check_launch("append_slots_kernel");
}

void* aiter_device_alloc(int64_t bytes, int device) {
  gpu::DeviceGuard guard(device);
  void* p = nullptr;
  gpu::check(hipMalloc(&p, static_cast<size_t>(bytes)), "hipMalloc (AITER route buffer)");
  return p;
}

void aiter_device_upload(void* dst, const void* src, int64_t bytes, int device) {
  gpu::DeviceGuard guard(device);
  gpu::check(hipMemcpy(dst, src, static_cast<size_t>(bytes), hipMemcpyHostToDevice), "hipMemcpy (AITER scale)");
}

}  // namespace mlacore
