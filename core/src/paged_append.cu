// Paged append kernels. The copy is bandwidth-bound only if every SM keeps
// enough bytes in flight (H200: ~4.2 TB/s over 132 SMs is ~32 KB per SM per
// microsecond of memory latency), so the kernel is shaped around that:
//  - a persistent grid of exactly the blocks that fit at once, each owning an
//    equal, contiguous range of tokens: no tail wave, and the sources of a
//    block are one contiguous region;
//  - a block takes its tokens in batches of up to kThreads: one thread per
//    token runs the page-table lookup (batch/positions -> kv_indptr ->
//    kv_indices, a chain of dependent loads), all of a batch's chains at once;
//  - source addresses do not depend on the page table, so the batch's first
//    round of source loads is issued before the lookups and the chains run
//    while those loads are in flight; the next batch's batch/position loads
//    are issued a batch ahead, so only the short indptr -> indices part is
//    left on the critical path;
//  - the copy is flat over (token, access) pairs, so every thread issues up to
//    kVecsPerThread independent 16-byte loads whatever the row length (a
//    power-of-two group per token left 44% of them idle for 1152-byte MLA
//    rows), then its stores, rounds spread evenly over the batch.
// The widest access every address and stride allows is used (16 bytes for
// any dtype whose rows are 16-byte multiples, which covers every head dim
// mlacore serves). Nothing depends on the warp size.

#include "gpu/compat.h"
#include "paged_append.h"

namespace mlacore::append {
namespace {

constexpr int kThreads = 256;
constexpr int kVecsPerThread = 8;
// Blocks resident per SM at <= 64 registers a thread (the launch bound below
// asks ptxas for that); also the persistent grid's blocks per SM.
constexpr int kBlocksPerSM = 4;
// Accesses one round of a block issues: kVecsPerThread per thread.
constexpr uint32_t kRound = kThreads * kVecsPerThread;

// n / d for n < 2^31 with one multiply-high (Granlund-Montgomery, round-up
// variant): the flat copy divides every access index by the row length, and
// GPUs have no integer divide (a 32-bit division is a dozen instructions).
struct FastDiv {
  uint32_t d = 1, mul = 1, shift = 0;
};

FastDiv fast_div(uint32_t d) {
  FastDiv f;
  f.d = d;
  while ((uint64_t{1} << f.shift) < d) ++f.shift;
  // 2^32 * (2^shift - d) / d + 1 < 2^32 since 2^shift < 2 * d.
  f.mul = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << f.shift) - d)) / d + 1);
  return f;
}

__device__ __forceinline__ uint32_t divide(const FastDiv& f, uint32_t n) {
  // mulhi(n, mul) <= n < 2^31, so the sum does not wrap.
  return (__umulhi(n, f.mul) + n) >> f.shift;
}

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
  uint32_t vecs;          // a.vecs + b.vecs
  FastDiv row;            // divides by vecs
  uint32_t batch_tokens;  // tokens per batch: <= kThreads, batch_tokens * vecs < 2^31
  int64_t share_q;        // nnz = share_q * grid + share_r: each block's share
  uint32_t share_r;
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

// q = n / d, r = n % d for 64-bit operands, one bit at a time. Only reached
// for positions or page sizes of 2^32 and more: nvcc's 64-bit division is a
// call, around which the first round's loaded rows (live here) would spill.
__device__ __forceinline__ void divide_slowly(uint64_t n, uint64_t d, uint64_t& q, uint64_t& r) {
  q = 0;
  r = 0;
#pragma unroll 1
  for (int i = 63; i >= 0; --i) {
    r = (r << 1) | ((n >> i) & 1);  // r < d < 2^63 before the shift: no overflow
    if (r >= d) {
      r -= d;
      q |= uint64_t{1} << i;
    }
  }
}

// Page and in-page offset of token `pos` of request `b`; page -1 when the
// token must be skipped. The same checks, in the same order, as
// PageTable::slot, through the same bounds-checked reads (pages_of,
// page_at); only the division differs (32-bit when the numbers fit).
template <class Idx>
__device__ __forceinline__ void locate(const PageTable<Idx>& t, int64_t b, int64_t pos, int64_t& page,
                                       int64_t& off) {
  page = -1;
  off = 0;
  int64_t begin, end;
  if (pos < 0 || !t.pages_of(b, begin, end)) return;
  int64_t in_request;
  if (((static_cast<uint64_t>(pos) | static_cast<uint64_t>(t.page_size)) >> 32) == 0) {
    const uint32_t q = static_cast<uint32_t>(pos) / static_cast<uint32_t>(t.page_size);
    in_request = q;
    off = static_cast<int64_t>(static_cast<uint32_t>(pos) - q * static_cast<uint32_t>(t.page_size));
  } else {
    uint64_t q, r;
    divide_slowly(static_cast<uint64_t>(pos), static_cast<uint64_t>(t.page_size), q, r);
    in_request = static_cast<int64_t>(q);
    off = static_cast<int64_t>(r);
  }
  // Compared before adding, as in PageTable::slot: no wrapped index.
  if (in_request >= end - begin) return;
  page = t.page_at(begin + in_request);
}

// Lookups of a batch, double-buffered: a warp writes buffer `parity` of the
// next batch only after the barrier of the current one, which every reader
// of that buffer's previous use (two batches back) has passed.
struct Rows {
  int64_t page[2][kThreads];  // < 0: skip the token
  int64_t off[2][kThreads];
};

// One block's tokens [first_tok, last_tok). Flat: both streams are one
// segment per row (NHD, contiguous heads, MLA), so access w of a stream's row
// is at row + w * sizeof(V); a template parameter, so the per-access code has
// neither a branch on it nor the segment division.
template <bool Flat, class Idx, class V>
__device__ __forceinline__ void copy_tokens(const PageTable<Idx>& table, const KParams& p, Rows& rows,
                                            int64_t first_tok, int64_t last_tok) {
  const uint32_t t = threadIdx.x;
  // Access j of the batch that starts at token `first`: access j % vecs of
  // token first + j / vecs; stream a's accesses first, then b's.
  auto src_of = [&](int64_t first, uint32_t j) -> const V* {
    const uint32_t k = divide(p.row, j);
    const uint32_t v = j - k * p.vecs;
    const int64_t tok = first + k;
    const char* row_a = p.a.src + tok * p.a.src_token;
    const char* row_b = p.b.src + tok * p.b.src_token;
    if (Flat) {
      const bool in_b = v >= p.a.vecs;
      return reinterpret_cast<const V*>(in_b ? row_b : row_a) + (in_b ? v - p.a.vecs : v);
    }
    return reinterpret_cast<const V*>(segmented<V>(p, v, row_a, row_b, true));
  };
  // nullptr when the token is skipped. Recomputed at store time rather than
  // kept from the loads, which keeps the kernel within 64 registers.
  auto dst_of = [&](int parity, uint32_t j) -> V* {
    const uint32_t k = divide(p.row, j);
    const uint32_t v = j - k * p.vecs;
    const int64_t page = rows.page[parity][k];
    if (page < 0) return nullptr;
    const int64_t off = rows.off[parity][k];
    // Pointer arithmetic, not integers: the compiler then knows every access
    // is global and emits STG rather than generic stores.
    char* row_a = p.a.dst + page * p.a.dst_page + off * p.a.dst_token;
    char* row_b = p.b.dst + page * p.b.dst_page + off * p.b.dst_token;
    if (Flat) {
      const bool in_b = v >= p.a.vecs;
      return reinterpret_cast<V*>(in_b ? row_b : row_a) + (in_b ? v - p.a.vecs : v);
    }
    return reinterpret_cast<V*>(segmented<V>(p, v, row_a, row_b, false));
  };

  // Batch index and position of this thread's token in the next batch:
  // loaded during the batch before, so only the indptr -> indices part of a
  // lookup is left for the batch itself.
  int64_t b = 0, pos = -1;
  if (t < p.batch_tokens && first_tok + t < last_tok) {
    b = p.batch.at(first_tok + t);
    pos = p.pos.at(first_tok + t);
  }
  int parity = 0;
  for (int64_t first = first_tok; first < last_tok; first += p.batch_tokens, parity ^= 1) {
    const int64_t left = last_tok - first;
    const uint32_t ntok = left < p.batch_tokens ? static_cast<uint32_t>(left) : p.batch_tokens;
    const uint32_t nacc = ntok * p.vecs;  // < 2^31 by the choice of batch_tokens
    // Rounds of (nearly) equal size, at most kRound, so the last round of a
    // batch is not a sliver with few bytes in flight: all blocks run in step
    // (equal shares, one wave), so a thin round would thin the whole GPU.
    const uint32_t rounds = (nacc + kRound - 1) / kRound;
    const uint32_t per_round = (nacc + rounds - 1) / rounds;

    for (uint32_t base = 0; base < nacc; base += per_round) {
      V buf[kVecsPerThread];
#pragma unroll
      for (int k = 0; k < kVecsPerThread; ++k) {
        const uint32_t i = k * kThreads + t;
        if (i < per_round && base + i < nacc) buf[k] = load_once(src_of(first, base + i));
      }
      if (base == 0) {
        // This round's loads are in flight while the lookups run.
        if (t < ntok) {
          int64_t page, off;
          locate(table, b, pos, page, off);
          rows.page[parity][t] = page;
          rows.off[parity][t] = off;
        }
        __syncthreads();
        // b and pos are free again: the next batch's, a batch ahead. (The
        // test on the uniform `left` keeps no per-thread 64-bit token index
        // alive across the batch, which cost the 16-byte kernels a spill.)
        const uint32_t ahead = p.batch_tokens + t;
        if (t < p.batch_tokens && ahead < left) {
          b = p.batch.at(first + ahead);
          pos = p.pos.at(first + ahead);
        }
      }
#pragma unroll
      for (int k = 0; k < kVecsPerThread; ++k) {
        const uint32_t i = k * kThreads + t;
        if (i < per_round && base + i < nacc) {
          V* to = dst_of(parity, base + i);
          if (to != nullptr) *to = buf[k];
        }
      }
    }
  }
}

template <class Idx, class V>
__global__ void __launch_bounds__(kThreads, kBlocksPerSM) append_kernel(PageTable<Idx> table, KParams p) {
  __shared__ Rows rows;
  // This block's share: tokens [floor(nnz * i / grid), floor(nnz * (i+1) / grid)),
  // from nnz = q * grid + r without the 64-bit product or division
  // (r * (i+1) < grid^2 < 2^32: the host keeps the grid below 2^16).
  const uint32_t i = blockIdx.x, grid = gridDim.x;
  const int64_t first_tok = p.share_q * i + (p.share_r * i) / grid;
  const int64_t last_tok = p.share_q * (i + 1) + (p.share_r * (i + 1)) / grid;
  if (p.a.seg_vecs == p.a.vecs && p.b.seg_vecs == p.b.vecs)
    copy_tokens<true, Idx, V>(table, p, rows, first_tok, last_tok);
  else
    copy_tokens<false, Idx, V>(table, p, rows, first_tok, last_tok);
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
void launch(const PageTable<Idx>& table, const KParams& p, unsigned blocks, gpuStream_t stream) {
  append_kernel<Idx, V><<<blocks, kThreads, 0, stream>>>(table, p);
}

template <class Idx>
void launch_width(const PageTable<Idx>& table, const KParams& p, int width, unsigned blocks, gpuStream_t stream) {
  switch (width) {
    case 16: return launch<Idx, uint4>(table, p, blocks, stream);
    case 8: return launch<Idx, uint2>(table, p, blocks, stream);
    case 4: return launch<Idx, unsigned int>(table, p, blocks, stream);
    default: return launch<Idx, unsigned short>(table, p, blocks, stream);
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
  p.row = fast_div(p.vecs);
  // One lookup per thread per batch, and a batch's access indices below 2^31
  // (the fast division's range).
  const uint32_t fit = static_cast<uint32_t>(((uint64_t{1} << 31) - 1) / p.vecs);
  p.batch_tokens = fit < 1 ? 1 : fit < static_cast<uint32_t>(kThreads) ? fit : kThreads;

  gpu::DeviceGuard guard(device);
  // Persistent grid: the blocks that are resident at once, each with an equal
  // share of the tokens. Fewer when there is less than a round per block, so
  // small appends do not spread a few tokens over hundreds of blocks.
  const int64_t tokens_per_round = p.vecs >= kRound ? 1 : kRound / p.vecs;
  const int64_t wanted = (p.nnz + tokens_per_round - 1) / tokens_per_round;
  // Asked once per device: the persistent grid needs it on every call, and the
  // host time of a small append is the bar.
  const int sms = gpu::device_attribute<gpuDevAttrMultiProcessorCount>(device);
  const int64_t resident = static_cast<int64_t>(sms > 1 ? sms : 1) * kBlocksPerSM;
  // Below 2^16 blocks, so the kernel's share arithmetic stays in 32 bits.
  const int64_t cap = resident < 65535 ? resident : 65535;
  const unsigned blocks = static_cast<unsigned>(wanted < cap ? wanted : cap);
  p.share_q = p.nnz / blocks;
  p.share_r = static_cast<uint32_t>(p.nnz % blocks);
  const gpuStream_t s = gpu::as_stream(stream);
  if (job.table64) launch_width(job.t64, p, width, blocks, s);
  else launch_width(job.t32, p, width, blocks, s);
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
