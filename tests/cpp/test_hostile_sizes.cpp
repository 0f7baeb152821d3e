// Hostile sizes over the C ABI (issue 28): caller-controlled shapes, strides
// and decode dims at int64's edge, NULL data, misaligned index tensors. Each
// call must return MLACORE_ERROR_VALUE with a message naming the argument,
// and leave every output as it was. Huge logical sizes use stride 0, so no
// case needs more than a few bytes. Run under ASan+UBSan by tests/run.sh.
#include <mlacore/mlacore.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "check.h"
#include "host_tensor.h"

namespace {

constexpr int64_t I64MAX = std::numeric_limits<int64_t>::max();
constexpr DLDataType kI32{kDLInt, 32, 1}, kI64{kDLInt, 64, 1}, kU8{kDLUInt, 8, 1};
constexpr DLDataType kBf16{kDLBfloat, 16, 1}, kF32{kDLFloat, 32, 1};

using T = HostTensor;  // tests/cpp/host_tensor.h

// The call failed with MLACORE_ERROR_VALUE and a message that starts with `arg`.
void expect_value_error(mlacore_status st, const char* arg, int line) {
  const char* msg = mlacore_last_error();
  if (st != MLACORE_ERROR_VALUE || std::strncmp(msg, arg, std::strlen(arg)) != 0) {
    std::fprintf(stderr, "line %d: expected MLACORE_ERROR_VALUE naming %s, got status %d: %s\n", line, arg, int(st),
                 msg);
    ++g_failures;
  }
}
#define EXPECT_VALUE_ERROR(call, arg) expect_value_error((call), (arg), __LINE__)

// D1 / E1: appends whose kv_last_page_len or kv_indptr is a huge broadcast,
// with a token at a huge batch index.
void appends() {
  std::vector<uint16_t> cache(2 * 2 * 576, 0x1234), src(576, 0x3f80);
  const std::vector<uint16_t> cache0 = cache;
  int64_t zero = 0, one[2] = {0, 1}, big = int64_t(1) << 62;
  T ckv(cache.data(), kBf16, {2, 2, 512}, {2 * 576, 576, 1}), kpe(cache.data() + 512, kBf16, {2, 2, 64}, {2 * 576, 576, 1});
  T sckv(src.data(), kBf16, {1, 512}), skpe(src.data() + 512, kBf16, {1, 64});
  T bi(&big, kI64, {1}), pos(&zero, kI64, {1}), idx(one, kI64, {2}), ptr(one, kI64, {2});
  T last_huge(&zero, kI64, {I64MAX}, {0}), last_2_59(&zero, kI64, {int64_t(1) << 59}, {0});
  T ptr_huge(&zero, kI64, {I64MAX}, {0}), last1(one + 1, kI64, {1}), last2(one, kI64, {2});
  for (int strict = 0; strict < 2; ++strict) {
    EXPECT_VALUE_ERROR(mlacore_append_paged_mla_kv_cache(sckv.p(), skpe.p(), bi.p(), pos.p(), ckv.p(), kpe.p(),
                                                         idx.p(), ptr.p(), last_huge.p(), 0, strict, nullptr),
                       "kv_last_page_len");
    EXPECT_VALUE_ERROR(mlacore_append_paged_mla_kv_cache(sckv.p(), skpe.p(), bi.p(), pos.p(), ckv.p(), kpe.p(),
                                                         idx.p(), ptr.p(), last_2_59.p(), 0, strict, nullptr),
                       "kv_last_page_len");
    EXPECT_VALUE_ERROR(mlacore_append_paged_mla_kv_cache(sckv.p(), skpe.p(), bi.p(), pos.p(), ckv.p(), kpe.p(),
                                                         idx.p(), ptr_huge.p(), last1.p(), 0, strict, nullptr),
                       "kv_indptr");
    // E1: one entry more than the batch kv_indptr defines.
    EXPECT_VALUE_ERROR(mlacore_append_paged_mla_kv_cache(sckv.p(), skpe.p(), bi.p(), pos.p(), ckv.p(), kpe.p(),
                                                         idx.p(), ptr.p(), last2.p(), 0, strict, nullptr),
                       "kv_last_page_len");
    CHECK_CONTAINS(mlacore_last_error(), "len(kv_indptr)-1=1");
  }
  CHECK(cache == cache0);
}

// D2: a block table of 2^63-1 rows (uint8 so its byte size fits: rows + 1
// is what would wrap) and of 2^59 int64 rows.
void block_table() {
  int64_t zero = 0, cu[2] = {0, 1}, out[4] = {-5, -5, -5, -5};
  uint8_t b = 0;
  T table8(&b, kU8, {I64MAX, 1}, {0, 1}), table64(&zero, kI64, {int64_t(1) << 59, 1}, {0, 1});
  T tcu(cu, kI64, {2}), tout(out, kI64, {4});
  EXPECT_VALUE_ERROR(mlacore_page_indices_from_block_table(table8.p(), tcu.p(), tout.p(), nullptr), "block_table");
  EXPECT_VALUE_ERROR(mlacore_page_indices_from_block_table(table64.p(), tcu.p(), tout.p(), nullptr), "cu_num_blocks");
  for (int64_t v : out) CHECK(v == -5);
}

// D3-D5, D10: decode dims whose layout total or workspace size wraps.
void decode_dims() {
  constexpr int H = 2, S = 4;
  std::vector<uint16_t> qn(H * 512, 0x3f80), qp(H * 64, 0x3f80), cache(2 * S * 576, 0x3f80);
  std::vector<uint16_t> out(H * 512, 0x7777);
  std::vector<float> lse(H, 42.f);
  int32_t idx = 0, ptr[2] = {0, 1}, len = 3;
  std::vector<int32_t> md(64, 0);
  alignas(16) unsigned char ws[16] = {};
  T tqn(qn.data(), kBf16, {1, H, 512}), tqp(qp.data(), kBf16, {1, H, 64});
  T ckv(cache.data(), kBf16, {2, S, 512}, {S * 576, 576, 1}), kpe(cache.data() + 512, kBf16, {2, S, 64}, {S * 576, 576, 1});
  T tidx(&idx, kI32, {1}), tptr(ptr, kI32, {2}), tqo(ptr, kI32, {2}), tlen(&len, kI32, {1});
  T tws(ws, kU8, {16}), tout(out.data(), kBf16, {1, H, 512}), tlse(lse.data(), kF32, {1, H});
  auto run = [&](mlacore_decode_dims dims, int64_t md_len) {
    T tmd(md.data(), kI32, {md_len}, {md_len > 64 ? 0 : 1});
    return mlacore_mla_decode(tqn.p(), tqp.p(), ckv.p(), kpe.p(), tidx.p(), tptr.p(), tqo.p(), tlen.p(), tmd.p(),
                              tws.p(), tout.p(), tlse.p(), dims, S, 0.1f, 0, nullptr);
  };
  const int64_t e62 = int64_t(1) << 62;
  EXPECT_VALUE_ERROR(run({1, e62, 1, 1}, 12), "dims.max_work");                         // D3
  EXPECT_VALUE_ERROR(run({1, 8, int64_t(1) << 61, 8}, 48), "dims.max_qo_len");        // D4
  EXPECT_VALUE_ERROR(run({e62 + (int64_t(1) << 40), e62 + (int64_t(1) << 40), 1, 1}, 12), "dims.max_batch");  // D5
  const int64_t cap = int64_t(1) << 28;
  EXPECT_VALUE_ERROR(run({cap, cap, 2147483647, cap}, 12), "dims: the workspace");
  for (uint16_t v : out) CHECK(v == 0x7777);
  for (float v : lse) CHECK(v == 42.f);
  for (unsigned char v : ws) CHECK(v == 0);

  CHECK(mlacore_plan_schedule_size(I64MAX, I64MAX) == -1);

  // D10: -1, not a wrapped value, when the byte count leaves int64.
  CHECK(mlacore_mla_decode_workspace_bytes({1, 1, int64_t(1) << 61, 1}, 128) == -1);
  CHECK(mlacore_mla_decode_workspace_bytes({1, cap, 2147483647, cap}, 128) == -1);
  CHECK(mlacore_mla_decode_workspace_bytes({1, 1, I64MAX, 1}, 1) == -1);
  CHECK(mlacore_mla_decode_workspace_bytes({1, 1, 1, 1}, 1) == 513 * 4);
}

// D6: a non-empty tensor with data == NULL; an empty one may have it.
void null_data() {
  int64_t cu[2] = {0, 0}, out[2] = {-5, -5};
  T table(nullptr, kI64, {1, 1}), tcu(cu, kI64, {2}), tout(out, kI64, {2});
  EXPECT_VALUE_ERROR(mlacore_page_indices_from_block_table(table.p(), tcu.p(), tout.p(), nullptr), "block_table");
  CHECK_CONTAINS(mlacore_last_error(), "NULL");
  T empty(nullptr, kI64, {1, 0});
  CHECK(mlacore_page_indices_from_block_table(empty.p(), tcu.p(), tout.p(), nullptr) == MLACORE_OK);
  T null_out(nullptr, kI64, {2});
  EXPECT_VALUE_ERROR(mlacore_page_indices_from_block_table(empty.p(), tcu.p(), null_out.p(), nullptr), "out");
  CHECK(out[0] == -5 && out[1] == -5);
}

// Strides whose byte span leaves int64 (no memory behind them either way).
void huge_strides() {
  int64_t v[2] = {0, 1}, out[2] = {-5, -5};
  T bi(v, kI64, {2}, {I64MAX / 4}), pos(v, kI64, {2}), idx(v, kI64, {2}), ptr(v, kI64, {2}), tout(out, kI64, {2});
  EXPECT_VALUE_ERROR(mlacore_slot_mapping(bi.p(), pos.p(), idx.p(), ptr.p(), 4, -1, tout.p(), nullptr), "batch_indices");
  T many(v, kI64, {I64MAX / 2, 4}, {0, 0});
  EXPECT_VALUE_ERROR(mlacore_slot_mapping(many.p(), pos.p(), idx.p(), ptr.p(), 4, -1, tout.p(), nullptr),
                     "batch_indices");
  CHECK(out[0] == -5 && out[1] == -5);
}

// U2: an int32 index tensor at an odd address.
void misaligned() {
  alignas(8) unsigned char raw[64] = {};
  int64_t out[4] = {-5, -5, -5, -5}, ptr[2] = {0, 1}, idx = 0;
  T bi(raw + 1, kI32, {4}), pos(raw + 1, kI32, {4}), tidx(&idx, kI64, {1}), tptr(ptr, kI64, {2}), tout(out, kI64, {4});
  EXPECT_VALUE_ERROR(mlacore_slot_mapping(bi.p(), pos.p(), tidx.p(), tptr.p(), 4, -1, tout.p(), nullptr),
                     "batch_indices");
  CHECK_CONTAINS(mlacore_last_error(), "aligned");
  for (int64_t v : out) CHECK(v == -5);
}

// U1: a plan at int32 extremes (qo_len = kv_len = page_size = 2^31-1) runs
// without signed overflow (UBSan checks), and more heads than the decode
// kernels take are refused.
void plan_extremes() {
  const int64_t n = 2147483647;
  for (int32_t sms : {1, 7, 132, 1024}) {
    for (int64_t max_batch : {1, 2}) {
      mlacore_plan* plan = nullptr;
      CHECK(mlacore_plan_create(max_batch, 0, sms, &plan) == MLACORE_OK);
      // One request of 2^31-1 query and KV tokens in one page of 2^31-1, or
      // the query tokens split over two requests with a full KV each.
      int64_t qo[3] = {0, max_batch == 1 ? n : n / 2, n}, kv[3] = {0, 1, 2}, len[2] = {n, n};
      T tqo(qo, kI64, {max_batch + 1}), tkv(kv, kI64, {max_batch + 1}), tlen(len, kI64, {max_batch});
      const int64_t total = mlacore_plan_schedule_size(max_batch, mlacore_plan_default_max_work(max_batch, sms));
      CHECK(total > 0);
      std::vector<int32_t> md(size_t(total), 0);
      T tmd(md.data(), kI32, {total});
      CHECK(mlacore_plan_build(plan, tqo.p(), tkv.p(), tlen.p(), int32_t(n), 128, tmd.p(), nullptr) == MLACORE_OK);
      CHECK(md[4] == n && md[7] == 0);  // header: max_kv_len, no error
      EXPECT_VALUE_ERROR(mlacore_plan_build(plan, tqo.p(), tkv.p(), tlen.p(), int32_t(n), 129, tmd.p(), nullptr),
                         "num_heads");
      mlacore_plan_destroy(plan);
    }
  }
}

}  // namespace

int main() {
  appends();
  block_table();
  decode_dims();
  null_data();
  huge_strides();
  misaligned();
  plan_extremes();
  return finish("test_hostile_sizes");
}
