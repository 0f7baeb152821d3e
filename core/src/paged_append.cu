// Paged append kernels: per token, one page-table lookup, then its rows are
// copied with the widest access every address and stride allows (16 bytes
// for any dtype whose rows are 16-byte multiples, which covers every head
// dim mlacore serves). Launch shape comes from the row size: a group of
// `tpt` threads per token (a power of two), each issuing up to
// kVecsPerThread independent loads before its stores, so enough bytes are
// in flight to stream at full bandwidth without depending on the warp size.
#include "gpu/compat.h"
#include "paged_append.h"

namespace mlacore::append {
namespace {

constexpr int kThreads = 256;
constexpr int kVecsPerThread = 8;

struct KStream {
  const char* src;
  int64_t src_token, src_seg;
  char* dst;
  int64_t dst_page, dst_token, dst_seg;
  uint32_t seg_vecs;  // accesses per segment
  uint32_t vecs;      // accesses per token row (seg_vecs * segments)
};

struct KParams {
  KStream a, b;
  IndexVec batch, pos;
  int64_t nnz;
  uint32_t vecs;  // a.vecs + b.vecs
  int tpt_log2;   // threads per token = 1 << tpt_log2, at most kThreads
};

template <class V>
__device__ __forceinline__ V load_once(const V* p) {
#if defined(MLACORE_GPU_CUDA)
  return __ldg(p);  // read-only path: the sources are never written here
#else
  return *p;
#endif
}

// Address of access `v` of a token row when rows are split into segments
// (HND heads, strided source heads): accesses [0, a.vecs) are stream a's,
// the rest stream b's; within a stream, segment by segment.
template <class V, class Ptr>
__device__ __forceinline__ Ptr segmented(const KParams& p, uint32_t v, Ptr row_a, Ptr row_b, bool source) {
  const bool in_b = v >= p.a.vecs;
  const KStream& s = in_b ? p.b : p.a;
  const uint32_t w = in_b ? v - p.a.vecs : v;
  const uint32_t seg = w / s.seg_vecs;
  const uint32_t e = w - seg * s.seg_vecs;
  return (in_b ? row_b : row_a) + seg * (source ? s.src_seg : s.dst_seg) + e * sizeof(V);
}

// This thread's accesses of one token row: lane, lane + tpt, ... All loads
// first, then all stores, so up to kVecsPerThread independent requests per
// thread are in flight. Store addresses are recomputed rather than kept,
// which holds the kernel at 4 blocks per SM without spilling.
template <class V, class SrcAt, class DstAt>
__device__ __forceinline__ void copy_row(const KParams& p, uint32_t lane, uint32_t tpt, SrcAt src_at, DstAt dst_at) {
  for (uint32_t base = lane; base < p.vecs; base += tpt * kVecsPerThread) {
    V buf[kVecsPerThread];
#pragma unroll
    for (int k = 0; k < kVecsPerThread; ++k) {
      const uint32_t v = base + k * tpt;
      if (v < p.vecs) buf[k] = load_once(reinterpret_cast<const V*>(src_at(v)));
    }
#pragma unroll
    for (int k = 0; k < kVecsPerThread; ++k) {
      const uint32_t v = base + k * tpt;
      if (v < p.vecs) *reinterpret_cast<V*>(dst_at(v)) = buf[k];
    }
  }
}

template <class Idx, class V>
__global__ void __launch_bounds__(kThreads, 4) append_kernel(PageTable<Idx> table, KParams p) {
  // One lookup per token, by one thread, shared with the token's group: the
  // page-table reads and 64-bit divisions are not repeated tpt times.
  __shared__ int64_t row_page[kThreads];
  __shared__ int64_t row_off[kThreads];
  const uint32_t tpt = 1u << p.tpt_log2;
  const uint32_t lane = threadIdx.x & (tpt - 1);
  const uint32_t slot_in_block = threadIdx.x >> p.tpt_log2;
  const int64_t per_block = kThreads >> p.tpt_log2;
  const int64_t step = static_cast<int64_t>(gridDim.x) * per_block;
  // Both streams one segment per row (NHD, contiguous heads, MLA): an access
  // is row + v * sizeof(V), with stream b's row shifted back by a.vecs.
  const bool flat = p.a.seg_vecs == p.a.vecs && p.b.seg_vecs == p.b.vecs;
  const int64_t shift_b = -static_cast<int64_t>(p.a.vecs) * static_cast<int64_t>(sizeof(V));

  for (int64_t first = blockIdx.x * per_block; first < p.nnz; first += step) {
    if (threadIdx.x < per_block) {
      const int64_t tok = first + threadIdx.x;
      const int64_t slot = tok < p.nnz ? table.slot(p.batch.at(tok), p.pos.at(tok)) : -1;
      const int64_t page = slot < 0 ? -1 : slot / table.page_size;
      row_page[threadIdx.x] = page;
      row_off[threadIdx.x] = slot - page * table.page_size;
    }
    __syncthreads();
    const int64_t tok = first + slot_in_block;
    const int64_t page = row_page[slot_in_block];
    // page < 0: out-of-range token (or past nnz), skipped, writes nothing.
    if (tok < p.nnz && page >= 0) {
      const int64_t off = row_off[slot_in_block];
      // Pointer arithmetic, not integers: the compiler then knows every
      // access is global and emits LDG/STG rather than generic accesses.
      const char* src_a = p.a.src + tok * p.a.src_token;
      const char* src_b = p.b.src + tok * p.b.src_token;
      char* dst_a = p.a.dst + page * p.a.dst_page + off * p.a.dst_token;
      char* dst_b = p.b.dst + page * p.b.dst_page + off * p.b.dst_token;
      if (flat) {
        auto at = [&](uint32_t v) { return (v < p.a.vecs ? int64_t{0} : shift_b) + int64_t{v} * int64_t{sizeof(V)}; };
        copy_row<V>(
            p, lane, tpt, [&](uint32_t v) { return (v < p.a.vecs ? src_a : src_b) + at(v); },
            [&](uint32_t v) { return (v < p.a.vecs ? dst_a : dst_b) + at(v); });
      } else {
        copy_row<V>(
            p, lane, tpt, [&](uint32_t v) { return segmented<V>(p, v, src_a, src_b, true); },
            [&](uint32_t v) { return segmented<V>(p, v, dst_a, dst_b, false); });
      }
    }
    __syncthreads();  // the next round overwrites row_page / row_off
  }
}

// The widest access (16, 8, 4 or 2 bytes) that divides every address,
// stride and segment length of both streams.
int access_width(const Job& job) {
  uint64_t bits = 0;
  for (const CopyStream& s : job.streams) {
    bits |= reinterpret_cast<uintptr_t>(s.src) | reinterpret_cast<uintptr_t>(s.dst);
    bits |= static_cast<uint64_t>(s.src_token) | static_cast<uint64_t>(s.src_seg);
    bits |= static_cast<uint64_t>(s.dst_page) | static_cast<uint64_t>(s.dst_token) | static_cast<uint64_t>(s.dst_seg);
    bits |= static_cast<uint64_t>(s.seg_bytes);
  }
  for (int w = 16; w >= 2; w /= 2)
    if ((bits & static_cast<uint64_t>(w - 1)) == 0) return w;
  runtime_error("append: rows are not aligned to 2 bytes; every supported dtype is");
}

KStream kstream(const CopyStream& s, int width) {
  const int64_t seg_vecs = s.seg_bytes / width;
  const int64_t vecs = seg_vecs * s.num_seg;
  if (vecs > (int64_t{1} << 30)) value_error("append: a token row of ", s.seg_bytes * s.num_seg, " bytes is too long");
  return {s.src, s.src_token, s.src_seg, s.dst, s.dst_page, s.dst_token, s.dst_seg,
          static_cast<uint32_t>(seg_vecs), static_cast<uint32_t>(vecs)};
}

template <class Idx, class V>
void launch(const PageTable<Idx>& table, const KParams& p, gpuStream_t stream) {
  const int64_t per_block = kThreads >> p.tpt_log2;
  const unsigned blocks = gpu::blocks_for(p.nnz, static_cast<int>(per_block));
  append_kernel<Idx, V><<<blocks, kThreads, 0, stream>>>(table, p);
}

template <class Idx>
void launch_width(const PageTable<Idx>& table, const KParams& p, int width, gpuStream_t stream) {
  switch (width) {
    case 16: return launch<Idx, uint4>(table, p, stream);
    case 8: return launch<Idx, uint2>(table, p, stream);
    case 4: return launch<Idx, unsigned int>(table, p, stream);
    default: return launch<Idx, unsigned short>(table, p, stream);
  }
}

}  // namespace

void launch_gpu(const Job& job, int device, void* stream) {
  const int width = access_width(job);
  KParams p{};
  p.a = kstream(job.streams[0], width);
  p.b = kstream(job.streams[1], width);
  p.batch = job.batch;
  p.pos = job.pos;
  p.nnz = job.nnz;
  p.vecs = p.a.vecs + p.b.vecs;
  if (p.vecs == 0 || p.nnz == 0) return;
  // Smallest power-of-two group that covers the row in one round of
  // kVecsPerThread accesses per thread; longer rows loop inside the group.
  p.tpt_log2 = 0;
  while ((1u << p.tpt_log2) < static_cast<uint32_t>(kThreads) &&
         static_cast<uint64_t>(1u << p.tpt_log2) * kVecsPerThread < p.vecs)
    ++p.tpt_log2;

  gpu::DeviceGuard guard(device);
  const gpuStream_t s = gpu::as_stream(stream);
  if (job.table64) launch_width(job.t64, p, width, s);
  else launch_width(job.t32, p, width, s);
  gpu::check_launch("append_kernel");
}

void copy_to_host(void* dst, const void* src, int64_t bytes, int device, void* stream) {
  gpu::DeviceGuard guard(device);
  gpu::check(gpuMemcpyAsync(dst, src, static_cast<size_t>(bytes), gpuMemcpyDeviceToHost, gpu::as_stream(stream)),
             "append (strict): copying indices to the host");
}

void wait_stream(int device, void* stream) {
  gpu::DeviceGuard guard(device);
  gpu::check(gpuStreamSynchronize(gpu::as_stream(stream)), "append (strict): synchronizing the stream");
}

}  // namespace mlacore::append
