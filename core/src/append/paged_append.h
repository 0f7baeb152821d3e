// What the host side of the paged append (paged_append.cpp) hands its GPU
// launcher (append_launch.cu): a validated Job (append_job.h).
#pragma once

#include "append/append_job.h"

namespace mlacore::append {

#if defined(MLACORE_WITH_CUDA) || defined(MLACORE_WITH_HIP)
// Launches the copy on `stream` (the device's current one when NULL); no sync.
void launch_gpu(const Job& job, int device, void* stream);
// Stream-ordered device-to-host copies and the wait for them (strict mode only).
void copy_to_host(void* dst, const void* src, int64_t bytes, int device, void* stream);
void wait_stream(int device, void* stream);
#endif

}  // namespace mlacore::append
