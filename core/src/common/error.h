// Internal error handling: core code throws CoreError; every C entry point
// runs its body through guarded(), which turns the exception into a status and
// the thread's last-error message. Nothing escapes the C ABI.
#pragma once

#include <mlacore/mlacore.h>

#include <exception>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace mlacore {

class CoreError : public std::runtime_error {
 public:
  CoreError(mlacore_status status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  mlacore_status status() const noexcept { return status_; }

 private:
  mlacore_status status_;
};

template <class... Parts>
std::string cat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

template <class... Parts>
[[noreturn]] void value_error(const Parts&... parts) {
  throw CoreError(MLACORE_ERROR_VALUE, cat(parts...));
}

template <class... Parts>
[[noreturn]] void type_error(const Parts&... parts) {
  throw CoreError(MLACORE_ERROR_TYPE, cat(parts...));
}

template <class... Parts>
[[noreturn]] void runtime_error(const Parts&... parts) {
  throw CoreError(MLACORE_ERROR_RUNTIME, cat(parts...));
}

void set_last_error(const char* message) noexcept;

// Runs `body` and maps what it throws onto the C ABI's status codes.
template <class Body>
mlacore_status guarded(Body&& body) noexcept {
  try {
    std::forward<Body>(body)();
    return MLACORE_OK;
  } catch (const CoreError& e) {
    set_last_error(e.what());
    return e.status();
  } catch (const std::bad_alloc&) {
    set_last_error("out of host memory");
    return MLACORE_ERROR_RUNTIME;
  } catch (const std::exception& e) {
    set_last_error(e.what());
    return MLACORE_ERROR_RUNTIME;
  } catch (...) {
    set_last_error("unknown C++ exception");
    return MLACORE_ERROR_RUNTIME;
  }
}

}  // namespace mlacore
