// The host build of a schedule: validation and the division-free passes
// (scan, chunk, placement) that restate build_schedule() for one host
// thread. See schedule_host.h for the contract.
#include "plan/schedule_host.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "common/error.h"

namespace mlacore {
namespace {

constexpr int64_t kMaxInt32 = 2147483647;

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

}  // namespace

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

namespace {

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

}  // namespace

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

// Validation alone, of the inputs a rejecting exchange kernel staged: throws
// the ValueError naming the argument or the request.
void validate_host(const ScheduleInputs& in, const ScheduleLayout& layout) {
  check_scalars(in, layout);
  with_vectors(in, [&](const auto& v) { scan_requests(v, in, nullptr); });
}

}  // namespace mlacore
