// Plan schedule through the C ABI and the C++ wrapper, on CPU DLTensors:
// layout sizes, coverage of every KV token, splits, padding, errors.
#include <mlacore/mlacore.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "check.h"

namespace {

struct Vec {
  std::vector<int64_t> shape;
  DLTensor t{};
  template <class T>
  Vec(std::vector<T>& data, DLDataType dtype) : shape{static_cast<int64_t>(data.size())} {
    t.data = data.data();
    t.device = {kDLCPU, 0};
    t.ndim = 1;
    t.dtype = dtype;
    t.shape = shape.data();
  }
};

constexpr DLDataType kI32{kDLInt, 32, 1};
constexpr DLDataType kI64{kDLInt, 64, 1};

struct Layout {
  int64_t header, last_page_len, split_indptr, work;
};

Layout layout_of(int64_t max_batch, int64_t max_work) {
  int64_t off[4] = {};
  mlacore::check(mlacore_plan_layout(max_batch, max_work, off));
  return {off[0], off[1], off[2], off[3]};
}

// Every token of every request is covered exactly once, in order, by the
// request's work items; partial indices match split_indptr.
void check_schedule(const std::vector<int32_t>& meta, const Layout& L, const std::vector<int32_t>& kv_len,
                    int64_t max_work, int page_size) {
  const int B = static_cast<int>(kv_len.size());
  const int num_work = meta[0], num_partials = meta[1], chunk = meta[5];
  CHECK(meta[2] == B);
  CHECK(chunk > 0 && chunk % 64 == 0);
  CHECK(num_work <= max_work);
  std::vector<int64_t> next(B, 0);
  std::vector<int> items(B, 0);
  for (int i = 0; i < max_work; ++i) {
    const int32_t* w = &meta[L.work + 4 * i];
    if (i >= num_work) {
      CHECK(w[0] == -1 && w[3] == -1);
      continue;
    }
    CHECK(w[0] >= 0 && w[0] < B);
    if (w[0] < 0 || w[0] >= B) continue;
    const int b = w[0];
    CHECK(w[1] == next[b]);
    CHECK(w[2] >= w[1] && w[2] - w[1] <= chunk);
    CHECK(w[1] % chunk == 0);
    next[b] = w[2];
    const int first = meta[L.split_indptr + b], last = meta[L.split_indptr + b + 1];
    if (last - first == 0) CHECK(w[3] == -1);
    else CHECK(w[3] == first + items[b]);
    ++items[b];
  }
  for (int b = 0; b < B; ++b) {
    CHECK(next[b] == kv_len[b]);
    CHECK(items[b] >= 1);
    const int parts = meta[L.split_indptr + b + 1] - meta[L.split_indptr + b];
    CHECK(parts == (items[b] > 1 ? items[b] : 0));
    const int pages = (kv_len[b] + page_size - 1) / page_size;
    const int expect_last = kv_len[b] == 0 ? 0 : kv_len[b] - (pages - 1) * page_size;
    CHECK(meta[L.last_page_len + b] == expect_last);
  }
  CHECK(meta[L.split_indptr + B] == num_partials);
}

}  // namespace

int main() {
  CHECK(mlacore_plan_default_max_work(8, 132) == 8 + 132);
  CHECK(mlacore_plan_schedule_size(4, 10) == ((8 + 4 + 5 + 3) / 4 * 4) + 40);
  CHECK(mlacore_plan_schedule_size(-1, 10) == -1);

  // A mixed batch: long, empty, short, one page exactly, MTP (qo_len 3).
  const int page_size = 16;
  std::vector<int32_t> kv_len = {5000, 0, 7, 16, 300};
  std::vector<int32_t> qo = {0, 1, 2, 3, 4, 7};
  std::vector<int32_t> kv = {0};
  for (int32_t l : kv_len) kv.push_back(kv.back() + (l + page_size - 1) / page_size);

  const int64_t max_batch = 8;
  mlacore::Plan plan(max_batch, /*num_sms=*/16);
  const int64_t max_work = plan.max_work();
  CHECK(max_work == 8 + 16);
  const Layout L = layout_of(max_batch, max_work);
  std::vector<int32_t> meta(static_cast<size_t>(plan.schedule_size()), 12345);
  Vec t_qo(qo, kI32), t_kv(kv, kI32), t_len(kv_len, kI32), t_meta(meta, kI32);
  plan.build(&t_qo.t, &t_kv.t, &t_len.t, page_size, 16, &t_meta.t);
  check_schedule(meta, L, kv_len, max_work, page_size);
  const mlacore_plan_info info = plan.info();
  CHECK(info.batch == 5 && info.on_host == 1 && info.error == 0);
  CHECK(info.max_qo_len == 3 && info.max_kv_len == 5000 && info.total_qo == 7);
  CHECK(info.num_work == meta[0] && info.num_partials == meta[1] && info.chunk_tokens == meta[5]);
  CHECK(info.num_partials > 0);  // 5000 tokens over 16 SMs must split
  {
    // The workspace budget: 0 rows fits no partial (nothing splits), the
    // sentinel removes the cap (the same schedule as never capped), and
    // anything below it is refused by name.
    std::vector<int32_t> capped(meta.size(), 0);
    Vec t_capped(capped, kI32);
    plan.set_partial_budget(0);
    plan.build(&t_qo.t, &t_kv.t, &t_len.t, page_size, 16, &t_capped.t);
    CHECK(plan.info().num_partials == 0 && plan.info().num_work == 5);
    check_schedule(capped, L, kv_len, max_work, page_size);
    plan.set_partial_budget(MLACORE_PLAN_NO_PARTIAL_BUDGET);
    plan.build(&t_qo.t, &t_kv.t, &t_len.t, page_size, 16, &t_capped.t);
    CHECK(capped == meta);
    CHECK(mlacore_plan_set_partial_budget(plan.handle(), -2, 0) == MLACORE_ERROR_VALUE);
    CHECK_CONTAINS(mlacore_last_error(), "partial_rows");
  }
  // CPU inputs and output: no pinned memory, no copies, no syncs.
  const mlacore_plan_stats stats = plan.stats();
  CHECK(stats.pinned_allocations == 0 && stats.device_to_host_copies == 0 && stats.stream_syncs == 0);

  // int64 and strided inputs give the same bytes.
  std::vector<int64_t> qo64(qo.begin(), qo.end()), kv64(kv.begin(), kv.end());
  std::vector<int32_t> len_strided;
  for (int32_t l : kv_len) {
    len_strided.push_back(l);
    len_strided.push_back(-99);
  }
  Vec s_qo(qo64, kI64), s_kv(kv64, kI64), s_len(len_strided, kI32);
  int64_t len_stride[1] = {2};
  s_len.shape[0] = static_cast<int64_t>(kv_len.size());
  s_len.t.strides = len_stride;
  std::vector<int32_t> meta2(meta.size(), -7);
  Vec t_meta2(meta2, kI32);
  plan.build(&s_qo.t, &s_kv.t, &s_len.t, page_size, 16, &t_meta2.t);
  CHECK(meta2 == meta);

  // Errors name the argument and the request.
  std::vector<int32_t> bad_len = kv_len;
  bad_len[2] = 40;  // needs 3 pages, kv_indptr gives 1
  Vec t_bad(bad_len, kI32);
  CHECK(mlacore_plan_build(plan.handle(), &t_qo.t, &t_kv.t, &t_bad.t, page_size, 16, &t_meta.t, nullptr) ==
        MLACORE_ERROR_VALUE);
  CHECK_CONTAINS(mlacore_last_error(), "kv_len_arr[2]");
  CHECK_CONTAINS(mlacore_last_error(), "request 2");

  std::vector<int32_t> bad_qo = {0, 1, 2, 1, 4, 7};
  Vec t_bad_qo(bad_qo, kI32);
  CHECK(mlacore_plan_build(plan.handle(), &t_bad_qo.t, &t_kv.t, &t_len.t, page_size, 16, &t_meta.t, nullptr) ==
        MLACORE_ERROR_VALUE);
  CHECK_CONTAINS(mlacore_last_error(), "qo_indptr: expected non-decreasing");

  std::vector<int32_t> short_meta(16);
  Vec t_short(short_meta, kI32);
  CHECK(mlacore_plan_build(plan.handle(), &t_qo.t, &t_kv.t, &t_len.t, page_size, 16, &t_short.t, nullptr) ==
        MLACORE_ERROR_VALUE);
  CHECK_CONTAINS(mlacore_last_error(), "schedule: expected at least");

  CHECK(mlacore_plan_build(plan.handle(), &t_qo.t, nullptr, &t_len.t, page_size, 16, &t_meta.t, nullptr) ==
        MLACORE_ERROR_TYPE);
  CHECK_CONTAINS(mlacore_last_error(), "kv_indptr");
  CHECK(mlacore_plan_build(nullptr, &t_qo.t, &t_kv.t, &t_len.t, page_size, 16, &t_meta.t, nullptr) ==
        MLACORE_ERROR_TYPE);

  // Batch over capacity, and a capacity smaller than the batch it must hold.
  mlacore::Plan small(2, 4);
  bool threw = false;
  try {
    std::vector<int32_t> m(static_cast<size_t>(small.schedule_size()));
    Vec t_m(m, kI32);
    small.build(&t_qo.t, &t_kv.t, &t_len.t, page_size, 16, &t_m.t);
  } catch (const mlacore::Error& e) {
    threw = e.status() == MLACORE_ERROR_VALUE && std::string(e.what()).find("max_batch=2") != std::string::npos;
  }
  CHECK(threw);
  mlacore_plan* p = nullptr;
  CHECK(mlacore_plan_create(8, 4, 16, &p) == MLACORE_ERROR_VALUE && p == nullptr);
  CHECK_CONTAINS(mlacore_last_error(), "max_work");

  // A full batch with max_work == max_batch leaves no room to split: one
  // item per request, no partials. With spare items it splits within them.
  mlacore::Plan tight(5, 16, 5);
  std::vector<int32_t> meta3(static_cast<size_t>(tight.schedule_size()));
  Vec t_meta3(meta3, kI32);
  tight.build(&t_qo.t, &t_kv.t, &t_len.t, page_size, 16, &t_meta3.t);
  check_schedule(meta3, layout_of(5, 5), kv_len, 5, page_size);
  CHECK(meta3[0] == 5 && meta3[1] == 0);
  mlacore::Plan spare(5, 16, 8);
  std::vector<int32_t> meta4(static_cast<size_t>(spare.schedule_size()));
  Vec t_meta4(meta4, kI32);
  spare.build(&t_qo.t, &t_kv.t, &t_len.t, page_size, 16, &t_meta4.t);
  check_schedule(meta4, layout_of(5, 8), kv_len, 8, page_size);
  CHECK(meta4[0] > 5 && meta4[0] <= 8);

  // Build_device needs GPU tensors.
  CHECK(mlacore_plan_build_device(plan.handle(), &t_qo.t, &t_kv.t, &t_len.t, page_size, 16, &t_meta.t, nullptr) ==
        MLACORE_ERROR_VALUE);
  CHECK_CONTAINS(mlacore_last_error(), "build_device");

  return finish("test_plan");
}
