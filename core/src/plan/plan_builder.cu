// Plan metadata on the GPU: the mapped pinned staging buffer and its event,
// the exchange kernel that decides the schedule on the GPU, hands the host
// its verdict and counts through that buffer and places the schedule itself
// (one launch, no memcpy, no stream synchronization), and the device-only
// schedule kernel (the same decision and placement without the host).
// Contract: build() returns once the verdict words of its sequence number
// arrive (on error bits it validates the staged inputs for the ValueError);
// info() waits for the count words. Every word is tagged with the build's
// sequence number, so none needs ordering against another and a word left
// from an earlier build is never taken. The kernel never waits for the host.
// Design: docs/design/2026-12-02-plan-exchange.md.
#include <chrono>
#include <cstring>
#include <thread>

#include "gpu/compat.h"
#include "plan/plan_builder.h"

#if defined(MLACORE_GPU_HIP)
using gpuEvent_t = hipEvent_t;
#define gpuEventCreateWithFlags hipEventCreateWithFlags
#define gpuEventDisableTiming hipEventDisableTiming
#define gpuEventDestroy hipEventDestroy
#define gpuEventRecord hipEventRecord
#define gpuEventQuery hipEventQuery
#define gpuEventSynchronize hipEventSynchronize
#define gpuErrorNotReady hipErrorNotReady
#define gpuStreamQuery hipStreamQuery
#define gpuDeviceSynchronize hipDeviceSynchronize
#else
using gpuEvent_t = cudaEvent_t;
#define gpuEventCreateWithFlags cudaEventCreateWithFlags
#define gpuEventDisableTiming cudaEventDisableTiming
#define gpuEventDestroy cudaEventDestroy
#define gpuEventRecord cudaEventRecord
#define gpuEventQuery cudaEventQuery
#define gpuEventSynchronize cudaEventSynchronize
#define gpuErrorNotReady cudaErrorNotReady
#define gpuStreamQuery cudaStreamQuery
#define gpuDeviceSynchronize cudaDeviceSynchronize
#endif

namespace mlacore::plan_gpu {

namespace {

// 64-bit words of the control block, which follows the inputs region, on one
// 128-byte line the device writes and the host only reads: the verdict's
// kVerdictWords words, then the counts' kCountsWords, each (sequence number
// mod 2^32) << 32 | value.
constexpr int kVerdict = 0;
constexpr int kVerdictWords = 4;  // StagedVerdict's fields, in order
constexpr int kCounts = 8;
constexpr int kCountsWords = 3;  // StagedCounts' fields, in order
constexpr unsigned long long kTagMask = 0xffffffffull;
constexpr size_t kControlBytes = 128;
static_assert(sizeof(StagedVerdict) == 4 * kVerdictWords && sizeof(StagedCounts) == 4 * kCountsWords,
              "one word per field");
static_assert(kVerdict + kVerdictWords <= kCounts && kCounts + kCountsWords <= 16, "both fit the line");

size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

// Host side of the polls: atomic loads of words the device writes over the
// bus. Aligned 8-byte accesses are single bus transactions, so no torn value.
uint64_t load_acquire(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
// Whether the word carries sequence number `seq`.
bool tagged(const uint64_t* p, uint64_t seq) { return (load_acquire(p) >> 32) == (seq & kTagMask); }

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Pure spinning for this long, then a yield per poll: the exchange normally
// completes within a few microseconds of the launch, but a busy stream can
// hold the kernel back for as long as its queue takes (as any round trip).
constexpr auto kSpinOnly = std::chrono::microseconds(10);
// How often a stalled poll asks the runtime whether the stream still lives.
constexpr auto kHealthCheck = std::chrono::milliseconds(1);

}  // namespace

struct Staging {
  int device = 0;
  void* host = nullptr;
  void* mapped = nullptr;  // the same memory as the GPU addresses it
  size_t bytes = 0;
  size_t inputs_offset = 0;   // bytes: the schedule region is [0, inputs_offset)
  size_t control_offset = 0;  // bytes: the control block
  gpuEvent_t uploaded{};  // recorded after each host-input upload that reads `host`
  bool pending = false;
  uint64_t seq = 0;       // the last sequence number handed to an exchange kernel
  // An exchange kernel whose verdict the host never saw (its wait threw): it
  // may still be queued, and would write the inputs region and the control line.
  uint64_t unseen = 0;
  // An accepted exchange kernel whose counts the host has not seen yet, and
  // its stream: it still writes the control line.
  uint64_t counting = 0;
  void* counting_stream = nullptr;

  uint64_t* control() { return reinterpret_cast<uint64_t*>(static_cast<char*>(host) + control_offset); }
};

Staging* staging_create(int device, size_t schedule_bytes, size_t input_bytes) {
  gpu::DeviceGuard guard(device);
  auto* s = new Staging;
  s->device = device;
  s->inputs_offset = round_up(schedule_bytes, 16);
  s->control_offset = round_up(s->inputs_offset + input_bytes, 128);
  s->bytes = s->control_offset + kControlBytes;
  // Mapped, so the exchange kernel stores its verdict (and rejected inputs)
  // into it directly: one launch where a D2H copy, a sync and an H2D copy
  // took three stream operations, each with its own latency.
  gpuError_t err = gpuHostAllocMapped(&s->host, s->bytes);
  if (err != gpuSuccess) {
    delete s;
    gpu::check(err, "plan: pinned staging allocation");
  }
  // Zeroed flags: sequence numbers start at 1, so nothing matches yet.
  for (size_t i = 0; i < kControlBytes / 8; ++i) s->control()[i] = 0;
  err = gpuHostGetDevicePointer(&s->mapped, s->host, 0);
  if (err == gpuSuccess) err = gpuEventCreateWithFlags(&s->uploaded, gpuEventDisableTiming);
  if (err != gpuSuccess) {
    (void)gpuFreeHost(s->host);
    delete s;
    gpu::check(err, "plan: mapping the staging buffer and creating its event");
  }
  return s;
}

void staging_destroy(Staging* s) noexcept {
  if (s == nullptr) return;
  // An upload may still read the buffer; freeing it under the copy would
  // hand the DMA engine freed memory.
  if (s->pending) (void)gpuEventSynchronize(s->uploaded);
  // So may an exchange kernel whose verdict was never seen, or whose counts
  // are still coming. It never waits for the host, so waiting for the device
  // is bounded. No DeviceGuard: it throws, and this runs in
  // destructors, at interpreter exit too, when the runtime may already be
  // unloading (errors ignored).
  const bool running = (s->unseen != 0 && !tagged(s->control() + kVerdict, s->unseen)) ||
                       (s->counting != 0 && !tagged(s->control() + kCounts, s->counting));
  if (running) {
    int previous = 0;
    if (gpuGetDevice(&previous) == gpuSuccess) {
      if (previous != s->device) (void)gpuSetDevice(s->device);
      (void)gpuDeviceSynchronize();
      if (previous != s->device) (void)gpuSetDevice(previous);
    }
  }
  (void)gpuEventDestroy(s->uploaded);
  (void)gpuFreeHost(s->host);
  delete s;
}

void* staging_host(Staging* s) { return s->host; }
size_t staging_inputs_offset(const Staging* s) { return s->inputs_offset; }
int staging_device(const Staging* s) { return s->device; }

void staging_wait(Staging* s) {
  if (!s->pending) return;
  // Usually done already; the query costs less than a wait that returns at once.
  const gpuError_t status = gpuEventQuery(s->uploaded);
  if (status == gpuErrorNotReady) {
    // Not an error: clear it so the next launch check does not report it.
    (void)gpuGetLastError();
    gpu::check(gpuEventSynchronize(s->uploaded), "plan: waiting for the previous metadata upload");
  } else {
    gpu::check(status, "plan: querying the previous metadata upload");
  }
  s->pending = false;
}

void refuse_capture(void* stream, const char* what) {
#if defined(MLACORE_GPU_CUDA)
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  gpu::check(cudaStreamIsCapturing(gpu::as_stream(stream), &status), "cudaStreamIsCapturing");
  if (status != cudaStreamCaptureStatusNone)
    runtime_error(what, ": the stream is capturing a CUDA graph, and a host-built plan needs a host round trip; "
                        "use build_device under capture");
#else
  // ROCm 5.2's HIP has no hipStreamIsCapturing; the synchronization itself
  // fails under capture there.
  (void)stream;
  (void)what;
#endif
}

namespace {

__device__ __forceinline__ void copy_index(const IndexView& v, int64_t i, char* dst) {
  if (v.is64)
    reinterpret_cast<int64_t*>(dst)[i] = static_cast<const int64_t*>(v.data)[i * v.stride];
  else
    reinterpret_cast<int32_t*>(dst)[i] = static_cast<const int32_t*>(v.data)[i * v.stride];
}

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

struct ExchangeArgs {
  ScheduleInputs in;
  ScheduleLayout layout;
  char* inputs;           // mapped: qo_indptr, kv_indptr at +off_kv, kv_len at +off_len
  int64_t off_kv, off_len;
  int32_t* meta;          // device: the plan's metadata tensor
  unsigned long long* control;  // mapped control line
  unsigned long long seq;
  // Reciprocals by which the kernel divides by num_sms and by max_work - batch
  // with one multiply-high, not a division's dozen dependent instructions
  // (reciprocal_of()).
  uint64_t sms_magic, spare_magic;
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

// N words, each tagged with the build's sequence number in its high half, one
// word a lane of warp 0 (one store instruction): the host takes them once
// every word carries its number, so no word needs ordering against another,
// and an accepted batch pays no system-scope fence. A rejection fences first: the staged
// inputs, which the host then reads, were stored before it (ordered by the
// barrier or the warp's sync before this).
template <class T>
__device__ __forceinline__ void publish(unsigned long long* words, unsigned long long seq, const T& fields, int lane,
                                        bool fence) {
  constexpr int N = sizeof(T) / 4;
  if (lane >= N) return;
  if (fence) __threadfence_system();
  uint32_t f[N];
  __builtin_memcpy(f, &fields, sizeof(T));
  uint32_t value = f[0];
#pragma unroll
  for (int k = 1; k < N; ++k) value = lane == k ? f[k] : value;
  *static_cast<volatile unsigned long long*>(words + lane) = ((seq & kTagMask) << 32) | value;
}

// One block: validates the three (possibly strided) inputs and hands the host
// its verdict (and, if it rejects them, the inputs at their own widths for
// the message); unless rejected, picks the chunk, hands over its counts and
// places the schedule into the metadata tensor. The same metadata as
// build_schedule(), bit for bit: the shared helpers decide (chunk_narrow()
// restates them in 32 bits, held to the host by test_plan), the same
// place_schedule() writes. Kernels after it on the stream read the metadata
// in stream order; the host waits only for the verdict, so only the loads and
// the totals' reduction are on its latency path.
template <bool kLongestFirst>
__global__ void __launch_bounds__(kScheduleThreads, 1) plan_exchange(ExchangeArgs a) {
  __shared__ int64_t smem[kSharedBytes / sizeof(int64_t)];  // place_schedule()'s collectives
  __shared__ DecisionSlots slots;
  __shared__ int64_t decided_chunk;  // -1: rejected
  const ScheduleInputs& in = a.in;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const bool one_warp = in.batch <= kWarp;
  ScheduleTotals t;
  if (decides(in)) {
    Share share{};
    uint32_t total_qo = 0;
    t = reduce_totals(in, reducer_of(in, slots.totals), share, total_qo);
    const StagedVerdict v{static_cast<uint32_t>(t.error), static_cast<uint32_t>(t.max_qo_len),
                          static_cast<uint32_t>(t.max_kv_len), total_qo};
    if (t.error != 0) {  // uniform: every thread holds the same totals
      const int64_t n = in.batch + 1;
      const int64_t first = one_warp ? lane : threadIdx.x, step = one_warp ? kWarp : kScheduleThreads;
#pragma unroll 1
      for (int64_t i = first; i < 3 * n; i += step) {
        if (i < n)
          copy_index(in.qo_indptr, i, a.inputs);
        else if (i < 2 * n)
          copy_index(in.kv_indptr, i - n, a.inputs + a.off_kv);
        else if (i - 2 * n < in.batch)
          copy_index(in.kv_len, i - 2 * n, a.inputs + a.off_len);
      }
      if (one_warp)
        gpu::warp_sync();
      else
        __syncthreads();
      if (warp == 0) publish(a.control + kVerdict, a.seq, v, lane, true);
      if (threadIdx.x == 0) decided_chunk = -1;
    } else {
      if (warp == 0) publish(a.control + kVerdict, a.seq, v, lane, false);
      const StagedCounts c =
          decide_chunk(in, a.layout, t, share, reducer_of(in, slots.chunk), a.sms_magic, a.spare_magic);
      if (warp == 0) publish(a.control + kCounts, a.seq, c, lane, false);
      if (threadIdx.x == 0) decided_chunk = c.chunk_tiles;
    }
  }
  __syncthreads();
  if (decided_chunk < 0) return;  // rejected: the metadata keeps its contents
  place_in_order<kLongestFirst>(BlockExec{reinterpret_cast<unsigned char*>(smem)}, in, a.layout, true, t,
                                decided_chunk, a.meta);
}

// The device-only schedule: the exchange's decision and placement without
// the host. A batch with an invalid request (rare: the device-only path
// flags them in the header instead of raising) takes build_schedule() itself,
// which gives each such request no work and records its bits; for valid
// batches the two agree bit for bit (the decision restates the shared
// helpers, test_plan compares both with the host). The generic helpers' checked
// 64-bit divisions one after another are too slow for this kernel, which a
// CUDA graph replays ahead of every decode.
template <bool kLongestFirst>
__global__ void __launch_bounds__(kScheduleThreads, 1)
    build_schedule_kernel(ScheduleInputs in, ScheduleLayout layout, int32_t* meta, uint64_t sms_magic,
                          uint64_t spare_magic) {
  // int64 elements: the reductions store structs of int64 fields there.
  __shared__ int64_t smem[kSharedBytes / sizeof(int64_t)];
  __shared__ DecisionSlots slots;
  __shared__ int64_t decided_chunk;  // -1: an invalid request
  ScheduleTotals t;
  if (decides(in)) {
    Share share{};
    uint32_t total_qo = 0;
    t = reduce_totals(in, reducer_of(in, slots.totals), share, total_qo);
    int64_t chunk = -1;
    if (t.error == 0)  // uniform over the deciding threads
      chunk = decide_chunk(in, layout, t, share, reducer_of(in, slots.chunk), sms_magic, spare_magic).chunk_tiles;
    if (threadIdx.x == 0) decided_chunk = chunk;
  }
  __syncthreads();
  const BlockExec ex{reinterpret_cast<unsigned char*>(smem)};
  if (decided_chunk < 0) {
    build_schedule_in_order<kLongestFirst>(ex, in, layout, meta);
    return;
  }
  place_in_order<kLongestFirst>(ex, in, layout, true, t, decided_chunk, meta);
}

}  // namespace

namespace {
// The N words from `words` of kernel `seq` once all of them carry its
// number, else false.
template <class T>
bool take(const uint64_t* words, uint64_t seq, T& out) {
  constexpr int N = sizeof(T) / 4;
  uint32_t f[N];
  for (int k = 0; k < N; ++k) {
    const uint64_t w = load_acquire(words + k);
    if ((w >> 32) != (seq & kTagMask)) return false;
    f[k] = static_cast<uint32_t>(w);
  }
  std::memcpy(&out, f, sizeof(T));
  return true;
}

// Spins until `seen()`: pure spinning for kSpinOnly, then a yield per poll,
// and every kHealthCheck `stalled()`, which returns once it knows the wait
// can go on and throws when it cannot.
template <class Seen, class Stalled>
void spin_until(Seen seen, Stalled stalled) {
  if (seen()) return;
  const auto t0 = std::chrono::steady_clock::now();
  auto next_check = t0 + kHealthCheck;
  for (unsigned polls = 1;; ++polls) {
    cpu_relax();
    if (seen()) return;
    if (polls % 16 != 0) continue;
    const auto now = std::chrono::steady_clock::now();
    if (now - t0 > kSpinOnly) std::this_thread::yield();
    if (now < next_check) continue;
    stalled();
    if (seen()) return;
    next_check = std::chrono::steady_clock::now() + kHealthCheck;
  }
}

}  // namespace

// Waits for the counts of `seq`, a kernel that has sent its verdict, so it
// runs and will send them: only a failing device (or a preempted context)
// can hold them back. So the health check, every millisecond, only asks
// whether the device has failed: a query of the legacy stream, which is
// always valid, returns a sticky error and never waits (a synchronization
// would wait for all the device's work, other streams' included).
StagedCounts exchange_counts(Staging* s, uint64_t seq) {
  const uint64_t* words = s->control() + kCounts;
  StagedCounts c{};
  spin_until(
      [&] {
        if (take(words, seq, c)) return true;
        // Tags only grow: a later one means a later accepted kernel's counts
        // replaced these (possible only after a wait that threw).
        const uint32_t tag = static_cast<uint32_t>(load_acquire(words) >> 32);
        if (static_cast<int32_t>(tag - static_cast<uint32_t>(seq & kTagMask)) > 0)
          runtime_error("plan: the counts of exchange ", seq, " were replaced by a later exchange's");
        return false;
      },
      [&] {
        gpu::DeviceGuard guard(s->device);
        const gpuError_t status = gpuStreamQuery(nullptr);
        if (status == gpuErrorNotReady) {
          (void)gpuGetLastError();  // not an error; keep it out of the next launch check
          return;
        }
        gpu::check(status, "plan: waiting for the exchange kernel's counts");
      });
  if (s->counting == seq) s->counting = 0;
  return c;
}

uint64_t exchange_launch(Staging* s, const ScheduleInputs& in, size_t off_kv, size_t off_len,
                         const ScheduleLayout& layout, int32_t* meta, void* stream) {
  gpu::DeviceGuard guard(s->device);
  if (s->unseen != 0 && !tagged(s->control() + kVerdict, s->unseen)) {
    // An earlier kernel may still write the control line this one will use.
    gpu::check(gpuDeviceSynchronize(), "plan: waiting for an earlier exchange kernel");
    s->counting = 0;  // every kernel has ended: no word is still coming
  }
  s->unseen = 0;
  // On another stream the previous kernel, still deciding its chunk, could
  // send its counts after this one's and leave them under an older tag; on
  // the same stream it ends before this one starts. It has sent its verdict,
  // so the wait is bounded by its chunk's decision. Streams are told apart by
  // handle: a stream destroyed while its kernel still decides and a new one
  // handed the same handle within those microseconds would defeat the rule,
  // and the next info() would wait for counts that never come.
  if (s->counting != 0 && s->counting_stream != stream) (void)exchange_counts(s, s->counting);
  ExchangeArgs a;
  a.in = in;
  a.layout = layout;
  a.inputs = static_cast<char*>(s->mapped) + s->inputs_offset;
  a.off_kv = static_cast<int64_t>(off_kv);
  a.off_len = static_cast<int64_t>(off_len);
  a.meta = meta;
  a.control = reinterpret_cast<unsigned long long*>(static_cast<char*>(s->mapped) + s->control_offset);
  a.seq = s->seq + 1;
  a.sms_magic = sms_magic_of(in);
  a.spare_magic = spare_magic_of(in, layout);
  // One instantiation per placement order (place_in_order()).
  if (in.longest_first)
    plan_exchange<true><<<1, kScheduleThreads, 0, gpu::as_stream(stream)>>>(a);
  else
    plan_exchange<false><<<1, kScheduleThreads, 0, gpu::as_stream(stream)>>>(a);
  gpu::check_launch("plan: plan_exchange");
  // Only a launched kernel consumes its number.
  s->seq = a.seq;
  s->unseen = a.seq;
  return a.seq;
}

StagedVerdict exchange_wait(Staging* s, uint64_t seq, void* stream) {
  const uint64_t* words = s->control() + kVerdict;
  StagedVerdict v{};
  spin_until([&] { return take(words, seq, v); },
             [&] {
               // Still waiting after a millisecond: a long queue ahead of the
               // kernel, or a context that died with it. A query tells them
               // apart without waiting.
               gpu::DeviceGuard guard(s->device);
               const gpuError_t status = gpuStreamQuery(gpu::as_stream(stream));
               if (status == gpuErrorNotReady) {
                 (void)gpuGetLastError();  // not an error; keep it out of the next launch check
                 return;
               }
               gpu::check(status, "plan: waiting for the exchange kernel");
               // The stream is idle, so the kernel has ended: its verdict must be there.
               if (!take(words, seq, v))
                 runtime_error("plan: the exchange kernel finished without handing over its verdict");
             });
  s->unseen = 0;
  if (v.error == 0) {
    // Accepted: its counts are still coming. A rejected kernel sends none and
    // is done with the buffer.
    s->counting = seq;
    s->counting_stream = stream;
  }
  return v;
}

void upload(Staging* s, void* device_dst, size_t bytes, void* stream) {
  gpu::DeviceGuard guard(s->device);
  const gpuStream_t st = gpu::as_stream(stream);
  gpu::check(gpuMemcpyAsync(device_dst, s->host, bytes, gpuMemcpyHostToDevice, st), "plan: copying the metadata");
  gpu::check(gpuEventRecord(s->uploaded, st), "plan: recording the upload");
  s->pending = true;
}

void launch_build_schedule(const ScheduleInputs& in, const ScheduleLayout& layout, int32_t* meta, int device,
                           void* stream) {
  gpu::DeviceGuard guard(device);
  auto kernel = in.longest_first ? build_schedule_kernel<true> : build_schedule_kernel<false>;
  kernel<<<1, kScheduleThreads, 0, gpu::as_stream(stream)>>>(in, layout, meta, sms_magic_of(in),
                                                              spare_magic_of(in, layout));
  gpu::check_launch("plan: build_schedule_kernel");
}

}  // namespace mlacore::plan_gpu
