// Fuzz cases for plan build on host tensors.
// The harness: harness.h; what a case is and how it is checked: driver.cpp.
#include <algorithm>
#include <vector>
#include "harness.h"
#include "ops.h"

namespace fuzz {

void fuzz_plan(Rng& r, Counter& c) {
  int64_t max_batch = r.range(0, 8), max_work = r.chance(0.5) ? 0 : max_batch + r.range(0, 20);
  int32_t num_sms = int32_t(r.range(1, 200));
  bool create_defect = false;
  if (r.chance(0.1)) {
    create_defect = true;
    switch (r.range(0, 3)) {
      case 0: max_batch = r.pick<int64_t>({-1, I64MIN, (int64_t(1) << 28) + 1, I64MAX}); break;
      case 1: max_work = max_batch >= 2 ? r.range(1, max_batch - 1) : (int64_t(1) << 28) + 1; break;
      case 2: num_sms = r.pick<int32_t>({0, -1, 65537, std::numeric_limits<int32_t>::min()}); break;
      default: max_work = r.pick<int64_t>({(int64_t(1) << 28) + 1, I64MAX}); break;
    }
  }
  g_desc = "max_batch=" + std::to_string(max_batch) + " max_work=" + std::to_string(max_work) +
           " num_sms=" + std::to_string(num_sms);
  PlanHandle h;
  ++c.cases;
  const mlacore_status cst = mlacore_plan_create(max_batch, max_work, num_sms, r.chance(0.02) ? nullptr : &h.p);
  if (cst == MLACORE_ERROR_TYPE && h.p == nullptr && std::strstr(mlacore_last_error(), "out") != nullptr) {
    ++c.errors;
    return;  // NULL out pointer
  }
  if (!check_status(c, cst, create_defect, false, {"max_batch", "max_work", "num_sms"})) {
    if (h.p != nullptr) fail("plan_create failed but returned a handle");
    return;
  }
  if (r.chance(0.1)) {  // the capacity helpers at extremes: no overflow (UBSan), sane answers
    const int64_t mbx = r.pick<int64_t>({I64MAX, I64MAX - 5, I64MIN, -1, 0, int64_t(1) << 28});
    const int32_t sms = int32_t(r.pick<int64_t>({I32MAX, 0, -1, 132}));
    const int64_t dw = mlacore_plan_default_max_work(mbx, sms);
    if (dw < std::max<int64_t>(mbx, 0)) fail("plan_default_max_work below max_batch");
    const int64_t sz = mlacore_plan_schedule_size(mbx, r.pick<int64_t>({I64MAX, -1, 1}));
    if (sz != -1 && (mbx < 0 || mbx > (int64_t(1) << 28))) fail("plan_schedule_size accepted an invalid capacity");
    int64_t offs[4] = {-7, -7, -7, -7};
    ++c.cases;
    const mlacore_status lst = mlacore_plan_layout(mbx, r.pick<int64_t>({I64MAX, -1, 1, mbx}), r.chance(0.2) ? nullptr : offs);
    if (lst != MLACORE_OK && !names_one_of(mlacore_last_error(), {"max_batch", "max_work", "offsets"}))
      fail(std::string("plan_layout error names no argument: ") + mlacore_last_error());
  }
  int64_t cap_batch = 0, cap_work = 0;
  mlacore_plan_capacity(h.p, &cap_batch, &cap_work, nullptr);
  if (cap_batch != max_batch || (max_work > 0 && cap_work != max_work)) fail("plan capacity differs from the request");
  const int64_t total = mlacore_plan_schedule_size(cap_batch, cap_work);

  const int64_t B = r.range(0, cap_batch);
  int32_t page_size = int32_t(r.pick<int64_t>({1, 3, 16, 64, 1024}));
  int32_t num_heads = int32_t(r.range(1, 128));
  TSpec qo = spec("qo_indptr", r.chance(0.5) ? I32 : I64, {B + 1}), kv = spec("kv_indptr", r.chance(0.5) ? I32 : I64, {B + 1});
  TSpec len = spec("kv_len_arr", r.chance(0.5) ? I32 : I64, {B});
  TSpec md = spec("schedule", I32, {total + (r.chance(0.3) ? r.range(1, 9) : 0)});
  for (TSpec* s : {&qo, &kv, &len}) layout1(*s, r, true);
  md.implicit_strides = r.chance(0.5);
  md.misalign = 0;
  // Values: consistent inputs, then one value defect at most.
  std::vector<int64_t> vq(static_cast<size_t>(B + 1)), vk(static_cast<size_t>(B + 1)), vl(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    vl[size_t(b)] = r.chance(0.1) ? 0 : r.range(0, r.chance(0.1) ? 5000 : 300);
    vq[size_t(b + 1)] = vq[size_t(b)] + r.range(0, 4);
    vk[size_t(b + 1)] = vk[size_t(b)] + (vl[size_t(b)] + page_size - 1) / page_size;
  }
  bool defect = false, runtime_ok = false;
  bool plan_null = false;
  if (r.chance(0.4)) {
    defect = true;
    const int64_t b = B > 0 ? r.range(0, B - 1) : 0;
    switch (r.range(0, 11)) {
      case 0: vq[0] = r.pick<int64_t>({1, -1, I32MAX}); break;
      case 1: vk[0] = r.pick<int64_t>({1, -1}); break;
      case 2: if (B > 0) vq[size_t(b + 1)] = vq[size_t(b)] - r.range(1, 3); else vq[0] = 5; break;
      case 3: if (B > 0) vl[size_t(b)] = r.pick<int64_t>({-1, I64MIN, I32MAX + int64_t(1)}); else vk[0] = 2; break;
      case 4: if (B > 0) vl[size_t(b)] += page_size * r.range(1, 3); else vq[0] = -3; break;
      case 5: page_size = int32_t(r.pick<int64_t>({0, -1, I32MIN})); break;
      case 6: num_heads = int32_t(r.pick<int64_t>({0, -5})); break;
      case 7: md.shape[0] = total - r.range(1, std::min<int64_t>(total, 8)); break;
      case 8: md.implicit_strides = false, md.strides[0] = 2; break;
      case 9: md.misalign = 4 * r.range(1, 3); break;
      case 10: {
        TSpec* all[] = {&qo, &kv, &len, &md};
        TSpec* s = all[r.range(0, 3)];
        Def d = random_generic(r);
        if (d == Def::Device && s == &qo) s = &kv;
        if (d == Def::Dtype && s != &md) { s->dtype = bad_dtype(r, {I32, I64}); break; }
        if (d == Def::Ndim && s == &len && B == 0) d = Def::Null;
        apply_generic(*s, r, d, {s == &md ? I32 : I64, I32}, &runtime_ok);
        break;
      }
      default: plan_null = true; break;
    }
  }
  Tensor tq = make(qo, r, fill_bytes(r)), tk = make(kv, r, fill_bytes(r)), tl = make(len, r, fill_bytes(r));
  const std::pair<Tensor*, std::vector<int64_t>*> fills[] = {{&tq, &vq}, {&tk, &vk}, {&tl, &vl}};
  for (auto [t, v] : fills)
    if (is_index(t->s.dtype) && t->s.ndim == 1 && !t->s.null)
      for (int64_t i = 0; i < std::min<int64_t>(t->size(0), int64_t(v->size())); ++i) t->set(i, (*v)[size_t(i)]);
  Tensor tm = make(md, r, fill_bytes(r));
  for (Tensor* t : {&tq, &tk, &tl, &tm}) finalize(*t, r);
  // Reading back what the tensors hold decides validity for int32 inputs.
  if (!plan_null && page_size >= 1 && num_heads >= 1 && !md.null && md.ndim == 1 && md.shape[0] >= total &&
      md.misalign == 0 && !md.null_data && md.npatch == 0 && (md.implicit_strides || md.strides[0] == 1) && same(md.dtype, I32) && md.device.device_type == kDLCPU) {
    bool ok = true;
    for (const Tensor* t : {&tq, &tk, &tl}) ok = ok && !t->s.null && !t->s.null_data && t->s.npatch == 0 && t->s.ndim == 1 && is_index(t->s.dtype) && t->s.device.device_type == kDLCPU;
    ok = ok && tq.size(0) == B + 1 && tk.size(0) == B + 1 && tl.size(0) == B;
    if (ok) {
      ok = tq.rd(0) == 0 && tk.rd(0) == 0;
      for (int64_t b = 0; ok && b < B; ++b) {
        const int64_t q0 = tq.rd(b), q1 = tq.rd(b + 1), p0 = tk.rd(b), p1 = tk.rd(b + 1), l = tl.rd(b);
        ok = q1 >= q0 && q1 <= I32MAX && p1 >= p0 && p1 <= I32MAX && l >= 0 && l <= I32MAX &&
             (l + page_size - 1) / page_size == p1 - p0;
      }
      // Validity is what the tensors hold: a value beyond int32 wraps in an
      // int32 input, and a broadcast (stride 0) input repeats one value.
      defect = !ok;
    }
  }
  std::vector<std::shared_ptr<Buf>> bufs = {tq.buf, tk.buf, tl.buf, tm.buf};
  snapshot(bufs);
  g_desc += " B=" + std::to_string(B) + " page_size=" + std::to_string(page_size) + " heads=" + std::to_string(num_heads);

  ++c.cases;
  const mlacore_status st =
      mlacore_plan_build(plan_null ? nullptr : h.p, tq.p(), tk.p(), tl.p(), page_size, num_heads, tm.p(), nullptr);
  if (check_status(c, st, defect, runtime_ok,
                   {"plan", "qo_indptr", "kv_indptr", "kv_len_arr", "page_size", "num_heads", "schedule"})) {
    // Schedule invariants (decode_schedule.h, plan.h) against the inputs.
    const int32_t* m = reinterpret_cast<const int32_t*>(&tm.buf->bytes[size_t(tm.origin)]);
    int64_t off[4];
    mlacore_plan_layout(cap_batch, cap_work, off);
    const int32_t num_work = m[0], num_partials = m[1];
    int64_t max_qo = 0, max_kv = 0;
    for (int64_t b = 0; b < B; ++b) max_qo = std::max(max_qo, tq.rd(b + 1) - tq.rd(b)), max_kv = std::max(max_kv, tl.rd(b));
    const int32_t chunk = m[5];
    if (m[2] != B || m[3] != max_qo || m[4] != max_kv || m[6] != tq.rd(B) || m[7] != 0 || num_work < 0 ||
        num_work > cap_work || num_partials < 0 || chunk <= 0 || chunk % 64 != 0)
      fail("plan header wrong");
    mlacore_plan_info info{};
    mlacore_plan_get_info(h.p, &info);
    if (info.batch != m[2] || info.num_work != num_work || info.num_partials != num_partials || info.on_host != 1)
      fail("plan info differs from the header");
    const int32_t* lpl = m + off[1];
    const int32_t* split = m + off[2];
    const int32_t* items = m + off[3];
    // Items may come in any order (MLACORE_SCHEDULE=longest_first places them
    // by length): gather each request's items, then check them in KV order.
    std::vector<std::vector<int64_t>> by_request(static_cast<size_t>(B));
    for (int64_t w = 0; w < num_work; ++w) {
      const int32_t b = items[4 * w];
      if (b < 0 || b >= B) fail("work item " + std::to_string(w) + " names request " + std::to_string(b));
      by_request[size_t(b)].push_back(w);
    }
    int64_t partials = 0;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t l = tl.rd(b), pages = tk.rd(b + 1) - tk.rd(b);
      if (lpl[b] != (l == 0 ? 0 : l - (pages - 1) * page_size)) fail("kv_last_page_len wrong at " + std::to_string(b));
      if (split[b] != partials) fail("split_indptr wrong at " + std::to_string(b));
      std::vector<int64_t>& mine = by_request[size_t(b)];
      std::sort(mine.begin(), mine.end(), [&](int64_t x, int64_t y) { return items[4 * x + 1] < items[4 * y + 1]; });
      int64_t pos = 0;
      const int64_t n = int64_t(mine.size());
      for (int64_t i = 0; i < n; ++i) {
        const int64_t w = mine[size_t(i)];
        if (items[4 * w + 1] != pos || items[4 * w + 2] < pos || items[4 * w + 2] - pos > chunk) fail("work item range wrong");
        pos = items[4 * w + 2];
        if (items[4 * w + 3] != (n > 1 ? partials + i : -1)) fail("partial index wrong");
      }
      if (pos != l || n == 0) fail("request " + std::to_string(b) + " not covered: got " + std::to_string(pos) + " of " + std::to_string(l));
      if (n > 1) partials += n;
    }
    if (partials != num_partials) fail("work items do not match the header");
    for (int64_t b = B; b < cap_batch; ++b)
      if (lpl[b] != 0) fail("kv_last_page_len padding not 0");
    for (int64_t b = B; b <= cap_batch; ++b)
      if (split[b] != num_partials) fail("split_indptr padding wrong");
    for (int64_t i = num_work; i < cap_work; ++i)
      if (items[4 * i] != -1 || items[4 * i + 3] != -1) fail("padding work item wrong");
    // The schedule region is the target; anything past total() is not.
    std::memcpy(&tm.buf->expect[size_t(tm.origin)], &tm.buf->bytes[size_t(tm.origin)], size_t(total * 4));
  } else if (!md.null && md.ndim == 1 && md.shape[0] >= total && tm.isz == 4 && (md.implicit_strides || md.strides[0] == 1)) {
    // After a failure the schedule contents are unspecified, nothing else.
    std::memcpy(&tm.buf->expect[size_t(tm.origin)], &tm.buf->bytes[size_t(tm.origin)], size_t(total * 4));
  }
  check_buffers(bufs);
}

}  // namespace fuzz
