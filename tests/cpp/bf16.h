// bf16 <-> float for the C++ tests, which build their caches and queries on
// the host (round to nearest even, as the GPU's conversions do).
#pragma once

#include <cstdint>
#include <cstring>

inline uint16_t to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

inline float from_bf16(uint16_t h) {
  const uint32_t x = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
