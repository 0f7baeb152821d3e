// A C++ program that uses an installed mlacore the way an inference server
// would: headers and libmlacore from the Python package, no Python at run time.
#include <mlacore/mlacore.hpp>

#include <cstdio>
#include <cstring>

int main() {
  std::printf("mlacore %s from %s\n", mlacore::version().c_str(), mlacore_library_path());

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
