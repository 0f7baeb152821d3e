// The parts of the C ABI that belong to no capability: version, errors, no-op.
#include <mlacore/mlacore.hpp>

#include <string>
#include <thread>

#include "check.h"

int main() {
  CHECK(std::string(mlacore_version()) == MLACORE_EXPECTED_VERSION);
  CHECK(mlacore::version() == MLACORE_EXPECTED_VERSION);
  CHECK(std::string(mlacore_library_path()).find("libmlacore") != std::string::npos);
  CHECK(mlacore_built_with("nonsense") == 0);
  CHECK(mlacore_built_with(nullptr) == 0);

  int64_t shape[1] = {4};
  int32_t data[4] = {0, 1, 2, 3};
  DLTensor t{};
  t.data = data;
  t.device = {kDLCPU, 0};
  t.ndim = 1;
  t.dtype = {kDLInt, 32, 1};
  t.shape = shape;
  const DLTensor* ok[2] = {&t, &t};
  CHECK(mlacore_noop(ok, 2, nullptr) == MLACORE_OK);

  // A NULL tensor is a type error with a message naming it.
  const DLTensor* bad[2] = {&t, nullptr};
  CHECK(mlacore_noop(bad, 2, nullptr) == MLACORE_ERROR_TYPE);
  CHECK_CONTAINS(mlacore_last_error(), "tensors[i]");
  CHECK(mlacore_noop(ok, -1, nullptr) == MLACORE_ERROR_VALUE);
  CHECK_CONTAINS(mlacore_last_error(), "count");

  // The C++ wrapper throws with the status and the message.
  bool threw = false;
  try {
    mlacore::noop(bad, 2);
  } catch (const mlacore::Error& e) {
    threw = e.status() == MLACORE_ERROR_TYPE && std::string(e.what()).find("NULL") != std::string::npos;
  }
  CHECK(threw);

  // The last error is per thread: a failure elsewhere does not overwrite ours.
  CHECK(mlacore_noop(ok, -1, nullptr) == MLACORE_ERROR_VALUE);
  std::thread other([&] { (void)mlacore_noop(bad, 2, nullptr); });
  other.join();
  CHECK_CONTAINS(mlacore_last_error(), "count");

  return finish("test_runtime");
}
