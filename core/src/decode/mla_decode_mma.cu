// The mma.sync MLA decode kernel (CUDA sm_80+): one CTA per (work item, tile
// of query rows), query rows packed into the MMA's M dimension in 16-row
// groups (one group for heads=16 decode, four for 64-row tiles), 64-token KV
// tiles gathered through the page table by cp.async into a ring of 32-token
// half tiles, online softmax in base 2, and a direct (whole request) or fp32
// partial (split request) epilogue that the combine kernel merges.
// Contract: DecodeParams validated by mla_decode.cpp, a schedule from
// plan_builder; every work item is re-checked by read_item, and masked tokens
// (bad page ids, past kv_len, causal) get no softmax weight and are never read.
// Design: docs/design/2026-11-30-decode-mma-portable-combine.md.
#include "gpu/compat.h"

#include <cstdint>

#include "decode/decode_numeric.h"
#include "plan/schedule.h"
#include "decode/mla_decode.h"
#include "decode/mla_decode_device.cuh"
#include "decode/mla_decode_kernels.h"

namespace mlacore {
namespace {

constexpr int kThreads = 256;
constexpr int kChunks = kQkDim / 8;  // 16-byte chunks per 576-element row

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

template <bool kBf16>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// KV arrives in half tiles of 32 tokens (36 KB) through a ring of kRing
// slots; a 64-token compute tile is two consecutive halves. While tile `it`
// is computed, halves up to 2*it + kRing - 1 are in flight: with kRing = 5
// that is ~110 KB per SM, enough for one CTA to pull its share of HBM
// bandwidth (~32 KB/us per SM at ~2 us loaded latency); a plain double buffer
// of 64-token tiles kept 0-74 KB in flight and stalled between tiles.
constexpr int kHalfTokens = kDecodeTileTokens / 2;

template <int kRowGroups>
struct MmaConfig {
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kColSplit = kWarps / kRowGroups;         // warps sharing one 16-row group
  static constexpr int kRows = 16 * kRowGroups;                 // query rows per CTA
  static constexpr int kTokPerWarp = kDecodeTileTokens / kColSplit;  // S columns per warp
  static constexpr int kColsPerWarp = kCkvDim / kColSplit;      // O columns per warp
  static constexpr int kSTiles = kTokPerWarp / 8;
  static constexpr int kOTiles = kColsPerWarp / 8;
  // 16 rows: Q is 18 KB, so five 36 KB halves fit in 227 KB. 64 rows: Q is
  // 72 KB, four halves (a plain double buffer) is all that fits; that config
  // serves compute-bound shapes, where the MMAs hide the loads anyway.
  static constexpr int kRing = kRowGroups == 1 ? 5 : 4;
  // shared memory, bytes
  static constexpr int kQBytes = kRows * kQkDim * 2;
  static constexpr int kHalfBytes = kHalfTokens * kQkDim * 2;
  static constexpr int kPBytes = kRows * kDecodeTileTokens * 2;
  static constexpr int kRedBytes = kRowGroups * kColSplit * 16 * 4;
  static constexpr int kValidBytes = kRing * kHalfTokens;
  static constexpr int kOffKv = kQBytes;
  static constexpr int kOffP = kOffKv + kRing * kHalfBytes;
  static constexpr int kOffRed = kOffP + kPBytes;
  static constexpr int kOffValid = kOffRed + kRedBytes;
  static constexpr int kSmem = kOffValid + kValidBytes;
  static_assert(kTokPerWarp == 8 || kTokPerWarp % 16 == 0, "S slab must suit ldmatrix.x4");
  static_assert(kHalfTokens % kTokPerWarp == 0, "a warp's S slab must lie in one half tile");
  static_assert(kColsPerWarp % 64 == 0, "O slab: ldmatrix.x4.trans, and a swizzle-aligned start (P V addresses)");
  static_assert(kRing >= 4, "two halves computed while two more load");
  static_assert(kThreads == 8 * kHalfTokens, "the loader gives each token row of a half to 8 threads");
};

// load_q: the query tile (rows row0 .. row0 + C::kRows of the request,
// token-major, zero past its end) -> shared at s_q by cp.async, swizzled; it
// joins the first half tile's commit group.
template <class C, class Idx>
__device__ __forceinline__ void load_q(const DecodeParams<Idx>& p, const ItemView& item, int64_t row0, int64_t rows,
                                       int H, uint32_t s_q, int tid) {
  const auto* qn = static_cast<const uint16_t*>(p.q_nope);
  const auto* qp = static_cast<const uint16_t*>(p.q_pe);
  for (int i = tid; i < C::kRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    const int64_t grow = row0 + r;
    const bool valid = grow < rows;
    const int64_t t = valid ? grow / H : 0, h = valid ? grow % H : 0;
    const uint16_t* src = c < kCkvDim / 8
        ? qn + (item.qo_begin + t) * p.q_nope_stride_t + h * p.q_nope_stride_h + c * 8
        : qp + (item.qo_begin + t) * p.q_pe_stride_t + h * p.q_pe_stride_h + (c - kCkvDim / 8) * 8;
    cp_async16(s_q + swz(r, c, kChunks), valid ? src : qn, valid);
  }
}

// write_o: the two rows this thread owns in each O fragment, normalized by the
// group's row sums (s_red), to the request's partial (split requests) or to
// out and lse.
template <bool kBf16, class C, class Idx>
__device__ __forceinline__ void write_o(const DecodeParams<Idx>& p, const ItemView& item, int64_t row0, int64_t rows,
                                        int64_t rows_cap, int H, const float* s_red,
                                        const float (&o)[C::kOTiles][4], const float (&m_run)[2], int rg, int cs,
                                        int lane) {
  const bool to_partial = item.partial >= 0;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float l = 0.f;
#pragma unroll
    for (int c = 0; c < C::kColSplit; ++c) l += s_red[(rg * C::kColSplit + c) * 16 + (lane >> 2) + 8 * i];
    const int64_t grow = row0 + rg * 16 + (lane >> 2) + 8 * i;
    if (grow >= rows || (to_partial && grow >= rows_cap)) continue;
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const float lse = l > 0.f ? m_run[i] + log2f(l) : -INFINITY;
    const int64_t t = grow / H, h = grow % H;
    if (to_partial) {
      float* dst = p.partial_o + (item.partial * rows_cap + grow) * kCkvDim + cs * C::kColsPerWarp + (lane & 3) * 2;
#pragma unroll
      for (int j = 0; j < C::kOTiles; ++j)
        *reinterpret_cast<float2*>(dst + j * 8) = make_float2(o[j][2 * i] * inv, o[j][2 * i + 1] * inv);
      if (cs == 0 && (lane & 3) == 0) p.partial_lse[item.partial * rows_cap + grow] = lse;
    } else {
      uint16_t* dst = static_cast<uint16_t*>(p.out) + (item.qo_begin + t) * p.out_stride_t + h * p.out_stride_h +
                      cs * C::kColsPerWarp + (lane & 3) * 2;
#pragma unroll
      for (int j = 0; j < C::kOTiles; ++j)
        *reinterpret_cast<uint32_t*>(dst + j * 8) = pack2<kBf16>(o[j][2 * i] * inv, o[j][2 * i + 1] * inv);
      if (p.lse && cs == 0 && (lane & 3) == 0) p.lse[(item.qo_begin + t) * p.lse_stride_t + h * p.lse_stride_h] = lse;
    }
  }
}

// compute_pv: O += P V for this warp's 16 rows and C::kColsPerWarp columns, P
// from s_p, V = the first 512 dims of the tile's two half tiles, read
// transposed.
template <bool kBf16, class C>
__device__ __forceinline__ void compute_pv(uint32_t s_p, uint32_t kv0, uint32_t kv1, uint32_t v_lane,
                                           const uint32_t (&v_off)[4], int rg, int lane,
                                           float (&o)[C::kOTiles][4]) {
#pragma unroll
  for (int kt = 0; kt < kDecodeTileTokens / 16; ++kt) {
    uint32_t a[4];
    ldsm_x4(a, s_p + swz(rg * 16 + (lane & 15), kt * 2 + (lane >> 4), 8));
    // As for K above: chunk c0 + j + x (c0 = cs * kColsPerWarp / 8, a
    // multiple of 8) of a row is 16 * (c0 + (j & ~7) + ((j % 8 + x) ^ (row & 7))).
    const uint32_t v_half = (kt < 2 ? kv0 : kv1) + (kt & 1) * 16 * kChunks * 16 + v_lane;
#pragma unroll
    for (int j = 0; j < C::kOTiles; j += 2) {
      uint32_t b[4];
      ldsm_x4_trans(b, v_half + (j & ~7) * 16 + v_off[(j & 7) >> 1]);
      mma16816<kBf16>(o[j], a, b[0], b[1]);
      mma16816<kBf16>(o[j + 1], a, b[2], b[3]);
    }
  }
}

template <bool kBf16, int kRowGroups, class Idx>
__global__ void __launch_bounds__(kThreads, 1) mla_decode_mma_kernel(const DecodeParams<Idx> p) {
  using C = MmaConfig<kRowGroups>;
  constexpr int R = C::kRing;
  extern __shared__ __align__(128) unsigned char smem[];
  float* s_red = reinterpret_cast<float*>(smem + C::kOffRed);
  unsigned char* s_valid = smem + C::kOffValid;
  const uint32_t s_q = smem_addr(smem);
  const uint32_t s_kv = smem_addr(smem + C::kOffKv);
  const uint32_t s_p = smem_addr(smem + C::kOffP);

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Lets the combine kernel launch once every CTA of this grid is resident;
  // it still waits (griddepcontrol.wait) for this grid to finish writing.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
  const int H = p.num_heads;
  const int64_t rows_cap = decode_partial_rows(p.max_qo_len, H);
  const CtaCoord cta = cta_coord(decode_query_tiles(rows_cap, C::kRows));
  const ItemView item = read_item(p, cta.item);
  if (!item.ok) return;
  const int64_t rows = item.qo_len * H;
  const int64_t row0 = cta.tile * C::kRows;
  if (row0 >= rows) return;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int rg = warp / C::kColSplit, cs = warp % C::kColSplit;
  const int64_t rows_here = rows - row0 < C::kRows ? rows - row0 : C::kRows;
  const bool group_active = rg * 16 < rows_here;  // warp-uniform: idle groups skip the MMAs

  const auto* ckv = static_cast<const uint16_t*>(p.ckv);
  const auto* kpe = static_cast<const uint16_t*>(p.kpe);

  load_q<C>(p, item, row0, rows, H, s_q, tid);

  const ItemPages<Idx> lookup(p.pages, item);

  const int64_t n_tiles =
      item.end > item.begin ? (item.end - item.begin + kDecodeTileTokens - 1) / kDecodeTileTokens : 0;
  const int64_t n_halves = 2 * n_tiles;

  // 8 threads per token row (each 8-lane group reads 128 contiguous bytes per
  // instruction): thread `tid` always loads row tid / 8 of a half, chunks
  // ld_sub + 8j. Since 8j leaves the low three bits alone, chunk ld_sub + 8j
  // lands at a fixed swizzled offset plus 128j bytes in every slot.
  const int ld_tok = tid >> 3, ld_sub = tid & 7;
  const uint32_t ld_dst = (ld_tok * kChunks + (ld_sub ^ (ld_tok & 7))) * 16;
  auto fetch = [&](int64_t half) { return lookup(item.begin + half * kHalfTokens + ld_tok); };
  // Half `half` into ring slot `slot` (rows past the item are zero-filled, so
  // no stale shared memory ever meets a zero probability), then its commit
  // group; halves past the item commit an empty group, which keeps the
  // wait_group count uniform.
  auto issue = [&](int64_t half, int slot, const PageRef& r) {
    if (half < n_halves) {
      const int64_t page = r.page >= 0 && (p.pages.num_pages < 0 || r.page < p.pages.num_pages) ? r.page : -1;
      const bool valid = page >= 0;
      const uint16_t* crow = ckv + (valid ? page * p.ckv_stride_page + r.off * p.ckv_stride_tok : 0) + ld_sub * 8;
      const uint16_t* krow = kpe + (valid ? page * p.kpe_stride_page + r.off * p.kpe_stride_tok : 0) + ld_sub * 8;
      const uint32_t dst = s_kv + slot * C::kHalfBytes + ld_dst;
#pragma unroll
      for (int j = 0; j < kCkvDim / 64; ++j) cp_async16(dst + 128 * j, crow + 64 * j, valid);
      static_assert(kKpeDim == 64, "the kpe part of a row is one chunk per loader thread");
      cp_async16(dst + 128 * (kCkvDim / 64), krow, valid);
      if (ld_sub == 0) s_valid[slot * kHalfTokens + ld_tok] = valid;
    }
    cp_async_commit();
  };

  // The two rows this thread owns in every accumulator fragment, and the
  // first KV position each may not see.
  int64_t limit[2];
  for (int i = 0; i < 2; ++i) {
    const int64_t grow = row0 + rg * 16 + (lane >> 2) + 8 * i;
    const int64_t t = grow / H;
    int64_t lim = p.causal ? item.kv_len - item.qo_len + t + 1 : item.kv_len;
    lim = lim < item.end ? lim : item.end;
    limit[i] = grow < rows ? lim : 0;
  }

  float o[C::kOTiles][4];
#pragma unroll
  for (int j = 0; j < C::kOTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

  // Prologue: halves 0 .. R-3 (their page ids all requested before the first
  // cp.async waits on one), then the ids of the two halves iteration 0 issues.
  {
    PageRef first[R - 2];
#pragma unroll
    for (int h = 0; h < R - 2; ++h) first[h] = fetch(h);
#pragma unroll
    for (int h = 0; h < R - 2; ++h) issue(h, h, first[h]);
  }
  PageRef next0 = fetch(R - 2), next1 = fetch(R - 1);

  // This thread's row and swizzle offsets in the transposed V loads (P V).
  const uint32_t v_lane = (((lane >> 3) & 1) * 8 + (lane & 7)) * kChunks * 16 + cs * C::kColsPerWarp * 2;
  uint32_t v_off[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) v_off[i] = 16 * ((2 * i + (lane >> 4)) ^ (lane & 7));

  // 16-row tiles keep all of Q in registers once it has arrived (144 of
  // them; ptxas still fits the kernel in 255 without spilling): every warp
  // reads Q whole for each 8-token slab, which made Q two thirds of the
  // shared-memory reads of Q K^T and left the kernel waiting on ldmatrix.
  // 64-row tiles have no registers to spare for it.
  constexpr bool kQInRegs = C::kTokPerWarp == 8;
  constexpr int kQSteps = kChunks / 4;  // pairs of k-steps of 16
  uint32_t q_reg[kQInRegs ? kQSteps : 1][2][4];

  int slot0 = 0;  // ring slot of half 2*it
  for (int64_t it = 0; it < n_tiles; ++it) {
    const int slot1 = slot0 + 1 == R ? 0 : slot0 + 1;
    const int64_t tile_start = item.begin + it * kDecodeTileTokens;
    // Halves 2it and 2it+1 are this thread's oldest groups; R-4 newer ones may still fly.
    cp_async_wait<R - 4>();
    // Tile `it` visible to all; every warp is done with tile it-1 (its slots,
    // P and the row maxima in s_red are free).
    __syncthreads();
    if constexpr (kQInRegs) {
      if (it == 0 && group_active) {
        // Same addressing as the K loads below.
        const uint32_t y = lane & 7, qx = lane >> 4;
        const uint32_t q_base = s_q + (rg * 16 + (lane & 15)) * kChunks * 16;
#pragma unroll
        for (int kk = 0; kk < kQSteps; ++kk) {
          const uint32_t hi = (kk >> 1) * 128;
          ldsm_x4(q_reg[kk][0], q_base + hi + 16 * (((kk & 1) * 4 + qx) ^ y));
          ldsm_x4(q_reg[kk][1], q_base + hi + 16 * (((kk & 1) * 4 + qx + 2) ^ y));
        }
      }
    }
    issue(2 * it + R - 2, slot0 + R - 2 >= R ? slot0 - 2 : slot0 + R - 2, next0);
    issue(2 * it + R - 1, slot0 + R - 1 >= R ? slot0 - 1 : slot0 + R - 1, next1);
    next0 = fetch(2 * it + R);
    next1 = fetch(2 * it + R + 1);

    const uint32_t kv0 = s_kv + slot0 * C::kHalfBytes, kv1 = s_kv + slot1 * C::kHalfBytes;
    float s[C::kSTiles][4];
#pragma unroll
    for (int j = 0; j < C::kSTiles; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;

    // S = Q K^T over 576 dims. A warp's slab of tokens lies in one half.
    constexpr int kSlabsPerHalf = kHalfTokens / C::kTokPerWarp;
    const uint32_t kv_slab = cs / kSlabsPerHalf == 0 ? kv0 : kv1;
    const int slab_row = (cs % kSlabsPerHalf) * C::kTokPerWarp;
    if (group_active) {
      const int a_row = rg * 16 + (lane & 15);
      if constexpr (C::kTokPerWarp == 8) {
        // One n-tile: each ldmatrix.x4 of K brings two k-steps. Four
        // accumulators, summed after: one would chain all 36 MMAs of the
        // slab back to back, each waiting out the previous one's latency
        // with only two warps per scheduler to cover it.
        // Addresses without per-load arithmetic: chunk 4*kk + x of row r is
        // at 16 * (72r + ((4kk + x) ^ (r & 7))), and for x < 4 that is
        // 128 * (kk / 2) + 16 * ((x + 4 * (kk & 1)) ^ (r & 7)) past the
        // row: a per-thread base plus one of two offsets plus a constant.
        const int k_row = slab_row + (lane & 7);
        const uint32_t y = lane & 7, kx = lane >> 3;
        const uint32_t k_base = kv_slab + k_row * kChunks * 16;
        const uint32_t k_off[2] = {16 * (kx ^ y), 16 * ((kx + 4) ^ y)};
        float acc[4][4] = {};
#pragma unroll
        for (int kk = 0; kk < kQSteps; ++kk) {
          uint32_t b[4];
          ldsm_x4(b, k_base + (kk >> 1) * 128 + k_off[kk & 1]);
          mma16816<kBf16>(acc[(2 * kk) & 3], q_reg[kk][0], b[0], b[1]);
          mma16816<kBf16>(acc[(2 * kk + 1) & 3], q_reg[kk][1], b[2], b[3]);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) s[0][e] = (acc[0][e] + acc[1][e]) + (acc[2][e] + acc[3][e]);
      } else {
        const int k_row = slab_row + ((lane >> 4) << 3) + (lane & 7);
#pragma unroll 4
        for (int kk = 0; kk < kChunks / 2; ++kk) {
          uint32_t a[4];
          ldsm_x4(a, s_q + swz(a_row, kk * 2 + (lane >> 4), kChunks));
#pragma unroll
          for (int j = 0; j < C::kSTiles; j += 2) {
            uint32_t b[4];
            ldsm_x4(b, kv_slab + swz(k_row + j * 8, kk * 2 + ((lane >> 3) & 1), kChunks));
            mma16816<kBf16>(s[j], a, b[0], b[1]);
            mma16816<kBf16>(s[j + 1], a, b[2], b[3]);
          }
        }
      }
    }

    // Mask, scale, and this warp's row maxima (including the running one).
    const unsigned char* valid_slab = s_valid + (cs / kSlabsPerHalf == 0 ? slot0 : slot1) * kHalfTokens + slab_row;
    float mx[2] = {m_run[0], m_run[1]};
#pragma unroll
    for (int j = 0; j < C::kSTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int tok = j * 8 + (lane & 3) * 2 + (e & 1);  // inside the slab
        const int i = e >> 1;
        const bool ok = tile_start + cs * C::kTokPerWarp + tok < limit[i] && valid_slab[tok];
        s[j][e] = ok ? s[j][e] * p.scale_log2 : -INFINITY;
        mx[i] = fmaxf(mx[i], s[j][e]);
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
    }
    // The group's maximum first (one barrier), then P against it, stored
    // once, then a second barrier before P V reads it. Exponentiating against
    // each warp's own maximum would save that barrier but cost a rescale of
    // every P fragment on the way into P V: an exp2 per slab and row, and an
    // unpack, two multiplies and a repack per register, on the issue-bound
    // path, plus a second bf16 rounding of P.
    if ((lane & 3) == 0) {
      s_red[(rg * C::kColSplit + cs) * 16 + (lane >> 2)] = mx[0];
      s_red[(rg * C::kColSplit + cs) * 16 + (lane >> 2) + 8] = mx[1];
    }
    __syncthreads();

    // Every warp of the group computes the same maximum. A row that has seen
    // nothing valid keeps m = -inf; exponentiate it against 0 so no inf - inf.
    const float* red_row = s_red + rg * C::kColSplit * 16 + (lane >> 2);
    float m_use[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float m_new = mx[i];
#pragma unroll
      for (int c = 0; c < C::kColSplit; ++c) m_new = fmaxf(m_new, red_row[c * 16 + 8 * i]);
      m_use[i] = m_new == -INFINITY ? 0.f : m_new;
      const float alpha = fast_exp2(m_run[i] - m_use[i]);
      l_run[i] *= alpha;
      m_run[i] = m_new;
#pragma unroll
      for (int j = 0; j < C::kOTiles; ++j) {
        o[j][2 * i] *= alpha;
        o[j][2 * i + 1] *= alpha;
      }
    }
#pragma unroll
    for (int j = 0; j < C::kSTiles; ++j) {
      const float p0 = fast_exp2(s[j][0] - m_use[0]), p1 = fast_exp2(s[j][1] - m_use[0]);
      const float p2 = fast_exp2(s[j][2] - m_use[1]), p3 = fast_exp2(s[j][3] - m_use[1]);
      l_run[0] += p0 + p1;
      l_run[1] += p2 + p3;
      const int tok = cs * C::kTokPerWarp + j * 8 + (lane & 3) * 2;
      const int r = rg * 16 + (lane >> 2);
      const uint32_t in_chunk = (tok & 7) * 2;
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(s_p + swz(r, tok >> 3, 8) + in_chunk), "r"(pack2<kBf16>(p0, p1)));
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(s_p + swz(r + 8, tok >> 3, 8) + in_chunk),
                   "r"(pack2<kBf16>(p2, p3)));
    }
    __syncthreads();

    // O += P V, V = the first 512 dims of the tile, read transposed.
    if (group_active) compute_pv<kBf16, C>(s_p, kv0, kv1, v_lane, v_off, rg, lane, o);
    slot0 = slot0 + 2 >= R ? slot0 + 2 - R : slot0 + 2;
  }

  cp_async_wait_all();  // the query copy is still in flight when the item has no KV tile

  // Row sums over the group's warps (all used the same running maxima).
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 1);
    l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 2);
  }
  __syncthreads();  // s_red's last readers (the final tile's maxima) are done
  if ((lane & 3) == 0) {
    s_red[(rg * C::kColSplit + cs) * 16 + (lane >> 2)] = l_run[0];
    s_red[(rg * C::kColSplit + cs) * 16 + (lane >> 2) + 8] = l_run[1];
  }
  __syncthreads();

  write_o<kBf16, C>(p, item, row0, rows, rows_cap, H, s_red, o, m_run, rg, cs, lane);
}

}  // namespace

int mla_decode_mma_groups(int64_t rows_cap, int device) {
  const int smem_optin = gpu::device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(device);
  // Up to 16 query rows per request (heads=16 decode): one 16-row group, so
  // the MMAs do no padding work. Else 64-row tiles.
  if (rows_cap <= 16 && MmaConfig<1>::kSmem <= smem_optin) return 1;
  if (rows_cap > 16 && MmaConfig<4>::kSmem <= smem_optin) return 4;
  return 0;  // GPUs with less shared memory per block than an H100 (A100: 163 KB)
}

template <class Idx>
void launch_mla_decode_mma(const DecodeParams<Idx>& p, bool bf16, int groups, gpuStream_t stream) {
  const int64_t rows_cap = decode_partial_rows(p.max_qo_len, p.num_heads);
  auto run = [&](auto kernel, int rows_per_cta, int smem) {
    gpu::check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
               "cudaFuncSetAttribute(mla_decode_mma_kernel)");
    kernel<<<decode_tiled_grid(p.max_work, rows_cap, rows_per_cta), kThreads, smem, stream>>>(p);
    gpu::check_launch("mla_decode_mma_kernel");
  };
  if (groups == 1) {
    if (bf16) run(mla_decode_mma_kernel<true, 1, Idx>, 16, MmaConfig<1>::kSmem);
    else run(mla_decode_mma_kernel<false, 1, Idx>, 16, MmaConfig<1>::kSmem);
  } else {
    if (bf16) run(mla_decode_mma_kernel<true, 4, Idx>, 64, MmaConfig<4>::kSmem);
    else run(mla_decode_mma_kernel<false, 4, Idx>, 64, MmaConfig<4>::kSmem);
  }
}

template void launch_mla_decode_mma<int32_t>(const DecodeParams<int32_t>&, bool, int, gpuStream_t);
template void launch_mla_decode_mma<int64_t>(const DecodeParams<int64_t>&, bool, int, gpuStream_t);

}  // namespace mlacore
