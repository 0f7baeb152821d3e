// Layout detection for a (ckv, kpe) cache pair. Pure metadata: it reads
// pointers, shapes, strides and dtypes, never the memory behind them, which
// is why one code path serves CPU tensors, GPU tensors and C++ DLTensors.
#include <mlacore/kv_layout.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "common/error.h"
#include "layout/kv_layout.h"
#include "common/tensor.h"

namespace mlacore {
namespace {

// Element size from the raw DLPack dtype, so fp8 and other codes the CheckedTensor
// enum does not name still get an answer: adjacency only needs byte widths.
int64_t element_bytes(const DLDataType& t) { return int64_t(t.bits) * t.lanes / 8; }

std::string dtype_desc(const CheckedTensor& a) {
  if (a.dtype() != DType::Other) return dtype_name(a.dtype());
  return cat("dtype(code=", int(a.dl().dtype.code), ", bits=", int(a.dl().dtype.bits), ", lanes=",
             int(a.dl().dtype.lanes), ")");
}

bool same_dtype(const DLDataType& a, const DLDataType& b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

bool same_device(const CheckedTensor& a, const CheckedTensor& b) {
  return a.dl().device.device_type == b.dl().device.device_type && a.device_id() == b.device_id();
}

void validate_cache(const CheckedTensor& a, const char* dim_name) {
  if (a.ndim() == 4)
    value_error(a.name(), ": expected a 3-D [num_pages, page_size, ", dim_name, "] cache, got a 4-D ",
                a.describe(), "; pass one layer or drop the head dimension (e.g. cache[:, :, 0])");
  if (a.ndim() != 3)
    value_error(a.name(), ": expected a 3-D [num_pages, page_size, ", dim_name, "] cache, got ", a.describe());
  if (a.size(2) < 1) value_error(a.name(), ": expected a non-empty last dimension, got ", a.describe());
  const DLDataType& t = a.dl().dtype;
  if (t.bits == 0 || t.lanes == 0 || (int64_t(t.bits) * t.lanes) % 8 != 0)
    value_error(a.name(), ": expected a dtype of whole bytes per element, got ", a.describe());
}

}  // namespace

bool kv_halves_adjacent(const CheckedTensor& ckv, const CheckedTensor& kpe, std::string* why) {
  validate_cache(ckv, "Dc");
  validate_cache(kpe, "Dp");
  kpe.expect_size(0, ckv.size(0), "num_pages of ckv_cache");
  kpe.expect_size(1, ckv.size(1), "page_size of ckv_cache");

  const int64_t pages = ckv.size(0), page_size = ckv.size(1);
  const int64_t dc = ckv.size(2), dp = kpe.size(2), width = dc + dp;
  bool ok = true;
  // Reasons are built only when asked for: routing calls this on every append.
  auto fail = [&](auto&& reason) {
    ok = false;
    if (why) *why += (why->empty() ? "" : "; ") + reason();
  };

  if (!same_device(ckv, kpe))
    fail([&] { return cat("ckv_cache is on ", ckv.device_str(), " and kpe_cache on ", kpe.device_str()); });
  if (!same_dtype(ckv.dl().dtype, kpe.dl().dtype))
    fail([&] { return cat("ckv_cache is ", dtype_desc(ckv), " and kpe_cache ", dtype_desc(kpe)); });
  for (const CheckedTensor* a : {&ckv, &kpe})
    if (a->size(2) > 1 && a->stride(2) != 1)
      fail([&] { return cat(a->name(), "'s last dimension is not contiguous (stride ", a->stride(2), ")"); });
  // A dimension of size 1 addresses one element whatever its stride says.
  if (page_size > 1) {
    if (ckv.stride(1) != width)
      fail([&] { return cat("ckv_cache's token stride is ", ckv.stride(1), " elements, not Dc + Dp = ", dc, " + ", dp, " = ",
               width, ckv.stride(1) > width ? " (padded rows)" : ""); });
    if (kpe.stride(1) != ckv.stride(1))
      fail([&] { return cat("the token strides differ (ckv_cache ", ckv.stride(1), ", kpe_cache ", kpe.stride(1), ")"); });
  }
  if (pages > 1 && kpe.stride(0) != ckv.stride(0))
    fail([&] { return cat("the page strides differ (ckv_cache ", ckv.stride(0), ", kpe_cache ", kpe.stride(0), ")"); });

  // Byte distance between the first elements; only meaningful within one
  // allocation, but a mismatch is all we report for separate ones.
  const int64_t bytes = element_bytes(ckv.dl().dtype);
  const auto ckv_addr = reinterpret_cast<uintptr_t>(ckv.data());
  const auto kpe_addr = reinterpret_cast<uintptr_t>(kpe.data());
  const int64_t distance = static_cast<int64_t>(kpe_addr - ckv_addr);
  if (distance != dc * bytes) {
    if (same_dtype(ckv.dl().dtype, kpe.dl().dtype) && -distance == dp * bytes)
      fail([&] { return cat("the halves are reversed: kpe_cache ends where ckv_cache starts (kpe first in each token)"); });
    else
      fail([&] { return cat("kpe_cache does not start Dc = ", dc, " elements (", dc * bytes,
               " bytes) after ckv_cache but ", distance,
               " bytes from it: separate allocations or a different offset inside one"); });
  }
  if (ok && why)
    *why = cat("adjacent: kpe_cache starts ", dc, " elements after ckv_cache, token stride ", width,
               ", page stride ", ckv.stride(0), "; combined view [", pages, ", ", page_size, ", ", width,
               "] with strides (", ckv.stride(0), ", ", page_size > 1 ? ckv.stride(1) : width, ", 1)");
  else if (why)
    *why = "not adjacent: " + *why;
  return ok;
}

}  // namespace mlacore

extern "C" {

MLACORE_API mlacore_status mlacore_combined_kv_view(const DLTensor* ckv_cache, const DLTensor* kpe_cache,
                                                    int64_t* view_shape, int64_t* view_strides,
                                                    int32_t* adjacent) {
  return mlacore::guarded([&] {
    const mlacore::CheckedTensor ckv(ckv_cache, "ckv_cache"), kpe(kpe_cache, "kpe_cache");
    if (adjacent == nullptr) mlacore::type_error("adjacent: expected a pointer, got NULL");
    if (view_shape == nullptr || view_strides == nullptr)
      mlacore::type_error("view_shape, view_strides: expected arrays of 3, got NULL");
    *adjacent = 0;
    if (!mlacore::kv_halves_adjacent(ckv, kpe, nullptr)) return;
    const int64_t width = ckv.size(2) + kpe.size(2);
    view_shape[0] = ckv.size(0);
    view_shape[1] = ckv.size(1);
    view_shape[2] = width;
    view_strides[0] = ckv.stride(0);
    // With one token per page the parent's token stride is arbitrary; the
    // interleaved one keeps the view's strides meaningful to consumers.
    view_strides[1] = ckv.size(1) > 1 ? ckv.stride(1) : width;
    view_strides[2] = 1;
    *adjacent = 1;
  });
}

MLACORE_API mlacore_status mlacore_explain_kv_layout(const DLTensor* ckv_cache, const DLTensor* kpe_cache,
                                                     char* buf, size_t buf_size, size_t* length) {
  return mlacore::guarded([&] {
    const mlacore::CheckedTensor ckv(ckv_cache, "ckv_cache"), kpe(kpe_cache, "kpe_cache");
    if (buf == nullptr && buf_size > 0) mlacore::type_error("buf: expected a buffer of buf_size bytes, got NULL");
    std::string text;
    mlacore::kv_halves_adjacent(ckv, kpe, &text);
    if (length) *length = text.size();
    if (buf_size > 0) {
      const size_t n = text.size() < buf_size - 1 ? text.size() : buf_size - 1;
      std::memcpy(buf, text.data(), n);
      buf[n] = '\0';
    }
  });
}

}  // extern "C"
