// A C++ program that uses an installed mlacore the way an inference server
// would: headers and libmlacore from the Python package, no Python at run time.
#include <mlacore/mlacore.hpp>

#include <cstdio>
#include <cstring>

int main() {
  std::printf("mlacore %s from %s\n", mlacore::version().c_str(), mlacore_library_path());
  // The headers' version macros name the library they came with.
  char expected[32];
  std::snprintf(expected, sizeof expected, "%d.%d.%d", MLACORE_VERSION_MAJOR, MLACORE_VERSION_MINOR,
                MLACORE_VERSION_PATCH);
  if (mlacore::version() != expected) {
    std::printf("FAIL: headers say %s, the library %s\n", expected, mlacore::version().c_str());
    return 1;
  }

  int64_t shape[1] = {3};
  int32_t data[3] = {1, 2, 3};
  DLTensor t{};
  t.data = data;
  t.device = {kDLCPU, 0};
  t.ndim = 1;
  t.dtype = {kDLInt, 32, 1};
  t.shape = shape;
  const DLTensor* args[1] = {&t};
  mlacore::noop(args, 1);

  try {
    const DLTensor* none[1] = {nullptr};
    mlacore::noop(none, 1);
    std::printf("FAIL: a NULL tensor was accepted\n");
    return 1;
  } catch (const mlacore::Error& e) {
    if (e.status() != MLACORE_ERROR_TYPE) return 1;
  }
  std::printf("consumer: ok\n");
  return 0;
}
