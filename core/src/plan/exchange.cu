// The exchange: build() with device inputs in one kernel launch. The mapped
// pinned staging a plan owns and its upload event; plan_exchange, one block
// that validates the three inputs, hands the host its verdict and then its
// counts through the staging, and places the schedule itself into the
// schedule tensor (no memcpy, no stream synchronization); and the host's
// polls for those words.
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
#include "plan/block_schedule.cuh"
#include "plan/exchange.h"

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
    gpu::check(gpuEventSynchronize(s->uploaded), "plan: waiting for the previous schedule upload");
  } else {
    gpu::check(status, "plan: querying the previous schedule upload");
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

struct ExchangeArgs {
  ScheduleInputs in;
  ScheduleLayout layout;
  char* inputs;           // mapped: qo_indptr, kv_indptr at +off_kv, kv_len at +off_len
  int64_t off_kv, off_len;
  int32_t* meta;          // device: the plan's schedule tensor
  unsigned long long* control;  // mapped control line
  unsigned long long seq;
  // Reciprocals by which the kernel divides by num_sms and by max_work - batch
  // with one multiply-high, not a division's dozen dependent instructions
  // (reciprocal_of()).
  uint64_t sms_magic, spare_magic;
};

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
// places the schedule into the schedule tensor. The same schedule as
// build_schedule(), bit for bit: the shared helpers decide (chunk_narrow()
// restates them in 32 bits, held to the host by test_plan), the same
// place_schedule() writes. Kernels after it on the stream read the schedule
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
  if (decided_chunk < 0) return;  // rejected: the schedule keeps its contents
  place_in_order<kLongestFirst>(BlockExec{reinterpret_cast<unsigned char*>(smem)}, in, a.layout, true, t,
                                decided_chunk, a.meta);
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
  gpu::check(gpuMemcpyAsync(device_dst, s->host, bytes, gpuMemcpyHostToDevice, st), "plan: copying the schedule");
  gpu::check(gpuEventRecord(s->uploaded, st), "plan: recording the upload");
  s->pending = true;
}

}  // namespace mlacore::plan_gpu
