// Layout detection over the C ABI, on DLTensors a C++ engine would build by
// hand (no torch): halves of one [P, S, 576] buffer, layer slices, and the
// layouts that must be rejected.
#include <mlacore/mlacore.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "check.h"

namespace {

struct Half {
  int64_t shape[3];
  int64_t strides[3];
  DLTensor t{};
  Half(void* base, int64_t elem_offset, int64_t pages, int64_t page_size, int64_t dim, int64_t page_stride,
       int64_t token_stride, uint8_t code = kDLBfloat) {
    shape[0] = pages, shape[1] = page_size, shape[2] = dim;
    strides[0] = page_stride, strides[1] = token_stride, strides[2] = 1;
    t.data = base;
    t.byte_offset = static_cast<uint64_t>(elem_offset) * 2;
    t.device = {kDLCPU, 0};
    t.ndim = 3;
    t.dtype = {code, 16, 1};
    t.shape = shape;
    t.strides = strides;
  }
};

}  // namespace

int main() {
  const int64_t L = 3, P = 4, S = 16, W = 576;
  std::vector<uint16_t> buf(L * P * S * W);

  // Layer 1 of a [L, P, S, 576] buffer, split into 512 + 64.
  const int64_t layer = 1 * P * S * W;
  Half ckv(buf.data(), layer, P, S, 512, S * W, W), kpe(buf.data(), layer + 512, P, S, 64, S * W, W);
  mlacore::CombinedKvView v = mlacore::combined_kv_view(&ckv.t, &kpe.t);
  CHECK(v.adjacent);
  CHECK(v.shape[0] == P && v.shape[1] == S && v.shape[2] == W);
  CHECK(v.strides[0] == S * W && v.strides[1] == W && v.strides[2] == 1);
  CHECK(mlacore::explain_kv_layout(&ckv.t, &kpe.t).rfind("adjacent", 0) == 0);

  // The C entry point leaves the view untouched when not adjacent.
  int64_t shape[3] = {-7, -7, -7}, strides[3] = {-7, -7, -7};
  int32_t adjacent = 5;
  Half far(buf.data(), layer + 512 + W, P, S, 64, S * W, W);  // kpe of the next token
  CHECK(mlacore_combined_kv_view(&ckv.t, &far.t, shape, strides, &adjacent) == MLACORE_OK);
  CHECK(adjacent == 0 && shape[0] == -7 && strides[2] == -7);

  // Reversed halves: kpe first in each token.
  Half rkpe(buf.data(), 0, P, S, 64, S * W, W), rckv(buf.data(), 64, P, S, 512, S * W, W);
  CHECK(!mlacore::combined_kv_view(&rckv.t, &rkpe.t).adjacent);
  CHECK(mlacore::explain_kv_layout(&rckv.t, &rkpe.t).find("reversed") != std::string::npos);

  // Padded rows (token stride 640).
  Half pckv(buf.data(), 0, P, S, 512, S * 640, 640), pkpe(buf.data(), 512, P, S, 64, S * 640, 640);
  CHECK(!mlacore::combined_kv_view(&pckv.t, &pkpe.t).adjacent);
  CHECK(mlacore::explain_kv_layout(&pckv.t, &pkpe.t).find("padded") != std::string::npos);

  // Mismatched dtypes (fp16 kpe next to a bf16 ckv).
  Half hkpe(buf.data(), layer + 512, P, S, 64, S * W, W, kDLFloat);
  CHECK(!mlacore::combined_kv_view(&ckv.t, &hkpe.t).adjacent);

  // Compact DLTensors (strides NULL) of separate buffers.
  std::vector<uint16_t> a(P * S * 512), b(P * S * 64);
  Half cckv(a.data(), 0, P, S, 512, 0, 0), ckpe(b.data(), 0, P, S, 64, 0, 0);
  cckv.t.strides = nullptr;
  ckpe.t.strides = nullptr;
  CHECK(!mlacore::combined_kv_view(&cckv.t, &ckpe.t).adjacent);

  // Truncation: the full length comes back, the buffer stays NUL-terminated.
  char small[8];
  size_t length = 0;
  CHECK(mlacore_explain_kv_layout(&ckv.t, &kpe.t, small, sizeof small, &length) == MLACORE_OK);
  CHECK(length > sizeof small && std::string(small) == "adjacen");

  // A 4-D cache and mismatched page counts are value errors naming the argument.
  int64_t shape4[4] = {P, S, 1, 512};
  DLTensor four = ckv.t;
  four.ndim = 4;
  four.shape = shape4;
  four.strides = nullptr;
  CHECK(mlacore_combined_kv_view(&four, &kpe.t, shape, strides, &adjacent) == MLACORE_ERROR_VALUE);
  CHECK_CONTAINS(mlacore_last_error(), "ckv_cache: expected a 3-D");
  Half fewer(buf.data(), layer + 512, P - 1, S, 64, S * W, W);
  CHECK(mlacore_combined_kv_view(&ckv.t, &fewer.t, shape, strides, &adjacent) == MLACORE_ERROR_VALUE);
  CHECK_CONTAINS(mlacore_last_error(), "kpe_cache: expected size 4");
  CHECK(mlacore_combined_kv_view(&ckv.t, nullptr, shape, strides, &adjacent) == MLACORE_ERROR_TYPE);

  return finish("test_kv_layout");
}
