// The device-only build of a plan (PlanBuilder::build_device, C ABI
// mlacore_plan_build_device): one block computes the whole schedule from
// device inputs on `stream`, with no host involvement, so a CUDA graph can
// capture it. Its result equals the host build's bit for bit for valid
// inputs; an invalid request gets no work and its PlanError bits in the
// header. Defined in build_device.cu.
#pragma once

#include <cstdint>

#include "plan/schedule_algorithm.h"

namespace mlacore::plan_gpu {

#if defined(MLACORE_WITH_CUDA) || defined(MLACORE_WITH_HIP)
// The device-only schedule: one block, no host involvement.
void launch_build_schedule(const ScheduleInputs& in, const ScheduleLayout& layout, int32_t* meta, int device,
                           void* stream);
#endif

}  // namespace mlacore::plan_gpu
