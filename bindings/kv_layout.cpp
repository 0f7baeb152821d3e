#include <nanobind/stl/string.h>

#include <string>

#include "bindings.h"
#include "tensor_args.h"

namespace mlacore::bind {

void bind_kv_layout(nb::module_& m) {
  // None when not adjacent, else (shape, strides) in elements for as_strided;
  // the Python layer builds the view, since only it can make a torch view.
  m.def(
      "combined_kv_view",
      [](nb::handle ckv_cache, nb::handle kpe_cache) -> nb::object {
        BorrowedTensor ckv, kpe;
        convert(ckv_cache, "ckv_cache", ckv);
        convert(kpe_cache, "kpe_cache", kpe);
        int64_t shape[3], strides[3];
        int32_t adjacent = 0;
        check(mlacore_combined_kv_view(&ckv.dl, &kpe.dl, shape, strides, &adjacent));
        if (!adjacent) return nb::none();
        return nb::make_tuple(nb::make_tuple(shape[0], shape[1], shape[2]),
                              nb::make_tuple(strides[0], strides[1], strides[2]));
      },
      nb::arg("ckv_cache").none(), nb::arg("kpe_cache").none());

  m.def(
      "explain_kv_layout",
      [](nb::handle ckv_cache, nb::handle kpe_cache) {
        BorrowedTensor ckv, kpe;
        convert(ckv_cache, "ckv_cache", ckv);
        convert(kpe_cache, "kpe_cache", kpe);
        size_t length = 0;
        check(mlacore_explain_kv_layout(&ckv.dl, &kpe.dl, nullptr, 0, &length));
        std::string text(length + 1, '\0');
        check(mlacore_explain_kv_layout(&ckv.dl, &kpe.dl, &text[0], text.size(), &length));
        text.resize(length);
        return text;
      },
      nb::arg("ckv_cache").none(), nb::arg("kpe_cache").none());
}

}  // namespace mlacore::bind
