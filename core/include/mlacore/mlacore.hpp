// mlacore: a header-only C++ face over the C ABI in <mlacore/mlacore.h>.
// Same entry points, but failures throw mlacore::Error instead of returning a
// status, so a C++ server can use libmlacore without checking every call.
#ifndef MLACORE_MLACORE_HPP_
#define MLACORE_MLACORE_HPP_

#include <mlacore/mlacore.h>

#include <stdexcept>
#include <string>

namespace mlacore {

class Error : public std::runtime_error {
 public:
  Error(mlacore_status status, const char* message)
      : std::runtime_error(message), status_(status) {}
  mlacore_status status() const noexcept { return status_; }

 private:
  mlacore_status status_;
};

inline void check(mlacore_status status) {
  if (status != MLACORE_OK) throw Error(status, mlacore_last_error());
}

inline std::string version() { return mlacore_version(); }
inline bool built_with(const char* feature) { return mlacore_built_with(feature) != 0; }

inline void noop(const DLTensor* const* tensors, int32_t count, void* stream = nullptr) {
  check(mlacore_noop(tensors, count, stream));
}

// Capability wrappers follow, one section per capability header.

}  // namespace mlacore

#endif  // MLACORE_MLACORE_HPP_
