// The rows paged append kernel, CUDA and HIP: one lean launch for small
// appends (a decode step's one token a request) and for every slot-mapped
// append (concat_and_cache_mla). A thread group per token issues its source
// loads, then the token's lookup (page table or slot mapping), then its
// stores: no shared memory, no barrier, no loop. rows_shape() sizes the grid
// so every access of the call is in flight at once.
// Contract: a validated Job; page-table appends use 16-byte accesses and one
// dtype for batch_indices and positions (the launcher checks).
#include "append/append_kernels.h"

namespace mlacore::append {
namespace {

// A decode step appends one token per request (nnz = the batch, 1-512), so the
// whole call is a few microseconds of latency: the dependent loads before the
// first store (batch index and position -> kv_indptr -> kv_indices) and the
// kernel's own start. This kernel keeps both short: a small body (little to
// fetch into a cold instruction cache), no shared memory, no barrier, no
// loop, and a grid that puts every access of the call in flight at once
// whatever the batch. `lanes` threads share a token and each moves up to
// kRowsPer of its accesses (u, u + lanes, ...): it issues those source loads
// first, then the token's lookup (threads of one token read the same index
// words: one request a warp), then its stores. The page-table lookup guesses
// that token i is request i's (locate_guessing): two dependent loads when it
// holds, as in a decode step, three otherwise. With a slot mapping the lookup
// is one load. The page size divides by a multiply-high (PageDiv), its slow
// path out of line.
constexpr int kRowsThreads = 256;
constexpr int kRowsPer = 2;
constexpr uint32_t kRowsBlock = kRowsThreads * kRowsPer;  // accesses a block moves at most

// A 1-D index tensor whose dtype is a template parameter: no per-read branch
// on the width (IndexVec's), so the rows kernel's body stays short.
template <class T>
struct TypedIndex {
  const T* data;
  int64_t stride;
  __device__ __forceinline__ int64_t at(int64_t i) const { return static_cast<int64_t>(data[i * stride]); }
};

template <class T>
TypedIndex<T> typed(const IndexVec& v) {
  return {static_cast<const T*>(v.data), v.stride};
}

// Where a token goes, from the page table (Idx: its dtype; Pos: that of
// batch_indices and positions), guessing that token i belongs to request i.
template <class Idx, class Pos>
struct ByTable {
  PageTable<Idx> table;
  PageDiv div;
  TypedIndex<Pos> batch, pos;
  __device__ __forceinline__ void operator()(int64_t tok, int64_t& page, int64_t& off) const {
    locate_guessing(table, div, batch, pos, tok, page, off);
  }
};

// Where a token goes, from a slot mapping: a slot < 0 or past the cache
// (SlotMap::capacity) skips the token.
template <class S>
struct BySlot {
  TypedIndex<S> slots;
  PageDiv div;
  int64_t capacity;
  __device__ __forceinline__ void operator()(int64_t tok, int64_t& page, int64_t& off) const {
    const int64_t s = slots.at(tok);
    page = -1;
    off = 0;
    if (s >= 0 && s < capacity) div(s, page, off);
  }
};

// Block (x, y) moves tokens [x * block_tokens, (x + 1) * block_tokens),
// accesses [y * kRowsBlock, (y + 1) * kRowsBlock) of their rows: several
// whole rows a block for short rows (gridDim.y == 1), one chunk of one row
// for long ones (block_tokens == 1, lanes == kRowsThreads).
template <class Where, class V, bool Flat>
__global__ void __launch_bounds__(kRowsThreads) append_rows_kernel(Where where, KParams p) {
  const uint32_t t = threadIdx.x;
  const uint32_t kt = divide(p.lane_div, t);  // the token of the block this thread works on
  const uint32_t u = t - kt * p.lanes;
  const int64_t tok = static_cast<int64_t>(blockIdx.x) * p.block_tokens + kt;
  if (kt >= p.block_tokens || tok >= p.nnz) return;
  const uint32_t v0 = blockIdx.y * kRowsBlock + u;
  const char* src_a = p.a.src + tok * p.a.src_token;
  const char* src_b = p.b.src + tok * p.b.src_token;
  V buf[kRowsPer];
#pragma unroll
  for (int k = 0; k < kRowsPer; ++k) {
    const uint32_t v = v0 + k * p.lanes;
    if (v < p.vecs) buf[k] = load_once(reinterpret_cast<const V*>(access_at<Flat, V>(p, v, src_a, src_b, true)));
  }
  int64_t page, off;
  where(tok, page, off);  // while the loads are in flight
  if (page < 0) return;
  char* dst_a = p.a.dst + page * p.a.dst_page + off * p.a.dst_token;
  char* dst_b = p.b.dst + page * p.b.dst_page + off * p.b.dst_token;
#pragma unroll
  for (int k = 0; k < kRowsPer; ++k) {
    const uint32_t v = v0 + k * p.lanes;
    if (v < p.vecs) *reinterpret_cast<V*>(access_at<Flat, V>(p, v, dst_a, dst_b, false)) = buf[k];
  }
}

template <class Where, class V, bool Flat>
void launch_rows(const Where& where, const KParams& p, dim3 grid, gpuStream_t stream) {
  append_rows_kernel<Where, V, Flat><<<grid, kRowsThreads, 0, stream>>>(where, p);
  gpu::check_launch("append_rows_kernel");
}

// A page-table append in the rows kernel: 16-byte accesses only (the host
// sends narrower rows to the classic kernel).
template <class Idx, class Pos>
void launch_rows_table(const PageTable<Idx>& table, const Job& job, const KParams& p, dim3 grid,
                       gpuStream_t stream) {
  const ByTable<Idx, Pos> where{table, page_div(table.page_size), typed<Pos>(job.batch), typed<Pos>(job.pos)};
  if (is_flat(p)) launch_rows<ByTable<Idx, Pos>, uint4, true>(where, p, grid, stream);
  else launch_rows<ByTable<Idx, Pos>, uint4, false>(where, p, grid, stream);
}

// batch_indices and positions of one dtype (the host checks).
template <class Idx>
void launch_rows_table(const PageTable<Idx>& table, const Job& job, const KParams& p, dim3 grid,
                       gpuStream_t stream) {
  if (job.batch.is64) launch_rows_table<Idx, int64_t>(table, job, p, grid, stream);
  else launch_rows_table<Idx, int32_t>(table, job, p, grid, stream);
}

// A slot-mapped append: rows are one run per stream (concat_and_cache_mla), any access width.
template <class S>
void launch_rows_slots(const Job& job, const KParams& p, int width, dim3 grid, gpuStream_t stream) {
  const BySlot<S> where{typed<S>(job.slot_map.slots), page_div(job.slot_map.page_size), job.slot_map.capacity};
  switch (width) {
    case 16: return launch_rows<BySlot<S>, uint4, true>(where, p, grid, stream);
    case 8: return launch_rows<BySlot<S>, uint2, true>(where, p, grid, stream);
    case 4: return launch_rows<BySlot<S>, unsigned int, true>(where, p, grid, stream);
    default: return launch_rows<BySlot<S>, unsigned short, true>(where, p, grid, stream);
  }
}

}  // namespace

// Grid and lanes of the rows kernel for `p`; false when the call is past
// what one launch of it covers (2^31 - 1 blocks of tokens, 65535 chunks of a row).
bool rows_shape(KParams& p, dim3& grid) {
  const uint32_t span = p.vecs < kRowsBlock ? p.vecs : kRowsBlock;  // accesses of a row one block moves
  p.lanes = (span + kRowsPer - 1) / kRowsPer;
  p.lane_div = fast_div(p.lanes);
  p.block_tokens = kRowsThreads / p.lanes;
  const int64_t chunks = (static_cast<int64_t>(p.vecs) + kRowsBlock - 1) / kRowsBlock;
  const int64_t blocks = (p.nnz + p.block_tokens - 1) / p.block_tokens;
  if (chunks > 65535 || blocks > 0x7fffffff) return false;
  grid = dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(chunks));
  return true;
}

void launch_rows_by_table(const Job& job, const KParams& p, dim3 grid, gpuStream_t stream) {
  if (job.table64) launch_rows_table(job.t64, job, p, grid, stream);
  else launch_rows_table(job.t32, job, p, grid, stream);
}

void launch_rows_by_slot(const Job& job, const KParams& p, int width, dim3 grid, gpuStream_t stream) {
  if (job.slot_map.slots.is64) launch_rows_slots<int64_t>(job, p, width, grid, stream);
  else launch_rows_slots<int32_t>(job, p, width, grid, stream);
}

}  // namespace mlacore::append
