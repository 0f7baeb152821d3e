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

// Auto: AITER when its gates pass and it is available, else native.
// Native: always native. Aiter: value_error naming the first failed gate,
// runtime_error "AITER unavailable: <reason>" when the probe failed.
// `explain` false leaves Route::why empty: ops on the hot path format no
// strings unless they fail.
Route route(const mlacore_route_request& request, Backend requested, bool explain = true);

}  // namespace mlacore
