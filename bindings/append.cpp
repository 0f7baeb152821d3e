#include "backend.h"
#include "bindings.h"
#include "tensor_args.h"

namespace mlacore::bind {

void bind_append(nb::module_& m) {
  m.def(
      "append_paged_mla_kv_cache",
      [](nb::handle append_ckv, nb::handle append_kpe, nb::handle batch_indices, nb::handle positions,
         nb::handle ckv_cache, nb::handle kpe_cache, nb::handle kv_indices, nb::handle kv_indptr,
         nb::handle kv_last_page_len, const char* backend, bool strict, nb::handle stream) {
        BorrowedTensor ckv, kpe, bi, pos, cc, kc, idx, ptr, last;
        convert(append_ckv, "append_ckv", ckv);
        convert(append_kpe, "append_kpe", kpe);
        convert(batch_indices, "batch_indices", bi);
        convert(positions, "positions", pos);
        convert(ckv_cache, "ckv_cache", cc);
        convert(kpe_cache, "kpe_cache", kc);
        convert(kv_indices, "kv_indices", idx);
        convert(kv_indptr, "kv_indptr", ptr);
        convert(kv_last_page_len, "kv_last_page_len", last);
        const int32_t b = parse_backend(backend);
        void* s = stream_for(cc, stream);
        check(without_gil([&] {
          return mlacore_append_paged_mla_kv_cache(ckv.get(), kpe.get(), bi.get(), pos.get(), cc.get(), kc.get(),
                                                   idx.get(), ptr.get(), last.get(), b, strict ? 1 : 0, s);
        }));
      },
      nb::arg("append_ckv").none(), nb::arg("append_kpe").none(), nb::arg("batch_indices").none(),
      nb::arg("positions").none(), nb::arg("ckv_cache").none(), nb::arg("kpe_cache").none(),
      nb::arg("kv_indices").none(), nb::arg("kv_indptr").none(), nb::arg("kv_last_page_len").none(),
      nb::arg("backend") = "auto", nb::arg("strict") = false, nb::arg("stream").none() = nb::none());

  m.def(
      "append_paged_kv_cache",
      [](nb::handle append_key, nb::handle append_value, nb::handle batch_indices, nb::handle positions,
         nb::handle k_cache, nb::handle v_cache, nb::handle kv_indices, nb::handle kv_indptr,
         nb::handle kv_last_page_len, const char* kv_layout, const char* backend, bool strict, nb::handle stream) {
        BorrowedTensor key, value, bi, pos, kc, vc, idx, ptr, last;
        convert(append_key, "append_key", key);
        convert(append_value, "append_value", value);
        convert(batch_indices, "batch_indices", bi);
        convert(positions, "positions", pos);
        // v_cache None: k_cache is the 5-D [P, 2, ...] cache.
        convert(k_cache, v_cache.is_none() ? "paged_kv_cache" : "paged_kv_cache[0]", kc);
        convert_optional(v_cache, "paged_kv_cache[1]", vc);
        convert(kv_indices, "kv_indices", idx);
        convert(kv_indptr, "kv_indptr", ptr);
        convert(kv_last_page_len, "kv_last_page_len", last);
        const int32_t layout = parse_kv_layout(kv_layout);
        const int32_t b = parse_backend(backend);
        void* s = stream_for(kc, stream);
        check(without_gil([&] {
          return mlacore_append_paged_kv_cache(key.get(), value.get(), bi.get(), pos.get(), kc.get(), vc.get(),
                                               idx.get(), ptr.get(), last.get(), layout, b, strict ? 1 : 0, s);
        }));
      },
      nb::arg("append_key").none(), nb::arg("append_value").none(), nb::arg("batch_indices").none(),
      nb::arg("positions").none(), nb::arg("k_cache").none(), nb::arg("v_cache").none(),
      nb::arg("kv_indices").none(), nb::arg("kv_indptr").none(), nb::arg("kv_last_page_len").none(),
      nb::arg("kv_layout") = "NHD", nb::arg("backend") = "auto", nb::arg("strict") = false,
      nb::arg("stream").none() = nb::none());

  m.def(
      "concat_and_cache_mla",
      [](nb::handle kv_c, nb::handle k_pe, nb::handle kv_cache, nb::handle slot_mapping, bool strict,
         nb::handle stream) {
        BorrowedTensor c, pe, cache, slots;
        convert(kv_c, "kv_c", c);
        convert(k_pe, "k_pe", pe);
        convert(kv_cache, "kv_cache", cache);
        convert(slot_mapping, "slot_mapping", slots);
        void* s = stream_for(cache, stream);
        check(without_gil([&] {
          return mlacore_concat_and_cache_mla(c.get(), pe.get(), cache.get(), slots.get(), strict ? 1 : 0, s);
        }));
      },
      nb::arg("kv_c").none(), nb::arg("k_pe").none(), nb::arg("kv_cache").none(), nb::arg("slot_mapping").none(),
      nb::arg("strict") = false, nb::arg("stream").none() = nb::none());
}

}  // namespace mlacore::bind
