// Paged append and backend routing over the C ABI on CPU DLTensors: a combined
// [P, S, 576]-style buffer written through two views, a 5-D K/V cache, skipped
// out-of-range tokens, strict mode, errors, and the routing decision.
#include <mlacore/mlacore.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "check.h"

namespace {

// A CPU tensor over caller-owned storage with explicit shape and strides.
struct View {
  int64_t shape[5];
  int64_t strides[5];
  DLTensor t{};
  View(void* data, DLDataType dtype, std::vector<int64_t> dims, std::vector<int64_t> st) {
    for (size_t i = 0; i < dims.size(); ++i) {
      shape[i] = dims[i];
      strides[i] = st[i];
    }
    t.data = data;
    t.device = {kDLCPU, 0};
    t.ndim = static_cast<int32_t>(dims.size());
    t.dtype = dtype;
    t.shape = shape;
    t.strides = strides;
  }
  const DLTensor* operator&() const { return &t; }
};

constexpr DLDataType kF32{kDLFloat, 32, 1};
constexpr DLDataType kI32{kDLInt, 32, 1};
constexpr DLDataType kI64{kDLInt, 64, 1};
constexpr float kPoison = -7.0f;

}  // namespace

int main() {
  // Pool of 4 pages of 2 tokens, rows of 6 floats: ckv = first 4, kpe = last 2.
  const int64_t P = 4, S = 2, DC = 4, DP = 2, ROW = DC + DP;
  std::vector<float> pool(P * S * ROW, kPoison);
  View ckv_cache(pool.data(), kF32, {P, S, DC}, {S * ROW, ROW, 1});
  View kpe_cache(pool.data() + DC, kF32, {P, S, DP}, {S * ROW, ROW, 1});

  // Request 0 owns pages 2, 0; request 1 owns page 3. Token 3 has a position
  // past request 1's pages and token 4 a batch index out of range: both skipped.
  std::vector<int32_t> indptr{0, 2, 3}, indices{2, 0, 3}, last_len{1, 2};
  std::vector<int64_t> bi{0, 0, 1, 1, 2}, pos{0, 2, 1, 2, 0};
  const int64_t nnz = 5;
  View v_indptr(indptr.data(), kI32, {3}, {1}), v_indices(indices.data(), kI32, {3}, {1});
  View v_last(last_len.data(), kI32, {2}, {1});
  View v_bi(bi.data(), kI64, {nnz}, {1}), v_pos(pos.data(), kI64, {nnz}, {1});

  // Sources: rows of one [nnz, 8] buffer (row stride 8, not 6).
  std::vector<float> src(nnz * 8);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i);
  View a_ckv(src.data(), kF32, {nnz, DC}, {8, 1}), a_kpe(src.data() + 6, kF32, {nnz, DP}, {8, 1});

  CHECK(mlacore_append_paged_mla_kv_cache(&a_ckv, &a_kpe, &v_bi, &v_pos, &ckv_cache, &kpe_cache, &v_indices,
                                          &v_indptr, &v_last, MLACORE_BACKEND_AUTO, 0, nullptr) == MLACORE_OK);
  // Expected slot (page, offset) per token; -1: skipped.
  const int64_t page_of[nnz] = {2, 0, 3, -1, -1}, off_of[nnz] = {0, 0, 1, -1, -1};
  std::vector<float> expect(pool.size(), kPoison);
  for (int64_t i = 0; i < nnz; ++i) {
    if (page_of[i] < 0) continue;
    float* row = expect.data() + (page_of[i] * S + off_of[i]) * ROW;
    for (int64_t d = 0; d < DC; ++d) row[d] = src[i * 8 + d];
    for (int64_t d = 0; d < DP; ++d) row[DC + d] = src[i * 8 + 6 + d];
  }
  CHECK(pool == expect);

  // Strict mode: refuses, names token 3, and writes nothing.
  std::vector<float> before = pool;
  for (float& x : src) x += 1000.0f;
  CHECK(mlacore_append_paged_mla_kv_cache(&a_ckv, &a_kpe, &v_bi, &v_pos, &ckv_cache, &kpe_cache, &v_indices,
                                          &v_indptr, &v_last, MLACORE_BACKEND_AUTO, 1, nullptr) ==
        MLACORE_ERROR_VALUE);
  CHECK_CONTAINS(mlacore_last_error(), "token 3 (batch index 1, position 2)");
  CHECK(pool == before);

  // The C++ wrapper throws with the status; a dtype mismatch names the argument.
  std::vector<int32_t> bi32{0, 0, 1, 1, 2};
  View v_bi32(bi32.data(), kI32, {nnz}, {1});
  View half_cache(pool.data(), {kDLFloat, 16, 1}, {P, S, DC}, {S * ROW, ROW, 1});
  bool threw = false;
  try {
    mlacore::append_paged_mla_kv_cache(&a_ckv, &a_kpe, &v_bi32, &v_pos, &half_cache, &kpe_cache, &v_indices,
                                       &v_indptr, &v_last);
  } catch (const mlacore::Error& e) {
    threw = e.status() == MLACORE_ERROR_VALUE && std::string(e.what()).find("kpe_cache: expected float16") == 0;
  }
  CHECK(threw);
  CHECK(mlacore_append_paged_mla_kv_cache(&a_ckv, &a_kpe, &v_bi, &v_pos, &ckv_cache, nullptr, &v_indices,
                                          &v_indptr, &v_last, MLACORE_BACKEND_AUTO, 0, nullptr) ==
        MLACORE_ERROR_TYPE);
  CHECK_CONTAINS(mlacore_last_error(), "kpe_cache");
  CHECK(mlacore_append_paged_mla_kv_cache(&a_ckv, &a_kpe, &v_bi, &v_pos, &ckv_cache, &kpe_cache, &v_indices,
                                          &v_indptr, &v_last, 7, 0, nullptr) == MLACORE_ERROR_VALUE);
  CHECK_CONTAINS(mlacore_last_error(), "backend");
  CHECK(mlacore_append_paged_mla_kv_cache(&a_ckv, &a_kpe, &v_bi, &v_pos, &ckv_cache, &kpe_cache, &v_indices,
                                          &v_indptr, &v_last, MLACORE_BACKEND_AITER, 0, nullptr) ==
        MLACORE_ERROR_VALUE);
  CHECK_CONTAINS(mlacore_last_error(), "not a HIP device");

  // K/V: one 5-D HND cache [P, 2, H=2, S, D=2], int32 batch indices.
  const int64_t H = 2, D = 2;
  std::vector<float> kv(P * 2 * H * S * D, kPoison);
  View kv_cache(kv.data(), kF32, {P, 2, H, S, D}, {2 * H * S * D, H * S * D, S * D, D, 1});
  std::vector<float> keys(nnz * H * D), values(nnz * H * D);
  for (size_t i = 0; i < keys.size(); ++i) {
    keys[i] = static_cast<float>(i);
    values[i] = static_cast<float>(-1 - static_cast<int64_t>(i));
  }
  View a_key(keys.data(), kF32, {nnz, H, D}, {H * D, D, 1}), a_value(values.data(), kF32, {nnz, H, D}, {H * D, D, 1});
  mlacore::append_paged_kv_cache(&a_key, &a_value, &v_bi32, &v_pos, &kv_cache, nullptr, &v_indices, &v_indptr,
                                 &v_last, MLACORE_LAYOUT_HND);
  std::vector<float> kv_expect(kv.size(), kPoison);
  for (int64_t i = 0; i < nnz; ++i) {
    if (page_of[i] < 0) continue;
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < D; ++d) {
        const int64_t at = page_of[i] * 2 * H * S * D + h * S * D + off_of[i] * D + d;
        kv_expect[at] = keys[(i * H + h) * D + d];
        kv_expect[at + H * S * D] = values[(i * H + h) * D + d];
      }
  }
  CHECK(kv == kv_expect);
  CHECK(mlacore_append_paged_kv_cache(&a_key, &a_value, &v_bi32, &v_pos, &kv_cache, nullptr, &v_indices,
                                      &v_indptr, &v_last, 5, MLACORE_BACKEND_AUTO, 0, nullptr) ==
        MLACORE_ERROR_VALUE);
  CHECK_CONTAINS(mlacore_last_error(), "kv_layout");

  // Routing: auto falls back to native and says why; explicit AITER fails by gate or availability.
  mlacore_route_request req{};
  req.op = MLACORE_ROUTE_APPEND_MLA;
  req.device_type = kDLROCM;
  req.dtype = {kDLBfloat, 16, 1};
  req.layout = MLACORE_LAYOUT_NHD;
  req.page_size = 1;
  req.head_dim = 512;
  req.head_dim_pe = 64;
  req.adjacent = 1;
  const mlacore::RouteDecision auto_route = mlacore::route(req);
  CHECK(auto_route.backend == MLACORE_BACKEND_NATIVE);
  CHECK(auto_route.why.find("AITER unavailable") != std::string::npos);
  int32_t chosen = -1;
  CHECK(mlacore_route(&req, MLACORE_BACKEND_AITER, &chosen, nullptr, 0) == MLACORE_ERROR_RUNTIME);
  CHECK_CONTAINS(mlacore_last_error(), "AITER unavailable: ");
  req.device_type = kDLCUDA;
  CHECK(mlacore_route(&req, MLACORE_BACKEND_AITER, &chosen, nullptr, 0) == MLACORE_ERROR_VALUE);
  CHECK_CONTAINS(mlacore_last_error(), "not a HIP device");
  char why[16];
  CHECK(mlacore_route(&req, MLACORE_BACKEND_NATIVE, &chosen, why, sizeof why) == MLACORE_OK);
  CHECK(chosen == MLACORE_BACKEND_NATIVE && std::string(why) == "native: request");  // truncated to fit
  req.op = 99;
  CHECK(mlacore_route(&req, MLACORE_BACKEND_AUTO, &chosen, nullptr, 0) == MLACORE_ERROR_VALUE);

  const mlacore::BackendInfo aiter = mlacore::backend_info("aiter");
  CHECK(!aiter.available && !aiter.reason.empty());
  CHECK(mlacore::backend_info("native").available);
  int32_t available = 0;
  const char* reason = nullptr;
  CHECK(mlacore_backend_info("cutlass", &available, &reason) == MLACORE_ERROR_VALUE);

  // concat_and_cache_mla: one layer of a [2, blocks=3, block_size=2, 6] cache, sources
  // kv_c [4, 4] and k_pe [4, 2] as slices of one [4, 8] buffer; slot -1 and slot 6
  // (past 3 * 2 slots) are skipped, the rest land side by side.
  {
    const int64_t L = 2, B = 3, BS = 2, T = 4;
    std::vector<float> layers(L * B * BS * ROW, kPoison);
    View layer1(layers.data() + B * BS * ROW, kF32, {B, BS, ROW}, {BS * ROW, ROW, 1});
    View kv_c(src.data(), kF32, {T, DC}, {8, 1}), k_pe(src.data() + 6, kF32, {T, DP}, {8, 1});
    std::vector<int64_t> slots{5, -1, 0, 6};
    View v_slots(slots.data(), kI64, {T}, {1});
    CHECK(mlacore_concat_and_cache_mla(&kv_c, &k_pe, &layer1, &v_slots, 0, nullptr) == MLACORE_OK);
    std::vector<float> want(layers.size(), kPoison);
    for (int64_t i = 0; i < T; ++i) {
      if (slots[i] < 0 || slots[i] >= B * BS) continue;
      float* row = want.data() + (B * BS + slots[i]) * ROW;  // layer 1, block-major slots
      for (int64_t d = 0; d < DC; ++d) row[d] = src[i * 8 + d];
      for (int64_t d = 0; d < DP; ++d) row[DC + d] = src[i * 8 + 6 + d];
    }
    CHECK(layers == want);
    // Strict: slot 6 is past the cache; token 3 is named and nothing moves.
    for (float& x : src) x += 1.0f;
    CHECK(mlacore_concat_and_cache_mla(&kv_c, &k_pe, &layer1, &v_slots, 1, nullptr) == MLACORE_ERROR_VALUE);
    CHECK_CONTAINS(mlacore_last_error(), "token 3 (slot 6)");
    CHECK(layers == want);
    // Validation names the argument.
    View short_pe(src.data() + 6, kF32, {T, 1}, {8, 1});
    CHECK(mlacore_concat_and_cache_mla(&kv_c, &short_pe, &layer1, &v_slots, 0, nullptr) == MLACORE_ERROR_VALUE);
    CHECK_CONTAINS(mlacore_last_error(), "k_pe: ");
    CHECK(mlacore_concat_and_cache_mla(&kv_c, &k_pe, &layer1, nullptr, 0, nullptr) == MLACORE_ERROR_TYPE);
    CHECK_CONTAINS(mlacore_last_error(), "slot_mapping");
  }

  return finish("test_append");
}
