// Where an op runs, decided from the device of its anchor tensor. GPU
// launchers exist only in builds with a GPU backend; asking for one in a
// build without it is a clear error, not a link failure.
#pragma once

#include "common/error.h"
#include "common/tensor.h"

#if defined(MLACORE_WITH_CUDA) || defined(MLACORE_WITH_HIP)
#define MLACORE_WITH_GPU 1
#endif

namespace mlacore {

enum class Where { CPU, GPU };

inline Where where_to_run(const CheckedTensor& anchor) {
  switch (anchor.device()) {
    case DeviceKind::CPU:
      return Where::CPU;
    case DeviceKind::CUDA:
#if defined(MLACORE_WITH_CUDA)
      return Where::GPU;
#else
      runtime_error(anchor.name(), ": tensor on ", anchor.device_str(),
                    ", but this libmlacore was built without CUDA (rebuild with -Dgpu=cuda)");
#endif
    case DeviceKind::ROCM:
#if defined(MLACORE_WITH_HIP)
      return Where::GPU;
#else
      runtime_error(anchor.name(), ": tensor on ", anchor.device_str(),
                    ", but this libmlacore was built without HIP (rebuild with -Dgpu=hip)");
#endif
    default:
      value_error(anchor.name(), ": expected a CPU, CUDA or ROCm tensor, got one on ", anchor.device_str());
  }
}

}  // namespace mlacore
