// The AITER decode route's two kernels around AITER's stage 1 (HIP builds
// only: the route exists for ROCm devices). Both run the per-element code of
// aiter_decode.h, as the CPU loops of the contract test do.
#include "gpu/compat.h"


#include "backends/aiter/aiter_decode.h"

namespace mlacore {
namespace {

constexpr int kPrepareThreads = 256;
// One block per (row, head): 128 threads x 4 output dims = 512.
constexpr int kCombineThreads = 128;

__global__ void aiter_prepare_kernel(AiterDecodePrepare p) {
  const int64_t n = p.elements();
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) p.run(i);
}

__global__ void aiter_combine_kernel(AiterDecodeCombine c) {
  const int64_t r = blockIdx.x;
  const int64_t h = blockIdx.y;
  const int64_t token = c.token_of(r);
  if (token < 0) return;
  // Every thread derives the (at most 16) weights itself: cheaper than a
  // shared-memory round trip for so few values.
  float w[kAiterMaxSplits];
  float lse2;
  const int64_t valid = c.weights(r, h, w, &lse2);
  constexpr int64_t per_thread = kAiterVDim / kCombineThreads;
  c.write(r, h, token, w, valid, threadIdx.x * per_thread, per_thread);
  if (threadIdx.x == 0 && c.lse) c.lse[token * c.lse_stride_t + h * c.lse_stride_h] = lse2;
}

}  // namespace

void launch_aiter_decode_prepare(const AiterDecodePrepare& p, int device, void* stream) {
  gpu::DeviceGuard guard(device);
  const unsigned blocks = gpu::blocks_for(p.elements(), kPrepareThreads);
  aiter_prepare_kernel<<<blocks, kPrepareThreads, 0, gpu::as_stream(stream)>>>(p);
  gpu::check_launch("aiter_prepare_kernel");
}

void launch_aiter_decode_combine(const AiterDecodeCombine& c, int device, void* stream) {
  const int64_t rows = c.batch * c.max_qo_len;
  if (rows == 0) return;
  // rows <= 2^31 * 2^16 is what the layout admits; grid.x holds 2^31 - 1 and
  // grid.y 65535, while rows stay far below both (batch <= int32, M <= 4).
  if (rows > 0x7fffffffLL || c.heads > 65535) runtime_error("aiter_combine_kernel: grid too large");
  gpu::DeviceGuard guard(device);
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(c.heads));
  aiter_combine_kernel<<<grid, kCombineThreads, 0, gpu::as_stream(stream)>>>(c);
  gpu::check_launch("aiter_combine_kernel");
}

int aiter_device_compute_units(int device) {
  // Cached per device (device_attribute): the split count is computed on every call.
  const int cu = gpu::device_attribute<gpuDevAttrMultiProcessorCount>(device);
  return cu > 1 ? cu : 1;
}

}  // namespace mlacore
