// Plan metadata on the GPU: the mapped pinned staging buffer and its event,
// the exchange kernel that trades the three inputs for the host's chunk through
// that buffer and places the schedule itself (one launch, no memcpy, no stream
// synchronization), and the device-only schedule kernel (build_schedule() run
// by one block).
//
// The exchange handshake (build() with device inputs), for sequence number s:
//   device: inputs -> staging; totals (validation bits included) -> ctl[kTotals]; fence.sys;
//           ctl[kInputsReady] = s; spin on ctl[kScheduleReady]
//   host:   spin until ctl[kInputsReady] == s (acquire); on error bits, validate the staged
//           inputs for the message; pick the chunk (from the totals alone when nothing splits);
//           ctl[kChunk] = chunk; ctl[kScheduleReady] = s (release), or s | kAbortBit on any error
//   device: fence.sys; read ctl[kChunk]; fence.sys; ctl[kDone] = s; place the schedule into the metadata
// Sequence numbers are 64-bit and grow by one per exchange, so a flag left
// over from an earlier build never equals the current one.
//
// The host keeps only what must be on the host: the ValueErrors and the chunk,
// which the kernel would take microseconds to pick (the candidates' 64-bit
// divisions run in one thread there). The placement, which writes every int32
// of the metadata, runs on the kernel's 256 threads instead of one host
// thread, and the schedule no longer crosses the bus. At batch 256 the host
// did 1.5-2.3 us of passes over the staged inputs; with the totals it does
// none unless the batch splits.
#include <chrono>
#include <cstdlib>
#include <thread>

#include "gpu/compat.h"
#include "plan_builder.h"

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

// 64-bit words of the control block, which follows the inputs region. The
// device writes kInputsReady and kDone, the host kScheduleReady: they sit on
// different 128-byte lines so a host store never shares a line the PCIe
// writes of the device land on.
constexpr int kInputsReady = 0;
constexpr int kDone = 1;           // the last kernel released with a chunk has read it
constexpr int kTotals = 2;         // StagedTotals (8 words), written before kInputsReady
constexpr int kScheduleReady = 16;  // 128 bytes further
constexpr int kChunk = 17;          // the chunk in tiles, written before kScheduleReady
static_assert(kTotals * 8 + sizeof(StagedTotals) <= kScheduleReady * 8, "the totals fit the device's line");
constexpr size_t kControlBytes = 256;
// Set in kScheduleReady next to the sequence number: "no schedule, leave the
// metadata alone and exit". Sequence numbers never reach 2^63.
constexpr unsigned long long kAbortBit = 1ull << 63;

size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

// Host side of the polls: atomic loads of words the device writes over the
// bus. Aligned 8-byte accesses are single bus transactions, so no torn value.
uint64_t load_acquire(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }

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
  uint64_t reader = 0;    // the last exchange kernel released with a chunk (it reads kChunk)
  bool aborted = false;   // an exchange kernel was released without one: it may still be polling

  uint64_t* control() { return reinterpret_cast<uint64_t*>(static_cast<char*>(host) + control_offset); }
};

Staging* staging_create(int device, size_t schedule_bytes, size_t input_bytes) {
  gpu::DeviceGuard guard(device);
  auto* s = new Staging;
  s->device = device;
  s->inputs_offset = round_up(schedule_bytes, 16);
  s->control_offset = round_up(s->inputs_offset + input_bytes, 128);
  s->bytes = s->control_offset + kControlBytes;
  // Mapped, so the exchange kernel stores the inputs into it and reads the
  // schedule back from it directly: one launch where a D2H copy, a sync and
  // an H2D copy took three stream operations, each with its own latency.
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
  // So may an exchange kernel: the last one released with a chunk until
  // it writes kDone, and one released with the abort value until it has seen
  // it (nothing reports that back). Both always finish, having been released,
  // so waiting for the device is bounded; it is rare (plan teardown).
  // No DeviceGuard: it throws, and this runs in destructors, at interpreter
  // exit too, when the runtime may already be unloading (errors ignored).
  if (s->aborted || (s->reader != 0 && load_acquire(s->control() + kDone) < s->reader)) {
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

void wait_reader(Staging* s) {
  // Same stream: the reader finished before the current kernel started (stream
  // order), so the first load already sees kDone. Another stream: the reader
  // is resident and released, so it finishes within microseconds.
  if (s->reader == 0) return;
  const uint64_t* done = s->control() + kDone;
  const auto t0 = std::chrono::steady_clock::now();
  while (load_acquire(done) < s->reader) {
    cpu_relax();
    const auto waited = std::chrono::steady_clock::now() - t0;
    if (waited > kSpinOnly) std::this_thread::yield();
    if (waited > std::chrono::seconds(1)) {
      // Never in a healthy context; a dead one would leave kDone unwritten.
      // Once the device is idle no kernel reads the release words.
      gpu::DeviceGuard guard(s->device);
      gpu::check(gpuDeviceSynchronize(), "plan: waiting for the previous exchange kernel");
      break;
    }
  }
  s->reader = 0;
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
  unsigned long long* control;  // mapped control block
  unsigned long long seq;
  bool handshake;               // false: store the inputs and end (launches_block())
};

__device__ __forceinline__ unsigned long long load_volatile(const unsigned long long* p) {
  return *static_cast<const volatile unsigned long long*>(p);
}
__device__ __forceinline__ void store_volatile(unsigned long long* p, unsigned long long v) {
  *static_cast<volatile unsigned long long*>(p) = v;
}

// The backoff between two polls of kScheduleReady. Each poll is a read
// across the bus (~1 us); a short sleep keeps the spinning warp from flooding
// it, capped so the release is seen at most ~1 us late.
__device__ __forceinline__ void poll_backoff(int polls) {
#if defined(MLACORE_GPU_CUDA)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  __nanosleep(polls < 32 ? 100 : 1000);
#else
  (void)polls;
#endif
#else
  // s_sleep takes a constant: about 64 * 2 clocks.
  (void)polls;
#if defined(__HIP_DEVICE_COMPILE__)
  __builtin_amdgcn_s_sleep(2);
#endif
#endif
}

// One block: gathers the three (possibly strided) vectors into the mapped
// staging buffer at their own widths and reduces the batch's totals (the
// validation included: their error bits), hands both to the host, and,
// released with the host's chunk, places the schedule into the metadata
// tensor (released with the abort value it leaves the metadata alone).
// Kernels after it on the stream read the metadata in stream order. The host
// waits on it, so it asks for little: 256 threads, 520 bytes of shared memory.
__global__ void __launch_bounds__(kScheduleThreads) plan_exchange(ExchangeArgs a) {
  __shared__ int64_t smem[kSharedBytes / sizeof(int64_t)];
  __shared__ long long chunk;
  const int64_t n = a.in.batch + 1;
  for (int64_t i = threadIdx.x; i < 3 * n; i += kScheduleThreads) {
    if (i < n)
      copy_index(a.in.qo_indptr, i, a.inputs);
    else if (i < 2 * n)
      copy_index(a.in.kv_indptr, i - n, a.inputs + a.off_kv);
    else if (i - 2 * n < a.in.batch)
      copy_index(a.in.kv_len, i - 2 * n, a.inputs + a.off_len);
  }
  if (!a.handshake) {
    // The host synchronizes the stream: kernel end publishes the stores.
    return;
  }
  // The totals come from the device's copy of the inputs (just loaded, so
  // cache hits): with them the host needs no pass over the staged inputs at
  // all when nothing splits, and one only then when it does.
  const BlockExec ex{reinterpret_cast<unsigned char*>(smem)};
  const bool starts_ok = schedule_starts_ok(a.in);
  const ScheduleTotals t = schedule_totals(ex, a.in, starts_ok);
  // The reduction's barriers order every thread's input stores before thread
  // 0's fence (fences are cumulative over what a barrier made visible to
  // thread 0); the system-scope fence orders them and the totals before the
  // flag store for any observer, the host included. Host side: the acquire
  // load of the flag.
  if (threadIdx.x == 0) {
    StagedTotals published{t, a.in.qo_indptr[a.in.batch]};
    if (!starts_ok) published.totals.error |= kPlanErrorIndptrStart;
    __builtin_memcpy(a.control + kTotals, &published, sizeof(published));
    __threadfence_system();
    store_volatile(a.control + kInputsReady, a.seq);
    unsigned long long v;
    for (int polls = 0;; ++polls) {
      v = load_volatile(a.control + kScheduleReady);
      // seq: the chunk is there. seq|abort: the host rejected the inputs.
      // A larger number: the host has moved on to a later build, which it
      // only does after releasing this one, so this one was aborted.
      if ((v & ~kAbortBit) >= a.seq) break;
      poll_backoff(polls);
    }
    // Acquire half of the handshake: the chunk read below is performed after
    // the flag read above, so it sees what the host wrote before its release.
    __threadfence_system();
    chunk = v == a.seq ? static_cast<long long>(load_volatile(a.control + kChunk)) : 0;
    if (chunk > 0) {
      // The chunk's value is in hand (stored above) before kDone tells the
      // host the release words are free again.
      __threadfence_system();
      store_volatile(a.control + kDone, a.seq);
    }
  }
  __syncthreads();
  if (chunk <= 0) return;  // aborted: the metadata keeps its contents
  place_schedule(ex, a.in, a.layout, starts_ok, t, chunk, a.meta);
}

__global__ void __launch_bounds__(kScheduleThreads)
    build_schedule_kernel(ScheduleInputs in, ScheduleLayout layout, int32_t* meta) {
  // int64 elements: the reductions store structs of int64 fields there.
  __shared__ int64_t smem[kSharedBytes / sizeof(int64_t)];
  build_schedule(BlockExec{reinterpret_cast<unsigned char*>(smem)}, in, layout, meta);
}

}  // namespace

uint64_t exchange_launch(Staging* s, const ScheduleInputs& in, size_t off_kv, size_t off_len,
                         const ScheduleLayout& layout, int32_t* meta, void* stream) {
  gpu::DeviceGuard guard(s->device);
  ExchangeArgs a;
  a.in = in;
  a.layout = layout;
  a.inputs = static_cast<char*>(s->mapped) + s->inputs_offset;
  a.off_kv = static_cast<int64_t>(off_kv);
  a.off_len = static_cast<int64_t>(off_len);
  a.meta = meta;
  a.control = reinterpret_cast<unsigned long long*>(static_cast<char*>(s->mapped) + s->control_offset);
  a.seq = s->seq + 1;
  a.handshake = true;
  plan_exchange<<<1, kScheduleThreads, 0, gpu::as_stream(stream)>>>(a);
  gpu::check_launch("plan: plan_exchange");
  // Only a launched kernel consumes its number; a failed launch leaves
  // nothing spinning and nothing to release.
  s->seq = a.seq;
  return a.seq;
}

void gather_launch(Staging* s, const ScheduleInputs& in, size_t off_kv, size_t off_len, void* stream) {
  gpu::DeviceGuard guard(s->device);
  ExchangeArgs a{};
  a.in = in;
  a.layout = ScheduleLayout{0, 0};
  a.inputs = static_cast<char*>(s->mapped) + s->inputs_offset;
  a.off_kv = static_cast<int64_t>(off_kv);
  a.off_len = static_cast<int64_t>(off_len);
  a.handshake = false;
  plan_exchange<<<1, kScheduleThreads, 0, gpu::as_stream(stream)>>>(a);
  gpu::check_launch("plan: plan_exchange (gather)");
}

bool launches_block() {
  static const bool blocking = [] {
    for (const char* name : {"CUDA_LAUNCH_BLOCKING", "HIP_LAUNCH_BLOCKING", "MLACORE_PLAN_SYNC"}) {
      const char* v = std::getenv(name);
      if (v != nullptr && v[0] != '\0' && v[0] != '0') return true;
    }
    return false;
  }();
  return blocking;
}

void sync_stream(Staging* s, void* stream) {
  gpu::DeviceGuard guard(s->device);
  gpu::check(gpuStreamSynchronize(gpu::as_stream(stream)), "plan: waiting for the inputs");
}

void exchange_wait_inputs(Staging* s, uint64_t seq, void* stream) {
  const uint64_t* flag = s->control() + kInputsReady;
  if (load_acquire(flag) == seq) return;
  const auto t0 = std::chrono::steady_clock::now();
  auto next_check = t0 + kHealthCheck;
  for (unsigned polls = 1;; ++polls) {
    cpu_relax();
    if (load_acquire(flag) == seq) return;
    if (polls % 16 != 0) continue;
    const auto now = std::chrono::steady_clock::now();
    if (now - t0 > kSpinOnly) std::this_thread::yield();
    if (now < next_check) continue;
    next_check = now + kHealthCheck;
    // Still waiting after a millisecond: a long queue ahead of the kernel, or
    // a context that died with it. A query tells them apart without waiting.
    gpu::DeviceGuard guard(s->device);
    const gpuError_t status = gpuStreamQuery(gpu::as_stream(stream));
    if (status == gpuErrorNotReady) {
      (void)gpuGetLastError();  // not an error; keep it out of the next launch check
      continue;
    }
    gpu::check(status, "plan: waiting for the exchange kernel");
    // The stream is idle, yet the kernel cannot finish before it is released.
    if (load_acquire(flag) == seq) return;
    runtime_error("plan: the exchange kernel finished without handing over the inputs");
  }
}

StagedTotals exchange_totals(Staging* s) {
  // Ordered after the flag by exchange_wait_inputs()'s acquire load.
  StagedTotals t;
  __builtin_memcpy(&t, s->control() + kTotals, sizeof(t));
  return t;
}

void exchange_publish(Staging* s, uint64_t seq, int64_t chunk_tiles) noexcept {
  const bool ok = chunk_tiles > 0;
  // Release: the chunk stored first becomes visible to the device before the
  // flag does. On x86 plain stores already are ordered (TSO); the builtins
  // keep the compiler from reordering them and emit stlr on Arm.
  if (ok) __atomic_store_n(s->control() + kChunk, static_cast<uint64_t>(chunk_tiles), __ATOMIC_RELAXED);
  __atomic_store_n(s->control() + kScheduleReady, ok ? seq : (seq | kAbortBit), __ATOMIC_RELEASE);
  if (ok)
    s->reader = seq;
  else
    s->aborted = true;
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
  build_schedule_kernel<<<1, kScheduleThreads, 0, gpu::as_stream(stream)>>>(in, layout, meta);
  gpu::check_launch("plan: build_schedule_kernel");
}

}  // namespace mlacore::plan_gpu
