// Host side of the TMA loads (gpu/tma_sm90.cuh): the tensor map of a paged
// KV cache, built with the driver's cuTensorMapEncodeTiled, which the CUDA
// runtime hands out (cudaGetDriverEntryPointByVersion), so libmlacore does
// not link libcuda. CUDA only.
#pragma once

#include <cstdint>

#include <cuda.h>

namespace mlacore::tma {

// A cache of `pages` pages of `page_tokens` rows of `cols` 16-bit elements
// (bf16 when `bf16`, else f16), rows `row_bytes` apart within a page and
// pages `page_bytes` apart: a 3-D tensor (cols, page_tokens, pages) read in
// boxes of 64 x 64 x 1 with the 128-byte swizzle (the layout of
// gpu/wgmma_sm90.cuh's K-major blocks). False, with `map` unspecified, when
// the driver has no encoder or refuses the shape (base not 16-byte aligned,
// strides not multiples of 16 bytes or past 2^40, dimensions past 2^32).
bool encode_kv_map(CUtensorMap* map, const void* base, bool bf16, uint64_t cols, uint64_t page_tokens,
                   uint64_t pages, uint64_t row_bytes, uint64_t page_bytes);

}  // namespace mlacore::tma
