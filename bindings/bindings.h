// One registration function per capability; module.cpp calls them all.
#pragma once

#include <nanobind/nanobind.h>

namespace mlacore::bind {

void bind_runtime(nanobind::module_& m);

}  // namespace mlacore::bind
