// A fake AITER for the loader's and the routes' contract tests: the same
// extern "C" entry points real AITER (or mlacore's shim, for the cache
// writes) exports, run on the CPU. It records every call's arguments as text
// (read back through fake_aiter_log) and computes what the real kernels
// compute, so the tests can check what crossed the ABI and that the routed
// results equal the native ones:
//   - mla_decode_stage1_asm_fwd with num_kv_splits_indptr (non-persistent,
//     the route's mode): per-split fp32 partials and natural-log LSEs, as
//     AITER's stage 1 leaves them for its stage 2; the splits stage 2 does
//     not read (past min(splits, ceil(kv_len / g))) are poisoned with NaN,
//     so a merge that reads them fails the test. Without it (persistent
//     mode, the loader test's raw call) it fills `output` with a pattern.
//   - aiter_concat_and_cache_mla, aiter_reshape_and_cache_flash: plain
//     loops through every tensor's strides, skipping slots < 0.
//
// Built several times by tests/cpp/meson.build, one shared_module per case:
//   (no flags)              good: version 1, decode and both cache writes
//   -DFAKE_NO_CACHE_WRITES  decode only, like a library without the shim's entry points
//   -DFAKE_ABI_VERSION=7    a version mlacore does not know
//   -DFAKE_NO_ENTRY         the version symbol but no decode entry point
//   -DFAKE_NO_VERSION       the entry point only, like released AITER builds
// FAKE_AITER_FAIL=1 in the environment makes the cache writes return 7.
#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "backends/aiter/aiter_abi.h"

#ifndef FAKE_ABI_VERSION
#define FAKE_ABI_VERSION 1
#endif

namespace {

std::mutex g_mutex;
std::string g_log;
std::atomic<int> g_version_queries{0};

[[maybe_unused]] void describe(std::string& out, const char* name, const aiter_tensor_t* t) {
  char buf[64];
  out += name;
  if (t == nullptr) {
    out += "=null ";
    return;
  }
  out += "{shape=(";
  for (int i = 0; i < t->ndim && i < MLACORE_AITER_MAX_DIMS; ++i) {
    std::snprintf(buf, sizeof buf, "%s%" PRId64, i ? "," : "", t->shape[i]);
    out += buf;
  }
  out += ") strides=(";
  for (int i = 0; i < t->ndim && i < MLACORE_AITER_MAX_DIMS; ++i) {
    std::snprintf(buf, sizeof buf, "%s%" PRId64, i ? "," : "", t->strides[i]);
    out += buf;
  }
  std::snprintf(buf, sizeof buf, ") numel=%zu dtype=%d dev=%d ptr=%p} ", t->numel_, static_cast<int>(t->dtype_),
                t->device_id, t->ptr);
  out += buf;
}

// Writes value(i) = i + page_size at the i-th element in row-major order,
// addressed through the tensor's strides: a wrong stride or pointer shows up
// as a wrong value where the test looks.
[[maybe_unused]] void fill(aiter_tensor_t* t, int page_size) {
  if (t == nullptr || t->ptr == nullptr || t->ndim < 1 || t->ndim > MLACORE_AITER_MAX_DIMS) return;
  int64_t index[MLACORE_AITER_MAX_DIMS] = {};
  for (size_t i = 0; i < t->numel_; ++i) {
    int64_t offset = 0;
    for (int d = 0; d < t->ndim; ++d) offset += index[d] * t->strides[d];
    const float v = static_cast<float>(i) + static_cast<float>(page_size);
    if (t->dtype_ == AITER_DTYPE_fp32) {
      static_cast<float*>(t->ptr)[offset] = v;
    } else if (t->dtype_ == AITER_DTYPE_bf16) {
      uint32_t bits;
      std::memcpy(&bits, &v, sizeof bits);
      static_cast<uint16_t*>(t->ptr)[offset] = static_cast<uint16_t>(bits >> 16);  // exact for small integers
    }
    for (int d = t->ndim - 1; d >= 0; --d) {
      if (++index[d] < t->shape[d]) break;
      index[d] = 0;
    }
  }
}

[[maybe_unused]] float bf16_value(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// "name=[v0,v1,...]" of a small int32 tensor, through its stride.
[[maybe_unused]] void values(std::string& out, const char* name, const aiter_tensor_t* t) {
  out += name;
  out += "=[";
  if (t != nullptr && t->ptr != nullptr && t->dtype_ == AITER_DTYPE_i32 && t->ndim == 1) {
    char buf[24];
    for (int64_t i = 0; i < t->shape[0]; ++i) {
      std::snprintf(buf, sizeof buf, "%s%d", i ? "," : "", static_cast<const int32_t*>(t->ptr)[i * t->strides[0]]);
      out += buf;
    }
  }
  out += "] ";
}

[[maybe_unused]] int32_t i32_at(const aiter_tensor_t* t, int64_t i) {
  return static_cast<const int32_t*>(t->ptr)[i * t->strides[0]];
}

// AITER's stage 1 without num_kv_splits_indptr's sibling modes: every
// request has (qo_indptr) rows, all M long as the route lays them out; KV
// length (pages - 1) * page_size + last; causal inside the request, as
// AITER's decode reference masks (tril with diagonal kv_len - q_len).
[[maybe_unused]] void decode_splits(const aiter_tensor_t* Q, const aiter_tensor_t* KV, const aiter_tensor_t* qo_indptr,
                                    const aiter_tensor_t* kv_indptr, const aiter_tensor_t* pages,
                                    const aiter_tensor_t* last, int max_seqlen_q, int page_size, float scale,
                                    aiter_tensor_t* split_o, aiter_tensor_t* split_lse) {
  const int64_t batch = qo_indptr->shape[0] - 1, heads = Q->shape[1], splits = split_o->shape[1];
  const int64_t g = heads == 16 && max_seqlen_q == 1 ? 64 : 16;
  const float nan = std::numeric_limits<float>::quiet_NaN(), neg_inf = -std::numeric_limits<float>::infinity();
  auto* o = static_cast<float*>(split_o->ptr);
  auto* lse = static_cast<float*>(split_lse->ptr);
  const auto* q = static_cast<const uint16_t*>(Q->ptr);
  const auto* kv = static_cast<const uint16_t*>(KV->ptr);
  std::vector<float> qrow(576), acc(512);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t p0 = i32_at(kv_indptr, b), p1 = i32_at(kv_indptr, b + 1);
    const int64_t kv_len = p1 > p0 ? (p1 - p0 - 1) * page_size + i32_at(last, b) : 0;
    const int64_t blocks = (kv_len + g - 1) / g, valid = blocks < splits ? blocks : splits;
    const int64_t r0 = i32_at(qo_indptr, b), r1 = i32_at(qo_indptr, b + 1), nq = r1 - r0;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t limit = kv_len - nq + (r - r0) + 1;
      for (int64_t h = 0; h < heads; ++h) {
        for (int d = 0; d < 576; ++d) qrow[d] = bf16_value(q[r * Q->strides[0] + h * Q->strides[1] + d * Q->strides[2]]);
        for (int64_t s = 0; s < splits; ++s) {
          float* os = o + ((r * splits + s) * heads + h) * 512;
          float* ls = lse + (r * splits + s) * heads + h;
          if (s >= valid) {
            for (int d = 0; d < 512; ++d) os[d] = nan;
            *ls = nan;
            continue;
          }
          const int64_t lo = (s * blocks / valid) * g;
          int64_t hi = ((s + 1) * blocks / valid) * g;
          if (hi > kv_len) hi = kv_len;
          std::vector<float> score;
          std::vector<const uint16_t*> rows;
          float m = neg_inf;
          for (int64_t pos = lo; pos < hi && pos < limit; ++pos) {
            const int64_t page = i32_at(pages, p0 + pos / page_size);
            const uint16_t* row = kv + page * KV->strides[0] + (pos % page_size) * KV->strides[1];
            float dot = 0.f;
            for (int d = 0; d < 576; ++d) dot += qrow[d] * bf16_value(row[d * KV->strides[3]]);
            score.push_back(dot * scale);
            rows.push_back(row);
            m = score.back() > m ? score.back() : m;
          }
          std::fill(acc.begin(), acc.end(), 0.f);
          float sum = 0.f;
          for (size_t j = 0; j < score.size(); ++j) {
            const float w = std::exp(score[j] - m);
            sum += w;
            for (int d = 0; d < 512; ++d) acc[d] += w * bf16_value(rows[j][d * KV->strides[3]]);
          }
          for (int d = 0; d < 512; ++d) os[d] = sum > 0.f ? acc[d] / sum : 0.f;
          *ls = sum > 0.f ? m + std::log(sum) : neg_inf;
        }
      }
    }
  }
}

[[maybe_unused]] int fail_status() {
  const char* v = std::getenv("FAKE_AITER_FAIL");
  return v != nullptr && std::strcmp(v, "1") == 0 ? 7 : 0;
}

// Copies `n` 16-bit elements from src (stride ss) to dst (stride ds).
[[maybe_unused]] void copy16(uint16_t* dst, int64_t ds, const uint16_t* src, int64_t ss, int64_t n) {
  for (int64_t d = 0; d < n; ++d) dst[d * ds] = src[d * ss];
}

}  // namespace

extern "C" {

#ifndef FAKE_NO_VERSION
int aiter_c_abi_version(void) {
  // Counted: the loader asks once per process however many threads probe.
  g_version_queries.fetch_add(1);
  return FAKE_ABI_VERSION;
}
#endif

#ifndef FAKE_NO_ENTRY
void mla_decode_stage1_asm_fwd(aiter_tensor_t* Q, aiter_tensor_t* KV, aiter_tensor_t* qo_indptr,
                               aiter_tensor_t* kv_indptr, aiter_tensor_t* kv_page_indices,
                               aiter_tensor_t* kv_last_page_lens, aiter_tensor_t* num_kv_splits_indptr,
                               aiter_tensor_t* work_meta_data, aiter_tensor_t* work_indptr,
                               aiter_tensor_t* work_info_set, int max_seqlen_q, int page_size, int nhead_kv,
                               float softmax_scale, aiter_tensor_t* splitData, aiter_tensor_t* splitLse,
                               aiter_tensor_t* output, aiter_tensor_t* lse, aiter_tensor_t* q_scale,
                               aiter_tensor_t* kv_scale, aiter_stream_t stream) {
  std::string line = "call ";
  describe(line, "Q", Q);
  describe(line, "KV", KV);
  describe(line, "qo_indptr", qo_indptr);
  describe(line, "kv_indptr", kv_indptr);
  describe(line, "kv_page_indices", kv_page_indices);
  describe(line, "kv_last_page_lens", kv_last_page_lens);
  describe(line, "num_kv_splits_indptr", num_kv_splits_indptr);
  describe(line, "work_meta_data", work_meta_data);
  describe(line, "work_indptr", work_indptr);
  describe(line, "work_info_set", work_info_set);
  describe(line, "splitData", splitData);
  describe(line, "splitLse", splitLse);
  describe(line, "output", output);
  describe(line, "lse", lse);
  describe(line, "q_scale", q_scale);
  describe(line, "kv_scale", kv_scale);
  char buf[160];
  // %a prints the float exactly: the scale must cross the ABI bit for bit.
  std::snprintf(buf, sizeof buf, "max_seqlen_q=%d page_size=%d nhead_kv=%d softmax_scale=%a stream=%p\n",
                max_seqlen_q, page_size, nhead_kv, static_cast<double>(softmax_scale),
                static_cast<void*>(stream));
  line += buf;
  if (num_kv_splits_indptr == nullptr) {
    fill(output, page_size);  // persistent mode writes the final output
  } else {
    line += "values ";
    values(line, "qo_indptr", qo_indptr);
    values(line, "kv_indptr", kv_indptr);
    values(line, "kv_last_page_lens", kv_last_page_lens);
    values(line, "num_kv_splits_indptr", num_kv_splits_indptr);
    line += "\n";
    decode_splits(Q, KV, qo_indptr, kv_indptr, kv_page_indices, kv_last_page_lens, max_seqlen_q, page_size,
                  softmax_scale, splitData, splitLse);
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  g_log += line;
}
#endif

#if !defined(FAKE_NO_ENTRY) && !defined(FAKE_NO_CACHE_WRITES)
int aiter_concat_and_cache_mla(aiter_tensor_t* kv_c, aiter_tensor_t* k_pe, aiter_tensor_t* kv_cache,
                               aiter_tensor_t* slot_mapping, const char* kv_cache_dtype, aiter_tensor_t* scale,
                               aiter_stream_t stream) {
  std::string line = "concat_and_cache_mla ";
  describe(line, "kv_c", kv_c);
  describe(line, "k_pe", k_pe);
  describe(line, "kv_cache", kv_cache);
  describe(line, "slot_mapping", slot_mapping);
  describe(line, "scale", scale);
  char buf[160];
  std::snprintf(buf, sizeof buf, "kv_cache_dtype=%s scale_value=%a stream=%p\n", kv_cache_dtype,
                static_cast<double>(*static_cast<const float*>(scale->ptr)), static_cast<void*>(stream));
  line += buf;
  if (slot_mapping->dtype_ == AITER_DTYPE_i64) {  // anything else is logged and not written
    const auto* slots = static_cast<const int64_t*>(slot_mapping->ptr);
    const int64_t block_size = kv_cache->shape[1], dc = kv_c->shape[1], dp = k_pe->shape[1];
    auto* cache = static_cast<uint16_t*>(kv_cache->ptr);
    for (int64_t i = 0; i < kv_c->shape[0]; ++i) {
      const int64_t slot = slots[i * slot_mapping->strides[0]];
      if (slot < 0) continue;
      uint16_t* dst = cache + (slot / block_size) * kv_cache->strides[0] + (slot % block_size) * kv_cache->strides[1];
      copy16(dst, kv_cache->strides[2], static_cast<const uint16_t*>(kv_c->ptr) + i * kv_c->strides[0],
             kv_c->strides[1], dc);
      copy16(dst + dc * kv_cache->strides[2], kv_cache->strides[2],
             static_cast<const uint16_t*>(k_pe->ptr) + i * k_pe->strides[0], k_pe->strides[1], dp);
    }
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  g_log += line;
  return fail_status();
}

int aiter_reshape_and_cache_flash(aiter_tensor_t* key, aiter_tensor_t* value, aiter_tensor_t* key_cache,
                                  aiter_tensor_t* value_cache, aiter_tensor_t* slot_mapping,
                                  const char* kv_cache_dtype, aiter_tensor_t* k_scale, aiter_tensor_t* v_scale,
                                  aiter_stream_t stream) {
  std::string line = "reshape_and_cache_flash ";
  describe(line, "key", key);
  describe(line, "value", value);
  describe(line, "key_cache", key_cache);
  describe(line, "value_cache", value_cache);
  describe(line, "slot_mapping", slot_mapping);
  describe(line, "k_scale", k_scale);
  describe(line, "v_scale", v_scale);
  char buf[200];
  std::snprintf(buf, sizeof buf, "kv_cache_dtype=%s k_scale_value=%a v_scale_value=%a stream=%p\n", kv_cache_dtype,
                static_cast<double>(*static_cast<const float*>(k_scale->ptr)),
                static_cast<double>(*static_cast<const float*>(v_scale->ptr)), static_cast<void*>(stream));
  line += buf;
  if (slot_mapping->dtype_ == AITER_DTYPE_i64) {
    const auto* slots = static_cast<const int64_t*>(slot_mapping->ptr);
    const int64_t block_size = key_cache->shape[1], heads = key->shape[1], dim = key->shape[2];
    for (int64_t i = 0; i < key->shape[0]; ++i) {
      const int64_t slot = slots[i * slot_mapping->strides[0]];
      if (slot < 0) continue;
      const aiter_tensor_t* srcs[2] = {key, value};
      const aiter_tensor_t* caches[2] = {key_cache, value_cache};
      for (int k = 0; k < 2; ++k) {
        const aiter_tensor_t* c = caches[k];
        const aiter_tensor_t* src = srcs[k];
        for (int64_t h = 0; h < heads; ++h)
          copy16(static_cast<uint16_t*>(c->ptr) + (slot / block_size) * c->strides[0] +
                     (slot % block_size) * c->strides[1] + h * c->strides[2],
                 c->strides[3], static_cast<const uint16_t*>(src->ptr) + i * src->strides[0] + h * src->strides[1],
                 src->strides[2], dim);
      }
    }
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  g_log += line;
  return fail_status();
}
#endif

// Test-only readers. The pointer stays valid until the next call.
const char* fake_aiter_log(void) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_log.c_str();
}

void fake_aiter_clear_log(void) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_log.clear();
}

int fake_aiter_version_queries(void) { return g_version_queries.load(); }

}  // extern "C"
