// Slot mapping, block-table flattening and batch indices/positions: argument
// validation, CPU loops and the C entry points. The per-element work lives in
// slot_mapping.h so the GPU kernels run exactly the same code.
#include <mlacore/slot_mapping.h>

#include <cstdint>
#include <limits>

#include "common/checked.h"
#include "common/dispatch.h"
#include "common/error.h"
#include "slots/slot_mapping.h"
#include "common/tensor.h"

namespace mlacore {
namespace {

// Calls body(int32_t{}) or body(int64_t{}) for an index dtype already validated.
template <class Body>
void with_index_type(DType d, Body&& body) {
  if (d == DType::I32) body(int32_t{});
  else body(int64_t{});
}

void expect_same_dtype(const CheckedTensor& a, const CheckedTensor& other) {
  if (a.dtype() != other.dtype())
    value_error(a.name(), ": expected ", dtype_name(other.dtype()), " (the dtype of ", other.name(),
                "), got ", a.describe());
}

// The per-token ops: args.run(t) for every token, as a CPU loop or through
// `launch`, the op's GPU launcher (its kernel runs the same element code).
template <class Args, class Launch>
void for_each_token(const Args& args, Where where, int device, void* stream, Launch&& launch) {
  if (args.nnz == 0) return;
  if (where == Where::CPU) {
    for (int64_t t = 0; t < args.nnz; ++t) args.run(t);
    return;
  }
#if defined(MLACORE_WITH_GPU)
  launch(args, device, stream);
#else
  (void)launch, (void)device, (void)stream;  // where_to_run() has refused GPU tensors
#endif
}

template <class T>
T* mutable_ptr(const CheckedTensor& a) {
  return static_cast<T*>(a.data());
}

}  // namespace
}  // namespace mlacore

extern "C" {

MLACORE_API mlacore_status mlacore_slot_mapping(const DLTensor* batch_indices, const DLTensor* positions,
                                                const DLTensor* kv_indices, const DLTensor* kv_indptr,
                                                int64_t page_size, int64_t num_pages, const DLTensor* out,
                                                void* stream) {
  using namespace mlacore;
  return guarded([&] {
    const CheckedTensor bi(batch_indices, "batch_indices"), pos(positions, "positions");
    const CheckedTensor indices(kv_indices, "kv_indices"), indptr(kv_indptr, "kv_indptr"), o(out, "out");
    bi.expect_index_vector();
    pos.expect_index_vector(bi.size(0), "len(batch_indices)");
    expect_same_dtype(pos, bi);
    indices.expect_index_vector();
    indptr.expect_index_vector();
    expect_same_dtype(indptr, indices);
    if (indptr.size(0) < 1) value_error("kv_indptr: expected 1-D of length batch+1 >= 1, got ", indptr.describe());
    o.expect_ndim(1);
    o.expect_dtype({DType::I64});
    o.expect_size(0, bi.size(0), "len(batch_indices)");
    o.expect_element_aligned();
    for (const CheckedTensor* a : {&pos, &indices, &indptr, &o}) a->expect_same_device(bi);
    if (page_size < 1) value_error("page_size: expected >= 1, got ", page_size);
    // Pages at or above this bound have slots that do not fit in int64, so
    // they count as out of range even when num_pages is not given.
    const int64_t page_limit = std::numeric_limits<int64_t>::max() / page_size;
    if (num_pages > page_limit)
      value_error("num_pages: expected num_pages * page_size to fit in int64, got num_pages=", num_pages,
                  " with page_size=", page_size);

    const Where where = where_to_run(bi);
    with_index_type(bi.dtype(), [&](auto tok_tag) {
      using Tok = decltype(tok_tag);
      with_index_type(indices.dtype(), [&](auto idx_tag) {
        using Idx = decltype(idx_tag);
        SlotMappingArgs<Tok, Idx> args;
        args.batch_indices = bi.ptr<const Tok>();
        args.batch_indices_stride = bi.stride(0);
        args.positions = pos.ptr<const Tok>();
        args.positions_stride = pos.stride(0);
        args.out = mutable_ptr<int64_t>(o);
        args.out_stride = o.stride(0);
        args.nnz = bi.size(0);
        args.table.indices = indices.ptr<const Idx>();
        args.table.indices_stride = indices.stride(0);
        args.table.num_indices = indices.size(0);
        args.table.indptr = indptr.ptr<const Idx>();
        args.table.indptr_stride = indptr.stride(0);
        args.table.batch = indptr.size(0) - 1;
        args.table.page_size = page_size;
        args.table.num_pages = num_pages >= 0 ? num_pages : page_limit;
        for_each_token(args, where, bi.device_id(), stream,
                       [](const auto& a, int device, void* st) { launch_slot_mapping(a, device, st); });
      });
    });
  });
}

MLACORE_API mlacore_status mlacore_page_indices_from_block_table(const DLTensor* block_table,
                                                                 const DLTensor* cu_num_blocks,
                                                                 const DLTensor* out, void* stream) {
  using namespace mlacore;
  return guarded([&] {
    const CheckedTensor table(block_table, "block_table"), cu(cu_num_blocks, "cu_num_blocks"), o(out, "out");
    table.expect_ndim(2);
    table.expect_dtype({DType::I32, DType::I64});
    table.expect_element_aligned();
    cu.expect_index_vector(checked_add(table.size(0), 1, table.name()), "batch+1");
    o.expect_ndim(1);
    expect_same_dtype(o, table);
    o.expect_element_aligned();
    cu.expect_same_device(table);
    o.expect_same_device(table);

    const Where where = where_to_run(table);
    with_index_type(table.dtype(), [&](auto t_tag) {
      using T = decltype(t_tag);
      with_index_type(cu.dtype(), [&](auto cu_tag) {
        using Cu = decltype(cu_tag);
        BlockTableArgs<T, Cu> args;
        args.table = table.ptr<const T>();
        args.rows = table.size(0);
        args.cols = table.size(1);
        args.row_stride = table.stride(0);
        args.col_stride = table.stride(1);
        args.cu = cu.ptr<const Cu>();
        args.cu_stride = cu.stride(0);
        args.out = mutable_ptr<T>(o);
        args.out_len = o.size(0);
        args.out_stride = o.stride(0);
        if (args.rows == 0 || args.cols == 0 || args.out_len == 0) return;
        if (where == Where::CPU) {
          for (int64_t r = 0; r < args.rows; ++r) {
            int64_t dst = 0, count = 0;
            if (!args.row_range(r, dst, count)) continue;
            for (int64_t j = 0; j < count; ++j) args.copy(r, dst, j);
          }
          return;
        }
#if defined(MLACORE_WITH_GPU)
        launch_block_table(args, table.device_id(), stream);
#endif
      });
    });
    (void)stream;
  });
}

MLACORE_API mlacore_status mlacore_batch_indices_positions(const DLTensor* append_indptr, const DLTensor* seq_lens,
                                                           const DLTensor* batch_indices,
                                                           const DLTensor* positions, void* stream) {
  using namespace mlacore;
  return guarded([&] {
    const CheckedTensor indptr(append_indptr, "append_indptr"), lens(seq_lens, "seq_lens");
    const CheckedTensor bi(batch_indices, "batch_indices"), pos(positions, "positions");
    indptr.expect_index_vector();
    if (indptr.size(0) < 1)
      value_error("append_indptr: expected 1-D of length batch+1 >= 1, got ", indptr.describe());
    const int64_t batch = indptr.size(0) - 1;
    lens.expect_index_vector(batch, "len(append_indptr)-1");
    expect_same_dtype(lens, indptr);
    bi.expect_index_vector();
    pos.expect_index_vector(bi.size(0), "len(batch_indices)");
    expect_same_dtype(pos, bi);
    for (const CheckedTensor* a : {&lens, &bi, &pos}) a->expect_same_device(indptr);
    if (bi.dtype() == DType::I32 && batch > std::numeric_limits<int32_t>::max())
      value_error("batch_indices: int32 cannot hold request indices of a batch of ", batch, "; use int64");

    const Where where = where_to_run(indptr);
    with_index_type(indptr.dtype(), [&](auto idx_tag) {
      using Idx = decltype(idx_tag);
      with_index_type(bi.dtype(), [&](auto out_tag) {
        using Out = decltype(out_tag);
        BatchPositionsArgs<Idx, Out> args;
        args.indptr = indptr.ptr<const Idx>();
        args.indptr_stride = indptr.stride(0);
        args.seq_lens = lens.ptr<const Idx>();
        args.seq_lens_stride = lens.stride(0);
        args.batch = batch;
        args.batch_indices = mutable_ptr<Out>(bi);
        args.batch_indices_stride = bi.stride(0);
        args.positions = mutable_ptr<Out>(pos);
        args.positions_stride = pos.stride(0);
        args.nnz = bi.size(0);
        args.out_max = static_cast<int64_t>(std::numeric_limits<Out>::max());
        for_each_token(args, where, indptr.device_id(), stream,
                       [](const auto& a, int device, void* st) { launch_batch_positions(a, device, st); });
      });
    });
  });
}

}  // extern "C"
