// The one portability header for CUDA and HIP. Kernel sources (*.cu) are
// single-source: compiled by nvcc for CUDA and by hipcc (-x hip) for HIP; they
// use the gpu* names below and never the vendor prefix directly.
#pragma once

#if defined(__HIPCC__) || defined(MLACORE_WITH_HIP)
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#define MLACORE_GPU_HIP 1
using gpuStream_t = hipStream_t;
using gpuError_t = hipError_t;
#define gpuSuccess hipSuccess
#define gpuGetLastError hipGetLastError
#define gpuGetErrorString hipGetErrorString
#define gpuGetDevice hipGetDevice
#define gpuSetDevice hipSetDevice
#define gpuMemcpyAsync hipMemcpyAsync
#define gpuMemcpyDeviceToHost hipMemcpyDeviceToHost
#define gpuMemcpyHostToDevice hipMemcpyHostToDevice
#define gpuStreamSynchronize hipStreamSynchronize
#define gpuHostAlloc(p, n) hipHostMalloc((p), (n), hipHostMallocDefault)
// Pinned and mapped: kernels store into it through gpuHostGetDevicePointer.
#define gpuHostAllocMapped(p, n) hipHostMalloc((p), (n), hipHostMallocMapped)
#define gpuHostGetDevicePointer hipHostGetDevicePointer
#define gpuFreeHost hipHostFree
#define gpuDeviceGetAttribute hipDeviceGetAttribute
using gpuDeviceAttr = hipDeviceAttribute_t;
#define gpuDevAttrMultiProcessorCount hipDeviceAttributeMultiprocessorCount
#define gpuFuncSetAttribute(f, a, v) hipFuncSetAttribute(reinterpret_cast<const void*>(f), a, v)
#define gpuFuncAttributeMaxDynamicSharedMemorySize hipFuncAttributeMaxDynamicSharedMemorySize
#else
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#define MLACORE_GPU_CUDA 1
using gpuStream_t = cudaStream_t;
using gpuError_t = cudaError_t;
#define gpuSuccess cudaSuccess
#define gpuGetLastError cudaGetLastError
#define gpuGetErrorString cudaGetErrorString
#define gpuGetDevice cudaGetDevice
#define gpuSetDevice cudaSetDevice
#define gpuMemcpyAsync cudaMemcpyAsync
#define gpuMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define gpuMemcpyHostToDevice cudaMemcpyHostToDevice
#define gpuStreamSynchronize cudaStreamSynchronize
#define gpuHostAlloc(p, n) cudaHostAlloc((p), (n), cudaHostAllocDefault)
// Pinned and mapped: kernels store into it through gpuHostGetDevicePointer.
#define gpuHostAllocMapped(p, n) cudaHostAlloc((p), (n), cudaHostAllocMapped)
#define gpuHostGetDevicePointer cudaHostGetDevicePointer
#define gpuFreeHost cudaFreeHost
#define gpuDeviceGetAttribute cudaDeviceGetAttribute
using gpuDeviceAttr = cudaDeviceAttr;
#define gpuDevAttrMultiProcessorCount cudaDevAttrMultiProcessorCount
#define gpuFuncSetAttribute cudaFuncSetAttribute
#define gpuFuncAttributeMaxDynamicSharedMemorySize cudaFuncAttributeMaxDynamicSharedMemorySize
#endif

#include <atomic>
#include <cstdint>

#include "common/error.h"

namespace mlacore::gpu {

inline gpuStream_t as_stream(void* stream) { return static_cast<gpuStream_t>(stream); }

// Throws RuntimeError naming the operation when a runtime call failed.
inline void check(gpuError_t status, const char* what) {
  if (status != gpuSuccess) runtime_error(what, ": ", gpuGetErrorString(status));
}

// After a launch: configuration errors surface here, not at the next sync.
inline void check_launch(const char* kernel) {
  gpuError_t status = gpuGetLastError();
  if (status != gpuSuccess) runtime_error(kernel, ": launch failed: ", gpuGetErrorString(status));
}

// Makes `device` current for the scope, so tensors on a GPU other than the
// current one launch where their memory lives.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check(gpuGetDevice(&previous_), "gpuGetDevice");
    if (previous_ != device) check(gpuSetDevice(device), "gpuSetDevice");
    restore_ = previous_ != device;
  }
  ~DeviceGuard() {
    if (restore_) (void)gpuSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool restore_ = false;
};

// A non-negative property of `device` that never changes (a device
// attribute, a kernel's occupancy there), computed by `ask()` once per
// device: launch paths that run on every call need them. One cache per
// instantiation, so each call site passes its own lambda type. Devices past
// the first 64, and negative answers, are asked every time.
template <class Ask>
int once_per_device(int device, Ask ask) {
  constexpr int kCachedDevices = 64;
  static std::atomic<int> cache[kCachedDevices] = {};  // value + 1; 0: not asked yet
  const bool cached = device >= 0 && device < kCachedDevices;
  if (cached) {
    const int known = cache[device].load(std::memory_order_relaxed);
    if (known > 0) return known - 1;
  }
  const int value = ask();
  if (cached && value >= 0) cache[device].store(value + 1, std::memory_order_relaxed);
  return value;
}

// Attribute `A` of `device`, asked of the runtime once per device.
template <gpuDeviceAttr A>
int device_attribute(int device) {
  return once_per_device(device, [device] {
    int value = 0;
    check(gpuDeviceGetAttribute(&value, A, device), "gpuDeviceGetAttribute");
    return value;
  });
}

#if defined(MLACORE_GPU_CUDA)
// The binaryVersion of the image the runtime picked for `kernel` on the
// current device (90: sm_90 code), or -1 when there is none; that error is
// cleared here so the next launch check does not see it.
template <class Kernel>
int binary_version(Kernel kernel) {
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, kernel) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return attr.binaryVersion;
}
#endif

inline unsigned blocks_for(int64_t work, int threads, int64_t cap = 65535LL * 32) {
  int64_t b = (work + threads - 1) / threads;
  if (b < 1) b = 1;
  return static_cast<unsigned>(b < cap ? b : cap);
}

// Threads of a warp (a wavefront on AMD), and 64-bit shuffles across all of
// them: HIP's take no mask, CUDA's the full-warp one.
#if defined(MLACORE_GPU_HIP)
constexpr int kWarpThreads = 64;
#else
constexpr int kWarpThreads = 32;
#endif
// Orders the memory accesses of one warp's lanes (CUDA's __syncwarp). A HIP
// wavefront issues its lanes' accesses as one instruction stream, so there a
// scheduling barrier is all it takes. Declared for the host pass too, which
// parses kernel bodies under HIP.
__device__ __forceinline__ void warp_sync() {
#if defined(__HIP_DEVICE_COMPILE__)
  __builtin_amdgcn_wave_barrier();
#elif defined(__CUDA_ARCH__)
  __syncwarp();
#endif
}
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
__device__ __forceinline__ long long warp_shfl_xor(long long v, int mask) {
#if defined(MLACORE_GPU_HIP)
  return __shfl_xor(v, mask);
#else
  return __shfl_xor_sync(0xffffffffu, v, mask);
#endif
}
__device__ __forceinline__ long long warp_shfl_up(long long v, int delta) {
#if defined(MLACORE_GPU_HIP)
  return __shfl_up(v, delta);
#else
  return __shfl_up_sync(0xffffffffu, v, delta);
#endif
}
#endif

}  // namespace mlacore::gpu

// Loads and stores of 16 bytes: the vector width every copy kernel uses.
#define MLACORE_VEC_BYTES 16
