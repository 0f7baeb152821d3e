// Fuzz cases for MLA decode on tiny CPU shapes.
// The harness: harness.h; what a case is and how it is checked: driver.cpp.
#include <cmath>

#include "harness.h"
#include "ops.h"

namespace fuzz {

namespace {

float half_to_float(uint16_t h, bool bf16) {
  if (bf16) {
    const uint32_t u = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  const uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 31, man = h & 1023;
  float v;
  if (exp == 0) v = std::ldexp(float(man), -24);
  else if (exp == 31) v = man ? NAN : INFINITY;
  else v = std::ldexp(float(man | 1024), int(exp) - 25);
  return sign ? -v : v;
}

uint16_t float_to_half_bits(float f, bool bf16) {
  if (bf16) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return uint16_t((u + 0x7fff + ((u >> 16) & 1)) >> 16);
  }
  // Small values in [-1, 1] only: normal fp16 with round-to-nearest.
  const uint32_t sign = f < 0 ? 0x8000u : 0u;
  float a = std::fabs(f);
  if (a < 6.2e-5f) return uint16_t(sign);
  int e;
  const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  const uint32_t man = uint32_t(std::lround((m * 2 - 1) * 1024));
  return uint16_t(sign | (uint32_t(e - 1 + 15) << 10) | std::min<uint32_t>(man, 1023));
}

}  // namespace

void fuzz_decode(Rng& r, Counter& c) {
  const bool bf16 = r.chance(0.5);
  const DLDataType dt = bf16 ? BF16 : F16;
  const int64_t H = r.range(1, 3), B = r.range(0, 3), S = r.pick<int64_t>({1, 3, 16, 64});
  std::vector<int64_t> qo(static_cast<size_t>(B + 1)), kvp(static_cast<size_t>(B + 1)), lens(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    lens[size_t(b)] = r.chance(0.2) ? 0 : r.range(1, 140);
    qo[size_t(b + 1)] = qo[size_t(b)] + r.range(0, 2);
    kvp[size_t(b + 1)] = kvp[size_t(b)] + (lens[size_t(b)] + S - 1) / S;
  }
  const int64_t total_q = qo[size_t(B)] + (r.chance(0.2) ? r.range(1, 2) : 0);  // rows no request covers
  const int64_t num_idx = kvp[size_t(B)], P = std::max<int64_t>(1, num_idx / 2 + r.range(0, 3));
  const DLDataType idt = r.chance(0.5) ? I32 : I64;
  const bool causal = r.chance(0.5);
  const float scale = float(r.pick<double>({0.0416, 0.1, 1.0}));

  // Plan: a real schedule from the plan builder.
  PlanHandle h;
  if (mlacore_plan_create(std::max<int64_t>(B, 1) + r.range(0, 2), 0, int32_t(r.range(1, 8)), &h.p) != MLACORE_OK) {
    fail(std::string("plan_create: ") + mlacore_last_error());
    return;
  }
  int64_t mb = 0, mw = 0;
  mlacore_plan_capacity(h.p, &mb, &mw, nullptr);
  TSpec tqo = spec("qo_indptr", idt, {B + 1}), tkvp = spec("kv_indptr", idt, {B + 1}), tlen = spec("kv_len", idt, {B});
  TSpec tidx = spec("kv_indices", idt, {num_idx});
  for (TSpec* s : {&tqo, &tkvp, &tlen, &tidx}) layout1(*s, r, true);
  for (TSpec* s : {&tqo, &tkvp, &tlen})  // distinct values: no broadcast
    if (s->strides[0] == 0) s->strides[0] = 2;
  Tensor iq = make(tqo, r, fill_bytes(r)), ik = make(tkvp, r, fill_bytes(r)), il = make(tlen, r, fill_bytes(r));
  for (int64_t i = 0; i <= B; ++i) iq.set(i, qo[size_t(i)]), ik.set(i, kvp[size_t(i)]);
  for (int64_t i = 0; i < B; ++i) il.set(i, lens[size_t(i)]);
  Tensor ii = make(tidx, r, fill_index(r, P, P));
  TSpec md = spec("schedule", I32, {mlacore_plan_schedule_size(mb, mw)});
  Tensor tm = make(md, r, fill_bytes(r));
  for (Tensor* t : {&iq, &ik, &il, &ii, &tm}) finalize(*t, r);
  if (mlacore_plan_build(h.p, iq.p(), ik.p(), il.p(), int32_t(S), int32_t(H), tm.p(), nullptr) != MLACORE_OK) {
    fail(std::string("plan_build: ") + mlacore_last_error());
    return;
  }
  mlacore_plan_info info{};
  mlacore_plan_get_info(h.p, &info);
  mlacore_decode_dims dims{mb, mw, std::max<int64_t>(info.max_qo_len, 1) + (r.chance(0.2) ? 1 : 0),
                           r.chance(0.5) ? mw : r.range(std::max<int32_t>(info.num_partials, 1), mw)};
  bool garbage = r.chance(0.1);  // a random schedule: only safety is checked
  // qo_indptr / kv_len changed after planning (int32 or int64 extremes): only safety.
  const bool tables_changed = r.chance(0.08);
  if (tables_changed) {
    garbage = true;
    const int64_t v = r.pick<int64_t>({I64MIN, I64MAX, I32MIN, I32MAX, -1, total_q + 3});
    if (r.chance(0.5)) iq.set(r.range(0, B), v);
    else if (B > 0) il.set(r.range(0, B - 1), r.pick<int64_t>({I64MIN, I32MIN, -1, 0, 1000}));
  }
  if (garbage) {
    int32_t* m = reinterpret_cast<int32_t*>(&tm.buf->bytes[size_t(tm.origin)]);
    for (int64_t i = 0; i < md.shape[0]; ++i)
      if (r.chance(0.3)) m[i] = int32_t(r.chance(0.5) ? r.range(-3, 200) : int64_t(r.next()));
  }

  // Tensors.
  TSpec qn = spec("q_nope", dt, {total_q, H, 512}), qp = spec("q_pe", dt, {total_q, H, 64});
  TSpec ckv = spec("ckv_cache", dt, {P, S, 512}), kpe = spec("kpe_cache", dt, {P, S, 64});
  TSpec out = spec("out", dt, {total_q, H, 512}), lse = spec("lse", F32, {total_q, H});
  TSpec ws = spec("workspace", U8, {mlacore_mla_decode_workspace_bytes(dims, H) + (r.chance(0.3) ? 64 : 0)});
  for (TSpec* s : {&qn, &qp, &out}) layoutN(*s, r, true);
  layoutN(lse, r, false);
  for (TSpec* s : {&qn, &qp, &out, &lse})  // outputs and queries: distinct elements
    for (int d = 0; d < s->ndim; ++d)
      if (!s->implicit_strides && s->strides[d] == 0) s->strides[d] = 1, s->implicit_strides = true;
  const bool shared = r.chance(0.5);
  bool defect = false, runtime_ok = false, lse_null = r.chance(0.2);
  uint32_t flags = causal ? MLACORE_DECODE_CAUSAL : 0u;
  float sm = scale;
  int64_t page_size_arg = S;
  if (r.chance(0.35)) {
    defect = true;
    const int64_t kind = r.range(0, 12);
    g_desc = "defect " + std::to_string(kind);
    switch (kind) {
      case 0: case 1: {
        TSpec* all[] = {&qn, &qp, &out, &lse, &ws};
        TSpec* s = all[r.range(0, 4)];
        Def d = random_generic(r);
        if (d == Def::Device && s == &qn) s = &qp;
        if (s == &lse && d == Def::Null) lse_null = false, d = Def::Dtype;
        if (s == &ws && (d == Def::Ndim || d == Def::Dtype)) d = Def::Null;  // any shape/dtype of enough bytes is fine
        if (s == &lse) lse_null = false;
        apply_generic(*s, r, d, {s == &lse ? F32 : dt}, &runtime_ok);
        break;
      }
      case 2: qn.shape[1] = r.pick<int64_t>({0, 129}), qp.shape[1] = qn.shape[1], out.shape[1] = qn.shape[1], lse.shape[1] = qn.shape[1]; break;
      case 3: qp.shape[2] = 32; break;
      case 4: page_size_arg = r.pick<int64_t>({0, -1, S + 1}); break;
      case 5: kpe.shape[0] = P + 1; break;
      case 6: {
        // Small wrong values, and values near INT64_MAX / INT32_MAX whose
        // layout offsets or workspace bytes would wrap without their checks.
        const int64_t far = r.pick<int64_t>({I64MAX, I64MAX - 1, int64_t(1) << 62, (int64_t(1) << 62) + (int64_t(1) << 40),
                                             int64_t(1) << 61, I32MAX, I32MAX + 1, (int64_t(1) << 28) + 1, I64MIN});
        switch (r.range(0, 4)) {
          case 0: dims.max_work = r.chance(0.5) ? r.pick<int64_t>({0, -1}) : far; break;
          case 1: dims.max_partials = r.pick<int64_t>({-1, mw + 1, I64MAX, far}); break;  // 0 is valid: no partials
          case 2: dims.max_batch = far; break;
          case 3: dims.max_qo_len = far; break;
          default: dims.max_batch = dims.max_work = far; break;
        }
        break;
      }
      case 7: ws.shape[0] = std::max<int64_t>(0, ws.shape[0] - r.range(1, 64) - (ws.shape[0] > mlacore_mla_decode_workspace_bytes(dims, H) ? 64 : 0)); if (mlacore_mla_decode_workspace_bytes(dims, H) == 0) ws.misalign = 4; break;
      case 8: flags |= 4u << r.range(0, 4); break;
      case 9: sm = r.chance(0.5) ? NAN : INFINITY; break;
      case 10: out.shape[0] = total_q + 1; break;
      case 11: lse_null = false, lse.dtype = F16; break;
      default: dims.max_batch = mb + 2; break;  // schedule length no longer matches
    }
  }
  std::vector<std::shared_ptr<Buf>> bufs = {iq.buf, ik.buf, il.buf, ii.buf, tm.buf};
  auto fill_val = [&](Tensor& t, int64_t b) {
    const uint16_t v = float_to_half_bits(float(r.range(-1000, 1000)) / 1000.f, bf16);
    // A dtype defect may have made the elements 1 byte wide: never write past one.
    std::memcpy(&t.buf->bytes[size_t(b)], &v, size_t(std::min<int64_t>(2, t.isz)));
  };
  Tensor tqn = make(qn, r, fill_val), tqp = make(qp, r, fill_val);
  Tensor tc, tk;
  if (shared) {
    TSpec ps = spec("parent", dt, {P, S, 576 + (r.chance(0.3) ? 8 : 0)});
    Tensor tpar = make(ps, r, fill_val);
    ckv.strides[0] = kpe.strides[0] = ps.strides[0];
    ckv.strides[1] = kpe.strides[1] = ps.strides[1];
    ckv.strides[2] = kpe.strides[2] = 1;
    tc = view(ckv, tpar.buf, tpar.origin);
    tk = view(kpe, tpar.buf, tpar.origin + 512 * 2);
    bufs.push_back(tpar.buf);
  } else {
    layoutN(ckv, r, true);
    layoutN(kpe, r, true);
    tc = make(ckv, r, fill_val);
    tk = make(kpe, r, fill_val);
    bufs.push_back(tc.buf);
    bufs.push_back(tk.buf);
  }
  Tensor to = make(out, r, fill_bytes(r)), tl = make(lse, r, fill_bytes(r)), tw = make(ws, r, fill_bytes(r));
  if (lse_null) tl.s.null = true;
  for (Tensor* t : {&tqn, &tqp, &tc, &tk, &to, &tl, &tw}) finalize(*t, r);
  for (Tensor* t : {&tqn, &tqp, &to, &tl, &tw}) bufs.push_back(t->buf);
  snapshot(bufs);
  g_desc += " B=" + std::to_string(B) + " H=" + std::to_string(H) + " S=" + std::to_string(S) + " P=" + std::to_string(P) +
           " total_q=" + std::to_string(total_q) + (bf16 ? " bf16" : " fp16") + (causal ? " causal" : "") +
           (garbage ? " garbage-schedule" : "") + (shared ? " shared" : " separate");

  ++c.cases;
  const mlacore_status st = mlacore_mla_decode(tqn.p(), tqp.p(), tc.p(), tk.p(), ii.p(), ik.p(), iq.p(), il.p(), tm.p(),
                                               tw.p(), to.p(), tl.p(), dims, page_size_arg, sm, flags, nullptr);
  if (std::getenv("MLACORE_FUZZ_VERBOSE")) {
    const int32_t* m = reinterpret_cast<const int32_t*>(&tm.buf->bytes[size_t(tm.origin)]);
    int64_t off[4];
    mlacore_plan_layout(mb, mw, off);
    std::fprintf(stderr, "dims %lld %lld %lld hdr", (long long)dims.max_batch, (long long)dims.max_work, (long long)dims.max_qo_len);
    for (int i = 0; i < 8; ++i) std::fprintf(stderr, " %d", m[i]);
    std::fprintf(stderr, "\nitems:");
    for (int64_t w = 0; w < mw; ++w) std::fprintf(stderr, " (%d %d %d %d)", m[off[3] + 4 * w], m[off[3] + 4 * w + 1], m[off[3] + 4 * w + 2], m[off[3] + 4 * w + 3]);
    std::fprintf(stderr, "\nsplit:");
    for (int64_t b = 0; b <= mb; ++b) std::fprintf(stderr, " %d", m[off[2] + b]);
    std::fprintf(stderr, "\nqo/kvp/len:");
    for (int64_t b = 0; b < B; ++b) std::fprintf(stderr, " [%lld %lld %lld]", (long long)iq.rd(b), (long long)ik.rd(b), (long long)il.rd(b));
    std::fprintf(stderr, "\nidx:");
    for (int64_t i = 0; i < num_idx; ++i) std::fprintf(stderr, " %lld", (long long)ii.rd(i));
    std::fprintf(stderr, "\ndefect %d status %d %s\n", int(defect), int(st), mlacore_last_error());
    for (const Tensor* t : {&iq, &ik, &il, &ii, &tqn, &tqp, &tc, &tk, &to, &tl, &tw}) {
      std::fprintf(stderr, "  %s ndim %d null %d impl %d:", t->s.name, t->s.ndim, int(t->s.null), int(t->s.implicit_strides));
      for (int d = 0; d < t->dims(); ++d) std::fprintf(stderr, " %lld/%lld", (long long)t->s.shape[d], (long long)t->stride(d));
      std::fprintf(stderr, "\n");
    }
  }
  const bool ok = check_status(c, st, defect, runtime_ok,
                               {"q_nope", "q_pe", "ckv_cache", "kpe_cache", "kv_indices", "kv_indptr", "qo_indptr",
                                "kv_len", "schedule", "workspace", "out", "lse", "dims", "page_size", "flags", "sm_scale"});
  if (ok) {
    // Targets: the workspace, and out/lse rows of query tokens some request
    // covers (qo_indptr decides, whatever the schedule says). Everything else
    // must keep its bytes.
    std::vector<char> covered(size_t(total_q), 0);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = qo[size_t(b)]; t < qo[size_t(b + 1)]; ++t) covered[size_t(t)] = 1;
    if (tables_changed) std::fill(covered.begin(), covered.end(), char(1));
    for (int64_t i = 0; i < ws.shape[0]; ++i) tw.buf->expect[size_t(tw.at(i))] = tw.buf->bytes[size_t(tw.at(i))];
    for (int64_t t = 0; t < total_q; ++t)
      for (int64_t hh = 0; hh < H && covered[size_t(t)]; ++hh) {
        const int64_t o = to.at(t * to.stride(0) + hh * to.stride(1));
        std::memcpy(&to.buf->expect[size_t(o)], &to.buf->bytes[size_t(o)], size_t(512 * 2));
        if (!tl.s.null) {
          const int64_t lo = tl.at(t * tl.stride(0) + hh * tl.stride(1));
          std::memcpy(&tl.buf->expect[size_t(lo)], &tl.buf->bytes[size_t(lo)], 4);
        }
      }
    if (!garbage) {
      // Reference attention in double for every covered row.
      static std::vector<float> lut[2];  // 16-bit pattern -> float, per dtype
      if (lut[bf16].empty()) {
        lut[bf16].resize(65536);
        for (uint32_t v = 0; v < 65536; ++v) lut[bf16][v] = half_to_float(uint16_t(v), bf16);
      }
      const float* table = lut[bf16].data();
      auto ld = [&](const Tensor& t, int64_t el) {
        uint16_t v;
        std::memcpy(&v, &t.buf->bytes[size_t(t.at(el))], 2);
        return double(table[v]);
      };
      for (int64_t b = 0; b < B; ++b) {
        const int64_t q0 = qo[size_t(b)], ql = qo[size_t(b + 1)] - q0, L = lens[size_t(b)];
        for (int64_t t = 0; t < ql; ++t)
          for (int64_t hh = 0; hh < H; ++hh) {
            std::vector<double> sc;
            std::vector<int64_t> rows_c;
            const int64_t qrow_n = (q0 + t) * tqn.stride(0) + hh * tqn.stride(1);
            const int64_t qrow_p = (q0 + t) * tqp.stride(0) + hh * tqp.stride(1);
            for (int64_t p = 0; p < L; ++p) {
              if (causal && p >= L - ql + t + 1) continue;
              const int64_t slot = ref_slot(ii, ik, B, S, P, b, p);
              if (slot < 0) continue;  // masked: bad page id
              const int64_t pg = slot / S, off = slot % S;
              double acc = 0;
              for (int d = 0; d < 512; ++d) acc += ld(tqn, qrow_n + d) * ld(tc, pg * tc.stride(0) + off * tc.stride(1) + d);
              for (int d = 0; d < 64; ++d) acc += ld(tqp, qrow_p + d) * ld(tk, pg * tk.stride(0) + off * tk.stride(1) + d);
              sc.push_back(acc * sm);
              rows_c.push_back(pg * tc.stride(0) + off * tc.stride(1));
            }
            double mx = -INFINITY, sum = 0, worst = 0;
            for (double s : sc) mx = std::max(mx, s);
            std::vector<double> wgt(sc.size());
            for (size_t j = 0; j < sc.size(); ++j) sum += (wgt[j] = std::exp(sc[j] - mx));
            const int64_t obase = (q0 + t) * to.stride(0) + hh * to.stride(1);
            for (int d = 0; d < 512; ++d) {
              double o = 0;
              for (size_t j = 0; j < sc.size(); ++j) o += wgt[j] / sum * ld(tc, rows_c[j] + d);
              const double got = ld(to, obase + d);
              worst = std::max(worst, sc.empty() && got != 0 ? 1e9 : std::fabs(got - o));
            }
            const double tol = bf16 ? 2e-2 : 4e-3;
            if (!(worst <= tol))
              fail("decode output off by " + std::to_string(worst) + " (request " + std::to_string(b) + ", row " +
                   std::to_string(t) + ", head " + std::to_string(hh) + ")");
            if (!tl.s.null) {
              float got;
              std::memcpy(&got, &tl.buf->bytes[size_t(tl.at((q0 + t) * tl.stride(0) + hh * tl.stride(1)))], 4);
              const double want = sc.empty() ? -INFINITY : (mx + std::log(sum)) / std::log(2.0);
              if (sc.empty() ? !(std::isinf(got) && got < 0) : !(std::fabs(got - want) <= 1e-3 * (1 + std::fabs(want))))
                fail("decode lse " + std::to_string(got) + ", want " + std::to_string(want));
            }
          }
      }
    }
  }
  check_buffers(bufs);
}

}  // namespace fuzz
