#include "backends/backend_route.h"

#include <cstdlib>
#include <cstring>

#include "backends/aiter/aiter_decode.h"
#include "backends/aiter/aiter_loader.h"
#include "common/error.h"
#include "common/tensor.h"

namespace mlacore {
namespace {

const char* op_name(int32_t op) {
  switch (op) {
    case MLACORE_ROUTE_APPEND_MLA: return "append_paged_mla_kv_cache";
    case MLACORE_ROUTE_APPEND_KV: return "append_paged_kv_cache";
    case MLACORE_ROUTE_DECODE_MLA: return "mla_decode";
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

enum class Gate {
  Pass, Device, DType, Layout, PageSize, HeadDims, NotAdjacent, NotDense, SourcesNotDense,
  Heads, QoLen, NotCausal, IndexType, PageStride, Workspace
};

bool power_of_two(int64_t v) { return v >= 1 && (v & (v - 1)) == 0; }

// AITER's decode kernels exist for these (aiter op_tests/test_mla.py: bf16
// decode serves 16 and 128 heads, 1 to 4 query tokens per request).
bool decode_heads_ok(int64_t h) { return h == 16 || h == 128; }
constexpr int64_t kAiterMaxQoLen = 4;

// The first gate AITER's kernels for this op do not pass. Explicit "aiter"
// and auto apply the same gates, so auto never routes a call that an
// explicit request would refuse. Cheap: no strings until one is needed.
Gate aiter_gate(const mlacore_route_request& r) {
  if (r.device_type != kDLROCM && !(r.device_type == kDLCPU && aiter_cpu_contract())) return Gate::Device;
  const DType dt = dtype_of(r.dtype);
  if (r.op == MLACORE_ROUTE_DECODE_MLA ? dt != DType::BF16 : (dt != DType::BF16 && dt != DType::F16))
    return Gate::DType;
  if (r.layout != MLACORE_LAYOUT_NHD) return Gate::Layout;
  if (!power_of_two(r.page_size)) return Gate::PageSize;
  if (r.op == MLACORE_ROUTE_APPEND_KV) {
    // reshape_and_cache_flash implies the token stride from heads*head_dim
    // and reads one page stride for K and V.
    if (!r.adjacent) return Gate::NotDense;
    // ... and reads a token's heads as one run of heads*head_dim.
    if (r.sources_strided) return Gate::SourcesNotDense;
    return Gate::Pass;
  }
  if (r.head_dim != 512 || r.head_dim_pe != 64) return Gate::HeadDims;
  // concat_and_cache_mla writes one [P, S, 576] buffer and the decode kernel
  // reads one; separate ckv and kpe allocations have no such view.
  if (!r.adjacent) return Gate::NotAdjacent;
  if (r.op == MLACORE_ROUTE_DECODE_MLA) {
    if (!decode_heads_ok(r.num_heads)) return Gate::Heads;
    if (r.max_qo_len < 1 || r.max_qo_len > kAiterMaxQoLen) return Gate::QoLen;
    if (r.max_qo_len > 1 && !r.causal) return Gate::NotCausal;
    if (!r.index_int32) return Gate::IndexType;
    // asm_mla.cu keeps the page stride in bytes (2 per bf16 element) in an int.
    if (r.page_stride < 0 || r.page_stride > 0x7fffffffLL / 2) return Gate::PageStride;
    const AiterDecodeLayout l = aiter_decode_layout(r.batch, r.max_qo_len, r.num_heads, kAiterMinSplits);
    if (l.total < 0 || l.total > r.workspace_bytes) return Gate::Workspace;
  }
  return Gate::Pass;
}

std::string describe(Gate g, const mlacore_route_request& r) {
  switch (g) {
    case Gate::Pass: return "all gates passed";
    case Gate::Device: return cat("not a HIP device (the cache is on ", device_name(r.device_type), ")");
    case Gate::DType:
      if (r.op == MLACORE_ROUTE_DECODE_MLA)
        return cat("dtype ", dtype_name(dtype_of(r.dtype)), " (AITER's MLA decode kernels take bfloat16)");
      return cat("dtype ", dtype_name(dtype_of(r.dtype)), " (AITER's cache writes take bfloat16 or float16)");
    case Gate::Layout: return "layout HND (AITER's caches are NHD)";
    case Gate::PageSize: return cat("page_size ", r.page_size, " is not a power of two");
    case Gate::HeadDims: return cat("head dims ", r.head_dim, "+", r.head_dim_pe, " (AITER's MLA cache is 512+64)");
    case Gate::NotAdjacent:
      return "ckv_cache and kpe_cache are not the two halves of one [pages, page_size, 576] buffer (AITER reads "
             "and writes the combined view; mlacore never copies a cache pool to make one)";
    case Gate::NotDense:
      return "the cache's token stride is not dense (heads*head_dim), or K and V differ in page stride";
    case Gate::SourcesNotDense: return "append_key/append_value do not keep a token's heads dense (stride(1) != head_dim)";
    case Gate::Heads: return cat("num_heads ", r.num_heads, " (AITER's bf16 MLA decode kernels serve 16 and 128 heads)");
    case Gate::QoLen:
      return cat("max_qo_len ", r.max_qo_len, " (AITER's MLA decode serves 1 to ", kAiterMaxQoLen,
                 " query tokens per request)");
    case Gate::NotCausal:
      return cat("a non-causal call with max_qo_len ", r.max_qo_len,
                 " (AITER's MLA decode masks causally inside a request)");
    case Gate::IndexType:
      return "the index tensors are not all int32 with unit stride (AITER reads raw int32 arrays)";
    case Gate::PageStride:
      return cat("the cache's page stride of ", r.page_stride, " elements does not fit AITER's 32-bit byte stride");
    case Gate::Workspace: {
      const AiterDecodeLayout l = aiter_decode_layout(r.batch, r.max_qo_len, r.num_heads, kAiterMinSplits);
      return cat("the float workspace has ", r.workspace_bytes, " bytes; AITER's route needs at least ", l.total,
                 " (query rows [", l.rows, ", ", r.num_heads, ", 576] bf16 and fp32 partials of ", kAiterMinSplits,
                 " KV splits)");
    }
  }
  return "unknown gate";
}

// The probe says only whether AITER's library loaded (in any build, so the
// contract test runs without HIP); whether a call may use it is the gates'.
Probe run_aiter_probe() {
  const AiterLibrary& lib = aiter_library();
  return {lib.loaded, lib.reason};
}

// The entry point an op needs, or a reason the loaded library cannot serve
// it. The cache writes are optional symbols of ABI v1 (a shim's).
const char* missing_entry(int32_t op) {
  const AiterLibrary& lib = aiter_library();
  switch (op) {
    case MLACORE_ROUTE_APPEND_MLA:
      return lib.concat_and_cache_mla ? nullptr : MLACORE_AITER_CONCAT_MLA_SYMBOL;
    case MLACORE_ROUTE_APPEND_KV:
      return lib.reshape_and_cache_flash ? nullptr : MLACORE_AITER_RESHAPE_FLASH_SYMBOL;
    default: return lib.mla_decode_stage1 ? nullptr : MLACORE_AITER_ENTRY_SYMBOL;
  }
}

}  // namespace

bool aiter_cpu_contract() {
  static const bool on = [] {
    const char* v = std::getenv("MLACORE_AITER_CPU_CONTRACT");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return on;
}

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

  // Gates first: a call AITER cannot run never needs the probe (nor loads
  // a library).
  const Gate gate = aiter_gate(request);
  if (gate != Gate::Pass) {
    if (requested == Backend::Aiter)
      value_error(op, ": backend='aiter' cannot run this call: ", describe(gate, request));
    return {Backend::Native, explain ? cat("native: auto, AITER gate failed: ", describe(gate, request)) : ""};
  }
  const Probe& aiter = aiter_probe();
  if (requested == Backend::Aiter) {
    if (!aiter.available) runtime_error(op, ": backend='aiter': AITER unavailable: ", aiter.reason);
    if (const char* symbol = missing_entry(request.op))
      runtime_error(op, ": backend='aiter': the AITER library lacks ", symbol, " (", aiter_library().path,
                    "; docs/AITER.md says how a shim exports it)");
    return {Backend::Aiter, explain ? "aiter: requested" : ""};
  }
  // Auto falls back silently: the core has no logging hook, so the reason
  // is what mlacore_route() reports.
  if (!aiter.available)
    return {Backend::Native, explain ? cat("native: auto, AITER unavailable: ", aiter.reason) : ""};
  if (const char* symbol = missing_entry(request.op))
    return {Backend::Native, explain ? cat("native: auto, the AITER library lacks ", symbol) : ""};
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

MLACORE_API mlacore_status mlacore_aiter_library_info(int32_t* abi_version, const char** path,
                                                      uint32_t* entry_points) {
  return mlacore::guarded([&] {
    if (abi_version == nullptr || path == nullptr || entry_points == nullptr)
      mlacore::type_error("mlacore_aiter_library_info: expected non-NULL abi_version, path and entry_points");
    const mlacore::AiterLibrary& lib = mlacore::aiter_library();
    *abi_version = lib.abi_version;
    *path = lib.path.c_str();
    uint32_t bits = 0;
    if (lib.loaded) {
      if (lib.mla_decode_stage1) bits |= MLACORE_AITER_ENTRY_DECODE;
      if (lib.concat_and_cache_mla) bits |= MLACORE_AITER_ENTRY_CONCAT_MLA;
      if (lib.reshape_and_cache_flash) bits |= MLACORE_AITER_ENTRY_RESHAPE_FLASH;
    }
    *entry_points = bits;
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
