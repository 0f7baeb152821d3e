// The plan object and its C ABI: capacity and input checks, then the build
// on the host (schedule_host.cpp), through the exchange kernel (exchange.cu)
// or by the device-only kernel (build_device.cu). The schedule itself is
// build_schedule() in schedule_algorithm.h.
#include "plan/plan_builder.h"
#include "plan/schedule_host.h"

#include <mlacore/plan.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "common/dispatch.h"
#include "common/error.h"

static_assert(MLACORE_PLAN_ERROR_INDPTR_START == mlacore::kPlanErrorIndptrStart &&
                  MLACORE_PLAN_ERROR_INDPTR == mlacore::kPlanErrorIndptr &&
                  MLACORE_PLAN_ERROR_KV_LEN == mlacore::kPlanErrorKvLen,
              "the C ABI's error bits are the header's");

namespace mlacore {
namespace {

constexpr int64_t kMaxInt32 = 2147483647;
// Work items and partials share one int32-indexed space; the scan that
// places them needs both totals below 2^31.
constexpr int64_t kMaxCapacity = kMaxScheduleCapacity;

[[maybe_unused]] int64_t align_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

void check_capacity(int64_t max_batch, int64_t max_work) {
  if (max_batch < 0 || max_batch > kMaxCapacity)
    value_error("max_batch: expected 0 <= max_batch <= ", kMaxCapacity, ", got ", max_batch);
  if (max_work < max_batch || max_work < 1 || max_work > kMaxCapacity)
    value_error("max_work: expected max_batch=", max_batch, " <= max_work <= ", kMaxCapacity,
                " (every request needs one work item), got ", max_work);
}

IndexView view_of(const CheckedTensor& a) {
  return IndexView{a.data(), a.stride(0), a.dtype() == DType::I64};
}

}  // namespace

// MLACORE_SCHEDULE, read when a plan is created: "longest_first" (or unset,
// the default) places work items longest first (place_longest_first() in
// schedule_algorithm.h), "legacy" in request order. A knob for A/B runs.
static bool longest_first_from_env() {
  const char* v = std::getenv("MLACORE_SCHEDULE");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "longest_first") == 0) return true;
  if (std::strcmp(v, "legacy") == 0) return false;
  value_error("MLACORE_SCHEDULE: expected legacy or longest_first, got '", v, "'");
}

PlanBuilder::PlanBuilder(int64_t max_batch, int64_t max_work, int64_t num_sms)
    : layout_{max_batch, max_work}, num_sms_(num_sms), longest_first_(longest_first_from_env()) {
  if (num_sms < 1 || num_sms > 65536) value_error("num_sms: expected 1 <= num_sms <= 65536, got ", num_sms);
  check_capacity(max_batch, max_work);
  tiles_.resize(static_cast<size_t>(max_batch));
}

PlanBuilder::~PlanBuilder() {
#if defined(MLACORE_WITH_GPU)
  plan_gpu::staging_destroy(staging_);
#endif
}

ScheduleInputs PlanBuilder::check_inputs(const CheckedTensor& qo, const CheckedTensor& kv, const CheckedTensor& len, const CheckedTensor& meta,
                                         int64_t page_size, int64_t num_heads) const {
  qo.expect_index_vector();
  if (qo.size(0) < 1) value_error("qo_indptr: expected length batch+1 >= 1, got ", qo.describe());
  const int64_t B = qo.size(0) - 1;
  if (B > layout_.max_batch)
    value_error("qo_indptr: batch ", B, " (length ", B + 1, ") exceeds the plan's max_batch=", layout_.max_batch);
  kv.expect_index_vector(B + 1, "batch+1");
  len.expect_index_vector(B, "batch");
  kv.expect_same_device(qo);
  len.expect_same_device(qo);
  if (page_size < 1) value_error("page_size: expected >= 1, got ", page_size);
  if (num_heads < 1) value_error("num_heads: expected >= 1, got ", num_heads);
  if (num_heads > kMaxDecodeHeads) value_error("num_heads: expected <= ", kMaxDecodeHeads, ", got ", num_heads);

  meta.expect_ndim(1);
  meta.expect_dtype({DType::I32});
  if (meta.size(0) < layout_.total())
    value_error("schedule: expected at least ", layout_.total(), " int32 elements (max_batch=", layout_.max_batch,
                ", max_work=", layout_.max_work, "), got ", meta.describe());
  if (meta.size(0) > 1 && meta.stride(0) != 1)
    value_error("schedule: expected a contiguous tensor, got stride ", meta.stride(0));
  if (reinterpret_cast<uintptr_t>(meta.data()) % 16 != 0)
    value_error("schedule: expected 16-byte aligned data (work items are read as 16-byte vectors)");
  if (qo.on_gpu()) meta.expect_same_device(qo);

  ScheduleInputs in;
  in.qo_indptr = view_of(qo);
  in.kv_indptr = view_of(kv);
  in.kv_len = view_of(len);
  in.batch = B;
  in.page_size = page_size;
  in.num_heads = num_heads;
  in.num_sms = num_sms_;
  in.partial_rows = partial_rows_;
  in.partial_qo_len = partial_qo_len_;
  in.longest_first = longest_first_;
  return in;
}

static_assert(kNoPartialBudget == MLACORE_PLAN_NO_PARTIAL_BUDGET, "one sentinel for the core and the C ABI");

void PlanBuilder::set_partial_budget(int64_t partial_rows, int64_t partial_qo_len) {
  if (partial_rows < kNoPartialBudget)
    value_error("partial_rows: expected >= 0, or ", kNoPartialBudget, " for no budget, got ", partial_rows);
  if (partial_qo_len < 0 || partial_qo_len > kMaxInt32)
    value_error("partial_qo_len: expected 0 <= partial_qo_len <= 2^31-1, got ", partial_qo_len);
  partial_rows_ = partial_rows;
  partial_qo_len_ = partial_qo_len;
}

void PlanBuilder::record_info(const int32_t* meta) {
  info_.batch = meta[kHdrBatch];
  info_.num_work = meta[kHdrNumWork];
  info_.num_partials = meta[kHdrNumPartials];
  info_.max_qo_len = meta[kHdrMaxQoLen];
  info_.max_kv_len = meta[kHdrMaxKvLen];
  info_.chunk_tokens = meta[kHdrChunkTokens];
  info_.total_qo = meta[kHdrTotalQo];
  info_.error = meta[kHdrError];
  info_.on_host = true;
  counts_seq_ = 0;
}

const PlanInfo& PlanBuilder::info() const {
#if defined(MLACORE_WITH_GPU)
  if (counts_seq_ != 0) {
    const plan_gpu::StagedCounts c = plan_gpu::exchange_counts(staging_, counts_seq_);
    info_.num_work = static_cast<int32_t>(c.num_work);
    info_.num_partials = static_cast<int32_t>(c.num_partials);
    info_.chunk_tokens = static_cast<int32_t>(static_cast<int64_t>(c.chunk_tiles) * kDecodeTileTokens);
    counts_seq_ = 0;
  }
#endif
  return info_;
}

void PlanBuilder::build(const DLTensor* qo_indptr, const DLTensor* kv_indptr, const DLTensor* kv_len_arr,
                        int64_t page_size, int64_t num_heads, const DLTensor* schedule, void* stream) {
  const CheckedTensor qo(qo_indptr, "qo_indptr"), kv(kv_indptr, "kv_indptr"), len(kv_len_arr, "kv_len_arr");
  const CheckedTensor meta(schedule, "schedule");
  const ScheduleInputs in = check_inputs(qo, kv, len, meta, page_size, num_heads);
  const Where inputs_at = where_to_run(qo);
  const Where meta_at = where_to_run(meta);

  if (inputs_at == Where::CPU && meta_at == Where::CPU) {
    schedule_host(in, layout_, meta.ptr<int32_t>(), tiles_.data());
    record_info(meta.ptr<int32_t>());
    return;
  }
#if defined(MLACORE_WITH_GPU)
  // Before any launch: a capture would record the exchange kernel, whose
  // replay would spin with no host on the other end.
  plan_gpu::refuse_capture(stream, "plan build");
  const int device = meta.device_id();
  if (staging_ == nullptr) {
    // Once per plan, for the full capacity: the schedule region, room for the
    // three inputs at their widest (int64) and the handshake's flags, so no
    // later build of any batch size allocates pinned memory again.
    staging_ = plan_gpu::staging_create(device, static_cast<size_t>(layout_.total() * 4),
                                        static_cast<size_t>(3 * (layout_.max_batch + 1) * 8));
    ++stats_.pinned_allocations;
    stats_.staging = plan_gpu::staging_host(staging_);
  } else if (plan_gpu::staging_device(staging_) != device) {
    value_error("schedule: this plan serves GPU ", plan_gpu::staging_device(staging_), ", got a tensor on ",
                meta.device_str());
  }
  char* host = static_cast<char*>(plan_gpu::staging_host(staging_));
  int32_t* host_meta = reinterpret_cast<int32_t*>(host);
  const size_t schedule_bytes = static_cast<size_t>(layout_.total() * 4);

  if (inputs_at == Where::GPU) {
    // The exchange: one kernel validates the inputs, hands the verdict to
    // this thread through the mapped staging buffer, picks the chunk, sends
    // its counts the same way and places the work items into the schedule
    // tensor. One launch, no memcpy, no stream synchronization; this thread
    // blocks only until the stream reaches the kernel and it has validated
    // the batch, as any round trip does. Kernels after it on the stream read
    // the schedule in stream order, so nothing else needs to wait.
    const auto width = [](const IndexView& v) -> int64_t { return v.is64 ? 8 : 4; };
    const int64_t off_kv = align_up((in.batch + 1) * width(in.qo_indptr), 8);
    const int64_t off_len = off_kv + align_up((in.batch + 1) * width(in.kv_indptr), 8);
    const char* inputs = host + plan_gpu::staging_inputs_offset(staging_);
    ScheduleInputs host_in = in;
    host_in.qo_indptr = IndexView{inputs, 1, in.qo_indptr.is64};
    host_in.kv_indptr = IndexView{inputs + off_kv, 1, in.kv_indptr.is64};
    host_in.kv_len = IndexView{inputs + off_len, 1, in.kv_len.is64};
    // Scalars the kernel relies on, before it can see them.
    check_scalar_args(in, layout_);
    const uint64_t seq = plan_gpu::exchange_launch(staging_, in, static_cast<size_t>(off_kv),
                                                   static_cast<size_t>(off_len), layout_, meta.ptr<int32_t>(),
                                                   stream);
    const plan_gpu::StagedVerdict v = plan_gpu::exchange_wait(staging_, seq, stream);
    ++stats_.device_to_host;
    if (v.error != 0) {
      // The kernel flags exactly what scan_requests() and check_scalars()
      // reject, staged the inputs and left the schedule alone.
      validate_host(host_in, layout_);  // throws, naming the request
      runtime_error("plan: the exchange kernel flagged the inputs (error bits ", v.error,
                    ") but the host's validation accepts them");
    }
    // The info the kernel's header will hold, by the same function; its
    // counts come with info(), a chunk's decision after the verdict.
    ScheduleTotals maxima;
    maxima.max_qo_len = v.max_qo_len;
    maxima.max_kv_len = v.max_kv_len;
    int32_t header[kHdrSize];
    write_header(header, 0, 0, in.batch, maxima, 0, v.total_qo, 0);
    record_info(header);
    counts_seq_ = seq;
    return;
  }
  // Host inputs: schedule into the pinned region, one async H2D copy. The
  // region must be free of the previous upload (exchange kernels never read it).
  plan_gpu::staging_wait(staging_);
  schedule_host(in, layout_, host_meta, tiles_.data());
  record_info(host_meta);
  plan_gpu::upload(staging_, meta.data(), schedule_bytes, stream);
  ++stats_.host_to_device;
#else
  (void)stream;
  runtime_error("schedule: GPU tensors need a libmlacore built with a GPU backend");
#endif
}

void PlanBuilder::build_device(const DLTensor* qo_indptr, const DLTensor* kv_indptr, const DLTensor* kv_len_arr,
                               int64_t page_size, int64_t num_heads, const DLTensor* schedule, void* stream) {
  const CheckedTensor qo(qo_indptr, "qo_indptr"), kv(kv_indptr, "kv_indptr"), len(kv_len_arr, "kv_len_arr");
  const CheckedTensor meta(schedule, "schedule");
  const ScheduleInputs in = check_inputs(qo, kv, len, meta, page_size, num_heads);
  if (!qo.on_gpu())
    value_error("qo_indptr: build_device needs GPU tensors (it computes the schedule in a kernel), got ",
                qo.describe());
  if (!meta.on_gpu()) value_error("schedule: build_device needs a GPU tensor, got ", meta.describe());
  (void)where_to_run(qo);
#if defined(MLACORE_WITH_GPU)
  plan_gpu::launch_build_schedule(in, layout_, meta.ptr<int32_t>(), meta.device_id(), stream);
  ++stats_.device_builds;
  info_ = PlanInfo{};
  info_.batch = static_cast<int32_t>(in.batch);
  info_.on_host = false;
  counts_seq_ = 0;
#else
  (void)in;
  (void)stream;
#endif
}

}  // namespace mlacore

struct mlacore_plan : mlacore::PlanBuilder {
  using mlacore::PlanBuilder::PlanBuilder;
};

namespace {
void require_plan(const void* plan) {
  if (plan == nullptr) mlacore::type_error("plan: expected a plan handle, got NULL");
}
}  // namespace

extern "C" {

MLACORE_API int64_t mlacore_plan_default_max_work(int64_t max_batch, int32_t num_sms) {
  // Saturates instead of overflowing for a max_batch near INT64_MAX.
  const int64_t extra = num_sms > 0 ? num_sms : 1;
  if (max_batch > std::numeric_limits<int64_t>::max() - extra) return std::numeric_limits<int64_t>::max();
  return mlacore::default_max_work(max_batch < 0 ? 0 : max_batch, num_sms);
}

MLACORE_API int64_t mlacore_plan_schedule_size(int64_t max_batch, int64_t max_work) {
  if (max_batch < 0 || max_work < 0 || max_batch > mlacore::kMaxCapacity || max_work > mlacore::kMaxCapacity)
    return -1;
  return mlacore::ScheduleLayout{max_batch, max_work}.total();
}

MLACORE_API mlacore_status mlacore_plan_layout(int64_t max_batch, int64_t max_work, int64_t* offsets) {
  return mlacore::guarded([&] {
    if (offsets == nullptr) mlacore::type_error("offsets: expected an array of 4, got NULL");
    mlacore::check_capacity(max_batch, max_work);
    const mlacore::ScheduleLayout layout{max_batch, max_work};
    offsets[0] = layout.header();
    offsets[1] = layout.last_page_len();
    offsets[2] = layout.split_indptr();
    offsets[3] = layout.work();
  });
}

MLACORE_API mlacore_status mlacore_plan_create(int64_t max_batch, int64_t max_work, int32_t num_sms,
                                               mlacore_plan** out) {
  return mlacore::guarded([&] {
    if (out == nullptr) mlacore::type_error("out: expected a place for the plan handle, got NULL");
    *out = nullptr;
    // Clamped first: max_batch + num_sms overflows for a max_batch near
    // INT64_MAX, and the constructor rejects any max_batch out of range.
    if (max_work <= 0)
      max_work = mlacore::default_max_work(max_batch < 0 ? 0 : std::min(max_batch, mlacore::kMaxCapacity + 1), num_sms);
    *out = new mlacore_plan(max_batch, max_work, num_sms);
  });
}

MLACORE_API void mlacore_plan_destroy(mlacore_plan* plan) { delete plan; }

MLACORE_API mlacore_status mlacore_plan_build(mlacore_plan* plan, const DLTensor* qo_indptr,
                                              const DLTensor* kv_indptr, const DLTensor* kv_len_arr,
                                              int32_t page_size, int32_t num_heads, const DLTensor* schedule,
                                              void* stream) {
  return mlacore::guarded([&] {
    require_plan(plan);
    plan->build(qo_indptr, kv_indptr, kv_len_arr, page_size, num_heads, schedule, stream);
  });
}

MLACORE_API mlacore_status mlacore_plan_build_device(mlacore_plan* plan, const DLTensor* qo_indptr,
                                                     const DLTensor* kv_indptr, const DLTensor* kv_len_arr,
                                                     int32_t page_size, int32_t num_heads,
                                                     const DLTensor* schedule, void* stream) {
  return mlacore::guarded([&] {
    require_plan(plan);
    plan->build_device(qo_indptr, kv_indptr, kv_len_arr, page_size, num_heads, schedule, stream);
  });
}

MLACORE_API mlacore_status mlacore_plan_capacity(const mlacore_plan* plan, int64_t* max_batch, int64_t* max_work,
                                                 int32_t* num_sms) {
  return mlacore::guarded([&] {
    require_plan(plan);
    if (max_batch) *max_batch = plan->layout().max_batch;
    if (max_work) *max_work = plan->layout().max_work;
    if (num_sms) *num_sms = static_cast<int32_t>(plan->num_sms());
  });
}

MLACORE_API mlacore_status mlacore_plan_set_partial_budget(mlacore_plan* plan, int64_t partial_rows,
                                                           int64_t partial_qo_len) {
  return mlacore::guarded([&] {
    require_plan(plan);
    plan->set_partial_budget(partial_rows, partial_qo_len);
  });
}

MLACORE_API mlacore_status mlacore_plan_get_info(const mlacore_plan* plan, mlacore_plan_info* out) {
  return mlacore::guarded([&] {
    require_plan(plan);
    if (out == nullptr) mlacore::type_error("out: expected a mlacore_plan_info, got NULL");
    const mlacore::PlanInfo& i = plan->info();
    *out = mlacore_plan_info{i.batch,        i.num_work, i.num_partials, i.max_qo_len, i.max_kv_len,
                             i.chunk_tokens, i.total_qo, i.error,        i.on_host ? 1 : 0, 0};
  });
}

MLACORE_API mlacore_status mlacore_plan_get_stats(const mlacore_plan* plan, mlacore_plan_stats* out) {
  return mlacore::guarded([&] {
    require_plan(plan);
    if (out == nullptr) mlacore::type_error("out: expected a mlacore_plan_stats, got NULL");
    const mlacore::PlanStats& s = plan->stats();
    *out = mlacore_plan_stats{s.pinned_allocations, s.device_to_host, s.host_to_device,
                              s.stream_syncs,       s.device_builds,  s.staging};
  });
}

}  // extern "C"
