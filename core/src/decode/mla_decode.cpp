// MLA decode: argument validation, dispatch, and the CPU path. The CPU path
// executes the planned schedule exactly as the GPU does (work items writing
// outputs or fp32 partials, then the LSE combine), so CPU tests check the
// schedule and the combine, not only the attention arithmetic.
#include <mlacore/backend.h>
#include <mlacore/mla_decode.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "backends/aiter/aiter_decode.h"
#include "common/checked.h"
#include "backends/backend_route.h"
#include "plan/schedule.h"
#include "common/dispatch.h"
#include "decode/decode_numeric.h"
#include "common/error.h"
#include "layout/kv_layout.h"
#include "decode/mla_decode.h"
#include "common/tensor.h"

namespace mlacore {
namespace {

struct Conv {
  float (*load)(uint16_t);
  uint16_t (*store)(float);
};

template <class Idx>
int64_t idx_at(const Idx* p, int64_t stride, int64_t i) {
  return static_cast<int64_t>(p[i * stride]);
}

// Rows of request b as the kernels see them: [qo_begin, qo_begin + qo_len)
// query tokens, kv_len KV tokens. False when the tables are inconsistent, in
// which case the request is skipped (nothing to write that is in bounds).
template <class Idx>
bool request_rows(const DecodeParams<Idx>& p, int64_t total_q, int64_t b, int64_t& qo_begin, int64_t& qo_len,
                  int64_t& kv_len) {
  qo_begin = idx_at(p.qo_indptr, p.qo_indptr_stride, b);
  const int64_t qo_end = idx_at(p.qo_indptr, p.qo_indptr_stride, b + 1);
  // Index values are caller data: checked before any arithmetic that could
  // overflow (qo_end - qo_begin, kv_len - qo_len). A negative kv_len is a
  // request without KV, like 0.
  kv_len = std::max<int64_t>(idx_at(p.kv_len, p.kv_len_stride, b), 0);
  qo_len = 0;
  if (qo_begin < 0 || qo_end < qo_begin || qo_end > total_q) return false;
  qo_len = qo_end - qo_begin;
  return true;
}

template <class Idx>
void write_row(const DecodeParams<Idx>& p, const Conv& cv, int64_t q_index, int h, const float* o, float lse) {
  uint16_t* dst = static_cast<uint16_t*>(p.out) + q_index * p.out_stride_t + h * p.out_stride_h;
  for (int d = 0; d < kCkvDim; ++d) dst[d] = cv.store(o[d]);
  if (p.lse) p.lse[q_index * p.lse_stride_t + h * p.lse_stride_h] = lse;
}

template <class Idx>
void cpu_work_item(const DecodeParams<Idx>& p, const Conv& cv, int64_t total_q, const WorkItem& item) {
  const int64_t b = item.request;
  int64_t qo_begin, qo_len, kv_len;
  if (!request_rows(p, total_q, b, qo_begin, qo_len, kv_len)) return;
  const int64_t H = p.num_heads;
  const int64_t rows_cap = decode_partial_rows(p.max_qo_len, H);
  const bool to_partial = item.partial >= 0;
  if (to_partial && item.partial >= p.max_partials) return;  // outside the workspace: never a write

  const int64_t begin = std::max<int64_t>(item.kv_begin, 0);
  const int64_t end = std::min<int64_t>(item.kv_end, kv_len);
  // Row offsets of the item's tokens, kMaskedRow where masked (past the pages,
  // bad page id): offsets may be negative (negative page or token strides),
  // so the mark is a value no offset can take.
  constexpr int64_t kMaskedRow = std::numeric_limits<int64_t>::min();
  std::vector<int64_t> ckv_off, kpe_off;
  for (int64_t pos = begin; pos < end; ++pos) {
    const int64_t slot = p.pages.slot(b, pos);
    if (slot < 0) {
      ckv_off.push_back(kMaskedRow);
      kpe_off.push_back(kMaskedRow);
      continue;
    }
    const int64_t page = slot / p.pages.page_size, off = slot % p.pages.page_size;
    ckv_off.push_back(page * p.ckv_stride_page + off * p.ckv_stride_tok);
    kpe_off.push_back(page * p.kpe_stride_page + off * p.kpe_stride_tok);
  }

  const auto* qn = static_cast<const uint16_t*>(p.q_nope);
  const auto* qp = static_cast<const uint16_t*>(p.q_pe);
  const auto* ckv = static_cast<const uint16_t*>(p.ckv);
  const auto* kpe = static_cast<const uint16_t*>(p.kpe);
  std::vector<float> q(kQkDim), s(ckv_off.size()), o(kCkvDim);
  for (int64_t r = 0; r < qo_len * H; ++r) {
    const int64_t t = r / H;
    const int h = static_cast<int>(r % H);
    const int64_t qi = qo_begin + t;
    for (int d = 0; d < kCkvDim; ++d) q[d] = cv.load(qn[qi * p.q_nope_stride_t + h * p.q_nope_stride_h + d]);
    for (int d = 0; d < kKpeDim; ++d) q[kCkvDim + d] = cv.load(qp[qi * p.q_pe_stride_t + h * p.q_pe_stride_h + d]);
    const int64_t limit = p.causal ? kv_len - qo_len + t + 1 : kv_len;

    float m = -std::numeric_limits<float>::infinity();
    for (size_t j = 0; j < ckv_off.size(); ++j) {
      const int64_t pos = begin + static_cast<int64_t>(j);
      s[j] = -std::numeric_limits<float>::infinity();
      if (ckv_off[j] == kMaskedRow || pos >= limit) continue;
      float acc = 0.f;
      for (int d = 0; d < kCkvDim; ++d) acc += q[d] * cv.load(ckv[ckv_off[j] + d]);
      for (int d = 0; d < kKpeDim; ++d) acc += q[kCkvDim + d] * cv.load(kpe[kpe_off[j] + d]);
      s[j] = acc * p.scale_log2;
      m = std::max(m, s[j]);
    }
    std::fill(o.begin(), o.end(), 0.f);
    float l = 0.f;
    if (m != -std::numeric_limits<float>::infinity()) {
      for (size_t j = 0; j < ckv_off.size(); ++j) {
        if (s[j] == -std::numeric_limits<float>::infinity()) continue;
        const float w = std::exp2(s[j] - m);
        l += w;
        for (int d = 0; d < kCkvDim; ++d) o[d] += w * cv.load(ckv[ckv_off[j] + d]);
      }
    }
    const float inv = l > 0.f ? 1.f / l : 0.f;
    for (float& x : o) x *= inv;
    const float lse = l > 0.f ? m + std::log2(l) : -std::numeric_limits<float>::infinity();
    if (!to_partial) {
      write_row(p, cv, qi, h, o.data(), lse);
    } else if (r < rows_cap) {
      const int64_t row = item.partial * rows_cap + r;
      std::memcpy(p.partial_o + row * kCkvDim, o.data(), sizeof(float) * kCkvDim);
      p.partial_lse[row] = lse;
    }
  }
}

template <class Idx>
void cpu_combine(const DecodeParams<Idx>& p, const Conv& cv, int64_t total_q, int64_t batch) {
  const int32_t* split_indptr = p.schedule + ScheduleLayout{p.max_batch, p.max_work}.split_indptr();
  const int64_t H = p.num_heads;
  const int64_t rows_cap = decode_partial_rows(p.max_qo_len, H);
  std::vector<float> o(kCkvDim);
  const std::vector<float> zeros(kCkvDim, 0.f);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t b = 0; b < batch; ++b) {
    int64_t qo_begin, qo_len, kv_len;
    if (!request_rows(p, total_q, b, qo_begin, qo_len, kv_len)) continue;
    const int64_t first = split_indptr[b], last = split_indptr[b + 1];
    if (last <= first) {
      // No partials: written by its one work item, unless it has no KV, in
      // which case the planner may have given it no item at all.
      if (kv_len <= 0)
        for (int64_t r = 0; r < qo_len * H; ++r) write_row(p, cv, qo_begin + r / H, int(r % H), zeros.data(), neg_inf);
      continue;
    }
    // The partials that exist: a corrupt split_indptr must not cost a loop
    // over up to 2^32 indices per row.
    const int64_t lo = std::max<int64_t>(first, 0), hi = std::min<int64_t>(last, p.max_partials);
    for (int64_t r = 0; r < std::min(qo_len * H, rows_cap); ++r) {
      float mx = neg_inf;
      for (int64_t i = lo; i < hi; ++i)
        if (i >= 0 && i < p.max_partials) mx = std::max(mx, p.partial_lse[i * rows_cap + r]);
      std::fill(o.begin(), o.end(), 0.f);
      float wsum = 0.f;
      if (mx != neg_inf) {
        for (int64_t i = lo; i < hi; ++i) {
          if (i < 0 || i >= p.max_partials) continue;
          const float w = std::exp2(p.partial_lse[i * rows_cap + r] - mx);
          wsum += w;
          const float* src = p.partial_o + (i * rows_cap + r) * kCkvDim;
          for (int d = 0; d < kCkvDim; ++d) o[d] += w * src[d];
        }
      }
      const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
      for (float& x : o) x *= inv;
      write_row(p, cv, qo_begin + r / H, int(r % H), o.data(), wsum > 0.f ? mx + std::log2(wsum) : neg_inf);
    }
  }
}

template <class Idx>
void decode_cpu(const DecodeParams<Idx>& p, DecodeDType dtype, int64_t total_q) {
  const Conv cv = dtype == DecodeDType::BF16 ? Conv{bf16_to_float, float_to_bf16} : Conv{f16_to_float, float_to_f16};
  const ScheduleLayout layout{p.max_batch, p.max_work};
  const int32_t* hdr = p.schedule + ScheduleLayout::header();
  const int64_t num_work = std::min<int64_t>(std::max<int32_t>(hdr[kHdrNumWork], 0), p.max_work);
  const int64_t batch = std::min<int64_t>(std::max<int32_t>(hdr[kHdrBatch], 0), std::min(p.batch, p.max_batch));
  const auto* items = reinterpret_cast<const WorkItem*>(p.schedule + layout.work());
  for (int64_t w = 0; w < num_work; ++w) {
    const WorkItem item = items[w];
    if (item.request < 0 || item.request >= batch) continue;  // padding
    cpu_work_item(p, cv, total_q, item);
  }
  cpu_combine(p, cv, total_q, batch);
}

// Strides the GPU kernels move in 16-byte vectors.
void expect_vector_aligned(const CheckedTensor& a, std::initializer_list<int> dims) {
  if ((reinterpret_cast<uintptr_t>(a.data()) & 15u) != 0)
    value_error(a.name(), ": the GPU kernel reads 16-byte vectors, so the data must be 16-byte aligned (address ",
                a.data(), ")");
  for (int d : dims)
    if (a.size(d) > 1 && a.stride(d) % 8 != 0)
      value_error(a.name(), ": the GPU kernel reads 16-byte vectors, so the stride of dim ", d,
                  " must be a multiple of 8 elements, got ", a.stride(d));
}

template <class Idx>
void fill_index(DecodeParams<Idx>& p, const CheckedTensor& kv_indices, const CheckedTensor& kv_indptr, const CheckedTensor& qo_indptr,
                const CheckedTensor& kv_len, int64_t batch, int64_t page_size, int64_t num_pages) {
  p.pages.indices = kv_indices.ptr<const Idx>();
  p.pages.indices_stride = kv_indices.stride(0);
  p.pages.num_indices = kv_indices.size(0);
  p.pages.indptr = kv_indptr.ptr<const Idx>();
  p.pages.indptr_stride = kv_indptr.stride(0);
  p.pages.batch = batch;
  p.pages.page_size = page_size;
  p.pages.num_pages = num_pages;
  p.qo_indptr = qo_indptr.ptr<const Idx>();
  p.qo_indptr_stride = qo_indptr.stride(0);
  p.kv_len = kv_len.ptr<const Idx>();
  p.kv_len_stride = kv_len.stride(0);
}

template <class Idx>
void fill_common(DecodeParams<Idx>& p, const CheckedTensor& qn, const CheckedTensor& qp, const CheckedTensor& ckv, const CheckedTensor& kpe, const CheckedTensor& out,
                 const CheckedTensor* lse, const CheckedTensor& md, const CheckedTensor& ws, const mlacore_decode_dims& dims, float sm_scale,
                 bool causal, int64_t batch) {
  p.q_nope = qn.data();
  p.q_pe = qp.data();
  p.q_nope_stride_t = qn.stride(0);
  p.q_nope_stride_h = qn.stride(1);
  p.q_pe_stride_t = qp.stride(0);
  p.q_pe_stride_h = qp.stride(1);
  p.ckv = ckv.data();
  p.kpe = kpe.data();
  p.ckv_stride_page = ckv.stride(0);
  p.ckv_stride_tok = ckv.stride(1);
  p.kpe_stride_page = kpe.stride(0);
  p.kpe_stride_tok = kpe.stride(1);
  p.out = out.data();
  p.out_stride_t = out.stride(0);
  p.out_stride_h = out.stride(1);
  p.lse = lse ? lse->ptr<float>() : nullptr;
  p.lse_stride_t = lse ? lse->stride(0) : 0;
  p.lse_stride_h = lse ? lse->stride(1) : 0;
  p.batch = batch;
  p.total_q = qn.size(0);
  p.device = qn.device_id();
  p.schedule = md.ptr<const int32_t>();
  p.max_batch = dims.max_batch;
  p.max_work = dims.max_work;
  p.max_qo_len = dims.max_qo_len;
  p.max_partials = dims.max_partials;
  const int64_t H = qn.size(1);
  p.partial_o = ws.ptr<float>();
  p.partial_lse = p.partial_o + dims.max_partials * decode_partial_rows(dims.max_qo_len, H) * kCkvDim;
  p.num_heads = static_cast<int>(H);
  p.scale_log2 = sm_scale * 1.4426950408889634f;
  p.causal = causal;
}

// The facts routing looks at (backend_route.cpp decides; aiter_decode.cpp
// runs what it admits).
mlacore_route_request route_request(const CheckedTensor& qn, const CheckedTensor& ckv, const CheckedTensor& kpe, const CheckedTensor& ws,
                                    std::initializer_list<const CheckedTensor*> indices, const mlacore_decode_dims& dims,
                                    int64_t page_size, int64_t batch, bool causal) {
  mlacore_route_request r =
      describe_call(MLACORE_ROUTE_DECODE_MLA, qn.dl(), MLACORE_LAYOUT_NHD, page_size, ckv.size(2), kpe.size(2));
  r.adjacent = kv_halves_adjacent(ckv, kpe);
  r.num_heads = qn.size(1);
  r.max_qo_len = dims.max_qo_len;
  r.causal = causal;
  r.index_int32 = 1;
  for (const CheckedTensor* a : indices)
    if (a->dtype() != DType::I32 || (a->size(0) > 1 && a->stride(0) != 1)) r.index_int32 = 0;
  r.batch = batch;
  r.workspace_bytes = ws.numel() * itemsize(ws.dtype());
  r.page_stride = ckv.size(0) > 1 ? ckv.stride(0) : 0;
  return r;
}

void decode(const DLTensor* q_nope_t, const DLTensor* q_pe_t, const DLTensor* ckv_t, const DLTensor* kpe_t,
            const DLTensor* kv_indices_t, const DLTensor* kv_indptr_t, const DLTensor* qo_indptr_t,
            const DLTensor* kv_len_t, const DLTensor* schedule_t, const DLTensor* workspace_t, const DLTensor* out_t,
            const DLTensor* lse_t, mlacore_decode_dims dims, int64_t page_size, float sm_scale, uint32_t flags,
            int32_t backend, void* stream) {
  const CheckedTensor qn(q_nope_t, "q_nope"), qp(q_pe_t, "q_pe"), ckv(ckv_t, "ckv_cache"), kpe(kpe_t, "kpe_cache");
  const CheckedTensor kv_indices(kv_indices_t, "kv_indices"), kv_indptr(kv_indptr_t, "kv_indptr");
  const CheckedTensor qo_indptr(qo_indptr_t, "qo_indptr"), kv_len(kv_len_t, "kv_len");
  const CheckedTensor md(schedule_t, "schedule"), ws(workspace_t, "workspace"), out(out_t, "out");

  qn.expect_ndim(3);
  qn.expect_dtype({DType::BF16, DType::F16});
  const int64_t total_q = qn.size(0), H = qn.size(1);
  if (H < 1 || H > kMaxDecodeHeads)
    value_error("q_nope: expected 1 to ", kMaxDecodeHeads, " heads in dim 1, got ", qn.describe());
  qn.expect_size(2, kCkvDim, "head_dim_ckv");
  qn.expect_last_dim_contiguous();
  qp.expect_ndim(3);
  qp.expect_dtype({qn.dtype()});
  qp.expect_size(0, total_q, "total_q of q_nope");
  qp.expect_size(1, H, "heads of q_nope");
  qp.expect_size(2, kKpeDim, "head_dim_kpe");
  qp.expect_last_dim_contiguous();
  qp.expect_same_device(qn);

  if (page_size < 1) value_error("page_size: expected >= 1, got ", page_size);
  ckv.expect_ndim(3);
  ckv.expect_dtype({qn.dtype()});
  ckv.expect_size(1, page_size, "page_size");
  ckv.expect_size(2, kCkvDim, "head_dim_ckv");
  ckv.expect_last_dim_contiguous();
  ckv.expect_same_device(qn);
  const int64_t num_pages = ckv.size(0);
  kpe.expect_ndim(3);
  kpe.expect_dtype({qn.dtype()});
  kpe.expect_size(0, num_pages, "pages of ckv_cache");
  kpe.expect_size(1, page_size, "page_size");
  kpe.expect_size(2, kKpeDim, "head_dim_kpe");
  kpe.expect_last_dim_contiguous();
  kpe.expect_same_device(qn);

  qo_indptr.expect_index_vector();
  if (qo_indptr.size(0) < 1) value_error("qo_indptr: expected at least 1 element (batch+1), got ", qo_indptr.describe());
  const int64_t batch = qo_indptr.size(0) - 1;
  kv_indptr.expect_index_vector(batch + 1, "batch+1");
  kv_len.expect_index_vector(batch, "batch");
  kv_indices.expect_index_vector();
  for (const CheckedTensor* a : {&qo_indptr, &kv_indptr, &kv_len, &kv_indices}) {
    a->expect_same_device(qn);
    if (a->dtype() != qo_indptr.dtype())
      value_error(a->name(), ": expected the index dtype of qo_indptr (", dtype_name(qo_indptr.dtype()), "), got ",
                  a->describe());
  }

  if (dims.max_batch < 1 || dims.max_batch > kMaxScheduleCapacity)
    value_error("dims.max_batch: expected 1 <= max_batch <= ", kMaxScheduleCapacity, ", got ", dims.max_batch);
  if (dims.max_work < 1 || dims.max_work > kMaxScheduleCapacity)
    value_error("dims.max_work: expected 1 <= max_work <= ", kMaxScheduleCapacity, ", got ", dims.max_work);
  // The schedule header holds max_qo_len as int32.
  if (dims.max_qo_len < 1 || dims.max_qo_len > std::numeric_limits<int32_t>::max())
    value_error("dims.max_qo_len: expected 1 <= max_qo_len <= 2^31-1, got ", dims.max_qo_len);
  if (dims.max_partials < 0 || dims.max_partials > dims.max_work)
    value_error("dims.max_partials: expected max_partials in [0, max_work=", dims.max_work, "], got ",
                dims.max_partials);
  const int64_t ws_needed = mlacore_mla_decode_workspace_bytes(dims, H);
  if (ws_needed < 0)
    value_error("dims: the workspace for max_partials=", dims.max_partials, " x max_qo_len=", dims.max_qo_len,
                " x heads=", H, " rows overflows int64 bytes");
  const int64_t md_len = ScheduleLayout{dims.max_batch, dims.max_work}.total();
  md.expect_index_vector(md_len, "ScheduleLayout{max_batch, max_work}.total()");
  md.expect_dtype({DType::I32});
  md.expect_contiguous();
  md.expect_same_device(qn);

  ws.expect_contiguous();
  ws.expect_same_device(qn);
  const int64_t ws_bytes = ws.numel() * itemsize(ws.dtype());
  if (ws_bytes < ws_needed)
    value_error("workspace: expected at least ", ws_needed, " bytes (max_partials=", dims.max_partials,
                " x max_qo_len=", dims.max_qo_len, " x heads=", H, " rows of 512 fp32 + LSE), got ", ws_bytes,
                " bytes (", ws.describe(), ")");
  if ((reinterpret_cast<uintptr_t>(ws.data()) & 15u) != 0)
    value_error("workspace: expected a 16-byte aligned buffer, got address ", ws.data());

  out.expect_ndim(3);
  out.expect_dtype({qn.dtype()});
  out.expect_size(0, total_q, "total_q of q_nope");
  out.expect_size(1, H, "heads of q_nope");
  out.expect_size(2, kCkvDim, "head_dim_ckv");
  out.expect_last_dim_contiguous();
  out.expect_same_device(qn);
  std::optional<CheckedTensor> lse;
  if (lse_t) {
    lse.emplace(lse_t, "lse");
    lse->expect_ndim(2);
    lse->expect_dtype({DType::F32});
    lse->expect_size(0, total_q, "total_q of q_nope");
    lse->expect_size(1, H, "heads of q_nope");
    lse->expect_same_device(qn);
  }
  if (flags & ~(MLACORE_DECODE_CAUSAL | MLACORE_DECODE_PORTABLE)) value_error("flags: unknown bits ", flags);
  if (!std::isfinite(sm_scale)) value_error("sm_scale: expected a finite number, got ", sm_scale);

  const Where where = where_to_run(qn);
  const bool causal = (flags & MLACORE_DECODE_CAUSAL) != 0;
  Backend requested = parse_backend(backend);
  if (flags & MLACORE_DECODE_PORTABLE) {
    // The portable kernel is a native one: it cannot be had from AITER.
    if (requested == Backend::Aiter)
      value_error("flags: MLACORE_DECODE_PORTABLE asks for mlacore's portable kernel, which backend='aiter' "
                  "cannot run");
    requested = Backend::Native;
  }
  if (requested != Backend::Native) {
    const mlacore_route_request req = route_request(qn, ckv, kpe, ws, {&kv_indices, &kv_indptr, &qo_indptr, &kv_len},
                                                    dims, page_size, batch, causal);
    if (route(req, requested, false).backend == Backend::Aiter) {
      const AiterDecodeCall call{&qn, &qp, &ckv, &kv_indices, &kv_indptr, &qo_indptr, &kv_len, &md,
                                 ScheduleLayout{dims.max_batch, dims.max_work}.last_page_len(), &ws, &out,
                                 lse ? &*lse : nullptr, dims.max_qo_len, page_size, sm_scale};
      run_aiter_decode(call, stream);
      return;
    }
  }
  if (where == Where::GPU) {
    expect_vector_aligned(qn, {0, 1});
    expect_vector_aligned(qp, {0, 1});
    expect_vector_aligned(ckv, {0, 1});
    expect_vector_aligned(kpe, {0, 1});
    if ((reinterpret_cast<uintptr_t>(out.data()) & 7u) != 0 || (out.size(0) > 1 && out.stride(0) % 4) ||
        (out.size(1) > 1 && out.stride(1) % 4))
      value_error("out: the GPU kernels write 8-byte groups, so data must be 8-byte aligned and strides multiples "
                  "of 4 elements, got ", out.describe());
  }
  const DecodeDType dtype = qn.dtype() == DType::BF16 ? DecodeDType::BF16 : DecodeDType::F16;

  auto run = [&](auto tag) {
    using Idx = decltype(tag);
    DecodeParams<Idx> p{};
    fill_common(p, qn, qp, ckv, kpe, out, lse ? &*lse : nullptr, md, ws, dims, sm_scale, causal, batch);
    fill_index(p, kv_indices, kv_indptr, qo_indptr, kv_len, batch, page_size, num_pages);
    if (where == Where::CPU) {
      decode_cpu(p, dtype, total_q);
      return;
    }
#if defined(MLACORE_WITH_GPU)
    launch_mla_decode(p, dtype, (flags & MLACORE_DECODE_PORTABLE) != 0, stream);
#else
    (void)stream;
#endif
  };
  if (qo_indptr.dtype() == DType::I32) run(int32_t{});
  else run(int64_t{});
}

}  // namespace
}  // namespace mlacore

extern "C" {

MLACORE_API int64_t mlacore_mla_decode_workspace_bytes(mlacore_decode_dims dims, int64_t num_heads) {
  if (dims.max_partials < 0 || dims.max_qo_len < 0 || num_heads < 0) return -1;
  // fp32 partial outputs then their LSEs; the LSE block starts 16-byte aligned
  // because the output block is a multiple of 512 floats. -1 when it leaves int64.
  int64_t bytes;
  if (!mlacore::mul_fits(dims.max_qo_len, num_heads, &bytes) || !mlacore::mul_fits(bytes, dims.max_partials, &bytes) ||
      !mlacore::mul_fits(bytes, (mlacore::kCkvDim + 1) * static_cast<int64_t>(sizeof(float)), &bytes))
    return -1;
  return bytes;
}

MLACORE_API int64_t mlacore_mla_decode_workspace_rows(int64_t workspace_bytes) {
  if (workspace_bytes < 0) return -1;
  return workspace_bytes / ((mlacore::kCkvDim + 1) * static_cast<int64_t>(sizeof(float)));
}

MLACORE_API int64_t mlacore_mla_decode_workspace_partials(int64_t workspace_bytes, int64_t max_qo_len,
                                                          int64_t num_heads) {
  if (workspace_bytes < 0 || max_qo_len < 0 || num_heads < 0) return -1;
  const int64_t rows = mlacore::decode_partial_rows(max_qo_len > 0 ? max_qo_len : 1, num_heads > 0 ? num_heads : 1);
  return mlacore_mla_decode_workspace_rows(workspace_bytes) / rows;
}

MLACORE_API mlacore_status mlacore_mla_decode(
    const DLTensor* q_nope, const DLTensor* q_pe, const DLTensor* ckv, const DLTensor* kpe,
    const DLTensor* kv_indices, const DLTensor* kv_indptr, const DLTensor* qo_indptr, const DLTensor* kv_len,
    const DLTensor* schedule, const DLTensor* workspace, const DLTensor* out, const DLTensor* lse,
    mlacore_decode_dims dims, int64_t page_size, float sm_scale, uint32_t flags, void* stream) {
  return mlacore::guarded([&] {
    mlacore::decode(q_nope, q_pe, ckv, kpe, kv_indices, kv_indptr, qo_indptr, kv_len, schedule, workspace, out, lse,
                    dims, page_size, sm_scale, flags, MLACORE_BACKEND_AUTO, stream);
  });
}

MLACORE_API mlacore_status mlacore_mla_decode_backend(
    const DLTensor* q_nope, const DLTensor* q_pe, const DLTensor* ckv, const DLTensor* kpe,
    const DLTensor* kv_indices, const DLTensor* kv_indptr, const DLTensor* qo_indptr, const DLTensor* kv_len,
    const DLTensor* schedule, const DLTensor* workspace, const DLTensor* out, const DLTensor* lse,
    mlacore_decode_dims dims, int64_t page_size, float sm_scale, uint32_t flags, int32_t backend, void* stream) {
  return mlacore::guarded([&] {
    mlacore::decode(q_nope, q_pe, ckv, kpe, kv_indices, kv_indptr, qo_indptr, kv_len, schedule, workspace, out, lse,
                    dims, page_size, sm_scale, flags, backend, stream);
  });
}

}  // extern "C"
