// The AITER decode route: what aiter_decode.cpp (host side, CPU loops) and
// aiter_decode.cu (the HIP kernels) share. The route runs AITER's
// non-persistent stage-1 kernel (mla_decode_stage1_asm_fwd), which leaves
// fp32 partial outputs per KV split, and merges them itself: AITER's own
// merge (stage 2 in aiter/mla.py) is a Triton kernel, not a C entry point.
//
// Per call, nothing is allocated: the query buffer, the split partials and
// two small indptrs are carved from the caller's float workspace, and
// kv_last_page_lens is the plan's (a section of its schedule).
//
// Query rows are laid out uniformly, max_qo_len (M) rows per request, the
// request's tokens right-aligned in its block: AITER's non-persistent kernel
// addresses request b's queries at b * M rows (asm_mla.cu: s_Q_Bs =
// Q.stride(0) * itemsize * max_seqlen_q) and masks causally as if every
// request had M tokens, so a request with q < M tokens placed in the last q
// rows of its block sees exactly the KV a causal decode gives it. The
// leading M - q rows are zeros whose results nobody reads.
#pragma once

#include <cmath>
#include <cstdint>

#include "decode/decode_numeric.h"
#include "common/page_table.h"  // MLACORE_HD

namespace mlacore {

constexpr int kAiterQkDim = 576;
constexpr int kAiterVDim = 512;
constexpr int kAiterRopeDim = 64;

// The fewest and most KV splits the route asks for. At least 2: with one
// split several of AITER's kernels write the final output, in the query
// dtype, into splitData instead of fp32 partials (aiter/mla.py returns
// `logits` as the output when num_kv_splits == 1 for those shapes), and the
// merge could not tell which. At most 16: the range of AITER's own heuristic.
constexpr int64_t kAiterMinSplits = 2;
constexpr int64_t kAiterMaxSplits = 16;

// Byte offsets of the sections the route carves from the float workspace.
struct AiterDecodeLayout {
  int64_t rows = 0;           // batch * max_qo_len query rows
  int64_t splits = 0;         // KV splits per request
  int64_t q = 0;              // bf16 [rows, H, 576], contiguous
  int64_t split_o = 0;        // fp32 [rows, splits, H, 512]
  int64_t split_lse = 0;      // fp32 [rows, splits, H, 1] (natural log)
  int64_t qo_indptr = 0;      // int32 [batch + 1]: b * max_qo_len
  int64_t splits_indptr = 0;  // int32 [batch + 1]: b * splits (num_kv_splits_indptr)
  int64_t total = 0;          // bytes used; -1 when the sizes overflow
};

AiterDecodeLayout aiter_decode_layout(int64_t batch, int64_t max_qo_len, int64_t heads, int64_t splits);

// The KV granularity AITER's stage 2 assumes for the pinned ABI v1 kernels:
// request b has min(splits, ceil(kv_len / g)) splits with data, g = 64 for
// 16 heads and one query token, else 16 (aiter/mla.py, `mgc`, bf16 kernels).
MLACORE_HD int64_t aiter_split_granularity(int64_t heads, int64_t max_qo_len) {
  return heads == 16 && max_qo_len == 1 ? 64 : 16;
}

// A request's query tokens [begin, begin + len), or len 0 when its indptr
// entries do not delimit a range of the rows the caller passed (as the
// native kernels do, such a request is skipped).
MLACORE_HD void aiter_request_qo(const int32_t* qo_indptr, int64_t b, int64_t total_q, int64_t max_qo_len,
                                 int64_t& begin, int64_t& len) {
  begin = qo_indptr[b];
  const int64_t end = qo_indptr[b + 1];
  len = begin >= 0 && begin <= end && end <= total_q && end - begin <= max_qo_len ? end - begin : 0;
}

// Fills the workspace's query rows and indptrs from q_nope / q_pe.
struct AiterDecodePrepare {
  const uint16_t* q_nope = nullptr;  // [total_q, H, 512], last dim contiguous
  int64_t q_nope_stride_t = 0, q_nope_stride_h = 0;
  const uint16_t* q_pe = nullptr;    // [total_q, H, 64]
  int64_t q_pe_stride_t = 0, q_pe_stride_h = 0;
  const int32_t* qo_indptr = nullptr;  // the caller's, [batch + 1], unit stride
  int64_t batch = 0, total_q = 0, heads = 0, max_qo_len = 1, splits = kAiterMinSplits;
  uint16_t* q = nullptr;                 // workspace: [batch * M, H, 576]
  int32_t* uniform_qo_indptr = nullptr;  // workspace: [batch + 1]
  int32_t* splits_indptr = nullptr;      // workspace: [batch + 1]

  MLACORE_HD int64_t elements() const { return batch * max_qo_len * heads * kAiterQkDim; }

  // Element i of the query buffer (row-major over [rows, H, 576]); element
  // i <= batch of each indptr rides along.
  MLACORE_HD void run(int64_t i) const {
    if (i <= batch) {
      uniform_qo_indptr[i] = static_cast<int32_t>(i * max_qo_len);
      splits_indptr[i] = static_cast<int32_t>(i * splits);
    }
    const int64_t d = i % kAiterQkDim;
    const int64_t h = (i / kAiterQkDim) % heads;
    const int64_t row = i / (kAiterQkDim * heads);
    const int64_t b = row / max_qo_len, t = row % max_qo_len;
    int64_t begin, len;
    aiter_request_qo(qo_indptr, b, total_q, max_qo_len, begin, len);
    const int64_t pad = max_qo_len - len;
    uint16_t v = 0;
    if (t >= pad) {
      const int64_t token = begin + t - pad;
      v = d < kAiterVDim ? q_nope[token * q_nope_stride_t + h * q_nope_stride_h + d]
                         : q_pe[token * q_pe_stride_t + h * q_pe_stride_h + (d - kAiterVDim)];
    }
    q[i] = v;
  }
};

// Merges the split partials of one (row, head) into `out` and `lse`, in the
// caller's layout: the step AITER's stage 2 does, with mlacore's conventions
// (a request without KV gives zeros and -inf; the LSE is base 2).
struct AiterDecodeCombine {
  const float* split_o = nullptr;    // [rows, splits, H, 512]
  const float* split_lse = nullptr;  // [rows, splits, H], natural log
  const int32_t* qo_indptr = nullptr;  // the caller's
  const int32_t* kv_len = nullptr;     // the caller's, [batch], unit stride
  int64_t batch = 0, total_q = 0, heads = 0, max_qo_len = 1, splits = kAiterMinSplits, granularity = 16;
  uint16_t* out = nullptr;  // bf16 [total_q, H, 512], last dim contiguous
  int64_t out_stride_t = 0, out_stride_h = 0;
  float* lse = nullptr;  // [total_q, H] or null
  int64_t lse_stride_t = 0, lse_stride_h = 0;

  // The caller's query token that workspace row r holds, or -1 for a
  // padding row (or a request that was skipped).
  MLACORE_HD int64_t token_of(int64_t r) const {
    const int64_t b = r / max_qo_len, t = r % max_qo_len;
    int64_t begin, len;
    aiter_request_qo(qo_indptr, b, total_q, max_qo_len, begin, len);
    const int64_t pad = max_qo_len - len;
    return t >= pad ? begin + t - pad : -1;
  }

  // Weights of the splits of (r, h) that hold data: w[s] = exp(lse_s - max),
  // normalized. Returns how many (0 for a request without KV); *lse2 gets the
  // merged LSE in base 2. Splits whose LSE is -inf (every key masked) weigh 0.
  MLACORE_HD int64_t weights(int64_t r, int64_t h, float* w, float* lse2) const {
    const int64_t b = r / max_qo_len;
    const int64_t len = kv_len[b] > 0 ? static_cast<int64_t>(kv_len[b]) : 0;
    int64_t valid = (len + granularity - 1) / granularity;
    if (valid > splits) valid = splits;
    const float neg_inf = -__builtin_huge_valf();
    float mx = neg_inf;
    for (int64_t s = 0; s < valid; ++s) {
      const float l = split_lse[(r * splits + s) * heads + h];
      mx = l > mx ? l : mx;
    }
    float sum = 0.f;
    for (int64_t s = 0; s < valid; ++s) {
      const float l = split_lse[(r * splits + s) * heads + h];
      w[s] = mx == neg_inf || l == neg_inf ? 0.f : expf(l - mx);
      sum += w[s];
    }
    if (!(sum > 0.f)) {
      *lse2 = neg_inf;
      return 0;
    }
    for (int64_t s = 0; s < valid; ++s) w[s] /= sum;
    // AITER's LSE is natural (stage 2: e_max + log(e_sum)); mlacore's, like
    // FlashInfer's, is base 2.
    *lse2 = (mx + logf(sum)) * 1.4426950408889634f;
    return valid;
  }

  // Output elements [d0, d0 + n) of (r, h) for the caller's token `token`.
  MLACORE_HD void write(int64_t r, int64_t h, int64_t token, const float* w, int64_t valid, int64_t d0,
                        int64_t n) const {
    uint16_t* dst = out + token * out_stride_t + h * out_stride_h;
    for (int64_t d = d0; d < d0 + n; ++d) {
      float acc = 0.f;
      for (int64_t s = 0; s < valid; ++s) acc += w[s] * split_o[((r * splits + s) * heads + h) * kAiterVDim + d];
      dst[d] = float_to_bf16(acc);
    }
  }
};

class CheckedTensor;

// One decode call, validated by mla_decode.cpp and admitted by the route's
// gates (backend_route.cpp): bf16, int32 unit-stride indices, adjacent
// halves, a workspace of at least aiter_decode_layout(.., kAiterMinSplits).
struct AiterDecodeCall {
  const CheckedTensor* q_nope;
  const CheckedTensor* q_pe;
  const CheckedTensor* ckv;  // first half of the combined [P, S, 576] cache
  const CheckedTensor* kv_indices;
  const CheckedTensor* kv_indptr;
  const CheckedTensor* qo_indptr;
  const CheckedTensor* kv_len;
  const CheckedTensor* schedule;  // the plan's schedule: kv_last_page_len lives in it
  int64_t last_page_len_offset;  // int32 elements into schedule
  const CheckedTensor* workspace;
  const CheckedTensor* out;
  const CheckedTensor* lse;  // or null
  int64_t max_qo_len;
  int64_t page_size;
  float sm_scale;
};

// Runs the call through AITER: prepare (query rows, indptrs), AITER's
// stage-1 kernel, merge. CPU tensors only under the contract-test hook.
void run_aiter_decode(const AiterDecodeCall& call, void* stream);

#if defined(MLACORE_WITH_HIP)
// aiter_decode.cu: the two steps around AITER's kernel, on `stream`, and the
// device's compute-unit count (cached), which AITER's split heuristic reads.
void launch_aiter_decode_prepare(const AiterDecodePrepare& p, int device, void* stream);
void launch_aiter_decode_combine(const AiterDecodeCombine& c, int device, void* stream);
int aiter_device_compute_units(int device);
#endif

}  // namespace mlacore
