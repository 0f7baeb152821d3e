// MLA decode kernels: the tensor-core kernel (CUDA sm_80+, mma.sync), the
// portable SIMT kernel (HIP, and CUDA on request), and the LSE combine.
//
// Tensor-core kernel, one CTA per (work item, tile of query rows):
//  - query rows (qo_len * heads, token-major) are packed into M. A CTA holds
//    kRowGroups groups of 16 rows; heads=16 decode uses the 1-group config, so
//    no MMA is spent on padding rows, and 8 warps split its KV columns instead.
//  - each 64-token KV tile (64 x 576: ckv | kpe) crosses HBM once per CTA,
//    by cp.async in two 32-token halves through a ring of half-tile slots
//    (5 for 16 rows: ~110 KB in flight per SM), gathered row by row through
//    the page table (page size 1 puts every token on its own page; the page
//    ids are loaded one tile ahead), and serves both S = Q K^T (all 576
//    dims) and O += P V (V = the first 512 dims).
//  - warp (g, c) of group g computes S for 64/kColSplit tokens and O for
//    512/kColSplit columns; row maxima and P go through shared memory, so the
//    fp32 output accumulator per thread stays <= 128 registers. P is stored
//    against each warp's own maximum and rescaled when read, so a tile costs
//    two barriers (tile landed, P ready), not three.
//  - online softmax in base 2 (scores scaled by sm_scale * log2 e).
// Shared-memory rows are XOR-swizzled in 16-byte chunks (chunk ^ row % 8):
// ldmatrix's 8 row addresses then hit 8 different bank groups.
//
// On sm_90a, 64-row tiles go to the wgmma kernel (mla_decode_sm90.cu) unless
// MLACORE_DECODE_KERNEL=mma; the schedule, partial layout and combine are shared.
#include "gpu/compat.h"

#include <cstdint>

#include "decode/decode_numeric.h"
#include "plan/schedule.h"
#include "decode/mla_decode.h"
#include "decode/mla_decode_device.cuh"

#if defined(MLACORE_GPU_CUDA)
#include <cstdlib>
#include <cstring>

#include "decode/mla_decode_sm90.h"
#endif

namespace mlacore {
namespace {

constexpr int kThreads = 256;
constexpr int kChunks = kQkDim / 8;  // 16-byte chunks per 576-element row

#if defined(MLACORE_GPU_CUDA)

// ---------------------------------------------------------------------------
// Tensor-core kernel (CUDA only)

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

  const auto* qn = static_cast<const uint16_t*>(p.q_nope);
  const auto* qp = static_cast<const uint16_t*>(p.q_pe);
  const auto* ckv = static_cast<const uint16_t*>(p.ckv);
  const auto* kpe = static_cast<const uint16_t*>(p.kpe);

  // Query tile -> shared (zero rows past the request), once per CTA; it
  // joins the first half tile's commit group.
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
  // shared-memory reads of Q K^T and left the kernel waiting on ldmatrix
  // (1.01-1.04x instead of 1.08-1.10x the bare-read floor at 16 heads on the
  // H200). 64-row tiles have no registers to spare for it.
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
    if (group_active) {
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

#endif  // MLACORE_GPU_CUDA

// ---------------------------------------------------------------------------
// Portable kernel: one block per (work item, query row). Plain loads and
// shared-memory reductions only (no warp shuffles: HIP wavefronts are 64
// wide), float32 throughout. Correct for every shape; not fast.

template <bool kBf16>
__device__ __forceinline__ float load_h(const uint16_t* p) {
  return kBf16 ? bf16_to_float(*p) : f16_to_float(*p);
}

template <bool kBf16, class Idx>
__global__ void __launch_bounds__(kThreads) mla_decode_portable_kernel(const DecodeParams<Idx> p) {
  constexpr int kTok = kDecodeTileTokens;
  constexpr int kParts = kThreads / kTok;  // threads per token in the dot products
  __shared__ float s_q[kQkDim];
  __shared__ float s_part[kParts][kTok];
  __shared__ float s_p[kTok];
  constexpr int64_t kMaskedRow = INT64_MIN;
  __shared__ int64_t s_coff[kTok], s_koff[kTok];

  const ItemView item = read_item(p, blockIdx.x);
  if (!item.ok) return;
  const int H = p.num_heads;
  const int64_t rows = item.qo_len * H;
  const int64_t row = blockIdx.y;
  if (row >= rows) return;
  const int64_t rows_cap = decode_partial_rows(p.max_qo_len, H);
  if (item.partial >= 0 && row >= rows_cap) return;
  const int64_t t = row / H, h = row % H;
  const int tid = threadIdx.x;

  const auto* qn = static_cast<const uint16_t*>(p.q_nope);
  const auto* qp = static_cast<const uint16_t*>(p.q_pe);
  const auto* ckv = static_cast<const uint16_t*>(p.ckv);
  const auto* kpe = static_cast<const uint16_t*>(p.kpe);
  for (int d = tid; d < kQkDim; d += kThreads)
    s_q[d] = d < kCkvDim ? load_h<kBf16>(qn + (item.qo_begin + t) * p.q_nope_stride_t + h * p.q_nope_stride_h + d)
                         : load_h<kBf16>(qp + (item.qo_begin + t) * p.q_pe_stride_t + h * p.q_pe_stride_h + d - kCkvDim);

  const int64_t page_begin = item.page_begin, page_end = item.page_end;
  int64_t limit = p.causal ? item.kv_len - item.qo_len + t + 1 : item.kv_len;
  limit = limit < item.end ? limit : item.end;

  float acc[kCkvDim / kThreads] = {};
  float m_run = -INFINITY, l_run = 0.f;
  for (int64_t start = item.begin; start < item.end; start += kTok) {
    __syncthreads();  // the previous chunk's readers of s_coff / s_p are done
    if (tid < kTok) {
      const int64_t pos = start + tid;
      int64_t page = -1;
      if (pos < limit) {
        const int64_t in_req = pos / p.pages.page_size;
        if (in_req < page_end - page_begin) page = p.pages.page_at(page_begin + in_req);
      }
      const int64_t off = pos % p.pages.page_size;
      // Offsets can be negative (negative strides), so masked rows get a mark no offset can take.
      s_coff[tid] = page < 0 ? kMaskedRow : page * p.ckv_stride_page + off * p.ckv_stride_tok;
      s_koff[tid] = page < 0 ? kMaskedRow : page * p.kpe_stride_page + off * p.kpe_stride_tok;
    }
    __syncthreads();
    {
      const int tok = tid % kTok, part = tid / kTok;
      constexpr int kSpan = kQkDim / kParts;
      float dot = 0.f;
      if (s_coff[tok] != kMaskedRow) {
        for (int d = part * kSpan; d < (part + 1) * kSpan; ++d)
          dot += s_q[d] * (d < kCkvDim ? load_h<kBf16>(ckv + s_coff[tok] + d) : load_h<kBf16>(kpe + s_koff[tok] + d - kCkvDim));
      }
      s_part[part][tok] = dot;
    }
    __syncthreads();
    if (tid < kTok) {
      float sc = 0.f;
      for (int i = 0; i < kParts; ++i) sc += s_part[i][tid];
      s_p[tid] = s_coff[tid] != kMaskedRow ? sc * p.scale_log2 : -INFINITY;
    }
    __syncthreads();
    float m_new = m_run;
    for (int i = 0; i < kTok; ++i) m_new = fmaxf(m_new, s_p[i]);
    const float m_use = m_new == -INFINITY ? 0.f : m_new;
    const float alpha = exp2f(m_run - m_use);
    m_run = m_new;
    l_run *= alpha;
    for (int k = 0; k < kCkvDim / kThreads; ++k) acc[k] *= alpha;
    for (int i = 0; i < kTok; ++i) {
      if (s_coff[i] == kMaskedRow) continue;
      const float w = exp2f(s_p[i] - m_use);
      l_run += w;
      for (int k = 0; k < kCkvDim / kThreads; ++k) acc[k] += w * load_h<kBf16>(ckv + s_coff[i] + tid + k * kThreads);
    }
  }

  const float inv = l_run > 0.f ? 1.f / l_run : 0.f;
  const float lse = l_run > 0.f ? m_run + log2f(l_run) : -INFINITY;
  if (item.partial >= 0) {
    float* dst = p.partial_o + (item.partial * rows_cap + row) * kCkvDim;
    for (int k = 0; k < kCkvDim / kThreads; ++k) dst[tid + k * kThreads] = acc[k] * inv;
    if (tid == 0) p.partial_lse[item.partial * rows_cap + row] = lse;
  } else {
    uint16_t* dst = static_cast<uint16_t*>(p.out) + (item.qo_begin + t) * p.out_stride_t + h * p.out_stride_h;
    for (int k = 0; k < kCkvDim / kThreads; ++k)
      dst[tid + k * kThreads] = kBf16 ? float_to_bf16(acc[k] * inv) : float_to_f16(acc[k] * inv);
    if (p.lse && tid == 0) p.lse[(item.qo_begin + t) * p.lse_stride_t + h * p.lse_stride_h] = lse;
  }
}

// ---------------------------------------------------------------------------
// Combine: 128 threads per query row of a split request, each owning 4 of
// the 512 columns (one float4 per partial, 2 KB coalesced per row), and
// kCombineLoads partial loads in flight per thread at a time: a b=8 batch has
// only 8 * 16 rows, and the old 32 lanes per row walked 16 partials one
// latency at a time. A large batch (many rows, few partials each) gives each
// thread kRowsPerThread rows of one request instead of one: at b=32 x 128
// heads one row a thread took 2048 blocks, about four waves (4 resident an
// SM at 61 registers) behind the decode's last CTAs; four rows a thread take
// 512 blocks, about 1.3 waves (3 resident at 80 registers), with as many
// loads in flight per thread.
// Requests without partials are left alone, except those with no KV, whose
// zeros and -inf LSE are written here as well as by their (empty) work item,
// so a schedule that gives them no item still produces defined output.
constexpr int kCombineThreadsPerRow = kCkvDim / 4;
// (partial, row) loads in flight together per thread: a float4 and an LSE each.
constexpr int kCombineLoads = 8;
// Launch the combine as a programmatic dependent of the decode kernel on
// sm_90+ (see launch_typed); false falls back to a plain stream-ordered launch.
constexpr bool kCombinePdl = true;
constexpr int kCombineRows = kThreads / kCombineThreadsPerRow;  // rows of a block per row a thread

// Rows a combine thread merges, from the rows of the whole batch: one while
// the grid is small (b=8 x 128 heads: 512 blocks, each thread 8 partials of
// its row in flight), more as the row count, and with it the block count,
// grows (H200: b=32 x 128 heads, 4 rows a thread).
int combine_rows_per_thread(int64_t batch, int64_t rows_cap) {
  const int64_t rows = batch * rows_cap;
  return rows >= 4096 ? 4 : rows >= 2048 ? 2 : 1;
}

template <bool kBf16, int kRowsPerThread, class Idx>
__global__ void __launch_bounds__(kThreads) mla_decode_combine_kernel(const DecodeParams<Idx> p) {
  // Launched as a programmatic dependent of the decode kernel (sm_90+), this
  // block may start while the decode still runs: everything up to the wait
  // below reads only what was complete before the decode began (the plan's
  // metadata, the index tensors), so those dependent loads overlap the
  // decode's tail instead of following it.
  constexpr int R = kRowsPerThread;
  constexpr int kGroup = kCombineLoads / R;  // partials of each row per round
  static_assert(kGroup * R == kCombineLoads, "rows a thread divide the loads in flight");
  const int64_t b = blockIdx.x;
  const int32_t* md = p.metadata;
  int64_t batch = md[kHdrBatch];
  batch = batch < p.batch ? batch : p.batch;
  batch = batch < p.max_batch ? batch : p.max_batch;
  if (b >= batch) return;
  const int32_t* split = md + ScheduleLayout{p.max_batch, p.max_work}.split_indptr();
  const int64_t first = split[b], last = split[b + 1];
  const int64_t qo_begin = static_cast<int64_t>(p.qo_indptr[b * p.qo_indptr_stride]);
  const int64_t qo_end = static_cast<int64_t>(p.qo_indptr[(b + 1) * p.qo_indptr_stride]);
  const int64_t kv_len = static_cast<int64_t>(p.kv_len[b * p.kv_len_stride]);
  if (qo_begin < 0 || qo_end < qo_begin || qo_end > p.total_q) return;
  const int H = p.num_heads;
  const int64_t rows = (qo_end - qo_begin) * H;
  const int64_t rows_cap = decode_partial_rows(p.max_qo_len, H);
  const int col = threadIdx.x % kCombineThreadsPerRow;
  // Row r of this thread: the block's rows are R slabs of kCombineRows, so
  // each load instruction still covers whole 2 KB rows.
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * (kCombineRows * R) + threadIdx.x / kCombineThreadsPerRow;
  const bool merge = last > first;
  if (!merge && kv_len > 0) return;  // the decode wrote this request directly
  const int64_t row_end = merge && rows_cap < rows ? rows_cap : rows;
  if (row0 >= row_end) return;  // so is every later row of this thread
#if defined(MLACORE_GPU_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // The decode kernel's partials (and, for an empty request, its zeros) are
  // complete and visible after this.
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif

  // Partials outside the workspace (a schedule bug) are skipped, never read.
  // One pass, kGroup partials of each of the R rows (LSE and float4 each)
  // loaded together and merged into running maxima: one memory latency per
  // round, where a pass for the maximum and another for the sum cost one per
  // partial plus one per four (ncu, b=8 x 8 partials: 11 us at 1.3 TB/s).
  const int64_t lo = first > 0 ? first : 0, hi = last < p.max_partials ? last : p.max_partials;
  float4 acc[R];
  float mx[R], wsum[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    acc[r] = make_float4(0.f, 0.f, 0.f, 0.f);
    mx[r] = -INFINITY;
    wsum[r] = 0.f;
  }
  if (merge) {
    for (int64_t i0 = lo; i0 < hi; i0 += kGroup) {
      float l[R][kGroup];
      float4 v[R][kGroup];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int64_t row = row0 + r * kCombineRows;
#pragma unroll
        for (int k = 0; k < kGroup; ++k) {
          const int64_t i = i0 + k;
          const bool in = i < hi && row < row_end;
          l[r][k] = in ? p.partial_lse[i * rows_cap + row] : -INFINITY;
          v[r][k] = in ? reinterpret_cast<const float4*>(p.partial_o + (i * rows_cap + row) * kCkvDim)[col]
                       : make_float4(0.f, 0.f, 0.f, 0.f);
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float gm = mx[r];
#pragma unroll
        for (int k = 0; k < kGroup; ++k) gm = fmaxf(gm, l[r][k]);
        if (gm == -INFINITY) continue;  // nothing but empty partials so far
        const float rescale = exp2f(mx[r] - gm);  // 0 while mx is still -inf
        acc[r].x *= rescale;
        acc[r].y *= rescale;
        acc[r].z *= rescale;
        acc[r].w *= rescale;
        wsum[r] *= rescale;
#pragma unroll
        for (int k = 0; k < kGroup; ++k) {
          const float w = exp2f(l[r][k] - gm);
          wsum[r] += w;
          acc[r].x += w * v[r][k].x;
          acc[r].y += w * v[r][k].y;
          acc[r].z += w * v[r][k].z;
          acc[r].w += w * v[r][k].w;
        }
        mx[r] = gm;
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t row = row0 + r * kCombineRows;
    if (row >= row_end) break;
    const float inv = wsum[r] > 0.f ? 1.f / wsum[r] : 0.f;
    const int64_t t = row / H, h = row % H;
    uint16_t* dst = static_cast<uint16_t*>(p.out) + (qo_begin + t) * p.out_stride_t + h * p.out_stride_h;
    const float o[4] = {acc[r].x * inv, acc[r].y * inv, acc[r].z * inv, acc[r].w * inv};
    uint16_t e16[4];
    for (int e = 0; e < 4; ++e) e16[e] = kBf16 ? float_to_bf16(o[e]) : float_to_f16(o[e]);
    uint2 packed;
    packed.x = static_cast<uint32_t>(e16[0]) | (static_cast<uint32_t>(e16[1]) << 16);
    packed.y = static_cast<uint32_t>(e16[2]) | (static_cast<uint32_t>(e16[3]) << 16);
    *reinterpret_cast<uint2*>(dst + 4 * col) = packed;
    if (p.lse && col == 0)
      p.lse[(qo_begin + t) * p.lse_stride_t + h * p.lse_stride_h] =
          wsum[r] > 0.f ? mx[r] + log2f(wsum[r]) : -INFINITY;
  }
}

#if defined(MLACORE_GPU_CUDA)
// MLACORE_DECODE_KERNEL=mma keeps 64-row tiles on the mma.sync kernel on
// sm_90a too (A/B comparisons, a fallback in the field); unset or "wgmma",
// the wgmma kernel (mla_decode_sm90.cu) is tried first. Read once.
bool wgmma_decode_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("MLACORE_DECODE_KERNEL");
    return !(v && std::strcmp(v, "mma") == 0);
  }();
  return enabled;
}
#endif

template <bool kBf16, class Idx>
void launch_typed(const DecodeParams<Idx>& p, bool portable, gpuStream_t stream) {
  const int64_t rows_cap = decode_partial_rows(p.max_qo_len, p.num_heads);
  if (p.max_work > 0x7fffffff) runtime_error("mla_decode: max_work ", p.max_work, " exceeds the grid limit");
#if defined(MLACORE_GPU_CUDA)
  if (!portable) {
    const int smem_optin = gpu::device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(p.device);
    auto run = [&](auto kernel, int rows_per_cta, int smem) {
      gpu::check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
                 "cudaFuncSetAttribute(mla_decode_mma_kernel)");
      kernel<<<decode_tiled_grid(p.max_work, rows_cap, rows_per_cta), kThreads, smem, stream>>>(p);
      gpu::check_launch("mla_decode_mma_kernel");
    };
    // Up to 16 query rows per request (heads=16 decode): one 16-row group, so
    // the MMAs do no padding work. Else 64-row tiles.
    if (rows_cap <= 16 && MmaConfig<1>::kSmem <= smem_optin) {
      run(mla_decode_mma_kernel<kBf16, 1, Idx>, 16, MmaConfig<1>::kSmem);
    } else if (rows_cap > 16 && MmaConfig<4>::kSmem <= smem_optin) {
      // The wgmma kernel writes the same outputs and partials; it declines
      // (launching nothing) off sm_90a.
      if (!(wgmma_decode_enabled() && launch_mla_decode_sm90(p, kBf16, stream)))
        run(mla_decode_mma_kernel<kBf16, 4, Idx>, 64, MmaConfig<4>::kSmem);
    } else {
      portable = true;  // GPUs with less shared memory per block than an H100 (A100: 163 KB)
    }
  }
#else
  portable = true;
#endif
  if (portable) {
    if (rows_cap > 65535) runtime_error("mla_decode: ", rows_cap, " query rows exceed the portable kernel's grid");
    const dim3 grid(static_cast<unsigned>(p.max_work), static_cast<unsigned>(rows_cap));
    mla_decode_portable_kernel<kBf16, Idx><<<grid, kThreads, 0, stream>>>(p);
    gpu::check_launch("mla_decode_portable_kernel");
  }
  const int64_t batch = p.batch < p.max_batch ? p.batch : p.max_batch;
  if (batch > 0) {
    const int per_thread = combine_rows_per_thread(batch, rows_cap);
    const int64_t block_rows = static_cast<int64_t>(kCombineRows) * per_thread;
    const dim3 grid(static_cast<unsigned>(batch), static_cast<unsigned>((rows_cap + block_rows - 1) / block_rows));
    auto combine = per_thread == 4   ? mla_decode_combine_kernel<kBf16, 4, Idx>
                   : per_thread == 2 ? mla_decode_combine_kernel<kBf16, 2, Idx>
                                     : mla_decode_combine_kernel<kBf16, 1, Idx>;
#if defined(MLACORE_GPU_CUDA)
    // Programmatic dependent launch: the combine's launch overlaps the decode
    // kernel's tail instead of following it (a few us of a ~100 us decode).
    // Only when the combine that will run was compiled for sm_90+, so it
    // carries the griddepcontrol.wait that orders it after the decode.
    // The image's binaryVersion is fixed for the process: asked once per device
    // (once for the three row counts: kernels of one file, the same targets).
    const int binary = !kCombinePdl ? 0 : gpu::once_per_device(p.device, [combine] {
      cudaFuncAttributes attr{};
      gpu::check(cudaFuncGetAttributes(&attr, combine), "cudaFuncGetAttributes(mla_decode_combine_kernel)");
      return attr.binaryVersion;
    });
    if (binary >= 90) {
      cudaLaunchConfig_t cfg{};
      cfg.gridDim = grid;
      cfg.blockDim = dim3(kThreads);
      cfg.dynamicSmemBytes = 0;
      cfg.stream = stream;
      cudaLaunchAttribute pdl[1];
      pdl[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      pdl[0].val.programmaticStreamSerializationAllowed = 1;
      cfg.attrs = pdl;
      cfg.numAttrs = 1;
      gpu::check(cudaLaunchKernelEx(&cfg, combine, p), "mla_decode_combine_kernel");
      return;
    }
#endif
    combine<<<grid, kThreads, 0, stream>>>(p);
    gpu::check_launch("mla_decode_combine_kernel");
  }
}

}  // namespace

template <class Idx>
void launch_mla_decode(const DecodeParams<Idx>& p, DecodeDType dtype, bool portable, void* stream) {
  gpu::DeviceGuard guard(p.device);
  if (dtype == DecodeDType::BF16) launch_typed<true>(p, portable, gpu::as_stream(stream));
  else launch_typed<false>(p, portable, gpu::as_stream(stream));
}

template void launch_mla_decode<int32_t>(const DecodeParams<int32_t>&, DecodeDType, bool, void*);
template void launch_mla_decode<int64_t>(const DecodeParams<int64_t>&, DecodeDType, bool, void*);

}  // namespace mlacore
