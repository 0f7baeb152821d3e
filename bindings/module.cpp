#include "bindings.h"

NB_MODULE(_mlacore, m) {
  m.doc() = "mlacore's C++ core. Use the torch-facing API in `mlacore`, not this module.";
  mlacore::bind::bind_runtime(m);
  // one line per capability
}
