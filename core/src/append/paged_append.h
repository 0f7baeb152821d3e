// What the host side of the paged append (paged_append.cpp) hands its GPU
// launcher (paged_append.cu): validated, byte-addressed copy descriptors. One
// call copies one or two sources (ckv+kpe, or K+V) per token into the slot the
// page table gives that token.
#pragma once

#include <cstdint>

#include "common/page_table.h"

namespace mlacore::append {

// A 1-D int32 or int64 index tensor (batch_indices, positions).
struct IndexVec {
  const void* data = nullptr;
  int64_t stride = 1;
  bool is64 = false;

  MLACORE_HD int64_t at(int64_t i) const {
    return is64 ? static_cast<const int64_t*>(data)[i * stride]
                : static_cast<int64_t>(static_cast<const int32_t*>(data)[i * stride]);
  }
};

// One source [nnz, ...] into one cache. A token's row is `num_seg` segments
// (heads, or 1 when the row is contiguous on both sides) of `seg_bytes` each.
// All strides in bytes; strides of dims of size 1 are 0, so they never
// constrain the access width.
struct CopyStream {
  const char* src = nullptr;
  int64_t src_token = 0;
  int64_t src_seg = 0;
  char* dst = nullptr;
  int64_t dst_page = 0;
  int64_t dst_token = 0;
  int64_t dst_seg = 0;
  int64_t seg_bytes = 0;
  int64_t num_seg = 1;
};

struct Job {
  CopyStream streams[2];
  IndexVec batch;
  IndexVec pos;
  int64_t nnz = 0;
  bool table64 = false;  // which of the two tables below is the real one
  PageTable<int32_t> t32;
  PageTable<int64_t> t64;
};

#if defined(MLACORE_WITH_CUDA) || defined(MLACORE_WITH_HIP)
// Launches the copy on `stream` (the device's current one when NULL); no sync.
void launch_gpu(const Job& job, int device, void* stream);
// Stream-ordered device-to-host copies and the wait for them (strict mode only).
void copy_to_host(void* dst, const void* src, int64_t bytes, int device, void* stream);
void wait_stream(int device, void* stream);
#endif

}  // namespace mlacore::append
