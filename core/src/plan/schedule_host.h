// The host build of a schedule (PlanBuilder::build with host inputs, and the
// check of inputs a rejecting exchange kernel staged): validation with the
// ValueError naming the argument or the request, then the chunk and the
// placement, as build_schedule(SerialExec{}, ...) of schedule_algorithm.h
// computes them but in division-free passes, since it sits on the latency
// path of every plan. Defined in schedule_host.cpp.
// Contract: bit-identical to build_schedule() for valid inputs; on a
// rejection `meta` is untouched (the per-request scratch is `tiles`).
#pragma once

#include <cstdint>

#include "plan/schedule_algorithm.h"

namespace mlacore {

// The checks of the scalar inputs (batch against the capacity, page_size,
// num_heads, num_sms) that read no input element.
void check_scalar_args(const ScheduleInputs& in, const ScheduleLayout& layout);

// Validates the inputs and writes the whole ScheduleLayout::total() schedule
// into `meta`; `tiles` (max_batch entries) is the caller's scratch.
void schedule_host(const ScheduleInputs& in, const ScheduleLayout& layout, int32_t* meta, RequestTiles* tiles);

// Validation alone (of the inputs a rejecting exchange kernel staged): throws
// the ValueError naming the argument or the request.
void validate_host(const ScheduleInputs& in, const ScheduleLayout& layout);

}  // namespace mlacore
