#include "bindings.h"
#include "tensor_args.h"

namespace mlacore::bind {

void bind_slot_mapping(nb::module_& m) {
  m.def(
      "slot_mapping",
      [](nb::handle batch_indices, nb::handle positions, nb::handle kv_indices, nb::handle kv_indptr,
         int64_t page_size, int64_t num_pages, nb::handle out, nb::handle stream) {
        BorrowedTensor bi, pos, indices, indptr, o;
        convert(batch_indices, "batch_indices", bi);
        convert(positions, "positions", pos);
        convert(kv_indices, "kv_indices", indices);
        convert(kv_indptr, "kv_indptr", indptr);
        convert(out, "out", o);
        void* s = stream_for(o, stream);
        check(without_gil([&] {
          return mlacore_slot_mapping(&bi.dl, &pos.dl, &indices.dl, &indptr.dl, page_size, num_pages, &o.dl, s);
        }));
      },
      nb::arg("batch_indices").none(), nb::arg("positions").none(), nb::arg("kv_indices").none(),
      nb::arg("kv_indptr").none(), nb::arg("page_size"), nb::arg("num_pages"), nb::arg("out").none(),
      nb::arg("stream").none() = nb::none());

  m.def(
      "page_indices_from_block_table",
      [](nb::handle block_table, nb::handle cu_num_blocks, nb::handle out, nb::handle stream) {
        BorrowedTensor table, cu, o;
        convert(block_table, "block_table", table);
        convert(cu_num_blocks, "cu_num_blocks", cu);
        convert(out, "out", o);
        void* s = stream_for(o, stream);
        check(without_gil([&] { return mlacore_page_indices_from_block_table(&table.dl, &cu.dl, &o.dl, s); }));
      },
      nb::arg("block_table").none(), nb::arg("cu_num_blocks").none(), nb::arg("out").none(),
      nb::arg("stream").none() = nb::none());

  m.def(
      "batch_indices_positions",
      [](nb::handle append_indptr, nb::handle seq_lens, nb::handle batch_indices, nb::handle positions,
         nb::handle stream) {
        BorrowedTensor indptr, lens, bi, pos;
        convert(append_indptr, "append_indptr", indptr);
        convert(seq_lens, "seq_lens", lens);
        convert(batch_indices, "batch_indices", bi);
        convert(positions, "positions", pos);
        void* s = stream_for(bi, stream);
        check(without_gil([&] { return mlacore_batch_indices_positions(&indptr.dl, &lens.dl, &bi.dl, &pos.dl, s); }));
      },
      nb::arg("append_indptr").none(), nb::arg("seq_lens").none(), nb::arg("batch_indices").none(),
      nb::arg("positions").none(), nb::arg("stream").none() = nb::none());
}

}  // namespace mlacore::bind
