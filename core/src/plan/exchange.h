// The GPU side of a plan's builds, as its host code (plan_builder.cpp) calls
// it: the mapped pinned staging a plan owns, the exchange (build() with
// device inputs: one kernel decides and places the schedule and hands the
// host its verdict and counts through the staging, exchange.cu), and the
// upload of a host-built schedule.
// Contract: no call allocates past staging_create(), none synchronizes a
// stream (staging_wait waits only for the previous upload's event), and every
// exchange word is tagged with its build's sequence number.
#pragma once

#include <cstddef>
#include <cstdint>

#include "plan/schedule_algorithm.h"

namespace mlacore {

#if defined(MLACORE_WITH_CUDA) || defined(MLACORE_WITH_HIP)
namespace plan_gpu {
// Pinned staging owned by a plan, mapped into the GPU's address space: the
// schedule region (schedule_bytes), the three inputs (input_bytes) and the
// control line of the exchange, plus the event that guards
// host-input uploads. Defined in exchange.cu so that only the GPU sources
// need the GPU runtime headers.
struct Staging;
Staging* staging_create(int device, size_t schedule_bytes, size_t input_bytes);
void staging_destroy(Staging* s) noexcept;
void* staging_host(Staging* s);
size_t staging_inputs_offset(const Staging* s);
int staging_device(const Staging* s);
// Returns once the previous host-input upload from the schedule region has
// finished: a query first, a blocking wait only when it has not.
void staging_wait(Staging* s);
// Raises when `stream` is capturing a CUDA graph: a host round trip cannot be captured.
void refuse_capture(void* stream, const char* what);

// What the exchange kernel hands the host in two steps, each below 2^31.
// The verdict, as soon as the totals are reduced: the error bits (the start
// check folded in) and, for an accepted batch, the maxima and
// qo_indptr[batch]. That is all a build waits for.
struct StagedVerdict {
  uint32_t error;  // != 0: the kernel rejected the batch and left the schedule alone
  uint32_t max_qo_len, max_kv_len;
  uint32_t total_qo;
};
// The schedule's counts, once an accepted batch's chunk is picked (rejected
// ones never send any): read only when someone asks for the info.
struct StagedCounts {
  uint32_t chunk_tiles;
  uint32_t num_work, num_partials;
};

// The exchange (build() with device inputs), see exchange.cu. One 1-block
// kernel decides the schedule from the three inputs (any width and stride),
// hands over its verdict and then its counts, tagged with a fresh sequence
// number, which it returns, and unless it rejected the batch writes the whole
// schedule (place_schedule) into `meta`. On a rejection it first stores the
// inputs into the inputs region (qo_indptr, kv_indptr at +off_kv, kv_len at
// +off_len bytes) for the host's message. It never waits for the host.
// Throws only when the launch failed.
uint64_t exchange_launch(Staging* s, const ScheduleInputs& in, size_t off_kv, size_t off_len,
                         const ScheduleLayout& layout, int32_t* meta, void* stream);
// Blocks the host thread until kernel `seq`'s verdict has arrived, i.e. until
// the stream reaches it and it has validated the batch (what any round trip
// costs), and returns it. Throws when the stream reports an error, or went
// idle without it.
StagedVerdict exchange_wait(Staging* s, uint64_t seq, void* stream);
// The counts of accepted kernel `seq`, whose verdict exchange_wait() returned:
// they follow it by the chunk's decision (a microsecond or two), so this
// spins. Throws if a later kernel has replaced them (only after a build whose
// wait threw) or the device fails.
StagedCounts exchange_counts(Staging* s, uint64_t seq);

// Copies `bytes` from the start of the staging buffer to `device_dst`, async,
// and records the event staging_wait() checks.
void upload(Staging* s, void* device_dst, size_t bytes, void* stream);
}  // namespace plan_gpu
#endif

}  // namespace mlacore
