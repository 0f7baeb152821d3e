// The schedule algorithm: the integer helpers and the template
// build_schedule() that turn qo_indptr, kv_indptr (page indptr) and
// kv_len_arr into the int32 schedule of schedule.h (header, kv_last_page_len,
// split_indptr, work items, padding). Written for any executor: the device
// kernels (build_device.cu, exchange.cu) run it with a block of threads, and
// with one "thread" (SerialExec) it is the reference of the host build
// (plan_builder.cpp), which restates it in division-free passes. Every step
// is integer arithmetic whose result does not depend on how the requests were
// spread over threads, so host and device agree bit for bit.
// Contract: max_work >= max_batch; default_max_work(max_batch, num_sms) is
// always enough. An invalid request gets no work and its PlanError bits in
// the header. The order of the work items is request order or longest first
// (place_longest_first(), the default; MLACORE_SCHEDULE=legacy keeps request
// order); the split itself is the same.
#pragma once

#include <cstddef>
#include <cstdint>

#include "plan/schedule.h"

#ifndef MLACORE_HD
#if defined(__CUDACC__) || defined(__HIPCC__)
#define MLACORE_HD __host__ __device__ __forceinline__
#else
#define MLACORE_HD inline
#endif
#endif

namespace mlacore {

// Header kHdrError bits. Only the device-only path can see them set (the
// host path raises ValueError instead); an affected request gets no work
// items, kv_last_page_len 0 and no partials, so the kernels never touch it.
enum PlanError : int32_t {
  kPlanErrorIndptrStart = 1,  // qo_indptr[0] or kv_indptr[0] != 0: no request gets work
  kPlanErrorIndptr = 2,       // a request whose qo or kv indptr decreases or leaves int32
  kPlanErrorKvLen = 4,        // kv_len < 0, > INT32_MAX, or ceil(kv_len/page_size) != its pages
};

// Per request a fixed cost charged on top of its KV tiles when balancing, in
// tiles of kDecodeTileTokens (FlashMLA charges 5 blocks of 64 tokens): loading
// the query tile, writing output or partial, its share of the combine.
constexpr int64_t kPlanFixedCostTiles = 5;
// Chunk sizes compared per batch (candidate_chunks).
constexpr int kPlanCandidates = 5;

// Work items that suffice for any batch of max_batch requests: room for
// num_sms items on top of one per request, which the capacity bound of
// chunk_bounds() keeps the splits within.
constexpr int64_t default_max_work(int64_t max_batch, int64_t num_sms) {
  return max_batch + (num_sms > 0 ? num_sms : 1);
}

// A 1-D int32 or int64 index vector read with a stride; the width is a
// runtime flag so one kernel instantiation serves every dtype mix.
struct IndexView {
  const void* data = nullptr;
  int64_t stride = 1;
  bool is64 = false;

  MLACORE_HD int64_t operator[](int64_t i) const {
    return is64 ? static_cast<const int64_t*>(data)[i * stride]
                : static_cast<int64_t>(static_cast<const int32_t*>(data)[i * stride]);
  }
};

// ScheduleInputs::partial_rows of a plan without a workspace budget
// (MLACORE_PLAN_NO_PARTIAL_BUDGET in the C ABI).
constexpr int64_t kNoPartialBudget = -1;

struct ScheduleInputs {
  IndexView qo_indptr;  // batch + 1
  IndexView kv_indptr;  // batch + 1, in pages
  IndexView kv_len;     // batch, in tokens
  int64_t batch = 0;
  int64_t page_size = 1;
  int64_t num_heads = 1;
  int64_t num_sms = 1;
  // The workspace's budget for partial outputs, a cap separate from the
  // balance: partial_rows >= 0 holds that many fp32 rows (512 values + LSE),
  // a partial takes max(partial_qo_len, the batch's max_qo_len) * num_heads
  // of them (0 rows: nothing splits). kNoPartialBudget: no budget (the
  // partials are bounded by max_work alone).
  int64_t partial_rows = kNoPartialBudget;
  int64_t partial_qo_len = 0;
  // Work items in longest-first order (place_longest_first()), else request order.
  bool longest_first = false;
};

// What one request contributes; error != 0 means it is skipped.
struct RequestShape {
  int64_t qo_len = 0;
  int64_t kv_len = 0;
  int64_t q_tiles = 0;   // CTAs (grid y) it keeps busy per work item, at least 1
  int64_t kv_tiles = 0;
  int64_t last_page_len = 0;
  int32_t error = 0;
};

#if defined(__CUDACC__) || defined(__HIPCC__)
// Out of line: ptxas expands every 64-bit division in place (~70
// instructions), and the schedule has dozens of call sites.
static __device__ __noinline__ int64_t ceil_div_wide(int64_t a, int64_t b) { return (a + b - 1) / b; }
#endif

MLACORE_HD int64_t ceil_div(int64_t a, int64_t b) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  // The exchange kernel's decision sits on the host's wait, and its operands
  // almost always fit 31 bits: a 32-bit division there, the wide one aside.
  if (a >= 0 && b > 0 && ((a | b) >> 31) == 0)
    return static_cast<int64_t>((static_cast<uint32_t>(a) + static_cast<uint32_t>(b) - 1u) / static_cast<uint32_t>(b));
  return ceil_div_wide(a, b);
#else
  return (a + b - 1) / b;
#endif
}

// ceil(2^64 / d), the reciprocal by which floor(n / d) is the high half of
// n * m, exact for n * d < 2^64 (0 stands for d <= 1: the quotient is n). The
// host's Divider and the exchange kernel's divisions by num_sms both use it.
MLACORE_HD uint64_t reciprocal_of(uint64_t d) { return d > 1 ? ~uint64_t{0} / d + 1 : 0; }

// By a constant: shifts, no division on either side.
template <int64_t N>
MLACORE_HD int64_t ceil_div_by(int64_t a) {
  return (a + N - 1) / N;
}

MLACORE_HD RequestShape request_shape(const ScheduleInputs& in, int64_t b, bool starts_ok) {
  // All five loads first (b < batch keeps them in bounds): one memory round
  // trip, not one per check.
  const int64_t q0 = in.qo_indptr[b], q1 = in.qo_indptr[b + 1];
  const int64_t p0 = in.kv_indptr[b], p1 = in.kv_indptr[b + 1];
  const int64_t len = in.kv_len[b];
  RequestShape r;
  if (!starts_ok) {
    r.error = kPlanErrorIndptrStart;
    return r;
  }
  constexpr int64_t kMax32 = 2147483647;
  if (q0 < 0 || q1 < q0 || q1 > kMax32 || p0 < 0 || p1 < p0 || p1 > kMax32) {
    r.error = kPlanErrorIndptr;
    return r;
  }
  // ceil(len / page_size) == pages without a division: (pages - 1) * ps < len
  // <= pages * ps, exact in int64 for pages < 2^31 and ps clamped to 2^31
  // (every valid len is below that, so a larger page holds it in one page).
  const int64_t pages = p1 - p0;
  const int64_t ps = in.page_size > kMax32 ? kMax32 + 1 : in.page_size;
  if (len < 0 || len > kMax32 || (len == 0 ? pages != 0 : pages < 1 || (pages - 1) * ps >= len || pages * ps < len)) {
    r.error = kPlanErrorKvLen;
    return r;
  }
  r.qo_len = q1 - q0;
  r.kv_len = len;
  const int64_t q_tiles = ceil_div_by<kDecodeTileRows>(r.qo_len * in.num_heads);
  r.q_tiles = q_tiles > 0 ? q_tiles : 1;
  r.kv_tiles = ceil_div_by<kDecodeTileTokens>(len);
  r.last_page_len = len == 0 ? 0 : len - (p1 - p0 - 1) * in.page_size;
  return r;
}

// Work items of a request for a chunk of `chunk_tiles` tiles: an empty request
// still gets one (the kernel writes zeros and -inf LSE), a skipped one none.
MLACORE_HD int64_t splits_of(const RequestShape& r, int64_t chunk_tiles) {
  if (r.error != 0) return 0;
  if (r.kv_tiles == 0 || chunk_tiles >= r.kv_tiles) return 1;
  // Here chunk_tiles < kv_tiles <= 2^25 (kv_len <= INT32_MAX): exact in 32 bits.
  const uint32_t c = static_cast<uint32_t>(chunk_tiles);
  return static_cast<int64_t>((static_cast<uint32_t>(r.kv_tiles) + c - 1u) / c);
}

// Reductions over requests. Every field merges with an associative and
// commutative integer operation, so the result does not depend on the order.
struct ScheduleTotals {
  int64_t cost = 0;       // sum of q_tiles * (kv_tiles + fixed cost)
  int64_t kv_tiles = 0;   // sum of kv_tiles
  int64_t valid = 0;      // requests that get work
  int64_t max_kv_tiles = 0;
  int64_t max_qo_len = 0;
  int64_t max_kv_len = 0;
  int64_t error = 0;      // OR of PlanError bits

  // The chunk (in tiles) that splits no request: the longest request, at least 1.
  MLACORE_HD int64_t no_split_tiles() const { return max_kv_tiles > 0 ? max_kv_tiles : 1; }

  MLACORE_HD void add(const RequestShape& r) {
    if (r.error != 0) {
      error |= r.error;
      return;
    }
    cost += r.q_tiles * (r.kv_tiles + kPlanFixedCostTiles);
    kv_tiles += r.kv_tiles;
    valid += 1;
    if (r.kv_tiles > max_kv_tiles) max_kv_tiles = r.kv_tiles;
    if (r.qo_len > max_qo_len) max_qo_len = r.qo_len;
    if (r.kv_len > max_kv_len) max_kv_len = r.kv_len;
  }
  MLACORE_HD void merge(const ScheduleTotals& o) {
    cost += o.cost;
    kv_tiles += o.kv_tiles;
    valid += o.valid;
    if (o.max_kv_tiles > max_kv_tiles) max_kv_tiles = o.max_kv_tiles;
    if (o.max_qo_len > max_qo_len) max_qo_len = o.max_qo_len;
    if (o.max_kv_len > max_kv_len) max_kv_len = o.max_kv_len;
    error |= o.error;
  }
};

// CTAs (work items x query tiles) each candidate chunk would launch.
struct CandidateCtas {
  int64_t ctas[kPlanCandidates] = {};
  MLACORE_HD void merge(const CandidateCtas& o) {
    for (int i = 0; i < kPlanCandidates; ++i) ctas[i] += o.ctas[i];
  }
};

// The bounds on a batch's chunk (in tiles), both at most no_split.
// Capacity (hard): splitting request b into ceil(kv_tiles_b / c) <
// kv_tiles_b / c + 1 items stays within max_work when c >= sum kv_tiles /
// (max_work - valid). Balance (FlashMLA, where the candidates start): the
// work of the whole batch, fixed costs included, spread over num_sms CTAs
// gives each ceil(cost / num_sms) tiles; never below the capacity bound.
struct ChunkBounds {
  int64_t balance;
  int64_t capacity;
};

// The workspace cap (ScheduleInputs::partial_rows): the smallest chunk (in
// tiles) whose partials fit `fit` = partial_rows / (qo_len * num_heads) of
// them, 0 when there is no budget or it does not bind, -1 when not even two
// fit (nothing may split). A split request has n = ceil(kv_tiles / c) >= 2 items with
// (n - 1) * c < kv_tiles, so n <= 2 (n - 1) < 2 kv_tiles / c: the partials
// total less than 2 * sum kv_tiles / c, at most `fit` for c >= 2 * sum
// kv_tiles / fit. A budget of max_work or more partials never binds (the
// partials are at most the work items), so the schedule is then the uncapped one.
MLACORE_HD int64_t partial_chunk_floor(const ScheduleTotals& t, const ScheduleInputs& in, int64_t max_work) {
  if (in.partial_rows < 0) return 0;  // kNoPartialBudget
  int64_t qo = t.max_qo_len > in.partial_qo_len ? t.max_qo_len : in.partial_qo_len;
  if (qo < 1) qo = 1;
  const int64_t fit = in.partial_rows / (qo * in.num_heads);
  if (fit >= max_work) return 0;
  if (fit < 2) return -1;
  return ceil_div(2 * t.kv_tiles, fit);
}

// `floor` is partial_chunk_floor(): raised into the capacity bound, or -1: no split.
MLACORE_HD ChunkBounds chunk_bounds(const ScheduleTotals& t, int64_t num_sms, int64_t max_work, int64_t floor) {
  const int64_t no_split = t.no_split_tiles();
  const int64_t spare = max_work - t.valid;
  if (spare <= 0 || floor < 0) return {no_split, no_split};
  int64_t cap = ceil_div(t.kv_tiles, spare);
  if (cap < 1) cap = 1;
  if (cap < floor) cap = floor;
  int64_t c = ceil_div(t.cost, num_sms);
  if (c < cap) c = cap;
  return {c < no_split ? c : no_split, cap < no_split ? cap : no_split};
}

// The balance bound already allows the chunk that splits nothing: no
// candidate needs comparing, and every request gets one work item.
MLACORE_HD bool splits_nothing(const ChunkBounds& cb, const ScheduleTotals& t) {
  return cb.balance >= t.no_split_tiles();
}

// Candidate i as a number of equal parts of the longest request (no_split
// tiles): most = ceil(no_split / balance), the most parts the balance
// allows, then most - 1, 3/4 most, most / 2 and 1 (no split at all). Equal parts (512
// tiles in 8 x 64, not 8 x 63 + 8) leave no CTA with a tail the others wait
// for, and a count that just misses a wave is weighed against the one below
// it: 16 query tiles of 512 KV tiles on 132 SMs are 9 x 57 (144 CTAs, two
// waves) or 8 x 64 (128 CTAs, one), where chunks grown from the balance
// (63, 79, ...) gave 7 x 74 and left 20 SMs idle. A part may fall below the
// balance bound (the modelled time decides), never below the capacity bound.
struct CandidateChunks {
  int64_t tiles[kPlanCandidates];
};

MLACORE_HD CandidateChunks candidate_chunks(const ChunkBounds& cb, int64_t no_split) {
  const int64_t most = ceil_div(no_split, cb.balance);
  const int64_t parts[kPlanCandidates] = {most, most - 1, most * 3 / 4, most / 2, 1};
  CandidateChunks out;
  for (int i = 0; i < kPlanCandidates; ++i) {
    const int64_t c = ceil_div(no_split, parts[i] < 1 ? 1 : parts[i]);
    out.tiles[i] = c > cb.capacity ? c : cb.capacity;
  }
  return out;
}

// Picks the candidate with the shortest modelled time: waves of num_sms CTAs
// (AITER's occupancy term: a wave that is mostly empty costs as much as a
// full one) times the per-CTA time, chunk + fixed cost (AITER's split
// overhead term). Ties go to the larger chunk: fewer partials to merge.
MLACORE_HD int64_t pick_chunk_tiles(const CandidateCtas& cand, const CandidateChunks& chunks, int64_t no_split,
                                    int64_t num_sms) {
  int64_t best = no_split, best_time = -1;
  for (int i = kPlanCandidates - 1; i >= 0; --i) {
    const int64_t c = chunks.tiles[i];
    const int64_t time = ceil_div(cand.ctas[i], num_sms) * (c + kPlanFixedCostTiles);
    if (best_time < 0 || time < best_time || (time == best_time && c > best)) {
      best = c;
      best_time = time;
    }
  }
  return best;
}

// A request's query and KV tile counts, as the host schedule's scan leaves
// them for its candidate pass.
struct RequestTiles {
  int64_t q, kv;
};

// The schedule header (decode_schedule.h), written the same way by the host
// path and by the kernel, which must agree bit for bit.
MLACORE_HD void write_header(int32_t* meta, int64_t num_work, int64_t num_partials, int64_t batch,
                             const ScheduleTotals& t, int64_t chunk_tokens, int64_t total_qo, int64_t error) {
  meta[kHdrNumWork] = static_cast<int32_t>(num_work);
  meta[kHdrNumPartials] = static_cast<int32_t>(num_partials);
  meta[kHdrBatch] = static_cast<int32_t>(batch);
  meta[kHdrMaxQoLen] = static_cast<int32_t>(t.max_qo_len);
  meta[kHdrMaxKvLen] = static_cast<int32_t>(t.max_kv_len);
  meta[kHdrChunkTokens] = static_cast<int32_t>(chunk_tokens);
  meta[kHdrTotalQo] = static_cast<int32_t>(total_qo);
  meta[kHdrError] = static_cast<int32_t>(error);
}

// One host "thread": every collective is the identity.
struct SerialExec {
  MLACORE_HD int64_t tid() const { return 0; }
  MLACORE_HD int64_t nthreads() const { return 1; }
  MLACORE_HD void sync() const {}
  template <class T>
  MLACORE_HD T reduce(const T& v) const { return v; }
  MLACORE_HD int64_t exclusive_scan(int64_t v, int64_t& total) const {
    total = v;
    return 0;
  }
};

// The schedule, in three phases any executor runs in turn: the totals, the
// chunk, the placement. Exec supplies tid(), nthreads(), sync(), reduce(T)
// (merge over all threads, result on every thread) and exclusive_scan(v,
// total). The exchange kernel runs only the first and last (the host picks
// the chunk); build_schedule() runs all three.
MLACORE_HD bool schedule_starts_ok(const ScheduleInputs& in) {
  return in.batch >= 0 && in.qo_indptr[0] == 0 && in.kv_indptr[0] == 0;
}

template <class Exec>
MLACORE_HD ScheduleTotals schedule_totals(const Exec& ex, const ScheduleInputs& in, bool starts_ok) {
  ScheduleTotals local;
  for (int64_t b = ex.tid(); b < in.batch; b += ex.nthreads()) local.add(request_shape(in, b, starts_ok));
  return ex.reduce(local);
}

template <class Exec>
MLACORE_HD int64_t schedule_chunk_tiles(const Exec& ex, const ScheduleInputs& in, bool starts_ok,
                                        const ScheduleTotals& t, int64_t max_work) {
  const int64_t no_split = t.no_split_tiles();
  const ChunkBounds cb = chunk_bounds(t, in.num_sms, max_work, partial_chunk_floor(t, in, max_work));
  if (splits_nothing(cb, t)) return no_split;
  const CandidateChunks chunks = candidate_chunks(cb, no_split);
  CandidateCtas cand;
  for (int64_t b = ex.tid(); b < in.batch; b += ex.nthreads()) {
    const RequestShape r = request_shape(in, b, starts_ok);
    for (int i = 0; i < kPlanCandidates; ++i) cand.ctas[i] += r.q_tiles * splits_of(r, chunks.tiles[i]);
  }
  return pick_chunk_tiles(ex.reduce(cand), chunks, no_split, in.num_sms);
}

// ---- longest-first placement (the default; MLACORE_SCHEDULE=legacy turns it off) ----
//
// The decode grid runs one CTA per work item and query tile, and the GPU hands
// CTAs out in grid order as SMs free up: a greedy list schedule. When a batch
// needs more than one wave and its items differ in length (ragged batches,
// every request's remainder item), request order can leave a long item for
// the end, where it runs alone. Placing the items longest first (LPT) bounds
// that tail by the shortest items instead. Lengths are ranked by octave below
// the chunk, kLptBuckets classes: bucket k holds the items of bit_length(chunk)
// - k tiles (the last one everything shorter, empty items included), each
// bucket in request order, so a request's items keep their order (its full
// chunks are in bucket 0, its last item in bucket 0 or later). Split points,
// partial indices, split_indptr and the header are those of request order;
// only positions in the work array change.
constexpr int kLptBuckets = 16;

MLACORE_HD int bit_length(int64_t x) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return x > 0 ? 64 - __clzll(static_cast<long long>(x)) : 0;
#else
  return x > 0 ? 64 - __builtin_clzll(static_cast<unsigned long long>(x)) : 0;
#endif
}

// The length class of an item of `tiles` tiles (<= chunk): 0 for the longest.
MLACORE_HD int lpt_bucket(int64_t tiles, int64_t chunk) {
  const int k = bit_length(chunk) - bit_length(tiles);
  return k < kLptBuckets - 1 ? k : kLptBuckets - 1;
}

// Items per length class; a request of n items adds n - 1 full chunks to
// class 0 and its last item to its own class.
struct LptCounts {
  int32_t n[kLptBuckets] = {};
  MLACORE_HD void add(int64_t items, int64_t last_tiles, int64_t chunk) {
    if (items <= 0) return;
    n[0] += static_cast<int32_t>(items - 1);
    n[lpt_bucket(last_tiles, chunk)] += 1;
  }
  MLACORE_HD void merge(const LptCounts& o) {
    for (int k = 0; k < kLptBuckets; ++k) n[k] += o.n[k];
  }
};
static_assert(sizeof(LptCounts) == 64, "reduced like the totals: one 64-byte slot a warp");

// Tiles of a request's last item for a chunk of `chunk` tiles and n items.
MLACORE_HD int64_t last_item_tiles(const RequestShape& r, int64_t n, int64_t chunk) {
  return n > 0 ? r.kv_tiles - (n - 1) * chunk : 0;
}

// The per-request sections and the work items of a schedule buffer.
struct ScheduleSections {
  int32_t* last_page_len;
  int32_t* split_indptr;
  WorkItem* work;
  MLACORE_HD ScheduleSections(const ScheduleLayout& layout, int32_t* meta)
      : last_page_len(meta + layout.last_page_len()),
        split_indptr(meta + layout.split_indptr()),
        work(reinterpret_cast<WorkItem*>(meta + layout.work())) {}
};

// Request b's shape and item count in a placement round; a thread past the
// batch (b >= batch) gets none, and a shape that no request has.
MLACORE_HD int64_t round_request(const ScheduleInputs& in, int64_t b, bool starts_ok, int64_t chunk,
                                 RequestShape& r) {
  r = RequestShape{};
  r.error = kPlanErrorIndptrStart;
  if (b >= in.batch) return 0;
  r = request_shape(in, b, starts_ok);
  return splits_of(r, chunk);
}

// The schedule's int32s past the work items in use: padding of the per-request
// sections and of the work items, the header. Shared by both placements.
template <class Exec>
MLACORE_HD void finish_schedule(const Exec& ex, const ScheduleInputs& in, const ScheduleLayout& layout,
                                bool starts_ok, const ScheduleTotals& t, int64_t chunk_tokens, int64_t num_work,
                                int64_t num_partials, int32_t* meta) {
  const int64_t B = in.batch;
  const int64_t tid = ex.tid(), nth = ex.nthreads();
  const ScheduleSections sec(layout, meta);
  for (int64_t b = B + tid; b < layout.max_batch; b += nth) sec.last_page_len[b] = 0;
  for (int64_t b = B + tid; b <= layout.max_batch; b += nth) sec.split_indptr[b] = static_cast<int32_t>(num_partials);
  for (int64_t i = layout.split_indptr() + layout.max_batch + 1 + tid; i < layout.work(); i += nth) meta[i] = 0;
  for (int64_t i = num_work + tid; i < layout.max_work; i += nth) sec.work[i] = WorkItem{-1, 0, 0, -1};
  if (tid == 0)
    write_header(meta, num_work, num_partials, B, t, chunk_tokens,
                 starts_ok && (t.error & kPlanErrorIndptr) == 0 ? static_cast<int64_t>(in.qo_indptr[B]) : 0,
                 t.error | (starts_ok ? 0 : kPlanErrorIndptrStart));
  ex.sync();
}

// place_schedule() with the work items longest first. Two passes over the
// requests: the class counts (one reduction) give each class its first
// position; then, in rounds of nthreads, one scan places partials as in
// request order and four scans (four 16-bit class counts a word: a round adds
// at most nthreads <= 256 to each) place every item within its class.
template <class Exec>
MLACORE_HD void place_longest_first(const Exec& ex, const ScheduleInputs& in, const ScheduleLayout& layout,
                                    bool starts_ok, const ScheduleTotals& t, int64_t chunk, int32_t* meta) {
  static_assert(kLptBuckets == 16, "four words of four 16-bit counts");
  const int64_t B = in.batch;
  const int64_t tid = ex.tid(), nth = ex.nthreads();
  const int64_t chunk_tokens = chunk * kDecodeTileTokens;
  const ScheduleSections sec(layout, meta);

  LptCounts local;
  for (int64_t b = tid; b < B; b += nth) {
    const RequestShape r = request_shape(in, b, starts_ok);
    const int64_t n = splits_of(r, chunk);
    local.add(n, last_item_tiles(r, n, chunk), chunk);
  }
  const LptCounts all = ex.reduce(local);
  int64_t next[kLptBuckets];  // first free position of each class
  int64_t at = 0;
  for (int k = 0; k < kLptBuckets; ++k) {
    next[k] = at;
    at += all.n[k];
  }

  int64_t carry = 0;  // items (low 32 bits) and partials (high), as place_schedule()
  for (int64_t base = 0; base < B; base += nth) {
    const int64_t b = base + tid;
    RequestShape r;
    const int64_t n = round_request(in, b, starts_ok, chunk, r);
    const int last_class = n > 0 ? lpt_bucket(last_item_tiles(r, n, chunk), chunk) : -1;
    int64_t before[kLptBuckets];  // this request's first position within each class
    for (int w = 0; w < 4; ++w) {
      int64_t word = 0;
      for (int j = 0; j < 4; ++j) {
        const int k = 4 * w + j;
        const int64_t c = (k == 0 && n > 0 ? n - 1 : 0) + (k == last_class ? 1 : 0);
        word |= c << (16 * j);
      }
      int64_t round_total = 0;
      const int64_t offset = ex.exclusive_scan(word, round_total);
      for (int j = 0; j < 4; ++j) {
        const int k = 4 * w + j;
        before[k] = next[k] + ((offset >> (16 * j)) & 0xffff);
        next[k] += (round_total >> (16 * j)) & 0xffff;
      }
    }
    const int64_t packed = n + ((n > 1 ? n : 0) << 32);
    int64_t round_total = 0;
    const int64_t offset = carry + ex.exclusive_scan(packed, round_total);
    carry += round_total;
    if (b >= B) continue;
    const int64_t first_partial = offset >> 32;
    sec.last_page_len[b] = static_cast<int32_t>(r.last_page_len);
    sec.split_indptr[b] = static_cast<int32_t>(first_partial);
    for (int64_t i = 0; i < n; ++i) {
      // Full chunks in class 0 in order, then the last item in its class
      // (right after them when that is class 0 too).
      const int64_t pos = i < n - 1 ? before[0] + i : last_class == 0 ? before[0] + n - 1 : before[last_class];
      if (pos >= layout.max_work) continue;  // a broken invariant loses work, never writes past the buffer
      const int64_t begin = i * chunk_tokens;
      const int64_t end = begin + chunk_tokens < r.kv_len ? begin + chunk_tokens : r.kv_len;
      sec.work[pos] = WorkItem{static_cast<int32_t>(b), static_cast<int32_t>(begin), static_cast<int32_t>(end),
                           n > 1 ? static_cast<int32_t>(first_partial + i) : -1};
    }
  }
  finish_schedule(ex, in, layout, starts_ok, t, chunk_tokens, carry & 0xffffffffLL, carry >> 32, meta);
}

// Places every request's work items for a chunk of `chunk` tiles and writes
// every int32 of ScheduleLayout::total(), so stale contents never leak into a
// plan. Requests are visited in rounds of nthreads so the prefix sums that
// place each request's work items carry from round to round.
template <class Exec>
MLACORE_HD void place_request_order(const Exec& ex, const ScheduleInputs& in, const ScheduleLayout& layout,
                                    bool starts_ok, const ScheduleTotals& t, int64_t chunk, int32_t* meta) {
  const int64_t B = in.batch;
  const int64_t tid = ex.tid(), nth = ex.nthreads();
  const int64_t chunk_tokens = chunk * kDecodeTileTokens;
  const ScheduleSections sec(layout, meta);
  int32_t* last_page_len = sec.last_page_len;
  int32_t* split_indptr = sec.split_indptr;
  WorkItem* work = sec.work;

  // Items in the low 32 bits, partials in the high ones: both total at most
  // max_work < 2^31, so one scan places both without carries between them.
  int64_t carry = 0;
  for (int64_t base = 0; base < B; base += nth) {
    const int64_t b = base + tid;
    RequestShape r;
    const int64_t n = round_request(in, b, starts_ok, chunk, r);
    const int64_t packed = n + ((n > 1 ? n : 0) << 32);
    int64_t round_total = 0;
    const int64_t offset = carry + ex.exclusive_scan(packed, round_total);
    carry += round_total;
    if (b >= B) continue;
    const int64_t first_item = offset & 0xffffffffLL, first_partial = offset >> 32;
    last_page_len[b] = static_cast<int32_t>(r.last_page_len);
    split_indptr[b] = static_cast<int32_t>(first_partial);
    // The capacity bound keeps the items within max_work; the bound below only
    // makes a broken invariant lose work instead of writing past the buffer.
    for (int64_t i = 0; i < n && first_item + i < layout.max_work; ++i) {
      const int64_t begin = i * chunk_tokens;
      const int64_t end = begin + chunk_tokens < r.kv_len ? begin + chunk_tokens : r.kv_len;
      WorkItem& w = work[first_item + i];
      w.request = static_cast<int32_t>(b);
      w.kv_begin = static_cast<int32_t>(begin);
      w.kv_end = static_cast<int32_t>(end);
      w.partial = n > 1 ? static_cast<int32_t>(first_partial + i) : -1;
    }
  }
  finish_schedule(ex, in, layout, starts_ok, t, chunk_tokens, carry & 0xffffffffLL, carry >> 32, meta);
}

// The placement of in.longest_first's order, fixed at compile time: the GPU
// kernels are instantiated once per order, so request order (the default)
// compiles to exactly its own code (the longest-first pass's class arrays
// would otherwise cost the latency-bound exchange kernel registers and stack).
template <bool kLongestFirst, class Exec>
MLACORE_HD void place_in_order(const Exec& ex, const ScheduleInputs& in, const ScheduleLayout& layout,
                               bool starts_ok, const ScheduleTotals& t, int64_t chunk, int32_t* meta) {
  if constexpr (kLongestFirst)
    place_longest_first(ex, in, layout, starts_ok, t, chunk, meta);
  else
    place_request_order(ex, in, layout, starts_ok, t, chunk, meta);
}

// Either placement, as in.longest_first says (the host's entry).
template <class Exec>
MLACORE_HD void place_schedule(const Exec& ex, const ScheduleInputs& in, const ScheduleLayout& layout,
                               bool starts_ok, const ScheduleTotals& t, int64_t chunk, int32_t* meta) {
  if (in.longest_first)
    place_in_order<true>(ex, in, layout, starts_ok, t, chunk, meta);
  else
    place_in_order<false>(ex, in, layout, starts_ok, t, chunk, meta);
}

template <bool kLongestFirst, class Exec>
MLACORE_HD void build_schedule_in_order(const Exec& ex, const ScheduleInputs& in, const ScheduleLayout& layout,
                                        int32_t* meta) {
  const bool starts_ok = schedule_starts_ok(in);
  const ScheduleTotals t = schedule_totals(ex, in, starts_ok);
  const int64_t chunk = schedule_chunk_tiles(ex, in, starts_ok, t, layout.max_work);
  place_in_order<kLongestFirst>(ex, in, layout, starts_ok, t, chunk, meta);
}

template <class Exec>
MLACORE_HD void build_schedule(const Exec& ex, const ScheduleInputs& in, const ScheduleLayout& layout,
                               int32_t* meta) {
  if (in.longest_first)
    build_schedule_in_order<true>(ex, in, layout, meta);
  else
    build_schedule_in_order<false>(ex, in, layout, meta);
}

}  // namespace mlacore
