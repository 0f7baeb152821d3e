// Contract test of the AITER routes (core/src/backends/aiter/aiter_decode.cpp,
// core/src/backends/aiter/aiter_cache_write.cpp, the gates in core/src/backends/backend_route.cpp):
// the public C ABI driven on CPU tensors against the fake AITER of
// tests/cpp/fake_aiter.cpp, with MLACORE_AITER_CPU_CONTRACT=1 letting the
// device gate accept the CPU (the test hook; real AITER needs ROCm memory).
// One process per case, since the AITER probe runs once per process:
//
//   test_aiter_routes gates             every gate, for auto and explicit "aiter"
//   test_aiter_routes decode            routed decode: exact arguments, stable buffers, = native
//   test_aiter_routes append            routed cache writes: exact arguments, = native
//   test_aiter_routes decode_only       a library without the cache-write entry points
//   test_aiter_routes fallback <reason> a missing/corrupt/incomplete library: auto runs native
//   test_aiter_routes no_contract       without the hook, CPU tensors never reach AITER
//   test_aiter_routes write_fails       a cache write returning non-zero is a RuntimeError
#include <dlfcn.h>
#include <mlacore/mlacore.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bf16.h"
#include "check.h"
#include "host_tensor.h"

namespace {

constexpr DLDataType kBf16{kDLBfloat, 16, 1};
constexpr DLDataType kF16{kDLFloat, 16, 1};
constexpr DLDataType kF32{kDLFloat, 32, 1};
constexpr DLDataType kI32{kDLInt, 32, 1};
constexpr DLDataType kI64{kDLInt, 64, 1};
constexpr DLDataType kU8{kDLUInt, 8, 1};

using Tensor = HostTensor;

// The fake's test-only readers, through the handle the core's loader opened.
struct Fake {
  int (*version_queries)() = nullptr;
  const char* (*log)() = nullptr;
  void (*clear)() = nullptr;
  bool ok = false;
};

Fake fake() {
  Fake f;
  // The probe opens the library; RTLD_NOLOAD below then finds that handle.
  int32_t available = 0;
  const char* reason = nullptr;
  if (mlacore_backend_info("aiter", &available, &reason) != MLACORE_OK || !available) return f;
  const char* path = std::getenv("MLACORE_AITER_LIB");
  void* h = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : nullptr;
  if (h == nullptr) return f;
  f.version_queries = reinterpret_cast<int (*)()>(dlsym(h, "fake_aiter_version_queries"));
  f.log = reinterpret_cast<const char* (*)()>(dlsym(h, "fake_aiter_log"));
  f.clear = reinterpret_cast<void (*)()>(dlsym(h, "fake_aiter_clear_log"));
  f.ok = f.version_queries && f.log && f.clear;
  return f;
}

// The text of `name{...}` (or "null") in a logged call line, "" if absent.
std::string field(const std::string& line, const std::string& name) {
  const std::string key = " " + name;
  size_t at = line.find(key + "{");
  if (at == std::string::npos) {
    at = line.find(key + "=");
    if (at == std::string::npos) return "";
    const size_t b = at + key.size() + 1;
    return line.substr(b, line.find(' ', b) - b);
  }
  const size_t b = at + key.size() + 1;
  return line.substr(b, line.find('}', b) - b);
}

// "shape=(..) strides=(..) numel=N dtype=D dev=0 ptr=P" of a tensor.
std::string tensor_text(const std::string& shape, const std::string& strides, int64_t numel, int dtype,
                        const void* ptr) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "shape=(%s) strides=(%s) numel=%lld dtype=%d dev=0 ptr=%p", shape.c_str(),
                strides.c_str(), static_cast<long long>(numel), dtype, ptr);
  return buf;
}

void* ptr_of(const std::string& text) {
  const size_t at = text.find("ptr=");
  if (at == std::string::npos) return nullptr;
  return reinterpret_cast<void*>(std::strtoull(text.c_str() + at + 4, nullptr, 16));
}

std::vector<std::string> lines_starting(const std::string& log, const std::string& prefix) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < log.size()) {
    const size_t end = log.find('\n', at);
    const std::string line = log.substr(at, end == std::string::npos ? std::string::npos : end - at);
    if (line.compare(0, prefix.size(), prefix) == 0) out.push_back(line);
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return out;
}

std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

// ---- gates ---------------------------------------------------------------

mlacore_route_request decode_request() {
  mlacore_route_request r{};
  r.op = MLACORE_ROUTE_DECODE_MLA;
  r.device_type = kDLCPU;  // with the hook, the contract's "HIP device"
  r.dtype = kBf16;
  r.layout = MLACORE_LAYOUT_NHD;
  r.page_size = 16;
  r.head_dim = 512;
  r.head_dim_pe = 64;
  r.adjacent = 1;
  r.num_heads = 16;
  r.max_qo_len = 1;
  r.causal = 1;
  r.index_int32 = 1;
  r.batch = 4;
  r.workspace_bytes = int64_t{1} << 30;
  r.page_stride = 16 * 576;
  return r;
}

mlacore_route_request append_request(int32_t op) {
  mlacore_route_request r{};
  r.op = op;
  r.device_type = kDLCPU;
  r.dtype = kF16;
  r.layout = MLACORE_LAYOUT_NHD;
  r.page_size = 1;
  r.head_dim = op == MLACORE_ROUTE_APPEND_MLA ? 512 : 128;
  r.head_dim_pe = op == MLACORE_ROUTE_APPEND_MLA ? 64 : 0;
  r.adjacent = 1;
  return r;
}

// auto: native, saying why (auto_prefix + detail); explicit aiter: `status`
// with aiter_prefix and the same detail.
void expect_refused(const mlacore_route_request& r, const char* auto_prefix, mlacore_status status,
                    const char* aiter_prefix, const char* detail) {
  int32_t chosen = -1;
  char why[512] = {};
  CHECK(mlacore_route(&r, MLACORE_BACKEND_AUTO, &chosen, why, sizeof why) == MLACORE_OK);
  CHECK(chosen == MLACORE_BACKEND_NATIVE);
  CHECK_CONTAINS(why, auto_prefix);
  CHECK_CONTAINS(why, detail);
  CHECK(mlacore_route(&r, MLACORE_BACKEND_AITER, &chosen, nullptr, 0) == status);
  CHECK_CONTAINS(mlacore_last_error(), aiter_prefix);
  CHECK_CONTAINS(mlacore_last_error(), detail);
}

// A failed gate: explicit aiter is a value error naming it.
void expect_gate(const mlacore_route_request& r, const char* words) {
  expect_refused(r, "native: auto, AITER gate failed: ", MLACORE_ERROR_VALUE, "backend='aiter' cannot run this call: ",
                 words);
}

void expect_aiter(const mlacore_route_request& r) {
  int32_t chosen = -1;
  char why[512] = {};
  CHECK(mlacore_route(&r, MLACORE_BACKEND_AUTO, &chosen, why, sizeof why) == MLACORE_OK);
  CHECK(chosen == MLACORE_BACKEND_AITER);
  CHECK(std::strcmp(why, "aiter: auto, all gates passed") == 0);
  CHECK(mlacore_route(&r, MLACORE_BACKEND_AITER, &chosen, why, sizeof why) == MLACORE_OK);
  CHECK(chosen == MLACORE_BACKEND_AITER);
  CHECK(mlacore_route(&r, MLACORE_BACKEND_NATIVE, &chosen, why, sizeof why) == MLACORE_OK);
  CHECK(chosen == MLACORE_BACKEND_NATIVE);
}

int run_gates() {
  expect_aiter(decode_request());
  for (int64_t h : {16, 128}) {
    mlacore_route_request r = decode_request();
    r.num_heads = h;
    for (int64_t m : {1, 2, 4}) {
      r.max_qo_len = m;
      expect_aiter(r);
    }
  }
  for (int64_t ps : {1, 2, 64}) {
    mlacore_route_request r = decode_request();
    r.page_size = ps;
    expect_aiter(r);
  }
  struct Case {
    void (*edit)(mlacore_route_request&);
    const char* words;
  };
  const Case decode_cases[] = {
      {[](mlacore_route_request& r) { r.device_type = kDLCUDA; }, "not a HIP device (the cache is on cuda)"},
      {[](mlacore_route_request& r) { r.dtype = kF16; }, "dtype float16 (AITER's MLA decode kernels take bfloat16)"},
      {[](mlacore_route_request& r) { r.page_size = 3; }, "page_size 3 is not a power of two"},
      {[](mlacore_route_request& r) { r.page_size = 0; }, "page_size 0 is not a power of two"},
      {[](mlacore_route_request& r) { r.head_dim = 256; }, "head dims 256+64"},
      {[](mlacore_route_request& r) { r.adjacent = 0; }, "are not the two halves of one [pages, page_size, 576] buffer"},
      {[](mlacore_route_request& r) { r.num_heads = 32; }, "num_heads 32 (AITER's bf16 MLA decode kernels serve 16 and 128"},
      {[](mlacore_route_request& r) { r.max_qo_len = 5; }, "max_qo_len 5 (AITER's MLA decode serves 1 to 4"},
      {[](mlacore_route_request& r) { r.max_qo_len = 2, r.causal = 0; }, "a non-causal call with max_qo_len 2"},
      {[](mlacore_route_request& r) { r.index_int32 = 0; }, "not all int32 with unit stride"},
      {[](mlacore_route_request& r) { r.page_stride = int64_t{1} << 30; }, "does not fit AITER's 32-bit byte stride"},
      {[](mlacore_route_request& r) { r.page_stride = -576; }, "does not fit AITER's 32-bit byte stride"},
      {[](mlacore_route_request& r) { r.workspace_bytes = 1000; }, "the float workspace has 1000 bytes; AITER's route needs at least"},
  };
  for (const Case& c : decode_cases) {
    mlacore_route_request r = decode_request();
    c.edit(r);
    expect_gate(r, c.words);
  }
  // The workspace gate is exact: the bytes it names suffice, one fewer fails.
  {
    mlacore_route_request r = decode_request();
    r.workspace_bytes = 1000;
    char why[512] = {};
    int32_t chosen = -1;
    CHECK(mlacore_route(&r, MLACORE_BACKEND_AUTO, &chosen, why, sizeof why) == MLACORE_OK);
    const char* at = std::strstr(why, "needs at least ");
    CHECK(at != nullptr);
    const int64_t need = at ? std::strtoll(at + std::strlen("needs at least "), nullptr, 10) : 0;
    // 4 rows: bf16 q [4,16,576] | fp32 [4,2,16,512] | fp32 [4,2,16] | 2 x int32 [5], each section 256-aligned.
    CHECK(need == 73728 + 262144 + 512 + 256 + 20);
    r.workspace_bytes = need;
    expect_aiter(r);
    r.workspace_bytes = need - 1;
    expect_gate(r, "AITER's route needs at least");
  }

  for (int32_t op : {MLACORE_ROUTE_APPEND_MLA, MLACORE_ROUTE_APPEND_KV}) {
    for (DLDataType dt : {kF16, kBf16}) {
      mlacore_route_request r = append_request(op);
      r.dtype = dt;
      expect_aiter(r);
    }
    const Case append_cases[] = {
        {[](mlacore_route_request& r) { r.device_type = kDLCUDA; }, "not a HIP device"},
        {[](mlacore_route_request& r) { r.dtype = kF32; }, "dtype float32 (AITER's cache writes take bfloat16 or float16)"},
        {[](mlacore_route_request& r) { r.layout = MLACORE_LAYOUT_HND; }, "layout HND (AITER's caches are NHD)"},
        {[](mlacore_route_request& r) { r.page_size = 6; }, "page_size 6 is not a power of two"},
    };
    for (const Case& c : append_cases) {
      mlacore_route_request r = append_request(op);
      c.edit(r);
      expect_gate(r, c.words);
    }
  }
  mlacore_route_request r = append_request(MLACORE_ROUTE_APPEND_MLA);
  r.adjacent = 0;
  expect_gate(r, "are not the two halves");
  r = append_request(MLACORE_ROUTE_APPEND_MLA);
  r.head_dim_pe = 32;
  expect_gate(r, "head dims 512+32");
  r = append_request(MLACORE_ROUTE_APPEND_KV);
  r.adjacent = 0;
  expect_gate(r, "token stride is not dense (heads*head_dim), or K and V differ in page stride");
  r = append_request(MLACORE_ROUTE_APPEND_KV);
  r.sources_strided = 1;
  expect_gate(r, "append_key/append_value do not keep a token's heads dense");
  r = append_request(MLACORE_ROUTE_APPEND_KV);
  r.head_dim = 96;  // reshape_and_cache_flash copies any head size
  expect_aiter(r);
  return finish("test_aiter_routes gates");
}

// ---- decode ----------------------------------------------------------------

// One decode problem on the CPU: a combined [P, S, 576] cache (pages padded
// by 64 elements, so the page stride is not S*576), or separate ckv and kpe
// allocations; q_nope and q_pe the halves of one [total_q, H, 576] buffer;
// a plan built by mlacore_plan_build.
struct Decode {
  int64_t heads, page_size, batch, total_q, max_qo_len, pages;
  std::vector<int32_t> qo_indptr, kv_indptr, kv_indices, kv_len;
  std::vector<int64_t> kv_indices64;
  std::vector<uint16_t> q, cache, ckv_sep, kpe_sep;
  int64_t page_stride;
  mlacore_plan* plan = nullptr;
  std::vector<int32_t> schedule;
  mlacore_decode_dims dims{};
  std::vector<unsigned char> ws_storage;
  unsigned char* ws = nullptr;
  int64_t ws_bytes = 0;
  std::unique_ptr<Tensor> tq_nope, tq_pe, tckv, tkpe, tckv_sep, tkpe_sep, tqo, tkvp, tidx, tidx64, tlen, tmd, tws;

  Decode(int64_t h, int64_t ps, const std::vector<int32_t>& qo_lens, const std::vector<int32_t>& kv_lens,
         int64_t ws_bytes_wanted = 0)
      : heads(h), page_size(ps), batch(static_cast<int64_t>(qo_lens.size())) {
    std::mt19937 rng(static_cast<unsigned>(h * 131 + ps));
    std::normal_distribution<float> normal(0.f, 1.f);
    qo_indptr = {0};
    kv_indptr = {0};
    max_qo_len = 1;
    for (int64_t b = 0; b < batch; ++b) {
      qo_indptr.push_back(qo_indptr.back() + qo_lens[b]);
      kv_indptr.push_back(kv_indptr.back() + (kv_lens[b] + static_cast<int32_t>(ps) - 1) / static_cast<int32_t>(ps));
      max_qo_len = std::max<int64_t>(max_qo_len, qo_lens[b]);
    }
    kv_len = kv_lens;
    total_q = qo_indptr.back();
    pages = kv_indptr.back() + 3;
    for (int32_t i = 0; i < kv_indptr.back(); ++i) kv_indices.push_back((i * 7 + 2) % static_cast<int32_t>(pages));
    kv_indices64.assign(kv_indices.begin(), kv_indices.end());
    page_stride = ps * 576 + 64;
    q.resize(total_q * h * 576);
    for (auto& v : q) v = to_bf16(normal(rng));
    cache.resize(pages * page_stride);
    for (auto& v : cache) v = to_bf16(0.5f * normal(rng));
    ckv_sep.resize(pages * ps * 512);
    kpe_sep.resize(pages * ps * 64);
    for (int64_t p = 0; p < pages; ++p)
      for (int64_t t = 0; t < ps; ++t)
        for (int d = 0; d < 576; ++d) {
          const uint16_t v = cache[p * page_stride + t * 576 + d];
          if (d < 512) ckv_sep[(p * ps + t) * 512 + d] = v;
          else kpe_sep[(p * ps + t) * 64 + d - 512] = v;
        }

    tq_nope.reset(new Tensor(q.data(), kBf16, {total_q, h, 512}, {h * 576, 576, 1}));
    tq_pe.reset(new Tensor(q.data() + 512, kBf16, {total_q, h, 64}, {h * 576, 576, 1}));
    tckv.reset(new Tensor(cache.data(), kBf16, {pages, ps, 512}, {page_stride, 576, 1}));
    tkpe.reset(new Tensor(cache.data() + 512, kBf16, {pages, ps, 64}, {page_stride, 576, 1}));
    tckv_sep.reset(new Tensor(ckv_sep.data(), kBf16, {pages, ps, 512}));
    tkpe_sep.reset(new Tensor(kpe_sep.data(), kBf16, {pages, ps, 64}));
    tqo.reset(new Tensor(qo_indptr.data(), kI32, {batch + 1}));
    tkvp.reset(new Tensor(kv_indptr.data(), kI32, {batch + 1}));
    tidx.reset(new Tensor(kv_indices.data(), kI32, {static_cast<int64_t>(kv_indices.size())}));
    tidx64.reset(new Tensor(kv_indices64.data(), kI64, {static_cast<int64_t>(kv_indices64.size())}));
    tlen.reset(new Tensor(kv_len.data(), kI32, {batch}));

    mlacore::check(mlacore_plan_create(batch, 0, 4, &plan));
    int64_t max_batch = 0, max_work = 0;
    int32_t sms = 0;
    mlacore::check(mlacore_plan_capacity(plan, &max_batch, &max_work, &sms));
    schedule.assign(mlacore_plan_schedule_size(max_batch, max_work), 0);
    tmd.reset(new Tensor(schedule.data(), kI32, {static_cast<int64_t>(schedule.size())}));
    mlacore::check(mlacore_plan_build(plan, tqo->p(), tkvp->p(), tlen->p(), static_cast<int32_t>(ps),
                                      static_cast<int32_t>(h), tmd->p(), nullptr));
    mlacore_plan_info info{};
    mlacore::check(mlacore_plan_get_info(plan, &info));
    dims = {max_batch, max_work, std::max<int64_t>(info.max_qo_len, 1), std::max<int64_t>(info.num_partials, 1)};
    ws_bytes = ws_bytes_wanted > 0 ? ws_bytes_wanted : int64_t{64} << 20;
    ws_bytes = std::max(ws_bytes, mlacore_mla_decode_workspace_bytes(dims, h));
    ws_storage.assign(ws_bytes + 16, 0xee);
    ws = ws_storage.data() + ((16 - reinterpret_cast<uintptr_t>(ws_storage.data()) % 16) % 16);
    tws.reset(new Tensor(ws, kU8, {ws_bytes}));
  }
  ~Decode() { mlacore_plan_destroy(plan); }

  // Offset of kv_last_page_len in the schedule.
  int64_t last_page_offset() const {
    int64_t off[4];
    mlacore::check(mlacore_plan_layout(dims.max_batch, dims.max_work, off));
    return off[1];
  }

  mlacore_status run(int32_t backend, std::vector<uint16_t>& out, std::vector<float>& lse, bool separate = false,
                     bool int64_indices = false, uint32_t flags = MLACORE_DECODE_CAUSAL) {
    out.assign(total_q * heads * 512, 0x7fc1);  // NaN bits: every row must be written
    lse.assign(total_q * heads, 12345.f);
    Tensor tout(out.data(), kBf16, {total_q, heads, 512}), tlse(lse.data(), kF32, {total_q, heads});
    std::vector<int64_t> kv_indptr64(kv_indptr.begin(), kv_indptr.end()), qo64(qo_indptr.begin(), qo_indptr.end()),
        len64(kv_len.begin(), kv_len.end());
    Tensor tkvp64(kv_indptr64.data(), kI64, {batch + 1}), tqo64(qo64.data(), kI64, {batch + 1}),
        tlen64(len64.data(), kI64, {batch});
    return mlacore_mla_decode_backend(tq_nope->p(), tq_pe->p(), separate ? tckv_sep->p() : tckv->p(),
                                      separate ? tkpe_sep->p() : tkpe->p(), int64_indices ? tidx64->p() : tidx->p(),
                                      int64_indices ? tkvp64.p() : tkvp->p(), int64_indices ? tqo64.p() : tqo->p(),
                                      int64_indices ? tlen64.p() : tlen->p(), tmd->p(), tws->p(), tout.p(), tlse.p(),
                                      dims, page_size, 0.0625f, flags, backend, reinterpret_cast<void*>(0x5000));
  }
};

// The split count AITER's heuristic gives (mla.py get_meta_param), for 304 CUs.
int64_t aiter_splits(int64_t batch, int64_t total_kv) {
  double best = -1;
  int64_t pick = 1;
  const double avg = double(total_kv) / double(batch);
  for (int64_t i = 1; i <= 16; ++i) {
    const double occ = double(batch * i) / double((batch * i + 303) / 304 * 304);
    const double score = occ * avg / (avg + 84.1 * double(i));
    if (score > best) best = score, pick = i;
  }
  return std::max<int64_t>(pick, 2);
}

int64_t align256(int64_t x) { return (x + 255) / 256 * 256; }

// Routed vs native on one problem: the fake's log line carries exactly the
// documented arguments, results agree, a second call reuses every buffer.
void check_decode(Decode& d, const Fake& f, int64_t want_splits = 0) {
  std::vector<uint16_t> out_native, out_aiter;
  std::vector<float> lse_native, lse_aiter;
  f.clear();
  CHECK(d.run(MLACORE_BACKEND_NATIVE, out_native, lse_native) == MLACORE_OK);
  CHECK(std::string(f.log()).empty());  // native never calls AITER
  CHECK(d.run(MLACORE_BACKEND_AUTO, out_aiter, lse_aiter) == MLACORE_OK);
  const std::string log = f.log();
  const std::vector<std::string> calls = lines_starting(log, "call ");
  const std::vector<std::string> values = lines_starting(log, "values ");
  CHECK(calls.size() == 1 && values.size() == 1);
  if (calls.size() != 1 || values.size() != 1) {
    std::fprintf(stderr, "log: %s\n", log.c_str());
    return;
  }
  const std::string& line = calls[0];
  const int64_t H = d.heads, M = d.dims.max_qo_len, B = d.batch, rows = B * M;
  const int64_t S = want_splits > 0 ? want_splits : aiter_splits(B, static_cast<int64_t>(d.kv_indices.size()));
  // Workspace sections, in order, each 256-byte aligned (docs/AITER.md).
  const int64_t q_off = 0, o_off = align256(rows * H * 576 * 2), l_off = o_off + align256(rows * S * H * 512 * 4),
                qi_off = l_off + align256(rows * S * H * 4), si_off = qi_off + align256((B + 1) * 4);
  const std::string hs = std::to_string(H), ms = std::to_string(M);
  CHECK(field(line, "Q") == tensor_text(std::to_string(rows) + "," + hs + ",576", std::to_string(H * 576) + ",576,1",
                                        rows * H * 576, 3, d.ws + q_off));
  CHECK(field(line, "KV") == tensor_text(std::to_string(d.pages) + "," + std::to_string(d.page_size) + ",1,576",
                                         std::to_string(d.page_stride) + ",576,576,1", d.pages * d.page_size * 576, 3,
                                         d.cache.data()));
  CHECK(field(line, "qo_indptr") == tensor_text(std::to_string(B + 1), "1", B + 1, 8, d.ws + qi_off));
  CHECK(field(line, "kv_indptr") == tensor_text(std::to_string(B + 1), "1", B + 1, 8, d.kv_indptr.data()));
  CHECK(field(line, "kv_page_indices") == tensor_text(std::to_string(d.kv_indices.size()), "1",
                                                      static_cast<int64_t>(d.kv_indices.size()), 8,
                                                      d.kv_indices.data()));
  CHECK(field(line, "kv_last_page_lens") ==
        tensor_text(std::to_string(B), "1", B, 8, d.schedule.data() + d.last_page_offset()));
  CHECK(field(line, "num_kv_splits_indptr") == tensor_text(std::to_string(B + 1), "1", B + 1, 8, d.ws + si_off));
  CHECK(field(line, "work_meta_data") == "null" && field(line, "work_indptr") == "null" &&
        field(line, "work_info_set") == "null");
  CHECK(field(line, "splitData") == tensor_text(std::to_string(rows) + "," + std::to_string(S) + "," + hs + ",512",
                                                std::to_string(S * H * 512) + "," + std::to_string(H * 512) + ",512,1",
                                                rows * S * H * 512, 4, d.ws + o_off));
  CHECK(field(line, "splitLse") == tensor_text(std::to_string(rows) + "," + std::to_string(S) + "," + hs + ",1",
                                               std::to_string(S * H) + "," + hs + ",1,1", rows * S * H, 4,
                                               d.ws + l_off));
  CHECK(field(line, "lse") == "null" && field(line, "q_scale") == "null" && field(line, "kv_scale") == "null");
  CHECK(field(line, "max_seqlen_q") == ms);
  CHECK(field(line, "page_size") == std::to_string(d.page_size));
  CHECK(field(line, "nhead_kv") == "1");
  char scale[32];
  std::snprintf(scale, sizeof scale, "%a", 0.0625);
  CHECK(field(line, "softmax_scale") == scale);
  CHECK(field(line, "stream") == "0x5000");
  // Index values: the uniform qo_indptr, the caller's kv_indptr, the plan's
  // last-page lengths, b * splits.
  std::vector<int64_t> uniform, splits, last;
  for (int64_t b = 0; b <= B; ++b) uniform.push_back(b * M), splits.push_back(b * S);
  for (int64_t b = 0; b < B; ++b)
    last.push_back(d.kv_len[b] == 0 ? 0 : d.kv_len[b] - (d.kv_indptr[b + 1] - d.kv_indptr[b] - 1) * d.page_size);
  CHECK(values[0] == "values qo_indptr=[" + join(uniform) + "] kv_indptr=[" +
                         join(std::vector<int64_t>(d.kv_indptr.begin(), d.kv_indptr.end())) +
                         "] kv_last_page_lens=[" + join(last) + "] num_kv_splits_indptr=[" + join(splits) + "] ");
  // The query rows: request b's tokens right-aligned in its block of M rows,
  // q_nope | q_pe concatenated, the padding rows zero.
  const auto* qbuf = reinterpret_cast<const uint16_t*>(d.ws + q_off);
  int wrong_q = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = d.qo_indptr[b + 1] - d.qo_indptr[b];
    for (int64_t t = 0; t < M; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t k = 0; k < 576; ++k) {
          const uint16_t got = qbuf[((b * M + t) * H + h) * 576 + k];
          const uint16_t want = t < M - n ? 0 : d.q[((d.qo_indptr[b] + t - (M - n)) * H + h) * 576 + k];
          wrong_q += got != want;
        }
  }
  CHECK(wrong_q == 0);

  // Results: the native kernel's, to float rounding (both accumulate in fp32
  // over different splits); empty requests identical (zeros, -inf).
  double max_err = 0, max_lse_err = 0;
  int nonfinite = 0, lse_inf_mismatch = 0;
  for (int64_t i = 0; i < d.total_q * H; ++i) {
    for (int k = 0; k < 512; ++k) {
      const float a = from_bf16(out_aiter[i * 512 + k]), n = from_bf16(out_native[i * 512 + k]);
      nonfinite += !std::isfinite(a);
      max_err = std::max(max_err, static_cast<double>(std::fabs(a - n)));
    }
    if (std::isinf(lse_native[i]) || std::isinf(lse_aiter[i])) lse_inf_mismatch += lse_native[i] != lse_aiter[i];
    else max_lse_err = std::max(max_lse_err, static_cast<double>(std::fabs(lse_native[i] - lse_aiter[i])));
  }
  std::printf("decode H=%lld page_size=%lld M=%lld splits=%lld: max |aiter - native| out %.2e, lse %.2e\n",
              static_cast<long long>(H), static_cast<long long>(d.page_size), static_cast<long long>(M),
              static_cast<long long>(S), max_err, max_lse_err);
  CHECK(nonfinite == 0);
  CHECK(lse_inf_mismatch == 0);
  CHECK(max_err < 8e-3);
  CHECK(max_lse_err < 1e-4);

  // A second call into the same out/lse: the same buffers everywhere (no
  // allocation per call), the same result.
  const std::vector<uint16_t> out_first = out_aiter;
  const std::vector<float> lse_first = lse_aiter;
  f.clear();
  CHECK(d.run(MLACORE_BACKEND_AITER, out_aiter, lse_aiter) == MLACORE_OK);
  const std::vector<std::string> again = lines_starting(f.log(), "call ");
  CHECK(again.size() == 1 && again[0] == line);
  CHECK(out_aiter == out_first);
  CHECK(std::memcmp(lse_first.data(), lse_aiter.data(), lse_aiter.size() * sizeof(float)) == 0);
}

int run_decode() {
  const Fake f = fake();
  CHECK(f.ok);
  if (!f.ok) return finish("test_aiter_routes decode");

  // 16 heads, one token per request, page size 16: an empty request, a
  // short one, one past the 64-token split granularity, a long one.
  {
    Decode d(16, 16, {1, 1, 1, 1}, {100, 0, 37, 1500});
    check_decode(d, f);
  }
  // 128 heads, MTP: ragged 2/1/2 query tokens (causal), page size 1.
  {
    Decode d(128, 1, {2, 1, 2}, {70, 5, 300});
    check_decode(d, f);
  }
  // 16 heads, 4 query tokens, page size 64.
  {
    Decode d(16, 64, {4, 3}, {300, 64});
    check_decode(d, f);
  }
  // A workspace that holds 5 splits but not 6: the split count shrinks to fit.
  {
    const int64_t rows = 2, H = 16;
    auto bytes = [&](int64_t s) {
      return align256(rows * H * 576 * 2) + align256(rows * s * H * 512 * 4) + align256(rows * s * H * 4) + 256 + 12;
    };
    Decode d(16, 16, {1, 1}, {2000, 3000}, bytes(5));
    CHECK(d.ws_bytes == bytes(5));
    check_decode(d, f, 5);
  }

  // Gates on real calls. Separate ckv/kpe allocations: auto runs native (no
  // copy of the pool is ever made), explicit aiter names the adjacency gate.
  Decode d(16, 16, {1, 1}, {40, 90});
  std::vector<uint16_t> out, out_native;
  std::vector<float> lse, lse_native;
  CHECK(d.run(MLACORE_BACKEND_NATIVE, out_native, lse_native) == MLACORE_OK);
  f.clear();
  CHECK(d.run(MLACORE_BACKEND_AUTO, out, lse, /*separate=*/true) == MLACORE_OK);
  CHECK(out == out_native);
  CHECK(d.run(MLACORE_BACKEND_AITER, out, lse, /*separate=*/true) == MLACORE_ERROR_VALUE);
  CHECK_CONTAINS(mlacore_last_error(), "mla_decode: backend='aiter' cannot run this call: ckv_cache and kpe_cache are "
                                       "not the two halves");
  // int64 index tensors: native under auto, a named gate under aiter.
  CHECK(d.run(MLACORE_BACKEND_AUTO, out, lse, false, /*int64_indices=*/true) == MLACORE_OK);
  CHECK(out == out_native);
  CHECK(d.run(MLACORE_BACKEND_AITER, out, lse, false, true) == MLACORE_ERROR_VALUE);
  CHECK_CONTAINS(mlacore_last_error(), "not all int32 with unit stride");
  // The portable flag means a native kernel.
  CHECK(d.run(MLACORE_BACKEND_AUTO, out, lse, false, false, MLACORE_DECODE_CAUSAL | MLACORE_DECODE_PORTABLE) ==
        MLACORE_OK);
  CHECK(d.run(MLACORE_BACKEND_AITER, out, lse, false, false, MLACORE_DECODE_CAUSAL | MLACORE_DECODE_PORTABLE) ==
        MLACORE_ERROR_VALUE);
  CHECK_CONTAINS(mlacore_last_error(), "MLACORE_DECODE_PORTABLE");
  CHECK(std::string(f.log()).empty());
  // mlacore_mla_decode (no backend argument) is auto: it routes.
  {
    std::vector<uint16_t> o(d.total_q * d.heads * 512);
    Tensor tout(o.data(), kBf16, {d.total_q, d.heads, 512});
    CHECK(mlacore_mla_decode(d.tq_nope->p(), d.tq_pe->p(), d.tckv->p(), d.tkpe->p(), d.tidx->p(), d.tkvp->p(),
                             d.tqo->p(), d.tlen->p(), d.tmd->p(), d.tws->p(), tout.p(), nullptr, d.dims, d.page_size,
                             0.0625f, MLACORE_DECODE_CAUSAL, nullptr) == MLACORE_OK);
    CHECK(lines_starting(f.log(), "call ").size() == 1);
  }
  // One probe however many calls.
  CHECK(f.version_queries() == 1);
  return finish("test_aiter_routes decode");
}

// ---- cache writes --------------------------------------------------------------

struct Append {
  int64_t nnz, page_size = 4, pages = 6, batch = 2;
  std::vector<int32_t> batch_indices, positions, kv_indices{5, 1, 3, 0}, kv_indptr{0, 3, 4}, last{4, 2};
  std::vector<int64_t> slots;  // expected
  std::unique_ptr<Tensor> tbi, tpos, tidx, tptr, tlast;

  explicit Append(int64_t n) : nnz(n) {
    // Tokens of request 0 (positions 0..11) and 1 (0..3), plus three that
    // write nothing: a batch index out of range, a position past the pages,
    // a negative position.
    for (int64_t i = 0; i < nnz; ++i) {
      int32_t b = static_cast<int32_t>(i % 2), p = static_cast<int32_t>((i * 5) % (b == 0 ? 12 : 4));
      if (i == 1) b = 7;
      if (i == 2) b = 1, p = 4;
      if (i == 3) p = -1;
      batch_indices.push_back(b);
      positions.push_back(p);
      int64_t slot = -1;
      if (b >= 0 && b < batch && p >= 0 && p / page_size < kv_indptr[b + 1] - kv_indptr[b])
        slot = kv_indices[kv_indptr[b] + p / page_size] * page_size + p % page_size;
      slots.push_back(slot);
    }
    tbi.reset(new Tensor(batch_indices.data(), kI32, {nnz}));
    tpos.reset(new Tensor(positions.data(), kI32, {nnz}));
    tidx.reset(new Tensor(kv_indices.data(), kI32, {4}));
    tptr.reset(new Tensor(kv_indptr.data(), kI32, {3}));
    tlast.reset(new Tensor(last.data(), kI32, {2}));
  }
};

std::vector<uint16_t> random_bits(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = to_bf16(std::normal_distribution<float>(0.f, 1.f)(rng));
  return v;
}

// Six tokens appended to a combined [6, 4, 576] cache through the C ABI.
struct MlaAppendCase {
  Append a{6};
  std::vector<uint16_t> src, cache;
  Tensor sckv, skpe, ckv, kpe;
  explicit MlaAppendCase(unsigned seed)
      : src(random_bits(6 * 576, seed)),
        cache(6 * 4 * 576, 0),
        sckv(src.data(), kBf16, {6, 512}, {576, 1}),
        skpe(src.data() + 512, kBf16, {6, 64}, {576, 1}),
        ckv(cache.data(), kBf16, {6, 4, 512}, {4 * 576, 576, 1}),
        kpe(cache.data() + 512, kBf16, {6, 4, 64}, {4 * 576, 576, 1}) {}
  mlacore_status run(int32_t backend) {
    return mlacore_append_paged_mla_kv_cache(sckv.p(), skpe.p(), a.tbi->p(), a.tpos->p(), ckv.p(), kpe.p(),
                                             a.tidx->p(), a.tptr->p(), a.tlast->p(), backend, 0, nullptr);
  }
};

// The slot buffer the fake saw: its values are what the native kernel
// would write to, -1 where it writes nothing.
void check_slots(const std::string& line, const Append& a) {
  const std::string text = field(line, "slot_mapping");
  CHECK(text.find("shape=(" + std::to_string(a.nnz) + ") strides=(1) numel=" + std::to_string(a.nnz) +
                  " dtype=12 ") == 0);
  const auto* slots = static_cast<const int64_t*>(ptr_of(text));
  CHECK(slots != nullptr);
  if (slots == nullptr) return;
  int wrong = 0;
  for (int64_t i = 0; i < a.nnz; ++i) wrong += slots[i] != a.slots[i];
  CHECK(wrong == 0);
}

int run_append() {
  const Fake f = fake();
  CHECK(f.ok);
  if (!f.ok) return finish("test_aiter_routes append");
  char one[32];
  std::snprintf(one, sizeof one, "%a", 1.0);

  // MLA into one [P, S, 576] buffer, sources the halves of one [nnz, 576]
  // buffer (row stride 576): concat_and_cache_mla.
  {
    Append a(24);
    const int64_t P = a.pages, S = a.page_size, page_stride = S * 576 + 32;
    const std::vector<uint16_t> src = random_bits(a.nnz * 576, 3), init = random_bits(P * page_stride, 4);
    std::vector<uint16_t> native = init, routed = init, separate_ckv(P * S * 512), separate_kpe(P * S * 64);
    Tensor sckv(const_cast<uint16_t*>(src.data()), kBf16, {a.nnz, 512}, {576, 1}),
        skpe(const_cast<uint16_t*>(src.data()) + 512, kBf16, {a.nnz, 64}, {576, 1});
    auto run = [&](std::vector<uint16_t>& cache, int32_t backend) {
      Tensor ckv(cache.data(), kBf16, {P, S, 512}, {page_stride, 576, 1}),
          kpe(cache.data() + 512, kBf16, {P, S, 64}, {page_stride, 576, 1});
      return mlacore_append_paged_mla_kv_cache(sckv.p(), skpe.p(), a.tbi->p(), a.tpos->p(), ckv.p(), kpe.p(),
                                               a.tidx->p(), a.tptr->p(), a.tlast->p(), backend, 0,
                                               reinterpret_cast<void*>(0x6000));
    };
    f.clear();
    CHECK(run(native, MLACORE_BACKEND_NATIVE) == MLACORE_OK);
    CHECK(std::string(f.log()).empty());
    CHECK(run(routed, MLACORE_BACKEND_AUTO) == MLACORE_OK);
    CHECK(routed == native);
    const std::vector<std::string> calls = lines_starting(f.log(), "concat_and_cache_mla ");
    CHECK(calls.size() == 1);
    if (calls.size() == 1) {
      const std::string& line = calls[0];
      const std::string n = std::to_string(a.nnz);
      CHECK(field(line, "kv_c") == tensor_text(n + ",512", "576,1", a.nnz * 512, 3, src.data()));
      CHECK(field(line, "k_pe") == tensor_text(n + ",64", "576,1", a.nnz * 64, 3, src.data() + 512));
      CHECK(field(line, "kv_cache") == tensor_text("6,4,576", std::to_string(page_stride) + ",576,1", P * S * 576, 3,
                                                   routed.data()));
      check_slots(line, a);
      CHECK(field(line, "scale").find("shape=(1) strides=(1) numel=1 dtype=4 ") == 0);
      CHECK(field(line, "kv_cache_dtype") == "auto");
      CHECK(field(line, "scale_value") == one);
      CHECK(field(line, "stream") == "0x6000");
      // Again: the same slot buffer and scale, no allocation.
      f.clear();
      CHECK(run(routed, MLACORE_BACKEND_AITER) == MLACORE_OK);
      const std::vector<std::string> again = lines_starting(f.log(), "concat_and_cache_mla ");
      CHECK(again.size() == 1 && again[0] == line);
    }
    // Separate allocations: native under auto, the adjacency gate under aiter.
    f.clear();
    Tensor ckv(separate_ckv.data(), kBf16, {P, S, 512}), kpe(separate_kpe.data(), kBf16, {P, S, 64});
    CHECK(mlacore_append_paged_mla_kv_cache(sckv.p(), skpe.p(), a.tbi->p(), a.tpos->p(), ckv.p(), kpe.p(),
                                            a.tidx->p(), a.tptr->p(), a.tlast->p(), MLACORE_BACKEND_AUTO, 0,
                                            nullptr) == MLACORE_OK);
    CHECK(mlacore_append_paged_mla_kv_cache(sckv.p(), skpe.p(), a.tbi->p(), a.tpos->p(), ckv.p(), kpe.p(),
                                            a.tidx->p(), a.tptr->p(), a.tlast->p(), MLACORE_BACKEND_AITER, 0,
                                            nullptr) == MLACORE_ERROR_VALUE);
    CHECK_CONTAINS(mlacore_last_error(), "append_paged_mla_kv_cache: backend='aiter' cannot run this call: ckv_cache "
                                         "and kpe_cache are not the two halves");
    CHECK(std::string(f.log()).empty());
  }

  // K/V caches: two 4-D NHD caches, and one fused [P, 2, S, H, D] cache:
  // reshape_and_cache_flash. HND and float32 stay native.
  for (int fused = 0; fused < 2; ++fused) {
    Append a(20);
    const int64_t P = a.pages, S = a.page_size, H = 2, D = 64;
    const std::vector<uint16_t> key = random_bits(a.nnz * H * D, 5), value = random_bits(a.nnz * H * D, 6);
    const std::vector<uint16_t> init = random_bits(P * 2 * S * H * D, 7);
    std::vector<uint16_t> native = init, routed = init;
    Tensor tkey(const_cast<uint16_t*>(key.data()), kF16, {a.nnz, H, D}),
        tvalue(const_cast<uint16_t*>(value.data()), kF16, {a.nnz, H, D});
    auto run = [&](std::vector<uint16_t>& cache, int32_t backend, int32_t layout) {
      const bool nhd = layout == MLACORE_LAYOUT_NHD;
      const int64_t d1 = nhd ? S : H, d2 = nhd ? H : S;
      if (fused) {
        Tensor kv(cache.data(), kF16, {P, 2, d1, d2, D});
        return mlacore_append_paged_kv_cache(tkey.p(), tvalue.p(), a.tbi->p(), a.tpos->p(), kv.p(), nullptr,
                                             a.tidx->p(), a.tptr->p(), a.tlast->p(), layout, backend, 0, nullptr);
      }
      Tensor k(cache.data(), kF16, {P, d1, d2, D}), v(cache.data() + P * S * H * D, kF16, {P, d1, d2, D});
      return mlacore_append_paged_kv_cache(tkey.p(), tvalue.p(), a.tbi->p(), a.tpos->p(), k.p(), v.p(), a.tidx->p(),
                                           a.tptr->p(), a.tlast->p(), layout, backend, 0, nullptr);
    };
    f.clear();
    CHECK(run(native, MLACORE_BACKEND_NATIVE, MLACORE_LAYOUT_NHD) == MLACORE_OK);
    CHECK(run(routed, MLACORE_BACKEND_AUTO, MLACORE_LAYOUT_NHD) == MLACORE_OK);
    CHECK(routed == native);
    const std::vector<std::string> calls = lines_starting(f.log(), "reshape_and_cache_flash ");
    CHECK(calls.size() == 1);
    if (calls.size() == 1) {
      const std::string& line = calls[0];
      const std::string n = std::to_string(a.nnz), page = std::to_string(fused ? 2 * S * H * D : S * H * D);
      CHECK(field(line, "key") == tensor_text(n + ",2,64", "128,64,1", a.nnz * H * D, 2, key.data()));
      CHECK(field(line, "value") == tensor_text(n + ",2,64", "128,64,1", a.nnz * H * D, 2, value.data()));
      CHECK(field(line, "key_cache") == tensor_text("6,4,2,64", page + ",128,64,1", P * S * H * D, 2, routed.data()));
      CHECK(field(line, "value_cache") == tensor_text("6,4,2,64", page + ",128,64,1", P * S * H * D, 2,
                                                      routed.data() + (fused ? S * H * D : P * S * H * D)));
      check_slots(line, a);
      CHECK(field(line, "k_scale") == field(line, "v_scale"));
      CHECK(field(line, "k_scale_value") == one && field(line, "v_scale_value") == one);
      CHECK(field(line, "kv_cache_dtype") == "auto");
    }
    f.clear();
    CHECK(run(routed, MLACORE_BACKEND_AUTO, MLACORE_LAYOUT_HND) == MLACORE_OK);
    CHECK(run(routed, MLACORE_BACKEND_AITER, MLACORE_LAYOUT_HND) == MLACORE_ERROR_VALUE);
    CHECK_CONTAINS(mlacore_last_error(), "layout HND (AITER's caches are NHD)");
    CHECK(std::string(f.log()).empty());
  }
  {
    Append a(8);
    std::vector<float> key(8 * 2 * 32, 1.f), cache(6 * 2 * 4 * 2 * 32, 0.f);
    Tensor tk(key.data(), kF32, {8, 2, 32}), kv(cache.data(), kF32, {6, 2, 4, 2, 32});
    f.clear();
    CHECK(mlacore_append_paged_kv_cache(tk.p(), tk.p(), a.tbi->p(), a.tpos->p(), kv.p(), nullptr, a.tidx->p(),
                                        a.tptr->p(), a.tlast->p(), MLACORE_LAYOUT_NHD, MLACORE_BACKEND_AUTO, 0,
                                        nullptr) == MLACORE_OK);
    CHECK(std::string(f.log()).empty());
  }
  {
    // Sources whose heads are padded apart: native under auto, the gate named under aiter.
    Append a(8);
    std::vector<uint16_t> key(8 * 2 * 128, 0x3c00), cache(6 * 2 * 4 * 2 * 64, 0);
    Tensor tk(key.data(), kF16, {8, 2, 64}, {256, 128, 1}), kv(cache.data(), kF16, {6, 2, 4, 2, 64});
    f.clear();
    CHECK(mlacore_append_paged_kv_cache(tk.p(), tk.p(), a.tbi->p(), a.tpos->p(), kv.p(), nullptr, a.tidx->p(),
                                        a.tptr->p(), a.tlast->p(), MLACORE_LAYOUT_NHD, MLACORE_BACKEND_AUTO, 0,
                                        nullptr) == MLACORE_OK);
    CHECK(mlacore_append_paged_kv_cache(tk.p(), tk.p(), a.tbi->p(), a.tpos->p(), kv.p(), nullptr, a.tidx->p(),
                                        a.tptr->p(), a.tlast->p(), MLACORE_LAYOUT_NHD, MLACORE_BACKEND_AITER, 0,
                                        nullptr) == MLACORE_ERROR_VALUE);
    CHECK_CONTAINS(mlacore_last_error(), "append_key/append_value do not keep a token's heads dense");
    CHECK(std::string(f.log()).empty());
  }
  CHECK(f.version_queries() == 1);
  return finish("test_aiter_routes append");
}

// Appends through a library without the shim's cache writes: decode still
// routes; the appends stay native under auto and fail under aiter, naming
// the missing symbol.
int run_decode_only() {
  const Fake f = fake();
  CHECK(f.ok);
  if (!f.ok) return finish("test_aiter_routes decode_only");
  int32_t abi = -1;
  const char* path = nullptr;
  uint32_t entries = 0;
  CHECK(mlacore_aiter_library_info(&abi, &path, &entries) == MLACORE_OK);
  CHECK(abi == 1 && entries == MLACORE_AITER_ENTRY_DECODE);
  for (int32_t op : {MLACORE_ROUTE_APPEND_MLA, MLACORE_ROUTE_APPEND_KV}) {
    const mlacore_route_request r = append_request(op);
    const char* symbol = op == MLACORE_ROUTE_APPEND_MLA ? "aiter_concat_and_cache_mla" : "aiter_reshape_and_cache_flash";
    expect_refused(r, "native: auto, the AITER library lacks ", MLACORE_ERROR_RUNTIME,
                   "backend='aiter': the AITER library lacks ", symbol);
  }
  MlaAppendCase append(8);
  CHECK(append.run(MLACORE_BACKEND_AUTO) == MLACORE_OK);
  CHECK(std::string(f.log()).empty());
  Decode d(16, 16, {1, 1}, {40, 90});
  check_decode(d, f);
  return finish("test_aiter_routes decode_only");
}

// A library that is missing, corrupt, of another version or without the
// decode entry point: auto never raises and runs native; explicit aiter is
// a RuntimeError carrying the probe's reason.
int run_fallback(const char* reason) {
  Decode d(16, 16, {1, 1}, {40, 90});
  std::vector<uint16_t> out, out_native;
  std::vector<float> lse, lse_native;
  CHECK(d.run(MLACORE_BACKEND_NATIVE, out_native, lse_native) == MLACORE_OK);
  CHECK(d.run(MLACORE_BACKEND_AUTO, out, lse) == MLACORE_OK);
  CHECK(out == out_native);
  CHECK(d.run(MLACORE_BACKEND_AITER, out, lse) == MLACORE_ERROR_RUNTIME);
  CHECK_CONTAINS(mlacore_last_error(), "mla_decode: backend='aiter': AITER unavailable: ");
  CHECK_CONTAINS(mlacore_last_error(), reason);

  Append a(6);
  const std::vector<uint16_t> src = random_bits(6 * 576, 9);
  std::vector<uint16_t> cache(6 * 4 * 576, 0), cache_native(6 * 4 * 576, 0);
  Tensor sckv(const_cast<uint16_t*>(src.data()), kBf16, {6, 512}, {576, 1}),
      skpe(const_cast<uint16_t*>(src.data()) + 512, kBf16, {6, 64}, {576, 1});
  for (int32_t backend : {MLACORE_BACKEND_NATIVE, MLACORE_BACKEND_AUTO, MLACORE_BACKEND_AITER}) {
    std::vector<uint16_t>& c = backend == MLACORE_BACKEND_NATIVE ? cache_native : cache;
    Tensor ckv(c.data(), kBf16, {6, 4, 512}, {4 * 576, 576, 1}), kpe(c.data() + 512, kBf16, {6, 4, 64}, {4 * 576, 576, 1});
    const mlacore_status st = mlacore_append_paged_mla_kv_cache(sckv.p(), skpe.p(), a.tbi->p(), a.tpos->p(), ckv.p(),
                                                                kpe.p(), a.tidx->p(), a.tptr->p(), a.tlast->p(),
                                                                backend, 0, nullptr);
    CHECK(st == (backend == MLACORE_BACKEND_AITER ? MLACORE_ERROR_RUNTIME : MLACORE_OK));
  }
  CHECK(cache == cache_native);
  CHECK_CONTAINS(mlacore_last_error(), reason);
  int32_t available = 1;
  const char* why = nullptr;
  CHECK(mlacore_backend_info("aiter", &available, &why) == MLACORE_OK);
  CHECK(available == 0);
  CHECK_CONTAINS(why, reason);
  int32_t abi = -1;
  const char* path = nullptr;
  uint32_t entries = 7;
  CHECK(mlacore_aiter_library_info(&abi, &path, &entries) == MLACORE_OK);
  CHECK(entries == 0);
  return finish("test_aiter_routes fallback");
}

// Without the test hook the CPU is never "a HIP device".
int run_no_contract() {
  const Fake f = fake();
  CHECK(f.ok);
  if (!f.ok) return finish("test_aiter_routes no_contract");
  Decode d(16, 16, {1, 1}, {40, 90});
  std::vector<uint16_t> out;
  std::vector<float> lse;
  CHECK(d.run(MLACORE_BACKEND_AUTO, out, lse) == MLACORE_OK);
  CHECK(d.run(MLACORE_BACKEND_AITER, out, lse) == MLACORE_ERROR_VALUE);
  CHECK_CONTAINS(mlacore_last_error(), "not a HIP device (the cache is on cpu)");
  CHECK(std::string(f.log()).empty());
  int32_t abi = -1;
  const char* path = nullptr;
  uint32_t entries = 0;
  CHECK(mlacore_aiter_library_info(&abi, &path, &entries) == MLACORE_OK);
  CHECK(abi == 1);
  CHECK(entries == (MLACORE_AITER_ENTRY_DECODE | MLACORE_AITER_ENTRY_CONCAT_MLA | MLACORE_AITER_ENTRY_RESHAPE_FLASH));
  CHECK(std::strcmp(path, std::getenv("MLACORE_AITER_LIB")) == 0);
  return finish("test_aiter_routes no_contract");
}

// A shim that reports failure: the append raises instead of passing silently.
int run_write_fails() {
  MlaAppendCase append(10);
  CHECK(append.run(MLACORE_BACKEND_AUTO) == MLACORE_ERROR_RUNTIME);
  CHECK_CONTAINS(mlacore_last_error(), "append_paged_mla_kv_cache: AITER's aiter_concat_and_cache_mla failed (status 7)");
  return finish("test_aiter_routes write_fails");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "gates") return run_gates();
  if (mode == "decode") return run_decode();
  if (mode == "append") return run_append();
  if (mode == "decode_only") return run_decode_only();
  if (mode == "fallback" && argc == 3) return run_fallback(argv[2]);
  if (mode == "no_contract") return run_no_contract();
  if (mode == "write_fails") return run_write_fails();
  std::fprintf(stderr, "usage: test_aiter_routes gates | decode | append | decode_only | fallback <reason> | "
                       "no_contract | write_fails\n");
  return 2;
}
