// mlacore: a header-only C++ face over the C ABI in <mlacore/mlacore.h>.
// Same entry points, but failures throw mlacore::Error instead of returning a
// status, so a C++ server can use libmlacore without checking every call.
#ifndef MLACORE_MLACORE_HPP_
#define MLACORE_MLACORE_HPP_

#include <mlacore/mlacore.h>

#include <stdexcept>
#include <string>

namespace mlacore {

class Error : public std::runtime_error {
 public:
  Error(mlacore_status status, const char* message)
      : std::runtime_error(message), status_(status) {}
  mlacore_status status() const noexcept { return status_; }

 private:
  mlacore_status status_;
};

inline void check(mlacore_status status) {
  if (status != MLACORE_OK) throw Error(status, mlacore_last_error());
}

inline std::string version() { return mlacore_version(); }
inline bool built_with(const char* feature) { return mlacore_built_with(feature) != 0; }

inline void noop(const DLTensor* const* tensors, int32_t count, void* stream = nullptr) {
  check(mlacore_noop(tensors, count, stream));
}

// Capability wrappers follow, one section per capability header.

// --- Plan schedule (plan.h) ---
// Owns an mlacore_plan; move-only. See plan.h for what each build costs.
class Plan {
 public:
  // max_work <= 0: mlacore_plan_default_max_work(max_batch, num_sms).
  Plan(int64_t max_batch, int32_t num_sms, int64_t max_work = 0) {
    check(mlacore_plan_create(max_batch, max_work, num_sms, &plan_));
  }
  ~Plan() { mlacore_plan_destroy(plan_); }
  Plan(Plan&& other) noexcept : plan_(other.plan_) { other.plan_ = nullptr; }
  Plan& operator=(Plan&& other) noexcept {
    if (this != &other) {
      mlacore_plan_destroy(plan_);
      plan_ = other.plan_;
      other.plan_ = nullptr;
    }
    return *this;
  }
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;

  // int32 elements the schedule tensor needs.
  int64_t schedule_size() const { return mlacore_plan_schedule_size(max_batch(), max_work()); }
  int64_t max_batch() const { int64_t b = 0; check(mlacore_plan_capacity(plan_, &b, nullptr, nullptr)); return b; }
  int64_t max_work() const { int64_t w = 0; check(mlacore_plan_capacity(plan_, nullptr, &w, nullptr)); return w; }

  void build(const DLTensor* qo_indptr, const DLTensor* kv_indptr, const DLTensor* kv_len_arr, int32_t page_size,
             int32_t num_heads, const DLTensor* schedule, void* stream = nullptr) {
    check(mlacore_plan_build(plan_, qo_indptr, kv_indptr, kv_len_arr, page_size, num_heads, schedule, stream));
  }
  void build_device(const DLTensor* qo_indptr, const DLTensor* kv_indptr, const DLTensor* kv_len_arr,
                    int32_t page_size, int32_t num_heads, const DLTensor* schedule, void* stream = nullptr) {
    check(mlacore_plan_build_device(plan_, qo_indptr, kv_indptr, kv_len_arr, page_size, num_heads, schedule,
                                    stream));
  }
  // Caps later builds' partials to a workspace of `partial_rows` fp32 rows
  // (mla_decode_workspace_rows); MLACORE_PLAN_NO_PARTIAL_BUDGET removes the cap.
  void set_partial_budget(int64_t partial_rows, int64_t partial_qo_len = 0) {
    check(mlacore_plan_set_partial_budget(plan_, partial_rows, partial_qo_len));
  }
  mlacore_plan_info info() const { mlacore_plan_info i{}; check(mlacore_plan_get_info(plan_, &i)); return i; }
  mlacore_plan_stats stats() const { mlacore_plan_stats s{}; check(mlacore_plan_get_stats(plan_, &s)); return s; }
  mlacore_plan* handle() const noexcept { return plan_; }

 private:
  mlacore_plan* plan_ = nullptr;
};

// --- Backends (backend.h) ---
struct RouteDecision {
  mlacore_backend backend;
  std::string why;
};

inline RouteDecision route(const mlacore_route_request& request,
                           mlacore_backend requested = MLACORE_BACKEND_AUTO) {
  char why[512];
  int32_t chosen = 0;
  check(mlacore_route(&request, requested, &chosen, why, sizeof why));
  return {static_cast<mlacore_backend>(chosen), why};
}

struct BackendInfo {
  bool available;
  std::string reason;
};

inline BackendInfo backend_info(const char* name) {
  int32_t available = 0;
  const char* reason = "";
  check(mlacore_backend_info(name, &available, &reason));
  return {available != 0, reason};
}

// --- Paged append (paged_append.h) ---
inline void append_paged_mla_kv_cache(const DLTensor* append_ckv, const DLTensor* append_kpe,
                                      const DLTensor* batch_indices, const DLTensor* positions,
                                      const DLTensor* ckv_cache, const DLTensor* kpe_cache,
                                      const DLTensor* kv_indices, const DLTensor* kv_indptr,
                                      const DLTensor* kv_last_page_len,
                                      mlacore_backend backend = MLACORE_BACKEND_AUTO, bool strict = false,
                                      void* stream = nullptr) {
  check(mlacore_append_paged_mla_kv_cache(append_ckv, append_kpe, batch_indices, positions, ckv_cache, kpe_cache,
                                          kv_indices, kv_indptr, kv_last_page_len, backend, strict ? 1 : 0,
                                          stream));
}

// v_cache == nullptr: k_cache is one 5-D [P, 2, ...] tensor.
inline void append_paged_kv_cache(const DLTensor* append_key, const DLTensor* append_value,
                                  const DLTensor* batch_indices, const DLTensor* positions,
                                  const DLTensor* k_cache, const DLTensor* v_cache, const DLTensor* kv_indices,
                                  const DLTensor* kv_indptr, const DLTensor* kv_last_page_len,
                                  mlacore_kv_layout layout = MLACORE_LAYOUT_NHD,
                                  mlacore_backend backend = MLACORE_BACKEND_AUTO, bool strict = false,
                                  void* stream = nullptr) {
  check(mlacore_append_paged_kv_cache(append_key, append_value, batch_indices, positions, k_cache, v_cache,
                                      kv_indices, kv_indptr, kv_last_page_len, layout, backend, strict ? 1 : 0,
                                      stream));
}

// --- KV layout (kv_layout.h) ---
struct CombinedKvView {
  bool adjacent = false;
  int64_t shape[3] = {0, 0, 0};
  int64_t strides[3] = {0, 0, 0};  // elements
};

inline CombinedKvView combined_kv_view(const DLTensor* ckv_cache, const DLTensor* kpe_cache) {
  CombinedKvView v;
  int32_t adjacent = 0;
  check(mlacore_combined_kv_view(ckv_cache, kpe_cache, v.shape, v.strides, &adjacent));
  v.adjacent = adjacent != 0;
  return v;
}

inline std::string explain_kv_layout(const DLTensor* ckv_cache, const DLTensor* kpe_cache) {
  size_t length = 0;
  check(mlacore_explain_kv_layout(ckv_cache, kpe_cache, nullptr, 0, &length));
  std::string text(length + 1, '\0');
  check(mlacore_explain_kv_layout(ckv_cache, kpe_cache, &text[0], text.size(), &length));
  text.resize(length);
  return text;
}

// --- Slot mapping (slot_mapping.h) ---
inline void slot_mapping(const DLTensor* batch_indices, const DLTensor* positions, const DLTensor* kv_indices,
                         const DLTensor* kv_indptr, int64_t page_size, const DLTensor* out,
                         int64_t num_pages = -1, void* stream = nullptr) {
  check(mlacore_slot_mapping(batch_indices, positions, kv_indices, kv_indptr, page_size, num_pages, out, stream));
}

inline void page_indices_from_block_table(const DLTensor* block_table, const DLTensor* cu_num_blocks,
                                          const DLTensor* out, void* stream = nullptr) {
  check(mlacore_page_indices_from_block_table(block_table, cu_num_blocks, out, stream));
}

inline void batch_indices_positions(const DLTensor* append_indptr, const DLTensor* seq_lens,
                                    const DLTensor* batch_indices, const DLTensor* positions,
                                    void* stream = nullptr) {
  check(mlacore_batch_indices_positions(append_indptr, seq_lens, batch_indices, positions, stream));
}

// --- MLA decode (mla_decode.h) ---
inline int64_t mla_decode_workspace_bytes(mlacore_decode_dims dims, int64_t num_heads) {
  return mlacore_mla_decode_workspace_bytes(dims, num_heads);
}

inline void mla_decode(const DLTensor* q_nope, const DLTensor* q_pe, const DLTensor* ckv, const DLTensor* kpe,
                       const DLTensor* kv_indices, const DLTensor* kv_indptr, const DLTensor* qo_indptr,
                       const DLTensor* kv_len, const DLTensor* schedule, const DLTensor* workspace,
                       const DLTensor* out, const DLTensor* lse, mlacore_decode_dims dims, int64_t page_size,
                       float sm_scale, uint32_t flags, void* stream = nullptr) {
  check(mlacore_mla_decode(q_nope, q_pe, ckv, kpe, kv_indices, kv_indptr, qo_indptr, kv_len, schedule, workspace,
                           out, lse, dims, page_size, sm_scale, flags, stream));
}

// The same with a backend request (mlacore_backend): see mlacore_mla_decode_backend.
inline void mla_decode(const DLTensor* q_nope, const DLTensor* q_pe, const DLTensor* ckv, const DLTensor* kpe,
                       const DLTensor* kv_indices, const DLTensor* kv_indptr, const DLTensor* qo_indptr,
                       const DLTensor* kv_len, const DLTensor* schedule, const DLTensor* workspace,
                       const DLTensor* out, const DLTensor* lse, mlacore_decode_dims dims, int64_t page_size,
                       float sm_scale, uint32_t flags, mlacore_backend backend, void* stream = nullptr) {
  check(mlacore_mla_decode_backend(q_nope, q_pe, ckv, kpe, kv_indices, kv_indptr, qo_indptr, kv_len, schedule,
                                   workspace, out, lse, dims, page_size, sm_scale, flags, backend, stream));
}

}  // namespace mlacore

#endif  // MLACORE_MLACORE_HPP_
