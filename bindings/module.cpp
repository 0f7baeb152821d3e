#include "bindings.h"

NB_MODULE(_mlacore, m) {
  m.doc() = "mlacore's C++ core. Use the torch-facing API in `mlacore`, not this module.";
  mlacore::bind::bind_runtime(m);
  mlacore::bind::bind_backend(m);
  mlacore::bind::bind_append(m);
  mlacore::bind::bind_plan(m);
  mlacore::bind::bind_kv_layout(m);
  mlacore::bind::bind_slot_mapping(m);
  mlacore::bind::bind_mla_decode(m);
  // one line per capability
}
