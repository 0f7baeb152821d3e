// The contract between the plan builder (which writes a decode schedule) and
// the decode kernels (which read it). Host and device see the same int32
// layout, so a schedule computed on the host is one H2D copy away from the
// kernels, and one computed by a kernel (CUDA-graph mode) needs no copy.
//
// A decode is split into work items: a contiguous KV token range of one
// request, for all of that request's query rows (qo_len * num_heads rows,
// processed in tiles of kDecodeTileRows by the grid's y dimension). A request
// whose KV is split in several items writes fp32 partial outputs + LSE, merged
// by the combine kernel; a request with one item writes its output directly.
#pragma once

#include <cstdint>

namespace mlacore {

// KV tokens per kernel tile; split boundaries fall on multiples of it.
constexpr int32_t kDecodeTileTokens = 64;
// Query rows (qo_len * heads, packed) per CTA.
constexpr int32_t kDecodeTileRows = 64;
// Heads the decode kernels take; the plan refuses more, which also keeps its
// cost sums (query tiles x KV tiles over a batch) within int64.
constexpr int64_t kMaxDecodeHeads = 128;

// One unit of decode work. request < 0 marks padding (a no-op), so a grid
// sized for the capacity stays valid for any smaller batch (CUDA graphs).
struct WorkItem {
  int32_t request;
  int32_t kv_begin;  // token range [kv_begin, kv_end) of the request's KV
  int32_t kv_end;
  int32_t partial;   // index of its partial output, or -1: write `out` directly
};
static_assert(sizeof(WorkItem) == 16, "WorkItem is read as one 16-byte vector");

// Fixed header at the start of the schedule buffer.
enum ScheduleHeader : int32_t {
  kHdrNumWork = 0,      // work items in use (<= max_work); the rest are padding
  kHdrNumPartials = 1,  // partial outputs in use
  kHdrBatch = 2,        // requests planned (<= max_batch)
  kHdrMaxQoLen = 3,
  kHdrMaxKvLen = 4,
  kHdrChunkTokens = 5,  // KV tokens per split (multiple of kDecodeTileTokens)
  kHdrTotalQo = 6,      // qo_indptr[batch]
  kHdrError = 7,        // 0, or kPlanError* bits (schedule_algorithm.h): such requests got no work
  kHdrSize = 8
};

// The largest max_batch and max_work a schedule may have: every offset of
// the layout below then fits int32 with room to spare.
constexpr int64_t kMaxScheduleCapacity = int64_t{1} << 28;

// Offsets (in int32 elements) of each section of the schedule buffer for a
// capacity of max_batch requests and max_work work items.
struct ScheduleLayout {
  int64_t max_batch;
  int64_t max_work;

  static constexpr int64_t header() { return 0; }
  // kv_last_page_len[b] = kv_len - (pages - 1) * page_size; 0 for empty requests.
  constexpr int64_t last_page_len() const { return kHdrSize; }
  // Partials of request b: [split_indptr[b], split_indptr[b+1]); one entry per
  // request + 1. A request with split count 1 has no partials (written directly).
  constexpr int64_t split_indptr() const { return last_page_len() + max_batch; }
  // WorkItem[max_work], 16-byte aligned.
  constexpr int64_t work() const { return (split_indptr() + max_batch + 1 + 3) / 4 * 4; }
  constexpr int64_t total() const { return work() + 4 * max_work; }
};

}  // namespace mlacore
