#include "common/tensor.h"

#include <algorithm>
#include <limits>

#include "common/checked.h"
#include "common/error.h"

namespace mlacore {

DType dtype_of(const DLDataType& t) noexcept {
  if (t.lanes != 1) return DType::Other;
  switch (t.code) {
    case kDLFloat:
      return t.bits == 16 ? DType::F16 : t.bits == 32 ? DType::F32 : t.bits == 64 ? DType::F64 : DType::Other;
    case kDLBfloat:
      return t.bits == 16 ? DType::BF16 : DType::Other;
    case kDLInt:
      return t.bits == 32 ? DType::I32 : t.bits == 64 ? DType::I64 : t.bits == 8 ? DType::I8 : DType::Other;
    case kDLUInt:
      return t.bits == 8 ? DType::U8 : DType::Other;
    default:
      return DType::Other;
  }
}

const char* dtype_name(DType d) noexcept {
  switch (d) {
    case DType::F16: return "float16";
    case DType::BF16: return "bfloat16";
    case DType::F32: return "float32";
    case DType::F64: return "float64";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
    case DType::U8: return "uint8";
    case DType::I8: return "int8";
    default: return "unsupported-dtype";
  }
}

int64_t itemsize(DType d) noexcept {
  switch (d) {
    case DType::F16: case DType::BF16: return 2;
    case DType::F32: case DType::I32: return 4;
    case DType::F64: case DType::I64: return 8;
    case DType::U8: case DType::I8: return 1;
    default: return 0;
  }
}

std::string shape_str(const DLTensor& t) {
  std::string s = "(";
  for (int i = 0; i < t.ndim; ++i) {
    s += std::to_string(t.shape[i]);
    if (i + 1 < t.ndim || t.ndim == 1) s += ",";
    if (i + 1 < t.ndim) s += " ";
  }
  return s + ")";
}

CheckedTensor::CheckedTensor(const DLTensor* tensor, const char* name) : t_(tensor), name_(name) {
  if (tensor == nullptr) type_error(name, ": expected a tensor, got NULL");
  if (tensor->ndim < 0 || tensor->ndim > 8 || (tensor->ndim > 0 && tensor->shape == nullptr))
    value_error(name, ": malformed DLTensor (ndim ", tensor->ndim, ")");
  for (int i = 0; i < tensor->ndim; ++i)
    if (tensor->shape[i] < 0) value_error(name, ": malformed DLTensor (negative size in dim ", i, ")");
  dtype_ = dtype_of(tensor->dtype);
  expect_addressable();
}

// Every size computation on this tensor afterwards (numel, numel * itemsize,
// index * stride * itemsize for an index within its dim) fits int64, so the
// ops index it without overflow checks of their own.
void CheckedTensor::expect_addressable() const {
  for (int i = 0; i < t_->ndim; ++i)
    if (t_->shape[i] == 0) return;  // nothing is addressed: any data pointer, strides and other sizes
  int64_t n = 1;
  for (int i = 0; i < t_->ndim; ++i)
    if (!mul_fits(n, t_->shape[i], &n))
      value_error(name_, ": expected at most 2^63-1 elements, got a tensor of shape ", shape_str(*t_));
  const int64_t es = std::max<int64_t>(1, (int64_t(t_->dtype.bits) * std::max<int>(t_->dtype.lanes, 1) + 7) / 8);
  int64_t span = 0;  // bytes from the lowest to the highest element address
  for (int i = 0; i < t_->ndim; ++i) {
    const int64_t st = stride(i);
    int64_t reach;
    if (st == std::numeric_limits<int64_t>::min() || !mul_fits(t_->shape[i] - 1, st < 0 ? -st : st, &reach) ||
        !mul_fits(reach, es, &reach) || !add_fits(span, reach, &span))
      value_error(name_, ": expected strides whose byte span fits int64, got shape ", shape_str(*t_), " with stride ",
                  st, " in dim ", i);
  }
  int64_t bytes;
  if (!mul_fits(n, es, &bytes))
    value_error(name_, ": expected a byte size that fits int64, got ", n, " elements of ", es, " bytes");
  if (t_->data == nullptr)
    value_error(name_, ": expected a data pointer for a non-empty tensor, got NULL (shape ", shape_str(*t_), ")");
}

void CheckedTensor::expect_element_aligned() const {
  const int64_t isz = itemsize(dtype_);
  if (numel() > 0 && isz > 1 && reinterpret_cast<uintptr_t>(data()) % uint64_t(isz) != 0)
    value_error(name_, ": expected a ", isz, "-byte aligned address for ", dtype_name(dtype_), " elements, got ",
                data());
}

int64_t CheckedTensor::stride(int dim) const noexcept {
  if (t_->strides != nullptr) return t_->strides[dim];
  // Fits int64 for any tensor with elements (the constructor checked the
  // element count); an empty one may have sizes whose product does not.
  int64_t s = 1;
  for (int i = t_->ndim - 1; i > dim; --i)
    if (!mul_fits(s, t_->shape[i], &s)) return std::numeric_limits<int64_t>::max();
  return s;
}

int64_t CheckedTensor::numel() const noexcept {
  for (int i = 0; i < t_->ndim; ++i)
    if (t_->shape[i] == 0) return 0;
  int64_t n = 1;  // fits: the constructor checked the product
  for (int i = 0; i < t_->ndim; ++i) n *= t_->shape[i];
  return n;
}

DeviceKind CheckedTensor::device() const noexcept {
  switch (t_->device.device_type) {
    case kDLCPU: case kDLCUDAHost: case kDLROCMHost: return DeviceKind::CPU;
    case kDLCUDA: case kDLCUDAManaged: return DeviceKind::CUDA;
    case kDLROCM: return DeviceKind::ROCM;
    default: return DeviceKind::Other;
  }
}

std::string CheckedTensor::device_str() const {
  switch (device()) {
    case DeviceKind::CPU: return "cpu";
    case DeviceKind::CUDA: return cat("cuda:", device_id());
    case DeviceKind::ROCM: return cat("rocm:", device_id());
    default: return cat("device type ", int(t_->device.device_type));
  }
}

std::string CheckedTensor::describe() const {
  return cat(dtype_name(dtype_), " tensor of shape ", shape_str(*t_), " on ", device_str());
}

void CheckedTensor::fail(const std::string& expected) const {
  value_error(name_, ": expected ", expected, ", got ", describe());
}

void CheckedTensor::expect_ndim(int n) const {
  if (ndim() != n) fail(cat(n, "-D tensor"));
}

void CheckedTensor::expect_dtype(std::initializer_list<DType> allowed) const {
  for (DType d : allowed)
    if (d == dtype_) return;
  std::string names;
  for (DType d : allowed) names += (names.empty() ? "" : " or ") + std::string(dtype_name(d));
  fail(names);
}

void CheckedTensor::expect_size(int dim, int64_t expected, const char* what) const {
  if (ndim() <= dim || size(dim) != expected)
    fail(cat("size ", expected, what ? cat(" (", what, ")") : std::string(), " in dim ", dim));
}

void CheckedTensor::expect_index_vector(int64_t length, const char* length_desc) const {
  const bool ok_kind = ndim() == 1 && (dtype_ == DType::I32 || dtype_ == DType::I64);
  const bool ok_len = length < 0 || (ndim() == 1 && size(0) == length);
  if (ok_kind && ok_len) {
    expect_element_aligned();
    return;
  }
  std::string expected = "1-D int32 or int64";
  if (length >= 0) {
    expected += " of length ";
    expected += length_desc ? cat(length_desc, "=", length) : std::to_string(length);
  }
  fail(expected);
}

void CheckedTensor::expect_same_device(const CheckedTensor& other) const {
  if (device() != other.device() || (!on_cpu() && device_id() != other.device_id()))
    value_error(name_, ": expected a tensor on ", other.device_str(), " (the device of ", other.name(),
                "), got one on ", device_str());
}

void CheckedTensor::expect_last_dim_contiguous() const {
  if (ndim() > 0 && size(ndim() - 1) > 1 && stride(ndim() - 1) != 1)
    fail(cat("a contiguous last dimension (stride 1), stride is ", stride(ndim() - 1)));
}

void CheckedTensor::expect_contiguous() const {
  int64_t expected = 1;
  for (int i = ndim() - 1; i >= 0; --i) {
    if (size(i) != 1 && stride(i) != expected) fail("a contiguous tensor");
    expected *= size(i);
  }
}

}  // namespace mlacore
