// Checked access to the DLTensors that cross the C ABI. Every op validates its
// arguments through these before it launches anything, so the messages read
// alike everywhere: "<name>: expected <what>, got <dtype> tensor of shape (...) on <device>".
#pragma once

#include <dlpack/dlpack.h>

#include <cstdint>
#include <initializer_list>
#include <string>

namespace mlacore {

enum class DType : uint8_t { F16, BF16, F32, F64, I32, I64, U8, I8, Other };

DType dtype_of(const DLDataType& t) noexcept;
const char* dtype_name(DType d) noexcept;
int64_t itemsize(DType d) noexcept;

enum class DeviceKind : uint8_t { CPU, CUDA, ROCM, Other };

// One validated argument: a view of a non-null DLTensor, checked on
// construction, with a name for messages. It owns nothing (the bindings'
// BorrowedTensor is what holds a converted Python object for a call). The
// constructor refuses a malformed tensor, one whose element count, byte size
// or stride span leaves int64, and a non-empty one with a NULL data pointer.
class CheckedTensor {
 public:
  CheckedTensor(const DLTensor* tensor, const char* name);  // type_error when tensor is NULL

  const char* name() const noexcept { return name_; }
  const DLTensor& dl() const noexcept { return *t_; }
  int ndim() const noexcept { return t_->ndim; }
  int64_t size(int dim) const noexcept { return t_->shape[dim]; }
  // Element stride; compact row-major when the producer gave no strides.
  int64_t stride(int dim) const noexcept;
  int64_t numel() const noexcept;
  DType dtype() const noexcept { return dtype_; }
  DeviceKind device() const noexcept;
  int device_id() const noexcept { return t_->device.device_id; }
  bool on_cpu() const noexcept { return device() == DeviceKind::CPU; }
  bool on_gpu() const noexcept { return device() == DeviceKind::CUDA || device() == DeviceKind::ROCM; }
  // First element's address (data + byte_offset).
  void* data() const noexcept { return static_cast<char*>(t_->data) + t_->byte_offset; }
  template <class T>
  T* ptr() const noexcept { return static_cast<T*>(data()); }

  // "int64 tensor of shape (8,) on cpu"
  std::string describe() const;
  std::string device_str() const;

  // Each throws value_error naming this argument.
  void expect_ndim(int n) const;
  void expect_dtype(std::initializer_list<DType> allowed) const;
  void expect_size(int dim, int64_t expected, const char* what = nullptr) const;
  // 1-D int32/int64 of `length` elements (length < 0: any), element-aligned;
  // `length_desc` says where the length comes from ("batch+1=9").
  void expect_index_vector(int64_t length = -1, const char* length_desc = nullptr) const;
  // The first element at an address that is a multiple of the element size
  // (an empty tensor is never read: any address).
  void expect_element_aligned() const;
  void expect_same_device(const CheckedTensor& other) const;
  void expect_last_dim_contiguous() const;
  void expect_contiguous() const;

 private:
  [[noreturn]] void fail(const std::string& expected) const;
  void expect_addressable() const;

  const DLTensor* t_;
  const char* name_;
  DType dtype_;
};

std::string shape_str(const DLTensor& t);

}  // namespace mlacore
