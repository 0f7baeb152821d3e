// The paged append's shared device steps, included by each kernel file
// (append_classic.cu, append_rows.cu, append_sm90.cu) and the launcher
// (append_launch.cu): the kernels' view of a call (KParams: one or two
// streams of token rows, the batch and position indices), the fast 32-bit
// division the flat copies use, the address of access `v` of a token row,
// and locate(), the page-table lookup with PageTable::slot's checks in its
// order. Contract: every index read is bounds-checked; a token whose request,
// position or page is out of range gets page -1 (skipped, never written).
#pragma once

#include <cstdint>

#include "gpu/compat.h"
#include "append/append_job.h"

namespace mlacore::append {

// n / d for n < 2^31 with one multiply-high (Granlund-Montgomery, round-up
// variant): the flat copy divides every access index by the row length, and
// GPUs have no integer divide (a 32-bit division is a dozen instructions).
struct FastDiv {
  uint32_t d = 1, mul = 1, shift = 0;
};

inline FastDiv fast_div(uint32_t d) {
  FastDiv f;
  f.d = d;
  while ((uint64_t{1} << f.shift) < d) ++f.shift;
  // 2^32 * (2^shift - d) / d + 1 < 2^32 since 2^shift < 2 * d.
  f.mul = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << f.shift) - d)) / d + 1);
  return f;
}

__device__ __forceinline__ uint32_t divide(const FastDiv& f, uint32_t n) {
  // mulhi(n, mul) <= n < 2^31, so the sum does not wrap.
  return (__umulhi(n, f.mul) + n) >> f.shift;
}

struct KStream {
  const char* src;
  int64_t src_token, src_seg;
  char* dst;
  int64_t dst_page, dst_token, dst_seg;
  uint32_t seg_vecs;  // accesses per segment
  uint32_t vecs;      // accesses per token row (seg_vecs * segments)
};

struct KParams {
  KStream a, b;
  IndexVec batch, pos;
  int64_t nnz;
  uint32_t vecs;          // a.vecs + b.vecs
  FastDiv row;            // divides by vecs
  uint32_t batch_tokens;  // tokens per batch: <= kThreads, batch_tokens * vecs < 2^31
  int64_t share_q;        // nnz = share_q * grid + share_r: each block's share
  uint32_t share_r;
  // append_rows_kernel: threads a token (`lanes`, divided by lane_div), tokens a block.
  uint32_t lanes, block_tokens;
  FastDiv lane_div;
};

template <class V>
__device__ __forceinline__ V load_once(const V* p) {
#if defined(MLACORE_GPU_CUDA)
  return __ldg(p);  // read-only path: the sources are never written here
#else
  return *p;
#endif
}

// Address of access `v` of a token row when rows are split into segments
// (HND heads, strided source heads): accesses [0, a.vecs) are stream a's,
// the rest stream b's; within a stream, segment by segment.
template <class V, class Ptr>
__device__ __forceinline__ Ptr segmented(const KParams& p, uint32_t v, Ptr row_a, Ptr row_b, bool source) {
  const bool in_b = v >= p.a.vecs;
  const KStream& s = in_b ? p.b : p.a;
  const uint32_t w = in_b ? v - p.a.vecs : v;
  const uint32_t seg = w / s.seg_vecs;
  const uint32_t e = w - seg * s.seg_vecs;
  return (in_b ? row_b : row_a) + seg * (source ? s.src_seg : s.dst_seg) + e * sizeof(V);
}

// Address of access `v` of a token row in either stream: flat rows (one
// segment per stream: NHD, contiguous heads, MLA) are one run per stream, so
// access w of a stream's row is at row + w * sizeof(V); a template parameter,
// so the per-access code has neither a branch on it nor the segment division.
template <bool Flat, class V, class Ptr>
__device__ __forceinline__ Ptr access_at(const KParams& p, uint32_t v, Ptr row_a, Ptr row_b, bool source) {
  if (Flat) {
    const bool in_b = v >= p.a.vecs;
    return (in_b ? row_b : row_a) + static_cast<size_t>(in_b ? v - p.a.vecs : v) * sizeof(V);
  }
  return segmented<V>(p, v, row_a, row_b, source);
}

// q = n / d, r = n % d for 64-bit operands, one bit at a time. Only reached
// for positions or page sizes of 2^32 and more: nvcc's 64-bit division is a
// call, around which the first round's loaded rows (live here) would spill.
__device__ __forceinline__ void divide_slowly(uint64_t n, uint64_t d, uint64_t& q, uint64_t& r) {
  q = 0;
  r = 0;
#pragma unroll 1
  for (int i = 63; i >= 0; --i) {
    r = (r << 1) | ((n >> i) & 1);  // r < d < 2^63 before the shift: no overflow
    if (r >= d) {
      r -= d;
      q |= uint64_t{1} << i;
    }
  }
}

// q = n / d, r = n % d for n >= 0, d >= 1: 32-bit when both fit.
__device__ __forceinline__ void split(int64_t n, int64_t d, int64_t& q, int64_t& r) {
  if (((static_cast<uint64_t>(n) | static_cast<uint64_t>(d)) >> 32) == 0) {
    const uint32_t q32 = static_cast<uint32_t>(n) / static_cast<uint32_t>(d);
    q = q32;
    r = static_cast<int64_t>(static_cast<uint32_t>(n) - q32 * static_cast<uint32_t>(d));
  } else {
    uint64_t uq, ur;
    divide_slowly(static_cast<uint64_t>(n), static_cast<uint64_t>(d), uq, ur);
    q = static_cast<int64_t>(uq);
    r = static_cast<int64_t>(ur);
  }
}

// split()'s quotient and remainder, returned by value: registers, where
// references across a call would put them in local memory.
struct QuotRem {
  int64_t q, r;
};

// split(), out of line: a call on a path the rows kernel never takes in a
// decode step, so its straight-line path does not jump over the division's
// code (after an L2 flush every instruction-cache line it skips to is one
// more DRAM round trip before the first store).
static __device__ __noinline__ QuotRem split_out_of_line(int64_t n, int64_t d) {
  QuotRem qr;
  split(n, d, qr.q, qr.r);
  return qr;
}

// Position -> (page of the request, offset in it) for a page size fixed for
// the call: a multiply-high (FastDiv) while position and page size fit 31
// bits, split() out of line otherwise. Built on the host by page_div().
struct PageDiv {
  FastDiv fast;
  int64_t size = 1;
  bool small = true;  // 1 <= size < 2^31: `fast` divides by it

  __device__ __forceinline__ void operator()(int64_t pos, int64_t& q, int64_t& r) const {
    if (__builtin_expect(small & (static_cast<uint64_t>(pos) < 0x80000000ull), 1)) {
      const uint32_t q32 = divide(fast, static_cast<uint32_t>(pos));
      q = q32;
      r = pos - static_cast<int64_t>(q32) * size;
    } else {
      const QuotRem qr = split_out_of_line(pos, size);
      q = qr.q;
      r = qr.r;
    }
  }
};

inline PageDiv page_div(int64_t page_size) {
  PageDiv d;
  d.size = page_size;
  d.small = page_size >= 1 && page_size < (int64_t{1} << 31);
  if (d.small) d.fast = fast_div(static_cast<uint32_t>(page_size));
  return d;
}

// The lookups' shared tail: the page and offset of position `pos` (>= 0) of
// a request whose pages are indices[begin, end), a range already checked
// against the table; page stays -1 past the request's pages.
template <class Idx, class Div>
__device__ __forceinline__ void page_in_request(const PageTable<Idx>& t, const Div& div, int64_t begin, int64_t end,
                                                int64_t pos, int64_t& page, int64_t& off) {
  int64_t in_request;
  div(pos, in_request, off);
  // Compared before adding, as in PageTable::slot: no wrapped index.
  if (in_request >= end - begin) return;
  page = t.page_at(begin + in_request);
}

// Page and in-page offset of token `pos` of request `b`; page -1 when the
// token must be skipped. The same checks, in the same order, as
// PageTable::slot, through the same bounds-checked reads (pages_of,
// page_at); only the division differs (32-bit when the numbers fit).
template <class Idx>
__device__ __forceinline__ void locate(const PageTable<Idx>& t, int64_t b, int64_t pos, int64_t& page,
                                       int64_t& off) {
  page = -1;
  off = 0;
  // Both index words are used before the first branch: the compiler cannot
  // sink one load behind a test of the other, so they are in flight together
  // and the lookup is three dependent loads (batch/position, kv_indptr,
  // kv_indices), not four.
  if (!((pos >= 0) & (b >= 0) & (b < t.batch))) return;
  int64_t begin, end;
  if (!t.pages_of(b, begin, end)) return;
  const auto by_split = [&t](int64_t n, int64_t& q, int64_t& r) { split(n, t.page_size, q, r); };
  page_in_request(t, by_split, begin, end, pos, page, off);
}

// locate() for token `tok` of an append whose batch index is usually the
// token itself (a decode step: one token a request, batch_indices = arange).
// kv_indptr[tok] and kv_indptr[tok + 1] are loaded together with the token's
// batch index and position, before either is known, so when the guess holds
// the lookup is two dependent loads (those four words, then kv_indices), not
// three. The guessed entries are read only for tok < batch (in the table);
// a miss re-reads the request's entries as locate() does. Same checks, same
// result as locate() for every input.
template <class Idx, class B, class P>
__device__ __forceinline__ void locate_guessing(const PageTable<Idx>& t, const PageDiv& div, const B& batch,
                                                const P& positions, int64_t tok, int64_t& page, int64_t& off) {
  page = -1;
  off = 0;
  const int64_t b = batch.at(tok), pos = positions.at(tok);
  int64_t begin = 0, end = 0;
  if (tok < t.batch) {
    begin = static_cast<int64_t>(t.indptr[tok * t.indptr_stride]);
    end = static_cast<int64_t>(t.indptr[(tok + 1) * t.indptr_stride]);
  }
  if (!((pos >= 0) & (b >= 0) & (b < t.batch))) return;
  if (b != tok) {
    begin = static_cast<int64_t>(t.indptr[b * t.indptr_stride]);
    end = static_cast<int64_t>(t.indptr[(b + 1) * t.indptr_stride]);
  }
  if (!(begin >= 0 && begin <= end && end <= t.num_indices)) return;  // PageTable::pages_of's test
  page_in_request(t, div, begin, end, pos, page, off);
}

// Rows that are one run per stream (NHD, contiguous heads, MLA): see access_at.
inline bool is_flat(const KParams& p) { return p.a.seg_vecs == p.a.vecs && p.b.seg_vecs == p.b.vecs; }

}  // namespace mlacore::append
