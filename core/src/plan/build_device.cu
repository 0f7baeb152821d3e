// The device-only build (PlanBuilder::build_device): build_schedule_kernel,
// one block that computes the whole schedule from device inputs, with the
// exchange's decision and placement but without the host, and its launcher.
// Contract: no synchronization, no allocation, capturable in a CUDA graph;
// for valid batches the schedule equals the host build's bit for bit; a
// batch with an invalid request takes build_schedule() itself, which gives
// each such request no work and records its PlanError bits in the header.
#include "gpu/compat.h"
#include "plan/block_schedule.cuh"
#include "plan/build_device.h"

namespace mlacore::plan_gpu {
namespace {

// The device-only schedule: the exchange's decision and placement without
// the host. A batch with an invalid request (rare: the device-only path
// flags them in the header instead of raising) takes build_schedule() itself,
// which gives each such request no work and records its bits; for valid
// batches the two agree bit for bit (the decision restates the shared
// helpers, test_plan compares both with the host). The generic helpers' checked
// 64-bit divisions one after another are too slow for this kernel, which a
// CUDA graph replays ahead of every decode.
template <bool kLongestFirst>
__global__ void __launch_bounds__(kScheduleThreads, 1)
    build_schedule_kernel(ScheduleInputs in, ScheduleLayout layout, int32_t* meta, uint64_t sms_magic,
                          uint64_t spare_magic) {
  // int64 elements: the reductions store structs of int64 fields there.
  __shared__ int64_t smem[kSharedBytes / sizeof(int64_t)];
  __shared__ DecisionSlots slots;
  __shared__ int64_t decided_chunk;  // -1: an invalid request
  ScheduleTotals t;
  if (decides(in)) {
    Share share{};
    uint32_t total_qo = 0;
    t = reduce_totals(in, reducer_of(in, slots.totals), share, total_qo);
    int64_t chunk = -1;
    if (t.error == 0)  // uniform over the deciding threads
      chunk = decide_chunk(in, layout, t, share, reducer_of(in, slots.chunk), sms_magic, spare_magic).chunk_tiles;
    if (threadIdx.x == 0) decided_chunk = chunk;
  }
  __syncthreads();
  const BlockExec ex{reinterpret_cast<unsigned char*>(smem)};
  if (decided_chunk < 0) {
    build_schedule_in_order<kLongestFirst>(ex, in, layout, meta);
    return;
  }
  place_in_order<kLongestFirst>(ex, in, layout, true, t, decided_chunk, meta);
}

}  // namespace

void launch_build_schedule(const ScheduleInputs& in, const ScheduleLayout& layout, int32_t* meta, int device,
                           void* stream) {
  gpu::DeviceGuard guard(device);
  auto kernel = in.longest_first ? build_schedule_kernel<true> : build_schedule_kernel<false>;
  kernel<<<1, kScheduleThreads, 0, gpu::as_stream(stream)>>>(in, layout, meta, sms_magic_of(in),
                                                              spare_magic_of(in, layout));
  gpu::check_launch("plan: build_schedule_kernel");
}

}  // namespace mlacore::plan_gpu
