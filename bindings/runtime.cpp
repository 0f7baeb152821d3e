#include <nanobind/stl/string.h>

#include <vector>

#include "bindings.h"
#include "tensor_args.h"

namespace mlacore::bind {

void bind_runtime(nb::module_& m) {
  m.def("version", [] { return std::string(mlacore_version()); });
  m.def("built_with", [](const char* feature) { return mlacore_built_with(feature) != 0; });
  m.def("library_path", [] { return std::string(mlacore_library_path()); });

  // Nine tensors through the same conversion every op uses: the overhead
  // benchmark's subject (bench --mode overhead).
  m.def(
      "noop",
      [](nb::handle t0, nb::handle t1, nb::handle t2, nb::handle t3, nb::handle t4, nb::handle t5,
         nb::handle t6, nb::handle t7, nb::handle t8, nb::handle stream) {
        BorrowedTensor a[9];
        const nb::handle objs[9] = {t0, t1, t2, t3, t4, t5, t6, t7, t8};
        const DLTensor* dls[9];
        for (int i = 0; i < 9; ++i) {
          convert(objs[i], "tensors[i]", a[i]);
          dls[i] = &a[i].dl;
        }
        check(mlacore_noop(dls, 9, stream_for(a[0], stream)));
      },
      // .none() on tensor arguments: None reaches convert(), whose error names the argument.
      nb::arg("t0").none(), nb::arg("t1").none(), nb::arg("t2").none(), nb::arg("t3").none(),
      nb::arg("t4").none(), nb::arg("t5").none(), nb::arg("t6").none(), nb::arg("t7").none(),
      nb::arg("t8").none(), nb::arg("stream").none() = nb::none());
}

}  // namespace mlacore::bind
