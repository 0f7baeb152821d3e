// Per-element work of the slot-mapping ops, shared by the CPU loops
// (slot_mapping.cpp) and the GPU kernels (slot_mapping.cu): both call the same
// MLACORE_HD functions, so the two paths agree bit for bit by construction.
// Every index read here is either of a position the host proved in range
// (t < nnz, r < rows, j < cols) or bounds-checked against the table it reads.
#pragma once

#include <cstdint>

#include "common/page_table.h"

namespace mlacore {

template <class Tok, class Idx>
struct SlotMappingArgs {
  const Tok* batch_indices = nullptr;
  int64_t batch_indices_stride = 1;
  const Tok* positions = nullptr;
  int64_t positions_stride = 1;
  int64_t* out = nullptr;
  int64_t out_stride = 1;
  int64_t nnz = 0;
  PageTable<Idx> table;  // num_pages set so that every accepted slot fits int64

  MLACORE_HD void run(int64_t t) const {
    const int64_t b = static_cast<int64_t>(batch_indices[t * batch_indices_stride]);
    const int64_t pos = static_cast<int64_t>(positions[t * positions_stride]);
    out[t * out_stride] = table.slot(b, pos);
  }
};

template <class T, class Cu>
struct BlockTableArgs {
  const T* table = nullptr;
  int64_t rows = 0, cols = 0;
  int64_t row_stride = 0, col_stride = 0;
  const Cu* cu = nullptr;  // rows + 1 entries
  int64_t cu_stride = 1;
  T* out = nullptr;
  int64_t out_len = 0;
  int64_t out_stride = 1;

  // Where row r goes in `out` and how many of its entries fit: at most
  // `cols`, and none past the end of `out`. False when nothing is written.
  MLACORE_HD bool row_range(int64_t r, int64_t& dst, int64_t& count) const {
    const int64_t begin = static_cast<int64_t>(cu[r * cu_stride]);
    const int64_t end = static_cast<int64_t>(cu[(r + 1) * cu_stride]);
    if (begin < 0 || end < begin || begin >= out_len) return false;
    int64_t n = end - begin;
    if (n > cols) n = cols;
    if (n > out_len - begin) n = out_len - begin;
    dst = begin;
    count = n;
    return n > 0;
  }

  MLACORE_HD void copy(int64_t r, int64_t dst, int64_t j) const {
    out[(dst + j) * out_stride] = table[r * row_stride + j * col_stride];
  }
};

template <class Idx, class Out>
struct BatchPositionsArgs {
  const Idx* indptr = nullptr;  // batch + 1 entries
  int64_t indptr_stride = 1;
  const Idx* seq_lens = nullptr;
  int64_t seq_lens_stride = 1;
  int64_t batch = 0;
  Out* batch_indices = nullptr;
  int64_t batch_indices_stride = 1;
  Out* positions = nullptr;
  int64_t positions_stride = 1;
  int64_t nnz = 0;
  int64_t out_max = 0;  // largest value the output dtype holds

  MLACORE_HD int64_t ptr(int64_t i) const { return static_cast<int64_t>(indptr[i * indptr_stride]); }

  // The request holding token t: the last b with indptr[b] <= t, found by a
  // binary search that reads only indptr[0..batch], so it is a per-token
  // O(log batch) lookup with no second pass and no sync. On an indptr that
  // is not non-decreasing it still ends on some b with indptr[b] <= t, and
  // the range check below decides.
  MLACORE_HD void run(int64_t t) const {
    int64_t b = -1, position = -1;
    if (batch > 0 && ptr(0) <= t) {
      int64_t lo = 0, hi = batch;
      while (lo < hi) {
        const int64_t mid = lo + (hi - lo + 1) / 2;
        if (ptr(mid) <= t) lo = mid;
        else hi = mid - 1;
      }
      if (lo < batch) {
        const int64_t end = ptr(lo + 1);
        if (t < end) {
          // seq_len - (end - begin) + (t - begin), folded so that no
          // subtraction can overflow: 0 < end - t and seq_len >= 0.
          const int64_t seq_len = static_cast<int64_t>(seq_lens[lo * seq_lens_stride]);
          const int64_t p = seq_len < 0 ? -1 : seq_len - (end - t);
          b = lo;
          position = p < 0 || p > out_max ? -1 : p;
        }
      }
    }
    batch_indices[t * batch_indices_stride] = static_cast<Out>(b);
    positions[t * positions_stride] = static_cast<Out>(position);
  }
};

#if defined(MLACORE_WITH_CUDA) || defined(MLACORE_WITH_HIP)
// GPU launchers (slot_mapping.cu), instantiated for int32/int64 pairs only.
template <class Tok, class Idx>
void launch_slot_mapping(const SlotMappingArgs<Tok, Idx>& args, int device, void* stream);
template <class T, class Cu>
void launch_block_table(const BlockTableArgs<T, Cu>& args, int device, void* stream);
template <class Idx, class Out>
void launch_batch_positions(const BatchPositionsArgs<Idx, Out>& args, int device, void* stream);
#endif

}  // namespace mlacore
