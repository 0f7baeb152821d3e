// A CPU DLTensor over caller-owned memory for the C ABI tests; strides empty =
// compact.
#pragma once

#include <dlpack/dlpack.h>

#include <cstdint>
#include <utility>
#include <vector>

struct HostTensor {
  std::vector<int64_t> shape, strides;
  DLTensor dl{};
  HostTensor(void* data, DLDataType dtype, std::vector<int64_t> s, std::vector<int64_t> st = {})
      : shape(std::move(s)), strides(std::move(st)) {
    dl.data = data;
    dl.device = {kDLCPU, 0};
    dl.ndim = static_cast<int>(shape.size());
    dl.dtype = dtype;
    dl.shape = shape.data();
    dl.strides = strides.empty() ? nullptr : strides.data();
  }
  HostTensor(const HostTensor&) = delete;
  const DLTensor* p() const { return &dl; }
};
