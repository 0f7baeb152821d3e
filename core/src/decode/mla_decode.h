// What mla_decode.cpp (validation, CPU path) hands the GPU launcher in
// mla_decode_launch.cu and its kernels: raw pointers and element strides, all checked already.
#pragma once

#include <cstdint>

#include "common/page_table.h"

namespace mlacore {

constexpr int kCkvDim = 512;
constexpr int kKpeDim = 64;
constexpr int kQkDim = kCkvDim + kKpeDim;

enum class DecodeDType : int { BF16, F16 };

template <class Idx>
struct DecodeParams {
  const void* q_nope;  // [total_q, H, 512]
  const void* q_pe;    // [total_q, H, 64]
  int64_t q_nope_stride_t, q_nope_stride_h;
  int64_t q_pe_stride_t, q_pe_stride_h;
  const void* ckv;  // page/token strides in elements; the last dim is contiguous
  const void* kpe;
  int64_t ckv_stride_page, ckv_stride_tok;
  int64_t kpe_stride_page, kpe_stride_tok;
  void* out;  // [total_q, H, 512]
  int64_t out_stride_t, out_stride_h;
  float* lse;  // [total_q, H] or null
  int64_t lse_stride_t, lse_stride_h;

  PageTable<Idx> pages;  // kv_indices / kv_indptr, page ids checked against the pool
  const Idx* qo_indptr;
  int64_t qo_indptr_stride;
  const Idx* kv_len;
  int64_t kv_len_stride;
  int64_t batch;    // entries of qo_indptr - 1 (and of kv_len, kv_indptr - 1)
  int64_t total_q;  // rows of q_nope / out: a request's qo range is checked against it
  int device;

  const int32_t* schedule;  // ScheduleLayout{max_batch, max_work}
  int64_t max_batch, max_work, max_qo_len, max_partials;
  float* partial_o;    // [max_partials, max_qo_len * H, 512]
  float* partial_lse;  // [max_partials, max_qo_len * H]

  int num_heads;
  float scale_log2;  // sm_scale * log2(e): scores go straight into exp2
  bool causal;
};

// Rows of one partial output: every partial is sized for the largest request.
MLACORE_HD int64_t decode_partial_rows(int64_t max_qo_len, int64_t num_heads) { return max_qo_len * num_heads; }

#if defined(MLACORE_WITH_CUDA) || defined(MLACORE_WITH_HIP)
// Launches the decode kernels (and the combine) on `stream`.
template <class Idx>
void launch_mla_decode(const DecodeParams<Idx>& p, DecodeDType dtype, bool portable, void* stream);
#endif

}  // namespace mlacore
