// One registration function per capability; module.cpp calls them all.
#pragma once

#include <nanobind/nanobind.h>

namespace mlacore::bind {

void bind_runtime(nanobind::module_& m);
void bind_backend(nanobind::module_& m);
void bind_append(nanobind::module_& m);
void bind_plan(nanobind::module_& m);
void bind_kv_layout(nanobind::module_& m);
void bind_slot_mapping(nanobind::module_& m);
void bind_mla_decode(nanobind::module_& m);

}  // namespace mlacore::bind
