#include <mlacore/plan.h>

#include <nanobind/stl/string.h>

#include "bindings.h"
#include "plan/schedule.h"
#include "tensor_args.h"

namespace mlacore::bind {
namespace {

// Owns one mlacore_plan handle for the Python object's lifetime.
class Plan {
 public:
  Plan(int64_t max_batch, int64_t max_work, int32_t num_sms) {
    check(mlacore_plan_create(max_batch, max_work, num_sms, &plan_));
  }
  ~Plan() { mlacore_plan_destroy(plan_); }
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;

  void build(nb::handle qo, nb::handle kv, nb::handle len, int32_t page_size, int32_t num_heads, nb::handle meta,
             nb::handle stream, bool device) {
    BorrowedTensor a_qo, a_kv, a_len, a_meta;
    convert(qo, "qo_indptr", a_qo);
    convert(kv, "kv_indptr", a_kv);
    convert(len, "kv_len_arr", a_len);
    convert(meta, "schedule", a_meta);
    // The schedule is the anchor: host inputs with a device schedule tensor
    // still copy on that device's current stream.
    void* s = stream_for(a_meta, stream);
    // The host build may wait for the device, and either may block in a launch.
    check(without_gil([&] {
      return device ? mlacore_plan_build_device(plan_, a_qo.get(), a_kv.get(), a_len.get(), page_size, num_heads,
                                                a_meta.get(), s)
                    : mlacore_plan_build(plan_, a_qo.get(), a_kv.get(), a_len.get(), page_size, num_heads,
                                         a_meta.get(), s);
    }));
  }

  nb::dict info() const {
    mlacore_plan_info i{};
    // The first read after a device-input build waits for the exchange
    // kernel's counts (normally a microsecond or two; longer only while the
    // GPU is preempted), so other Python threads run meanwhile.
    check(without_gil([&] { return mlacore_plan_get_info(plan_, &i); }));
    nb::dict d;
    d["batch"] = i.batch;
    d["num_work"] = i.num_work;
    d["num_partials"] = i.num_partials;
    d["max_qo_len"] = i.max_qo_len;
    d["max_kv_len"] = i.max_kv_len;
    d["chunk_tokens"] = i.chunk_tokens;
    d["total_qo"] = i.total_qo;
    d["error"] = i.error;
    d["on_host"] = i.on_host != 0;
    return d;
  }

  nb::dict stats() const {
    mlacore_plan_stats s{};
    check(mlacore_plan_get_stats(plan_, &s));
    nb::dict d;
    d["pinned_allocations"] = s.pinned_allocations;
    d["device_to_host_copies"] = s.device_to_host_copies;
    d["host_to_device_copies"] = s.host_to_device_copies;
    d["stream_syncs"] = s.stream_syncs;
    d["device_builds"] = s.device_builds;
    d["staging"] = reinterpret_cast<uintptr_t>(s.staging);
    return d;
  }

  void set_partial_budget(int64_t rows, int64_t qo_len) { check(mlacore_plan_set_partial_budget(plan_, rows, qo_len)); }

  nb::tuple capacity() const {
    int64_t max_batch = 0, max_work = 0;
    int32_t num_sms = 0;
    check(mlacore_plan_capacity(plan_, &max_batch, &max_work, &num_sms));
    return nb::make_tuple(max_batch, max_work, num_sms);
  }

 private:
  mlacore_plan* plan_ = nullptr;
};

}  // namespace

void bind_plan(nb::module_& m) {
  // The schedule layout's constants, from the core's own definitions
  // (plan/schedule.h, the public MLACORE_PLAN_ERROR_* bits), so Python never
  // keeps a copy of them.
  const char* header[kHdrSize] = {};
  header[kHdrNumWork] = "num_work";
  header[kHdrNumPartials] = "num_partials";
  header[kHdrBatch] = "batch";
  header[kHdrMaxQoLen] = "max_qo_len";
  header[kHdrMaxKvLen] = "max_kv_len";
  header[kHdrChunkTokens] = "chunk_tokens";
  header[kHdrTotalQo] = "total_qo";
  header[kHdrError] = "error";
  nb::list fields;
  for (const char* name : header) fields.append(name);
  m.attr("SCHEDULE_HEADER_FIELDS") = nb::tuple(fields);
  m.attr("DECODE_TILE_TOKENS") = kDecodeTileTokens;
  m.attr("DECODE_TILE_ROWS") = kDecodeTileRows;
  m.attr("PLAN_ERROR_INDPTR_START") = MLACORE_PLAN_ERROR_INDPTR_START;
  m.attr("PLAN_ERROR_INDPTR") = MLACORE_PLAN_ERROR_INDPTR;
  m.attr("PLAN_ERROR_KV_LEN") = MLACORE_PLAN_ERROR_KV_LEN;
  m.attr("PLAN_NO_PARTIAL_BUDGET") = MLACORE_PLAN_NO_PARTIAL_BUDGET;

  m.def("plan_default_max_work", &mlacore_plan_default_max_work, nb::arg("max_batch"), nb::arg("num_sms"));
  m.def(
      "plan_schedule_size",
      [](int64_t max_batch, int64_t max_work) {
        const int64_t n = mlacore_plan_schedule_size(max_batch, max_work);
        if (n < 0) throw nb::value_error("max_batch, max_work: expected non-negative capacities");
        return n;
      },
      nb::arg("max_batch"), nb::arg("max_work"));
  m.def(
      "plan_layout",
      [](int64_t max_batch, int64_t max_work) {
        int64_t off[4];
        check(mlacore_plan_layout(max_batch, max_work, off));
        return nb::make_tuple(off[0], off[1], off[2], off[3]);
      },
      nb::arg("max_batch"), nb::arg("max_work"));

  nb::class_<Plan>(m, "Plan")
      .def(nb::init<int64_t, int64_t, int32_t>(), nb::arg("max_batch"), nb::arg("max_work"), nb::arg("num_sms"))
      .def(
          "build",
          [](Plan& p, nb::handle qo, nb::handle kv, nb::handle len, int32_t page_size, int32_t num_heads,
             nb::handle meta, nb::handle stream) { p.build(qo, kv, len, page_size, num_heads, meta, stream, false); },
          nb::arg("qo_indptr").none(), nb::arg("kv_indptr").none(), nb::arg("kv_len_arr").none(),
          nb::arg("page_size"), nb::arg("num_heads"), nb::arg("schedule").none(),
          nb::arg("stream").none() = nb::none())
      .def(
          "build_device",
          [](Plan& p, nb::handle qo, nb::handle kv, nb::handle len, int32_t page_size, int32_t num_heads,
             nb::handle meta, nb::handle stream) { p.build(qo, kv, len, page_size, num_heads, meta, stream, true); },
          nb::arg("qo_indptr").none(), nb::arg("kv_indptr").none(), nb::arg("kv_len_arr").none(),
          nb::arg("page_size"), nb::arg("num_heads"), nb::arg("schedule").none(),
          nb::arg("stream").none() = nb::none())
      .def("set_partial_budget", &Plan::set_partial_budget, nb::arg("partial_rows"), nb::arg("partial_qo_len"))
      .def("info", &Plan::info)
      .def("stats", &Plan::stats)
      .def("capacity", &Plan::capacity);
}

}  // namespace mlacore::bind
