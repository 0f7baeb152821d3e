// Plan metadata on the GPU: the mapped pinned staging buffer and its event,
// the pack kernel that writes the three inputs straight into host memory (the
// single D2H transfer), and the device-only schedule kernel (build_schedule()
// run by one block).
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
#else
using gpuEvent_t = cudaEvent_t;
#define gpuEventCreateWithFlags cudaEventCreateWithFlags
#define gpuEventDisableTiming cudaEventDisableTiming
#define gpuEventDestroy cudaEventDestroy
#define gpuEventRecord cudaEventRecord
#define gpuEventQuery cudaEventQuery
#define gpuEventSynchronize cudaEventSynchronize
#define gpuErrorNotReady cudaErrorNotReady
#endif

namespace mlacore::plan_gpu {

struct Staging {
  int device = 0;
  void* host = nullptr;
  void* mapped = nullptr;  // the same memory as the GPU addresses it
  size_t bytes = 0;
  gpuEvent_t uploaded{};  // recorded after each upload that reads `host`
  bool pending = false;
};

Staging* staging_create(int device, size_t bytes) {
  gpu::DeviceGuard guard(device);
  auto* s = new Staging;
  s->device = device;
  s->bytes = bytes;
  // Mapped, so the pack kernel stores the inputs into it directly: one launch
  // where a gather into device scratch and a D2H memcpy took two stream
  // operations, each with its own host call and device-side latency.
  gpuError_t err = gpuHostAllocMapped(&s->host, bytes);
  if (err != gpuSuccess) {
    delete s;
    gpu::check(err, "plan: pinned staging allocation");
  }
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
  (void)gpuEventDestroy(s->uploaded);
  (void)gpuFreeHost(s->host);
  delete s;
}

void* staging_host(Staging* s) { return s->host; }
int staging_device(const Staging* s) { return s->device; }

void staging_wait(Staging* s) {
  if (!s->pending) return;
  // Usually done already (a device-input build has just synchronized the
  // stream); the query costs less than a wait that returns at once.
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

// Gathers the three (possibly strided) vectors into one contiguous block of
// mapped host memory, at their own widths. The stores cross the bus as posted
// writes; the stream synchronization that follows makes them visible to the
// host, so no fence is needed here.
__global__ void pack_inputs(ScheduleInputs in, char* dst, int64_t off_kv, int64_t off_len) {
  const int64_t n = in.batch + 1;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < 3 * n; i += int64_t{gridDim.x} * blockDim.x) {
    if (i < n)
      copy_index(in.qo_indptr, i, dst);
    else if (i < 2 * n)
      copy_index(in.kv_indptr, i - n, dst + off_kv);
    else if (i - 2 * n < in.batch)
      copy_index(in.kv_len, i - 2 * n, dst + off_len);
  }
}

constexpr int kScheduleThreads = 256;
constexpr int kSharedBytes = kScheduleThreads * 64;
static_assert(sizeof(ScheduleTotals) <= 64 && sizeof(CandidateCtas) <= 64 && alignof(ScheduleTotals) <= 8 &&
                  alignof(CandidateCtas) <= 8,
              "reduction slots are 64 bytes per thread, int64-aligned");

#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define MLACORE_DEVICE_PASS 1
#endif

// build_schedule()'s executor on one block: shared-memory tree reductions and
// a Hillis-Steele scan. Its members are host+device only to match the
// template's signature; they run on the device alone.
struct BlockExec {
  unsigned char* smem;

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
  template <class T>
  MLACORE_HD T reduce(const T& v) const {
#ifdef MLACORE_DEVICE_PASS
    T* buf = reinterpret_cast<T*>(smem);
    const int t = threadIdx.x;
    buf[t] = v;
    __syncthreads();
    for (int s = kScheduleThreads / 2; s > 0; s >>= 1) {
      if (t < s) buf[t].merge(buf[t + s]);
      __syncthreads();
    }
    const T r = buf[0];
    __syncthreads();
    return r;
#else
    return v;
#endif
  }
  MLACORE_HD int64_t exclusive_scan(int64_t v, int64_t& total) const {
#ifdef MLACORE_DEVICE_PASS
    int64_t* buf = reinterpret_cast<int64_t*>(smem);
    const int t = threadIdx.x;
    buf[t] = v;
    __syncthreads();
    for (int off = 1; off < kScheduleThreads; off <<= 1) {
      const int64_t add = t >= off ? buf[t - off] : 0;
      __syncthreads();
      buf[t] += add;
      __syncthreads();
    }
    const int64_t inclusive = buf[t];
    total = buf[kScheduleThreads - 1];
    __syncthreads();
    return inclusive - v;
#else
    total = v;
    return 0;
#endif
  }
};

__global__ void __launch_bounds__(kScheduleThreads)
    build_schedule_kernel(ScheduleInputs in, ScheduleLayout layout, int32_t* meta) {
  // int64 elements: the reductions store structs of int64 fields there.
  __shared__ int64_t smem[kSharedBytes / sizeof(int64_t)];
  build_schedule(BlockExec{reinterpret_cast<unsigned char*>(smem)}, in, layout, meta);
}

}  // namespace

void fetch_inputs(Staging* s, const ScheduleInputs& in, size_t host_offset, size_t off_kv, size_t off_len,
                  void* stream) {
  gpu::DeviceGuard guard(s->device);
  const gpuStream_t st = gpu::as_stream(stream);
  const int64_t n = 3 * (in.batch + 1);
  pack_inputs<<<gpu::blocks_for(n, 256, 64), 256, 0, st>>>(in, static_cast<char*>(s->mapped) + host_offset,
                                                          static_cast<int64_t>(off_kv),
                                                          static_cast<int64_t>(off_len));
  gpu::check_launch("plan: pack_inputs");
  gpu::check(gpuStreamSynchronize(st), "plan: waiting for the inputs");
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
