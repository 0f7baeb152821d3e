// Fuzz cases for appends.
// The harness: harness.h; what a case is and how it is checked: driver.cpp.
#include "harness.h"
#include "ops.h"

namespace fuzz {

namespace {

// The index tensors both appends take; clean unless the defect switch says so.
struct AppendIndex {
  TSpec bi, pos, idx, ptr, last;
  Tensor tb, tp, ti, tq, tl;
  int64_t batch = 0;
};

void make_append_index(Rng& r, AppendIndex& a, int64_t nnz) {
  a.batch = r.range(0, 5);
  const DLDataType bdt = r.chance(0.5) ? I32 : I64, pdt = r.chance(0.5) ? I32 : I64, idt = r.chance(0.5) ? I32 : I64;
  const int64_t num_indices = r.range(0, 20);
  a.bi = spec("batch_indices", bdt, {nnz});
  a.pos = spec("positions", pdt, {nnz});
  a.idx = spec("kv_indices", idt, {num_indices});
  a.ptr = spec("kv_indptr", idt, {a.batch + 1});
  a.last = spec("kv_last_page_len", r.chance(0.5) ? I32 : I64, {a.batch});
  for (TSpec* s : {&a.bi, &a.pos, &a.idx, &a.ptr, &a.last}) layout1(*s, r, false);
}

void materialize_append_index(Rng& r, AppendIndex& a, int64_t pages, int64_t page_size,
                              std::vector<std::shared_ptr<Buf>>& bufs) {
  const int64_t ps = std::max<int64_t>(page_size, 1);
  a.tb = make(a.bi, r, fill_index(r, a.batch, a.batch));
  a.tp = make(a.pos, r, fill_index(r, ps * 4, ps));
  a.ti = make(a.idx, r, fill_index(r, pages, pages));
  a.tq = make(a.ptr, r, fill_bytes(r));
  if (is_index(a.ptr.dtype)) fill_indptr(r, a.tq, a.batch, a.idx.ndim == 1 ? a.idx.shape[0] : 0, 0.1);
  a.tl = make(a.last, r, fill_index(r, ps + 1));
  for (Tensor* t : {&a.tb, &a.tp, &a.ti, &a.tq, &a.tl}) {
    finalize(*t, r);
    bufs.push_back(t->buf);
  }
}

// Index-side defects shared by both appends; returns false when none applied.
bool append_index_defect(Rng& r, AppendIndex& a, int64_t nnz, bool* runtime_ok) {
  switch (r.range(0, 6)) {
    case 0: case 1: {
      TSpec* all[] = {&a.bi, &a.pos, &a.idx, &a.ptr, &a.last};
      TSpec* s = all[r.range(0, 4)];
      apply_generic(*s, r, random_generic(r), {I32, I64}, runtime_ok);
      return true;
    }
    case 2: (r.chance(0.5) ? a.bi : a.pos).shape[0] = nnz + r.range(1, 2); return true;
    case 3: a.ptr.shape[0] = a.batch + r.pick<int64_t>({0, 2}); return true;
    case 4: a.idx.dtype = same(a.ptr.dtype, I32) ? I64 : I32; return true;
    case 5: {
      TSpec& s = r.chance(0.5) ? a.bi : a.pos;
      if (s.shape[0] < 2) s.shape[0] = 2, (&s == &a.bi ? a.pos : a.bi).shape[0] = 2;
      s.implicit_strides = false;
      s.strides[0] = -r.range(1, 2);  // appends refuse negative index strides (and the length may differ too)
      return true;
    }
    default: return false;
  }
}

// Applies the reference writes: token i's row of each source into its slot.
struct CopyRef {
  const Tensor* src;
  const Tensor* dst;
  int64_t page_dim, tok_dim, head_dim;  // dims of dst (head_dim < 0: none)
  int64_t extra_off;                    // element offset added (fused V)
  int64_t heads, width;
};

void apply_append_ref(const AppendIndex& a, int64_t pages, int64_t page_size, const std::vector<CopyRef>& copies,
                      int64_t nnz) {
  for (int64_t i = 0; i < nnz; ++i) {
    const int64_t slot = ref_slot(a.ti, a.tq, a.batch, page_size, pages, a.tb.rd(i), a.tp.rd(i));
    if (slot < 0) continue;
    const int64_t page = slot / page_size, off = slot % page_size;
    for (const CopyRef& cp : copies) {
      const Tensor& s = *cp.src;
      const Tensor& d = *cp.dst;
      for (int64_t h = 0; h < cp.heads; ++h)
        for (int64_t e = 0; e < cp.width; ++e) {
          const int last_src = s.s.ndim - 1;
          const int64_t src_el = i * s.stride(0) + (cp.head_dim >= 0 ? h * s.stride(1) : 0) + e * s.stride(last_src);
          const int last_dst = d.s.ndim - 1;
          const int64_t dst_el = cp.extra_off + page * d.stride(int(cp.page_dim)) + off * d.stride(int(cp.tok_dim)) +
                                 (cp.head_dim >= 0 ? h * d.stride(int(cp.head_dim)) : 0) + e * d.stride(last_dst);
          std::memcpy(&d.buf->expect[size_t(d.at(dst_el))], &s.buf->bytes[size_t(s.at(src_el))], size_t(s.isz));
        }
    }
  }
}

bool all_tokens_valid(const AppendIndex& a, int64_t pages, int64_t page_size, int64_t nnz) {
  for (int64_t i = 0; i < nnz; ++i)
    if (ref_slot(a.ti, a.tq, a.batch, page_size, pages, a.tb.rd(i), a.tp.rd(i)) < 0) return false;
  return true;
}

}  // namespace

void fuzz_append_mla(Rng& r, Counter& c) {
  const DLDataType dt = r.pick({BF16, F16, F32});
  const bool real_dims = r.chance(0.1);
  const int64_t P = r.range(0, 5), S = r.pick<int64_t>({1, 2, 3, 16}), nnz = r.range(0, 20);
  const int64_t dc = real_dims ? 512 : r.range(1, 24), dp = real_dims ? 64 : r.range(1, 12);
  const bool shared = r.chance(0.5);
  TSpec ckv = spec("ckv_cache", dt, {P, S, dc}), kpe = spec("kpe_cache", dt, {P, S, dp});
  TSpec sckv = spec("append_ckv", dt, {nnz, dc}), skpe = spec("append_kpe", dt, {nnz, dp});
  std::shared_ptr<Buf> parent;
  int64_t ckv_origin = 0, kpe_origin = 0;
  if (shared) {
    // Halves of one [L, P, S, dc + dp (+pad)] buffer, one layer of it.
    const int64_t L = r.range(1, 2), W = dc + dp + (r.chance(0.2) ? r.range(1, 3) : 0);
    TSpec ps = spec("parent", dt, {L, P, S, W});
    if (r.chance(0.3)) std::swap(ps.strides[1], ps.strides[2]), ps.strides[1] = W, ps.strides[2] = W * S;  // page-minor
    Tensor tpar = make(ps, r, fill_bytes(r));
    parent = tpar.buf;
    ckv_origin = tpar.at(r.range(0, L - 1) * ps.strides[0]);
    kpe_origin = ckv_origin + dc * tpar.isz;
    for (TSpec* s : {&ckv, &kpe}) s->strides[0] = ps.strides[1], s->strides[1] = ps.strides[2], s->strides[2] = 1;
  } else {
    layoutN(ckv, r, true);
    layoutN(kpe, r, true);
  }
  layoutN(sckv, r, true);
  layoutN(skpe, r, true);
  AppendIndex a;
  make_append_index(r, a, nnz);
  int32_t backend = r.chance(0.5) ? MLACORE_BACKEND_AUTO : MLACORE_BACKEND_NATIVE;
  const int32_t strict = r.chance(0.3) ? 1 : 0;

  bool defect = false, runtime_ok = false;
  if (r.chance(0.4)) {
    defect = true;
    switch (r.range(0, 9)) {
      case 0: case 1: {
        TSpec* all[] = {&ckv, &kpe, &sckv, &skpe};
        TSpec* s = all[r.range(0, 3)];
        Def d = random_generic(r);
        if (d == Def::Device && s == &ckv) s = &kpe;
        if (shared && (s == &ckv || s == &kpe) && d == Def::Ndim) d = Def::Null;
        apply_generic(*s, r, d, {dt}, &runtime_ok);
        break;
      }
      case 2: case 3: defect = append_index_defect(r, a, nnz, &runtime_ok); break;
      case 4: if (dc > 1) sckv.implicit_strides = false, sckv.strides[1] = 2; else sckv.shape[1] = 2; break;
      case 5: skpe.shape[0] = nnz + 1; break;
      case 6: sckv.shape[1] = dc + 1; break;
      case 7: if (!shared) kpe.shape[r.range(0, 1)] += 1; else backend = 7; break;
      case 8: backend = r.pick<int32_t>({MLACORE_BACKEND_AITER, 3, -1}); runtime_ok = true; break;
      default: if (!shared && dc > 1) ckv.implicit_strides = false, ckv.strides[2] = 2; else backend = 5; break;
    }
  }
  std::vector<std::shared_ptr<Buf>> bufs;
  Tensor tc, tk;
  if (shared) {
    tc = view(ckv, parent, ckv_origin);
    tk = view(kpe, parent, kpe_origin);
    bufs.push_back(parent);
  } else {
    tc = make(ckv, r, fill_bytes(r));
    tk = make(kpe, r, fill_bytes(r));
    bufs.push_back(tc.buf);
    bufs.push_back(tk.buf);
  }
  Tensor ts = make(sckv, r, fill_bytes(r)), tz = make(skpe, r, fill_bytes(r));
  bufs.push_back(ts.buf);
  bufs.push_back(tz.buf);
  for (Tensor* t : {&tc, &tk, &ts, &tz}) finalize(*t, r);
  materialize_append_index(r, a, P, S, bufs);
  snapshot(bufs);
  g_desc = "P=" + std::to_string(P) + " S=" + std::to_string(S) + " nnz=" + std::to_string(nnz) + " dc=" +
           std::to_string(dc) + " dp=" + std::to_string(dp) + (shared ? " shared" : " separate") +
           " strict=" + std::to_string(strict) + " backend=" + std::to_string(backend);
  const bool strict_reject = !defect && strict && !all_tokens_valid(a, P, S, nnz);
  if (strict_reject) defect = true;

  ++c.cases;
  const mlacore_status st = mlacore_append_paged_mla_kv_cache(ts.p(), tz.p(), a.tb.p(), a.tp.p(), tc.p(), tk.p(),
                                                              a.ti.p(), a.tq.p(), a.tl.p(), backend, strict, nullptr);
  if (check_status(c, st, defect, runtime_ok,
                   {"append_ckv", "append_kpe", "batch_indices", "positions", "ckv_cache", "kpe_cache", "kv_indices",
                    "kv_indptr", "kv_last_page_len", "backend", "(strict): token"})) {
    apply_append_ref(a, P, S, {{&ts, &tc, 0, 1, -1, 0, 1, dc}, {&tz, &tk, 0, 1, -1, 0, 1, dp}}, nnz);
  }
  check_buffers(bufs);
}

void fuzz_append_kv(Rng& r, Counter& c) {
  const DLDataType dt = r.pick({BF16, F16, F32});
  int32_t layout = r.chance(0.5) ? MLACORE_LAYOUT_NHD : MLACORE_LAYOUT_HND;
  const bool nhd = layout == MLACORE_LAYOUT_NHD;
  const bool fused = r.chance(0.4);
  const int64_t P = r.range(0, 4), S = r.pick<int64_t>({1, 2, 3, 8}), H = r.range(1, 3), nnz = r.range(0, 16);
  const int64_t D = r.chance(0.1) ? r.pick<int64_t>({64, 128}) : r.range(1, 16);
  const char* kname = fused ? "paged_kv_cache" : "paged_kv_cache[0]";
  TSpec k = fused ? (nhd ? spec(kname, dt, {P, 2, S, H, D}) : spec(kname, dt, {P, 2, H, S, D}))
                  : (nhd ? spec(kname, dt, {P, S, H, D}) : spec(kname, dt, {P, H, S, D}));
  TSpec v = nhd ? spec("paged_kv_cache[1]", dt, {P, S, H, D}) : spec("paged_kv_cache[1]", dt, {P, H, S, D});
  if (fused) v.null = true;
  TSpec key = spec("append_key", dt, {nnz, H, D}), value = spec("append_value", dt, {nnz, H, D});
  layoutN(k, r, true);
  if (fused && !k.implicit_strides && k.strides[1] == 0) k.strides[1] = 1;  // K and V must not coincide
  layoutN(v, r, true);
  layoutN(key, r, true);
  layoutN(value, r, true);
  AppendIndex a;
  make_append_index(r, a, nnz);
  const int32_t strict = r.chance(0.3) ? 1 : 0;
  int32_t backend = r.chance(0.5) ? MLACORE_BACKEND_AUTO : MLACORE_BACKEND_NATIVE;

  bool defect = false, runtime_ok = false;
  if (r.chance(0.4)) {
    defect = true;
    switch (r.range(0, 8)) {
      case 0: case 1: {
        TSpec* all[] = {&k, &v, &key, &value};
        TSpec* s = all[r.range(0, fused ? 3 : 3)];
        if (fused && s == &v) s = &key;
        Def d = random_generic(r);
        if (d == Def::Device && s == &k) s = &key;
        if (d == Def::Null && s == &v) {  // NULL v_cache selects the fused 5-D form: a 4-D k then fails
        }
        apply_generic(*s, r, d, {dt}, &runtime_ok);
        break;
      }
      case 2: case 3: defect = append_index_defect(r, a, nnz, &runtime_ok); break;
      case 4: layout = r.pick<int32_t>({2, -1, 99}); break;
      case 5: key.shape[1] = H + 1; break;
      case 6: value.shape[0] = nnz + 1; break;
      case 7: if (!fused) v.shape[r.range(0, 3)] += 1; else k.shape[1] = 3; break;
      default: backend = r.pick<int32_t>({MLACORE_BACKEND_AITER, 9}); runtime_ok = true; break;
    }
  }
  std::vector<std::shared_ptr<Buf>> bufs;
  Tensor tk = make(k, r, fill_bytes(r)), tv = make(v, r, fill_bytes(r));
  Tensor tkey = make(key, r, fill_bytes(r)), tval = make(value, r, fill_bytes(r));
  for (Tensor* t : {&tk, &tv, &tkey, &tval}) {
    finalize(*t, r);
    bufs.push_back(t->buf);
  }
  materialize_append_index(r, a, P, S, bufs);
  snapshot(bufs);
  g_desc = std::string(nhd ? "NHD" : "HND") + (fused ? " fused" : " pair") + " P=" + std::to_string(P) + " S=" +
           std::to_string(S) + " H=" + std::to_string(H) + " D=" + std::to_string(D) + " nnz=" + std::to_string(nnz) +
           " strict=" + std::to_string(strict);
  if (!defect && strict && !all_tokens_valid(a, P, S, nnz)) defect = true;

  ++c.cases;
  const mlacore_status st =
      mlacore_append_paged_kv_cache(tkey.p(), tval.p(), a.tb.p(), a.tp.p(), tk.p(), tv.p(), a.ti.p(), a.tq.p(),
                                    a.tl.p(), layout, backend, strict, nullptr);
  if (check_status(c, st, defect, runtime_ok,
                   {"append_key", "append_value", "batch_indices", "positions", "paged_kv_cache", "kv_indices",
                    "kv_indptr", "kv_last_page_len", "kv_layout", "backend", "(strict): token"})) {
    std::vector<CopyRef> copies;
    if (fused) {
      const int64_t f = 2;  // page, kv, then (S, H) or (H, S), D
      copies.push_back({&tkey, &tk, 0, nhd ? f : f + 1, nhd ? f + 1 : f, 0, H, D});
      copies.push_back({&tval, &tk, 0, nhd ? f : f + 1, nhd ? f + 1 : f, tk.stride(1), H, D});
    } else {
      copies.push_back({&tkey, &tk, 0, nhd ? 1 : 2, nhd ? 2 : 1, 0, H, D});
      copies.push_back({&tval, &tv, 0, nhd ? 1 : 2, nhd ? 2 : 1, 0, H, D});
    }
    apply_append_ref(a, P, S, copies, nnz);
  }
  check_buffers(bufs);
}

}  // namespace fuzz
