// The portable MLA decode kernel (HIP, and CUDA on request or where the
// tiled kernels do not fit): one block per (work item, query row), plain
// loads and shared-memory reductions only (no warp shuffles: HIP wavefronts
// are 64 wide), fp32 throughout. Correct for every shape; not fast.
// Same contract and outputs as the tiled kernels: a direct or fp32 partial
// epilogue for the combine, work items re-checked by read_item, masked tokens
// never read. Design: docs/design/2026-11-30-decode-mma-portable-combine.md.
#include "gpu/compat.h"

#include <cstdint>

#include "decode/decode_numeric.h"
#include "plan/schedule.h"
#include "decode/mla_decode.h"
#include "decode/mla_decode_device.cuh"
#include "decode/mla_decode_kernels.h"

namespace mlacore {
namespace {

constexpr int kThreads = 256;

template <bool kBf16>
__device__ __forceinline__ float load_h(const uint16_t* p) {
  return kBf16 ? bf16_to_float(*p) : f16_to_float(*p);
}

constexpr int kTok = kDecodeTileTokens;
constexpr int kParts = kThreads / kTok;     // threads per token in the dot products
constexpr int kCols = kCkvDim / kThreads;   // output columns a thread
constexpr int64_t kMaskedRow = INT64_MIN;  // offsets can be negative (negative strides): no offset takes this

// Q row (q_nope | q_pe) of query token t, head h -> s_q as fp32.
template <bool kBf16, class Idx>
__device__ __forceinline__ void load_q(const DecodeParams<Idx>& p, const ItemView& item, int64_t t, int64_t h,
                                       float* s_q, int tid) {
  const auto* qn = static_cast<const uint16_t*>(p.q_nope);
  const auto* qp = static_cast<const uint16_t*>(p.q_pe);
  for (int d = tid; d < kQkDim; d += kThreads)
    s_q[d] = d < kCkvDim ? load_h<kBf16>(qn + (item.qo_begin + t) * p.q_nope_stride_t + h * p.q_nope_stride_h + d)
                         : load_h<kBf16>(qp + (item.qo_begin + t) * p.q_pe_stride_t + h * p.q_pe_stride_h + d - kCkvDim);
}

// Element offsets of the ckv and kpe rows of tokens [start, start + kTok)
// through the page table; kMaskedRow for tokens past `limit` or on a page id
// outside the pool.
template <class Idx>
__device__ __forceinline__ void locate_kv(const DecodeParams<Idx>& p, const ItemView& item, int64_t start,
                                          int64_t limit, int64_t* s_coff, int64_t* s_koff, int tid) {
  const int64_t page_begin = item.page_begin, page_end = item.page_end;
  if (tid < kTok) {
    const int64_t pos = start + tid;
    int64_t page = -1;
    if (pos < limit) {
      const int64_t in_req = pos / p.pages.page_size;
      if (in_req < page_end - page_begin) page = p.pages.page_at(page_begin + in_req);
    }
    const int64_t off = pos % p.pages.page_size;
    s_coff[tid] = page < 0 ? kMaskedRow : page * p.ckv_stride_page + off * p.ckv_stride_tok;
    s_koff[tid] = page < 0 ? kMaskedRow : page * p.kpe_stride_page + off * p.kpe_stride_tok;
  }
}

// The parts summed into each token's score in base 2 -> s_p (-inf if masked).
__device__ __forceinline__ void sum_scores(const float (*s_part)[kTok], const int64_t* s_coff, float scale_log2,
                                           float* s_p, int tid) {
  if (tid < kTok) {
    float sc = 0.f;
    for (int i = 0; i < kParts; ++i) sc += s_part[i][tid];
    s_p[tid] = s_coff[tid] != kMaskedRow ? sc * scale_log2 : -INFINITY;
  }
}

// Online softmax: the running maximum over this chunk's scores, the running
// sum and accumulator rescaled to it; returns the exponent reference for P.
__device__ __forceinline__ float softmax(const float* s_p, float& m_run, float& l_run, float (&acc)[kCols]) {
  float m_new = m_run;
  for (int i = 0; i < kTok; ++i) m_new = fmaxf(m_new, s_p[i]);
  const float m_use = m_new == -INFINITY ? 0.f : m_new;
  const float alpha = exp2f(m_run - m_use);
  m_run = m_new;
  l_run *= alpha;
  for (int k = 0; k < kCols; ++k) acc[k] *= alpha;
  return m_use;
}

// acc += P V over the chunk's unmasked tokens (V: the ckv rows), l_run += P.
template <bool kBf16>
__device__ __forceinline__ void compute_pv(const uint16_t* ckv, const int64_t* s_coff, const float* s_p, float m_use,
                                           float& l_run, float (&acc)[kCols], int tid) {
  for (int i = 0; i < kTok; ++i) {
    if (s_coff[i] == kMaskedRow) continue;
    const float w = exp2f(s_p[i] - m_use);
    l_run += w;
    for (int k = 0; k < kCols; ++k) acc[k] += w * load_h<kBf16>(ckv + s_coff[i] + tid + k * kThreads);
  }
}

// The normalized row and its LSE: to the partial of a split request, else to
// out (and lse).
template <bool kBf16, class Idx>
__device__ __forceinline__ void write_o(const DecodeParams<Idx>& p, const ItemView& item, int64_t row, int64_t t,
                                        int64_t h, int64_t rows_cap, float m_run, float l_run,
                                        const float (&acc)[kCols], int tid) {
  const float inv = l_run > 0.f ? 1.f / l_run : 0.f;
  const float lse = l_run > 0.f ? m_run + log2f(l_run) : -INFINITY;
  if (item.partial >= 0) {
    float* dst = p.partial_o + (item.partial * rows_cap + row) * kCkvDim;
    for (int k = 0; k < kCols; ++k) dst[tid + k * kThreads] = acc[k] * inv;
    if (tid == 0) p.partial_lse[item.partial * rows_cap + row] = lse;
  } else {
    uint16_t* dst = static_cast<uint16_t*>(p.out) + (item.qo_begin + t) * p.out_stride_t + h * p.out_stride_h;
    for (int k = 0; k < kCols; ++k)
      dst[tid + k * kThreads] = kBf16 ? float_to_bf16(acc[k] * inv) : float_to_f16(acc[k] * inv);
    if (p.lse && tid == 0) p.lse[(item.qo_begin + t) * p.lse_stride_t + h * p.lse_stride_h] = lse;
  }
}

template <bool kBf16, class Idx>
__global__ void __launch_bounds__(kThreads) mla_decode_portable_kernel(const DecodeParams<Idx> p) {
  __shared__ float s_q[kQkDim];
  __shared__ float s_part[kParts][kTok];
  __shared__ float s_p[kTok];
  __shared__ int64_t s_coff[kTok], s_koff[kTok];

  const ItemView item = read_item(p, blockIdx.x);
  if (!item.ok) return;
  const int H = p.num_heads;
  const int64_t rows = item.qo_len * H;
  const int64_t row = blockIdx.y;
  if (row >= rows) return;
  const int64_t rows_cap = decode_partial_rows(p.max_qo_len, H);
  if (item.partial >= 0 && row >= rows_cap) return;
  const int64_t t = row / H, h = row % H;
  const int tid = threadIdx.x;
  const auto* ckv = static_cast<const uint16_t*>(p.ckv);
  const auto* kpe = static_cast<const uint16_t*>(p.kpe);

  load_q<kBf16>(p, item, t, h, s_q, tid);
  int64_t limit = p.causal ? item.kv_len - item.qo_len + t + 1 : item.kv_len;
  limit = limit < item.end ? limit : item.end;

  float acc[kCols] = {};
  float m_run = -INFINITY, l_run = 0.f;
  for (int64_t start = item.begin; start < item.end; start += kTok) {
    __syncthreads();  // the previous chunk's readers of s_coff / s_p are done
    locate_kv(p, item, start, limit, s_coff, s_koff, tid);
    __syncthreads();
    {
      // Q K^T: part `part` of the dot product of s_q with the K row (ckv |
      // kpe) of token `tok` -> s_part. Kept in the kernel body: as a function
      // the compiler schedules the loads differently.
      const int tok = tid % kTok, part = tid / kTok;
      constexpr int kSpan = kQkDim / kParts;
      float dot = 0.f;
      if (s_coff[tok] != kMaskedRow) {
        for (int d = part * kSpan; d < (part + 1) * kSpan; ++d)
          dot += s_q[d] * (d < kCkvDim ? load_h<kBf16>(ckv + s_coff[tok] + d) : load_h<kBf16>(kpe + s_koff[tok] + d - kCkvDim));
      }
      s_part[part][tok] = dot;
    }
    __syncthreads();
    sum_scores(s_part, s_coff, p.scale_log2, s_p, tid);
    __syncthreads();
    const float m_use = softmax(s_p, m_run, l_run, acc);
    compute_pv<kBf16>(ckv, s_coff, s_p, m_use, l_run, acc, tid);
  }
  write_o<kBf16>(p, item, row, t, h, rows_cap, m_run, l_run, acc, tid);
}

}  // namespace

template <class Idx>
void launch_mla_decode_portable(const DecodeParams<Idx>& p, bool bf16, gpuStream_t stream) {
  const int64_t rows_cap = decode_partial_rows(p.max_qo_len, p.num_heads);
  if (rows_cap > 65535) runtime_error("mla_decode: ", rows_cap, " query rows exceed the portable kernel's grid");
  const dim3 grid(static_cast<unsigned>(p.max_work), static_cast<unsigned>(rows_cap));
  if (bf16) mla_decode_portable_kernel<true, Idx><<<grid, kThreads, 0, stream>>>(p);
  else mla_decode_portable_kernel<false, Idx><<<grid, kThreads, 0, stream>>>(p);
  gpu::check_launch("mla_decode_portable_kernel");
}

template void launch_mla_decode_portable<int32_t>(const DecodeParams<int32_t>&, bool, gpuStream_t);
template void launch_mla_decode_portable<int64_t>(const DecodeParams<int64_t>&, bool, gpuStream_t);

}  // namespace mlacore
