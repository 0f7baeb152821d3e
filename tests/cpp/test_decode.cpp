// MLA decode through the C ABI and the C++ wrapper on CPU DLTensors: a small
// batch (one request split into two partials, one written directly, one
// empty) against a plain float loop over the same bf16 values.
#include <mlacore/mlacore.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "bf16.h"
#include "check.h"

namespace {

struct Tensor {
  std::vector<int64_t> shape;
  DLTensor dl{};
  Tensor(void* data, DLDataType dtype, std::vector<int64_t> s) : shape(std::move(s)) {
    dl.data = data;
    dl.device = {kDLCPU, 0};
    dl.ndim = static_cast<int>(shape.size());
    dl.dtype = dtype;
    dl.shape = shape.data();
  }
  Tensor(const Tensor&) = delete;
};

constexpr DLDataType kBf16{kDLBfloat, 16, 1};
constexpr DLDataType kI32{kDLInt, 32, 1};
constexpr DLDataType kF32{kDLFloat, 32, 1};
constexpr DLDataType kU8{kDLUInt, 8, 1};

}  // namespace

int main() {
  constexpr int H = 2, S = 4;  // heads, page size
  const std::vector<int32_t> kv_lens = {100, 7, 0};
  const std::vector<int32_t> qo_lens = {1, 2, 1};
  const int B = 3, total_q = 4, num_pages = 30;
  std::vector<int32_t> qo_indptr = {0, 1, 3, 4};
  std::vector<int32_t> kv_indptr = {0, 25, 27, 27};
  std::vector<int32_t> kv_indices(27);
  for (int i = 0; i < 27; ++i) kv_indices[i] = (i * 7 + 3) % num_pages;  // scattered, distinct pages
  std::vector<int32_t> kv_len(kv_lens);

  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<uint16_t> q_nope(total_q * H * 512), q_pe(total_q * H * 64), cache(num_pages * S * 576);
  for (auto& v : q_nope) v = to_bf16(normal(rng));
  for (auto& v : q_pe) v = to_bf16(normal(rng));
  for (auto& v : cache) v = to_bf16(0.5f * normal(rng));

  // Schedule (decode_schedule.h) for max_batch 3, max_work 5: request 0 in
  // two items [0,64) and [64,100) with partials 0 and 1, request 1 written
  // directly, request 2 empty, and one padding item (request -1).
  const int64_t max_batch = 3, max_work_cap = 5, max_qo_len = 2;
  const int64_t split_off = 8 + max_batch, work_off = (split_off + max_batch + 1 + 3) / 4 * 4;
  std::vector<int32_t> md(work_off + 4 * max_work_cap, 0);
  const int32_t header[8] = {4, 2, B, 2, 100, 64, total_q, 0};
  for (int i = 0; i < 8; ++i) md[i] = header[i];
  const int32_t splits[4] = {0, 2, 2, 2};
  for (int b = 0; b <= B; ++b) md[split_off + b] = splits[b];
  const int32_t items[5][4] = {{0, 0, 64, 0}, {0, 64, 100, 1}, {1, 0, 7, -1}, {2, 0, 0, -1}, {-1, 0, 0, -1}};
  for (int w = 0; w < 5; ++w)
    for (int k = 0; k < 4; ++k) md[work_off + 4 * w + k] = items[w][k];

  const mlacore_decode_dims dims{max_batch, max_work_cap, max_qo_len, /*max_partials=*/2};
  std::vector<unsigned char> ws(mlacore::mla_decode_workspace_bytes(dims, H) + 16);
  // 16-byte aligned view of the workspace
  unsigned char* ws_ptr = ws.data() + ((16 - reinterpret_cast<uintptr_t>(ws.data()) % 16) % 16);
  std::vector<uint16_t> out(total_q * H * 512, 0xffff);
  std::vector<float> lse(total_q * H, 123.f);

  Tensor t_qn(q_nope.data(), kBf16, {total_q, H, 512}), t_qp(q_pe.data(), kBf16, {total_q, H, 64});
  // ckv and kpe: the halves of one [P, S, 576] buffer, through strides.
  int64_t cache_strides[3] = {S * 576, 576, 1};
  Tensor t_ckv(cache.data(), kBf16, {num_pages, S, 512}), t_kpe(cache.data() + 512, kBf16, {num_pages, S, 64});
  t_ckv.dl.strides = cache_strides;
  t_kpe.dl.strides = cache_strides;
  Tensor t_idx(kv_indices.data(), kI32, {27}), t_kvp(kv_indptr.data(), kI32, {B + 1}),
      t_qop(qo_indptr.data(), kI32, {B + 1}), t_len(kv_len.data(), kI32, {B});
  Tensor t_md(md.data(), kI32, {static_cast<int64_t>(md.size())});
  Tensor t_ws(ws_ptr, kU8, {mlacore::mla_decode_workspace_bytes(dims, H)});
  Tensor t_out(out.data(), kBf16, {total_q, H, 512}), t_lse(lse.data(), kF32, {total_q, H});

  const float sm_scale = 0.125f;
  mlacore::mla_decode(&t_qn.dl, &t_qp.dl, &t_ckv.dl, &t_kpe.dl, &t_idx.dl, &t_kvp.dl, &t_qop.dl, &t_len.dl, &t_md.dl,
                      &t_ws.dl, &t_out.dl, &t_lse.dl, dims, S, sm_scale, MLACORE_DECODE_CAUSAL);

  // Reference: a plain loop, causal inside each request.
  double max_err = 0, max_lse_err = 0;
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < qo_lens[b]; ++t) {
      const int qi = qo_indptr[b] + t;
      const int limit = kv_lens[b] - qo_lens[b] + t + 1;
      for (int h = 0; h < H; ++h) {
        std::vector<double> s, o(512, 0.0);
        std::vector<int64_t> rows;
        for (int pos = 0; pos < kv_lens[b] && pos < limit; ++pos) {
          const int64_t row = (static_cast<int64_t>(kv_indices[kv_indptr[b] + pos / S]) * S + pos % S) * 576;
          double acc = 0;
          for (int d = 0; d < 512; ++d) acc += double(from_bf16(q_nope[(qi * H + h) * 512 + d])) * from_bf16(cache[row + d]);
          for (int d = 0; d < 64; ++d) acc += double(from_bf16(q_pe[(qi * H + h) * 64 + d])) * from_bf16(cache[row + 512 + d]);
          s.push_back(acc * sm_scale);
          rows.push_back(row);
        }
        double m = -std::numeric_limits<double>::infinity(), l = 0;
        for (double x : s) m = std::max(m, x);
        for (size_t j = 0; j < s.size(); ++j) {
          const double w = std::exp(s[j] - m);
          l += w;
          for (int d = 0; d < 512; ++d) o[d] += w * from_bf16(cache[rows[j] + d]);
        }
        for (int d = 0; d < 512; ++d) {
          const double ref = l > 0 ? o[d] / l : 0.0;
          max_err = std::max(max_err, std::fabs(ref - from_bf16(out[(qi * H + h) * 512 + d])));
        }
        const double ref_lse = l > 0 ? (m + std::log(l)) / std::log(2.0) : -std::numeric_limits<double>::infinity();
        const float got = lse[qi * H + h];
        if (std::isinf(ref_lse)) CHECK(std::isinf(got) && got < 0);
        else max_lse_err = std::max(max_lse_err, std::fabs(ref_lse - got));
      }
    }
  }
  std::printf("max |out - ref| = %.3e, max |lse - ref| = %.3e\n", max_err, max_lse_err);
  CHECK(max_err < 1e-2);
  CHECK(max_lse_err < 1e-3);

  // The empty request: zeros.
  for (int d = 0; d < H * 512; ++d) CHECK(out[3 * H * 512 + d] == 0);

  // A workspace one byte short: a value error naming the bytes needed.
  Tensor t_small(ws_ptr, kU8, {mlacore::mla_decode_workspace_bytes(dims, H) - 1});
  const mlacore_status st = mlacore_mla_decode(&t_qn.dl, &t_qp.dl, &t_ckv.dl, &t_kpe.dl, &t_idx.dl, &t_kvp.dl,
                                               &t_qop.dl, &t_len.dl, &t_md.dl, &t_small.dl, &t_out.dl, nullptr, dims,
                                               S, sm_scale, MLACORE_DECODE_CAUSAL, nullptr);
  CHECK(st == MLACORE_ERROR_VALUE);
  CHECK_CONTAINS(mlacore_last_error(), std::to_string(mlacore::mla_decode_workspace_bytes(dims, H)).c_str());

  // NULL q_nope: a type error naming it; the wrapper throws.
  bool threw = false;
  try {
    mlacore::mla_decode(nullptr, &t_qp.dl, &t_ckv.dl, &t_kpe.dl, &t_idx.dl, &t_kvp.dl, &t_qop.dl, &t_len.dl, &t_md.dl,
                        &t_ws.dl, &t_out.dl, nullptr, dims, S, sm_scale, 0);
  } catch (const mlacore::Error& e) {
    threw = e.status() == MLACORE_ERROR_TYPE && std::string(e.what()).find("q_nope") != std::string::npos;
  }
  CHECK(threw);
  return finish("test_decode");
}
