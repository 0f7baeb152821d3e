// The paged append's launcher (launch_gpu): the choice of kernel for a
// call, from its data, and the stream-ordered copies of strict mode. Every
// append whose rows move in 16-byte accesses runs the rows kernel (one lean
// launch for a decode step, the scatter ceiling's speed for the largest
// appends); narrower rows, and batch_indices and positions of two dtypes,
// run the classic kernel. MLACORE_APPEND_KERNEL overrides the choice
// (kernel_choice), e.g. for the sm_90 kernels.
// Contract: a validated Job (paged_append.cpp); no allocation, no
// synchronization on the append itself.
// Design: docs/design/2026-12-01-append-kernels.md.
#include <cstdlib>
#include <cstring>

#include "append/append_kernels.h"
#include "append/paged_append.h"

namespace mlacore::append {
namespace {

// The widest access (16, 8, 4 or 2 bytes) that divides every address,
// stride and segment length of both streams.
int access_width(const Job& job) {
  uint64_t bits = 0;
  for (const CopyStream& s : job.streams) {
    bits |= reinterpret_cast<uintptr_t>(s.src) | reinterpret_cast<uintptr_t>(s.dst);
    bits |= static_cast<uint64_t>(s.src_token) | static_cast<uint64_t>(s.src_seg);
    bits |= static_cast<uint64_t>(s.dst_page) | static_cast<uint64_t>(s.dst_token) | static_cast<uint64_t>(s.dst_seg);
    bits |= static_cast<uint64_t>(s.seg_bytes);
  }
  for (int w = 16; w >= 2; w /= 2)
    if ((bits & static_cast<uint64_t>(w - 1)) == 0) return w;
  runtime_error("append: rows are not aligned to 2 bytes; every supported dtype is");
}

KStream kstream(const CopyStream& s, int width) {
  const int64_t seg_vecs = s.seg_bytes / width;
  const int64_t vecs = seg_vecs * s.num_seg;
  if (vecs > (int64_t{1} << 30)) value_error("append: a token row of ", s.seg_bytes * s.num_seg, " bytes is too long");
  return {s.src, s.src_token, s.src_seg, s.dst, s.dst_page, s.dst_token, s.dst_seg,
          static_cast<uint32_t>(seg_vecs), static_cast<uint32_t>(vecs)};
}

// MLACORE_APPEND_KERNEL, read once: "classic" runs append_kernel for every
// page-table append (A/B runs, a fallback in the field), "fast" the sm_90
// kernels where they apply and never the rows kernel; unset, "rows" or
// anything else, the rows kernel wherever it applies. Slot-mapped appends
// always run the rows kernel.
enum class Choice { Rows, Classic, Fast };

Choice kernel_choice() {
  static const Choice choice = [] {
    const char* v = std::getenv("MLACORE_APPEND_KERNEL");
    if (v == nullptr) return Choice::Rows;
    if (std::strcmp(v, "classic") == 0) return Choice::Classic;
    if (std::strcmp(v, "fast") == 0) return Choice::Fast;
    return Choice::Rows;
  }();
  return choice;
}

}  // namespace

void launch_gpu(const Job& job, int device, void* stream) {
  const int width = access_width(job);
  KParams p{};
  p.a = kstream(job.streams[0], width);
  p.b = kstream(job.streams[1], width);
  p.batch = job.batch;
  p.pos = job.pos;
  p.nnz = job.nnz;
  p.vecs = p.a.vecs + p.b.vecs;
  if (p.vecs == 0 || p.nnz == 0) return;

  gpu::DeviceGuard guard(device);
  const Choice choice = kernel_choice();
  const gpuStream_t s = gpu::as_stream(stream);
  dim3 grid;
  if (job.by_slot) {
    if (!rows_shape(p, grid)) value_error("concat_and_cache_mla: ", p.nnz, " tokens are more than one launch moves");
    if (!is_flat(p)) runtime_error("concat_and_cache_mla: rows are not one run per source (a dispatch bug)");
    launch_rows_by_slot(job, p, width, grid, s);
    return;
  }
  // The rows kernel (append_rows_kernel) at every size: on an H200 it is one
  // lean launch for a decode step and at or above the scatter ceiling for the
  // largest appends, where the sm_90 kernels were 3-9% slower (MHA) or equal
  // (MLA): docs/design/2026-12-01-append-kernels.md. Rows narrower than
  // 16-byte accesses, and batch_indices and positions of two dtypes, keep the
  // classic kernel.
  const bool rows_fit = width == 16 && job.batch.is64 == job.pos.is64;
  if (rows_fit && choice == Choice::Rows && rows_shape(p, grid)) {
    launch_rows_by_table(job, p, grid, s);
    return;
  }
#if defined(MLACORE_GPU_CUDA)
  if (width == 16 && choice != Choice::Classic) {
    if (launch_sm90(job, p, device, s)) return;
  }
#endif
  launch_classic(job, p, width, device, s);
}

void copy_to_host(void* dst, const void* src, int64_t bytes, int device, void* stream) {
  gpu::DeviceGuard guard(device);
  gpu::check(gpuMemcpyAsync(dst, src, static_cast<size_t>(bytes), gpuMemcpyDeviceToHost, gpu::as_stream(stream)),
             "append (strict): copying indices to the host");
}

void wait_stream(int device, void* stream) {
  gpu::DeviceGuard guard(device);
  gpu::check(gpuStreamSynchronize(gpu::as_stream(stream)), "append (strict): synchronizing the stream");
}

}  // namespace mlacore::append
