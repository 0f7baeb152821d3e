// MLA decode with wgmma (sm_90a) in FlashMLA's pair structure, the "seesaw",
// for 64-row query tiles over caches whose page size is a multiple of 64.
// KV tiles go in pairs, tile b in stage 0 and b + 1 in stage 1. Warpgroup 0
// computes S = Q K^T, the softmax and P for tile b; warpgroup 1 for tile
// b + 1, after warpgroup 0 (the row maximum is shared, in sM). O's columns
// are halved between them as in mla_decode_sm90.cu: each multiplies its own
// P (registers) by its half of V of its own tile, and the other's P (shared
// memory) by its half of V of the other tile. A stage arrives as nine
// 64 x 64 TMA boxes with an mbarrier each; the warpgroup that has just freed
// a half of a stage refills it (the rope box, which no product reads, as soon
// as the tile's S is done), and the next S runs box by box in the order of
// the refills. Each warpgroup publishes its row maxima before it
// exponentiates: it reads its maxima and factors back from shared memory
// after the arrival, so ptxas cannot schedule the arrival after that work,
// and the other's softmax waits for the maxima alone. Same
// contract, schedule, epilogue and combine as the wgmma kernel. Design:
// docs/design/2026-12-03-decode-seesaw.md; the barrier protocol is
// research/decode/seesaw_model.py's, whose op lists the loops below follow
// (change both together).
// The launcher (mla_decode_launch.cu) selects it by shape (requests of 256
// rows or more, or of 128 on devices of high DRAM bandwidth an SM, in
// batches of two or more), or for every shape with MLACORE_DECODE_KERNEL=seesaw.
#include "gpu/compat.h"

#include <cstdint>
#include <type_traits>

#include "plan/schedule.h"
#include "gpu/tma_map.h"
#include "gpu/tma_sm90.cuh"
#include "gpu/wgmma_sm90.cuh"
#include "decode/mla_decode.h"
#include "decode/mla_decode_device.cuh"
#include "decode/mla_decode_seesaw.h"
#include "decode/mla_decode_sm90.h"
#include "decode/mla_decode_sm90_steps.cuh"
#include "decode/decode_timeline.cuh"

namespace mlacore {
namespace {

namespace wg = wgmma;

constexpr int kThreads = 256;
constexpr int kRows = kDecodeTileRows;
constexpr int kTok = kDecodeTileTokens;
constexpr int kBlocks = kQkDim / 64;               // 64-column boxes of a tile (the ninth: kpe)
constexpr int kLeft = kCkvDim / 2 / 64;            // boxes of V's left half: warpgroup 0's columns of O
constexpr int kBlockBytes = 64 * 128;
// compute_s's box ranges (start, count, modulus): boxes start, start + 1, ...
// modulo the modulus.
using Box0 = std::integral_constant<int, 0>;
using BoxRight = std::integral_constant<int, kLeft>;       // V's right half: warpgroup 1's columns of O
using BoxRope = std::integral_constant<int, kBlocks - 1>;  // the kpe box
using OneBox = std::integral_constant<int, 1>;
using AllBoxes = std::integral_constant<int, kBlocks>;
// From BoxRope modulo kBlocks: the rope box, then V's left half.
using RopeAndLeft = std::integral_constant<int, kLeft + 1>;
using VBoxes = std::integral_constant<int, kBlocks - 1>;     // V's boxes: as a modulus, skips the rope box
using RightV = std::integral_constant<int, kBlocks - 1 - kLeft>;
using Fresh = std::true_type;         // compute_s: a new tile's S (its first k-step does not read S)
using Accumulate = std::false_type;   // compute_s: S so far plus more boxes
constexpr int kTileBytes = kBlocks * kBlockBytes;  // Q, or one KV stage
// Named barriers: one side arrives, the other waits (ids 1..4); 5 and 6 are
// the warpgroups' own (128 threads).
constexpr int kBarScale0 = 1;  // 0 -> 1: sM and sScale0 of tile b written
constexpr int kBarScale1 = 2;  // 1 -> 0: sM and sScale1 of tile b + 1 written
constexpr int kBarP0 = 3;      // 0 -> 1: sP0 written
constexpr int kBarO1 = 4;      // 1 -> 0: sP1 written and warpgroup 1's product with sP0 issued
constexpr int kBarOwn = 5;     // + warpgroup: its 128 threads
// The four hand-offs (ids 1..4) as mbarriers (racecheck builds, meson
// -Dracecheck_barriers=true), one phase a pair, or as named barriers the
// arriving side enters with bar.arrive, which racecheck does not model.
constexpr bool kHandoffMbarriers =
#if defined(MLACORE_RACECHECK_BARRIERS)
    true;
#else
    false;
#endif
// Shared memory, bytes from a 1024-aligned base.
constexpr int kOffQ = 0;
constexpr int kOffP1 = kOffQ + (kBlocks - 1) * kBlockBytes;  // Q's rope block, held in registers
constexpr int kOffK = kOffQ + kTileBytes;                   // stage s at kOffK + s * kTileBytes
constexpr int kOffP0 = kOffK + 2 * kTileBytes;
constexpr int kOffM = kOffP0 + kBlockBytes;     // float[kRows]: the running row maximum (base 2)
constexpr int kOffScale0 = kOffM + kRows * 4;   // float[kRows]: tile b's rescale factor
constexpr int kOffScale1 = kOffScale0 + kRows * 4;
constexpr int kOffSum = kOffScale1 + kRows * 4;  // float[2][kRows]: each warpgroup's row sums
constexpr int kOffBar = kOffSum + 2 * kRows * 4;  // uint64[2][kBlocks]: a box's mbarrier
constexpr int kOffHand = kOffBar + 2 * kBlocks * 8;  // uint64[4]: the hand-offs' mbarriers (racecheck builds)
constexpr int kSmemUsed = kOffHand + 4 * 8;
constexpr int kSmem = kSmemUsed + 1024;
static_assert(kSmem <= 232448, "over the H100/H200 opt-in shared memory per block (227 KB)");
static_assert(kRows == 64 && kTok == 64, "one m64 wgmma row tile, 64-token tiles");
static_assert(kOffK % 1024 == 0 && kOffP0 % 1024 == 0 && kOffP1 % 1024 == 0, "swizzle atoms on 1 KB");
static_assert(kOffBar % 8 == 0, "mbarriers are 8-byte aligned");
static_assert(kRows * kCkvDim * 4 <= 2 * kTileBytes, "the fp32 O tile fits the two stages");

// The page of a tile as its raw page-table entry (-1 past the request's
// pages) and the tile's first row in the page. The entry is checked only
// where it is used (page_box, page_valid), so its load's latency is paid
// there, hundreds of instructions after it was issued, not at once.
template <class Idx>
struct TilePage {
  Idx raw;
  int32_t off;
};

template <bool kBf16, class Idx>
__global__ void __launch_bounds__(kThreads, 1)
    mla_decode_seesaw_kernel(const __grid_constant__ DecodeParams<Idx> p, const __grid_constant__ CUtensorMap ckv_map,
                             const __grid_constant__ CUtensorMap kpe_map) {
#if defined(MLACORE_WGMMA_ENABLED)
  constexpr int kOCols = kCkvDim / 2;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  const uint32_t s_base = smem_addr(smem);
  const uint32_t s_q = s_base + kOffQ, s_p0 = s_base + kOffP0, s_p1 = s_base + kOffP1;
  float* s_m = reinterpret_cast<float*>(smem + kOffM);
  float* s_scale0 = reinterpret_cast<float*>(smem + kOffScale0);
  float* s_scale1 = reinterpret_cast<float*>(smem + kOffScale1);
  float* s_sum = reinterpret_cast<float*>(smem + kOffSum);
  // Tile indices are int: a work item spans at most INT32_MAX positions.
  auto stage = [s_base](int t) { return s_base + kOffK + static_cast<uint32_t>(t & 1) * kTileBytes; };
  auto box_bar = [s_base](int t, int j) {
    return s_base + kOffBar + 8 * (static_cast<uint32_t>(t & 1) * kBlocks + j);
  };
  // A hand-off of pair b (one side arrives, the other waits; ids 1..4).
  auto hand_arrive = [s_base](int id) {
    if constexpr (kHandoffMbarriers) wg::mbar_arrive(s_base + kOffHand + 8 * (id - 1));
    else wg::bar_arrive(id, kThreads);
  };
  auto hand_wait = [s_base](int id, int b) {
    const uint32_t parity = static_cast<uint32_t>((b >> 1) & 1);
    if constexpr (kHandoffMbarriers) wg::mbar_wait(s_base + kOffHand + 8 * (id - 1), parity);
    else wg::bar_sync(id, kThreads);
  };

  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  const int H = p.num_heads;
  const int64_t rows_cap = decode_partial_rows(p.max_qo_len, H);
  const CtaCoord cta = cta_coord(decode_query_tiles(rows_cap, kRows));
  const ItemView item = read_item(p, cta.item);
  if (!item.ok) return;
  const int64_t rows = item.qo_len * H;
  const int64_t row0 = cta.tile * kRows;
  if (row0 >= rows) return;

  const int tid = threadIdx.x, g = tid >> 7, wtid = tid & 127, lane = tid & 31;
  const bool leader = wtid == 0;  // issues its warpgroup's box loads and byte-count arrivals
  // Positions are < item.end <= INT32_MAX, so tile t starts at the 32-bit
  // position begin32 + 64 t, and the launcher keeps page sizes and page
  // counts below 2^31.
  const int n_tiles = item.end > item.begin ? static_cast<int>((item.end - item.begin + kTok - 1) / kTok) : 0;
  const uint32_t begin32 = static_cast<uint32_t>(item.begin);
  const uint32_t page_size = static_cast<uint32_t>(p.pages.page_size);
  const bool page_pow2 = (page_size & (page_size - 1)) == 0;
  const int page_shift = __ffs(static_cast<int>(page_size)) - 1;
  // A request's slots past 2^31 are past every position's page.
  const uint32_t req_pages = static_cast<uint32_t>(
      item.page_end - item.page_begin < 0x7fffffff ? item.page_end - item.page_begin : 0x7fffffff);
  const Idx* req_ids = p.pages.indices + item.page_begin * p.pages.indices_stride;
  const int64_t id_stride = p.pages.indices_stride;
  const int32_t num_pages = static_cast<int32_t>(p.pages.num_pages);  // in [1, 2^31 - 2] (the launcher)

  // ---- steps ----
  // tile_page: the page-table entry of tile t (t < n_tiles), loaded, not yet read.
  auto tile_page = [&](int t) {
    const uint32_t pos = begin32 + static_cast<uint32_t>(t) * kTok;
    const uint32_t in_req = page_pow2 ? pos >> page_shift : pos / page_size;
    TilePage<Idx> tp;
    tp.off = static_cast<int32_t>(pos - in_req * page_size);
    tp.raw = in_req < req_pages ? req_ids[in_req * id_stride] : Idx(-1);
    return tp;
  };
  auto page_valid = [&](const TilePage<Idx>& tp) {
    return tp.raw >= 0 && tp.raw < static_cast<Idx>(num_pages);
  };
  // The box coordinate of the page: an invalid id becomes the out-of-bounds
  // page `num_pages` (a box of zeros; its tokens are masked).
  auto page_box = [&](const TilePage<Idx>& tp) {
    return page_valid(tp) ? static_cast<int32_t>(tp.raw) : num_pages;
  };
  // load_kv: boxes [lo, hi) of tile t into its stage (the leader alone; lo
  // and hi are std::integral_constant, so the loop unrolls).
  auto load_kv = [&](int t, const TilePage<Idx>& tp, auto lo_c, auto hi_c) {
    constexpr int lo = decltype(lo_c)::value, hi = decltype(hi_c)::value;
    if (!leader) return;
    const int32_t page = page_box(tp);
#pragma unroll 1
    for (int j = lo; j < hi; ++j) {
      const uint32_t dst = stage(t) + j * kBlockBytes;
      if (j < kBlocks - 1) tma::load_3d(dst, &ckv_map, 64 * j, tp.off, page, box_bar(t, j));
      else tma::load_3d(dst, &kpe_map, 0, tp.off, page, box_bar(t, j));
    }
  };
  // compute_s: S += Q K^T over `count` boxes of tile t from box `start` on
  // (modulo `mod`), each box waited for (the leader first arrives with its
  // byte count) before its four k-steps; Q's rope block comes from
  // registers. One commit group. (start, count and mod are
  // std::integral_constant: the loop unrolls, and q_rope stays in registers.)
  // With Fresh, the first k-step writes S without reading it: a new tile's S,
  // with no zeroing of the accumulators first.
  const uint64_t desc_q = wg::desc_k_sw128(s_q);
  uint32_t q_rope[16];
  auto compute_s = [&](float(&s)[kTok / 2], int t, auto start_c, auto count_c, auto mod_c, auto fresh_c) {
    constexpr int start = decltype(start_c)::value, count = decltype(count_c)::value;
    constexpr int mod = decltype(mod_c)::value;
    constexpr bool fresh = decltype(fresh_c)::value;
    const uint64_t desc_k = wg::desc_k_sw128(stage(t));
    const uint32_t parity = static_cast<uint32_t>((t >> 1) & 1);
    wg::fence_regs(s);
#pragma unroll
    for (int i = 0; i < count; ++i) {
      const int j = (start + i) % mod;
      if (leader) tma::arrive_expect_tx(box_bar(t, j), kBlockBytes);
      wg::mbar_wait(box_bar(t, j), parity);
      // A wgmma.fence of its own after the wait, on every path: without it
      // ptxas inserts one on the wait loop's path and serializes every wgmma.
      wg::fence();
#pragma unroll
      for (int kk = 4 * j; kk < 4 * j + 4; ++kk) {
        const uint32_t off = wg::k_major_step(kk, kRows);  // Q and the stage both have 64 rows
        const bool first = fresh && i == 0 && kk == 4 * j;
        if (j < kBlocks - 1) {
          if (first) wg::mma_m64n64k16_ss_first<kBf16>(s, wg::desc_at(desc_q, off), wg::desc_at(desc_k, off));
          else wg::mma_m64n64k16_ss<kBf16>(s, wg::desc_at(desc_q, off), wg::desc_at(desc_k, off));
        } else {
          if (first) wg::mma_m64n64k16_rs_first<kBf16>(s, q_rope + 4 * (kk - 4 * j), wg::desc_at(desc_k, off));
          else wg::mma_m64n64k16_rs<kBf16>(s, q_rope + 4 * (kk - 4 * j), wg::desc_at(desc_k, off));
        }
      }
    }
    wg::commit();
  };
  // The two rows (of the 64) this thread holds in every accumulator, and the
  // first KV position each may not see.
  const int r_lo = wg::acc_row(wtid, 0);
  int64_t limit[2];
  row_limits(p, item, row0, rows, r_lo, limit);
  // publish_max: mask tile t's scores, the new row maxima (scaled) to sM
  // and the factor from the old ones to s_scale (all the other warpgroup
  // waits for), l *= alpha; m_use is what exponentiate subtracts.
  auto publish_max = [&](float(&s)[kTok / 2], int t, bool valid, bool whole, float* s_scale, float(&alpha)[2],
                         float(&l)[2], float(&m_use)[2]) {
    // whole: the caller knows every row sees all of tile t (a steady pair).
    int lim[2] = {kTok, kTok};
    if (!(whole && valid)) {
      const int64_t ts = item.begin + static_cast<int64_t>(t) * kTok;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int64_t d = valid ? limit[i] - ts : 0;
        lim[i] = d < 0 ? 0 : (d > kTok ? kTok : static_cast<int>(d));
      }
    }
    // Each row's maximum in two chains of 8.
    float mx2[2][2] = {{-INFINITY, -INFINITY}, {-INFINITY, -INFINITY}};
    if (__all_sync(0xffffffffu, lim[0] == kTok && lim[1] == kTok)) {
#pragma unroll
      for (int e = 0; e < kTok / 2; ++e) mx2[(e >> 1) & 1][(e >> 2) & 1] = fmaxf(mx2[(e >> 1) & 1][(e >> 2) & 1], s[e]);
    } else {
#pragma unroll
      for (int e = 0; e < kTok / 2; ++e) {
        const int i = (e >> 1) & 1;
        s[e] = wg::acc_col(wtid, e) < lim[i] ? s[e] : -INFINITY;
        mx2[i][(e >> 2) & 1] = fmaxf(mx2[i][(e >> 2) & 1], s[e]);
      }
    }
    float mx[2] = {fmaxf(mx2[0][0], mx2[0][1]), fmaxf(mx2[1][0], mx2[1][1])};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2)) * p.scale_log2;  // > 0: the launcher checks
      const float m_old = s_m[r_lo + 8 * i];
      const float m_new = fmaxf(m_old, mx[i]);
      // A row that has seen nothing valid keeps -inf; exponentiate against 0, no inf - inf.
      m_use[i] = m_new == -INFINITY ? 0.f : m_new;
      alpha[i] = m_old == m_new ? 1.f : fast_exp2(m_old - m_new);
      l[i] *= alpha[i];
      mx[i] = m_new;
    }
    __syncwarp();  // the warp's rows are its own: every lane has read sM before it changes
    if ((lane & 3) == 0) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        s_m[r_lo + 8 * i] = mx[i];
        s_scale[r_lo + 8 * i] = alpha[i];
      }
    }
  };
  // exponentiate: s becomes P (base 2, against the new maxima; the scale
  // rides in the exponent's multiply-add), l += its row sums (this thread's
  // 16 values a row, in two chains of 8).
  auto exponentiate = [&](float(&s)[kTok / 2], const float(&m_use)[2], float(&l)[2]) {
    const float neg_m[2] = {-m_use[0], -m_use[1]};
    float sum[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
#pragma unroll
    for (int e = 0; e < kTok / 2; ++e) {
      const int i = (e >> 1) & 1;
      s[e] = fast_exp2(fmaf(s[e], p.scale_log2, neg_m[i]));
      sum[i][(e >> 2) & 1] += s[e];
    }
    l[0] += sum[0][0] + sum[0][1];
    l[1] += sum[1][0] + sum[1][1];
  };
  // zero_v: the rows of tile t past the item, in boxes [lo, hi), zeroed (a
  // page's rows past the request are stale, and NaN there would survive a
  // zero probability); then published to this warpgroup's wgmma.
  auto zero_v = [&](int t, int lo, int hi) {
    const int64_t left = item.end - (item.begin + static_cast<int64_t>(t) * kTok);
    if (left >= kTok) return;
    const int first = left < 0 ? 0 : static_cast<int>(left);
    const int per_row = (hi - lo) * 8;
    for (int idx = wtid; idx < (kTok - first) * per_row; idx += 128) {
      const int r = first + idx / per_row, j = lo + (idx % per_row) / 8, c = idx % 8;
      asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" ::"r"(stage(t) + j * kBlockBytes + wg::sw128(r, c)),
                   "r"(0u)
                   : "memory");
    }
    wg::fence_proxy_async();
    wg::bar_sync(kBarOwn + g, 128);
  };
  // O's products over 16-token k-steps: P from registers, or P from shared
  // memory, times this warpgroup's half of V in tile t's stage. Commit each.
  const uint64_t desc_p[2] = {wg::desc_k_sw128(s_p0), wg::desc_k_sw128(s_p1)};
  auto v_desc = [&](int t) { return wg::desc_mn_sw128(stage(t) + g * kLeft * kBlockBytes, kBlockBytes); };
  float o[kOCols / 2];
  uint32_t pk[kTok / 4];  // this warpgroup's P as the register A operand
  auto product_own = [&](int t) {
    wg::fence_regs(o);
    wg::fence_regs(pk);
    wg::fence();
    const uint64_t dv = v_desc(t);
#pragma unroll
    for (int kt = 0; kt < kTok / 16; ++kt)
      wg::mma_m64n256k16_rs_tb<kBf16>(o, pk + 4 * kt, wg::desc_at(dv, wg::mn_major_step(kt)));
    wg::commit();
  };
  auto product_other = [&](int t, int which_p) {
    wg::fence_regs(o);
    wg::fence();
    const uint64_t dv = v_desc(t);
#pragma unroll
    for (int kt = 0; kt < kTok / 16; ++kt)
      wg::mma_m64n256k16_ss_tb<kBf16>(o, wg::desc_at(desc_p[which_p], wg::k_major_step(kt, kRows)),
                                      wg::desc_at(dv, wg::mn_major_step(kt)));
    wg::commit();
  };
  // After a Scale hand-off: this warpgroup's own row maxima (quad leaders
  // park them in its half of sSum, free until the epilogue) and factors
  // read back from shared memory, so the exponentials and the O rescale wait
  // for loads behind the arrival and ptxas cannot sink the arrival below
  // them: the other warpgroup gets the maxima first.
  float* s_mine = s_sum + g * kRows;
  auto park = [&](const float (&m_use)[2]) {
    if ((lane & 3) == 0) {
      s_mine[r_lo] = m_use[0];
      s_mine[r_lo + 8] = m_use[1];
    }
  };
  auto reload = [&](float (&m_use)[2], float (&alpha)[2], const float* s_scale) {
    __syncwarp();
    m_use[0] = s_mine[r_lo];
    m_use[1] = s_mine[r_lo + 8];
    alpha[0] = s_scale[r_lo];
    alpha[1] = s_scale[r_lo + 8];
  };
  auto rescale_o = [&](float a0, float a1) {
#pragma unroll
    for (int j = 0; j < kOCols / 8; ++j) {
      o[4 * j] *= a0;
      o[4 * j + 1] *= a0;
      o[4 * j + 2] *= a1;
      o[4 * j + 3] *= a1;
    }
  };
  // store_p: P as the A operand (pk's layout) into the shared block at
  // `block`, published by the caller's barrier.
  auto store_p = [&](const uint32_t(&a)[kTok / 4], uint32_t block) {
    wg::store_a_block(block, wtid, a);
    wg::fence_proxy_async();
  };

  // ---- prologue ----
  // The first two tiles' page ids are loaded before Q, and their KV is on
  // its way before Q is waited for: the chain to tile 0 (work item, kv_indptr,
  // page ids, KV) overlaps Q's load instead of following it.
  TilePage<Idx> own = tile_page(g);  // the page of this warpgroup's first tile (0 or 1)
  TilePage<Idx> second = own;
  if (tid == 0 && n_tiles > 1) second = tile_page(1);
  load_q(p, item, row0, rows, s_q, tid);
  cp_async_commit();
  if (tid == 0) {  // warpgroup 0's leader: the mbarriers, then the first two tiles
    for (int j = 0; j < 2 * kBlocks; ++j) wg::mbar_init(s_base + kOffBar + 8 * j, 1);
    if (kHandoffMbarriers)
      for (int j = 0; j < 4; ++j) wg::mbar_init(s_base + kOffHand + 8 * j, kThreads / 2);
    tma::fence_barrier_init();
    if (n_tiles > 0) {
      load_kv(0, own, Box0{}, AllBoxes{});
      if (n_tiles > 1) {
        load_kv(1, second, BoxRight{}, AllBoxes{});
        load_kv(1, second, Box0{}, BoxRight{});
      }
    }
  }
  if (tid < kRows) s_m[tid] = -INFINITY;
  cp_async_wait_all();
  wg::fence_proxy_async();
  __syncthreads();  // the mbarriers, Q and sM
  wg::load_a_block(s_q + (kBlocks - 1) * kBlockBytes, wtid, q_rope);
#pragma unroll
  for (int e = 0; e < kOCols / 2; ++e) o[e] = 0.f;
  float s[kTok / 2], l[2] = {0.f, 0.f}, alpha[2], other[2], m_use[2];
  if (g < n_tiles) {
    if (g == 0) {
      compute_s(s, 0, Box0{}, AllBoxes{}, AllBoxes{}, Fresh{});
    } else {
      compute_s(s, 1, BoxRight{}, AllBoxes{}, AllBoxes{}, Fresh{});  // the right half first, as it was loaded
    }
    wg::wait<0>();
    wg::fence_regs(s);
  }

  // ---- pairs of tiles ----
  // pair(b, steady): tiles b (warpgroup 0) and b + 1 (warpgroup 1). A steady
  // pair is one where tiles b .. b + 3 exist and every row of this CTA sees
  // tiles b and b + 1 whole: one test a pair instead of the tile-count and
  // zero-fill tests. The steady pairs run in a loop of their own, compiled
  // without the tests and spill-free; the last pairs in a second loop, which
  // keeps them (and spills: 255 registers). FlashMLA splits its loop alike.
  auto pair = [&](int b, bool steady) {
    const bool has1 = steady || b + 1 < n_tiles, has2 = steady || b + 2 < n_tiles, has3 = steady || b + 3 < n_tiles;
    // The page ids of the next pair, loaded now: both warpgroups refill
    // halves of both of its tiles, and the index loads' latency hides behind
    // this pair's softmax and products instead of sitting in front of a refill.
    [[maybe_unused]] const int pi = b >> 1;  // the pair's index, for the pair marks (attribution builds)
    MLACORE_PAIR_MARK(pi, 10 * g, leader);
    TilePage<Idx> next2 = own, next3 = own;
    if (has2) next2 = tile_page(b + 2);
    if (has3) next3 = tile_page(b + 3);
    if (g == 0) {
      // -------- warpgroup 0: tile b --------
      // The rope box of tile b's stage is free once S(b) is: tile b + 2's goes out first.
      if (has2) load_kv(b + 2, next2, BoxRope{}, AllBoxes{});
      publish_max(s, b, page_valid(own), steady, s_scale0, alpha, l, m_use);
      park(m_use);
      hand_arrive(kBarScale0);
      MLACORE_PAIR_MARK(pi, 1, leader);
      reload(m_use, alpha, s_scale0);
      exponentiate(s, m_use, l);
      rescale_o(alpha[0], alpha[1]);
      wg::acc_to_a<kBf16>(s, pk);
      if (!steady) zero_v(b, 0, kLeft);
      product_own(b);
      MLACORE_PAIR_MARK(pi, 2, leader);
      wg::wait<0>();
      wg::fence_regs(o);
      wg::fence_regs(pk);
      hand_wait(kBarScale1, b);
      MLACORE_PAIR_MARK(pi, 3, leader);
      if (has2) load_kv(b + 2, next2, Box0{}, BoxRight{});
      other[0] = s_scale1[r_lo];
      other[1] = s_scale1[r_lo + 8];
      // P of tile b against tile b + 1's maxima, packed into pk (free: the
      // product that read it is complete).
#pragma unroll
      for (int i = 0; i < kTok / 4; ++i)
        pk[i] = pack2<kBf16>(s[2 * i] * other[i & 1], s[2 * i + 1] * other[i & 1]);
      store_p(pk, s_p0);
      hand_arrive(kBarP0);
      MLACORE_PAIR_MARK(pi, 4, leader);
      l[0] *= other[0];
      l[1] *= other[1];
      if (has1) {
        hand_wait(kBarO1, b);
        MLACORE_PAIR_MARK(pi, 5, leader);
        if (!steady) zero_v(b + 1, 0, kLeft);
        // sScale1 read again after O1, not taken from `other`: the rescale's
        // 128 multiplies then wait for a load behind this barrier, so ptxas
        // cannot hoist them ahead of the P0 arrival that warpgroup 1 waits
        // for (FlashMLA reads it here too).
        rescale_o(s_scale1[r_lo], s_scale1[r_lo + 8]);
        product_other(b + 1, 1);
      }
      if (has2) compute_s(s, b + 2, BoxRope{}, RopeAndLeft{}, AllBoxes{}, Fresh{});
      MLACORE_PAIR_MARK(pi, 6, leader);
      if (has3) {
        wg::wait<1>();  // the product with sP1, not the S just issued
        wg::fence_regs(o);
        load_kv(b + 3, next3, Box0{}, BoxRight{});
      }
      MLACORE_PAIR_MARK(pi, 7, leader);
      if (has2) compute_s(s, b + 2, BoxRight{}, RightV{}, AllBoxes{}, Accumulate{});
      MLACORE_PAIR_MARK(pi, 8, leader);
      wg::wait<0>();
      wg::fence_regs(o);
      wg::fence_regs(s);
      MLACORE_PAIR_MARK(pi, 9, leader);
      own = next2;
    } else {
      // -------- warpgroup 1: tile b + 1 --------
      if (has3) load_kv(b + 3, next3, BoxRope{}, AllBoxes{});  // as warpgroup 0's above
      hand_wait(kBarScale0, b);
      MLACORE_PAIR_MARK(pi, 11, leader);
      other[0] = s_scale0[r_lo];
      other[1] = s_scale0[r_lo + 8];
      l[0] *= other[0];
      l[1] *= other[1];
      if (has1) {
        // Nothing is in flight here; the wait tells ptxas so (without it,
        // C7515: it serializes every wgmma of the kernel).
        wg::wait<0>();
        wg::fence_regs(s);
        publish_max(s, b + 1, page_valid(own), steady, s_scale1, alpha, l, m_use);
        park(m_use);
        hand_arrive(kBarScale1);
        MLACORE_PAIR_MARK(pi, 12, leader);
        reload(m_use, alpha, s_scale1);
        exponentiate(s, m_use, l);
      } else {  // no tile b + 1: the maxima stay
        alpha[0] = alpha[1] = 1.f;
        if ((lane & 3) == 0) s_scale1[r_lo] = s_scale1[r_lo + 8] = 1.f;
        hand_arrive(kBarScale1);
      }
      rescale_o(other[0] * alpha[0], other[1] * alpha[1]);
      if (has1) {
        wg::acc_to_a<kBf16>(s, pk);
        store_p(pk, s_p1);
        if (!steady) zero_v(b + 1, kLeft, 2 * kLeft);
        product_own(b + 1);
      }
      MLACORE_PAIR_MARK(pi, 13, leader);
      hand_wait(kBarP0, b);
      MLACORE_PAIR_MARK(pi, 14, leader);
      if (!steady) zero_v(b, kLeft, 2 * kLeft);
      product_other(b, 0);
      if (has1) hand_arrive(kBarO1);
      MLACORE_PAIR_MARK(pi, 15, leader);
      if (has3) {
        wg::wait<1>();  // the product with this warpgroup's P (the other one still accumulates into o)
        wg::fence_regs(pk);
        load_kv(b + 3, next3, BoxRight{}, BoxRope{});
      }
      MLACORE_PAIR_MARK(pi, 16, leader);
      wg::wait<0>();
      wg::fence_regs(o);
      if (has2) load_kv(b + 2, next2, BoxRight{}, BoxRope{});
      MLACORE_PAIR_MARK(pi, 17, leader);
      if (has3) {
        compute_s(s, b + 3, BoxRope{}, OneBox{}, AllBoxes{}, Fresh{});
        compute_s(s, b + 3, BoxRight{}, VBoxes{}, VBoxes{}, Accumulate{});  // its own right half was refilled first
      }
      MLACORE_PAIR_MARK(pi, 18, leader);
      wg::wait<0>();
      wg::fence_regs(o);
      wg::fence_regs(pk);
      wg::fence_regs(s);
      MLACORE_PAIR_MARK(pi, 19, leader);
      own = next3;
    }
  };
  // Tiles every row of the CTA sees whole: below the smallest row limit (a
  // causal bound grows with the row's query token, so the first real row's
  // is the smallest; rows past the request are never stored).
  int64_t min_limit = item.kv_len;
  if (p.causal) min_limit = item.kv_len - item.qo_len + row0 / H + 1;
  min_limit = min_limit < item.end ? min_limit : item.end;
  const int64_t seen = min_limit > item.begin ? (min_limit - item.begin) / kTok : 0;
  const int whole_tiles = static_cast<int>(seen < n_tiles ? seen : n_tiles);
  int b = 0;
  for (; b + 4 <= n_tiles && b + 2 <= whole_tiles; b += 2) pair(b, true);
  for (; b < n_tiles; b += 2) pair(b, false);

  // ---- row sums of both warpgroups, then O ----
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
  __syncwarp();  // every lane has read its parked maxima (reload) before the sums take their place
  if ((lane & 3) == 0) {
    s_sum[g * kRows + r_lo] = l[0];
    s_sum[g * kRows + r_lo + 8] = l[1];
  }
  __syncthreads();
  if (tid < kRows) s_sum[tid] += s_sum[kRows + tid];
  const float m_row[2] = {s_m[r_lo], s_m[r_lo + 8]};
  __syncthreads();
  store_o_tile<kBf16>(p, item, row0, rows, rows_cap, reinterpret_cast<float*>(smem + kOffK), s_sum, m_row, o, tid);
#else
  // Compiled for a target without wgmma: the launcher never launches it.
  (void)p;
  (void)ckv_map;
  (void)kpe_map;
#if defined(__CUDA_ARCH__)
  __trap();
#endif
#endif  // MLACORE_WGMMA_ENABLED
}

template <bool kBf16, class Idx>
bool launch_typed(const DecodeParams<Idx>& p, gpuStream_t stream) {
  const int64_t page_size = p.pages.page_size, pages = p.pages.num_pages;
  if (page_size < kTok || page_size % kTok != 0 || page_size > (int64_t{1} << 30)) return false;
  if (pages < 1 || pages > 0x7ffffffe) return false;  // box coordinates are int32, `pages` itself the zero page
  if (!(p.scale_log2 > 0.f)) return false;  // the row maxima are taken before scaling
  auto kernel = mla_decode_seesaw_kernel<kBf16, Idx>;
  if (!sm90a_kernel_runs(kernel, p.device, kSmem)) return false;
  // Element strides -> bytes (16-bit elements); the encoder refuses what TMA cannot read.
  CUtensorMap ckv_map, kpe_map;
  if (!tma::encode_kv_map(&ckv_map, p.ckv, kBf16, kCkvDim, page_size, pages, 2 * p.ckv_stride_tok,
                          2 * p.ckv_stride_page) ||
      !tma::encode_kv_map(&kpe_map, p.kpe, kBf16, kKpeDim, page_size, pages, 2 * p.kpe_stride_tok,
                          2 * p.kpe_stride_page))
    return false;
  gpu::check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
             "cudaFuncSetAttribute(mla_decode_seesaw_kernel)");
  const int64_t rows_cap = decode_partial_rows(p.max_qo_len, p.num_heads);
  kernel<<<decode_tiled_grid(p.max_work, rows_cap, kRows), kThreads, kSmem, stream>>>(p, ckv_map, kpe_map);
  gpu::check_launch("mla_decode_seesaw_kernel");
  return true;
}

}  // namespace

MLACORE_PAIRS_EXPORT(mlacore_debug_decode_pairs)

template <class Idx>
bool launch_mla_decode_seesaw(const DecodeParams<Idx>& p, bool bf16, gpuStream_t stream) {
  return bf16 ? launch_typed<true>(p, stream) : launch_typed<false>(p, stream);
}

template bool launch_mla_decode_seesaw<int32_t>(const DecodeParams<int32_t>&, bool, gpuStream_t);
template bool launch_mla_decode_seesaw<int64_t>(const DecodeParams<int64_t>&, bool, gpuStream_t);

}  // namespace mlacore
