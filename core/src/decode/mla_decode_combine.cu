// The LSE combine of split requests: 128 threads per query row, each owning
// 4 of the 512 columns (one float4 per partial), several partial loads in
// flight per thread, one to four rows a thread as the batch grows. Writes the
// output (and LSE) of every request that has partials, and the zeros and -inf
// LSE of requests with no KV; leaves requests the decode wrote directly alone.
// On sm_90+ it is a programmatic dependent of the decode kernel: its index
// loads overlap the decode's tail, griddepcontrol.wait orders its reads after
// the decode's writes. Partials outside the workspace are skipped, never read.
// Design: docs/design/2026-11-30-decode-mma-portable-combine.md.
#include "gpu/compat.h"

#include <cstdint>

#include "decode/decode_numeric.h"
#include "plan/schedule.h"
#include "decode/mla_decode.h"
#include "decode/mla_decode_device.cuh"
#include "decode/mla_decode_kernels.h"

namespace mlacore {
namespace {

constexpr int kThreads = 256;
constexpr int kCombineThreadsPerRow = kCkvDim / 4;
// (partial, row) loads in flight together per thread (a float4 and an LSE
// each), by rows a thread: one round of loads is one memory latency, so a row
// merged alone (few rows, each with many partials: one long request) takes
// 16 partials a round, several rows 8 between them.
template <int kRowsPerThread>
constexpr int combine_loads() {
  return kRowsPerThread == 1 ? 16 : 8;
}
// Launch the combine as a programmatic dependent of the decode kernel on
// sm_90+ (launch_mla_decode_combine); false falls back to a plain stream-ordered launch.
constexpr bool kCombinePdl = true;
constexpr int kCombineRows = kThreads / kCombineThreadsPerRow;  // rows of a block per row a thread

// Rows a combine thread merges, from the rows of the whole batch: one while
// the grid is small (b=8 x 128 heads: 512 blocks, each thread 8 partials of
// its row in flight), more as the row count, and with it the block count,
// grows (b=32 x 128 heads: 4 rows a thread, 512 blocks instead of 2048).
int combine_rows_per_thread(int64_t batch, int64_t rows_cap) {
  const int64_t rows = batch * rows_cap;
  return rows >= 4096 ? 4 : rows >= 2048 ? 2 : 1;
}

template <bool kBf16, int kRowsPerThread, class Idx>
__global__ void __launch_bounds__(kThreads) mla_decode_combine_kernel(const DecodeParams<Idx> p) {
  // Launched as a programmatic dependent of the decode kernel (sm_90+), this
  // block may start while the decode still runs: everything up to the wait
  // below reads only what was complete before the decode began (the plan's
  // schedule, the index tensors), so those dependent loads overlap the
  // decode's tail instead of following it.
  constexpr int R = kRowsPerThread;
  constexpr int kGroup = combine_loads<R>() / R;  // partials of each row per round
  static_assert(kGroup * R == combine_loads<R>(), "rows a thread divide the loads in flight");
  const int64_t b = blockIdx.x;
  const int32_t* md = p.schedule;
  int64_t batch = md[kHdrBatch];
  batch = batch < p.batch ? batch : p.batch;
  batch = batch < p.max_batch ? batch : p.max_batch;
  if (b >= batch) return;
  const int32_t* split = md + ScheduleLayout{p.max_batch, p.max_work}.split_indptr();
  const int64_t first = split[b], last = split[b + 1];
  const int64_t qo_begin = static_cast<int64_t>(p.qo_indptr[b * p.qo_indptr_stride]);
  const int64_t qo_end = static_cast<int64_t>(p.qo_indptr[(b + 1) * p.qo_indptr_stride]);
  const int64_t kv_len = static_cast<int64_t>(p.kv_len[b * p.kv_len_stride]);
  if (qo_begin < 0 || qo_end < qo_begin || qo_end > p.total_q) return;
  const int H = p.num_heads;
  const int64_t rows = (qo_end - qo_begin) * H;
  const int64_t rows_cap = decode_partial_rows(p.max_qo_len, H);
  const int col = threadIdx.x % kCombineThreadsPerRow;
  // Row r of this thread: the block's rows are R slabs of kCombineRows, so
  // each load instruction still covers whole 2 KB rows.
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * (kCombineRows * R) + threadIdx.x / kCombineThreadsPerRow;
  const bool merge = last > first;
  if (!merge && kv_len > 0) return;  // the decode wrote this request directly
  const int64_t row_end = merge && rows_cap < rows ? rows_cap : rows;
  if (row0 >= row_end) return;  // so is every later row of this thread
#if defined(MLACORE_GPU_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // The decode kernel's partials (and, for an empty request, its zeros) are
  // complete and visible after this.
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif

  // Partials outside the workspace (a schedule bug) are skipped, never read.
  // One pass, kGroup partials of each of the R rows (LSE and float4 each)
  // loaded together and merged into running maxima: one memory latency per
  // round, where a pass for the maximum and another for the sum would cost
  // one per partial plus one per four.
  const int64_t lo = first > 0 ? first : 0, hi = last < p.max_partials ? last : p.max_partials;
  float4 acc[R];
  float mx[R], wsum[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    acc[r] = make_float4(0.f, 0.f, 0.f, 0.f);
    mx[r] = -INFINITY;
    wsum[r] = 0.f;
  }
  if (merge) {
    for (int64_t i0 = lo; i0 < hi; i0 += kGroup) {
      float l[R][kGroup];
      float4 v[R][kGroup];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int64_t row = row0 + r * kCombineRows;
#pragma unroll
        for (int k = 0; k < kGroup; ++k) {
          const int64_t i = i0 + k;
          const bool in = i < hi && row < row_end;
          l[r][k] = in ? p.partial_lse[i * rows_cap + row] : -INFINITY;
          v[r][k] = in ? reinterpret_cast<const float4*>(p.partial_o + (i * rows_cap + row) * kCkvDim)[col]
                       : make_float4(0.f, 0.f, 0.f, 0.f);
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float gm = mx[r];
#pragma unroll
        for (int k = 0; k < kGroup; ++k) gm = fmaxf(gm, l[r][k]);
        if (gm == -INFINITY) continue;  // nothing but empty partials so far
        const float rescale = exp2f(mx[r] - gm);  // 0 while mx is still -inf
        acc[r].x *= rescale;
        acc[r].y *= rescale;
        acc[r].z *= rescale;
        acc[r].w *= rescale;
        wsum[r] *= rescale;
#pragma unroll
        for (int k = 0; k < kGroup; ++k) {
          const float w = exp2f(l[r][k] - gm);
          wsum[r] += w;
          acc[r].x += w * v[r][k].x;
          acc[r].y += w * v[r][k].y;
          acc[r].z += w * v[r][k].z;
          acc[r].w += w * v[r][k].w;
        }
        mx[r] = gm;
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t row = row0 + r * kCombineRows;
    if (row >= row_end) break;
    const float inv = wsum[r] > 0.f ? 1.f / wsum[r] : 0.f;
    const int64_t t = row / H, h = row % H;
    uint16_t* dst = static_cast<uint16_t*>(p.out) + (qo_begin + t) * p.out_stride_t + h * p.out_stride_h;
    const float o[4] = {acc[r].x * inv, acc[r].y * inv, acc[r].z * inv, acc[r].w * inv};
    uint16_t e16[4];
    for (int e = 0; e < 4; ++e) e16[e] = kBf16 ? float_to_bf16(o[e]) : float_to_f16(o[e]);
    uint2 packed;
    packed.x = static_cast<uint32_t>(e16[0]) | (static_cast<uint32_t>(e16[1]) << 16);
    packed.y = static_cast<uint32_t>(e16[2]) | (static_cast<uint32_t>(e16[3]) << 16);
    *reinterpret_cast<uint2*>(dst + 4 * col) = packed;
    if (p.lse && col == 0)
      p.lse[(qo_begin + t) * p.lse_stride_t + h * p.lse_stride_h] =
          wsum[r] > 0.f ? mx[r] + log2f(wsum[r]) : -INFINITY;
  }
}

}  // namespace

template <class Idx>
void launch_mla_decode_combine(const DecodeParams<Idx>& p, bool bf16, gpuStream_t stream) {
  const int64_t rows_cap = decode_partial_rows(p.max_qo_len, p.num_heads);
  const int64_t batch = p.batch < p.max_batch ? p.batch : p.max_batch;
  if (batch <= 0) return;
  const int per_thread = combine_rows_per_thread(batch, rows_cap);
  const int64_t block_rows = static_cast<int64_t>(kCombineRows) * per_thread;
  const dim3 grid(static_cast<unsigned>(batch), static_cast<unsigned>((rows_cap + block_rows - 1) / block_rows));
  using Kernel = void (*)(const DecodeParams<Idx>);
  const Kernel combine = bf16 ? (per_thread == 4   ? mla_decode_combine_kernel<true, 4, Idx>
                                 : per_thread == 2 ? mla_decode_combine_kernel<true, 2, Idx>
                                                   : mla_decode_combine_kernel<true, 1, Idx>)
                              : (per_thread == 4   ? mla_decode_combine_kernel<false, 4, Idx>
                                 : per_thread == 2 ? mla_decode_combine_kernel<false, 2, Idx>
                                                   : mla_decode_combine_kernel<false, 1, Idx>);
#if defined(MLACORE_GPU_CUDA)
  // Programmatic dependent launch: the combine's launch overlaps the decode
  // kernel's tail instead of following it. Only when the combine that will
  // run was compiled for sm_90+, so it carries the griddepcontrol.wait that
  // orders it after the decode. The image's binaryVersion is fixed for the
  // process: asked once per device (the combine kernels share one file and
  // its targets).
  const int binary = !kCombinePdl ? 0 : gpu::once_per_device(p.device, [combine] {
    cudaFuncAttributes attr{};
    gpu::check(cudaFuncGetAttributes(&attr, combine), "cudaFuncGetAttributes(mla_decode_combine_kernel)");
    return attr.binaryVersion;
  });
  if (binary >= 90) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = stream;
    cudaLaunchAttribute pdl[1];
    pdl[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    pdl[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = pdl;
    cfg.numAttrs = 1;
    gpu::check(cudaLaunchKernelEx(&cfg, combine, p), "mla_decode_combine_kernel");
    return;
  }
#endif
  combine<<<grid, kThreads, 0, stream>>>(p);
  gpu::check_launch("mla_decode_combine_kernel");
}

template void launch_mla_decode_combine<int32_t>(const DecodeParams<int32_t>&, bool, gpuStream_t);
template void launch_mla_decode_combine<int64_t>(const DecodeParams<int64_t>&, bool, gpuStream_t);

}  // namespace mlacore
