// Contract test for the AITER runtime loader (core/src/backends/aiter/aiter_loader.cpp).
// One process per case, since the probe runs once per process: meson runs
// this driver several times with MLACORE_AITER_LIB pointing at a fake AITER
// build (tests/cpp/fake_aiter.cpp), a corrupt file or nothing.
//
//   test_aiter_loader probe <0|1> <reason substring>   the probe's answer
//   test_aiter_loader contract                          good fake: once-only load, round trip
//   test_aiter_loader handover <lib> <0|1> <substring>  mlacore_aiter_set_library, env first
//   test_aiter_loader convert                           DLTensor -> aiter_tensor_t
//
// This file also compiles aiter_loader.cpp itself (libmlacore keeps the
// resolved entry point hidden), so the process holds two loaders: the
// library's, reached through the C ABI, and this driver's.
#include <dlfcn.h>
#include <mlacore/backend.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "backends/aiter/aiter_loader.h"
#include "check.h"

namespace {

constexpr int kThreads = 16;

mlacore_route_request aiter_shaped_request(int32_t device_type) {
  mlacore_route_request r{};
  r.op = MLACORE_ROUTE_APPEND_MLA;
  r.device_type = device_type;
  r.dtype = {kDLBfloat, 16, 1};
  r.layout = MLACORE_LAYOUT_NHD;
  r.page_size = 1;
  r.head_dim = 512;
  r.head_dim_pe = 64;
  r.adjacent = 1;
  return r;
}

// Races the library's probe from 16 threads; every answer must be the same,
// down to the cached reason's address.
void check_probe_race(int expect_available, const char* expect_reason) {
  std::vector<int32_t> avail(kThreads, -1);
  std::vector<const char*> reasons(kThreads, nullptr);
  std::vector<mlacore_status> status(kThreads, MLACORE_ERROR_RUNTIME);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] { status[i] = mlacore_backend_info("aiter", &avail[i], &reasons[i]); });
  for (auto& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i) {
    CHECK(status[i] == MLACORE_OK);
    CHECK(avail[i] == expect_available);
    CHECK(reasons[i] == reasons[0]);
  }
  CHECK(reasons[0] != nullptr);
  if (reasons[0] == nullptr) return;
  std::printf("probe: available=%d reason=\"%s\"\n", avail[0], reasons[0]);
  if (expect_available) CHECK(std::strcmp(reasons[0], "") == 0);
  else CHECK_CONTAINS(reasons[0], expect_reason);

  // The driver's own loader copy reaches the same verdict.
  const mlacore::AiterLibrary& lib = mlacore::aiter_library();
  CHECK(lib.loaded == (expect_available != 0));
  CHECK(lib.reason == reasons[0]);
  CHECK(lib.loaded == (lib.mla_decode_stage1 != nullptr));
}

// Routing with the probe's answer: auto never fails, and picks AITER for a
// ROCm cache exactly when the library loaded (the good fake exports the
// cache writes too); an explicit "aiter" fails naming why, or routes.
// (tests/cpp/test_aiter_routes.cpp checks the routes themselves.)
void check_routing(int available, const char* reason) {
  for (int32_t dev : {static_cast<int32_t>(kDLROCM), static_cast<int32_t>(kDLCPU), static_cast<int32_t>(kDLCUDA)}) {
    const mlacore_route_request r = aiter_shaped_request(dev);
    int32_t chosen = -1;
    char why[512] = {};
    CHECK(mlacore_route(&r, MLACORE_BACKEND_AUTO, &chosen, why, sizeof why) == MLACORE_OK);
    CHECK(chosen == (dev == kDLROCM && available ? MLACORE_BACKEND_AITER : MLACORE_BACKEND_NATIVE));
    if (dev == kDLROCM) {
      if (available) CHECK(std::strcmp(why, "aiter: auto, all gates passed") == 0);
      else CHECK_CONTAINS(why, reason);
    }
  }
  const mlacore_route_request r = aiter_shaped_request(kDLROCM);
  int32_t chosen = -1;
  if (available) {
    CHECK(mlacore_route(&r, MLACORE_BACKEND_AITER, &chosen, nullptr, 0) == MLACORE_OK);
    CHECK(chosen == MLACORE_BACKEND_AITER);
  } else {
    CHECK(mlacore_route(&r, MLACORE_BACKEND_AITER, &chosen, nullptr, 0) == MLACORE_ERROR_RUNTIME);
    CHECK_CONTAINS(mlacore_last_error(), "backend='aiter': AITER unavailable: ");
    CHECK_CONTAINS(mlacore_last_error(), reason);
  }
  // A gate still comes first: a CPU cache is a ValueError naming the device.
  const mlacore_route_request cpu = aiter_shaped_request(kDLCPU);
  CHECK(mlacore_route(&cpu, MLACORE_BACKEND_AITER, &chosen, nullptr, 0) == MLACORE_ERROR_VALUE);
  CHECK_CONTAINS(mlacore_last_error(), "not a HIP device");
}

int run_probe(int expect_available, const char* expect_reason) {
  check_probe_race(expect_available, expect_reason);
  check_routing(expect_available, expect_reason);
  return finish("test_aiter_loader probe");
}

DLTensor cpu_tensor(void* data, DLDataType dtype, std::vector<int64_t>& shape, std::vector<int64_t>* strides,
                    uint64_t byte_offset = 0) {
  DLTensor t{};
  t.data = data;
  t.device = {kDLCPU, 0};
  t.ndim = static_cast<int32_t>(shape.size());
  t.dtype = dtype;
  t.shape = shape.data();
  t.strides = strides != nullptr ? strides->data() : nullptr;
  t.byte_offset = byte_offset;
  return t;
}

aiter_tensor_t convert(const DLTensor& t) {
  aiter_tensor_t out;
  std::string why;
  const bool ok = mlacore::to_aiter_tensor(t, &out, &why);
  if (!ok) std::fprintf(stderr, "to_aiter_tensor: %s\n", why.c_str());
  CHECK(ok);
  return out;
}

std::string expect(const char* name, const char* shape, const char* strides, size_t numel, int dtype,
                   const void* ptr) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s{shape=(%s) strides=(%s) numel=%zu dtype=%d dev=0 ptr=%p} ", name, shape,
                strides, numel, dtype, ptr);
  return buf;
}

int run_contract() {
  const char* path = std::getenv("MLACORE_AITER_LIB");
  CHECK(path != nullptr);
  if (path == nullptr) return finish("test_aiter_loader contract");

  // The library's loader, raced: one load, so one version query.
  check_probe_race(1, "");
  void* fake = dlopen(path, RTLD_NOW | RTLD_NOLOAD);  // the handle the loaders opened
  CHECK(fake != nullptr);
  if (fake == nullptr) return finish("test_aiter_loader contract");
  auto queries = reinterpret_cast<int (*)()>(dlsym(fake, "fake_aiter_version_queries"));
  auto log = reinterpret_cast<const char* (*)()>(dlsym(fake, "fake_aiter_log"));
  CHECK(queries != nullptr && log != nullptr);
  if (queries == nullptr || log == nullptr) return finish("test_aiter_loader contract");
  // check_probe_race also ran the driver's loader once: two loaders, two
  // queries, however many threads asked.
  CHECK(queries() == 2);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) threads.emplace_back([] { (void)mlacore::aiter_library(); });
  for (auto& t : threads) t.join();
  CHECK(queries() == 2);
  check_routing(1, "");

  const mlacore::AiterLibrary& lib = mlacore::aiter_library();
  CHECK(lib.loaded && lib.abi_version == 1 && lib.path == path);
  CHECK(lib.concat_and_cache_mla != nullptr && lib.reshape_and_cache_flash != nullptr);  // the optional ones
  if (lib.mla_decode_stage1 == nullptr) return finish("test_aiter_loader contract");

  // A decode-shaped call on CPU memory: q [2,16,576] contiguous (NULL
  // strides); kv [4 pages, 16, 1, 576] with padded pages and a byte offset;
  // int32 indptrs, strided int64 page indices, and an output whose heads
  // are the outer storage dim, so the fake's writes must follow strides.
  const DLDataType bf16{kDLBfloat, 16, 1}, f32{kDLFloat, 32, 1}, i32{kDLInt, 32, 1}, i64{kDLInt, 64, 1};
  std::vector<uint16_t> q(2 * 16 * 576), kv(64 + 4 * (16 * 576 + 64));
  std::vector<int32_t> qo_indptr{0, 1, 2}, kv_indptr{0, 2, 3}, last{16, 7};
  std::vector<int64_t> pages{3, -1, 0, -1, 2};  // every other entry used
  std::vector<float> out(2 * 16 * 512, -1.0f), lse(2 * 16, 0.0f);
  std::vector<int64_t> q_shape{2, 16, 576}, kv_shape{4, 16, 1, 576}, kv_strides{16 * 576 + 64, 576, 576, 1},
      ind_shape{3}, pages_shape{3}, pages_strides{2}, last_shape{2}, out_shape{2, 16, 512}, out_strides{512, 1024, 1},
      lse_shape{2, 16};
  const uint64_t kv_offset = 64 * sizeof(uint16_t);
  DLTensor dq = cpu_tensor(q.data(), bf16, q_shape, nullptr);
  DLTensor dkv = cpu_tensor(kv.data(), bf16, kv_shape, &kv_strides, kv_offset);
  DLTensor dqo = cpu_tensor(qo_indptr.data(), i32, ind_shape, nullptr);
  DLTensor dkvp = cpu_tensor(kv_indptr.data(), i32, ind_shape, nullptr);
  DLTensor dpages = cpu_tensor(pages.data(), i64, pages_shape, &pages_strides);
  DLTensor dlast = cpu_tensor(last.data(), i32, last_shape, nullptr);
  DLTensor dout = cpu_tensor(out.data(), f32, out_shape, &out_strides);
  DLTensor dlse = cpu_tensor(lse.data(), f32, lse_shape, nullptr);
  aiter_tensor_t aq = convert(dq), akv = convert(dkv), aqo = convert(dqo), akvp = convert(dkvp),
                 apages = convert(dpages), alast = convert(dlast), aout = convert(dout), alse = convert(dlse);

  const float scale = 0.041666668f;  // 1/sqrt(576) in float
  auto stream = reinterpret_cast<aiter_stream_t>(static_cast<uintptr_t>(0x5000));  // carried, never dereferenced
  lib.mla_decode_stage1(&aq, &akv, &aqo, &akvp, &apages, &alast, nullptr, nullptr, nullptr, nullptr,
                        /*max_seqlen_q=*/1, /*page_size=*/16, /*nhead_kv=*/1, scale, nullptr, nullptr, &aout, &alse,
                        nullptr, nullptr, stream);

  std::string want = "call ";
  want += expect("Q", "2,16,576", "9216,576,1", 18432, AITER_DTYPE_bf16, q.data());
  want += expect("KV", "4,16,1,576", "9280,576,576,1", 36864, AITER_DTYPE_bf16, kv.data() + 64);
  want += expect("qo_indptr", "3", "1", 3, AITER_DTYPE_i32, qo_indptr.data());
  want += expect("kv_indptr", "3", "1", 3, AITER_DTYPE_i32, kv_indptr.data());
  want += expect("kv_page_indices", "3", "2", 3, AITER_DTYPE_i64, pages.data());
  want += expect("kv_last_page_lens", "2", "1", 2, AITER_DTYPE_i32, last.data());
  want += "num_kv_splits_indptr=null work_meta_data=null work_indptr=null work_info_set=null splitData=null "
          "splitLse=null ";
  want += expect("output", "2,16,512", "512,1024,1", 16384, AITER_DTYPE_fp32, out.data());
  want += expect("lse", "2,16", "16,1", 32, AITER_DTYPE_fp32, lse.data());
  char tail[160];
  std::snprintf(tail, sizeof tail, "q_scale=null kv_scale=null max_seqlen_q=1 page_size=16 nhead_kv=1 "
                "softmax_scale=%a stream=%p\n", static_cast<double>(scale), static_cast<void*>(stream));
  want += tail;
  const std::string got = log();
  if (got != want) std::fprintf(stderr, "log:  %s\nwant: %s", got.c_str(), want.c_str());
  CHECK(got == want);

  // The fake wrote i + page_size at row-major element i of output [b, h, d],
  // stored at b*512 + h*1024 + d.
  int wrong = 0;
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < 16; ++h)
      for (int d = 0; d < 512; ++d)
        wrong += out[b * 512 + h * 1024 + d] != static_cast<float>((b * 16 + h) * 512 + d + 16);
  CHECK(wrong == 0);
  return finish("test_aiter_loader contract");
}

// mlacore_aiter_set_library before the probe; MLACORE_AITER_LIB still wins.
int run_handover(const char* lib, int expect_available, const char* expect_reason) {
  CHECK(mlacore_aiter_set_library(nullptr) == MLACORE_ERROR_TYPE);
  CHECK(mlacore_aiter_set_library(lib) == MLACORE_OK);
  CHECK(mlacore::aiter_set_library_path(lib, nullptr));  // the driver's loader copy too
  check_probe_race(expect_available, expect_reason);
  // The answer is cached: a later hand-over is refused, not silently ignored.
  CHECK(mlacore_aiter_set_library(lib) == MLACORE_ERROR_RUNTIME);
  CHECK_CONTAINS(mlacore_last_error(), "the AITER probe already ran");
  std::string why;
  CHECK(!mlacore::aiter_set_library_path(lib, &why));
  CHECK_CONTAINS(why.c_str(), "already ran");
  return finish("test_aiter_loader handover");
}

void check_convert_fails(DLTensor t, const char* expect_why) {
  aiter_tensor_t out;
  std::string why;
  CHECK(!mlacore::to_aiter_tensor(t, &out, &why));
  CHECK_CONTAINS(why.c_str(), expect_why);
}

int run_convert() {
  // A ROCm tensor (never dereferenced here): device id and byte offset carry.
  std::vector<int64_t> shape{4, 16, 1, 576};
  DLTensor t{};
  t.data = reinterpret_cast<void*>(static_cast<uintptr_t>(0x10000));
  t.device = {kDLROCM, 3};
  t.ndim = 4;
  t.dtype = {kDLBfloat, 16, 1};
  t.shape = shape.data();
  t.byte_offset = 128;
  aiter_tensor_t a = convert(t);
  CHECK(a.ptr == reinterpret_cast<void*>(static_cast<uintptr_t>(0x10080)));
  CHECK(a.numel_ == 4u * 16u * 576u && a.ndim == 4 && a.device_id == 3 && a.dtype_ == AITER_DTYPE_bf16);
  const int64_t want_strides[4] = {9216, 576, 576, 1};
  for (int i = 0; i < 4; ++i) CHECK(a.shape[i] == shape[i] && a.strides[i] == want_strides[i]);
  for (int i = 4; i < MLACORE_AITER_MAX_DIMS; ++i) CHECK(a.shape[i] == 0 && a.strides[i] == 0);

  // Every mapped dtype.
  struct Pair { DLDataType dl; AiterDtype aiter; };
  const Pair pairs[] = {{{kDLFloat, 16, 1}, AITER_DTYPE_fp16}, {{kDLBfloat, 16, 1}, AITER_DTYPE_bf16},
                        {{kDLFloat, 32, 1}, AITER_DTYPE_fp32}, {{kDLInt, 8, 1}, AITER_DTYPE_i8},
                        {{kDLInt, 16, 1}, AITER_DTYPE_i16},    {{kDLInt, 32, 1}, AITER_DTYPE_i32},
                        {{kDLInt, 64, 1}, AITER_DTYPE_i64},    {{kDLUInt, 8, 1}, AITER_DTYPE_u8},
                        {{kDLUInt, 32, 1}, AITER_DTYPE_u32},   {{kDLUInt, 64, 1}, AITER_DTYPE_u64}};
  for (const Pair& p : pairs) {
    DLTensor u = t;
    u.dtype = p.dl;
    CHECK(convert(u).dtype_ == p.aiter);
  }

  // Zero-size with no data is fine; a zero dim does not zero the strides.
  std::vector<int64_t> empty_shape{0, 8};
  DLTensor e = t;
  e.data = nullptr;
  e.byte_offset = 0;
  e.ndim = 2;
  e.shape = empty_shape.data();
  aiter_tensor_t ae = convert(e);
  CHECK(ae.ptr == nullptr && ae.numel_ == 0 && ae.strides[0] == 8 && ae.strides[1] == 1);

  // Refusals.
  DLTensor bad = t;
  bad.dtype = {kDLFloat8_e4m3fnuz, 8, 1};
  check_convert_fails(bad, "got DLPack dtype (code 11, bits 8, lanes 1)");
  bad = t;
  bad.dtype = {kDLFloat, 64, 1};
  check_convert_fails(bad, "got DLPack dtype (code 2, bits 64");
  bad = t;
  bad.dtype = {kDLBfloat, 16, 2};
  check_convert_fails(bad, "lanes 2");
  bad = t;
  bad.device = {kDLCUDA, 0};
  check_convert_fails(bad, "got DLPack device type 2");
  std::vector<int64_t> nine(9, 1);
  bad = t;
  bad.ndim = 9;
  bad.shape = nine.data();
  check_convert_fails(bad, "expected at most 8 dims (aiter_tensor_t's limit), got 9");
  std::vector<int64_t> negative{4, -1};
  bad = t;
  bad.ndim = 2;
  bad.shape = negative.data();
  check_convert_fails(bad, "got shape (4, -1)");
  bad = t;
  bad.data = nullptr;
  check_convert_fails(bad, "expected data for a non-empty tensor");
  CHECK(!mlacore::to_aiter_tensor(t, nullptr, nullptr));
  return finish("test_aiter_loader convert");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "probe" && argc == 4) return run_probe(std::atoi(argv[2]), argv[3]);
  if (mode == "contract") return run_contract();
  if (mode == "handover" && argc == 5) return run_handover(argv[2], std::atoi(argv[3]), argv[4]);
  if (mode == "convert") return run_convert();
  std::fprintf(stderr, "usage: test_aiter_loader probe <0|1> <reason> | contract | handover <lib> <0|1> <reason> | "
                       "convert\n");
  return 2;
}
