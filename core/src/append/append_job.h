// One append as the host validated it: byte-addressed copy descriptors and
// where each token goes. Shared by the native append (paged_append.cpp/.cu)
// and the AITER cache-write route (backends/aiter/aiter_cache_write.*), so
// neither includes the other. One call copies one or two sources (ckv+kpe,
// K+V, kv_c+k_pe) per token into the slot the page table, or the slot
// mapping, gives that token.
#pragma once

#include <cstdint>

#include "common/page_table.h"

namespace mlacore::append {

// A 1-D int32 or int64 index tensor (batch_indices, positions, slot_mapping).
struct IndexVec {
  const void* data = nullptr;
  int64_t stride = 1;
  bool is64 = false;

  MLACORE_HD int64_t at(int64_t i) const {
    return is64 ? static_cast<const int64_t*>(data)[i * stride]
                : static_cast<int64_t>(static_cast<const int32_t*>(data)[i * stride]);
  }
};

// A vLLM slot mapping: token i goes to slot slots[i] = page * page_size +
// offset; a negative slot skips the token, and so does a slot at or past
// `capacity` (pages * page_size of the cache).
struct SlotMap {
  IndexVec slots;
  int64_t page_size = 1;
  int64_t capacity = 0;

  // The token's slot, or -1 when it writes nothing.
  MLACORE_HD int64_t slot(int64_t i) const {
    const int64_t s = slots.at(i);
    return s < 0 || s >= capacity ? -1 : s;
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
  int64_t nnz = 0;
  // by_slot: slot_map says where token i goes (concat_and_cache_mla);
  // otherwise the page table (t32 or t64, as table64 says) at batch[i], pos[i].
  bool by_slot = false;
  SlotMap slot_map;
  IndexVec batch;
  IndexVec pos;
  bool table64 = false;
  PageTable<int32_t> t32;
  PageTable<int64_t> t64;
};

}  // namespace mlacore::append
