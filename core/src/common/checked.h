// Overflow-checked int64 arithmetic for sizes, offsets and byte counts that a
// caller controls (tensor shapes, strides, plan and decode dims). Every such
// product or sum that feeds a length check, an offset or an allocation goes
// through these, so a wrapped value can never pass a check as a small one.
#pragma once

#include <cstdint>

#include "common/error.h"

namespace mlacore {

// a + b and a * b; false (and *out untouched) when the result leaves int64.
inline bool add_fits(int64_t a, int64_t b, int64_t* out) noexcept {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return false;
  *out = r;
  return true;
}
inline bool mul_fits(int64_t a, int64_t b, int64_t* out) noexcept {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return false;
  *out = r;
  return true;
}

// a + b, raising value_error that names `arg` (the argument whose size went
// into the sum) when the result leaves int64.
inline int64_t checked_add(int64_t a, int64_t b, const char* arg) {
  int64_t r;
  if (!add_fits(a, b, &r)) value_error(arg, ": size arithmetic overflows int64 (", a, " + ", b, ")");
  return r;
}

}  // namespace mlacore
