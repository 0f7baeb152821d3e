#include <mlacore/mla_decode.h>

#include "backend.h"
#include "bindings.h"
#include "tensor_args.h"

namespace mlacore::bind {

void bind_mla_decode(nb::module_& m) {
  m.def("mla_decode_workspace_bytes",
        [](int64_t max_batch, int64_t max_work, int64_t max_qo_len, int64_t max_partials, int64_t heads) {
          return mlacore_mla_decode_workspace_bytes(
              mlacore_decode_dims{max_batch, max_work, max_qo_len, max_partials}, heads);
        });

  m.def("mla_decode_workspace_rows", &mlacore_mla_decode_workspace_rows, nb::arg("workspace_bytes"));
  m.def("mla_decode_workspace_partials", &mlacore_mla_decode_workspace_partials, nb::arg("workspace_bytes"),
        nb::arg("max_qo_len"), nb::arg("num_heads"));

  m.def(
      "mla_decode",
      [](nb::handle q_nope, nb::handle q_pe, nb::handle ckv, nb::handle kpe, nb::handle kv_indices,
         nb::handle kv_indptr, nb::handle qo_indptr, nb::handle kv_len, nb::handle schedule, nb::handle workspace,
         nb::handle out, nb::handle lse, int64_t max_batch, int64_t max_work, int64_t max_qo_len, int64_t max_partials,
         int64_t page_size,
         float sm_scale, bool causal, bool portable, const char* backend, nb::handle stream) {
        const int32_t b = parse_backend(backend);
        BorrowedTensor a[12];
        convert(q_nope, "q_nope", a[0]);
        convert(q_pe, "q_pe", a[1]);
        convert(ckv, "ckv_cache", a[2]);
        convert(kpe, "kpe_cache", a[3]);
        convert(kv_indices, "kv_indices", a[4]);
        convert(kv_indptr, "kv_indptr", a[5]);
        convert(qo_indptr, "qo_indptr", a[6]);
        convert(kv_len, "kv_len", a[7]);
        convert(schedule, "schedule", a[8]);
        convert(workspace, "workspace", a[9]);
        convert(out, "out", a[10]);
        convert_optional(lse, "lse", a[11]);
        const uint32_t flags = (causal ? MLACORE_DECODE_CAUSAL : 0u) | (portable ? MLACORE_DECODE_PORTABLE : 0u);
        void* s = stream_for(a[0], stream);
        check(without_gil([&] {
          return mlacore_mla_decode_backend(a[0].get(), a[1].get(), a[2].get(), a[3].get(), a[4].get(), a[5].get(),
                                            a[6].get(), a[7].get(), a[8].get(), a[9].get(), a[10].get(),
                                            a[11].get(), mlacore_decode_dims{max_batch, max_work, max_qo_len,
                                            max_partials}, page_size, sm_scale, flags, b, s);
        }));
      },
      nb::arg("q_nope").none(), nb::arg("q_pe").none(), nb::arg("ckv_cache").none(), nb::arg("kpe_cache").none(),
      nb::arg("kv_indices").none(), nb::arg("kv_indptr").none(), nb::arg("qo_indptr").none(),
      nb::arg("kv_len").none(), nb::arg("schedule").none(), nb::arg("workspace").none(), nb::arg("out").none(),
      nb::arg("lse").none(), nb::arg("max_batch"), nb::arg("max_work"), nb::arg("max_qo_len"),
      nb::arg("max_partials"), nb::arg("page_size"),
      nb::arg("sm_scale"), nb::arg("causal"), nb::arg("portable") = false, nb::arg("backend") = "auto",
      nb::arg("stream").none() = nb::none());
}

}  // namespace mlacore::bind
