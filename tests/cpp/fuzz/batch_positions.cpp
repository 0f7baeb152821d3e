// Fuzz cases for batch indices and positions.
// The harness: harness.h; what a case is and how it is checked: driver.cpp.
#include "harness.h"
#include "ops.h"

namespace fuzz {

void fuzz_batch_positions(Rng& r, Counter& c) {
  const DLDataType idt = r.chance(0.5) ? I32 : I64, odt = r.chance(0.5) ? I32 : I64;
  const int64_t batch = r.range(0, 6), nnz = r.range(0, 40);
  TSpec ptr = spec("append_indptr", idt, {batch + 1}), lens = spec("seq_lens", idt, {batch});
  TSpec bi = spec("batch_indices", odt, {nnz}), pos = spec("positions", odt, {nnz});
  for (TSpec* s : {&ptr, &lens, &bi, &pos}) layout1(*s, r, true);
  const bool corrupt = r.chance(0.3);
  // Outputs with distinct elements when indptr may be non-monotone: then
  // every written pair is checked on its own (see below).
  if (corrupt)
    for (TSpec* s : {&bi, &pos})
      if (s->strides[0] == 0) s->strides[0] = 1;

  bool defect = false, runtime_ok = false;
  if (r.chance(0.4)) {
    defect = true;
    switch (r.range(0, 6)) {
      case 0: case 1: {
        TSpec* all[] = {&ptr, &lens, &bi, &pos};
        TSpec* s = all[r.range(0, 3)];
        const Def d = random_generic(r);
        if (d == Def::Device && s == &ptr) s = &bi;
        apply_generic(*s, r, d, {I32, I64}, &runtime_ok);
        break;
      }
      case 2: ptr.shape[0] = 0, lens.shape[0] = 0; break;
      case 3: lens.shape[0] = batch + r.pick<int64_t>({-1, 1}); if (lens.shape[0] < 0) lens.shape[0] = 1; break;
      case 4: lens.dtype = same(idt, I32) ? I64 : I32; break;
      case 5: pos.shape[0] = nnz + r.range(1, 3); break;
      default: pos.dtype = same(odt, I32) ? I64 : I32; break;
    }
  }
  Tensor tp = make(ptr, r, fill_bytes(r));
  bool monotone = true;
  if (is_index(ptr.dtype) && ptr.ndim == 1 && ptr.shape[0] == batch + 1 && !ptr.null) {
    int64_t v = r.chance(0.8) ? 0 : r.range(-5, 10);
    for (int64_t i = 0; i <= batch; ++i) {
      if (i > 0) v += r.range(0, 9);
      tp.set(i, corrupt && r.chance(0.3) ? index_value(r, nnz + 3, nnz) : v);
    }
    for (int64_t i = 0; i < batch; ++i) monotone = monotone && tp.rd(i) <= tp.rd(i + 1);
  }
  Tensor tl = make(lens, r, [&](Tensor& t, int64_t b) {
    const int64_t v = r.chance(0.7) ? r.range(0, 30) : index_value(r, 30, I32MAX - r.range(0, 3));
    if (t.isz == 8) std::memcpy(&t.buf->bytes[size_t(b)], &v, 8);
    else if (t.isz == 4) { const int32_t w = int32_t(v); std::memcpy(&t.buf->bytes[size_t(b)], &w, 4); }
    else fill_random_bytes(r, t, b);
  });
  Tensor tb = make(bi, r, fill_bytes(r)), to = make(pos, r, fill_bytes(r));
  for (Tensor* t : {&tp, &tl, &tb, &to}) finalize(*t, r);
  std::vector<std::shared_ptr<Buf>> bufs = {tp.buf, tl.buf, tb.buf, to.buf};
  snapshot(bufs);
  g_desc = "batch=" + std::to_string(batch) + " nnz=" + std::to_string(nnz) + (monotone ? " monotone" : " non-monotone");

  ++c.cases;
  const mlacore_status st = mlacore_batch_indices_positions(tp.p(), tl.p(), tb.p(), to.p(), nullptr);
  if (check_status(c, st, defect, runtime_ok, {"append_indptr", "seq_lens", "batch_indices", "positions"})) {
    const int64_t out_max = same(odt, I32) ? I32MAX : I64MAX;
    auto position = [&](int64_t b, int64_t t) -> int64_t {
      const int64_t seq_len = tl.rd(b);
      const __int128 p = (__int128)seq_len - tp.rd(b + 1) + t;
      return seq_len < 0 || p < 0 || p > out_max ? -1 : int64_t(p);
    };
    for (int64_t t = 0; t < nnz; ++t) {
      if (monotone) {
        int64_t b = -1;
        if (batch > 0 && tp.rd(0) <= t && t < tp.rd(batch))
          for (int64_t k = 0; k < batch; ++k)
            if (tp.rd(k) <= t) b = k;
        tb.expect_set(t, b);
        to.expect_set(t, b < 0 ? -1 : position(b, t));
      } else {
        // Non-monotone indptr: whichever request the search lands on must
        // cover t, and its position must be right.
        const int64_t b = tb.rd(t), p = to.rd(t);
        if (b == -1) {
          if (p != -1) fail("token " + std::to_string(t) + ": batch index -1 with position " + std::to_string(p));
        } else if (b < 0 || b >= batch || !(tp.rd(b) <= t && t < tp.rd(b + 1))) {
          fail("token " + std::to_string(t) + " assigned to request " + std::to_string(b) + " that does not cover it");
        } else if (p != position(b, t)) {
          fail("token " + std::to_string(t) + ": position " + std::to_string(p) + ", want " +
               std::to_string(position(b, t)));
        }
        tb.expect_set(t, b);
        to.expect_set(t, p);
      }
    }
  }
  check_buffers(bufs);
}

}  // namespace fuzz
