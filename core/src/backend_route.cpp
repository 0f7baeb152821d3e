#include "backend_route.h"

#include <cstring>

#include "aiter_loader.h"
#include "error.h"
#include "tensor.h"

namespace mlacore {
namespace {

const char* op_name(int32_t op) {
  switch (op) {
    case MLACORE_ROUTE_APPEND_MLA: return "append_paged_mla_kv_cache";
    case MLACORE_ROUTE_APPEND_KV: return "append_paged_kv_cache";
    default: return nullptr;
  }
}

const char* device_name(int32_t type) {
  switch (type) {
    case kDLCPU: case kDLCUDAHost: case kDLROCMHost: return "cpu";
    case kDLCUDA: case kDLCUDAManaged: return "cuda";
    case kDLROCM: return "rocm";
    default: return "an unknown device";
  }
}

enum class Gate { Pass, Device, DType, Layout, PageSize, HeadDims, NotAdjacent, NotDense };

// The first gate AITER's kernels for this op do not pass. Explicit "aiter"
// and auto apply the same gates, so auto never routes a call that an
// explicit request would refuse. Cheap: no strings until one is needed.
Gate aiter_gate(const mlacore_route_request& r) {
  if (r.device_type != kDLROCM) return Gate::Device;
  const DType dt = dtype_of(r.dtype);
  if (dt != DType::BF16 && dt != DType::F16) return Gate::DType;
  if (r.layout != MLACORE_LAYOUT_NHD) return Gate::Layout;
  if (r.page_size < 1 || (r.page_size & (r.page_size - 1)) != 0) return Gate::PageSize;
  if (r.op == MLACORE_ROUTE_APPEND_MLA) {
    if (r.head_dim != 512 || r.head_dim_pe != 64) return Gate::HeadDims;
    // concat_and_cache_mla writes one [P, S, 576] buffer; separate ckv and
    // kpe allocations have no such view.
    if (!r.adjacent) return Gate::NotAdjacent;
  } else if (!r.adjacent) {
    // reshape_and_cache_flash implies the token stride from heads*head_dim.
    return Gate::NotDense;
  }
  return Gate::Pass;
}

std::string describe(Gate g, const mlacore_route_request& r) {
  switch (g) {
    case Gate::Pass: return "all gates passed";
    case Gate::Device: return cat("not a HIP device (the cache is on ", device_name(r.device_type), ")");
    case Gate::DType:
      return cat("dtype ", dtype_name(dtype_of(r.dtype)), " (AITER's cache writes take bfloat16 or float16)");
    case Gate::Layout: return "layout HND (AITER's caches are NHD)";
    case Gate::PageSize: return cat("page_size ", r.page_size, " is not a power of two");
    case Gate::HeadDims: return cat("head dims ", r.head_dim, "+", r.head_dim_pe, " (AITER's MLA cache is 512+64)");
    case Gate::NotAdjacent:
      return "ckv_cache and kpe_cache are not the two halves of one [pages, page_size, 576] buffer";
    case Gate::NotDense: return "the cache's token stride is not dense (heads*head_dim)";
  }
  return "unknown gate";
}

// The probe says only whether AITER's library loaded (in any build, so the
// contract test runs without HIP); whether a call may use it is the gates'.
Probe run_aiter_probe() {
  const AiterLibrary& lib = aiter_library();
  return {lib.loaded, lib.reason};
}

// The ops whose AITER path is wired. None yet: the loader landed first, so a
// loaded AITER must not route a call into code that does not exist.
bool aiter_route_wired(int32_t /*op*/) { return false; }

}  // namespace

const Probe& aiter_probe() {
  // A function-local static: initialized once, thread-safe, and a failure is
  // cached like a success.
  static const Probe probe = run_aiter_probe();
  return probe;
}

Backend parse_backend(int32_t requested) {
  switch (requested) {
    case MLACORE_BACKEND_AUTO: return Backend::Auto;
    case MLACORE_BACKEND_NATIVE: return Backend::Native;
    case MLACORE_BACKEND_AITER: return Backend::Aiter;
    default: value_error("backend: expected auto (0), native (1) or aiter (2), got ", requested);
  }
}

Route route(const mlacore_route_request& request, Backend requested, bool explain) {
  const char* op = op_name(request.op);
  if (op == nullptr) value_error("route: unknown op ", request.op);
  if (requested == Backend::Native) return {Backend::Native, explain ? "native: requested" : ""};

  const Gate gate = aiter_gate(request);
  const Probe& aiter = aiter_probe();
  if (requested == Backend::Aiter) {
    if (gate != Gate::Pass) value_error(op, ": backend='aiter' cannot run this call: ", describe(gate, request));
    if (!aiter.available) runtime_error(op, ": backend='aiter': AITER unavailable: ", aiter.reason);
    if (!aiter_route_wired(request.op))
      runtime_error(op, ": backend='aiter': AITER loaded, but mlacore does not route ", op, " to it yet");
    return {Backend::Aiter, explain ? "aiter: requested" : ""};
  }
  if (gate != Gate::Pass)
    return {Backend::Native, explain ? cat("native: auto, AITER gate failed: ", describe(gate, request)) : ""};
  if (!aiter.available)
    return {Backend::Native, explain ? cat("native: auto, AITER unavailable: ", aiter.reason) : ""};
  if (!aiter_route_wired(request.op))
    return {Backend::Native,
            explain ? cat("native: auto, AITER loaded, but mlacore does not route ", op, " to it yet") : ""};
  return {Backend::Aiter, explain ? "aiter: auto, all gates passed" : ""};
}

}  // namespace mlacore

extern "C" {

MLACORE_API mlacore_status mlacore_route(const mlacore_route_request* request, int32_t requested, int32_t* chosen,
                                         char* why, size_t why_size) {
  return mlacore::guarded([&] {
    if (request == nullptr) mlacore::type_error("request: expected a mlacore_route_request, got NULL");
    if (chosen == nullptr) mlacore::type_error("chosen: expected a pointer, got NULL");
    const mlacore::Route r = mlacore::route(*request, mlacore::parse_backend(requested));
    *chosen = static_cast<int32_t>(r.backend);
    if (why != nullptr && why_size > 0) {
      const size_t n = r.why.size() < why_size - 1 ? r.why.size() : why_size - 1;
      std::memcpy(why, r.why.data(), n);
      why[n] = '\0';
    }
  });
}

MLACORE_API mlacore_status mlacore_aiter_set_library(const char* path) {
  return mlacore::guarded([&] {
    if (path == nullptr) mlacore::type_error("path: expected a library path, got NULL");
    std::string why;
    if (!mlacore::aiter_set_library_path(path, &why)) mlacore::runtime_error("mlacore_aiter_set_library: ", why);
  });
}

MLACORE_API mlacore_status mlacore_backend_info(const char* name, int32_t* available, const char** reason) {
  return mlacore::guarded([&] {
    if (name == nullptr || available == nullptr || reason == nullptr)
      mlacore::type_error("mlacore_backend_info: expected non-NULL name, available and reason");
    if (std::strcmp(name, "native") == 0) {
      *available = 1;
      *reason = "";
    } else if (std::strcmp(name, "aiter") == 0) {
      const mlacore::Probe& p = mlacore::aiter_probe();
      *available = p.available ? 1 : 0;
      *reason = p.reason.c_str();
    } else {
      mlacore::value_error("backend: expected 'native' or 'aiter', got '", name, "'");
    }
  });
}

}  // extern "C"
