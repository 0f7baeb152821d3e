// The AITER decode route, host side: the workspace layout, the split count,
// the tensors handed to mla_decode_stage1_asm_fwd and why each is what it
// is, and the CPU loops the contract test runs (the HIP kernels for the same
// steps are in aiter_decode.cu). See aiter_decode.h for the query layout.
#include "backends/aiter/aiter_decode.h"

#include <algorithm>
#include <limits>
#include <string>

#include "backends/aiter/aiter_loader.h"
#include "common/dispatch.h"
#include "common/error.h"
#include "common/tensor.h"

namespace mlacore {
namespace {

// AITER's non-persistent split heuristic (REFERENCES.md, aiter/mla.py
// get_meta_param): the i in 1..16 maximizing CU occupancy of bs*i work
// groups times avg_kv / (avg_kv + 84.1 i). total_kv is kv_indices' length,
// as AITER counts it. Strict `>` keeps the smallest i on ties, like AITER's
// stable sort.
int64_t split_heuristic(int64_t batch, int64_t total_kv, int64_t cu) {
  const double avg_kv = static_cast<double>(total_kv) / static_cast<double>(batch);
  double best = -1.0;
  int64_t pick = 1;
  for (int64_t i = 1; i <= kAiterMaxSplits; ++i) {
    const int64_t groups = batch * i;
    const double occupancy = static_cast<double>(groups) / static_cast<double>((groups + cu - 1) / cu * cu);
    const double score = occupancy * avg_kv / (avg_kv + 84.1 * static_cast<double>(i));
    if (score > best) {
      best = score;
      pick = i;
    }
  }
  return pick;
}

// MI300X's CU count: what the contract test (CPU tensors) plans for, so it
// sees the split counts an MI300X would.
constexpr int64_t kContractComputeUnits = 304;

aiter_tensor_t tensor_of(const CheckedTensor& a) {
  aiter_tensor_t t;
  std::string why;
  if (!to_aiter_tensor(a.dl(), &t, &why)) runtime_error(a.name(), ": cannot be handed to AITER: ", why);
  return t;
}

}  // namespace

AiterDecodeLayout aiter_decode_layout(int64_t batch, int64_t max_qo_len, int64_t heads, int64_t splits) {
  AiterDecodeLayout l;
  l.rows = batch * max_qo_len;
  l.splits = splits;
  // Sizes stay far below 2^63 for any shape the gates admit (batch and
  // max_qo_len come from index tensors' lengths); a guard for nonsense
  // inputs keeps the arithmetic defined.
  if (batch < 0 || max_qo_len < 1 || heads < 1 || splits < 1 || batch > (int64_t{1} << 31) ||
      max_qo_len > (int64_t{1} << 16) || heads > 4096 || splits > kAiterMaxSplits) {
    l.total = -1;
    return l;
  }
  // Every section starts 256-byte aligned: AITER's kernels load 16-byte
  // vectors, and the workspace itself is 16-byte aligned.
  auto align = [](int64_t x) { return (x + 255) / 256 * 256; };
  int64_t at = 0;
  l.q = at;
  at = align(at + l.rows * heads * kAiterQkDim * 2);
  l.split_o = at;
  at = align(at + l.rows * splits * heads * kAiterVDim * 4);
  l.split_lse = at;
  at = align(at + l.rows * splits * heads * 4);
  l.qo_indptr = at;
  at = align(at + (batch + 1) * 4);
  l.splits_indptr = at;
  l.total = at + (batch + 1) * 4;
  return l;
}

void run_aiter_decode(const AiterDecodeCall& c, void* stream) {
  const AiterLibrary& lib = aiter_library();
  if (!lib.loaded || lib.mla_decode_stage1 == nullptr)
    runtime_error("mla_decode: routed to AITER, but its library is not loaded");  // route() prevents this
  const CheckedTensor& qn = *c.q_nope;
  const int64_t batch = c.qo_indptr->size(0) - 1;
  const int64_t total_q = qn.size(0), heads = qn.size(1), M = c.max_qo_len;
  if (batch < 1 || total_q == 0) return;  // nothing to attend; the native path writes nothing either
  const Where where = where_to_run(qn);
  const int device = qn.device_id();

  // Splits: AITER's heuristic, at least kAiterMinSplits, and no more than the
  // workspace holds (the gate guaranteed the minimum fits).
  int64_t cu = kContractComputeUnits;
#if defined(MLACORE_WITH_HIP)
  if (where == Where::GPU) cu = aiter_device_compute_units(device);
#endif
  const int64_t ws_bytes = c.workspace->numel() * itemsize(c.workspace->dtype());
  int64_t splits = std::clamp(split_heuristic(batch, c.kv_indices->size(0), cu), kAiterMinSplits, kAiterMaxSplits);
  AiterDecodeLayout layout = aiter_decode_layout(batch, M, heads, splits);
  while (splits > kAiterMinSplits && (layout.total < 0 || layout.total > ws_bytes))
    layout = aiter_decode_layout(batch, M, heads, --splits);
  if (layout.total < 0 || layout.total > ws_bytes)
    value_error("workspace: the AITER route needs ", layout.total, " bytes, got ", ws_bytes);  // route() prevents this
  char* ws = c.workspace->ptr<char>();

  AiterDecodePrepare prep;
  prep.q_nope = qn.ptr<const uint16_t>();
  prep.q_nope_stride_t = qn.stride(0);
  prep.q_nope_stride_h = qn.stride(1);
  prep.q_pe = c.q_pe->ptr<const uint16_t>();
  prep.q_pe_stride_t = c.q_pe->stride(0);
  prep.q_pe_stride_h = c.q_pe->stride(1);
  prep.qo_indptr = c.qo_indptr->ptr<const int32_t>();
  prep.batch = batch;
  prep.total_q = total_q;
  prep.heads = heads;
  prep.max_qo_len = M;
  prep.splits = splits;
  prep.q = reinterpret_cast<uint16_t*>(ws + layout.q);
  prep.uniform_qo_indptr = reinterpret_cast<int32_t*>(ws + layout.qo_indptr);
  prep.splits_indptr = reinterpret_cast<int32_t*>(ws + layout.splits_indptr);

  AiterDecodeCombine comb;
  comb.split_o = reinterpret_cast<const float*>(ws + layout.split_o);
  comb.split_lse = reinterpret_cast<const float*>(ws + layout.split_lse);
  comb.qo_indptr = prep.qo_indptr;
  comb.kv_len = c.kv_len->ptr<const int32_t>();
  comb.batch = batch;
  comb.total_q = total_q;
  comb.heads = heads;
  comb.max_qo_len = M;
  comb.splits = splits;
  comb.granularity = aiter_split_granularity(heads, M);
  comb.out = c.out->ptr<uint16_t>();
  comb.out_stride_t = c.out->stride(0);
  comb.out_stride_h = c.out->stride(1);
  comb.lse = c.lse ? c.lse->ptr<float>() : nullptr;
  comb.lse_stride_t = c.lse ? c.lse->stride(0) : 0;
  comb.lse_stride_h = c.lse ? c.lse->stride(1) : 0;

  // 1. Query rows and the two indptrs, in the workspace (stream-ordered).
  if (where == Where::CPU) {
    for (int64_t i = 0; i < prep.elements(); ++i) prep.run(i);
  } else {
#if defined(MLACORE_WITH_HIP)
    launch_aiter_decode_prepare(prep, device, stream);
#endif
  }

  // 2. AITER's stage 1, non-persistent. What each argument is, and why:
  //  - Q [rows, H, 576] bf16, contiguous (asm_mla.cu requires it): the workspace rows.
  //  - KV [P, page_size, 1, 576]: the combined view of ckv|kpe, zero-copy; the
  //    kernel reads only stride(0) and log2(page_size), the token stride
  //    576 is implied (the adjacency gate guaranteed it).
  //  - qo_indptr: the uniform b * M indptr (the kernel's q addressing is uniform).
  //  - kv_indptr, kv_page_indices: the caller's int32 tables, unchanged.
  //  - kv_last_page_lens [batch]: the plan's (kv_len - (pages - 1) * page_size).
  //  - num_kv_splits_indptr [batch + 1] = b * splits: non-null selects the
  //    non-persistent kernel (persistent mode without work_meta_data would
  //    hipMalloc and hipMemcpy on every call), so work_meta_data,
  //    work_indptr and work_info_set are null: that path never reads them.
  //  - splitData [rows, splits, H, 512], splitLse [rows, splits, H, 1]: fp32
  //    partials in the workspace; kv_split is splitData's dim 1.
  //  - output: the caller's out. The non-persistent path does not write it
  //    (ptr_RP = nullptr); the merge below does.
  //  - lse: null. The final LSE is the merge's; a non-null one would select
  //    a kernel variant that writes a final LSE this path never produces.
  //  - q_scale, kv_scale: null; read only for fp8 queries or caches.
  //  - max_seqlen_q = M; page_size explicit (AITER >= 0.1.12 defaults it to
  //    1, never inferred from a shape); nhead_kv = 1 (MLA's one latent head).
  const AiterDtype bf16 = AITER_DTYPE_bf16;
  aiter_tensor_t q = aiter_view(prep.q, bf16, device, {layout.rows, heads, kAiterQkDim});
  const CheckedTensor& ckv = *c.ckv;
  const int64_t token_stride = c.page_size > 1 ? ckv.stride(1) : kAiterQkDim;
  aiter_tensor_t kv = aiter_view(ckv.data(), bf16, device, {ckv.size(0), c.page_size, 1, kAiterQkDim},
                                {ckv.stride(0), token_stride, kAiterQkDim, 1});
  aiter_tensor_t qo_indptr = aiter_view(prep.uniform_qo_indptr, AITER_DTYPE_i32, device, {batch + 1});
  aiter_tensor_t kv_indptr = tensor_of(*c.kv_indptr);
  aiter_tensor_t kv_indices = tensor_of(*c.kv_indices);
  aiter_tensor_t last_page =
      aiter_view(c.schedule->ptr<int32_t>() + c.last_page_len_offset, AITER_DTYPE_i32, device, {batch});
  aiter_tensor_t splits_indptr = aiter_view(prep.splits_indptr, AITER_DTYPE_i32, device, {batch + 1});
  aiter_tensor_t split_o =
      aiter_view(ws + layout.split_o, AITER_DTYPE_fp32, device, {layout.rows, splits, heads, kAiterVDim});
  aiter_tensor_t split_lse = aiter_view(ws + layout.split_lse, AITER_DTYPE_fp32, device, {layout.rows, splits, heads, 1});
  aiter_tensor_t out = tensor_of(*c.out);
  lib.mla_decode_stage1(&q, &kv, &qo_indptr, &kv_indptr, &kv_indices, &last_page, &splits_indptr, nullptr, nullptr,
                        nullptr, static_cast<int>(M), static_cast<int>(c.page_size), /*nhead_kv=*/1, c.sm_scale,
                        &split_o, &split_lse, &out, /*lse=*/nullptr, nullptr, nullptr,
                        static_cast<aiter_stream_t>(stream));

  // 3. The merge, into the caller's out and lse.
  if (where == Where::CPU) {
    float w[kAiterMaxSplits];
    for (int64_t r = 0; r < layout.rows; ++r) {
      const int64_t token = comb.token_of(r);
      if (token < 0) continue;
      for (int64_t h = 0; h < heads; ++h) {
        float lse2;
        const int64_t valid = comb.weights(r, h, w, &lse2);
        comb.write(r, h, token, w, valid, 0, kAiterVDim);
        if (comb.lse) comb.lse[token * comb.lse_stride_t + h * comb.lse_stride_h] = lse2;
      }
    }
  } else {
#if defined(MLACORE_WITH_HIP)
    launch_aiter_decode_combine(comb, device, stream);
#endif
  }
}

}  // namespace mlacore
