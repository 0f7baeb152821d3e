// Python strings for backend requests and KV layouts, as the C ABI's enums;
// ValueError naming the argument for anything else.
#pragma once

#include <cstdint>

namespace mlacore::bind {

int32_t parse_backend(const char* backend);
int32_t parse_kv_layout(const char* layout);

}  // namespace mlacore::bind
