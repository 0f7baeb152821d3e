// The one place that decides which backend runs a call. Ops describe the call
// (mlacore_route_request, filled from their validated tensors) and get back a
// backend and the reason for it; explicit requests that cannot be honoured
// throw here, so every op fails with the same messages.
#pragma once

#include <mlacore/backend.h>

#include <string>

namespace mlacore {

enum class Backend : int32_t { Auto = MLACORE_BACKEND_AUTO, Native = MLACORE_BACKEND_NATIVE, Aiter = MLACORE_BACKEND_AITER };

struct Route {
  Backend backend;
  std::string why;
};

struct Probe {
  bool available;
  std::string reason;  // why not, when unavailable
};

// Probed once per process, thread-safe; never throws.
const Probe& aiter_probe();

// Test hook for the contract test only: MLACORE_AITER_CPU_CONTRACT=1 in the
// environment (read once per process) lets the device gate accept CPU
// tensors, so tests/cpp/test_aiter_routes.cpp drives the AITER routes
// against the fake AITER of tests/cpp/fake_aiter.cpp on the host. Real AITER
// kernels read device memory: never set it outside that test.
bool aiter_cpu_contract();

// value_error unless `requested` is an mlacore_backend.
Backend parse_backend(int32_t requested);

// What every op states about a call: the op, the device and dtype of its
// anchor tensor (the cache), the layout, the page size and the head dims.
// Op-specific fields are the caller's to fill.
inline mlacore_route_request describe_call(int32_t op, const DLTensor& anchor, int32_t layout, int64_t page_size,
                                           int64_t head_dim, int64_t head_dim_pe) {
  mlacore_route_request r{};
  r.op = op;
  r.device_type = anchor.device.device_type;
  r.dtype = anchor.dtype;
  r.layout = layout;
  r.page_size = page_size;
  r.head_dim = head_dim;
  r.head_dim_pe = head_dim_pe;
  return r;
}

// Auto: AITER when its gates pass and it is available, else native.
// Native: always native. Aiter: value_error naming the first failed gate,
// runtime_error "AITER unavailable: <reason>" when the probe failed.
// `explain` false leaves Route::why empty: ops on the hot path format no
// strings unless they fail.
Route route(const mlacore_route_request& request, Backend requested, bool explain = true);

}  // namespace mlacore
