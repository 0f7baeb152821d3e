// Two floats as one 32-bit register of two 16-bit values (bf16 or fp16),
// each rounded to nearest even, `lo` in the low half: the element pair of an
// mma.sync or wgmma A fragment and of a bf16/fp16 output row. CUDA only.
#pragma once

#include <cstdint>

namespace mlacore {

#if defined(__CUDACC__)
template <bool kBf16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t r;
  if constexpr (kBf16) asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  else asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
#endif  // __CUDACC__

}  // namespace mlacore
