// Fuzz cases for page indices from a block table.
// The harness: harness.h; what a case is and how it is checked: driver.cpp.
#include "harness.h"
#include "ops.h"

namespace fuzz {

void fuzz_block_table(Rng& r, Counter& c) {
  const DLDataType tdt = r.chance(0.5) ? I32 : I64, cdt = r.chance(0.5) ? I32 : I64;
  const int64_t rows = r.range(0, 6);
  const bool huge_cols = r.chance(0.05);
  const int64_t cols = huge_cols ? (int64_t(1) << 40) : r.range(0, 8);
  const int64_t out_len = r.range(0, 40);
  TSpec table = spec("block_table", tdt, {rows, cols}), cu = spec("cu_num_blocks", cdt, {rows + 1});
  TSpec out = spec("out", tdt, {out_len});
  layoutN(table, r, false);
  if (huge_cols) table.implicit_strides = false, table.strides[1] = 0, table.strides[0] = 1;
  layout1(cu, r, true);
  layout1(out, r, true);

  bool defect = false, runtime_ok = false;
  if (r.chance(0.4)) {
    defect = true;
    switch (r.range(0, 5)) {
      case 0: case 1: {
        TSpec* all[] = {&table, &cu, &out};
        TSpec* s = all[r.range(0, 2)];
        Def d = random_generic(r);
        if (d == Def::Device && s == &table) s = &cu;
        if (d == Def::Ndim && s == &table && rows == 0) d = Def::Null;  // a 1-D table of 0 rows... keep it simple
        apply_generic(*s, r, d, {I32, I64}, &runtime_ok);
        break;
      }
      case 2: cu.shape[0] = rows + 1 + r.pick<int64_t>({-1, 1, 2}); break;
      case 3: out.dtype = same(tdt, I32) ? I64 : I32; break;
      case 4: out.ndim = 2, out.shape[1] = 1, out.strides[1] = 1; break;
      default: table.ndim = r.pick(std::initializer_list<int>{1, 3}), table.shape[2] = 1, table.strides[2] = 1; break;
    }
  }
  Tensor tt = make(table, r, fill_index(r, 1000));
  Tensor tc = make(cu, r, fill_bytes(r));
  if (is_index(cu.dtype) && cu.ndim == 1 && cu.shape[0] == rows + 1) {
    int64_t v = r.chance(0.8) ? 0 : r.range(-3, 10);
    for (int64_t i = 0; i <= rows; ++i) {
      if (i > 0) v += r.range(0, std::min<int64_t>(cols, 8) + 2);
      tc.set(i, r.chance(0.1) ? index_value(r, out_len + 3, out_len) : v);
    }
  }
  Tensor to = make(out, r, fill_bytes(r));
  for (Tensor* t : {&tt, &tc, &to}) finalize(*t, r);
  std::vector<std::shared_ptr<Buf>> bufs = {tt.buf, tc.buf, to.buf};
  snapshot(bufs);
  g_desc = "rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) + " out_len=" + std::to_string(out_len);

  ++c.cases;
  const mlacore_status st = mlacore_page_indices_from_block_table(tt.p(), tc.p(), to.p(), nullptr);
  if (check_status(c, st, defect, runtime_ok, {"block_table", "cu_num_blocks", "out"})) {
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t begin = tc.rd(row), end = tc.rd(row + 1);
      if (begin < 0 || end < begin || begin >= out_len) continue;
      const int64_t n = std::min({end - begin, cols, out_len - begin});
      for (int64_t j = 0; j < n; ++j)
        to.expect_set(begin + j, tt.get_int(tt.at(row * tt.stride(0) + j * tt.stride(1))));
    }
  }
  check_buffers(bufs);
}

}  // namespace fuzz
