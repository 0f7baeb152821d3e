// Finds and loads AITER's MLA library at run time, so libmlacore never links
// AITER (or the torch it is built against) at build time, and converts
// DLPack tensors into AITER's aiter_tensor_t.
//
// Self-contained on purpose (libc, libdl and the standard library only, no
// mlacore error machinery): tests/cpp/test_aiter_loader.cpp compiles this file
// into its driver to reach the resolved entry point, which libmlacore keeps
// hidden.
#pragma once

#include <dlpack/dlpack.h>

#include <initializer_list>
#include <string>

#include "backends/aiter/aiter_abi.h"

namespace mlacore {

// The ABI versions (aiter_c_abi_version()) this build knows how to call.
inline constexpr int kAiterKnownAbiVersion = 1;

struct AiterLibrary {
  bool loaded = false;
  std::string reason;  // why not loaded ("" when loaded); names the path
  std::string path;    // the file opened or tried ("" when none was given)
  int abi_version = 0;
  mla_decode_stage1_asm_fwd_fn mla_decode_stage1 = nullptr;
  // Optional entry points of ABI v1 (a shim's cache writes); NULL when the
  // library lacks them, which leaves the appends native and says so.
  aiter_concat_and_cache_mla_fn concat_and_cache_mla = nullptr;
  aiter_reshape_and_cache_flash_fn reshape_and_cache_flash = nullptr;
};

// Loads once per process under std::call_once; a failure is cached with its
// reason like a success. Never throws. Where it looks: $MLACORE_AITER_LIB
// (non-empty) first, then the path handed over by aiter_set_library_path().
const AiterLibrary& aiter_library() noexcept;

// Records the library the Python layer found (an installed aiter package).
// Returns false and says why when the probe has already run: its answer is
// cached for the process and a later path would silently not count.
bool aiter_set_library_path(const char* path, std::string* why);

// Fills *out from `t` (shape, strides in elements, dtype, device id, data +
// byte_offset). Returns false with *why ("expected ..., got ...") for what
// AITER's tensors cannot carry: more than 8 dims, vector lanes, a dtype
// without an unambiguous AiterDtype, a device other than ROCm (or CPU, which
// only the contract test's fake library reads).
bool to_aiter_tensor(const DLTensor& t, aiter_tensor_t* out, std::string* why);

// The AiterDtype of a DLPack dtype, false for those without an unambiguous
// one (see to_aiter_tensor).
bool to_aiter_dtype(DLDataType t, AiterDtype* out);

// A tensor the routes describe themselves (a workspace section, the
// combined view of two cache halves): shape and strides in elements,
// compact row-major when `strides` is empty.
aiter_tensor_t aiter_view(void* ptr, AiterDtype dtype, int device_id, std::initializer_list<int64_t> shape,
                          std::initializer_list<int64_t> strides = {});

}  // namespace mlacore
