// Device steps shared by the sm_90a decode kernels (mla_decode_sm90.cu,
// mla_decode_seesaw.cu), which hold a CTA's work the same way: 64 query rows
// of one work item, 256 threads in two warpgroups, O's 512 columns halved
// between them, each thread two rows (acc_row) of its warpgroup's m64n256
// accumulator. load_q brings the query tile into shared memory, row_limits
// gives a thread's rows the first KV position each may not see, and
// store_o_tile writes O: a request's whole KV to `out` (bf16/f16) and `lse`,
// a split one to its fp32 partial and LSE, staged through shared memory so
// that each warp stores 512 contiguous bytes an instruction.
#pragma once

#include <cstdint>

#include "plan/schedule.h"
#include "gpu/wgmma_sm90.cuh"
#include "decode/mla_decode.h"
#include "decode/mla_decode_device.cuh"

namespace mlacore {

#if defined(MLACORE_GPU_CUDA)

// The query tile (64 rows of 576 elements, rows past the request zeroed) into
// shared memory at s_q in the 128-byte-swizzle layout, by all 256 threads,
// eight a row (a warp reads four whole 128-byte lines an instruction), as
// cp.async the caller commits and waits for. Each thread divides its row by H
// twice, not once per chunk.
template <class Idx>
__device__ __forceinline__ void load_q(const DecodeParams<Idx>& p, const ItemView& item, int64_t row0, int64_t rows,
                                       uint32_t s_q, int tid) {
  constexpr int kRows = kDecodeTileRows;
  constexpr int kChunks = kQkDim / 8;  // 16-byte chunks per 576-element row
  constexpr int kQRowsPerPass = 256 / 8;
  const int H = p.num_heads;
  const auto* qn = static_cast<const uint16_t*>(p.q_nope);
  const auto* qp = static_cast<const uint16_t*>(p.q_pe);
#pragma unroll
  for (int pass = 0; pass < kRows / kQRowsPerPass; ++pass) {
    const int r = pass * kQRowsPerPass + (tid >> 3);
    const int64_t grow = row0 + r;
    const bool valid = grow < rows;
    const int64_t t = valid ? grow / H : 0, h = valid ? grow % H : 0;
    const uint16_t* nope = qn + (item.qo_begin + t) * p.q_nope_stride_t + h * p.q_nope_stride_h;
    const uint16_t* pe = qp + (item.qo_begin + t) * p.q_pe_stride_t + h * p.q_pe_stride_h;
#pragma unroll
    for (int c = tid & 7; c < kChunks; c += 8) {
      const uint16_t* src = c < kCkvDim / 8 ? nope + c * 8 : pe + (c - kCkvDim / 8) * 8;
      cp_async16(s_q + wgmma::sw128_tile(r, c, kRows), valid ? src : qn, valid);
    }
  }
}

// The first KV position rows r_lo and r_lo + 8 of the tile may not see:
// the item's end, or the causal bound of the row's query token; 0 for rows
// past the request.
template <class Idx>
__device__ __forceinline__ void row_limits(const DecodeParams<Idx>& p, const ItemView& item, int64_t row0,
                                           int64_t rows, int r_lo, int64_t (&limit)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t grow = row0 + r_lo + 8 * i;
    const int64_t t = grow / p.num_heads;
    int64_t lim = p.causal ? item.kv_len - item.qo_len + t + 1 : item.kv_len;
    lim = lim < item.end ? lim : item.end;
    limit[i] = grow < rows ? lim : 0;
  }
}

// Thread `tid` of 256 stores its rows of O. s_sum[r]: row r's sum of
// probabilities over the whole item; m_row[i]: the base-2 row maximum of its
// rows acc_row(tid % 128, 0) + 8 i; s_o: 128 KB of shared memory free for the
// staging (the caller's __syncthreads put every thread past its last read of
// it). Rows at or past `rows` (and past rows_cap for a partial) are not stored.
template <bool kBf16, class Idx>
__device__ __forceinline__ void store_o_tile(const DecodeParams<Idx>& p, const ItemView& item, int64_t row0,
                                             int64_t rows, int64_t rows_cap, float* s_o, const float* s_sum,
                                             const float (&m_row)[2], const float (&o)[kCkvDim / 4], int tid) {
  constexpr int kRows = kDecodeTileRows;
  constexpr int kThreads = 256;
  constexpr int kOCols = kCkvDim / 2;  // O columns per warpgroup
  const int H = p.num_heads;
  const int g = tid >> 7, wtid = tid & 127, lane = tid & 31;
  const int r_lo = wgmma::acc_row(wtid, 0);
  const bool to_partial = item.partial >= 0;
  if (to_partial) {
    // fp32 partial rows, contiguous in partial_o: through s_o, so that each
    // warp stores 512 contiguous bytes an instruction instead of 8-byte pairs
    // on eight rows. The fragment stores
    // put 16-byte chunk c of row r at chunk c ^ (r & 7), and a row read back
    // stays one conflict-free 512-byte sweep.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = r_lo + 8 * i;
      const float l = s_sum[r];
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const int col0 = g * kOCols + 2 * (lane & 3);
#pragma unroll
      for (int j = 0; j < kOCols / 8; ++j) {
        const int col = col0 + 8 * j;
        *reinterpret_cast<float2*>(s_o + r * kCkvDim + (((col >> 2) ^ (r & 7)) << 2) + (col & 3)) =
            make_float2(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
      }
      const int64_t grow = row0 + r;
      if (grow < rows && grow < rows_cap && g == 0 && (lane & 3) == 0)
        p.partial_lse[item.partial * rows_cap + grow] = l > 0.f ? m_row[i] + log2f(l) : -INFINITY;
    }
    __syncthreads();
    constexpr int kRowChunks = kCkvDim / 4;  // 16-byte chunks of an fp32 row
    float* dst = p.partial_o + (item.partial * rows_cap + row0) * kCkvDim;
#pragma unroll 4
    for (int idx = tid; idx < kRows * kRowChunks; idx += kThreads) {
      const int r = idx / kRowChunks, c = idx % kRowChunks;
      const int64_t grow = row0 + r;
      if (grow < rows && grow < rows_cap)
        *reinterpret_cast<float4*>(dst + r * kCkvDim + c * 4) =
            *reinterpret_cast<const float4*>(s_o + r * kCkvDim + ((c ^ (r & 7)) << 2));
    }
  } else {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = r_lo + 8 * i;
      const float l = s_sum[r];
      const int64_t grow = row0 + r;
      if (grow >= rows) continue;
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const float lse = l > 0.f ? m_row[i] + log2f(l) : -INFINITY;
      const int64_t t = grow / H, h = grow % H;
      const int col0 = g * kOCols + 2 * (lane & 3);
      uint16_t* dst =
          static_cast<uint16_t*>(p.out) + (item.qo_begin + t) * p.out_stride_t + h * p.out_stride_h + col0;
#pragma unroll
      for (int j = 0; j < kOCols / 8; ++j)
        *reinterpret_cast<uint32_t*>(dst + j * 8) = pack2<kBf16>(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
      if (p.lse && g == 0 && (lane & 3) == 0) p.lse[(item.qo_begin + t) * p.lse_stride_t + h * p.lse_stride_h] = lse;
    }
  }
}

#endif  // MLACORE_GPU_CUDA

}  // namespace mlacore
