// The plan object behind the C ABI (mlacore_plan_*, Python mlacore.MlaPlan):
// a capacity (max_batch, max_work, num_sms), its schedule layout, and the
// builds that write it. build() validates the three inputs (ValueError naming
// the request) and writes the whole ScheduleLayout::total() int32 schedule:
// on the host for host inputs (one H2D copy for a device schedule tensor),
// through the exchange kernel for device inputs, so the host's part does not
// grow with the batch. build_device() runs the device-only kernel: no sync,
// capturable, invalid requests flagged in the header instead of raised.
// The environment variable MLACORE_SCHEDULE, read when a plan is created,
// picks the order of the work items (schedule_algorithm.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/tensor.h"
#include "plan/build_device.h"
#include "plan/exchange.h"
#include "plan/schedule_algorithm.h"

namespace mlacore {

struct PlanInfo {
  int32_t batch = 0, num_work = 0, num_partials = 0, max_qo_len = 0, max_kv_len = 0;
  int32_t chunk_tokens = 0, total_qo = 0, error = 0;
  bool on_host = false;  // false after build_device: the values live in the device header only
};

struct PlanStats {
  int64_t pinned_allocations = 0;
  int64_t device_to_host = 0;  // D2H transfers: exchange kernels storing their verdict into the mapped staging
  int64_t host_to_device = 0;  // H2D transfers: the async copy of a host-input build's schedule
  int64_t stream_syncs = 0;
  int64_t device_builds = 0;   // schedules computed by the device kernel
  const void* staging = nullptr;
};

class PlanBuilder {
 public:
  PlanBuilder(int64_t max_batch, int64_t max_work, int64_t num_sms);
  ~PlanBuilder();
  PlanBuilder(const PlanBuilder&) = delete;
  PlanBuilder& operator=(const PlanBuilder&) = delete;

  void build(const DLTensor* qo_indptr, const DLTensor* kv_indptr, const DLTensor* kv_len_arr,
             int64_t page_size, int64_t num_heads, const DLTensor* schedule, void* stream);
  void build_device(const DLTensor* qo_indptr, const DLTensor* kv_indptr, const DLTensor* kv_len_arr,
                    int64_t page_size, int64_t num_heads, const DLTensor* schedule, void* stream);

  const ScheduleLayout& layout() const { return layout_; }
  int64_t num_sms() const { return num_sms_; }
  // An exchange's counts arrive after build() returns: the first call after
  // one waits for them (exchange_counts()).
  const PlanInfo& info() const;
  const PlanStats& stats() const { return stats_; }
  // The workspace's partial budget for later builds (ScheduleInputs::partial_rows).
  void set_partial_budget(int64_t partial_rows, int64_t partial_qo_len);

 private:
  ScheduleInputs check_inputs(const CheckedTensor& qo, const CheckedTensor& kv, const CheckedTensor& len, const CheckedTensor& meta, int64_t page_size,
                              int64_t num_heads) const;
  void record_info(const int32_t* meta);

  ScheduleLayout layout_;
  int64_t num_sms_;
  int64_t partial_rows_ = kNoPartialBudget, partial_qo_len_ = 0;
  bool longest_first_;  // MLACORE_SCHEDULE unset or longest_first when the plan was created
  // Mutable: info() completes it with the counts of the exchange counts_seq_
  // names (0: none pending).
  mutable PlanInfo info_;
  mutable uint64_t counts_seq_ = 0;
  PlanStats stats_;
  // The host schedule's per-request tile counts (max_batch), sized once: a
  // rejected batch must leave the schedule untouched, so they cannot live there.
  std::vector<RequestTiles> tiles_;
#if defined(MLACORE_WITH_CUDA) || defined(MLACORE_WITH_HIP)
  plan_gpu::Staging* staging_ = nullptr;
#endif
};

}  // namespace mlacore
