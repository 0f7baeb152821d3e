// Fuzz cases for combined_kv_view / explain_kv_layout.
// The harness: harness.h; what a case is and how it is checked: driver.cpp.
#include "harness.h"
#include "ops.h"

namespace fuzz {

void fuzz_kv_layout(Rng& r, Counter& c) {
  const int64_t P = r.range(0, 4), S = r.range(0, 4), dc = r.range(1, 16), dp = r.range(1, 8);
  const DLDataType dt = r.pick({BF16, F16, F32, I32, U8});
  // A parent [L, P, S, W] buffer (W = dc + dp, maybe padded) whose halves are
  // ckv and kpe, then perturbations that may or may not break adjacency.
  const int64_t W = dc + dp, pad = r.chance(0.2) ? r.range(1, 3) : 0, L = r.range(1, 2);
  TSpec parent = spec("parent", dt, {L, P, S, W + pad});
  if (r.chance(0.2)) parent.strides[1] = parent.strides[1] + r.range(1, 8);  // padded pages
  Tensor tpar = make(parent, r, fill_bytes(r));
  const int64_t layer = r.range(0, L - 1);
  TSpec ckv = spec("ckv_cache", dt, {P, S, dc}), kpe = spec("kpe_cache", dt, {P, S, dp});
  for (TSpec* s : {&ckv, &kpe}) {
    s->strides[0] = parent.strides[1];
    s->strides[1] = parent.strides[2];
    s->strides[2] = 1;
  }
  const int64_t base = tpar.at(layer * parent.strides[0]);
  int64_t kpe_origin = base + dc * tpar.isz;
  std::shared_ptr<Buf> kpe_buf = tpar.buf;
  std::vector<std::shared_ptr<Buf>> bufs = {tpar.buf};
  Tensor sep;
  bool defect = false, runtime_ok = false;
  switch (r.range(0, 12)) {
    case 0: kpe_origin = base - dp * tpar.isz + (int64_t(W + pad) * tpar.isz) * 0; break;  // reversed
    case 1: {  // separate allocation
      sep = make(spec("sep", dt, {P, S, dp}), r, fill_bytes(r));
      kpe_buf = sep.buf;
      kpe_origin = sep.origin;
      kpe.strides[0] = sep.stride(0), kpe.strides[1] = sep.stride(1);
      bufs.push_back(sep.buf);
      break;
    }
    case 2: kpe.dtype = bad_dtype(r, {dt}); break;
    case 3: kpe.device = {kDLCUDA, 0}; break;
    case 4: kpe.strides[1] += r.pick<int64_t>({-1, 1, 2}); break;
    case 5: kpe.strides[0] += r.pick<int64_t>({-1, 1, 2}); break;
    case 6: ckv.strides[2] = r.pick<int64_t>({2, 0, -1}); break;
    case 7: kpe_origin += tpar.isz * r.pick<int64_t>({-1, 1}); break;
    case 8: ckv.ndim = r.pick(std::initializer_list<int>{2, 4}), ckv.shape[3] = 1, ckv.strides[3] = 1; defect = true; break;
    case 9: kpe.shape[r.range(0, 1)] += 1; defect = true; break;
    case 10: {
      TSpec* s = r.chance(0.5) ? &ckv : &kpe;
      Def d = random_generic(r);
      if (d == Def::Dtype || d == Def::Device) d = Def::Null;  // those only break adjacency
      apply_generic(*s, r, d, {}, &runtime_ok);
      defect = true;
      break;
    }
    default: break;
  }
  if (!ckv.null && ckv.ndim == 3 && ckv.shape[2] < 1) defect = true;
  Tensor tc = view(ckv, tpar.buf, base), tk = view(kpe, kpe_buf, kpe_origin);
  finalize(tc, r);
  finalize(tk, r);
  snapshot(bufs);
  g_desc = "P=" + std::to_string(P) + " S=" + std::to_string(S) + " dc=" + std::to_string(dc) + " dp=" + std::to_string(dp);

  // Reference per kv_layout.h (defects above are exactly the VALUE/TYPE cases).
  bool adjacent = false;
  if (!defect) {
    const bool whole = (int64_t(kpe.dtype.bits) * kpe.dtype.lanes) % 8 == 0 && kpe.dtype.bits > 0 && kpe.dtype.lanes > 0;
    if (!whole) defect = true;  // kpe_cache: whole bytes per element required
    // By address, as the contract says, not by buffer identity: an empty
    // cache's first element may lie past its own buffer, exactly where a
    // separate allocation begins (seen in CI: P=1 S=0, F32, dc=14).
    adjacent = whole && kpe.device.device_type == kDLCPU && same(kpe.dtype, ckv.dtype) &&
               tk.address() == tc.address() + uintptr_t(dc * tc.isz) &&
               (dc <= 1 || ckv.strides[2] == 1) && (dp <= 1 || kpe.strides[2] == 1) &&
               (S <= 1 || (ckv.strides[1] == W && kpe.strides[1] == W)) && (P <= 1 || kpe.strides[0] == ckv.strides[0]);
  }

  ++c.cases;
  int64_t shape[4] = {-7, -7, -7, -7}, strides[4] = {-7, -7, -7, -7};
  int32_t adj = -7;
  const int nulls = r.chance(0.05) ? int(r.range(1, 3)) : 0;
  const mlacore_status st = mlacore_combined_kv_view(tc.p(), tk.p(), nulls == 1 ? nullptr : shape,
                                                     nulls == 2 ? nullptr : strides, nulls == 3 ? nullptr : &adj);
  if (check_status(c, st, defect || nulls != 0, runtime_ok,
                   {"ckv_cache", "kpe_cache", "view_shape", "view_strides", "adjacent"})) {
    if (adj != (adjacent ? 1 : 0)) fail("combined_kv_view: adjacent=" + std::to_string(adj) + ", want " + std::to_string(adjacent));
    if (adj == 1) {
      const int64_t want_shape[3] = {P, S, W}, want_strides[3] = {ckv.strides[0], S > 1 ? ckv.strides[1] : W, 1};
      for (int i = 0; i < 3; ++i)
        if (shape[i] != want_shape[i] || strides[i] != want_strides[i]) fail("combined_kv_view: wrong view");
    } else if (shape[0] != -7 || strides[0] != -7) {
      fail("combined_kv_view: view written for a non-adjacent pair");
    }
    if (shape[3] != -7 || strides[3] != -7) fail("combined_kv_view: wrote past 3 elements");
  }
  check_buffers(bufs);

  // explain: the sentence agrees with the decision and is truncated safely.
  ++c.cases;
  std::vector<char> big(4096, 'x');
  size_t full = 0;
  const mlacore_status st2 = mlacore_explain_kv_layout(tc.p(), tk.p(), big.data(), big.size(), &full);
  if (check_status(c, st2, defect, runtime_ok, {"ckv_cache", "kpe_cache"})) {
    if (full >= big.size() || std::strlen(big.data()) != full) fail("explain_kv_layout: length mismatch");
    else if ((std::strncmp(big.data(), "adjacent", 8) == 0) != adjacent) fail("explain_kv_layout disagrees: " + std::string(big.data()));
    const size_t sizes[] = {0, 1, 2, 7, 40};
    const size_t n = sizes[r.range(0, 4)];
    std::vector<char> small(n + 2 * kGuard, char(kCanary));
    size_t len2 = 0;
    const bool null_buf = n == 0 && r.chance(0.5);
    ++c.cases;
    const mlacore_status st3 = mlacore_explain_kv_layout(tc.p(), tk.p(), null_buf ? nullptr : small.data() + kGuard, n,
                                                         r.chance(0.5) ? &len2 : nullptr);
    if (st3 != MLACORE_OK) fail(std::string("explain_kv_layout with a small buffer failed: ") + mlacore_last_error());
    for (size_t i = 0; i < small.size(); ++i) {
      const bool inside = i >= size_t(kGuard) && i < size_t(kGuard) + n;
      if (!inside && small[i] != char(kCanary)) { fail("explain_kv_layout wrote outside buf"); break; }
    }
    if (n > 0) {
      const size_t k = std::min(n - 1, full);
      if (small[kGuard + k] != '\0' || std::strncmp(small.data() + kGuard, big.data(), k) != 0)
        fail("explain_kv_layout: truncated text is not a NUL-terminated prefix");
    }
  }
  // A NULL buf with a non-zero size is a TYPE error naming buf.
  if (!defect && r.chance(0.1)) {
    ++c.cases;
    const mlacore_status st4 = mlacore_explain_kv_layout(tc.p(), tk.p(), nullptr, 8, nullptr);
    check_status(c, st4, true, false, {"buf"});
  }
}

}  // namespace fuzz
