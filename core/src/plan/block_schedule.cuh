// The schedule on one GPU block, shared by the plan's two kernels (the
// exchange, exchange.cu, and the device-only build, build_device.cu): the
// block executor of build_schedule() (BlockExec: warp-shuffle reductions and
// scans), and the decision (the batch's totals, then the chunk) restated in
// 32-bit arithmetic without branches, with the same results as the shared
// helpers of schedule_algorithm.h, so the device schedule equals the host's
// bit for bit (test_plan compares them).
// Contract: blocks of kScheduleThreads threads; every thread calls the
// collectives; decides() says which threads take part in the decision.
#pragma once

#include <cstdint>

#include "gpu/compat.h"
#include "plan/exchange.h"
#include "plan/schedule_algorithm.h"

namespace mlacore::plan_gpu {
namespace {

constexpr int kScheduleThreads = 256;
constexpr int kWarp = gpu::kWarpThreads;
constexpr int kScheduleWarps = kScheduleThreads / kWarp;
// One 64-byte slot per warp: the warps' partial reductions or scan totals.
constexpr int kSharedBytes = kScheduleWarps * 64;
static_assert(sizeof(ScheduleTotals) <= 64 && sizeof(CandidateCtas) <= 64 && sizeof(ScheduleTotals) % 8 == 0 &&
                  sizeof(CandidateCtas) % 8 == 0 && alignof(ScheduleTotals) <= 8 && alignof(CandidateCtas) <= 8,
              "reduced structs are int64 words, at most 64 bytes");

#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define MLACORE_DEVICE_PASS 1
#endif

// build_schedule()'s executor on one block: warp-shuffle reductions and
// scans, then one shared slot per warp, two barriers per collective (a tree
// over 256 shared slots took eight: the exchange kernel reduces its totals
// while the host waits). Its members are host+device only to match the
// template's signature; they run on the device alone.
struct BlockExec {
  unsigned char* smem;  // kSharedBytes

  MLACORE_HD int64_t tid() const {
#ifdef MLACORE_DEVICE_PASS
    return threadIdx.x;
#else
    return 0;
#endif
  }
  MLACORE_HD int64_t nthreads() const { return kScheduleThreads; }
  MLACORE_HD void sync() const {
#ifdef MLACORE_DEVICE_PASS
    __syncthreads();
#endif
  }
  // Merges are integer, associative and commutative: any order gives the same bits.
  template <class T>
  MLACORE_HD T reduce(const T& v) const {
#ifdef MLACORE_DEVICE_PASS
    constexpr int kWords = sizeof(T) / 8;
    T acc = v;
    for (int mask = kWarp / 2; mask > 0; mask >>= 1) {
      long long w[kWords];
      __builtin_memcpy(w, &acc, sizeof(T));
#pragma unroll
      for (int k = 0; k < kWords; ++k) w[k] = gpu::warp_shfl_xor(w[k], mask);
      T other;
      __builtin_memcpy(&other, w, sizeof(T));
      acc.merge(other);
    }
    T* slot = reinterpret_cast<T*>(smem);
    if (threadIdx.x % kWarp == 0) slot[threadIdx.x / kWarp] = acc;
    __syncthreads();
    T r = slot[0];
    for (int w = 1; w < kScheduleWarps; ++w) r.merge(slot[w]);
    __syncthreads();  // the slots are the next collective's
    return r;
#else
    return v;
#endif
  }
  MLACORE_HD int64_t exclusive_scan(int64_t v, int64_t& total) const {
#ifdef MLACORE_DEVICE_PASS
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
    long long x = v;  // inclusive within the warp
    for (int d = 1; d < kWarp; d <<= 1) {
      const long long y = gpu::warp_shfl_up(x, d);
      if (lane >= d) x += y;
    }
    int64_t* slot = reinterpret_cast<int64_t*>(smem);
    if (lane == kWarp - 1) slot[warp] = x;
    __syncthreads();
    int64_t before = 0, all = 0;
    for (int w = 0; w < kScheduleWarps; ++w) {
      if (w < warp) before += slot[w];
      all += slot[w];
    }
    __syncthreads();
    total = all;
    return before + x - v;
#else
    total = v;
    return 0;
#endif
  }
};


// The decision's two divisors as reciprocals: num_sms, and the work items an
// accepted batch leaves spare (its requests are all valid).
uint64_t sms_magic_of(const ScheduleInputs& in) { return reciprocal_of(static_cast<uint64_t>(in.num_sms)); }
uint64_t spare_magic_of(const ScheduleInputs& in, const ScheduleLayout& layout) {
  return layout.max_work > in.batch ? reciprocal_of(static_cast<uint64_t>(layout.max_work - in.batch)) : 0;
}


// Warp-wide reductions of 32-bit words, the result on every lane: one
// redux.sync each on sm_80+ (no chain of shuffles), shuffles elsewhere.
#if defined(MLACORE_GPU_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
__device__ __forceinline__ unsigned warp_sum(unsigned v) { return __reduce_add_sync(0xffffffffu, v); }
__device__ __forceinline__ unsigned warp_max(unsigned v) { return __reduce_max_sync(0xffffffffu, v); }
__device__ __forceinline__ unsigned warp_or(unsigned v) { return __reduce_or_sync(0xffffffffu, v); }
#elif defined(MLACORE_DEVICE_PASS)
__device__ __forceinline__ unsigned lane_xor(unsigned v, int m) {
  return static_cast<unsigned>(gpu::warp_shfl_xor(static_cast<long long>(v), m));
}
__device__ __forceinline__ unsigned warp_sum(unsigned v) {
  for (int m = kWarp / 2; m > 0; m >>= 1) v += lane_xor(v, m);
  return v;
}
__device__ __forceinline__ unsigned warp_max(unsigned v) {
  for (int m = kWarp / 2; m > 0; m >>= 1) {
    const unsigned o = lane_xor(v, m);
    v = o > v ? o : v;
  }
  return v;
}
__device__ __forceinline__ unsigned warp_or(unsigned v) {
  for (int m = kWarp / 2; m > 0; m >>= 1) v |= lane_xor(v, m);
  return v;
}
#else  // the host pass of a device-only function: never called
__device__ __forceinline__ unsigned warp_sum(unsigned v) { return v; }
__device__ __forceinline__ unsigned warp_max(unsigned v) { return v; }
__device__ __forceinline__ unsigned warp_or(unsigned v) { return v; }
#endif

// The decision runs on warp 0 alone when the batch fits it (no barrier, no
// shared memory: every reduction is a redux.sync whose result every lane
// holds), else on all warps with one barrier per reduction: each warp leaves
// its partials in its own slot and, after the barrier, finishes the
// reduction itself from the slots (lane w reading warp w's), so no second
// barrier hands a result back. The totals' reduction sits between the
// kernel's entry and the host's verdict, the chunk's before info()'s counts.
struct Reducer {
  unsigned* slots;  // kScheduleWarps * N words for this one reduction, or null: warp 0 alone
  int lane, warp;

  // NS sums, then NM maxima, then NO ors of 32-bit words; every word >= 0,
  // so 0 is each operation's identity.
  template <int NS, int NM, int NO>
  __device__ __forceinline__ void operator()(unsigned (&v)[NS + NM + NO]) const {
    constexpr int N = NS + NM + NO;
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = k < NS ? warp_sum(v[k]) : k < NS + NM ? warp_max(v[k]) : warp_or(v[k]);
    if (slots == nullptr) return;
    if (lane == 0) {
#pragma unroll
      for (int k = 0; k < N; ++k) slots[warp * N + k] = v[k];
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = lane < kScheduleWarps ? slots[lane * N + k] : 0u;
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = k < NS ? warp_sum(v[k]) : k < NS + NM ? warp_max(v[k]) : warp_or(v[k]);
  }
};

// A non-negative int64 as three 22-bit pieces: a piece's sum over 256
// threads stays below 2^30, and the pieces reassemble the exact sum.
constexpr int kPieces = 3;
__device__ __forceinline__ void split64(unsigned* w, int64_t x) {
  const uint64_t u = static_cast<uint64_t>(x);
  w[0] = static_cast<unsigned>(u & 0x3fffff);
  w[1] = static_cast<unsigned>((u >> 22) & 0x3fffff);
  w[2] = static_cast<unsigned>(u >> 44);
}
__device__ __forceinline__ int64_t join64(const unsigned* w) {
  return static_cast<int64_t>(static_cast<uint64_t>(w[0]) + (static_cast<uint64_t>(w[1]) << 22) +
                              (static_cast<uint64_t>(w[2]) << 44));
}

// A thread's share of the batch: request tid, whose shape stays in registers
// for the candidate pass, and (batches over 256 only) every kScheduleThreads-th
// one after it, reloaded there.
struct Share {
  RequestShape first;
  bool has_first;
};

// The chunk and the items and partials it gives, for the counts.
struct ChunkCounts {
  int64_t chunk, items, partials;
};

// Totals for which every quantity of the chunk's choice stays below 2^31:
// the CTA counts too, which never exceed the cost (a request's items are at
// most its KV tiles, or 1 for an empty one, below its fixed cost of 5).
// Far beyond any real batch (2^31 tiles of 64 tokens each).
__device__ __forceinline__ bool narrow_totals(const ScheduleTotals& t, int64_t num_sms, int64_t max_work) {
  constexpr int64_t kNarrow = int64_t{1} << 31;
  return t.cost < kNarrow && t.kv_tiles < kNarrow && num_sms < kNarrow && max_work < kNarrow;
}

__device__ __forceinline__ uint32_t ceil_div32(uint32_t a, uint32_t b) { return (a + b - 1u) / b; }
// ceil(n / d) for n, d < 2^31 from d's magic.
__device__ __forceinline__ uint32_t ceil_by_magic(uint32_t n, uint64_t m) {
  if (m == 0) return n;
  const uint64_t q = __umul64hi(static_cast<uint64_t>(n) + 0xffffffffffffffffull, m);  // floor((n - 1) / d)
  return n == 0 ? 0u : static_cast<uint32_t>(q) + 1u;
}

// schedule_chunk_tiles() for narrow totals in 32-bit arithmetic, with the
// same results as the shared helpers (chunk_bounds, candidate_chunks,
// splits_of, pick_chunk_tiles), written without branches so that each stage's
// divisions issue together, and dividing by num_sms and the spare work through
// the host's reciprocals: three division latencies deep (the most parts, the
// candidates, the per-request splits), where the helpers' checked divisions
// run one after another.
// All operands stay below 2^31, so no sum or product below overflows its width.
__device__ __forceinline__ ChunkCounts chunk_narrow(const ScheduleInputs& in, const ScheduleLayout& layout,
                                                   const ScheduleTotals& t, const Share& share,
                                                   const Reducer& reduce, uint64_t sms_magic, uint64_t spare_magic) {
  const uint32_t no_split = static_cast<uint32_t>(t.no_split_tiles());
  const int64_t spare64 = layout.max_work - t.valid;
  const int64_t floor = partial_chunk_floor(t, in, layout.max_work);
  if (spare64 <= 0 || floor < 0) return {no_split, in.batch, 0};  // chunk_bounds(): {no_split, no_split}
  // An accepted batch's requests are all valid: spare is the host's max_work - batch.
  const uint32_t cap_raw = ceil_by_magic(static_cast<uint32_t>(t.kv_tiles), spare_magic);
  const uint32_t bal_raw = ceil_by_magic(static_cast<uint32_t>(t.cost), sms_magic);
  // floor < kv_tiles < 2^31 (2 kv_tiles / fit with fit >= 2).
  const uint32_t cap_items = cap_raw < 1u ? 1u : cap_raw;
  const uint32_t cap = cap_items < static_cast<uint32_t>(floor) ? static_cast<uint32_t>(floor) : cap_items;
  const uint32_t bal = bal_raw < cap ? cap : bal_raw;
  const uint32_t balance = bal < no_split ? bal : no_split, capacity = cap < no_split ? cap : no_split;
  if (balance >= no_split) return {no_split, in.batch, 0};  // splits_nothing()
  const uint32_t most = ceil_div32(no_split, balance);
  const uint32_t parts[kPlanCandidates] = {most, most - 1u, most * 3u / 4u, most / 2u, 1u};
  uint32_t chunk[kPlanCandidates];
#pragma unroll
  for (int i = 0; i < kPlanCandidates; ++i) {
    const uint32_t c = ceil_div32(no_split, parts[i] < 1u ? 1u : parts[i]);
    chunk[i] = c > capacity ? c : capacity;
  }
  constexpr int K = kPlanCandidates;
  uint32_t w[3 * K] = {};  // CTAs, items, partials per candidate
  const auto count = [&](const RequestShape& r) {
    const uint32_t kv = static_cast<uint32_t>(r.kv_tiles), q = static_cast<uint32_t>(r.q_tiles);
#pragma unroll
    for (int i = 0; i < K; ++i) {
      // An empty request's one item as ceil(1 / chunk): no branch around the
      // division, so the five issue together.
      const uint32_t n = ceil_div32(kv + (kv == 0u ? 1u : 0u), chunk[i]);
      w[i] += q * n;
      w[K + i] += n;
      w[2 * K + i] += n > 1u ? n : 0u;
    }
  };
  if (share.has_first) count(share.first);
#pragma unroll 1
  for (int64_t b = threadIdx.x + kScheduleThreads; b < in.batch; b += kScheduleThreads)
    count(request_shape(in, b, true));
  reduce.operator()<3 * K, 0, 0>(w);
  // pick_chunk_tiles(): the fewest waves times the per-CTA time, ties to the larger chunk.
  uint32_t best = no_split;
  uint64_t best_time = ~uint64_t{0};
  int best_i = 0;
#pragma unroll
  for (int i = K - 1; i >= 0; --i) {
    const uint64_t time = static_cast<uint64_t>(ceil_by_magic(w[i], sms_magic)) * (chunk[i] + kPlanFixedCostTiles);
    const bool take = time < best_time || (time == best_time && chunk[i] > best);
    best = take ? chunk[i] : best;
    best_time = take ? time : best_time;
    best_i = take ? i : best_i;
  }
  uint32_t items = 0, partials = 0;
#pragma unroll
  for (int i = 0; i < K; ++i) {
    items = i == best_i ? w[K + i] : items;
    partials = i == best_i ? w[2 * K + i] : partials;
  }
  return {best, items, partials};
}

// The same for totals beyond 2^31, through the shared helpers themselves.
__device__ __forceinline__ ChunkCounts chunk_wide(const ScheduleInputs& in, const ScheduleLayout& layout,
                                               const ScheduleTotals& t, const Share& share, const Reducer& reduce2) {
  const int64_t tid = threadIdx.x;
  const int64_t no_split = t.no_split_tiles();
  const ChunkBounds cb = chunk_bounds(t, in.num_sms, layout.max_work, partial_chunk_floor(t, in, layout.max_work));
  if (splits_nothing(cb, t)) return {no_split, in.batch, 0};
  const CandidateChunks chunks = candidate_chunks(cb, no_split);
  // The capacity bound keeps every candidate's items, and so its partials,
  // below max_work < 2^31: one word each; the CTAs in pieces.
  constexpr int K = kPlanCandidates;
  int64_t ctas[K] = {};
  unsigned items[K] = {}, parts[K] = {};
  const auto count = [&](const RequestShape& r) {
#pragma unroll
    for (int i = 0; i < K; ++i) {
      const int64_t n = splits_of(r, chunks.tiles[i]);
      ctas[i] += r.q_tiles * n;
      items[i] += static_cast<unsigned>(n);
      parts[i] += n > 1 ? static_cast<unsigned>(n) : 0u;
    }
  };
  if (share.has_first) count(share.first);
#pragma unroll 1
  for (int64_t b = tid + kScheduleThreads; b < in.batch; b += kScheduleThreads) count(request_shape(in, b, true));
  unsigned c[(kPieces + 2) * K];
#pragma unroll
  for (int i = 0; i < K; ++i) {
    split64(c + kPieces * i, ctas[i]);
    c[kPieces * K + i] = items[i];
    c[(kPieces + 1) * K + i] = parts[i];
  }
  reduce2.operator()<(kPieces + 2) * K, 0, 0>(c);
  CandidateCtas cand;
#pragma unroll
  for (int i = 0; i < K; ++i) cand.ctas[i] = join64(c + kPieces * i);
  ChunkCounts out{pick_chunk_tiles(cand, chunks, no_split, in.num_sms), 0, 0};
  // Candidates of equal chunks have equal counts: any match serves.
#pragma unroll
  for (int i = 0; i < K; ++i)
    if (chunks.tiles[i] == out.chunk) {
      out.items = c[kPieces * K + i];
      out.partials = c[(kPieces + 1) * K + i];
    }
  return out;
}


// schedule_totals() over the batch, every thread (of warp 0 alone, or of the
// block) holding the result; `share` keeps the thread's first request for
// the chunk's pass. The same shared helpers as on the host, so the same bits.
__device__ __forceinline__ ScheduleTotals reduce_totals(const ScheduleInputs& in, const Reducer& reduce, Share& share,
                                                        uint32_t& total_qo) {
  const int64_t tid = threadIdx.x;
  share.has_first = tid < in.batch;
  // Every load of the decision is issued here, before any depends on another.
  if (share.has_first) share.first = request_shape(in, tid, true);
  total_qo = static_cast<uint32_t>(in.qo_indptr[in.batch]);  // one broadcast load: any lane may publish it
  const bool starts_ok = tid != 0 || (in.qo_indptr[0] == 0 && in.kv_indptr[0] == 0);
  ScheduleTotals local;
  if (share.has_first) local.add(share.first);
#pragma unroll 1
  for (int64_t b = tid + kScheduleThreads; b < in.batch; b += kScheduleThreads) local.add(request_shape(in, b, true));
  if (!starts_ok) local.error |= kPlanErrorIndptrStart;

  unsigned w[2 * kPieces + 5];
  split64(w, local.cost);
  split64(w + kPieces, local.kv_tiles);
  w[2 * kPieces] = static_cast<unsigned>(local.valid);
  w[2 * kPieces + 1] = static_cast<unsigned>(local.max_kv_tiles);
  w[2 * kPieces + 2] = static_cast<unsigned>(local.max_qo_len);
  w[2 * kPieces + 3] = static_cast<unsigned>(local.max_kv_len);
  w[2 * kPieces + 4] = static_cast<unsigned>(local.error);
  reduce.operator()<2 * kPieces + 1, 3, 1>(w);
  ScheduleTotals t;
  t.cost = join64(w);
  t.kv_tiles = join64(w + kPieces);
  t.valid = w[2 * kPieces];
  t.max_kv_tiles = w[2 * kPieces + 1];
  t.max_qo_len = w[2 * kPieces + 2];
  t.max_kv_len = w[2 * kPieces + 3];
  t.error = w[2 * kPieces + 4];
  return t;
}

// schedule_chunk_tiles() of an accepted batch and the chosen chunk's item and
// partial counts.
__device__ __forceinline__ StagedCounts decide_chunk(const ScheduleInputs& in, const ScheduleLayout& layout,
                                                     const ScheduleTotals& t, const Share& share,
                                                     const Reducer& reduce, uint64_t sms_magic, uint64_t spare_magic) {
  const ChunkCounts cc = narrow_totals(t, in.num_sms, layout.max_work)
                             ? chunk_narrow(in, layout, t, share, reduce, sms_magic, spare_magic)
                             : chunk_wide(in, layout, t, share, reduce);
  return StagedCounts{static_cast<uint32_t>(cc.chunk), static_cast<uint32_t>(cc.items),
                      static_cast<uint32_t>(cc.partials)};
}

// The decision's shared slots: one per warp and reduction.
struct DecisionSlots {
  unsigned totals[kScheduleWarps * (2 * kPieces + 5)];
  unsigned chunk[kScheduleWarps * (kPieces + 2) * kPlanCandidates];
};

// Whether this thread takes part in the decision: warp 0 alone decides a
// batch it holds whole (uniform over the block), every warp a larger one.
// Warp 0 always does: thread 0, the only one place_schedule() asks for the
// totals (the header), holds them.
__device__ __forceinline__ bool decides(const ScheduleInputs& in) { return in.batch > kWarp || threadIdx.x < kWarp; }

// A reduction over the deciding threads, through `slots` when several warps decide.
__device__ __forceinline__ Reducer reducer_of(const ScheduleInputs& in, unsigned* slots) {
  return Reducer{in.batch <= kWarp ? nullptr : slots, static_cast<int>(threadIdx.x % kWarp),
                 static_cast<int>(threadIdx.x / kWarp)};
}

}  // namespace
}  // namespace mlacore::plan_gpu
