// The sm_90 paged append kernels, CUDA only: a warp per token or per group
// of tokens (append_warp_kernel: K/V rows of 2048 bytes, MLA rows at page
// sizes below 16) and Hopper bulk copies through a shared-memory ring
// (append_bulk_kernel: MLA rows at page sizes of 16 and more). Both assume
// 32-lane warps (__shfl_sync/__ballot_sync) and the bulk kernel uses
// cp.async.bulk, so this file is never in the hipcc list.
// Contract: 16-byte accesses; launch_sm90 launches only where the runtime
// picked sm_90+ code for the kernel (their bodies elsewhere are a trap).
#include "append/append_kernels.h"

namespace mlacore::append {
namespace {

// The two kernel shapes research/append_variants/append_variants.cu measured fastest on an
// H200 (research/measurements/2026-11-30-2098b67-h200-append-variants.txt), for the row shapes they were
// measured on; every other call keeps the classic kernel (append_classic.cu).
// Both assume 32-lane warps and use __shfl_sync/__ballot_sync, and the bulk
// kernel Hopper's cp.async.bulk, so they are compiled for CUDA only; HIP
// builds keep the classic kernel. The host picks one from the data
// (launch_gpu); kernel_choice() says which runs (MLACORE_APPEND_KERNEL).
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarpThreads = 256;  // 8 warps a block; each warp works alone

// Destination of a token, as byte offsets of its row in each stream's cache;
// ok is false when the token must be skipped (offsets then 0).
struct Dest {
  bool ok;
  int64_t off_a, off_b;
};

template <class Idx>
__device__ __forceinline__ Dest dest_of(const PageTable<Idx>& table, int64_t b, int64_t pos, int64_t a_page,
                                        int64_t a_token, int64_t b_page, int64_t b_token) {
  int64_t page, off;
  locate(table, b, pos, page, off);
  Dest d{page >= 0, 0, 0};
  if (d.ok) {
    d.off_a = page * a_page + off * a_token;
    d.off_b = page * b_page + off * b_token;
  }
  return d;
}

// (a)/(d) of the bench: a warp per group of U tokens, every lane moving
// PER = U * (VA + VB) / 32 16-byte vectors of the group; lanes < U run the
// lookups while the group's loads are in flight (batch/position fetched a
// group ahead). Pipe: register double-buffered, the next group's loads issued
// before this group's stores ("warp-pipe"). Row shapes served:
//   MhaWarp  two 2048-byte streams (K/V of 8 heads x 128 in bf16/fp16, or any
//            other H x D x dtype of 2048 bytes), NHD or HND: warp-pipe;
//   MlaWarp  1024 + 128 bytes (512 + 64 in bf16/fp16), page size < 16: warp.
template <int VA_, int VB_, int U_, bool Pipe_, int MinBlocks_, bool Flat_>
struct WarpShape {
  static constexpr int VA = VA_, VB = VB_, U = U_, kMinBlocks = MinBlocks_;
  static constexpr bool kPipe = Pipe_;
  static constexpr bool kFlat = Flat_;  // rows are one segment (the host checks)
  static constexpr int PA = VA * U / 32, PB = VB * U / 32, PER = PA + PB;
  static_assert(VA * U % 32 == 0 && VB * U % 32 == 0, "whole accesses per lane in each stream");
  static_assert((VA % 32 == 0 || 32 % VA == 0) && (VB % 32 == 0 || 32 % VB == 0),
                "a lane's token in a group is a shift away");
  static_assert(U <= 32, "lookups one token per lane");
};
using MhaWarp = WarpShape<128, 128, 1, true, 2, false>;
using MlaWarp = WarpShape<64, 8, 4, false, 4, true>;

// One stream for the warp kernel. Rows are segments of 2^seg_shift vectors
// (HND heads, strided source heads); a flat row is one segment of all its
// vectors (and MlaWarp, flat by the host's check, skips the arithmetic).
struct WStream {
  const char* src;
  int64_t src_token, src_seg;
  char* dst;
  int64_t dst_page, dst_token, dst_seg;
  uint32_t seg_shift, seg_mask;
};

struct WarpParams {
  WStream a, b;
  IndexVec batch, pos;
  int64_t nnz;
};

template <bool Flat>
__device__ __forceinline__ int64_t seg_offset(const WStream& s, uint32_t v, bool source) {
  if (Flat) return static_cast<int64_t>(v) * 16;
  return static_cast<int64_t>(v >> s.seg_shift) * (source ? s.src_seg : s.dst_seg) +
         static_cast<int64_t>(v & s.seg_mask) * 16;
}

// Access k of stream X (VX vectors a token) by `lane`: f(k, t, v), token t
// of the group, vector v of the token's row in that stream. t is a
// compile-time constant when VX is a multiple of 32.
template <int VX, int PX, class F>
__device__ __forceinline__ void for_each_of_stream(int lane, F&& f) {
#pragma unroll
  for (int k = 0; k < PX; ++k) {
    if constexpr (VX % 32 == 0) {
      f(k, (k * 32) / VX, static_cast<uint32_t>((k * 32) % VX + lane));
    } else {
      f(k, k * (32 / VX) + lane / VX, static_cast<uint32_t>(lane % VX));
    }
  }
}

template <class S, class Idx>
__global__ void __launch_bounds__(kWarpThreads, S::kMinBlocks)
    append_warp_kernel(PageTable<Idx> table, WarpParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int U = S::U, PA = S::PA, PER = S::PER;
  // The lane is written out as threadIdx.x & 31 where needed, not kept in a
  // variable (nor a helper): at 64 registers (MlaWarp, int64 tables) ptxas
  // spilled it otherwise.
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * (kWarpThreads / 32);
  const int64_t groups = (p.nnz + U - 1) / U;
  int64_t g = (static_cast<int64_t>(blockIdx.x) * kWarpThreads + threadIdx.x) / 32;
  if (g >= groups) return;  // warp-uniform

  auto load_group = [&](uint4 (&buf)[PER], int64_t grp) {
    const int64_t tok0 = grp * U;
    // Tokens of the group that exist (U unless it is the last one).
    const int ntok = p.nnz - tok0 < U ? static_cast<int>(p.nnz - tok0) : U;
    for_each_of_stream<S::VA, PA>((threadIdx.x & 31), [&](int k, int t, uint32_t v) {
      const int64_t tok = tok0 + t;
      if (U == 1 || t < ntok)
        buf[k] = load_once(reinterpret_cast<const uint4*>(p.a.src + tok * p.a.src_token + seg_offset<S::kFlat>(p.a, v, true)));
    });
    for_each_of_stream<S::VB, S::PB>((threadIdx.x & 31), [&](int k, int t, uint32_t v) {
      const int64_t tok = tok0 + t;
      if (U == 1 || t < ntok)
        buf[PA + k] =
            load_once(reinterpret_cast<const uint4*>(p.b.src + tok * p.b.src_token + seg_offset<S::kFlat>(p.b, v, true)));
    });
  };
  // Lanes < U hold their token's destination; ok bits of the whole group by
  // ballot. Tokens past nnz come with pos -1: locate() skips them.
  auto store_group = [&](const uint4 (&buf)[PER], const Dest& d) {
    const uint32_t ok = __ballot_sync(kFullMask, (threadIdx.x & 31) < U && d.ok);
    // Where a stream's token is the same for the whole warp (VX a multiple
    // of 32), its offset is broadcast once per token, not once per access.
    int64_t rows_a[U], rows_b[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if constexpr (S::VA % 32 == 0) rows_a[u] = __shfl_sync(kFullMask, d.off_a, u);
      if constexpr (S::VB % 32 == 0) rows_b[u] = __shfl_sync(kFullMask, d.off_b, u);
    }
    for_each_of_stream<S::VA, PA>((threadIdx.x & 31), [&](int k, int t, uint32_t v) {
      int64_t off;
      if constexpr (S::VA % 32 == 0) off = rows_a[t];
      else off = __shfl_sync(kFullMask, d.off_a, t);
      if ((ok >> t) & 1u)
        *reinterpret_cast<uint4*>(p.a.dst + off + seg_offset<S::kFlat>(p.a, v, false)) = buf[k];
    });
    for_each_of_stream<S::VB, S::PB>((threadIdx.x & 31), [&](int k, int t, uint32_t v) {
      int64_t off;
      if constexpr (S::VB % 32 == 0) off = rows_b[t];
      else off = __shfl_sync(kFullMask, d.off_b, t);
      if ((ok >> t) & 1u)
        *reinterpret_cast<uint4*>(p.b.dst + off + seg_offset<S::kFlat>(p.b, v, false)) = buf[PA + k];
    });
  };
  int64_t b = 0, pos = -1;
  auto fetch = [&](int64_t grp) {
    b = 0;
    pos = -1;
    const int64_t tok = grp * U + (threadIdx.x & 31);
    if ((threadIdx.x & 31) < U && tok < p.nnz) {
      b = p.batch.at(tok);
      pos = p.pos.at(tok);
    }
  };
  // Lookup of the group whose batch/pos were fetched, then the fetch of
  // group `ahead`'s: only indptr -> indices is left on the next lookup's path.
  auto lookup = [&](int64_t ahead) -> Dest {
    Dest d{false, 0, 0};
    if ((threadIdx.x & 31) < U) d = dest_of(table, b, pos, p.a.dst_page, p.a.dst_token, p.b.dst_page, p.b.dst_token);
    fetch(ahead);
    return d;
  };

  fetch(g);
  if constexpr (!S::kPipe) {
    for (; g < groups; g += nwarps) {
      uint4 buf[PER];
      load_group(buf, g);
      const Dest d = lookup(g + nwarps);  // while the loads are in flight
      store_group(buf, d);
    }
  } else {
    uint4 buf0[PER], buf1[PER];
    load_group(buf0, g);
    Dest d0 = lookup(g + nwarps), d1{false, 0, 0};
    // Unrolled by two so the buffers swap roles without register moves.
    while (true) {
      int64_t next = g + nwarps;
      const bool more = next < groups;
      if (more) load_group(buf1, next);
      store_group(buf0, d0);
      if (!more) break;
      d1 = lookup(next + nwarps);  // after the stores: they need not wait for it
      g = next;
      next = g + nwarps;
      const bool again = next < groups;
      if (again) load_group(buf0, next);
      store_group(buf1, d1);
      if (!again) break;
      d0 = lookup(next + nwarps);
      g = next;
    }
  }
#else
  // Measured on Hopper only: the launcher runs this kernel where the runtime
  // picked sm_90+ code for it (binary check), so reaching this is a dispatch bug.
  // (The voids keep nvcc's device pass from warning about what only the
  // sm_90 body uses.)
  (void)table;
  (void)p;
  (void)kFullMask;
  (void)S::kPipe;
  (void)S::kFlat;
  (void)S::PA;
  (void)S::PB;
  (void)S::PER;
#if defined(__CUDA_ARCH__)
  __trap();
#endif
#endif
}

// (c) of the bench ("tma"): Hopper bulk copies through a shared-memory ring
// per warp. Each warp owns a contiguous share of the tokens and a ring of K
// stages of G tokens; lane t of the warp moves token t of a stage:
// cp.async.bulk global->shared completing on the stage's mbarrier, then
// cp.async.bulk shared->global to the token's slot, committed as one bulk
// group per stage. Loads run K-2 stages ahead; a stage is refilled once
// wait_group.read says its stores have left shared memory. Lookups: 32
// tokens per warp (one per lane), a tile ahead of the stores, with batch and
// position a further tile ahead. Rows of up to kBulkMaxRow bytes (MLA
// 512 + 64 in bf16/fp16) whose streams are one contiguous segment each.
constexpr int kBulkG = 8, kBulkK = 6, kBulkW = 4, kBulkAhead = kBulkK - 2;
constexpr uint32_t kBulkMaxRow = 1152;
constexpr uint32_t kBulkStage = kBulkG * kBulkMaxRow;
constexpr int kBulkSmem = kBulkW * kBulkK * static_cast<int>(kBulkStage) + kBulkW * kBulkK * 8;
static_assert(kBulkStage % 128 == 0, "stages stay 128-byte aligned");
static_assert(32 % kBulkG == 0, "a 32-token lookup tile is whole stages");
static_assert(kBulkAhead >= 1 && kBulkK - kBulkAhead >= 2, "one stage loading, one storing, one draining");

struct BulkParams {
  const char* src_a;
  const char* src_b;
  int64_t src_a_token, src_b_token;
  char* dst_a;
  char* dst_b;
  int64_t a_page, a_token, b_page, b_token;
  uint32_t row_a, row_b;  // bytes, multiples of 16, row_a + row_b <= kBulkMaxRow
  uint32_t token_major;   // B follows A in the destination: one store a token
  uint32_t src_merged;    // B follows A in the source: one load a token
  IndexVec batch, pos;
  int64_t nnz;
  int64_t share_q, share_r;  // nnz = share_q * warps + share_r
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ uint32_t smem_u32(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
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

template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
#endif

template <class Idx>
__global__ void __launch_bounds__(kBulkW * 32, 1) append_bulk_kernel(PageTable<Idx> table, BulkParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int G = kBulkG, K = kBulkK, D = kBulkAhead;
  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const uint32_t ring = smem_u32(smem + static_cast<size_t>(warp) * K * kBulkStage);
  const uint32_t bars = smem_u32(smem + static_cast<size_t>(kBulkW) * K * kBulkStage) + warp * K * 8;

  // This warp's share: tokens [floor(nnz * w / warps), floor(nnz * (w+1) / warps)),
  // from nnz = q * warps + r without a product that could overflow.
  const uint64_t nw = static_cast<uint64_t>(gridDim.x) * kBulkW;
  const uint64_t gw = static_cast<uint64_t>(blockIdx.x) * kBulkW + warp;
  const uint64_t r = static_cast<uint64_t>(p.share_r);
  const int64_t first = p.share_q * static_cast<int64_t>(gw) + static_cast<int64_t>(r * gw / nw);
  const int64_t last = p.share_q * static_cast<int64_t>(gw + 1) + static_cast<int64_t>(r * (gw + 1) / nw);
  const int64_t items = (last - first + G - 1) / G;
  if (items == 0) return;  // warp-uniform; nothing of this warp was started

  if (lane == 0) {
    for (int i = 0; i < K; ++i) mbar_init(bars + 8 * i, 1);
    // Make the initialised barriers visible to the async (bulk-copy) proxy.
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncwarp();

  const uint32_t RA = p.row_a, RB = p.row_b, ROW = RA + RB;
  auto issue_loads = [&](int64_t item) {
    const uint32_t stage = static_cast<uint32_t>(item % K);
    const uint32_t buf = ring + stage * kBulkStage, bar = bars + 8 * stage;
    const int64_t tok0 = first + item * G;
    const int n = static_cast<int>(last - tok0 < G ? last - tok0 : G);
    // One arrival with the stage's bytes: the phase ends when they all landed.
    // (Other lanes' copies may complete bytes before this arrival; the phase
    // cannot end without it.)
    if (lane == 0) mbar_arrive_expect_tx(bar, static_cast<uint32_t>(n) * ROW);
    if (lane < n) {
      const int64_t tok = tok0 + lane;
      const char* from_a = p.src_a + tok * p.src_a_token;
      if (p.token_major) {
        const uint32_t row = buf + lane * ROW;
        if (p.src_merged) {
          bulk_load(row, from_a, ROW, bar);
        } else {
          bulk_load(row, from_a, RA, bar);
          bulk_load(row + RA, p.src_b + tok * p.src_b_token, RB, bar);
        }
      } else {
        bulk_load(buf + lane * RA, from_a, RA, bar);
        bulk_load(buf + G * RA + lane * RB, p.src_b + tok * p.src_b_token, RB, bar);
      }
    }
  };

  // `tile`: lane j holds the destination of token j of the current 32-token
  // tile, `ok` the tile's ok bits.
  auto issue_stores = [&](int64_t item, const Dest& tile, uint32_t ok) {
    const uint32_t stage = static_cast<uint32_t>(item % K);
    const uint32_t buf = ring + stage * kBulkStage, bar = bars + 8 * stage;
    const int64_t tok0 = first + item * G;
    const int n = static_cast<int>(last - tok0 < G ? last - tok0 : G);
    // Lane t stores token t of the stage (lanes >= G fetch copies and store nothing).
    const int j = static_cast<int>((item * G) & 31) + lane % G;
    const int64_t off_a = __shfl_sync(kFullMask, tile.off_a, j);
    const int64_t off_b = __shfl_sync(kFullMask, tile.off_b, j);
    mbar_wait(bar, static_cast<uint32_t>(item / K) & 1u);
    if (lane < n && ((ok >> j) & 1u)) {
      if (p.token_major) {
        bulk_store(p.dst_a + off_a, buf + lane * ROW, ROW);
      } else {
        bulk_store(p.dst_a + off_a, buf + lane * RA, RA);
        bulk_store(p.dst_b + off_b, buf + G * RA + lane * RB, RB);
      }
    }
    bulk_commit();  // every lane, every stage (empty groups included): the counts stay aligned
  };

  int64_t b = 0, pos = -1;
  auto fetch = [&](int64_t tok) {
    b = 0;
    pos = -1;
    if (tok < last) {
      b = p.batch.at(tok);
      pos = p.pos.at(tok);
    }
  };
  auto lookup = [&]() { return dest_of(table, b, pos, p.a_page, p.a_token, p.b_page, p.b_token); };

  fetch(first + lane);
  for (int64_t i = 0; i < D && i < items; ++i) issue_loads(i);
  Dest next = lookup(), cur{false, 0, 0};
  fetch(first + 32 + lane);
  uint32_t ok = 0;

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
      cur = next;
      ok = __ballot_sync(kFullMask, cur.ok);
      next = lookup();  // tile + 1
      fetch(first + (tile + 2) * 32 + lane);
    }
    issue_stores(item, cur, ok);
  }
  bulk_wait_all();  // shared memory must outlive the reads of the last stores
#else
  // Compiled for a target without cp.async.bulk: the launcher checks the
  // kernel's binary version first, so reaching this is a dispatch bug.
  (void)table;
  (void)p;
#if defined(__CUDA_ARCH__)
  __trap();
#endif
#endif
}


// Whether the cubin the runtime picked for the current device holds sm_90+
// code for `kernel` (the fast kernels' bodies are compiled for sm_90+ only:
// what was measured); no image at all counts as none.
template <class Kernel>
bool has_sm90_code(Kernel kernel) {
  return gpu::binary_version(kernel) >= 90;
}

// Blocks of the warp kernel resident per SM on `device` (current), asked once
// per device; 0 when it cannot run there (no sm_90+ code for the device).
template <class S, class Idx>
int warp_blocks_per_sm(int device) {
  return gpu::once_per_device(device, [] {
    auto kernel = append_warp_kernel<S, Idx>;
    int n = 0;
    if (has_sm90_code(kernel))
      gpu::check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kWarpThreads, 0),
                 "append: occupancy of append_warp_kernel");
    return n > 0 ? n : 0;
  });
}

// Blocks of the bulk kernel resident per SM on `device` (current), asked once
// per device; 0 when the kernel cannot run there: the cubin the runtime
// picked for the device is not sm_90+ code (an sm_80-only build on an H200,
// or any pre-Hopper GPU: the kernel body is then a trap), or the device
// lacks the shared memory.
template <class Idx>
int bulk_blocks_per_sm(int device) {
  return gpu::once_per_device(device, [device] {
    auto kernel = append_bulk_kernel<Idx>;
    if (gpu::device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(device) < kBulkSmem ||
        !has_sm90_code(kernel))
      return 0;
    gpu::check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBulkSmem),
               "cudaFuncSetAttribute(append_bulk_kernel)");
    int fit = 0;
    gpu::check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kernel, kBulkW * 32, kBulkSmem),
               "append: occupancy of append_bulk_kernel");
    return fit > 0 ? fit : 0;
  });
}

bool is_pow2(uint32_t x) { return x != 0 && (x & (x - 1)) == 0; }

WStream wstream(const KStream& s) {
  uint32_t shift = 0;
  while ((uint32_t{1} << shift) < s.seg_vecs) ++shift;
  return {s.src, s.src_token, s.src_seg, s.dst, s.dst_page, s.dst_token, s.dst_seg, shift, s.seg_vecs - 1};
}

template <class S, class Idx>
bool launch_warp(const PageTable<Idx>& table, const KParams& kp, int device, gpuStream_t stream) {
  const int per_sm = warp_blocks_per_sm<S, Idx>(device);
  if (per_sm <= 0) return false;
  WarpParams p{wstream(kp.a), wstream(kp.b), kp.batch, kp.pos, kp.nnz};
  // Persistent grid: the blocks resident at once, fewer when there are fewer
  // groups than warps in them.
  const int64_t groups = (kp.nnz + S::U - 1) / S::U;
  const int64_t wanted = (groups + kWarpThreads / 32 - 1) / (kWarpThreads / 32);
  const int64_t resident = static_cast<int64_t>(gpu::device_attribute<gpuDevAttrMultiProcessorCount>(device)) * per_sm;
  const unsigned blocks = static_cast<unsigned>(wanted < resident ? wanted : resident);
  append_warp_kernel<S, Idx><<<blocks, kWarpThreads, 0, stream>>>(table, p);
  gpu::check_launch("append_warp_kernel");
  return true;
}

template <class Idx>
bool launch_bulk(const PageTable<Idx>& table, const Job& job, const KParams& kp, int device, gpuStream_t stream) {
  const int per_sm = bulk_blocks_per_sm<Idx>(device);
  if (per_sm <= 0) return false;
  const CopyStream& a = job.streams[0];
  const CopyStream& b = job.streams[1];
  BulkParams p{};
  p.src_a = a.src;
  p.src_b = b.src;
  p.src_a_token = a.src_token;
  p.src_b_token = b.src_token;
  p.dst_a = a.dst;
  p.dst_b = b.dst;
  p.a_page = a.dst_page;
  p.a_token = a.dst_token;
  p.b_page = b.dst_page;
  p.b_token = b.dst_token;
  p.row_a = static_cast<uint32_t>(a.seg_bytes);
  p.row_b = static_cast<uint32_t>(b.seg_bytes);
  // The halves of one [P, S, 576] buffer: a token's row is one run of bytes.
  p.token_major = b.dst == a.dst + a.seg_bytes && b.dst_page == a.dst_page && b.dst_token == a.dst_token;
  // The halves of one [nnz, 576] source, likewise.
  p.src_merged = b.src == a.src + a.seg_bytes && b.src_token == a.src_token;
  p.batch = kp.batch;
  p.pos = kp.pos;
  p.nnz = kp.nnz;
  const int64_t per_block = static_cast<int64_t>(kBulkW) * kBulkG;
  const int64_t wanted = (kp.nnz + per_block - 1) / per_block;
  const int64_t resident = static_cast<int64_t>(gpu::device_attribute<gpuDevAttrMultiProcessorCount>(device)) * per_sm;
  const unsigned blocks = static_cast<unsigned>(wanted < resident ? wanted : resident);
  const int64_t warps = static_cast<int64_t>(blocks) * kBulkW;
  p.share_q = kp.nnz / warps;
  p.share_r = kp.nnz % warps;
  append_bulk_kernel<Idx><<<blocks, kBulkW * 32, kBulkSmem, stream>>>(table, p);
  gpu::check_launch("append_bulk_kernel");
  return true;
}

// The fast variant for this call, launched; false when none applies (the
// caller then runs the classic kernel). `kp` is the classic kernel's view of
// the call with 16-byte accesses: every address, stride and segment length
// of both streams is a multiple of 16 bytes.
template <class Idx>
bool launch_fast(const PageTable<Idx>& table, const Job& job, const KParams& kp, int device, gpuStream_t stream) {
  const bool flat = kp.a.seg_vecs == kp.a.vecs && kp.b.seg_vecs == kp.b.vecs;
  // K/V rows of 2048 bytes each (8 heads x 128 in bf16/fp16), NHD or HND,
  // any page size: warp-pipe.
  if (kp.a.vecs == 128 && kp.b.vecs == 128 && is_pow2(kp.a.seg_vecs) && is_pow2(kp.b.seg_vecs))
    return launch_warp<MhaWarp, Idx>(table, kp, device, stream);
  if (!flat || kp.a.vecs == 0 || kp.b.vecs == 0) return false;
  // MLA rows up to 1152 bytes, page size >= 16, sm_90 code: bulk copies.
  if (table.page_size >= 16 && (kp.a.vecs + kp.b.vecs) * 16 <= kBulkMaxRow &&
      launch_bulk(table, job, kp, device, stream))
    return true;
  // MLA 1024 + 128-byte rows at page sizes below 16: a warp per 4 tokens.
  if (table.page_size < 16 && kp.a.vecs == 64 && kp.b.vecs == 8)
    return launch_warp<MlaWarp, Idx>(table, kp, device, stream);
  return false;
}

}  // namespace

bool launch_sm90(const Job& job, const KParams& p, int device, gpuStream_t stream) {
  return job.table64 ? launch_fast(job.t64, job, p, device, stream) : launch_fast(job.t32, job, p, device, stream);
}

}  // namespace mlacore::append
