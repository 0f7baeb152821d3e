// Paged-append kernel variants against a plain device-to-device copy of the
// same bytes: which kernel shape gets a paged append to >= 0.90x (MLA) /
// >= 0.92x (MHA) of cudaMemcpy bandwidth on an H200. Standalone: no mlacore
// headers, so it can be built and run on its own on the GPU machine.
//
// Build and run (sm_90a: the bulk-copy variants need Hopper):
//   nvcc -O3 -std=c++17 -arch=sm_90a -o /tmp/av research/append_variants/append_variants.cu
//   /tmp/av [--reps N] [--pool F] [--cases mla,mla-view,mha] [--nnz 65536,262144]
// Exit status 0 only when every variant matched the reference everywhere.
//
// The problem (what append_paged_{mla_,}kv_cache does): token i's row goes to
//   slot = kv_indices[kv_indptr[batch[i]] + pos[i] / page_size] * page_size + pos[i] % page_size
// with every index checked (a token whose batch, position or page is out of
// range is skipped). A row is two streams, A and B:
//   mla       A = ckv 1024 B, B = kpe 128 B, from separate contiguous [nnz,512] and
//             [nnz,64] tensors, into the two halves of one [P, S, 576] bf16 buffer
//             (dst row stride 1152 B, B at +1024 B);
//   mla-view  the same, but A and B are views of one [nnz, 576] tensor (what
//             bench/append.py passes): source rows are 1152 B apart, B at +1024 B;
//   mha       A = K, B = V, 8 heads x 128 bf16 = 2048 B each, [nnz,8,128] sources
//             into two NHD caches [P, S, 8, 128].
// Requests, pages and positions follow bench/append.py (64 requests sharing
// the tokens, positions from 0), with the pages a random choice from a pool
// --pool (default 2) times the pages needed, in random order.
//
// Timing: CUDA events around each call, median of --reps (30), L2 flushed
// before every timed call by a 256 MB cudaMemsetAsync (as bench/_timing.py
// does with zero_()). GB/s counts bytes read + written (2 * nnz * row bytes);
// "x memcpy" = memcpy time / variant time, the figure the bars apply to.
//
// Variants (every one a persistent grid of the blocks that fit at once, with
// the row shape a template parameter so that token/vector splits are
// multiply-shifts, not runtime divisions):
//   memcpy      cudaMemcpyAsync D2D of nnz * row bytes: what torch copy_ does.
//   copy        grid-stride uint4 copy, one access per iteration: the trivial kernel.
//   copy8       grid-stride uint4 copy, 8 independent loads per thread before the
//               stores: what a plain SIMT copy reaches with enough bytes in flight.
//   ref         one thread per (token, 16 B) with slots precomputed on the host: the
//               validation reference; its time is scatter without any lookup.
//   warp        (a) one warp per U tokens (MLA U=4: 288 accesses = 9 per lane; MHA
//               U=1: 8 per lane): all loads first, then lanes 0..U-1 run the
//               lookups while the loads are in flight (batch/pos fetched one group
//               ahead), slots broadcast by shuffle, then the stores.
//   warp-cs     (d) as warp, with loads that skip L1 and are evict-first in L2
//               (ld.global.nc.L1::no_allocate.L2::cache_hint) and streaming stores
//               (st.global.cs): nothing of this traffic is reused.
//   warp-pipe   (d) as warp, register double-buffered: the loads of the next group
//               are issued before the stores of this one, so a warp never drains
//               its loads between groups (2 blocks/SM for the registers).
//   block       (b) the current mlacore design specialised to the row shape: a
//               block of 256 threads owns an equal contiguous share; per tile of 256
//               tokens, the first round's loads go out, one lookup per thread into
//               shared memory, one __syncthreads, then flat (token, vector) rounds
//               of 8 independent uint4 loads per thread before the stores.
//   tma         (c) Hopper bulk copies. Each warp owns a contiguous share and a ring
//               of K stages of G tokens in shared memory; lane t of the warp moves
//               token t of a stage: cp.async.bulk global->shared completing on the
//               stage's mbarrier, then cp.async.bulk shared->global to the slot,
//               committed as a bulk group. Loads run K-2 stages ahead; a stage is
//               refilled once wait_group.read says its stores have left shared
//               memory. Lookups: 32 tokens per warp (one per lane), a tile ahead.
//   tma-run     (c+d) as tma, but contiguous memory moves as one bulk copy: the
//               sources of a stage when they are contiguous (mla-view: one load of
//               G*1152 B; mha: one per stream), and the destination when the G
//               slots are consecutive (page size >= G: one store per stage for MLA,
//               one per stream for MHA).
// Validation: the cache is poisoned (0xA5 bytes) before each validation run and
// compared byte for byte with the reference's cache over the whole pool; the
// reference itself is checked independently (every written slot equals its
// source row, every other slot still holds the poison). Small cases with
// invalid tokens (bad batch, negative / out-of-range positions, bad page ids,
// per-request start offsets) exercise the bounds checks of every variant.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

void check(cudaError_t status, const char* what, const char* file, int line) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "%s:%d: %s: %s\n", file, line, what, cudaGetErrorString(status));
    std::exit(2);
  }
}
#define CK(x) check((x), #x, __FILE__, __LINE__)
#define CK_LAUNCH() CK(cudaGetLastError())

constexpr int kPoisonByte = 0xA5;
constexpr uint32_t kPoisonWord = 0xA5A5A5A5u;
constexpr unsigned kFull = 0xffffffffu;

// ---------------------------------------------------------------------------
// Problem description shared by all kernels
// ---------------------------------------------------------------------------

struct Table {
  const int* batch;
  const int* pos;
  const int* indptr;
  const int* indices;
  int batch_size;   // indptr has batch_size + 1 entries
  int num_indices;  // length of indices
  int num_pages;    // pool size: page ids >= num_pages are invalid
  int page_size;
};

// Byte strides everywhere: A and B are the two streams of a row (ckv/kpe, K/V).
struct Args {
  const char* srcA;
  const char* srcB;
  int64_t sA, sB;  // source token strides
  char* dstA;
  char* dstB;
  int64_t dA, dB;  // destination slot strides
  Table t;
  int nnz;
};

template <int RA_, int RB_>
struct Shape {
  static constexpr int RA = RA_, RB = RB_, ROW = RA + RB;
  static constexpr int VA = RA / 16, VB = RB / 16, V = VA + VB;  // 16-byte accesses
  static_assert(RA % 16 == 0 && RB % 16 == 0, "rows are whole 16-byte vectors");
};
using MlaShape = Shape<1024, 128>;
using MhaShape = Shape<2048, 2048>;

// Slot of token (b, pos), or -1: the checks of mlacore's PageTable::slot, in
// the same order. 32-bit arithmetic is exact here (all indices are int32).
__device__ __forceinline__ int64_t slot_of(const int* indptr, const int* indices, int batch_size,
                                                    int num_indices, int num_pages, int page_size, int b,
                                                    int pos) {
  if (pos < 0 || b < 0 || b >= batch_size) return -1;
  const int begin = __ldg(indptr + b), end = __ldg(indptr + b + 1);
  if (begin < 0 || begin > end || end > num_indices) return -1;
  const unsigned q = static_cast<unsigned>(pos) / static_cast<unsigned>(page_size);
  if (q >= static_cast<unsigned>(end - begin)) return -1;
  const int page = __ldg(indices + begin + static_cast<int>(q));
  if (page < 0 || page >= num_pages) return -1;
  return static_cast<int64_t>(page) * page_size + (static_cast<unsigned>(pos) - q * page_size);
}

__device__ __forceinline__ int64_t lookup(const Table& t, int b, int pos) {
  return slot_of(t.indptr, t.indices, t.batch_size, t.num_indices, t.num_pages, t.page_size, b, pos);
}

// Batch index and position of token `tok`, or a position that lookup() rejects
// when the token does not exist: callers prefetch these ahead of the lookup.
__device__ __forceinline__ void fetch_bp(const Table& t, int64_t tok, int64_t end, int& b, int& pos) {
  b = 0;
  pos = -1;
  if (tok < end) {
    b = __ldg(t.batch + tok);
    pos = __ldg(t.pos + tok);
  }
}

// Access v of a token row: stream A's first, then B's. Selects, not branches:
// within one unrolled access lanes may straddle the A/B boundary (MLA), and a
// branch there would split the warp's load into two passes.
template <class S>
__device__ __forceinline__ const uint4* src_vec(const Args& a, int64_t tok, int v) {
  const bool in_b = v >= S::VA;
  const char* base = in_b ? a.srcB : a.srcA;
  const int64_t stride = in_b ? a.sB : a.sA;
  return reinterpret_cast<const uint4*>(base + tok * stride) + (in_b ? v - S::VA : v);
}

template <class S>
__device__ __forceinline__ uint4* dst_vec(const Args& a, int64_t slot, int v) {
  const bool in_b = v >= S::VA;
  char* base = in_b ? a.dstB : a.dstA;
  const int64_t stride = in_b ? a.dB : a.dA;
  return reinterpret_cast<uint4*>(base + slot * stride) + (in_b ? v - S::VA : v);
}

// Streaming accesses: sources are read once and destinations not read again
// by this kernel, so neither should displace anything in L1/L2.
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

template <bool Stream>
__device__ __forceinline__ uint4 load16(const uint4* p, uint64_t policy) {
  if constexpr (Stream) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p), "l"(policy));
    return v;
  } else {
    (void)policy;
    return __ldg(p);
  }
}

template <bool Stream>
__device__ __forceinline__ void store16(uint4* p, const uint4& v) {
  if constexpr (Stream) __stcs(p, v);
  else *p = v;
}

// ---------------------------------------------------------------------------
// Baselines and the reference
// ---------------------------------------------------------------------------

__global__ void copy_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = __ldg(src + i);
}

__global__ void __launch_bounds__(256) copy8_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst,
                                                    int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; base < n; base += 8 * stride) {
    uint4 r[8];
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if (base + k * stride < n) r[k] = __ldg(src + base + k * stride);
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if (base + k * stride < n) dst[base + k * stride] = r[k];
  }
}

// Slots come from the host (host_slot), so the reference shares no lookup
// code with the variants it checks.
template <class S>
__global__ void ref_kernel(Args a, const int64_t* __restrict__ slots) {
  const int64_t n = static_cast<int64_t>(a.nnz) * S::V;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t tok = i / S::V;
    const int v = static_cast<int>(i - tok * S::V);
    const int64_t s = slots[tok];
    if (s >= 0) *dst_vec<S>(a, s, v) = *src_vec<S>(a, tok, v);
  }
}

// ---------------------------------------------------------------------------
// (a) warp per U tokens, and (d) its streaming-hint flavour
// ---------------------------------------------------------------------------

template <class S>
struct WarpTile;
template <>
struct WarpTile<MlaShape> {
  static constexpr int U = 4;  // ckv 4 * 64 = 256 accesses (8 a lane), kpe 4 * 8 = 32 (1 a lane)
};
template <>
struct WarpTile<MhaShape> {
  static constexpr int U = 1;  // K 128 accesses (4 a lane), V 128 (4 a lane)
};

// A lane's accesses of a warp group, stream by stream: every access of a
// lane knows its stream at compile time (no selects or divergence across the
// A/B boundary), and for A the token is a compile-time function of k too.
// f(k, token in group, stream B?, vector in the stream's row).
template <class S, class F>
__device__ __forceinline__ void for_each_access(int lane, F&& f) {
  constexpr int U = WarpTile<S>::U;
  constexpr int PA = S::VA * U / 32, PB = S::VB * U / 32;
  static_assert(S::VA * U % 32 == 0 && S::VB * U % 32 == 0, "whole accesses per lane in each stream");
#pragma unroll
  for (int k = 0; k < PA; ++k) {
    const int idx = k * 32 + lane;
    f(k, idx / S::VA, std::false_type{}, idx % S::VA);
  }
#pragma unroll
  for (int k = 0; k < PB; ++k) {
    const int idx = k * 32 + lane;
    f(PA + k, idx / S::VB, std::true_type{}, idx % S::VB);
  }
}

template <class InB>
__device__ __forceinline__ const uint4* src_of(const Args& a, int64_t tok, InB, int v) {
  if constexpr (InB::value) return reinterpret_cast<const uint4*>(a.srcB + tok * a.sB) + v;
  else return reinterpret_cast<const uint4*>(a.srcA + tok * a.sA) + v;
}

template <class InB>
__device__ __forceinline__ uint4* dst_of(const Args& a, int64_t slot, InB, int v) {
  if constexpr (InB::value) return reinterpret_cast<uint4*>(a.dstB + slot * a.dB) + v;
  else return reinterpret_cast<uint4*>(a.dstA + slot * a.dA) + v;
}

template <class S, bool Stream>
__global__ void __launch_bounds__(256, 4) warp_kernel(Args a) {
  constexpr int U = WarpTile<S>::U;
  constexpr int PER = U * S::V / 32;
  const int lane = threadIdx.x & 31;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  const int64_t groups = (static_cast<int64_t>(a.nnz) + U - 1) / U;
  const uint64_t policy = Stream ? evict_first_policy() : 0;

  int64_t g = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  int b, pos;  // lanes < U: the current group's token lane
  fetch_bp(a.t, lane < U ? g * U + lane : a.nnz, a.nnz, b, pos);
  for (; g < groups; g += nwarps) {
    const int64_t tok0 = g * U;
    uint4 buf[PER];
    for_each_access<S>(lane, [&](int k, int t, auto in_b, int v) {
      if (tok0 + t < a.nnz) buf[k] = load16<Stream>(src_of(a, tok0 + t, in_b, v), policy);
    });
    // The lookup chain runs while this group's loads are in flight.
    const int64_t slot = lane < U ? lookup(a.t, b, pos) : -1;
    fetch_bp(a.t, lane < U ? (g + nwarps) * U + lane : a.nnz, a.nnz, b, pos);
    for_each_access<S>(lane, [&](int k, int t, auto in_b, int v) {
      const int64_t s = __shfl_sync(kFull, slot, t);
      if (s >= 0) store16<Stream>(dst_of(a, s, in_b, v), buf[k]);  // s < 0 also for tokens past nnz
    });
  }
}

// (d) warp, double-buffered in registers: group g+1's loads are issued
// before group g's stores, so each warp keeps a group of loads in flight
// while it stores, instead of draining to zero once per group.
template <class S>
__global__ void __launch_bounds__(256, 2) warp_pipe_kernel(Args a) {
  constexpr int U = WarpTile<S>::U;
  constexpr int PER = U * S::V / 32;
  const int lane = threadIdx.x & 31;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  const int64_t groups = (static_cast<int64_t>(a.nnz) + U - 1) / U;

  auto load_group = [&](uint4 (&buf)[PER], int64_t g) {
    for_each_access<S>(lane, [&](int k, int t, auto in_b, int v) {
      if (g * U + t < a.nnz) buf[k] = __ldg(src_of(a, g * U + t, in_b, v));
    });
  };
  auto store_group = [&](const uint4 (&buf)[PER], int64_t slot) {
    for_each_access<S>(lane, [&](int k, int t, auto in_b, int v) {
      const int64_t s = __shfl_sync(kFull, slot, t);
      if (s >= 0) *dst_of(a, s, in_b, v) = buf[k];
    });
  };
  // Lookup of group g (lanes < U), prefetching the batch/pos of the group
  // after it so that only indptr -> indices is left on the next lookup's path.
  int b, pos;
  auto lookup_group = [&](int64_t g) -> int64_t {
    const int64_t slot = lane < U ? lookup(a.t, b, pos) : -1;
    fetch_bp(a.t, lane < U ? (g + nwarps) * U + lane : a.nnz, a.nnz, b, pos);
    return slot;
  };

  int64_t g = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (g >= groups) return;  // warp-uniform
  fetch_bp(a.t, lane < U ? g * U + lane : a.nnz, a.nnz, b, pos);
  uint4 buf0[PER], buf1[PER];
  load_group(buf0, g);
  int64_t slot0 = lookup_group(g), slot1 = -1;
  // Unrolled by two so the buffers swap roles without register moves.
  while (true) {
    int64_t next = g + nwarps;
    if (next < groups) load_group(buf1, next);
    store_group(buf0, slot0);
    if (next >= groups) break;
    slot1 = lookup_group(next);  // after the stores: they need not wait for it
    g = next;
    next = g + nwarps;
    if (next < groups) load_group(buf0, next);
    store_group(buf1, slot1);
    if (next >= groups) break;
    slot0 = lookup_group(next);
    g = next;
  }
}

// ---------------------------------------------------------------------------
// (b) block per contiguous share, lookups of a tile in shared memory
// ---------------------------------------------------------------------------

constexpr int kBlockThreads = 256;
constexpr int kBlockVecs = 8;  // independent 16-byte loads per thread per round

template <class S>
__global__ void __launch_bounds__(kBlockThreads, 4) block_kernel(Args a) {
  constexpr int kRound = kBlockThreads * kBlockVecs;
  // Double-buffered: a tile's slots are written after the barrier of the tile
  // before, which every reader of the same buffer (two tiles back) has passed.
  __shared__ int64_t slots[2][kBlockThreads];
  const int t = threadIdx.x;
  const int64_t first = static_cast<int64_t>(a.nnz) * blockIdx.x / gridDim.x;
  const int64_t last = static_cast<int64_t>(a.nnz) * (blockIdx.x + 1) / gridDim.x;
  int b, pos;
  fetch_bp(a.t, first + t, last, b, pos);
  int parity = 0;
  for (int64_t tile = first; tile < last; tile += kBlockThreads, parity ^= 1) {
    const int ntok = static_cast<int>(last - tile < kBlockThreads ? last - tile : kBlockThreads);
    const int nacc = ntok * S::V;
    for (int base = 0; base < nacc; base += kRound) {
      uint4 buf[kBlockVecs];
#pragma unroll
      for (int k = 0; k < kBlockVecs; ++k) {
        const int i = base + k * kBlockThreads + t;
        if (i < nacc) buf[k] = __ldg(src_vec<S>(a, tile + i / S::V, i % S::V));
      }
      if (base == 0) {
        // The first round's loads are in flight while the lookups run.
        if (t < ntok) slots[parity][t] = lookup(a.t, b, pos);
        __syncthreads();
        fetch_bp(a.t, tile + kBlockThreads + t, last, b, pos);
      }
#pragma unroll
      for (int k = 0; k < kBlockVecs; ++k) {
        const int i = base + k * kBlockThreads + t;
        if (i < nacc) {
          const int64_t s = slots[parity][i / S::V];
          if (s >= 0) *dst_vec<S>(a, s, i % S::V) = buf[k];
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// (c) Hopper bulk copies through a shared-memory ring per warp
// ---------------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n\t.reg .pred p;\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// Global -> shared, completing `bytes` of the barrier's transaction count.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

__device__ __forceinline__ void bulk_store(void* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(src), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }

// Until at most N of this thread's store groups still read shared memory.
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

// G tokens per stage, K stages per warp, W warps per block.
template <class S, int G, int K, int W>
struct TmaConfig {
  static constexpr int kG = G, kK = K, kW = W;
  static constexpr int kAhead = K - 2;  // stages of loads issued ahead of the stage being stored
  static constexpr uint32_t kStage = G * S::ROW;
  static constexpr size_t kSmem = static_cast<size_t>(W) * K * kStage + static_cast<size_t>(W) * K * 8;
  static_assert(32 % G == 0, "a 32-token lookup tile is whole stages");
  static_assert(K >= 3, "one stage loading, one storing, one draining");
  static_assert(kStage % 128 == 0, "stages stay 128-byte aligned");
};
template <class S>
struct TmaFor;
// MLA: 8 rows (9 KB) a stage, 6 stages, 4 warps: 221 KB, 147 KB of loads in flight per SM.
template <>
struct TmaFor<MlaShape> : TmaConfig<MlaShape, 8, 6, 4> {};
// MHA: 4 rows (16 KB) a stage, 6 stages, 2 warps: 192 KB, 128 KB of loads in flight per SM.
template <>
struct TmaFor<MhaShape> : TmaConfig<MhaShape, 4, 6, 2> {};

// `coalesce`: move contiguous sources and consecutive slots as one bulk copy
// (tma-run) instead of one per token row (tma). Uniform, so no divergence.
template <class S>
__global__ void __launch_bounds__(TmaFor<S>::kW * 32, 1) tma_kernel(Args a, int coalesce) {
  using C = TmaFor<S>;
  constexpr int G = C::kG, K = C::kK, D = C::kAhead;
  constexpr uint32_t STAGE = C::kStage;
  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const uint32_t ring = smem_addr(smem + static_cast<size_t>(warp) * K * STAGE);
  const uint32_t bars = smem_addr(smem + static_cast<size_t>(C::kW) * K * STAGE) + warp * K * 8;

  const int64_t nw = static_cast<int64_t>(gridDim.x) * C::kW;
  const int64_t gw = static_cast<int64_t>(blockIdx.x) * C::kW + warp;
  const int64_t first = a.nnz * gw / nw, last = a.nnz * (gw + 1) / nw;
  const int64_t items = (last - first + G - 1) / G;
  if (items == 0) return;  // warp-uniform; nothing of this warp was started

  if (lane == 0) {
    for (int i = 0; i < K; ++i) mbar_init(bars + 8 * i, 1);
    // Make the initialised barriers visible to the async (bulk-copy) proxy.
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncwarp();

  // Token-major stages ([G][A|B]) when A and B are adjacent in the destination
  // (MLA's one buffer): a token's row, or a run of them, leaves in one copy.
  // Otherwise stream-major ([G][A] then [G][B]) so each stream of a run is
  // contiguous in shared memory as in its cache.
  const bool token_major = a.dstB == a.dstA + S::RA && a.dA == S::ROW && a.dB == S::ROW;
  const bool src_merged = a.srcB == a.srcA + S::RA && a.sA == S::ROW && a.sB == S::ROW;
  const bool a_contig = coalesce && a.sA == S::RA, b_contig = coalesce && a.sB == S::RB;
  const bool dst_streams_contig = a.dA == S::RA && a.dB == S::RB;
  const int lane_b = G > 1 ? 1 : 0;  // second issuing lane, for stream B's single copies

  auto issue_loads = [&](int64_t item) {
    const uint32_t buf = ring + static_cast<uint32_t>(item % K) * STAGE, bar = bars + 8 * static_cast<uint32_t>(item % K);
    const int64_t tok0 = first + item * G;
    const int n = static_cast<int>(last - tok0 < G ? last - tok0 : G);
    // One arrival with the stage's bytes: the phase ends when they all landed.
    // (Other lanes' copies may complete bytes before this arrival; the phase
    // cannot end without it.)
    if (lane == 0) mbar_arrive_expect_tx(bar, static_cast<uint32_t>(n) * S::ROW);
    const int64_t tok = tok0 + lane;
    if (token_major) {
      if (src_merged && coalesce) {
        if (lane == 0) bulk_load(buf, a.srcA + tok0 * a.sA, n * S::ROW, bar);
      } else if (lane < n) {
        const uint32_t row = buf + lane * S::ROW;
        if (src_merged) {
          bulk_load(row, a.srcA + tok * a.sA, S::ROW, bar);
        } else {
          bulk_load(row, a.srcA + tok * a.sA, S::RA, bar);
          bulk_load(row + S::RA, a.srcB + tok * a.sB, S::RB, bar);
        }
      }
    } else {
      if (a_contig) {
        if (lane == 0) bulk_load(buf, a.srcA + tok0 * a.sA, n * S::RA, bar);
      } else if (lane < n) {
        bulk_load(buf + lane * S::RA, a.srcA + tok * a.sA, S::RA, bar);
      }
      if (b_contig) {
        if (lane == lane_b) bulk_load(buf + G * S::RA, a.srcB + tok0 * a.sB, n * S::RB, bar);
      } else if (lane < n) {
        bulk_load(buf + G * S::RA + lane * S::RB, a.srcB + tok * a.sB, S::RB, bar);
      }
    }
  };

  auto issue_stores = [&](int64_t item, int64_t tile_slot) {
    const uint32_t buf = ring + static_cast<uint32_t>(item % K) * STAGE, bar = bars + 8 * static_cast<uint32_t>(item % K);
    const int64_t tok0 = first + item * G;
    const int n = static_cast<int>(last - tok0 < G ? last - tok0 : G);
    // Lane t holds token t's slot (lanes >= G hold copies; they store nothing).
    const int64_t slot = __shfl_sync(kFull, tile_slot, static_cast<int>((item * G) & 31) + lane % G);
    bool run = false;
    int64_t slot0 = 0;
    if (coalesce) {
      slot0 = __shfl_sync(kFull, slot, 0);
      run = __all_sync(kFull, lane >= n || (slot >= 0 && slot == slot0 + lane));
    }
    mbar_wait(bar, static_cast<uint32_t>(item / K) & 1);
    if (run && token_major) {
      if (lane == 0) bulk_store(a.dstA + slot0 * a.dA, buf, n * S::ROW);
    } else if (run && dst_streams_contig) {
      if (lane == 0) bulk_store(a.dstA + slot0 * a.dA, buf, n * S::RA);
      if (lane == lane_b) bulk_store(a.dstB + slot0 * a.dB, buf + G * S::RA, n * S::RB);
    } else if (lane < n && slot >= 0) {
      if (token_major) {
        bulk_store(a.dstA + slot * a.dA, buf + lane * S::ROW, S::ROW);
      } else {
        bulk_store(a.dstA + slot * a.dA, buf + lane * S::RA, S::RA);
        bulk_store(a.dstB + slot * a.dB, buf + G * S::RA + lane * S::RB, S::RB);
      }
    }
    bulk_commit();  // every lane, every stage (empty groups included): the counts stay aligned
  };

  // Lookups, one token per lane, 32 tokens (a tile) at a time and a tile ahead
  // of the stores, with batch/pos a further tile ahead: the stores never wait
  // for a lookup, and the lookup's stall overlaps the stages in flight.
  int b, pos;
  fetch_bp(a.t, first + lane, last, b, pos);
  for (int64_t i = 0; i < D && i < items; ++i) issue_loads(i);
  int64_t slot_next = lookup(a.t, b, pos), slot_cur = -1;
  fetch_bp(a.t, first + 32 + lane, last, b, pos);

  for (int64_t item = 0; item < items; ++item) {
    if (item + D < items) {
      // The stage about to be refilled last held item + D - K = item - 2,
      // whose stores were committed two groups ago: at most one (item - 1's)
      // may still be reading shared memory.
      bulk_wait_read<K - D - 1>();
      __syncwarp();
      issue_loads(item + D);
    }
    if (((item * G) & 31) == 0) {
      const int64_t tile = item * G / 32;
      slot_cur = slot_next;
      slot_next = lookup(a.t, b, pos);  // tile + 1
      fetch_bp(a.t, first + (tile + 2) * 32 + lane, last, b, pos);
    }
    issue_stores(item, slot_cur);
  }
  bulk_wait_all();  // shared memory must outlive the reads of the last stores
}

// ---------------------------------------------------------------------------
// Validation kernels
// ---------------------------------------------------------------------------

__device__ __forceinline__ void count_into(unsigned long long* out, bool bad) {
  // One atomic per warp that saw a mismatch.
  const unsigned m = __ballot_sync(kFull, bad);
  if (m != 0 && (threadIdx.x & 31) == 0) atomicAdd(out, static_cast<unsigned long long>(__popc(m)));
}

__device__ __forceinline__ bool same(const uint4& x, const uint4& y) {
  return x.x == y.x && x.y == y.y && x.z == y.z && x.w == y.w;
}

// Grid-stride loops keep whole warps in the loop (the ballot needs them).
__global__ void count_diff_kernel(const uint4* x, const uint4* y, int64_t n, unsigned long long* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t start = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t base = start - (start & 31); base < n; base += stride) {
    const int64_t i = base + (threadIdx.x & 31);
    count_into(out, i < n && !same(x[i], y[i]));
  }
}

template <class S>
__global__ void count_bad_rows_kernel(Args a, const int64_t* slots, unsigned long long* out) {
  const int64_t n = static_cast<int64_t>(a.nnz) * S::V;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t start = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t base = start - (start & 31); base < n; base += stride) {
    const int64_t i = base + (threadIdx.x & 31);
    bool bad = false;
    if (i < n) {
      const int64_t tok = i / S::V;
      const int v = static_cast<int>(i - tok * S::V);
      const int64_t s = slots[tok];
      bad = s >= 0 && !same(*dst_vec<S>(a, s, v), *src_vec<S>(a, tok, v));
    }
    count_into(out, bad);
  }
}

// Words of unwritten slots that lost the poison.
__global__ void count_unpoisoned_kernel(const char* cache, int64_t slot_stride, int words, const uint8_t* written,
                                        int64_t nslots, unsigned long long* out) {
  const int64_t n = nslots * words;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t start = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t base = start - (start & 31); base < n; base += stride) {
    const int64_t i = base + (threadIdx.x & 31);
    bool bad = false;
    if (i < n) {
      const int64_t s = i / words;
      if (!written[s]) {
        const uint4 w = reinterpret_cast<const uint4*>(cache + s * slot_stride)[i - s * words];
        bad = w.x != kPoisonWord || w.y != kPoisonWord || w.z != kPoisonWord || w.w != kPoisonWord;
      }
    }
    count_into(out, bad);
  }
}

// Random bf16 bit patterns that are never zero and never the poison.
__global__ void fill_random_kernel(uint16_t* p, int64_t n, uint64_t seed) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    uint16_t v = static_cast<uint16_t>(z);
    if ((v & 0x7fff) == 0 || v == 0xA5A5) v = 0x3F80;  // bf16 1.0
    p[i] = v;
  }
}

// ---------------------------------------------------------------------------
// Host side
// ---------------------------------------------------------------------------

int g_sms = 0;

// Device buffer; frees itself (checked) at scope end.
class DevBuf {
 public:
  DevBuf() = default;
  explicit DevBuf(size_t bytes) : bytes_(bytes) { CK(cudaMalloc(&p_, bytes ? bytes : 16)); }
  DevBuf(DevBuf&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(o.bytes_) {}
  DevBuf& operator=(DevBuf&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() {
    if (p_) CK(cudaFree(p_));
  }
  template <class T = char>
  T* get() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

template <class T>
DevBuf upload(const std::vector<T>& v) {
  DevBuf d(v.size() * sizeof(T));
  if (!v.empty()) CK(cudaMemcpy(d.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

template <class Kernel>
int resident_grid(Kernel kernel, int threads, size_t smem) {
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  if (per_sm < 1) {
    std::fprintf(stderr, "a kernel does not fit on an SM (%d threads, %zu B shared)\n", threads, smem);
    std::exit(2);
  }
  return per_sm * g_sms;
}

unsigned long long read_counter(const DevBuf& c) {
  unsigned long long v = 0;
  CK(cudaMemcpy(&v, c.get(), sizeof v, cudaMemcpyDeviceToHost));
  return v;
}

enum class Layout { Mla, MlaView, Mha };

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::Mla: return "mla";
    case Layout::MlaView: return "mla-view";
    default: return "mha";
  }
}

// Host page tables of one case, and the slot of every token.
struct HostTables {
  std::vector<int> batch, pos, indptr, indices;
  int batch_size = 0, num_pages = 0;
  std::vector<int64_t> slots;  // -1: skipped
};

// The slot rule written again, in 64-bit host arithmetic, for the reference:
// a slip in the kernels' slot_of() cannot hide by being shared with it.
int64_t host_slot(const HostTables& h, int64_t page_size, int64_t b, int64_t pos) {
  if (b < 0 || b >= h.batch_size || pos < 0) return -1;
  const int64_t begin = h.indptr[b], end = h.indptr[b + 1];
  if (begin < 0 || end < begin || end > static_cast<int64_t>(h.indices.size())) return -1;
  const int64_t i = begin + pos / page_size;
  if (i >= end) return -1;
  const int64_t page = h.indices[i];
  return page < 0 || page >= h.num_pages ? -1 : page * page_size + pos % page_size;
}

// Timed cases: bench/append.py's requests (min(nnz/16, 64) of them, positions
// from 0), pages drawn at random from a pool `pool` times the pages needed.
// Edge cases: 5 requests with random start offsets, plus invalid tokens and
// page ids that every variant must skip.
HostTables make_tables(int nnz, int page_size, double pool, bool edge, std::mt19937_64& rng) {
  HostTables h;
  const int nb = edge ? std::min(nnz, 5) : std::max(std::min(nnz / 16, 64), 1);
  std::vector<int> len(nb), start(nb, 0);
  if (edge) {
    std::vector<int> cuts{0, nnz};
    for (int i = 0; i < nb - 1; ++i) cuts.push_back(static_cast<int>(rng() % (nnz + 1)));
    std::sort(cuts.begin(), cuts.end());
    for (int i = 0; i < nb; ++i) {
      len[i] = cuts[i + 1] - cuts[i];
      start[i] = static_cast<int>(rng() % (3 * page_size + 1));
    }
  } else {
    for (int i = 0; i < nb; ++i) len[i] = nnz / nb + (i < nnz % nb ? 1 : 0);
  }
  h.batch_size = nb;
  h.indptr.assign(nb + 1, 0);
  for (int i = 0; i < nb; ++i) h.indptr[i + 1] = h.indptr[i] + (start[i] + len[i] + page_size - 1) / page_size;
  const int needed = h.indptr[nb];
  h.num_pages = std::max(static_cast<int>(needed * pool), needed) + (edge ? 3 : 0);
  std::vector<int> perm(h.num_pages);
  for (int i = 0; i < h.num_pages; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  h.indices.assign(perm.begin(), perm.begin() + needed);
  for (int i = 0; i < nb; ++i)
    for (int j = 0; j < len[i]; ++j) {
      h.batch.push_back(i);
      h.pos.push_back(start[i] + j);
    }
  if (edge) {
    // Every kind of invalid token, each only where it cannot collide with a
    // valid token's slot (skipped tokens write nothing).
    auto bad = [&](int tok, int b, int p) {
      if (tok < nnz) {
        h.batch[tok] = b;
        h.pos[tok] = p;
      }
    };
    bad(1, -1, 0);                        // batch below range
    bad(2, nb, 0);                        // batch past the last request
    bad(5, 0, -3);                        // negative position
    bad(11, 0, 0x7fffffff);               // position far past the request's pages
    if (nnz > 7) bad(7, h.batch[7], (h.indptr[h.batch[7] + 1] - h.indptr[h.batch[7]]) * page_size);  // one past
    if (needed > 2) {
      h.indices[needed / 2] = -1;           // hole in the table
      h.indices[needed - 1] = h.num_pages;  // page id past the pool
    }
  }
  h.slots.resize(nnz);
  for (int i = 0; i < nnz; ++i) h.slots[i] = host_slot(h, page_size, h.batch[i], h.pos[i]);
  return h;
}

struct Result {
  std::string case_name, variant;
  double ms = 0, gbps = 0, ratio = 0;
  bool pass = true;
  bool candidate = false;
};

class Timer {
 public:
  Timer(int reps, DevBuf& flush) : reps_(reps), flush_(flush), start_(reps), stop_(reps) {
    for (int i = 0; i < reps; ++i) {
      CK(cudaEventCreate(&start_[i]));
      CK(cudaEventCreate(&stop_[i]));
    }
  }
  ~Timer() {
    for (int i = 0; i < reps_; ++i) {
      CK(cudaEventDestroy(start_[i]));
      CK(cudaEventDestroy(stop_[i]));
    }
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  // Median device time of fn() in ms, L2 flushed before each call.
  double median_ms(const std::function<void()>& fn) {
    for (int i = 0; i < 3; ++i) fn();
    for (int i = 0; i < reps_; ++i) {
      CK(cudaMemsetAsync(flush_.get(), i & 0xff, flush_.bytes(), 0));
      CK(cudaEventRecord(start_[i], 0));
      fn();
      CK(cudaEventRecord(stop_[i], 0));
    }
    CK(cudaDeviceSynchronize());
    std::vector<float> t(reps_);
    for (int i = 0; i < reps_; ++i) CK(cudaEventElapsedTime(&t[i], start_[i], stop_[i]));
    std::sort(t.begin(), t.end());
    return reps_ % 2 ? t[reps_ / 2] : 0.5 * (t[reps_ / 2 - 1] + t[reps_ / 2]);
  }

 private:
  int reps_;
  DevBuf& flush_;
  std::vector<cudaEvent_t> start_, stop_;
};

struct Variant {
  const char* name;
  std::function<void(const Args&)> run;
};

template <class S>
std::vector<Variant> candidates() {
  const int warp_grid = resident_grid(warp_kernel<S, false>, 256, 0);
  const int warp_cs_grid = resident_grid(warp_kernel<S, true>, 256, 0);
  const int pipe_grid = resident_grid(warp_pipe_kernel<S>, 256, 0);
  const int block_grid = resident_grid(block_kernel<S>, kBlockThreads, 0);
  using C = TmaFor<S>;
  CK(cudaFuncSetAttribute(tma_kernel<S>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(C::kSmem)));
  const int tma_grid = resident_grid(tma_kernel<S>, C::kW * 32, C::kSmem);
  return {
      {"warp", [=](const Args& a) { warp_kernel<S, false><<<warp_grid, 256>>>(a); CK_LAUNCH(); }},
      {"warp-cs", [=](const Args& a) { warp_kernel<S, true><<<warp_cs_grid, 256>>>(a); CK_LAUNCH(); }},
      {"warp-pipe", [=](const Args& a) { warp_pipe_kernel<S><<<pipe_grid, 256>>>(a); CK_LAUNCH(); }},
      {"block", [=](const Args& a) { block_kernel<S><<<block_grid, kBlockThreads>>>(a); CK_LAUNCH(); }},
      {"tma", [=](const Args& a) { tma_kernel<S><<<tma_grid, C::kW * 32, C::kSmem>>>(a, 0); CK_LAUNCH(); }},
      {"tma-run", [=](const Args& a) { tma_kernel<S><<<tma_grid, C::kW * 32, C::kSmem>>>(a, 1); CK_LAUNCH(); }},
  };
}

// Device state of one case: sources, caches (and the reference's), tables.
template <class S>
struct DeviceCase {
  Layout layout;
  int nnz, page_size;
  int64_t nslots;
  DevBuf srcA, srcB, cacheA, cacheB, refA, refB;
  DevBuf batch, pos, indptr, indices, slots, written;
  HostTables h;

  // Args pointing at the variant caches (ref = false) or the reference's.
  Args args(bool ref) const {
    Args a{};
    a.srcA = srcA.get();
    a.sA = layout == Layout::MlaView ? S::ROW : S::RA;
    a.srcB = layout == Layout::MlaView ? srcA.get() + S::RA : srcB.get();
    a.sB = layout == Layout::MlaView ? S::ROW : S::RB;
    char* base = ref ? refA.get() : cacheA.get();
    a.dstA = base;
    if (layout == Layout::Mha) {
      a.dstB = ref ? refB.get() : cacheB.get();
      a.dA = S::RA;
      a.dB = S::RB;
    } else {
      a.dstB = base + S::RA;
      a.dA = a.dB = S::ROW;
    }
    a.t = Table{batch.get<int>(), pos.get<int>(), indptr.get<int>(), indices.get<int>(), h.batch_size,
                static_cast<int>(h.indices.size()), h.num_pages, page_size};
    a.nnz = nnz;
    return a;
  }

  void poison(bool ref) {
    CK(cudaMemsetAsync(ref ? refA.get() : cacheA.get(), kPoisonByte, cacheA.bytes(), 0));
    if (layout == Layout::Mha) CK(cudaMemsetAsync(ref ? refB.get() : cacheB.get(), kPoisonByte, cacheB.bytes(), 0));
  }
};

template <class S>
DeviceCase<S> make_case(Layout layout, int nnz, int page_size, double pool, bool edge, std::mt19937_64& rng) {
  DeviceCase<S> c;
  c.layout = layout;
  c.nnz = nnz;
  c.page_size = page_size;
  c.h = make_tables(nnz, page_size, pool, edge, rng);
  c.nslots = static_cast<int64_t>(c.h.num_pages) * page_size;
  c.batch = upload(c.h.batch);
  c.pos = upload(c.h.pos);
  c.indptr = upload(c.h.indptr);
  c.indices = upload(c.h.indices);
  c.slots = upload(c.h.slots);
  std::vector<uint8_t> written(c.nslots, 0);
  for (int64_t s : c.h.slots)
    if (s >= 0) written[s] = 1;
  c.written = upload(written);

  auto fill = [&](DevBuf& b) {
    fill_random_kernel<<<4 * g_sms, 256>>>(b.get<uint16_t>(), static_cast<int64_t>(b.bytes() / 2), rng());
    CK_LAUNCH();
  };
  if (layout == Layout::MlaView) {
    c.srcA = DevBuf(static_cast<size_t>(nnz) * S::ROW);
    fill(c.srcA);
  } else {
    c.srcA = DevBuf(static_cast<size_t>(nnz) * S::RA);
    c.srcB = DevBuf(static_cast<size_t>(nnz) * S::RB);
    fill(c.srcA);
    fill(c.srcB);
  }
  if (layout == Layout::Mha) {
    c.cacheA = DevBuf(c.nslots * S::RA);
    c.cacheB = DevBuf(c.nslots * S::RB);
    c.refA = DevBuf(c.nslots * S::RA);
    c.refB = DevBuf(c.nslots * S::RB);
  } else {
    c.cacheA = DevBuf(c.nslots * S::ROW);
    c.refA = DevBuf(c.nslots * S::ROW);
  }
  return c;
}

// Mismatched 16-byte words between the variant caches and the reference's.
template <class S>
unsigned long long diff_vs_ref(const DeviceCase<S>& c, DevBuf& counter) {
  CK(cudaMemsetAsync(counter.get(), 0, sizeof(unsigned long long), 0));
  auto diff = [&](const DevBuf& x, const DevBuf& y) {
    count_diff_kernel<<<4 * g_sms, 256>>>(x.get<uint4>(), y.get<uint4>(), static_cast<int64_t>(x.bytes() / 16),
                                          counter.get<unsigned long long>());
    CK_LAUNCH();
  };
  diff(c.cacheA, c.refA);
  if (c.layout == Layout::Mha) diff(c.cacheB, c.refB);
  return read_counter(counter);
}

// Checks the reference's own output: written slots hold their rows, the rest the poison.
template <class S>
bool reference_ok(const DeviceCase<S>& c, DevBuf& counter) {
  CK(cudaMemsetAsync(counter.get(), 0, sizeof(unsigned long long), 0));
  count_bad_rows_kernel<S><<<4 * g_sms, 256>>>(c.args(true), c.slots.template get<int64_t>(),
                                               counter.get<unsigned long long>());
  CK_LAUNCH();
  const unsigned long long bad_rows = read_counter(counter);
  CK(cudaMemsetAsync(counter.get(), 0, sizeof(unsigned long long), 0));
  auto unpoisoned = [&](const DevBuf& cache, int64_t stride, int words) {
    count_unpoisoned_kernel<<<4 * g_sms, 256>>>(cache.get(), stride, words, c.written.template get<uint8_t>(),
                                                c.nslots, counter.get<unsigned long long>());
    CK_LAUNCH();
  };
  if (c.layout == Layout::Mha) {
    unpoisoned(c.refA, S::RA, S::VA);
    unpoisoned(c.refB, S::RB, S::VB);
  } else {
    unpoisoned(c.refA, S::ROW, S::V);
  }
  const unsigned long long bad_poison = read_counter(counter);
  if (bad_rows || bad_poison)
    std::printf("  reference FAILED its own check: %llu row words wrong, %llu unwritten words not poison\n", bad_rows,
                bad_poison);
  return bad_rows == 0 && bad_poison == 0;
}

struct Options {
  int reps = 30;
  double pool = 2.0;
  std::vector<Layout> layouts{Layout::Mla, Layout::MlaView, Layout::Mha};
  std::vector<int> sizes{65536, 262144};
};

template <class S>
void run_layout(Layout layout, const Options& o, Timer& timer, DevBuf& counter, std::vector<Result>& results,
                int& failures) {
  std::mt19937_64 rng(0x5eed + static_cast<int>(layout));
  const std::vector<Variant> vars = candidates<S>();
  const int ref_grid = 8 * g_sms;

  // Validate a variant on a case: poison, run, compare with the reference.
  auto validate = [&](DeviceCase<S>& c, const Variant& v) {
    c.poison(false);
    v.run(c.args(false));
    CK(cudaDeviceSynchronize());
    return diff_vs_ref(c, counter);
  };
  auto prepare_reference = [&](DeviceCase<S>& c, const std::string& name) {
    c.poison(true);
    ref_kernel<S><<<ref_grid, 256>>>(c.args(true), c.slots.template get<int64_t>());
    CK_LAUNCH();
    CK(cudaDeviceSynchronize());
    if (!reference_ok(c, counter)) {
      std::printf("%s: reference broken, variants not judged\n", name.c_str());
      ++failures;
      return false;
    }
    return true;
  };

  // Edge cases: invalid tokens and odd sizes, validation only.
  int edge_fail = 0, edge_runs = 0;
  for (int nnz : {1, 37, 3001})
    for (int ps : {1, 16, 64}) {
      DeviceCase<S> c = make_case<S>(layout, nnz, ps, o.pool, true, rng);
      const std::string name = std::string(layout_name(layout)) + " edge nnz=" + std::to_string(nnz) +
                               " ps=" + std::to_string(ps);
      if (!prepare_reference(c, name)) continue;
      for (const Variant& v : vars) {
        const unsigned long long bad = validate(c, v);
        ++edge_runs;
        if (bad) {
          ++edge_fail;
          std::printf("FAIL %-40s %-10s %llu words differ from the reference\n", name.c_str(), v.name, bad);
        }
      }
    }
  failures += edge_fail;
  std::printf("%s edge cases (invalid tokens, offsets, nnz 1/37/3001): %d/%d variant runs PASS\n",
              layout_name(layout), edge_runs - edge_fail, edge_runs);
  std::fflush(stdout);

  for (int nnz : o.sizes)
    for (int ps : {1, 16, 64}) {
      DeviceCase<S> c = make_case<S>(layout, nnz, ps, o.pool, false, rng);
      const std::string name =
          std::string(layout_name(layout)) + " nnz=" + std::to_string(nnz) + " ps=" + std::to_string(ps);
      const int64_t row_bytes = static_cast<int64_t>(nnz) * S::ROW;
      const double moved = 2.0 * static_cast<double>(row_bytes);
      auto add = [&](const char* variant, double ms, bool pass, bool candidate, double base_ms) {
        Result r{name, variant, ms, moved / (ms * 1e6), base_ms / ms, pass, candidate};
        results.push_back(r);
        std::printf("%-26s %-10s %9.4f ms %8.1f GB/s %6.3fx %s\n", name.c_str(), variant, ms, r.gbps, r.ratio,
                    pass ? "PASS" : "FAIL");
        std::fflush(stdout);
      };

      // Baselines over the same number of bytes, contiguous to contiguous
      // (freed before the variants run: the large MHA case needs the memory).
      double memcpy_ms = 0;
      {
        DevBuf from(row_bytes), to(row_bytes);
        fill_random_kernel<<<4 * g_sms, 256>>>(from.get<uint16_t>(), row_bytes / 2, rng());
        CK_LAUNCH();
        memcpy_ms = timer.median_ms(
            [&] { CK(cudaMemcpyAsync(to.get(), from.get(), row_bytes, cudaMemcpyDeviceToDevice, 0)); });
        add("memcpy", memcpy_ms, true, false, memcpy_ms);
        const int64_t nvec = row_bytes / 16;
        const int copy_grid = resident_grid(copy_kernel, 256, 0), copy8_grid = resident_grid(copy8_kernel, 256, 0);
        auto copy1 = [&] {
          copy_kernel<<<copy_grid, 256>>>(from.get<uint4>(), to.get<uint4>(), nvec);
          CK_LAUNCH();
        };
        auto copy8 = [&] {
          copy8_kernel<<<copy8_grid, 256>>>(from.get<uint4>(), to.get<uint4>(), nvec);
          CK_LAUNCH();
        };
        for (const auto& [label, fn] : {std::pair<const char*, std::function<void()>>{"copy", copy1}, {"copy8", copy8}}) {
          CK(cudaMemsetAsync(to.get(), 0, row_bytes, 0));
          fn();
          CK(cudaMemsetAsync(counter.get(), 0, sizeof(unsigned long long), 0));
          count_diff_kernel<<<4 * g_sms, 256>>>(from.get<uint4>(), to.get<uint4>(), nvec,
                                                counter.get<unsigned long long>());
          CK_LAUNCH();
          const bool ok = read_counter(counter) == 0;
          failures += !ok;
          add(label, timer.median_ms(fn), ok, false, memcpy_ms);
        }
      }

      if (!prepare_reference(c, name)) continue;
      const Args ref_args = c.args(true);
      add("ref", timer.median_ms([&] {
            ref_kernel<S><<<ref_grid, 256>>>(ref_args, c.slots.template get<int64_t>());
            CK_LAUNCH();
          }),
          true, false, memcpy_ms);
      for (const Variant& v : vars) {
        const unsigned long long bad = validate(c, v);
        if (bad) {
          ++failures;
          std::printf("FAIL %s %s: %llu words differ from the reference\n", name.c_str(), v.name, bad);
        }
        const Args va = c.args(false);
        add(v.name, timer.median_ms([&] { v.run(va); }), bad == 0, true, memcpy_ms);
      }
    }
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t comma = s.find(',', at);
    out.push_back(s.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const char* val = i + 1 < argc ? argv[i + 1] : nullptr;
    if (arg == "--reps" && val) {
      o.reps = std::max(1, std::atoi(val));
      ++i;
    } else if (arg == "--pool" && val) {
      o.pool = std::max(1.0, std::atof(val));
      ++i;
    } else if (arg == "--cases" && val) {
      o.layouts.clear();
      for (const std::string& c : split(val)) {
        if (c == "mla") o.layouts.push_back(Layout::Mla);
        else if (c == "mla-view") o.layouts.push_back(Layout::MlaView);
        else if (c == "mha") o.layouts.push_back(Layout::Mha);
        else {
          std::fprintf(stderr, "unknown case %s\n", c.c_str());
          std::exit(2);
        }
      }
      ++i;
    } else if (arg == "--nnz" && val) {
      o.sizes.clear();
      for (const std::string& n : split(val)) o.sizes.push_back(std::max(1, std::atoi(n.c_str())));
      ++i;
    } else {
      std::fprintf(stderr, "usage: %s [--reps N] [--pool F] [--cases mla,mla-view,mha] [--nnz 65536,262144]\n",
                   argv[0]);
      std::exit(2);
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  int dev = 0;
  CK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  g_sms = prop.multiProcessorCount;
  if (prop.major < 9) {
    std::fprintf(stderr, "needs sm_90 or newer (bulk copies); this is sm_%d%d\n", prop.major, prop.minor);
    return 2;
  }
  std::printf("%s: %d SMs, L2 %d MB; reps %d, pool %.1fx pages needed\n", prop.name, g_sms, prop.l2CacheSize >> 20,
              o.reps, o.pool);
  std::printf("MLA tma: %zu B smem/block; MHA tma: %zu B smem/block\n\n", TmaFor<MlaShape>::kSmem,
              TmaFor<MhaShape>::kSmem);

  DevBuf flush(size_t{256} << 20);
  DevBuf counter(sizeof(unsigned long long));
  Timer timer(o.reps, flush);
  std::vector<Result> results;
  int failures = 0;
  for (Layout l : o.layouts) {
    if (l == Layout::Mha) run_layout<MhaShape>(l, o, timer, counter, results, failures);
    else run_layout<MlaShape>(l, o, timer, counter, results, failures);
  }

  std::printf("\n%-26s %-10s %10s %9s %9s %s\n", "case", "variant", "ms", "GB/s", "x memcpy", "valid");
  std::string last;
  for (const Result& r : results) {
    if (r.case_name != last && !last.empty()) std::printf("\n");
    last = r.case_name;
    std::printf("%-26s %-10s %10.4f %9.1f %9.3f %s\n", r.case_name.c_str(), r.variant.c_str(), r.ms, r.gbps, r.ratio,
                r.pass ? "PASS" : "FAIL");
  }
  std::printf("\nbest candidate per case (bar: mla >= 0.90x, mha >= 0.92x of memcpy):\n");
  for (size_t i = 0; i < results.size();) {
    size_t j = i;
    const Result* best = nullptr;
    for (; j < results.size() && results[j].case_name == results[i].case_name; ++j)
      if (results[j].candidate && results[j].pass && (!best || results[j].ms < best->ms)) best = &results[j];
    if (best) {
      const double bar = best->case_name.rfind("mha", 0) == 0 ? 0.92 : 0.90;
      std::printf("  %-26s %-10s %6.3fx %s\n", best->case_name.c_str(), best->variant.c_str(), best->ratio,
                  best->ratio >= bar ? "meets bar" : "below bar");
    }
    i = j;
  }
  std::printf("\n%s: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
  return failures ? 1 : 0;
}
