// Paged append: validation, backend routing, strict-mode checks, the CPU path
// and the C entry points. The GPU kernels are launched by append_launch.cu, the AITER
// route in aiter_cache_write.cpp.
#include <mlacore/backend.h>
#include <mlacore/paged_append.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backends/aiter/aiter_cache_write.h"
#include "backends/aiter/aiter_loader.h"
#include "backends/backend_route.h"
#include "common/dispatch.h"
#include "common/error.h"
#include "layout/kv_layout.h"
#include "append/paged_append.h"
#include "common/tensor.h"

namespace mlacore::append {
namespace {

bool strict_from_env() {
  // Read on every call, not cached: a test or a debugging session may flip it
  // at run time, and getenv costs next to nothing beside a launch.
  const char* v = std::getenv("MLACORE_STRICT");
  return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
}

// Byte stride of `dim`; 0 when the dim has one element, so a stride that is
// never multiplied by a non-zero index cannot narrow the access width.
int64_t bstride(const CheckedTensor& a, int dim, int64_t es) { return a.size(dim) > 1 ? a.stride(dim) * es : 0; }

void expect_dtype_of(const CheckedTensor& a, const CheckedTensor& ref) {
  if (a.dtype() != ref.dtype())
    value_error(a.name(), ": expected ", dtype_name(ref.dtype()), " (the dtype of ", ref.name(), "), got ",
                a.describe());
}

void expect_cache_dtype(const CheckedTensor& a) { a.expect_dtype({DType::BF16, DType::F16, DType::F32}); }

IndexVec index_vec(const CheckedTensor& a) {
  // Strict mode copies the span [0, (n-1)*stride] to the host; a negative
  // stride would put it before the data pointer.
  if (a.size(0) > 1 && a.stride(0) < 0)
    value_error(a.name(), ": expected a non-negative stride, got ", a.stride(0));
  return {a.data(), a.stride(0), a.dtype() == DType::I64};
}

template <class Idx>
void fill_table(PageTable<Idx>& t, const IndexVec& indices, int64_t num_indices, const IndexVec& indptr,
                int64_t batch, int64_t page_size, int64_t num_pages) {
  t.indices = static_cast<const Idx*>(indices.data);
  t.indices_stride = indices.stride;
  t.num_indices = num_indices;
  t.indptr = static_cast<const Idx*>(indptr.data);
  t.indptr_stride = indptr.stride;
  t.batch = batch;
  t.page_size = page_size;
  t.num_pages = num_pages;
}

// Validates the index tensors against `nnz` and the cache (`anchor`), and
// fills the job's page table and per-token indices.
void set_indices(Job& job, const CheckedTensor& anchor, int64_t nnz, int64_t num_pages, int64_t page_size, const CheckedTensor& bi,
                 const CheckedTensor& pos, const CheckedTensor& idx, const CheckedTensor& ptr, const CheckedTensor& last) {
  bi.expect_index_vector(nnz, "nnz");
  pos.expect_index_vector(nnz, "nnz");
  // The batch is defined by kv_indptr (as in FlashInfer); kv_last_page_len
  // must match it.
  ptr.expect_index_vector();
  if (ptr.size(0) < 1) value_error(ptr.name(), ": expected at least 1 element (batch+1), got ", ptr.describe());
  const int64_t batch = ptr.size(0) - 1;
  last.expect_index_vector(batch, "len(kv_indptr)-1");
  idx.expect_index_vector();
  if (idx.dtype() != ptr.dtype())
    value_error(idx.name(), ": expected ", dtype_name(ptr.dtype()), " (the dtype of ", ptr.name(), "), got ",
                idx.describe());
  for (const CheckedTensor* a : {&bi, &pos, &idx, &ptr, &last}) a->expect_same_device(anchor);
  if (page_size < 1) value_error(anchor.name(), ": expected a page size of at least 1, got ", anchor.describe());

  job.batch = index_vec(bi);
  job.pos = index_vec(pos);
  const IndexVec indices = index_vec(idx);
  const IndexVec indptr = index_vec(ptr);
  job.nnz = nnz;
  job.table64 = indptr.is64;
  if (job.table64) fill_table(job.t64, indices, idx.size(0), indptr, batch, page_size, num_pages);
  else fill_table(job.t32, indices, idx.size(0), indptr, batch, page_size, num_pages);
}

// Heads that are contiguous on both sides become one segment: fewer, longer
// runs, and the kernel skips the per-vector segment arithmetic.
void merge_segments(CopyStream& s) {
  if (s.num_seg > 1 && s.src_seg == s.seg_bytes && s.dst_seg == s.seg_bytes) {
    s.seg_bytes *= s.num_seg;
    s.num_seg = 1;
    s.src_seg = s.dst_seg = 0;
  }
}

// ---- strict mode -------------------------------------------------------------

template <class Idx>
std::string why_skipped(const PageTable<Idx>& t, int64_t b, int64_t p) {
  if (b < 0 || b >= t.batch) return cat("its batch index is outside [0, ", t.batch, ")");
  const int64_t begin = static_cast<int64_t>(t.indptr[b * t.indptr_stride]);
  const int64_t end = static_cast<int64_t>(t.indptr[(b + 1) * t.indptr_stride]);
  if (!(begin >= 0 && begin <= end && end <= t.num_indices))
    return cat("kv_indptr[", b, "]=", begin, " and kv_indptr[", b + 1, "]=", end,
               " do not delimit a range of kv_indices (length ", t.num_indices, ")");
  if (p < 0) return "its position is negative";
  const int64_t k = p / t.page_size;
  if (k >= end - begin)
    return cat("its position falls in page ", k, " of the request, which has ", end - begin, " pages of ",
               t.page_size, " tokens");
  const int64_t j = begin + k;
  return cat("kv_indices[", j, "]=", static_cast<int64_t>(t.indices[j * t.indices_stride]),
             " is not a page of the cache (", t.num_pages, " pages)");
}

// Host pointers only. Names the first token the kernel would skip.
template <class Idx>
void check_tokens(const char* op, const IndexVec& bi, const IndexVec& pos, int64_t nnz, const PageTable<Idx>& t) {
  for (int64_t i = 0; i < nnz; ++i) {
    const int64_t b = bi.at(i);
    const int64_t p = pos.at(i);
    if (t.slot(b, p) >= 0) continue;
    value_error(op, " (strict): token ", i, " (batch index ", b, ", position ", p, ") cannot be written: ",
                why_skipped(t, b, p), "; nothing was written");
  }
}

// A negative slot is the engine's "skip this token" (padding), not an error;
// a slot past the cache is.
void check_slots(const char* op, const SlotMap& m, int64_t nnz) {
  for (int64_t i = 0; i < nnz; ++i) {
    const int64_t s = m.slots.at(i);
    if (s < m.capacity) continue;
    value_error(op, " (strict): token ", i, " (slot ", s, ") cannot be written: the cache holds ", m.capacity,
                " slots; nothing was written");
  }
}

void check_tokens(const char* op, const Job& job) {
  if (job.by_slot) return check_slots(op, job.slot_map, job.nnz);
  if (job.table64) check_tokens(op, job.batch, job.pos, job.nnz, job.t64);
  else check_tokens(op, job.batch, job.pos, job.nnz, job.t32);
}

#if defined(MLACORE_WITH_GPU)
// Host copy of the span a strided 1-D index tensor covers.
template <class T>
const T* fetch(std::vector<char>& keep, const T* src, int64_t n, int64_t stride, int device, void* stream) {
  if (n == 0) return nullptr;
  const int64_t bytes = ((n - 1) * stride + 1) * static_cast<int64_t>(sizeof(T));
  keep.resize(static_cast<size_t>(bytes));
  copy_to_host(keep.data(), src, bytes, device, stream);
  return reinterpret_cast<const T*>(keep.data());
}

IndexVec fetch(std::vector<char>& keep, const IndexVec& v, int64_t n, int device, void* stream) {
  IndexVec h = v;
  h.data = v.is64 ? static_cast<const void*>(fetch(keep, static_cast<const int64_t*>(v.data), n, v.stride, device, stream))
                  : static_cast<const void*>(fetch(keep, static_cast<const int32_t*>(v.data), n, v.stride, device, stream));
  return h;
}

template <class Idx>
PageTable<Idx> fetch(std::vector<char>& keep_indices, std::vector<char>& keep_indptr, const PageTable<Idx>& t,
                     int device, void* stream) {
  PageTable<Idx> h = t;
  h.indices = fetch(keep_indices, t.indices, t.num_indices, t.indices_stride, device, stream);
  h.indptr = fetch(keep_indptr, t.indptr, t.batch + 1, t.indptr_stride, device, stream);
  return h;
}

// Strict mode on a GPU: the one place this op synchronizes, by request.
void check_tokens_on_device(const char* op, const Job& job, int device, void* stream) {
  std::vector<char> b, p, i, ip;
  Job host = job;
  if (job.by_slot) {
    host.slot_map.slots = fetch(b, job.slot_map.slots, job.nnz, device, stream);
    wait_stream(device, stream);
    return check_tokens(op, host);
  }
  host.batch = fetch(b, job.batch, job.nnz, device, stream);
  host.pos = fetch(p, job.pos, job.nnz, device, stream);
  if (job.table64) host.t64 = fetch(i, ip, job.t64, device, stream);
  else host.t32 = fetch(i, ip, job.t32, device, stream);
  wait_stream(device, stream);
  check_tokens(op, host);
}
#endif

// ---- CPU path ----------------------------------------------------------------

// The slot of token i (page * page_size + offset), -1 when it writes nothing.
template <class Slot>
void run_cpu(const Job& job, int64_t page_size, Slot&& slot_of) {
  for (int64_t i = 0; i < job.nnz; ++i) {
    const int64_t slot = slot_of(i);
    if (slot < 0) continue;
    const int64_t page = slot / page_size;
    const int64_t off = slot - page * page_size;
    for (const CopyStream& s : job.streams) {
      const char* from = s.src + i * s.src_token;
      char* to = s.dst + page * s.dst_page + off * s.dst_token;
      for (int64_t seg = 0; seg < s.num_seg; ++seg)
        std::memcpy(to + seg * s.dst_seg, from + seg * s.src_seg, static_cast<size_t>(s.seg_bytes));
    }
  }
}

// ---- routing and execution ----------------------------------------------------

aiter_tensor_t aiter_tensor(const CheckedTensor& a) {
  aiter_tensor_t t;
  std::string why;
  if (!to_aiter_tensor(a.dl(), &t, &why)) runtime_error(a.name(), ": cannot be handed to AITER: ", why);
  return t;
}

AiterDtype aiter_cache_dtype(const CheckedTensor& cache) {
  AiterDtype dt{};
  if (!to_aiter_dtype(cache.dl().dtype, &dt)) runtime_error(cache.name(), ": no AITER dtype for ", cache.describe());
  return dt;
}

// `make_aiter` describes the call to AITER's cache writes; it runs only when
// the route picks AITER, so native calls build nothing for it.
// Strict mode (by request or MLACORE_STRICT): every token checked before
// anything is written; the one place an append synchronizes.
void check_strict(const char* op, const Job& job, const CheckedTensor& anchor, Where where, int32_t strict, void* stream) {
  if (strict == 0 && !strict_from_env()) return;
  if (where == Where::CPU) {
    check_tokens(op, job);
    return;
  }
#if defined(MLACORE_WITH_GPU)
  check_tokens_on_device(op, job, anchor.device_id(), stream);
#else
  (void)anchor;
  (void)stream;
#endif
}

// The native copy, on the CPU or the GPU; nothing synchronizes.
void run_native(const Job& job, const CheckedTensor& anchor, Where where, void* stream) {
  if (job.nnz == 0) return;
  if (where == Where::CPU) {
    if (job.by_slot) {
      run_cpu(job, job.slot_map.page_size, [&](int64_t i) { return job.slot_map.slot(i); });
    } else if (job.table64) {
      run_cpu(job, job.t64.page_size, [&](int64_t i) { return job.t64.slot(job.batch.at(i), job.pos.at(i)); });
    } else {
      run_cpu(job, job.t32.page_size, [&](int64_t i) { return job.t32.slot(job.batch.at(i), job.pos.at(i)); });
    }
    return;
  }
#if defined(MLACORE_WITH_GPU)
  launch_gpu(job, anchor.device_id(), stream);
#else
  (void)anchor;
  (void)stream;  // CPU-only build: where_to_run() has already refused GPU tensors
#endif
}

// `make_aiter` describes the call to AITER's cache writes; it runs only when
// the route picks AITER, so native calls build nothing for it.
template <class MakeAiter>
void execute(const char* op, const Job& job, const CheckedTensor& anchor, const mlacore_route_request& request,
             int32_t backend, int32_t strict, void* stream, MakeAiter&& make_aiter) {
  const bool aiter = route(request, parse_backend(backend), false).backend == Backend::Aiter;
  const Where where = where_to_run(anchor);
  check_strict(op, job, anchor, where, strict, stream);
  if (!aiter) return run_native(job, anchor, where, stream);
  if (job.nnz > 0) run_aiter_cache_write(op, make_aiter(), job, stream);
}

void append_mla(const DLTensor* append_ckv, const DLTensor* append_kpe, const DLTensor* batch_indices,
                const DLTensor* positions, const DLTensor* ckv_cache, const DLTensor* kpe_cache,
                const DLTensor* kv_indices, const DLTensor* kv_indptr, const DLTensor* kv_last_page_len,
                int32_t backend, int32_t strict, void* stream) {
  const CheckedTensor ckv(append_ckv, "append_ckv"), kpe(append_kpe, "append_kpe");
  const CheckedTensor bi(batch_indices, "batch_indices"), pos(positions, "positions");
  const CheckedTensor cc(ckv_cache, "ckv_cache"), kc(kpe_cache, "kpe_cache");
  const CheckedTensor idx(kv_indices, "kv_indices"), ptr(kv_indptr, "kv_indptr"), last(kv_last_page_len, "kv_last_page_len");

  cc.expect_ndim(3);
  expect_cache_dtype(cc);
  cc.expect_last_dim_contiguous();
  const int64_t pages = cc.size(0), page_size = cc.size(1), dc = cc.size(2);
  kc.expect_ndim(3);
  expect_dtype_of(kc, cc);
  kc.expect_same_device(cc);
  kc.expect_size(0, pages, "pages of ckv_cache");
  kc.expect_size(1, page_size, "page_size of ckv_cache");
  kc.expect_last_dim_contiguous();
  const int64_t dp = kc.size(2);

  ckv.expect_ndim(2);
  expect_dtype_of(ckv, cc);
  ckv.expect_same_device(cc);
  const int64_t nnz = ckv.size(0);
  ckv.expect_size(1, dc, "last dim of ckv_cache");
  ckv.expect_last_dim_contiguous();
  kpe.expect_ndim(2);
  expect_dtype_of(kpe, cc);
  kpe.expect_same_device(cc);
  kpe.expect_size(0, nnz, "rows of append_ckv");
  kpe.expect_size(1, dp, "last dim of kpe_cache");
  kpe.expect_last_dim_contiguous();

  Job job;
  set_indices(job, cc, nnz, pages, page_size, bi, pos, idx, ptr, last);
  const int64_t es = itemsize(cc.dtype());
  job.streams[0] = {ckv.ptr<char>(), bstride(ckv, 0, es), 0, cc.ptr<char>(), bstride(cc, 0, es),
                    bstride(cc, 1, es), 0, dc * es, 1};
  job.streams[1] = {kpe.ptr<char>(), bstride(kpe, 0, es), 0, kc.ptr<char>(), bstride(kc, 0, es),
                    bstride(kc, 1, es), 0, dp * es, 1};

  mlacore_route_request req = describe_call(MLACORE_ROUTE_APPEND_MLA, cc.dl(), MLACORE_LAYOUT_NHD, page_size, dc, dp);
  req.adjacent = kv_halves_adjacent(cc, kc);
  execute("append_paged_mla_kv_cache", job, cc, req, backend, strict, stream, [&] {
    // concat_and_cache_mla(kv_c, k_pe, kv_cache [P, S, 576], ...): the
    // combined view of the two halves (the adjacency gate passed), with the
    // parent's page and token strides, which the op honours.
    AiterCacheWrite w{};
    w.op = MLACORE_ROUTE_APPEND_MLA;
    w.src[0] = aiter_tensor(ckv);
    w.src[1] = aiter_tensor(kpe);
    w.cache[0] = aiter_view(cc.data(), aiter_cache_dtype(cc), cc.device_id(), {pages, page_size, dc + dp},
                            {cc.stride(0), page_size > 1 ? cc.stride(1) : dc + dp, 1});
    w.on_cpu = cc.on_cpu();
    w.device = cc.device_id();
    return w;
  });
}

// One paged K or V cache as the kernel addresses it.
struct KvView {
  char* base;
  int64_t page, token, head;  // byte strides
};

void append_kv(const DLTensor* append_key, const DLTensor* append_value, const DLTensor* batch_indices,
               const DLTensor* positions, const DLTensor* k_cache, const DLTensor* v_cache,
               const DLTensor* kv_indices, const DLTensor* kv_indptr, const DLTensor* kv_last_page_len,
               int32_t layout, int32_t backend, int32_t strict, void* stream) {
  if (layout != MLACORE_LAYOUT_NHD && layout != MLACORE_LAYOUT_HND)
    value_error("kv_layout: expected NHD (", int(MLACORE_LAYOUT_NHD), ") or HND (", int(MLACORE_LAYOUT_HND),
                "), got ", layout);
  const bool nhd = layout == MLACORE_LAYOUT_NHD;
  const bool fused = v_cache == nullptr;
  const CheckedTensor kc(k_cache, fused ? "paged_kv_cache" : "paged_kv_cache[0]");
  const CheckedTensor key(append_key, "append_key"), value(append_value, "append_value");
  const CheckedTensor bi(batch_indices, "batch_indices"), pos(positions, "positions");
  const CheckedTensor idx(kv_indices, "kv_indices"), ptr(kv_indptr, "kv_indptr"), last(kv_last_page_len, "kv_last_page_len");

  // Dims of the cache after the page dim (and, fused, the K/V dim).
  const int first = fused ? 2 : 1;
  const int tok_dim = nhd ? first : first + 1;
  const int head_dim = nhd ? first + 1 : first;
  kc.expect_ndim(fused ? 5 : 4);
  expect_cache_dtype(kc);
  kc.expect_last_dim_contiguous();
  if (fused) kc.expect_size(1, 2, "K and V");
  const int64_t es = itemsize(kc.dtype());
  const int64_t pages = kc.size(0), page_size = kc.size(tok_dim), heads = kc.size(head_dim);
  const int64_t dim = kc.size(first + 2);
  const KvView kview{kc.ptr<char>(), bstride(kc, 0, es), bstride(kc, tok_dim, es), bstride(kc, head_dim, es)};
  KvView vview = kview;
  // Element strides (page, token, head) of each cache, for AITER's views.
  int64_t k_strides[3] = {kc.stride(0), kc.stride(tok_dim), kc.stride(head_dim)};
  int64_t v_strides[3] = {k_strides[0], k_strides[1], k_strides[2]};
  bool dense = kc.stride(tok_dim) == heads * dim && kc.stride(head_dim) == dim;
  if (fused) {
    vview.base = kc.ptr<char>() + kc.stride(1) * es;
  } else {
    const CheckedTensor vc(v_cache, "paged_kv_cache[1]");
    vc.expect_ndim(4);
    expect_dtype_of(vc, kc);
    vc.expect_same_device(kc);
    for (int d = 0; d < 4; ++d) vc.expect_size(d, kc.size(d), "as paged_kv_cache[0]");
    vc.expect_last_dim_contiguous();
    vview = {vc.ptr<char>(), bstride(vc, 0, es), bstride(vc, tok_dim, es), bstride(vc, head_dim, es)};
    v_strides[0] = vc.stride(0);
    v_strides[1] = vc.stride(tok_dim);
    v_strides[2] = vc.stride(head_dim);
    // reshape_and_cache_flash reads one page stride (key_cache's) for both.
    dense = dense && vc.stride(tok_dim) == heads * dim && vc.stride(head_dim) == dim &&
            (pages == 1 || vc.stride(0) == kc.stride(0));
  }

  int64_t nnz = 0;
  for (const CheckedTensor* src : {&key, &value}) {
    src->expect_ndim(3);
    expect_dtype_of(*src, kc);
    src->expect_same_device(kc);
    if (src == &key) nnz = key.size(0);
    else src->expect_size(0, nnz, "rows of append_key");
    src->expect_size(1, heads, "heads of the cache");
    src->expect_size(2, dim, "head_dim of the cache");
    src->expect_last_dim_contiguous();
  }

  Job job;
  set_indices(job, kc, nnz, pages, page_size, bi, pos, idx, ptr, last);
  const KvView* views[2] = {&kview, &vview};
  const CheckedTensor* srcs[2] = {&key, &value};
  for (int s = 0; s < 2; ++s) {
    job.streams[s] = {srcs[s]->ptr<char>(), bstride(*srcs[s], 0, es), bstride(*srcs[s], 1, es), views[s]->base,
                      views[s]->page, views[s]->token, views[s]->head, dim * es, heads};
    merge_segments(job.streams[s]);
  }

  mlacore_route_request req = describe_call(MLACORE_ROUTE_APPEND_KV, kc.dl(), layout, page_size, dim, 0);
  req.adjacent = dense;
  req.sources_strided = heads > 1 && (key.stride(1) != dim || value.stride(1) != dim);
  execute("append_paged_kv_cache", job, kc, req, backend, strict, stream, [&] {
    // reshape_and_cache_flash(key, value, key_cache, value_cache [P, S, H, D], ...):
    // NHD views of the two caches (for a fused [P, 2, S, H, D] cache, its
    // K and V halves), with their real page strides.
    AiterCacheWrite w{};
    w.op = MLACORE_ROUTE_APPEND_KV;
    w.src[0] = aiter_tensor(key);
    w.src[1] = aiter_tensor(value);
    const AiterDtype dt = aiter_cache_dtype(kc);
    w.cache[0] = aiter_view(kview.base, dt, kc.device_id(), {pages, page_size, heads, dim},
                            {k_strides[0], k_strides[1], k_strides[2], 1});
    w.cache[1] = aiter_view(vview.base, dt, kc.device_id(), {pages, page_size, heads, dim},
                            {v_strides[0], v_strides[1], v_strides[2], 1});
    w.on_cpu = kc.on_cpu();
    w.device = kc.device_id();
    return w;
  });
}

// vLLM's concat_and_cache_mla: kv_c [T, Dc] and k_pe [T, Dp] side by side
// into kv_cache [num_blocks, block_size, Dc + Dp] at slot_mapping[i].
void concat_mla(const DLTensor* kv_c, const DLTensor* k_pe, const DLTensor* kv_cache, const DLTensor* slot_mapping,
                int32_t strict, void* stream) {
  const CheckedTensor c(kv_c, "kv_c"), pe(k_pe, "k_pe"), cache(kv_cache, "kv_cache"), slots(slot_mapping, "slot_mapping");
  cache.expect_ndim(3);
  expect_cache_dtype(cache);
  cache.expect_last_dim_contiguous();
  const int64_t blocks = cache.size(0), block_size = cache.size(1), width = cache.size(2);
  if (block_size < 1) value_error("kv_cache: expected a block size of at least 1, got ", cache.describe());
  c.expect_ndim(2);
  expect_dtype_of(c, cache);
  c.expect_same_device(cache);
  const int64_t tokens = c.size(0), dc = c.size(1);
  if (dc > width)
    value_error("kv_c: expected at most ", width, " columns (the last dim of kv_cache), got ", c.describe());
  c.expect_last_dim_contiguous();
  pe.expect_ndim(2);
  expect_dtype_of(pe, cache);
  pe.expect_same_device(cache);
  pe.expect_size(0, tokens, "rows of kv_c");
  pe.expect_size(1, width - dc, "last dim of kv_cache minus kv_c's");
  pe.expect_last_dim_contiguous();
  slots.expect_index_vector(tokens, "rows of kv_c");
  slots.expect_same_device(cache);

  Job job;
  job.nnz = tokens;
  job.by_slot = true;
  job.slot_map.slots = index_vec(slots);
  job.slot_map.page_size = block_size;
  if (__builtin_mul_overflow(blocks, block_size, &job.slot_map.capacity))
    value_error("kv_cache: ", cache.describe(), " holds more than 2^63 slots");
  const int64_t es = itemsize(cache.dtype());
  const int64_t page = bstride(cache, 0, es), token = bstride(cache, 1, es);
  job.streams[0] = {c.ptr<char>(), bstride(c, 0, es), 0, cache.ptr<char>(), page, token, 0, dc * es, 1};
  job.streams[1] = {pe.ptr<char>(), bstride(pe, 0, es), 0, cache.ptr<char>() + dc * es, page, token, 0,
                    (width - dc) * es, 1};
  const Where where = where_to_run(cache);
  check_strict("concat_and_cache_mla", job, cache, where, strict, stream);
  run_native(job, cache, where, stream);
}

}  // namespace
}  // namespace mlacore::append

extern "C" {

MLACORE_API mlacore_status mlacore_append_paged_mla_kv_cache(
    const DLTensor* append_ckv, const DLTensor* append_kpe, const DLTensor* batch_indices,
    const DLTensor* positions, const DLTensor* ckv_cache, const DLTensor* kpe_cache, const DLTensor* kv_indices,
    const DLTensor* kv_indptr, const DLTensor* kv_last_page_len, int32_t backend, int32_t strict, void* stream) {
  return mlacore::guarded([&] {
    mlacore::append::append_mla(append_ckv, append_kpe, batch_indices, positions, ckv_cache, kpe_cache, kv_indices,
                                kv_indptr, kv_last_page_len, backend, strict, stream);
  });
}

MLACORE_API mlacore_status mlacore_append_paged_kv_cache(
    const DLTensor* append_key, const DLTensor* append_value, const DLTensor* batch_indices,
    const DLTensor* positions, const DLTensor* k_cache, const DLTensor* v_cache, const DLTensor* kv_indices,
    const DLTensor* kv_indptr, const DLTensor* kv_last_page_len, int32_t layout, int32_t backend, int32_t strict,
    void* stream) {
  return mlacore::guarded([&] {
    mlacore::append::append_kv(append_key, append_value, batch_indices, positions, k_cache, v_cache, kv_indices,
                               kv_indptr, kv_last_page_len, layout, backend, strict, stream);
  });
}

MLACORE_API mlacore_status mlacore_concat_and_cache_mla(const DLTensor* kv_c, const DLTensor* k_pe,
                                                       const DLTensor* kv_cache, const DLTensor* slot_mapping,
                                                       int32_t strict, void* stream) {
  return mlacore::guarded([&] { mlacore::append::concat_mla(kv_c, k_pe, kv_cache, slot_mapping, strict, stream); });
}

}  // extern "C"
