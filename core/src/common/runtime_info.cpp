// Version, build features, last error and the no-op entry point: the parts of
// the C ABI that belong to no capability.
#include <mlacore/mlacore.h>

#include <dlfcn.h>

#include <cstring>
#include <string>

#include "common/error.h"
#include "common/tensor.h"

#ifndef MLACORE_VERSION
#error "the build must define MLACORE_VERSION"
#endif

namespace mlacore {
namespace {
thread_local std::string last_error;
}

void set_last_error(const char* message) noexcept {
  try {
    last_error = message;
  } catch (...) {
    // A message that cannot be stored is lost; the status still reports the failure.
  }
}

}  // namespace mlacore

extern "C" {

MLACORE_API const char* mlacore_version(void) { return MLACORE_VERSION; }

MLACORE_API const char* mlacore_last_error(void) { return mlacore::last_error.c_str(); }

MLACORE_API int mlacore_built_with(const char* feature) {
  if (feature == nullptr) return 0;
#if defined(MLACORE_WITH_CUDA)
  if (std::strcmp(feature, "cuda") == 0) return 1;
#endif
#if defined(MLACORE_WITH_HIP)
  if (std::strcmp(feature, "hip") == 0) return 1;
#endif
  return 0;
}

MLACORE_API const char* mlacore_library_path(void) {
  // dladdr on one of our own symbols names the file the loader mapped, which
  // is how an editable install finds its build directory.
  static const std::string path = [] {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&mlacore_library_path), &info) != 0 && info.dli_fname)
      return std::string(info.dli_fname);
    return std::string();
  }();
  return path.c_str();
}

MLACORE_API mlacore_status mlacore_noop(const DLTensor* const* tensors, int32_t count, void* stream) {
  (void)stream;
  return mlacore::guarded([&] {
    if (count < 0) mlacore::value_error("count: expected >= 0, got ", count);
    if (count > 0 && tensors == nullptr) mlacore::type_error("tensors: expected an array, got NULL");
    for (int32_t i = 0; i < count; ++i) mlacore::CheckedTensor(tensors[i], "tensors[i]");
  });
}

}  // extern "C"
