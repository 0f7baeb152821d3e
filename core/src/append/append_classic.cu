// The portable ("classic") paged append kernel, CUDA and HIP: a persistent
// grid whose blocks take equal shares of the tokens; each block copies its
// share in batches of up to kThreads tokens, the page-table lookups of a
// batch overlapped with its first round of source loads, then a flat copy of
// `width`-byte accesses (16, 8, 4 or 2). It serves every append no other
// kernel takes: any row shape, any alignment, mixed index dtypes.
// Contract: a validated Job; a skipped token (page -1) is never written.
#include "append/append_kernels.h"

namespace mlacore::append {
namespace {

constexpr int kThreads = 256;
constexpr int kVecsPerThread = 8;
// Blocks resident per SM at <= 64 registers a thread (the launch bound below
// asks ptxas for that); also the persistent grid's blocks per SM.
constexpr int kBlocksPerSM = 4;
// Accesses one round of a block issues: kVecsPerThread per thread.
constexpr uint32_t kRound = kThreads * kVecsPerThread;

// Lookups of a batch, double-buffered: a warp writes buffer `parity` of the
// next batch only after the barrier of the current one, which every reader
// of that buffer's previous use (two batches back) has passed.
struct Rows {
  int64_t page[2][kThreads];  // < 0: skip the token
  int64_t off[2][kThreads];
};

// One block's tokens [first_tok, last_tok). Flat: see access_at.
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
    return reinterpret_cast<const V*>(access_at<Flat, V>(p, v, row_a, row_b, true));
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
    return reinterpret_cast<V*>(access_at<Flat, V>(p, v, row_a, row_b, false));
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

void launch_classic(const Job& job, KParams& p, int width, int device, gpuStream_t stream) {
  p.row = fast_div(p.vecs);
  // One lookup per thread per batch, and a batch's access indices below 2^31
  // (the fast division's range).
  const uint32_t fit = static_cast<uint32_t>(((uint64_t{1} << 31) - 1) / p.vecs);
  p.batch_tokens = fit < 1 ? 1 : fit < static_cast<uint32_t>(kThreads) ? fit : kThreads;
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
  if (job.table64) launch_width(job.t64, p, width, blocks, stream);
  else launch_width(job.t32, p, width, blocks, stream);
  gpu::check_launch("append_kernel");
}

}  // namespace mlacore::append
