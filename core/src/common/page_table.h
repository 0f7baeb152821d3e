// The paged-KV page table (FlashInfer layout) as kernels and CPU paths read
// it: pages of request b are indices[indptr[b] .. indptr[b+1]). Index values
// live on the device, so they are checked where they are read, never trusted:
// every lookup that would leave the tables gives -1 instead of a read.
#pragma once

#include <cstdint>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define MLACORE_HD __host__ __device__ __forceinline__
#else
#define MLACORE_HD inline
#endif

namespace mlacore {

template <class Idx>
struct PageTable {
  const Idx* indices = nullptr;
  int64_t indices_stride = 1;  // element strides: index tensors may be views
  int64_t num_indices = 0;     // length of `indices`, known on the host
  const Idx* indptr = nullptr;
  int64_t indptr_stride = 1;
  int64_t batch = 0;           // indptr holds batch + 1 entries
  int64_t page_size = 1;
  int64_t num_pages = -1;      // pool size; < 0 leaves page ids unchecked

  // [begin, end) of request b's pages in `indices`, clamped to the table;
  // false when b or its indptr entries are out of range.
  MLACORE_HD bool pages_of(int64_t b, int64_t& begin, int64_t& end) const {
    if (b < 0 || b >= batch) return false;
    begin = static_cast<int64_t>(indptr[b * indptr_stride]);
    end = static_cast<int64_t>(indptr[(b + 1) * indptr_stride]);
    return begin >= 0 && begin <= end && end <= num_indices;
  }

  // Page id at slot i of `indices`, or -1 when it is not a valid page.
  MLACORE_HD int64_t page_at(int64_t i) const {
    const int64_t page = static_cast<int64_t>(indices[i * indices_stride]);
    return page < 0 || (num_pages >= 0 && page >= num_pages) ? -1 : page;
  }

  // Slot (page * page_size + offset) of token `pos` of request `b`, or -1.
  MLACORE_HD int64_t slot(int64_t b, int64_t pos) const {
    int64_t begin, end;
    if (pos < 0 || !pages_of(b, begin, end)) return -1;
    // Compared before adding: begin + pos / page_size can overflow for a huge
    // pos, and a wrapped index would pass an `i >= end` check.
    const int64_t page_in_request = pos / page_size;
    if (page_in_request >= end - begin) return -1;
    const int64_t page = page_at(begin + page_in_request);
    return page < 0 ? -1 : page * page_size + pos % page_size;
  }
};

}  // namespace mlacore
