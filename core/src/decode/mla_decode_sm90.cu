// MLA decode with wgmma (sm_90a), for 64-row query tiles (heads >= 32, or
// several query tokens). Same contract as the mma.sync kernel
// (mla_decode_mma.cu): one CTA per (work item, 64 packed query rows), 64-token
// KV tiles gathered through the page table, online softmax in base 2, the
// same direct / partial epilogue, so the schedule and the combine are shared.
// Warpgroup 0 computes S, the softmax and O[:, 0:256]; warpgroup 1 loads KV
// tiles (two in flight, two shared-memory stages) and computes O[:, 256:512].
// They hand off through named barriers (kBarStart, kBarPFull, kBarKvEmpty)
// and mbarriers (KvFull per stage, PFree); the order is modelled and checked
// by tests/_wgmma_barrier_model.py, which must change with it.
// Roles, barrier protocol and the reasons for each choice:
// docs/design/2026-12-01-decode-sm90-barriers.md.
#include "gpu/compat.h"

#include <cstdint>

#include "plan/schedule.h"
#include "gpu/wgmma_sm90.cuh"
#include "decode/mla_decode.h"
#include "decode/mla_decode_device.cuh"
#include "decode/mla_decode_sm90.h"
#include "decode/mla_decode_sm90_steps.cuh"
#include "decode/decode_timeline.cuh"

namespace mlacore {
namespace {

namespace wg = wgmma;

constexpr int kThreads = 256;
constexpr int kRows = kDecodeTileRows;
constexpr int kTok = kDecodeTileTokens;
constexpr int kBlocks = kQkDim / 64;               // 64-element column blocks per row
constexpr int kBlockBytes = 64 * 128;              // one column block of 64 rows
constexpr int kTileBytes = kBlocks * kBlockBytes;  // Q, or one KV stage
constexpr int kStages = 2;
constexpr int kLdRows = 16;  // token rows the 128 loader threads cover per pass (8 threads a row)
constexpr int kLdPasses = kTok / kLdRows;
// Named barrier ids (0 is __syncthreads).
constexpr int kBarStart = 1, kBarKvEmpty = 2, kBarPFull = 3;
// KvEmpty as an mbarrier (racecheck builds, meson -Dracecheck_barriers=true)
// or a named barrier that warpgroup 0 enters with bar.arrive, which racecheck
// does not model. Warpgroup 0 never blocks on KvEmpty (its warps decide the
// early free each for itself).
constexpr bool kKvEmptyMbarrier =
#if defined(MLACORE_RACECHECK_BARRIERS)
    true;
#else
    false;
#endif
// shared memory, bytes from a 1024-aligned base (the swizzle pattern of every
// operand must start on a 1024-byte boundary: descriptor base offset 0)
constexpr int kOffQ = 0;
constexpr int kOffKv = kOffQ + kTileBytes;
constexpr int kOffP = kOffKv + kStages * kTileBytes;
constexpr int kOffScale = kOffP + kBlockBytes;      // float[kRows]: alpha of the current tile
constexpr int kOffSum = kOffScale + kRows * 4;      // float[kRows]: row sums, at the end
constexpr int kOffValid = kOffSum + kRows * 4;      // uint8[kStages][kTok], 0 or 1
constexpr int kOffPFree = kOffValid + kStages * kTok;  // uint64: the PFree mbarrier
constexpr int kOffFull = kOffPFree + 8;                // uint64[kStages]: the KvFull mbarriers
constexpr int kOffEmpty = kOffFull + kStages * 8;      // uint64: the KvEmpty mbarrier (racecheck builds)
constexpr int kSmemUsed = kOffEmpty + 8;
// The dynamic shared memory base is only guaranteed 16-byte aligned: 1 KB of
// slack lets the kernel round it up.
constexpr int kSmem = kSmemUsed + 1024;
static_assert(kSmem <= 232448, "over the H100/H200 opt-in shared memory per block (227 KB)");
static_assert(kRows == 64 && kTok == 64, "one m64 wgmma row tile, 64-token tiles (4 k-steps of P V)");
static_assert(kOffPFree % 8 == 0, "mbarriers are 8-byte aligned");
static_assert(kOffValid % 16 == 0 && kTok % 16 == 0, "a stage's valid flags are whole 16-byte vectors");
static_assert(kOffKv % 1024 == 0 && kOffP % 1024 == 0 && kTileBytes % 1024 == 0, "swizzle atoms on 1 KB");
static_assert(kKpeDim == 64, "kpe is the ninth column block");
static_assert(kThreads == 256 && kLdRows * 8 == kThreads / 2, "warpgroup 1 loads, 8 threads per token row");
static_assert(kLdPasses * kLdRows == kTok, "the loader covers a tile in whole passes");
static_assert(0 < kBarStart && kBarStart < kBarKvEmpty && kBarKvEmpty < kBarPFull && kBarPFull < 16,
              "distinct named barrier ids, none of them 0 (__syncthreads)");

template <bool kBf16, class Idx>
__global__ void __launch_bounds__(kThreads, 1) mla_decode_wgmma_kernel(const DecodeParams<Idx> p) {
#if defined(MLACORE_WGMMA_ENABLED)
  constexpr int kOCols = kCkvDim / 2;  // O columns per warpgroup
  // Warpgroup 0's P V takes P from registers (register-A wgmma). false: from
  // its shared-memory copy, as warpgroup 1 does (same barriers; a switch to
  // isolate the register path if it ever misbehaves).
  constexpr bool kWg0PvFromRegs = true;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  const uint32_t s_base = smem_addr(smem);
  const uint32_t s_q = s_base + kOffQ, s_kv = s_base + kOffKv, s_p = s_base + kOffP;
  float* s_scale = reinterpret_cast<float*>(smem + kOffScale);
  float* s_sum = reinterpret_cast<float*>(smem + kOffSum);
  unsigned char* s_valid = smem + kOffValid;
  const uint32_t s_pfree = s_base + kOffPFree;
  const uint32_t s_full = s_base + kOffFull;  // + 8 * stage
  const uint32_t s_empty = s_base + kOffEmpty;
  // KvEmpty(t): warpgroup 0 is through with stage t % 2; warpgroup 1 waits
  // for it before refilling the stage with tile t+2.
  auto free_stage = [&] {
    if constexpr (kKvEmptyMbarrier) wg::mbar_arrive(s_empty);
    else wg::bar_arrive(kBarKvEmpty, kThreads);
  };
  auto wait_stage_free = [&](int64_t t) {
    if constexpr (kKvEmptyMbarrier) wg::mbar_wait(s_empty, static_cast<uint32_t>(t & 1));
    else wg::bar_sync(kBarKvEmpty, kThreads);
  };
  // Tile t >= 1 lands in stage t % 2 on phase (t - 1) / 2 of that stage's
  // KvFull mbarrier (tile 0 is the prologue's).
  auto full_parity = [](int64_t t) { return static_cast<uint32_t>(((t - 1) >> 1) & 1); };

  MLACORE_TIMELINE(0, threadIdx.x == 0);  // attribution builds only (decode_timeline.cuh)
  // Lets the combine kernel launch once every CTA of this grid is resident;
  // it still waits (griddepcontrol.wait) for this grid to finish writing.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  const int H = p.num_heads;
  const int64_t rows_cap = decode_partial_rows(p.max_qo_len, H);
  const CtaCoord cta = cta_coord(decode_query_tiles(rows_cap, kRows));
  const ItemView item = read_item(p, cta.item);
  MLACORE_TIMELINE(1, threadIdx.x == 0);
  if (!item.ok) return;
  const int64_t rows = item.qo_len * H;
  const int64_t row0 = cta.tile * kRows;
  if (row0 >= rows) return;

  const int tid = threadIdx.x, g = tid >> 7, wtid = tid & 127, lane = tid & 31;

  const auto* ckv = static_cast<const uint16_t*>(p.ckv);
  const auto* kpe = static_cast<const uint16_t*>(p.kpe);

  const ItemPages<Idx> lookup(p.pages, item);

  const int64_t n_tiles = item.end > item.begin ? (item.end - item.begin + kTok - 1) / kTok : 0;

  // Loader (warpgroup 1): 8 threads per token row (each 8-lane group reads
  // 128 contiguous bytes per instruction); thread wtid loads tokens
  // ld_tok + 16 q (q < 4) of a tile, chunk ld_sub of every column block: a
  // fixed swizzled offset per row plus kBlockBytes per block.
  const int ld_tok = wtid >> 3, ld_sub = wtid & 7;
  auto fetch = [&](int64_t tile, int pass) { return lookup(item.begin + tile * kTok + pass * kLdRows + ld_tok); };
  auto fetch_all = [&](int64_t tile, PageRef (&ref)[kLdPasses]) {
#pragma unroll
    for (int q = 0; q < kLdPasses; ++q) ref[q] = fetch(tile, q);
  };
  // Tile `tile` into stage `stage` (rows past the item zero-filled, so no
  // stale shared memory meets a zero probability), then its commit group;
  // tiles past the item commit an empty group. Tiles after the first also
  // arrive on their stage's KvFull mbarrier: once when this thread's copies
  // land and once now, which releases the valid flags stored here.
  auto issue = [&](int64_t tile, int stage, const PageRef (&ref)[kLdPasses]) {
    if (tile < n_tiles) {
#pragma unroll
      for (int q = 0; q < kLdPasses; ++q) {
        const PageRef& r = ref[q];
        const int tok = q * kLdRows + ld_tok;
        const int64_t page = r.page >= 0 && (p.pages.num_pages < 0 || r.page < p.pages.num_pages) ? r.page : -1;
        const bool valid = page >= 0;
        const uint16_t* crow = ckv + (valid ? page * p.ckv_stride_page + r.off * p.ckv_stride_tok : 0) + ld_sub * 8;
        const uint16_t* krow = kpe + (valid ? page * p.kpe_stride_page + r.off * p.kpe_stride_tok : 0) + ld_sub * 8;
        const uint32_t dst = s_kv + stage * kTileBytes + wg::sw128(tok, ld_sub);
#pragma unroll
        for (int j = 0; j < kCkvDim / 64; ++j) cp_async16(dst + j * kBlockBytes, crow + 64 * j, valid);
        cp_async16(dst + (kCkvDim / 64) * kBlockBytes, krow, valid);
        if (ld_sub == 0) s_valid[stage * kTok + tok] = valid;
      }
      if (tile > 0) {
        cp_async_arrive(s_full + 8 * stage);
        wg::mbar_arrive(s_full + 8 * stage);
      }
    }
    cp_async_commit();
  };

  // The two rows (of the 64) this thread holds in every accumulator, S and
  // O alike, and the first KV position each may not see.
  const int r_lo = wg::acc_row(wtid, 0);
  int64_t limit[2];
  row_limits(p, item, row0, rows, r_lo, limit);

  float o[kOCols / 2];
#pragma unroll
  for (int e = 0; e < kOCols / 2; ++e) o[e] = 0.f;
  // Warpgroup 0's running maximum and (per-thread partial) row sum.
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

  // Prologue: Q and tile 0, published by kBarStart; then tile 1
  // (empty groups past the item), which lands during S(0) and its softmax.
  // Issuing tile 1 with them held the first S back: every CTA starts at
  // once, and an SM's loads arrive at a bounded rate, so the extra 72 KB in
  // flight delayed Q and tile 0 by about their share.
  // Tile 0's page ids are loaded before Q is issued: they are the last link
  // of the chain to tile 0 (work item, kv_indptr, page ids, KV), and the Q
  // loop's 18 cp.async a thread need none of them.
  PageRef next[kLdPasses];
  if (g == 1) fetch_all(0, next);

  // Query tile -> shared (zero rows past the request), once per CTA, by all
  // 256 threads: its own commit group, the oldest of every thread.
  load_q(p, item, row0, rows, s_q, tid);
  cp_async_commit();
  if (g == 1) {
    issue(0, 0, next);
    fetch_all(1, next);
  }
  cp_async_wait_all();      // Q (and tile 0 in warpgroup 1)
  wg::fence_proxy_async();  // this thread's cp.async data, next read by wgmma
  if (tid == 0) {  // published by the barrier below
    wg::mbar_init(s_pfree, kThreads / 2);
    for (int st = 0; st < kStages; ++st) wg::mbar_init(s_full + 8 * st, kThreads / 2);
    if (kKvEmptyMbarrier) wg::mbar_init(s_empty, kThreads / 2);
  }
  wg::bar_sync(kBarStart, kThreads);
  MLACORE_TIMELINE(2, tid == 0);
  MLACORE_TIMELINE_NOTE(n_tiles);
  if (g == 1) {
    // Stage 1 is untouched until S(1), after the KvFull wait for it.
    issue(1, 1, next);
    fetch_all(2, next);
  }

  if (g == 0) {
    // ---------------- warpgroup 0: S, softmax, O[:, 0:256] ----------------
    // Descriptors move by byte offsets through wg::desc_at (a 32-bit add to
    // the start-address field, which never carries: every address stays
    // below 256 KB).
    const uint64_t desc_q = wg::desc_k_sw128(s_q);
    const uint64_t desc_v = wg::desc_mn_sw128(s_kv, kBlockBytes);  // column blocks 0..3
    const uint64_t desc_p = wg::desc_k_sw128(s_p);                   // only without kWg0PvFromRegs
    // P(it) as the register A operand of this warpgroup's P V(it) (k-step kt
    // = pk[4kt .. 4kt + 3]); owned by that wgmma until it is waited for in
    // tile it + 1 (or after the loop), so it lives across iterations.
    uint32_t pk[kTok / 4];
#pragma unroll
    for (int j = 0; j < kTok / 4; ++j) pk[j] = 0u;
    for (int64_t it = 0; it < n_tiles; ++it) {
      const int stage = static_cast<int>(it & 1);
      // Whether KvEmpty(it-1) was already arrived on: when tile `it` has not
      // landed, this warp waits for its P V(it-1) first and frees stage
      // (it-1) % 2 before waiting, so warpgroup 1 issues tile it+1 while tile
      // `it` is still in flight.
      bool freed = false;
      if (it > 0) {
        const uint32_t full = s_full + 8 * stage, parity = full_parity(it);
        if (it + 1 < n_tiles && !__all_sync(0xffffffffu, wg::mbar_test(full, parity))) {
          wg::wait<0>();
          free_stage();
          freed = true;
        }
        wg::mbar_wait(full, parity);  // tile `it` landed: its copies and valid flags
        wg::fence_proxy_async();      // seen by this thread, next read by wgmma
      }
      const uint32_t kv = s_kv + stage * kTileBytes;
      const int64_t tile_start = item.begin + it * kTok;

      // S = Q K^T over 576 dims, all 64 tokens.
      float s[kTok / 2];
#pragma unroll
      for (int e = 0; e < kTok / 2; ++e) s[e] = 0.f;
      const uint64_t desc_k = wg::desc_k_sw128(kv);
      wg::fence_regs(s);
      wg::fence();
#pragma unroll
      for (int kk = 0; kk < kQkDim / 16; ++kk) {
        const uint32_t off = wg::k_major_step(kk, kRows);  // Q and the stage both have 64 rows
        wg::mma_m64n64k16_ss<kBf16>(s, wg::desc_at(desc_q, off), wg::desc_at(desc_k, off));
      }
      wg::commit();
      if (it > 0 && it + 1 < n_tiles && !freed) {
        // P V(it-1), committed before S(it), is complete: with S(it-1) long
        // done, this warpgroup is through with stage (it-1) % 2, which
        // warpgroup 1 refills with tile it+1.
        wg::wait<1>();
        free_stage();
      }
      wg::wait<0>();  // S(it) and P V(it-1)
      MLACORE_TIMELINE(3, it == 0 && tid == 0);
      wg::fence_regs(s);
      wg::fence_regs(o);
      wg::fence_regs(pk);  // P V(it-1) no longer reads them

      // Mask, scale, row maxima (this warpgroup holds whole rows: a quad
      // shuffle). Position tile_start + col is visible to row i iff col <
      // lim[i] (limit[i] - tile_start clamped to [0, kTok]: 32-bit compares
      // per element); the valid flags of columns col, col + 1 are one
      // 16-bit load (col even).
      const unsigned char* valid = s_valid + stage * kTok;
      int lim[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int64_t d = limit[i] - tile_start;
        lim[i] = d < 0 ? 0 : (d > kTok ? kTok : static_cast<int>(d));
      }
      float mx[2] = {m_run[0], m_run[1]};
      // Steady state: every token of the tile has a valid page and is visible
      // to both rows, so nothing is masked. The 64 valid flags (0 or 1 bytes)
      // are four 16-byte broadcast loads; their AND is 0x01010101 only when all
      // are 1. The fast path computes what the masked one would for such a
      // tile, bit for bit, without its 8 flag loads and 32 compares a thread.
      const uint4* flags = reinterpret_cast<const uint4*>(valid);
      const uint4 f0 = flags[0], f1 = flags[1], f2 = flags[2], f3 = flags[3];
      const uint32_t all_valid = f0.x & f0.y & f0.z & f0.w & f1.x & f1.y & f1.z & f1.w & f2.x & f2.y & f2.z &
                                 f2.w & f3.x & f3.y & f3.z & f3.w;
      if (__all_sync(0xffffffffu, all_valid == 0x01010101u && lim[0] == kTok && lim[1] == kTok)) {
#pragma unroll
        for (int e = 0; e < kTok / 2; ++e) {
          s[e] *= p.scale_log2;
          mx[(e >> 1) & 1] = fmaxf(mx[(e >> 1) & 1], s[e]);
        }
      } else {
#pragma unroll
        for (int j = 0; j < kTok / 8; ++j) {
          const int col0 = wg::acc_col(wtid, 4 * j);
          const uint32_t v2 = *reinterpret_cast<const uint16_t*>(valid + col0);
#pragma unroll
          for (int e = 4 * j; e < 4 * j + 4; ++e) {
            const int col = col0 + (e & 1);
            const int i = (e >> 1) & 1;
            const bool ok = col < lim[i] && ((v2 >> (8 * (e & 1))) & 0xffu) != 0;
            s[e] = ok ? s[e] * p.scale_log2 : -INFINITY;
            mx[i] = fmaxf(mx[i], s[e]);
          }
        }
      }
      // A row that has seen nothing valid keeps m = -inf; exponentiate it
      // against 0 so no inf - inf.
      float m_use[2], alpha[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
        m_use[i] = mx[i] == -INFINITY ? 0.f : mx[i];
        alpha[i] = m_run[i] == m_use[i] ? 1.f : fast_exp2(m_run[i] - m_use[i]);  // exactly 1 when m holds
        l_run[i] *= alpha[i];
        m_run[i] = mx[i];
      }
      // Once the row maxima settle, alpha is exactly 1 for whole warps:
      // skipping O *= 1 changes no bit (warp-uniform branch).
      if (!__all_sync(0xffffffffu, alpha[0] == 1.f && alpha[1] == 1.f)) {
#pragma unroll
        for (int j = 0; j < kOCols / 8; ++j) {
          o[4 * j] *= alpha[0];
          o[4 * j + 1] *= alpha[0];
          o[4 * j + 2] *= alpha[1];
          o[4 * j + 3] *= alpha[1];
        }
      }
#pragma unroll
      for (int j = 0; j < kTok / 8; ++j) {
        s[4 * j] = fast_exp2(s[4 * j] - m_use[0]);
        s[4 * j + 1] = fast_exp2(s[4 * j + 1] - m_use[0]);
        s[4 * j + 2] = fast_exp2(s[4 * j + 2] - m_use[1]);
        s[4 * j + 3] = fast_exp2(s[4 * j + 3] - m_use[1]);
        l_run[0] += s[4 * j] + s[4 * j + 1];
        l_run[1] += s[4 * j + 2] + s[4 * j + 3];
      }
      // P in the A fragment layout; the same registers are the shared copy.
      wg::acc_to_a<kBf16>(s, pk);
      // P and alpha -> shared, once warpgroup 1's P V(it-1) has read the
      // previous ones.
      // Phase it-1 of PFree: warpgroup 1 is done with P(it-1) and alpha(it-1).
      // It cannot be a phase further ahead (it arrives on phase it only after
      // PFull(it), below), so the parity names the phase.
      if (it > 0) wg::mbar_wait(s_pfree, static_cast<uint32_t>((it - 1) & 1));
      wg::store_a_block(s_p, wtid, pk);
      if ((lane & 3) == 0) {
        s_scale[r_lo] = alpha[0];
        s_scale[r_lo + 8] = alpha[1];
      }
      wg::fence_proxy_async();  // P, written by stmatrix, is read by warpgroup 1's wgmma
      wg::bar_sync(kBarPFull, kThreads);

      // O[:, 0:256] += P V, P from registers: column blocks 0..3 of the
      // stage (LBO = one block), 16 tokens = 2048 bytes per k-step. Waited
      // for in the next tile (or after the loop). wgmma.fence orders the
      // register writes of o (rescale) and pk (above) before the wgmma.
      wg::fence_regs(o);
      wg::fence_regs(pk);
      wg::fence();
#pragma unroll
      for (int kt = 0; kt < kTok / 16; ++kt) {
        const uint64_t dv = wg::desc_at(desc_v, stage * kTileBytes + wg::mn_major_step(kt));
        if constexpr (kWg0PvFromRegs) {
          wg::mma_m64n256k16_rs_tb<kBf16>(o, pk + 4 * kt, dv);
        } else {
          // P(it) in shared memory is rewritten only after PFree(it), which
          // follows this warpgroup's wait for this P V in tile it + 1.
          wg::mma_m64n256k16_ss_tb<kBf16>(o, wg::desc_at(desc_p, wg::k_major_step(kt, kRows)), dv);
        }
      }
      wg::commit();
    }
    wg::wait<0>();
    MLACORE_TIMELINE(4, tid == 0);
    wg::fence_regs(o);
    wg::fence_regs(pk);
  } else {
    // ---------------- warpgroup 1: loads, O[:, 256:512] ----------------
    const uint64_t desc_v = wg::desc_mn_sw128(s_kv + (kOCols / 64) * kBlockBytes, kBlockBytes);  // blocks 4..7
    const uint64_t desc_p = wg::desc_k_sw128(s_p);
    for (int64_t it = 0; it < n_tiles; ++it) {
      const int stage = static_cast<int>(it & 1);
      wg::bar_sync(kBarPFull, kThreads);  // P(it), alpha(it)
      const float alpha0 = s_scale[r_lo], alpha1 = s_scale[r_lo + 8];
      // (Unconditional: the alpha == 1 skip of warpgroup 0 costs this
      // warpgroup over 30 registers in ptxas, and this rescale is hidden
      // behind warpgroup 0's P V(it).)
#pragma unroll
      for (int j = 0; j < kOCols / 8; ++j) {
        o[4 * j] *= alpha0;
        o[4 * j + 1] *= alpha0;
        o[4 * j + 2] *= alpha1;
        o[4 * j + 3] *= alpha1;
      }
      if (it > 0) {
        // Tile `it` landed (warpgroup 0 has seen it too, before PFull): this
        // thread's own acquire of the copies, then the proxy fence.
        wg::mbar_wait(s_full + 8 * stage, full_parity(it));
        wg::fence_proxy_async();
      }
      wg::fence_regs(o);
      wg::fence();
#pragma unroll
      for (int kt = 0; kt < kTok / 16; ++kt)
        wg::mma_m64n256k16_ss_tb<kBf16>(o, wg::desc_at(desc_p, wg::k_major_step(kt, kRows)),
                                        wg::desc_at(desc_v, stage * kTileBytes + wg::mn_major_step(kt)));
      wg::commit();
      wg::wait<0>();
      wg::fence_regs(o);
      if (it + 1 < n_tiles) {
        // Done with P(it) and alpha(it) (read above): phase it of PFree.
        wg::mbar_arrive(s_pfree);
        if (it + 2 < n_tiles) {
          // Stage it % 2: this warpgroup's P V(it) is complete (above);
          // warpgroup 0 says when its S(it) and P V(it) are.
          wait_stage_free(it);
          issue(it + 2, stage, next);
          fetch_all(it + 3, next);
        }
      }
    }
  }

  MLACORE_TIMELINE(5, tid == 128);
  cp_async_wait_all();  // nothing is left in flight on any path; kept as a guard

  // Row sums (warpgroup 0 saw every token): over the quad, then shared.
  if (g == 0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 1);
      l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 2);
    }
    if ((lane & 3) == 0) {
      s_sum[r_lo] = l_run[0];
      s_sum[r_lo + 8] = l_run[1];
    }
  }
  __syncthreads();
  MLACORE_TIMELINE(6, tid == 0);

  // O through the KV stages, free now.
  static_assert(kRows * kCkvDim * 4 <= kStages * kTileBytes, "the fp32 O tile fits the KV stages");
  store_o_tile<kBf16>(p, item, row0, rows, rows_cap, reinterpret_cast<float*>(smem + kOffKv), s_sum, m_run, o, tid);
  MLACORE_TIMELINE(7, tid == 0);
#else
  // Compiled for a target without wgmma: the launcher refuses to launch it
  // (binary check below), so reaching this is a dispatch bug.
  (void)p;
#if defined(__CUDA_ARCH__)
  __trap();
#endif
#endif  // MLACORE_WGMMA_ENABLED
}

template <bool kBf16, class Idx>
bool launch_typed_sm90(const DecodeParams<Idx>& p, gpuStream_t stream) {
  auto kernel = mla_decode_wgmma_kernel<kBf16, Idx>;
  if (!sm90a_kernel_runs(kernel, p.device, kSmem)) return false;
  // Not cached: the limit belongs to the context, which cudaDeviceReset replaces.
  gpu::check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
             "cudaFuncSetAttribute(mla_decode_wgmma_kernel)");
  const int64_t rows_cap = decode_partial_rows(p.max_qo_len, p.num_heads);
  kernel<<<decode_tiled_grid(p.max_work, rows_cap, kRows), kThreads, kSmem, stream>>>(p);
  gpu::check_launch("mla_decode_wgmma_kernel");
  return true;
}

}  // namespace

MLACORE_TIMELINE_EXPORT(mlacore_debug_decode_timeline)

template <class Idx>
bool launch_mla_decode_sm90(const DecodeParams<Idx>& p, bool bf16, gpuStream_t stream) {
  return bf16 ? launch_typed_sm90<true>(p, stream) : launch_typed_sm90<false>(p, stream);
}

template bool launch_mla_decode_sm90<int32_t>(const DecodeParams<int32_t>&, bool, gpuStream_t);
template bool launch_mla_decode_sm90<int64_t>(const DecodeParams<int64_t>&, bool, gpuStream_t);

}  // namespace mlacore
