// 16-bit float conversions shared by the CPU path and the portable GPU kernel.
// bf16 and fp16 travel as raw uint16_t bits: Debian's hipcc (ROCm 5.2) has no
// bf16 arithmetic type, and bit-level code converts identically everywhere.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/page_table.h"  // MLACORE_HD

namespace mlacore {

MLACORE_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

MLACORE_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

MLACORE_HD float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

MLACORE_HD uint16_t float_to_bf16(float f) {
  uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);  // round to nearest even, as cvt.rn does
  return static_cast<uint16_t>(x >> 16);
}

MLACORE_HD float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;  // subnormal: mant * 2^-24
    return sign ? -v : v;
  }
  return bits_float(exp == 31 ? sign | 0x7f800000u | (mant << 13) : sign | ((exp + 112u) << 23) | (mant << 13));
}

MLACORE_HD uint16_t float_to_f16(float f) {
  uint32_t x = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) return sign | 0x7c00u | (x > 0x7f800000u ? 0x200u : 0u);
  if (x >= 0x477ff000u) return sign | 0x7c00u;  // rounds past 65504
  if (x < 0x38800000u) {
    // Below 2^-14 the half is subnormal with mantissa round(x * 2^24); adding
    // and subtracting 2^23 rounds a float below 2^23 to an integer, ties to even.
    const float v = bits_float(x) * 16777216.0f;
    const float r = (v + 8388608.0f) - 8388608.0f;  // 2^23: rounds to an integer, ties to even
    return sign | static_cast<uint16_t>(r);
  }
  const uint32_t r = x + 0xc8000fffu + ((x >> 13) & 1u);  // rebias the exponent, round to nearest even
  return sign | static_cast<uint16_t>(r >> 13);
}

}  // namespace mlacore
