// A fake AITER for the loader's contract test: the same extern "C" entry
// point real AITER exports, run on the CPU. It records every call's
// arguments as text (read back through fake_aiter_log) and fills `output`
// deterministically, so the test can check what crossed the ABI.
//
// Built several times by tests/cpp/meson.build, one shared_module per case:
//   (no flags)             good: version 1 and the entry point
//   -DFAKE_ABI_VERSION=7   a version mlacore does not know
//   -DFAKE_NO_ENTRY        the version symbol but no entry point
//   -DFAKE_NO_VERSION      the entry point only, like released AITER builds
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "aiter_abi.h"

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
  fill(output, page_size);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_log += line;
}
#endif

// Test-only readers. The pointer stays valid until the next call.
const char* fake_aiter_log(void) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_log.c_str();
}

int fake_aiter_version_queries(void) { return g_version_queries.load(); }

}  // extern "C"
