// The plan: validation, the host-built schedule, the plan object and its
// C ABI. The schedule itself is build_schedule() in schedule_algorithm.h.
#include "plan/plan_builder.h"

#include <mlacore/plan.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "common/dispatch.h"
#include "common/error.h"

static_assert(MLACORE_PLAN_ERROR_INDPTR_START == mlacore::kPlanErrorIndptrStart &&
                  MLACORE_PLAN_ERROR_INDPTR == mlacore::kPlanErrorIndptr &&
                  MLACORE_PLAN_ERROR_KV_LEN == mlacore::kPlanErrorKvLen,
              "the C ABI's error bits are the header's");

namespace mlacore {
namespace {

constexpr int64_t kMaxInt32 = 2147483647;
// Work items and partials share one int32-indexed space; the scan that
// places them needs both totals below 2^31.
constexpr int64_t kMaxCapacity = kMaxScheduleCapacity;

[[maybe_unused]] int64_t align_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

void check_capacity(int64_t max_batch, int64_t max_work) {
  if (max_batch < 0 || max_batch > kMaxCapacity)
    value_error("max_batch: expected 0 <= max_batch <= ", kMaxCapacity, ", got ", max_batch);
  if (max_work < max_batch || max_work < 1 || max_work > kMaxCapacity)
    value_error("max_work: expected max_batch=", max_batch, " <= max_work <= ", kMaxCapacity,
                " (every request needs one work item), got ", max_work);
}

IndexView view_of(const CheckedTensor& a) {
  return IndexView{a.data(), a.stride(0), a.dtype() == DType::I64};
}

// floor(n / d) as one multiply, for a divisor shared by a whole pass over the
// requests: a 64-bit idiv costs up to ~90 cycles on older Xeons, one per
// request per candidate chunk, and the host schedule is on the latency path of
// every plan. With m = ceil(2^64 / d) and e = m*d - 2^64
// (0 <= e < d), n*m / 2^64 = n/d + n*e / (d * 2^64), and the error term stays
// below 1/d, so the floor is exact, whenever n*e < 2^64: true for n, d < 2^32.
// The schedule only divides tile counts (kv_len <= 2^31-1 gives < 2^26 tiles).
class Divider {
 public:
  Divider() = default;  // by 1
  explicit Divider(int64_t d) : m_(d > 1 ? reciprocal_of(static_cast<uint64_t>(d)) : 0) {}
  int64_t floor_div(int64_t n) const {
    if (m_ == 0) return n;  // d == 1: ceil(2^64 / 1) does not fit
    return static_cast<int64_t>((static_cast<unsigned __int128>(static_cast<uint64_t>(n)) * m_) >> 64);
  }
  // splits_of() of a valid request: an empty one still gets one item.
  int64_t splits(int64_t kv_tiles) const { return floor_div(kv_tiles > 0 ? kv_tiles - 1 : 0) + 1; }

 private:
  uint64_t m_ = 0;
};

// request_shape()'s tile counts without its page-count division, which only
// checks what scan_requests() has already checked.
inline int64_t q_tiles_of(int64_t qo_len, int64_t num_heads) {
  const int64_t q = ceil_div(qo_len * num_heads, kDecodeTileRows);
  return q > 0 ? q : 1;
}
inline int64_t kv_tiles_of(int64_t kv_len) { return ceil_div(kv_len, kDecodeTileTokens); }

// The messages for request b, in the order validate_schedule_inputs() has
// always reported them. Only reached once the fast test below found a fault.
[[noreturn]] __attribute__((noinline, cold)) void report_request(const ScheduleInputs& in, int64_t b) {
  const int64_t q0 = in.qo_indptr[b], q1 = in.qo_indptr[b + 1];
  const int64_t p0 = in.kv_indptr[b], p1 = in.kv_indptr[b + 1];
  const int64_t len = in.kv_len[b];
  if (q1 < q0)
    value_error("qo_indptr: expected non-decreasing values, got qo_indptr[", b, "]=", q0, " > qo_indptr[", b + 1,
                "]=", q1, " (request ", b, ")");
  if (q1 > kMaxInt32) value_error("qo_indptr[", b + 1, "]=", q1, ": exceeds int32 (request ", b, ")");
  if (p1 < p0)
    value_error("kv_indptr: expected non-decreasing values, got kv_indptr[", b, "]=", p0, " > kv_indptr[", b + 1,
                "]=", p1, " (request ", b, ")");
  if (p1 > kMaxInt32) value_error("kv_indptr[", b + 1, "]=", p1, ": exceeds int32 (request ", b, ")");
  if (len < 0 || len > kMaxInt32)
    value_error("kv_len_arr[", b, "]: expected 0 <= kv_len <= 2^31-1, got ", len, " (request ", b, ")");
  const int64_t need = ceil_div(len, in.page_size);
  value_error("kv_len_arr[", b, "]=", len, ": request ", b, " needs ceil(", len, "/page_size ", in.page_size,
              ")=", need, " pages, but kv_indptr gives it ", p1 - p0, " (kv_indptr[", b + 1, "]-kv_indptr[", b,
              "])");
}

// Contiguous index vectors of one width, the common case (the GPU path's
// packed copy, most host callers), read without IndexView's per-element width
// test and stride multiply; the passes below are instantiated for these and
// for IndexView (anything else).
template <class T>
struct Dense {
  const T* p;
  int64_t operator[](int64_t i) const { return p[i]; }
};

template <class V>
struct Vectors {
  V qo, kv, len;
};

template <class Fn>
void with_vectors(const ScheduleInputs& in, Fn&& fn) {
  const IndexView &q = in.qo_indptr, &k = in.kv_indptr, &l = in.kv_len;
  const bool dense = q.stride == 1 && k.stride == 1 && l.stride == 1;
  if (dense && !q.is64 && !k.is64 && !l.is64) {
    fn(Vectors<Dense<int32_t>>{{static_cast<const int32_t*>(q.data)}, {static_cast<const int32_t*>(k.data)},
                               {static_cast<const int32_t*>(l.data)}});
  } else if (dense && q.is64 && k.is64 && l.is64) {
    fn(Vectors<Dense<int64_t>>{{static_cast<const int64_t*>(q.data)}, {static_cast<const int64_t*>(k.data)},
                               {static_cast<const int64_t*>(l.data)}});
  } else {
    fn(Vectors<IndexView>{q, k, l});
  }
}

// The scalar checks of validate_schedule_inputs() that read no input element.
void check_scalar_args(const ScheduleInputs& in, const ScheduleLayout& layout) {
  const int64_t B = in.batch;
  if (B < 0 || B > layout.max_batch)
    value_error("qo_indptr: batch ", B, " exceeds the plan's max_batch=", layout.max_batch);
  if (in.page_size < 1) value_error("page_size: expected >= 1, got ", in.page_size);
  if (in.num_heads < 1) value_error("num_heads: expected >= 1, got ", in.num_heads);
  if (in.num_sms < 1) value_error("num_sms: expected >= 1, got ", in.num_sms);
  // The C ABI passes both as int32; the bound keeps the products below in
  // int64 for C++ callers too.
  if (in.page_size > kMaxInt32) value_error("page_size: expected <= 2^31-1, got ", in.page_size);
  if (in.num_heads > kMaxDecodeHeads) value_error("num_heads: expected <= ", kMaxDecodeHeads, ", got ", in.num_heads);
}

// The scalar checks of validate_schedule_inputs().
void check_scalars(const ScheduleInputs& in, const ScheduleLayout& layout) {
  check_scalar_args(in, layout);
  if (in.qo_indptr[0] != 0) value_error("qo_indptr: expected first element 0, got ", in.qo_indptr[0]);
  if (in.kv_indptr[0] != 0) value_error("kv_indptr: expected first element 0, got ", in.kv_indptr[0]);
}

// Validates every request (ValueError naming the first bad one) and returns
// the totals build_schedule() reduces, in one pass that reads each input
// element once and divides nothing: ceil(len / page_size) == pages is tested
// as (pages - 1) * page_size < len <= pages * page_size, exact in int64
// because both factors are below 2^31 by the time it is evaluated.
// `tiles` (batch entries, the plan's own scratch, or null) receives each
// request's tile counts, so the candidate pass reads a compact array instead
// of recomputing them from the inputs once per candidate.
template <class V>
ScheduleTotals scan_requests(const Vectors<V>& v, const ScheduleInputs& in, RequestTiles* tiles) {
  const int64_t B = in.batch, ps = in.page_size;
  ScheduleTotals t;
  int64_t q0 = 0, p0 = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t q1 = v.qo[b + 1], p1 = v.kv[b + 1], len = v.len[b];
    const int64_t pages = p1 - p0;
    // The same conditions request_shape() flags, so a validated batch never
    // reaches the schedule with a skipped request.
    if (q1 < q0 || q1 > kMaxInt32 || p1 < p0 || p1 > kMaxInt32 || len < 0 || len > kMaxInt32 ||
        (len == 0 ? pages != 0 : pages < 1 || (pages - 1) * ps >= len || pages * ps < len))
      report_request(in, b);
    RequestShape r;
    r.qo_len = q1 - q0;
    r.kv_len = len;
    r.q_tiles = q_tiles_of(r.qo_len, in.num_heads);
    r.kv_tiles = kv_tiles_of(len);
    t.add(r);
    if (tiles != nullptr) tiles[b] = RequestTiles{r.q_tiles, r.kv_tiles};
    q0 = q1;
    p0 = p1;
  }
  return t;
}

// schedule_chunk_tiles() for one host thread on validated inputs, from the
// scan's tile counts: one pass per distinct candidate, one divider and one sum
// in registers each (five of each at once spilled). A chunk of at least
// no_split tiles splits nothing (one item a request), and equal chunks give
// equal counts: neither needs a pass.
int64_t host_chunk_tiles(const ScheduleInputs& in, const ScheduleLayout& layout, const ScheduleTotals& t,
                         const RequestTiles* tiles) {
  const int64_t B = in.batch;
  const int64_t no_split = t.no_split_tiles();
  const ChunkBounds cb = chunk_bounds(t, in.num_sms, layout.max_work, partial_chunk_floor(t, in, layout.max_work));
  if (splits_nothing(cb, t)) return no_split;
  const CandidateChunks chunks = candidate_chunks(cb, no_split);
  const int64_t* chunk_of = chunks.tiles;
  CandidateCtas cand;
  for (int i = 0; i < kPlanCandidates; ++i) {
    int same = -1;
    for (int j = 0; j < i; ++j)
      if (chunk_of[j] == chunk_of[i]) same = j;
    if (same >= 0) {
      cand.ctas[i] = cand.ctas[same];
      continue;
    }
    int64_t ctas = 0;
    if (chunk_of[i] >= no_split) {
      for (int64_t b = 0; b < B; ++b) ctas += tiles[b].q;
    } else {
      const Divider by(chunk_of[i]);
      for (int64_t b = 0; b < B; ++b) ctas += tiles[b].q * by.splits(tiles[b].kv);
    }
    cand.ctas[i] = ctas;
  }
  return pick_chunk_tiles(cand, chunks, no_split, in.num_sms);
}

// place_schedule() for one host thread on validated inputs, rewritten without
// a division per request (see Divider). It must stay bit-identical to it:
// same placement order, same padding, same header.
template <class V>
void host_place(const Vectors<V>& v, const ScheduleInputs& in, const ScheduleLayout& layout,
                const ScheduleTotals& t, int64_t chunk, int32_t* meta) {
  if (in.longest_first) {
    // The tuning knob's order: the shared template itself on one thread (its
    // divisions per request are the price of an opt-in mode, not of every plan).
    place_schedule(SerialExec{}, in, layout, true, t, chunk, meta);
    return;
  }
  const int64_t B = in.batch;
  const int64_t no_split = t.no_split_tiles();
  const int64_t chunk_tokens = chunk * kDecodeTileTokens;
  int32_t* last_page_len = meta + layout.last_page_len();
  int32_t* split_indptr = meta + layout.split_indptr();
  WorkItem* work = reinterpret_cast<WorkItem*>(meta + layout.work());
  int64_t num_work = 0, num_partials = 0, p0 = 0;
  if (chunk >= no_split) {
    // No request has more tiles than the chunk: one item each (an empty one
    // too), no partials. Large decode batches land here, where the general
    // placement would spend a multiply-high and a branchy inner loop on every request.
    for (int64_t b = 0; b < B; ++b) {
      const int64_t p1 = v.kv[b + 1], len = v.len[b];
      last_page_len[b] = static_cast<int32_t>(len == 0 ? 0 : len - (p1 - p0 - 1) * in.page_size);
      split_indptr[b] = 0;
      work[b] = WorkItem{static_cast<int32_t>(b), 0, static_cast<int32_t>(len), -1};
      p0 = p1;
    }
    num_work = B;  // B <= max_batch <= max_work
  } else {
    const Divider by_chunk(chunk);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t p1 = v.kv[b + 1], len = v.len[b];
      const int64_t n = by_chunk.splits(kv_tiles_of(len));
      last_page_len[b] = static_cast<int32_t>(len == 0 ? 0 : len - (p1 - p0 - 1) * in.page_size);
      split_indptr[b] = static_cast<int32_t>(num_partials);
      const int32_t partial0 = n > 1 ? static_cast<int32_t>(num_partials) : -1;
      // Bounded like place_schedule(): a broken invariant loses work instead
      // of writing past the buffer.
      const int64_t fit = layout.max_work - num_work < n ? layout.max_work - num_work : n;
      for (int64_t i = 0; i < fit; ++i) {
        const int64_t begin = i * chunk_tokens;
        const int64_t end = begin + chunk_tokens < len ? begin + chunk_tokens : len;
        work[num_work + i] = WorkItem{static_cast<int32_t>(b), static_cast<int32_t>(begin),
                                      static_cast<int32_t>(end), n > 1 ? partial0 + static_cast<int32_t>(i) : -1};
      }
      num_work += n;
      num_partials += n > 1 ? n : 0;
      p0 = p1;
    }
  }

  for (int64_t b = B; b < layout.max_batch; ++b) last_page_len[b] = 0;
  for (int64_t b = B; b <= layout.max_batch; ++b) split_indptr[b] = static_cast<int32_t>(num_partials);
  for (int64_t i = layout.split_indptr() + layout.max_batch + 1; i < layout.work(); ++i) meta[i] = 0;
  for (int64_t i = num_work; i < layout.max_work; ++i) work[i] = WorkItem{-1, 0, 0, -1};
  write_header(meta, num_work, num_partials, B, t, chunk_tokens, v.qo[B], 0);
}

// The host build: validation, the chunk, the placement into `meta`. Stays
// bit-identical to build_schedule(SerialExec{}, ...), which the device-only
// kernel runs too: same totals, same candidates and choice (the shared
// helpers), same placement. A batch costs at most three tight passes.
void schedule_host(const ScheduleInputs& in, const ScheduleLayout& layout, int32_t* meta, RequestTiles* tiles) {
  check_scalars(in, layout);
  with_vectors(in, [&](const auto& v) {
    const ScheduleTotals t = scan_requests(v, in, tiles);
    host_place(v, in, layout, t, host_chunk_tiles(in, layout, t, tiles), meta);
  });
}

#if defined(MLACORE_WITH_GPU)
// Validation alone, of the inputs a rejecting exchange kernel staged: throws
// the ValueError naming the argument or the request.
void validate_host(const ScheduleInputs& in, const ScheduleLayout& layout) {
  check_scalars(in, layout);
  with_vectors(in, [&](const auto& v) { scan_requests(v, in, nullptr); });
}
#endif

}  // namespace

// MLACORE_SCHEDULE, read when a plan is created: "legacy" (or unset) places
// work items in request order, "longest_first" longest first
// (place_longest_first() in schedule_algorithm.h). A tuning knob for A/B runs.
static bool longest_first_from_env() {
  const char* v = std::getenv("MLACORE_SCHEDULE");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "legacy") == 0) return false;
  if (std::strcmp(v, "longest_first") == 0) return true;
  value_error("MLACORE_SCHEDULE: expected legacy or longest_first, got '", v, "'");
}

PlanBuilder::PlanBuilder(int64_t max_batch, int64_t max_work, int64_t num_sms)
    : layout_{max_batch, max_work}, num_sms_(num_sms), longest_first_(longest_first_from_env()) {
  if (num_sms < 1 || num_sms > 65536) value_error("num_sms: expected 1 <= num_sms <= 65536, got ", num_sms);
  check_capacity(max_batch, max_work);
  tiles_.resize(static_cast<size_t>(max_batch));
}

PlanBuilder::~PlanBuilder() {
#if defined(MLACORE_WITH_GPU)
  plan_gpu::staging_destroy(staging_);
#endif
}

ScheduleInputs PlanBuilder::check_inputs(const CheckedTensor& qo, const CheckedTensor& kv, const CheckedTensor& len, const CheckedTensor& meta,
                                         int64_t page_size, int64_t num_heads) const {
  qo.expect_index_vector();
  if (qo.size(0) < 1) value_error("qo_indptr: expected length batch+1 >= 1, got ", qo.describe());
  const int64_t B = qo.size(0) - 1;
  if (B > layout_.max_batch)
    value_error("qo_indptr: batch ", B, " (length ", B + 1, ") exceeds the plan's max_batch=", layout_.max_batch);
  kv.expect_index_vector(B + 1, "batch+1");
  len.expect_index_vector(B, "batch");
  kv.expect_same_device(qo);
  len.expect_same_device(qo);
  if (page_size < 1) value_error("page_size: expected >= 1, got ", page_size);
  if (num_heads < 1) value_error("num_heads: expected >= 1, got ", num_heads);
  if (num_heads > kMaxDecodeHeads) value_error("num_heads: expected <= ", kMaxDecodeHeads, ", got ", num_heads);

  meta.expect_ndim(1);
  meta.expect_dtype({DType::I32});
  if (meta.size(0) < layout_.total())
    value_error("schedule: expected at least ", layout_.total(), " int32 elements (max_batch=", layout_.max_batch,
                ", max_work=", layout_.max_work, "), got ", meta.describe());
  if (meta.size(0) > 1 && meta.stride(0) != 1)
    value_error("schedule: expected a contiguous tensor, got stride ", meta.stride(0));
  if (reinterpret_cast<uintptr_t>(meta.data()) % 16 != 0)
    value_error("schedule: expected 16-byte aligned data (work items are read as 16-byte vectors)");
  if (qo.on_gpu()) meta.expect_same_device(qo);

  ScheduleInputs in;
  in.qo_indptr = view_of(qo);
  in.kv_indptr = view_of(kv);
  in.kv_len = view_of(len);
  in.batch = B;
  in.page_size = page_size;
  in.num_heads = num_heads;
  in.num_sms = num_sms_;
  in.partial_rows = partial_rows_;
  in.partial_qo_len = partial_qo_len_;
  in.longest_first = longest_first_;
  return in;
}

void PlanBuilder::set_partial_budget(int64_t partial_rows, int64_t partial_qo_len) {
  if (partial_rows < 0) value_error("partial_rows: expected >= 0 (0: no budget), got ", partial_rows);
  if (partial_qo_len < 0 || partial_qo_len > kMaxInt32)
    value_error("partial_qo_len: expected 0 <= partial_qo_len <= 2^31-1, got ", partial_qo_len);
  partial_rows_ = partial_rows;
  partial_qo_len_ = partial_qo_len;
}

void PlanBuilder::record_info(const int32_t* meta) {
  info_.batch = meta[kHdrBatch];
  info_.num_work = meta[kHdrNumWork];
  info_.num_partials = meta[kHdrNumPartials];
  info_.max_qo_len = meta[kHdrMaxQoLen];
  info_.max_kv_len = meta[kHdrMaxKvLen];
  info_.chunk_tokens = meta[kHdrChunkTokens];
  info_.total_qo = meta[kHdrTotalQo];
  info_.error = meta[kHdrError];
  info_.on_host = true;
  counts_seq_ = 0;
}

const PlanInfo& PlanBuilder::info() const {
#if defined(MLACORE_WITH_GPU)
  if (counts_seq_ != 0) {
    const plan_gpu::StagedCounts c = plan_gpu::exchange_counts(staging_, counts_seq_);
    info_.num_work = static_cast<int32_t>(c.num_work);
    info_.num_partials = static_cast<int32_t>(c.num_partials);
    info_.chunk_tokens = static_cast<int32_t>(static_cast<int64_t>(c.chunk_tiles) * kDecodeTileTokens);
    counts_seq_ = 0;
  }
#endif
  return info_;
}

void PlanBuilder::build(const DLTensor* qo_indptr, const DLTensor* kv_indptr, const DLTensor* kv_len_arr,
                        int64_t page_size, int64_t num_heads, const DLTensor* schedule, void* stream) {
  const CheckedTensor qo(qo_indptr, "qo_indptr"), kv(kv_indptr, "kv_indptr"), len(kv_len_arr, "kv_len_arr");
  const CheckedTensor meta(schedule, "schedule");
  const ScheduleInputs in = check_inputs(qo, kv, len, meta, page_size, num_heads);
  const Where inputs_at = where_to_run(qo);
  const Where meta_at = where_to_run(meta);

  if (inputs_at == Where::CPU && meta_at == Where::CPU) {
    schedule_host(in, layout_, meta.ptr<int32_t>(), tiles_.data());
    record_info(meta.ptr<int32_t>());
    return;
  }
#if defined(MLACORE_WITH_GPU)
  // Before any launch: a capture would record the exchange kernel, whose
  // replay would spin with no host on the other end.
  plan_gpu::refuse_capture(stream, "plan build");
  const int device = meta.device_id();
  if (staging_ == nullptr) {
    // Once per plan, for the full capacity: the schedule region, room for the
    // three inputs at their widest (int64) and the handshake's flags, so no
    // later build of any batch size allocates pinned memory again.
    staging_ = plan_gpu::staging_create(device, static_cast<size_t>(layout_.total() * 4),
                                        static_cast<size_t>(3 * (layout_.max_batch + 1) * 8));
    ++stats_.pinned_allocations;
    stats_.staging = plan_gpu::staging_host(staging_);
  } else if (plan_gpu::staging_device(staging_) != device) {
    value_error("schedule: this plan serves GPU ", plan_gpu::staging_device(staging_), ", got a tensor on ",
                meta.device_str());
  }
  char* host = static_cast<char*>(plan_gpu::staging_host(staging_));
  int32_t* host_meta = reinterpret_cast<int32_t*>(host);
  const size_t schedule_bytes = static_cast<size_t>(layout_.total() * 4);

  if (inputs_at == Where::GPU) {
    // The exchange: one kernel validates the inputs, hands the verdict to
    // this thread through the mapped staging buffer, picks the chunk, sends
    // its counts the same way and places the work items into the schedule
    // tensor. One launch, no memcpy, no stream synchronization; this thread
    // blocks only until the stream reaches the kernel and it has validated
    // the batch, as any round trip does. Kernels after it on the stream read
    // the schedule in stream order, so nothing else needs to wait.
    const auto width = [](const IndexView& v) -> int64_t { return v.is64 ? 8 : 4; };
    const int64_t off_kv = align_up((in.batch + 1) * width(in.qo_indptr), 8);
    const int64_t off_len = off_kv + align_up((in.batch + 1) * width(in.kv_indptr), 8);
    const char* inputs = host + plan_gpu::staging_inputs_offset(staging_);
    ScheduleInputs host_in = in;
    host_in.qo_indptr = IndexView{inputs, 1, in.qo_indptr.is64};
    host_in.kv_indptr = IndexView{inputs + off_kv, 1, in.kv_indptr.is64};
    host_in.kv_len = IndexView{inputs + off_len, 1, in.kv_len.is64};
    // Scalars the kernel relies on, before it can see them.
    check_scalar_args(in, layout_);
    const uint64_t seq = plan_gpu::exchange_launch(staging_, in, static_cast<size_t>(off_kv),
                                                   static_cast<size_t>(off_len), layout_, meta.ptr<int32_t>(),
                                                   stream);
    const plan_gpu::StagedVerdict v = plan_gpu::exchange_wait(staging_, seq, stream);
    ++stats_.device_to_host;
    if (v.error != 0) {
      // The kernel flags exactly what scan_requests() and check_scalars()
      // reject, staged the inputs and left the schedule alone.
      validate_host(host_in, layout_);  // throws, naming the request
      runtime_error("plan: the exchange kernel flagged the inputs (error bits ", v.error,
                    ") but the host's validation accepts them");
    }
    // The info the kernel's header will hold, by the same function; its
    // counts come with info(), a chunk's decision after the verdict.
    ScheduleTotals maxima;
    maxima.max_qo_len = v.max_qo_len;
    maxima.max_kv_len = v.max_kv_len;
    int32_t header[kHdrSize];
    write_header(header, 0, 0, in.batch, maxima, 0, v.total_qo, 0);
    record_info(header);
    counts_seq_ = seq;
    return;
  }
  // Host inputs: schedule into the pinned region, one async H2D copy. The
  // region must be free of the previous upload (exchange kernels never read it).
  plan_gpu::staging_wait(staging_);
  schedule_host(in, layout_, host_meta, tiles_.data());
  record_info(host_meta);
  plan_gpu::upload(staging_, meta.data(), schedule_bytes, stream);
  ++stats_.host_to_device;
#else
  (void)stream;
  runtime_error("schedule: GPU tensors need a libmlacore built with a GPU backend");
#endif
}

void PlanBuilder::build_device(const DLTensor* qo_indptr, const DLTensor* kv_indptr, const DLTensor* kv_len_arr,
                               int64_t page_size, int64_t num_heads, const DLTensor* schedule, void* stream) {
  const CheckedTensor qo(qo_indptr, "qo_indptr"), kv(kv_indptr, "kv_indptr"), len(kv_len_arr, "kv_len_arr");
  const CheckedTensor meta(schedule, "schedule");
  const ScheduleInputs in = check_inputs(qo, kv, len, meta, page_size, num_heads);
  if (!qo.on_gpu())
    value_error("qo_indptr: build_device needs GPU tensors (it computes the schedule in a kernel), got ",
                qo.describe());
  if (!meta.on_gpu()) value_error("schedule: build_device needs a GPU tensor, got ", meta.describe());
  (void)where_to_run(qo);
#if defined(MLACORE_WITH_GPU)
  plan_gpu::launch_build_schedule(in, layout_, meta.ptr<int32_t>(), meta.device_id(), stream);
  ++stats_.device_builds;
  info_ = PlanInfo{};
  info_.batch = static_cast<int32_t>(in.batch);
  info_.on_host = false;
  counts_seq_ = 0;
#else
  (void)in;
  (void)stream;
#endif
}

}  // namespace mlacore

struct mlacore_plan : mlacore::PlanBuilder {
  using mlacore::PlanBuilder::PlanBuilder;
};

namespace {
void require_plan(const void* plan) {
  if (plan == nullptr) mlacore::type_error("plan: expected a plan handle, got NULL");
}
}  // namespace

extern "C" {

MLACORE_API int64_t mlacore_plan_default_max_work(int64_t max_batch, int32_t num_sms) {
  // Saturates instead of overflowing for a max_batch near INT64_MAX.
  const int64_t extra = num_sms > 0 ? num_sms : 1;
  if (max_batch > std::numeric_limits<int64_t>::max() - extra) return std::numeric_limits<int64_t>::max();
  return mlacore::default_max_work(max_batch < 0 ? 0 : max_batch, num_sms);
}

MLACORE_API int64_t mlacore_plan_schedule_size(int64_t max_batch, int64_t max_work) {
  if (max_batch < 0 || max_work < 0 || max_batch > mlacore::kMaxCapacity || max_work > mlacore::kMaxCapacity)
    return -1;
  return mlacore::ScheduleLayout{max_batch, max_work}.total();
}

MLACORE_API mlacore_status mlacore_plan_layout(int64_t max_batch, int64_t max_work, int64_t* offsets) {
  return mlacore::guarded([&] {
    if (offsets == nullptr) mlacore::type_error("offsets: expected an array of 4, got NULL");
    mlacore::check_capacity(max_batch, max_work);
    const mlacore::ScheduleLayout layout{max_batch, max_work};
    offsets[0] = layout.header();
    offsets[1] = layout.last_page_len();
    offsets[2] = layout.split_indptr();
    offsets[3] = layout.work();
  });
}

MLACORE_API mlacore_status mlacore_plan_create(int64_t max_batch, int64_t max_work, int32_t num_sms,
                                               mlacore_plan** out) {
  return mlacore::guarded([&] {
    if (out == nullptr) mlacore::type_error("out: expected a place for the plan handle, got NULL");
    *out = nullptr;
    // Clamped first: max_batch + num_sms overflows for a max_batch near
    // INT64_MAX, and the constructor rejects any max_batch out of range.
    if (max_work <= 0)
      max_work = mlacore::default_max_work(max_batch < 0 ? 0 : std::min(max_batch, mlacore::kMaxCapacity + 1), num_sms);
    *out = new mlacore_plan(max_batch, max_work, num_sms);
  });
}

MLACORE_API void mlacore_plan_destroy(mlacore_plan* plan) { delete plan; }

MLACORE_API mlacore_status mlacore_plan_build(mlacore_plan* plan, const DLTensor* qo_indptr,
                                              const DLTensor* kv_indptr, const DLTensor* kv_len_arr,
                                              int32_t page_size, int32_t num_heads, const DLTensor* schedule,
                                              void* stream) {
  return mlacore::guarded([&] {
    require_plan(plan);
    plan->build(qo_indptr, kv_indptr, kv_len_arr, page_size, num_heads, schedule, stream);
  });
}

MLACORE_API mlacore_status mlacore_plan_build_device(mlacore_plan* plan, const DLTensor* qo_indptr,
                                                     const DLTensor* kv_indptr, const DLTensor* kv_len_arr,
                                                     int32_t page_size, int32_t num_heads,
                                                     const DLTensor* schedule, void* stream) {
  return mlacore::guarded([&] {
    require_plan(plan);
    plan->build_device(qo_indptr, kv_indptr, kv_len_arr, page_size, num_heads, schedule, stream);
  });
}

MLACORE_API mlacore_status mlacore_plan_capacity(const mlacore_plan* plan, int64_t* max_batch, int64_t* max_work,
                                                 int32_t* num_sms) {
  return mlacore::guarded([&] {
    require_plan(plan);
    if (max_batch) *max_batch = plan->layout().max_batch;
    if (max_work) *max_work = plan->layout().max_work;
    if (num_sms) *num_sms = static_cast<int32_t>(plan->num_sms());
  });
}

MLACORE_API mlacore_status mlacore_plan_set_partial_budget(mlacore_plan* plan, int64_t partial_rows,
                                                           int64_t partial_qo_len) {
  return mlacore::guarded([&] {
    require_plan(plan);
    plan->set_partial_budget(partial_rows, partial_qo_len);
  });
}

MLACORE_API mlacore_status mlacore_plan_get_info(const mlacore_plan* plan, mlacore_plan_info* out) {
  return mlacore::guarded([&] {
    require_plan(plan);
    if (out == nullptr) mlacore::type_error("out: expected a mlacore_plan_info, got NULL");
    const mlacore::PlanInfo& i = plan->info();
    *out = mlacore_plan_info{i.batch,        i.num_work, i.num_partials, i.max_qo_len, i.max_kv_len,
                             i.chunk_tokens, i.total_qo, i.error,        i.on_host ? 1 : 0, 0};
  });
}

MLACORE_API mlacore_status mlacore_plan_get_stats(const mlacore_plan* plan, mlacore_plan_stats* out) {
  return mlacore::guarded([&] {
    require_plan(plan);
    if (out == nullptr) mlacore::type_error("out: expected a mlacore_plan_stats, got NULL");
    const mlacore::PlanStats& s = plan->stats();
    *out = mlacore_plan_stats{s.pinned_allocations, s.device_to_host, s.host_to_device,
                              s.stream_syncs,       s.device_builds,  s.staging};
  });
}

}  // extern "C"
