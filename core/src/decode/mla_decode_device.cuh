// Device helpers shared by the MLA decode kernels: mla_decode_mma.cu,
// mla_decode_portable.cu, mla_decode_combine.cu and mla_decode_sm90.cu.
// Single source like the kernels: the work-item reader serves HIP too; the
// cp.async / PTX helpers are CUDA only.
#pragma once

#include "gpu/compat.h"

#include <cstdint>

#include "plan/schedule.h"
#include "gpu/pack2.cuh"
#include "decode/mla_decode.h"

namespace mlacore {

struct ItemView {
  int64_t b, qo_begin, qo_len, kv_len, begin, end, partial;
  // The request's slots [page_begin, page_end) of kv_indices; empty (every
  // token masked) when its kv_indptr entries are out of range.
  int64_t page_begin, page_end;
  bool ok;
};

// The work item of CTA `w`, checked against the header and the tables; ok is
// false for padding, out-of-range requests and partial indices the workspace
// cannot hold (a schedule bug must never become a stray write).
// At kernel start every load here is a cold DRAM read, and the tile's page
// ids and KV wait for them: they go out in two rounds of independent loads,
// the item with the header (w < max_work bounds the grid), then all of the
// request's index entries, not as a chain of four.
template <class Idx>
__device__ ItemView read_item(const DecodeParams<Idx>& p, int64_t w) {
  ItemView v{};
  const int32_t* md = p.schedule;
  const ScheduleLayout layout{p.max_batch, p.max_work};
  if (w < 0 || w >= p.max_work) return v;
  const int4 it = *reinterpret_cast<const int4*>(md + layout.work() + 4 * w);  // WorkItem, 16-byte aligned
  const int64_t num_work = md[kHdrNumWork];
  int64_t batch = md[kHdrBatch];
  batch = batch < p.batch ? batch : p.batch;
  batch = batch < p.max_batch ? batch : p.max_batch;
  if (w >= num_work) return v;
  v.b = it.x;
  if (v.b < 0 || v.b >= batch) return v;
  v.qo_begin = static_cast<int64_t>(p.qo_indptr[v.b * p.qo_indptr_stride]);
  const int64_t qo_end = static_cast<int64_t>(p.qo_indptr[(v.b + 1) * p.qo_indptr_stride]);
  v.kv_len = static_cast<int64_t>(p.kv_len[v.b * p.kv_len_stride]);
  if (!p.pages.pages_of(v.b, v.page_begin, v.page_end)) v.page_begin = v.page_end = 0;
  v.qo_len = qo_end - v.qo_begin;
  if (v.qo_begin < 0 || v.qo_len <= 0 || qo_end > p.total_q) return v;
  v.begin = it.y > 0 ? it.y : 0;
  v.end = it.z < v.kv_len ? it.z : v.kv_len;
  v.partial = it.w;
  if (v.partial >= p.max_partials) return v;
  v.ok = true;
  return v;
}

// The tiled decode kernels (mma.sync, wgmma) run a one-dimensional grid,
// work item-major: block w * tiles + y is query tile y of work item w. The
// tiles of an item, which read the same KV rows, start side by side (so the
// second reader may find them in L2), and every real item's CTAs are
// scheduled before those of the padding items past num_work, which exit at
// once (with items along x and tiles along y, tile 1 of every item would
// wait behind all the padding items of tile 0).
struct CtaCoord {
  int64_t item, tile;
};
__device__ __forceinline__ CtaCoord cta_coord(int64_t tiles) {
  const int64_t x = blockIdx.x;
  return CtaCoord{x / tiles, x % tiles};
}
MLACORE_HD int64_t decode_query_tiles(int64_t rows_cap, int64_t rows_per_cta) {
  return (rows_cap + rows_per_cta - 1) / rows_per_cta;
}
// The launch side of cta_coord: max_work * tiles blocks along x, which must
// stay within the grid's 2^31 - 1.
inline dim3 decode_tiled_grid(int64_t max_work, int64_t rows_cap, int64_t rows_per_cta) {
  const int64_t tiles = decode_query_tiles(rows_cap, rows_per_cta);
  if (max_work < 1 || tiles > 0x7fffffff / max_work)
    runtime_error("mla_decode: ", max_work, " work items x ", tiles, " query tiles exceed the grid limit");
  return dim3(static_cast<unsigned>(max_work * tiles));
}

// A page-table lookup issued early: the raw index is loaded one tile before
// its cp.async needs it, so the dependent global load (every token is its
// own page at page size 1) is off the critical path; it is range-checked
// only when used. 32-bit: a page id >= 2^31 would need a pool of over 2 TB
// (1152 bytes per token), so such ids are treated as invalid, never wrapped.
struct PageRef {
  int32_t page;  // raw page id, or -1 outside the item / the request's pages
  int32_t off;   // token offset inside the page
};

// The tiled kernels' loaders: token `pos` of a work item to its PageRef.
// Positions are < item.end <= INT32_MAX (work items are int32), so 32-bit
// division suffices; a page larger than any position puts all in page 0.
// Powers of two (every engine's page size) shift instead: a 32-bit division
// is ~20 instructions, and each loader thread looks up several tokens a tile.
template <class Idx>
struct ItemPages {
  const PageTable<Idx>& pages;
  int64_t first, count, end;  // the request's slots [first, first + count); the item's end
  uint32_t page_size;
  bool pow2;
  int shift;

  // The body, not the initializers: nvcc's host pass keeps a __device__
  // constructor's initializer list, where __ffs is not declared.
  __device__ __forceinline__ ItemPages(const PageTable<Idx>& t, const ItemView& item) : pages(t) {
    first = item.page_begin;
    count = item.page_end - item.page_begin;
    end = item.end;
    page_size = t.page_size > 0x7fffffff ? 0x80000000u : static_cast<uint32_t>(t.page_size);
    pow2 = (page_size & (page_size - 1)) == 0;
    shift = __ffs(static_cast<int>(page_size)) - 1;
  }

  __device__ __forceinline__ PageRef operator()(int64_t pos) const {
    PageRef r{-1, 0};
    if (pos < end) {
      const uint32_t u = static_cast<uint32_t>(pos);
      const uint32_t in_req = pow2 ? u >> shift : u / page_size;
      r.off = static_cast<int32_t>(u - in_req * page_size);
      if (in_req < count) {
        const int64_t raw = static_cast<int64_t>(pages.indices[(first + in_req) * pages.indices_stride]);
        r.page = raw > 0x7fffffff ? -1 : static_cast<int32_t>(raw);
      }
    }
    return r;
  }
};

#if defined(MLACORE_GPU_CUDA)

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, bypassing L1; src_bytes = 0 zero-fills and reads nothing.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// One arrival on mbarrier `bar` once every cp.async this thread issued so far
// has landed (the pending count is raised now and lowered then, so the phase
// also needs this thread's ordinary arrival).
__device__ __forceinline__ void cp_async_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// Waits until at most `kPending` of this thread's newest cp.async groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Byte offset of 16-byte chunk `c` of row `r` in a swizzled buffer of rows of `chunks` chunks.
__device__ __forceinline__ uint32_t swz(int r, int c, int chunks) {
  return static_cast<uint32_t>((r * chunks + (c ^ (r & 7))) * 16);
}

#endif  // MLACORE_GPU_CUDA

}  // namespace mlacore
