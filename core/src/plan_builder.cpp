// Plan metadata: validation, the host-built schedule, the plan object and its
// C ABI. The schedule itself is build_schedule() in plan_builder.h.
#include "plan_builder.h"

#include <mlacore/plan.h>

#include <cstdint>

#include "dispatch.h"
#include "error.h"

static_assert(MLACORE_PLAN_ERROR_INDPTR_START == mlacore::kPlanErrorIndptrStart &&
                  MLACORE_PLAN_ERROR_INDPTR == mlacore::kPlanErrorIndptr &&
                  MLACORE_PLAN_ERROR_KV_LEN == mlacore::kPlanErrorKvLen,
              "the C ABI's error bits are the header's");

namespace mlacore {
namespace {

constexpr int64_t kMaxInt32 = 2147483647;
// Work items and partials share one int32-indexed space; the scan that
// places them needs both totals below 2^31.
constexpr int64_t kMaxCapacity = int64_t{1} << 28;

[[maybe_unused]] int64_t align_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

void check_capacity(int64_t max_batch, int64_t max_work) {
  if (max_batch < 0 || max_batch > kMaxCapacity)
    value_error("max_batch: expected 0 <= max_batch <= ", kMaxCapacity, ", got ", max_batch);
  if (max_work < max_batch || max_work < 1 || max_work > kMaxCapacity)
    value_error("max_work: expected max_batch=", max_batch, " <= max_work <= ", kMaxCapacity,
                " (every request needs one work item), got ", max_work);
}

IndexView view_of(const Arg& a) {
  return IndexView{a.data(), a.stride(0), a.dtype() == DType::I64};
}

}  // namespace

void validate_schedule_inputs(const ScheduleInputs& in, const ScheduleLayout& layout) {
  const int64_t B = in.batch;
  if (B < 0 || B > layout.max_batch)
    value_error("qo_indptr: batch ", B, " exceeds the plan's max_batch=", layout.max_batch);
  if (in.page_size < 1) value_error("page_size: expected >= 1, got ", in.page_size);
  if (in.num_heads < 1) value_error("num_heads: expected >= 1, got ", in.num_heads);
  if (in.num_sms < 1) value_error("num_sms: expected >= 1, got ", in.num_sms);
  if (in.qo_indptr[0] != 0) value_error("qo_indptr: expected first element 0, got ", in.qo_indptr[0]);
  if (in.kv_indptr[0] != 0) value_error("kv_indptr: expected first element 0, got ", in.kv_indptr[0]);
  // The same conditions request_shape() flags, so a validated batch never
  // reaches the schedule with a skipped request.
  for (int64_t b = 0; b < B; ++b) {
    const int64_t q0 = in.qo_indptr[b], q1 = in.qo_indptr[b + 1];
    const int64_t p0 = in.kv_indptr[b], p1 = in.kv_indptr[b + 1];
    const int64_t len = in.kv_len[b];
    if (q1 < q0)
      value_error("qo_indptr: expected non-decreasing values, got qo_indptr[", b, "]=", q0, " > qo_indptr[", b + 1,
                  "]=", q1, " (request ", b, ")");
    if (q1 > kMaxInt32) value_error("qo_indptr[", b + 1, "]=", q1, ": exceeds int32 (request ", b, ")");
    if (p1 < p0)
      value_error("kv_indptr: expected non-decreasing values, got kv_indptr[", b, "]=", p0, " > kv_indptr[", b + 1,
                  "]=", p1, " (request ", b, ")");
    if (p1 > kMaxInt32) value_error("kv_indptr[", b + 1, "]=", p1, ": exceeds int32 (request ", b, ")");
    if (len < 0 || len > kMaxInt32)
      value_error("kv_len_arr[", b, "]: expected 0 <= kv_len <= 2^31-1, got ", len, " (request ", b, ")");
    const int64_t need = ceil_div(len, in.page_size);
    if (need != p1 - p0)
      value_error("kv_len_arr[", b, "]=", len, ": request ", b, " needs ceil(", len, "/page_size ", in.page_size,
                  ")=", need, " pages, but kv_indptr gives it ", p1 - p0, " (kv_indptr[", b + 1, "]-kv_indptr[", b,
                  "])");
  }
}

void build_schedule_host(const ScheduleInputs& in, const ScheduleLayout& layout, int32_t* meta) {
  check_capacity(layout.max_batch, layout.max_work);
  validate_schedule_inputs(in, layout);
  build_schedule(SerialExec{}, in, layout, meta);
}

void build_schedule_host(const int32_t* qo_indptr, const int32_t* kv_indptr, const int32_t* kv_len_arr,
                         int64_t batch, int64_t page_size, int64_t num_heads, int64_t num_sms,
                         const ScheduleLayout& layout, int32_t* meta) {
  if (qo_indptr == nullptr || kv_indptr == nullptr || (batch > 0 && kv_len_arr == nullptr) || meta == nullptr)
    type_error("build_schedule_host: expected host arrays, got NULL");
  ScheduleInputs in;
  in.qo_indptr = IndexView{qo_indptr, 1, false};
  in.kv_indptr = IndexView{kv_indptr, 1, false};
  in.kv_len = IndexView{kv_len_arr, 1, false};
  in.batch = batch;
  in.page_size = page_size;
  in.num_heads = num_heads;
  in.num_sms = num_sms;
  build_schedule_host(in, layout, meta);
}

PlanBuilder::PlanBuilder(int64_t max_batch, int64_t max_work, int64_t num_sms)
    : layout_{max_batch, max_work}, num_sms_(num_sms) {
  if (num_sms < 1 || num_sms > 65536) value_error("num_sms: expected 1 <= num_sms <= 65536, got ", num_sms);
  check_capacity(max_batch, max_work);
}

PlanBuilder::~PlanBuilder() {
#if defined(MLACORE_WITH_GPU)
  plan_gpu::staging_destroy(staging_);
#endif
}

ScheduleInputs PlanBuilder::check_inputs(const Arg& qo, const Arg& kv, const Arg& len, const Arg& meta,
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

  meta.expect_ndim(1);
  meta.expect_dtype({DType::I32});
  if (meta.size(0) < layout_.total())
    value_error("metadata: expected at least ", layout_.total(), " int32 elements (max_batch=", layout_.max_batch,
                ", max_work=", layout_.max_work, "), got ", meta.describe());
  if (meta.size(0) > 1 && meta.stride(0) != 1)
    value_error("metadata: expected a contiguous tensor, got stride ", meta.stride(0));
  if (reinterpret_cast<uintptr_t>(meta.data()) % 16 != 0)
    value_error("metadata: expected 16-byte aligned data (work items are read as 16-byte vectors)");
  if (qo.on_gpu()) meta.expect_same_device(qo);

  ScheduleInputs in;
  in.qo_indptr = view_of(qo);
  in.kv_indptr = view_of(kv);
  in.kv_len = view_of(len);
  in.batch = B;
  in.page_size = page_size;
  in.num_heads = num_heads;
  in.num_sms = num_sms_;
  return in;
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
}

void PlanBuilder::build(const DLTensor* qo_indptr, const DLTensor* kv_indptr, const DLTensor* kv_len_arr,
                        int64_t page_size, int64_t num_heads, const DLTensor* metadata, void* stream) {
  const Arg qo(qo_indptr, "qo_indptr"), kv(kv_indptr, "kv_indptr"), len(kv_len_arr, "kv_len_arr");
  const Arg meta(metadata, "metadata");
  const ScheduleInputs in = check_inputs(qo, kv, len, meta, page_size, num_heads);
  const Where inputs_at = where_to_run(qo);
  const Where meta_at = where_to_run(meta);

  if (inputs_at == Where::CPU && meta_at == Where::CPU) {
    validate_schedule_inputs(in, layout_);
    build_schedule(SerialExec{}, in, layout_, meta.ptr<int32_t>());
    record_info(meta.ptr<int32_t>());
    return;
  }
#if defined(MLACORE_WITH_GPU)
  plan_gpu::refuse_capture(stream, "plan build");
  const int device = meta.device_id();
  if (staging_ == nullptr) {
    // Once per plan, for the full capacity: the schedule region, then room
    // for the three inputs at their widest (int64), so no later build of
    // any batch size allocates pinned memory again.
    const int64_t bytes = align_up(layout_.total() * 4, 16) + 3 * (layout_.max_batch + 1) * 8;
    staging_ = plan_gpu::staging_create(device, static_cast<size_t>(bytes));
    ++stats_.pinned_allocations;
    stats_.staging = plan_gpu::staging_host(staging_);
  } else if (plan_gpu::staging_device(staging_) != device) {
    value_error("metadata: this plan serves GPU ", plan_gpu::staging_device(staging_), ", got a tensor on ",
                meta.device_str());
  }
  char* host = static_cast<char*>(plan_gpu::staging_host(staging_));
  int32_t* host_meta = reinterpret_cast<int32_t*>(host);

  ScheduleInputs host_in = in;
  if (inputs_at == Where::GPU) {
    // Packed into the metadata tensor itself (it is rewritten by the upload
    // below, in stream order): the plan owns no device memory. It always
    // fits: 3*(batch+1) int64 <= 8 + 2*max_batch + 1 + 4*max_work int32.
    const auto width = [](const IndexView& v) -> int64_t { return v.is64 ? 8 : 4; };
    const int64_t off_kv = align_up((in.batch + 1) * width(in.qo_indptr), 8);
    const int64_t off_len = off_kv + align_up((in.batch + 1) * width(in.kv_indptr), 8);
    const int64_t bytes = off_len + in.batch * width(in.kv_len);
    const int64_t host_offset = align_up(layout_.total() * 4, 16);
    plan_gpu::fetch_inputs(staging_, in, meta.data(), static_cast<size_t>(off_kv), static_cast<size_t>(off_len),
                           static_cast<size_t>(bytes), static_cast<size_t>(host_offset), stream);
    ++stats_.device_to_host;
    ++stats_.stream_syncs;
    host_in.qo_indptr = IndexView{host + host_offset, 1, in.qo_indptr.is64};
    host_in.kv_indptr = IndexView{host + host_offset + off_kv, 1, in.kv_indptr.is64};
    host_in.kv_len = IndexView{host + host_offset + off_len, 1, in.kv_len.is64};
  }
  validate_schedule_inputs(host_in, layout_);
  // The previous upload may still be reading the schedule region.
  plan_gpu::staging_wait(staging_);
  build_schedule(SerialExec{}, host_in, layout_, host_meta);
  record_info(host_meta);
  plan_gpu::upload(staging_, meta.data(), static_cast<size_t>(layout_.total() * 4), stream);
  ++stats_.host_to_device;
#else
  (void)stream;
  runtime_error("metadata: GPU tensors need a libmlacore built with a GPU backend");
#endif
}

void PlanBuilder::build_device(const DLTensor* qo_indptr, const DLTensor* kv_indptr, const DLTensor* kv_len_arr,
                               int64_t page_size, int64_t num_heads, const DLTensor* metadata, void* stream) {
  const Arg qo(qo_indptr, "qo_indptr"), kv(kv_indptr, "kv_indptr"), len(kv_len_arr, "kv_len_arr");
  const Arg meta(metadata, "metadata");
  const ScheduleInputs in = check_inputs(qo, kv, len, meta, page_size, num_heads);
  if (!qo.on_gpu())
    value_error("qo_indptr: build_device needs GPU tensors (it computes the schedule in a kernel), got ",
                qo.describe());
  if (!meta.on_gpu()) value_error("metadata: build_device needs a GPU tensor, got ", meta.describe());
  (void)where_to_run(qo);
#if defined(MLACORE_WITH_GPU)
  plan_gpu::launch_build_schedule(in, layout_, meta.ptr<int32_t>(), meta.device_id(), stream);
  ++stats_.device_builds;
  info_ = PlanInfo{};
  info_.batch = static_cast<int32_t>(in.batch);
  info_.on_host = false;
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
  return mlacore::default_max_work(max_batch < 0 ? 0 : max_batch, num_sms);
}

MLACORE_API int64_t mlacore_plan_metadata_size(int64_t max_batch, int64_t max_work) {
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
    if (max_work <= 0) max_work = mlacore::default_max_work(max_batch, num_sms);
    *out = new mlacore_plan(max_batch, max_work, num_sms);
  });
}

MLACORE_API void mlacore_plan_destroy(mlacore_plan* plan) { delete plan; }

MLACORE_API mlacore_status mlacore_plan_build(mlacore_plan* plan, const DLTensor* qo_indptr,
                                              const DLTensor* kv_indptr, const DLTensor* kv_len_arr,
                                              int32_t page_size, int32_t num_heads, const DLTensor* metadata,
                                              void* stream) {
  return mlacore::guarded([&] {
    require_plan(plan);
    plan->build(qo_indptr, kv_indptr, kv_len_arr, page_size, num_heads, metadata, stream);
  });
}

MLACORE_API mlacore_status mlacore_plan_build_device(mlacore_plan* plan, const DLTensor* qo_indptr,
                                                     const DLTensor* kv_indptr, const DLTensor* kv_len_arr,
                                                     int32_t page_size, int32_t num_heads,
                                                     const DLTensor* metadata, void* stream) {
  return mlacore::guarded([&] {
    require_plan(plan);
    plan->build_device(qo_indptr, kv_indptr, kv_len_arr, page_size, num_heads, metadata, stream);
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
