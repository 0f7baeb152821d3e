// Fuzz cases for slot mapping.
// The harness: harness.h; what a case is and how it is checked: driver.cpp.
#include "harness.h"
#include "ops.h"

namespace fuzz {

void fuzz_slot_mapping(Rng& r, Counter& c) {
  const DLDataType tok = r.chance(0.5) ? I32 : I64, idt = r.chance(0.5) ? I32 : I64;
  const int64_t nnz = r.range(0, 40), batch = r.range(0, 6);
  int64_t page_size = r.pick<int64_t>({1, 1, 2, 3, 16, 16, 64, 4096, int64_t(1) << 20, int64_t(1) << 40, I64MAX});
  const bool huge_l = r.chance(0.05);
  const int64_t num_indices = huge_l ? (int64_t(1) << 40) + r.range(0, 99) : r.range(0, 30);
  const int64_t limit = I64MAX / page_size;
  int64_t num_pages = r.pick<int64_t>({-1, -1, -7, 0, r.range(1, 40), r.range(1, 40),
                                       (int64_t(1) << 31) / page_size + r.range(0, 3), limit, r.range(1, limit)});
  TSpec bi = spec("batch_indices", tok, {nnz}), pos = spec("positions", tok, {nnz});
  TSpec idx = spec("kv_indices", idt, {num_indices}), ptr = spec("kv_indptr", idt, {batch + 1});
  TSpec out = spec("out", I64, {nnz});
  for (TSpec* s : {&bi, &pos, &idx, &ptr, &out}) layout1(*s, r, true);
  if (huge_l) idx.strides[0] = 0, idx.implicit_strides = false;

  bool defect = false, runtime_ok = false;
  if (r.chance(0.4)) {
    defect = true;
    TSpec* all[] = {&bi, &pos, &idx, &ptr, &out};
    switch (r.range(0, 7)) {
      case 0: case 1: {
        TSpec* s = all[r.range(0, 4)];
        const Def d = random_generic(r);
        if (d == Def::Device && s == &bi) s = &pos;  // a device defect is a mismatch with the anchor
        apply_generic(*s, r, d, {s == &out ? I64 : s->dtype}, &runtime_ok);
        if (d == Def::Dtype && s != &out && is_index(s->dtype)) s->dtype = F32;
        break;
      }
      case 2: pos.shape[0] = nnz + r.range(1, 3); break;
      case 3: pos.dtype = same(tok, I32) ? I64 : I32; break;
      case 4: idx.dtype = same(idt, I32) ? I64 : I32; break;
      case 5: ptr.shape[0] = 0; break;
      case 6: out.shape[0] = nnz + r.range(1, 3); break;
      default:
        if (r.chance(0.5)) page_size = r.pick<int64_t>({0, -1, -64, I64MIN});
        else if (limit < I64MAX) num_pages = r.range(limit + 1, I64MAX);
        else page_size = 0;
        break;
    }
  }
  if (num_pages > I64MAX / std::max<int64_t>(page_size, 1)) defect = true;  // num_pages * page_size must fit
  const int64_t np_eff = num_pages >= 0 ? std::min<int64_t>(num_pages, 64) : 64;
  const int64_t ps_eff = page_size >= 1 ? page_size : 1;
  Tensor tb = make(bi, r, fill_index(r, batch, batch));
  Tensor tp = make(pos, r, [&](Tensor& t, int64_t b) {
    int64_t v;
    if (r.chance(0.8)) v = r.range(0, std::min<int64_t>(ps_eff, I64MAX / 8) * 6);
    else v = index_value(r, 0, ps_eff);
    if (t.isz == 8) std::memcpy(&t.buf->bytes[size_t(b)], &v, 8);
    else if (t.isz == 4) { const int32_t w = int32_t(v); std::memcpy(&t.buf->bytes[size_t(b)], &w, 4); }
    else fill_random_bytes(r, t, b);
  });
  Tensor ti = make(idx, r, fill_index(r, np_eff, r.chance(0.5) ? limit - 1 : limit));
  Tensor tq = make(ptr, r, fill_bytes(r));
  if (is_index(ptr.dtype)) fill_indptr(r, tq, batch, std::min<int64_t>(num_indices, 40), 0.1);
  Tensor to = make(out, r, fill_bytes(r));
  for (Tensor* t : {&tb, &tp, &ti, &tq, &to}) finalize(*t, r);
  std::vector<std::shared_ptr<Buf>> bufs = {tb.buf, tp.buf, ti.buf, tq.buf, to.buf};
  snapshot(bufs);
  g_desc = "nnz=" + std::to_string(nnz) + " batch=" + std::to_string(batch) + " page_size=" + std::to_string(page_size) +
           " num_pages=" + std::to_string(num_pages) + " num_indices=" + std::to_string(num_indices);

  ++c.cases;
  const mlacore_status st =
      mlacore_slot_mapping(tb.p(), tp.p(), ti.p(), tq.p(), page_size, num_pages, to.p(), nullptr);
  if (check_status(c, st, defect, runtime_ok,
                   {"batch_indices", "positions", "kv_indices", "kv_indptr", "out", "page_size", "num_pages"})) {
    for (int64_t t = 0; t < nnz; ++t)
      to.expect_set(t, ref_slot(ti, tq, batch, page_size, num_pages, tb.rd(t), tp.rd(t)));
  }
  check_buffers(bufs);
}

}  // namespace fuzz
