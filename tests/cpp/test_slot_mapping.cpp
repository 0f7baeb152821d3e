// Slot mapping, block-table flattening and batch positions over the C ABI on
// CPU DLTensors, including strided views and out-of-range entries.
#include <mlacore/mlacore.hpp>

#include <cstdint>
#include <vector>

#include "check.h"

namespace {

template <class T>
struct Vec {
  std::vector<T> data;
  int64_t shape[2];
  int64_t strides[2];
  DLTensor t{};
  Vec(std::vector<T> values, int64_t stride = 1) {
    // `stride` > 1 spreads the values out, with junk in between.
    data.assign(values.size() * stride + 1, T(-99));
    for (size_t i = 0; i < values.size(); ++i) data[i * stride] = values[i];
    shape[0] = static_cast<int64_t>(values.size());
    strides[0] = stride;
    t.data = data.data();
    t.device = {kDLCPU, 0};
    t.ndim = 1;
    t.dtype = {kDLInt, uint8_t(sizeof(T) * 8), 1};
    t.shape = shape;
    t.strides = strides;
  }
  T operator[](size_t i) const { return data[i * strides[0]]; }
};

}  // namespace

int main() {
  // Request 0: pages 10, 11; request 1: none; request 2: pages 5 (bad id 900 after).
  Vec<int32_t> indptr({0, 2, 2, 4}), indices({10, 11, 5, 900}, 3);
  Vec<int64_t> bi({0, 0, 0, 1, 2, 2, 3, -1}, 2), pos({0, 9, 16, 0, 3, 9, 0, 0});
  Vec<int64_t> out(std::vector<int64_t>(8, 0));
  mlacore::slot_mapping(&bi.t, &pos.t, &indices.t, &indptr.t, 8, &out.t, /*num_pages=*/64);
  const int64_t expected[8] = {80, 89, -1, -1, 43, -1, -1, -1};
  for (int i = 0; i < 8; ++i) CHECK(out[i] == expected[i]);
  // Without num_pages the id 900 is taken as it is.
  mlacore::slot_mapping(&bi.t, &pos.t, &indices.t, &indptr.t, 8, &out.t);
  CHECK(out[5] == 900 * 8 + 1 && out[4] == 43 && out[2] == -1);

  // Errors name the argument and launch nothing.
  Vec<int32_t> pos32({0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(mlacore_slot_mapping(&bi.t, &pos32.t, &indices.t, &indptr.t, 8, -1, &out.t, nullptr) == MLACORE_ERROR_VALUE);
  CHECK_CONTAINS(mlacore_last_error(), "positions: expected int64 (the dtype of batch_indices)");
  CHECK(mlacore_slot_mapping(&bi.t, &pos.t, &indices.t, &indptr.t, 0, -1, &out.t, nullptr) == MLACORE_ERROR_VALUE);
  CHECK_CONTAINS(mlacore_last_error(), "page_size");

  // A transposed [3, 4] block table: element (r, j) at j * 3 + r.
  std::vector<int32_t> storage(12);
  for (int r = 0; r < 3; ++r)
    for (int j = 0; j < 4; ++j) storage[j * 3 + r] = 100 * r + j;
  int64_t bt_shape[2] = {3, 4}, bt_strides[2] = {1, 3};
  DLTensor table{};
  table.data = storage.data();
  table.device = {kDLCPU, 0};
  table.ndim = 2;
  table.dtype = {kDLInt, 32, 1};
  table.shape = bt_shape;
  table.strides = bt_strides;
  Vec<int64_t> cu({1, 3, 9, 10});  // row 1 claims 6 of 4 blocks: clamped
  Vec<int32_t> flat(std::vector<int32_t>(9, -1), 2);
  mlacore::page_indices_from_block_table(&table, &cu.t, &flat.t);
  const int32_t want[9] = {-1, 0, 1, 100, 101, 102, 103, -1, -1};  // row 2 (cu 9..10) is past the end
  for (int i = 0; i < 9; ++i) CHECK(flat[i] == want[i]);

  // FlashInfer positions: seq_lens include the appended tokens.
  Vec<int32_t> append_indptr({0, 3, 3, 5}), seq_lens({10, 4, 2});
  Vec<int32_t> b_out(std::vector<int32_t>(6, 0)), p_out(std::vector<int32_t>(6, 0));
  mlacore::batch_indices_positions(&append_indptr.t, &seq_lens.t, &b_out.t, &p_out.t);
  const int32_t wb[6] = {0, 0, 0, 2, 2, -1}, wp[6] = {7, 8, 9, 0, 1, -1};
  for (int i = 0; i < 6; ++i) CHECK(b_out[i] == wb[i] && p_out[i] == wp[i]);

  return finish("test_slot_mapping");
}
