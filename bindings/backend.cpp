#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend.h"
#include "bindings.h"
#include "tensor_args.h"

namespace mlacore::bind {
namespace {

int32_t parse_op(const char* op) {
  if (std::strcmp(op, "append_paged_mla_kv_cache") == 0) return MLACORE_ROUTE_APPEND_MLA;
  if (std::strcmp(op, "append_paged_kv_cache") == 0) return MLACORE_ROUTE_APPEND_KV;
  throw nb::value_error(
      (std::string("op: expected 'append_paged_mla_kv_cache' or 'append_paged_kv_cache', got '") + op + "'").c_str());
}

int32_t parse_device(const char* device) {
  if (std::strcmp(device, "cpu") == 0) return kDLCPU;
  if (std::strcmp(device, "cuda") == 0) return kDLCUDA;
  if (std::strcmp(device, "rocm") == 0 || std::strcmp(device, "hip") == 0) return kDLROCM;
  throw nb::value_error((std::string("device: expected 'cpu', 'cuda' or 'rocm', got '") + device + "'").c_str());
}

DLDataType parse_dtype(const char* dtype) {
  if (std::strcmp(dtype, "bfloat16") == 0) return {kDLBfloat, 16, 1};
  if (std::strcmp(dtype, "float16") == 0) return {kDLFloat, 16, 1};
  if (std::strcmp(dtype, "float32") == 0) return {kDLFloat, 32, 1};
  throw nb::value_error((std::string("dtype: expected 'bfloat16', 'float16' or 'float32', got '") + dtype + "'").c_str());
}

const char* backend_name(int32_t b) { return b == MLACORE_BACKEND_AITER ? "aiter" : "native"; }

}  // namespace

int32_t parse_backend(const char* backend) {
  if (std::strcmp(backend, "auto") == 0) return MLACORE_BACKEND_AUTO;
  if (std::strcmp(backend, "native") == 0) return MLACORE_BACKEND_NATIVE;
  if (std::strcmp(backend, "aiter") == 0) return MLACORE_BACKEND_AITER;
  throw nb::value_error(
      (std::string("backend: expected 'auto', 'native' or 'aiter', got '") + backend + "'").c_str());
}

int32_t parse_kv_layout(const char* layout) {
  if (std::strcmp(layout, "NHD") == 0) return MLACORE_LAYOUT_NHD;
  if (std::strcmp(layout, "HND") == 0) return MLACORE_LAYOUT_HND;
  throw nb::value_error((std::string("kv_layout: expected 'NHD' or 'HND', got '") + layout + "'").c_str());
}

void bind_backend(nb::module_& m) {
  m.def("backend_info", [](const char* name) {
    int32_t available = 0;
    const char* reason = "";
    check(mlacore_backend_info(name, &available, &reason));
    return std::make_pair(available != 0, std::string(reason));
  });

  // What the probe found: (abi_version, library path, entry point names).
  m.def("aiter_library_info", [] {
    int32_t abi = 0;
    const char* path = "";
    uint32_t entries = 0;
    check(mlacore_aiter_library_info(&abi, &path, &entries));
    std::vector<std::string> names;
    if (entries & MLACORE_AITER_ENTRY_DECODE) names.emplace_back("mla_decode_stage1_asm_fwd");
    if (entries & MLACORE_AITER_ENTRY_CONCAT_MLA) names.emplace_back("aiter_concat_and_cache_mla");
    if (entries & MLACORE_AITER_ENTRY_RESHAPE_FLASH) names.emplace_back("aiter_reshape_and_cache_flash");
    return std::make_tuple(abi, std::string(path), names);
  });

  // The installed aiter package's MLA library, found by the Python layer;
  // must precede the first probe (mlacore_aiter_set_library).
  m.def("aiter_set_library", [](const char* path) { check(mlacore_aiter_set_library(path)); }, nb::arg("path"));

  // The routing decision for a described call, without running it.
  m.def(
      "route",
      [](const char* op, const char* device, const char* dtype, const char* kv_layout, int64_t page_size,
         int64_t head_dim, int64_t head_dim_pe, bool adjacent, const char* backend) {
        mlacore_route_request req{};
        req.op = parse_op(op);
        req.device_type = parse_device(device);
        req.dtype = parse_dtype(dtype);
        req.layout = parse_kv_layout(kv_layout);
        req.page_size = page_size;
        req.head_dim = head_dim;
        req.head_dim_pe = head_dim_pe;
        req.adjacent = adjacent ? 1 : 0;
        int32_t chosen = 0;
        char why[512];
        check(mlacore_route(&req, parse_backend(backend), &chosen, why, sizeof why));
        return std::make_pair(std::string(backend_name(chosen)), std::string(why));
      },
      nb::arg("op"), nb::arg("device"), nb::arg("dtype"), nb::arg("kv_layout"), nb::arg("page_size"),
      nb::arg("head_dim"), nb::arg("head_dim_pe"), nb::arg("adjacent"), nb::arg("backend"));
}

}  // namespace mlacore::bind
