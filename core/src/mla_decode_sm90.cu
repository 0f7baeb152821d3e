// MLA decode with wgmma (sm_90a), for 64-row query tiles (heads >= 32, or
// MTP). Same contract as mla_decode.cu's mma.sync kernel: one CTA per (work
// item, 64 packed query rows), 64-token KV tiles gathered through the page
// table, online softmax in base 2, the same direct / partial epilogue, so the
// combine kernel and the schedule are shared.
//
// Why: the mma.sync kernel re-reads K and V from shared memory with ldmatrix
// once per 16 query rows and is issue bound at heads=128. wgmma reads each
// shared-memory operand once per 64 rows, asynchronously.
//
// One CTA = two warpgroups (256 threads):
//  - Q (64 x 576) and each KV stage (64 x 576) sit in shared memory in the
//    128-byte-swizzle K-major layout of gpu/wgmma_sm90.cuh: 9 column blocks
//    of 64 elements. Both are loaded by cp.async, 16 bytes per thread, KV
//    gathered token by token through the page table into a double buffer
//    (tile i+1 loads while tile i computes).
//  - S = Q K^T: warpgroup g computes the 32 tokens [32g, 32g+32) of the tile
//    for all 64 rows (m64n32k16, 36 k-steps, A = Q and B = K from shared
//    memory). Its accumulator rows are the same rows the warpgroup holds in
//    O, so the softmax rescale needs no exchange beyond the row maxima.
//  - the two halves' row maxima meet in shared memory (one barrier); both
//    warpgroups then compute identical maxima, exponentiate their half of P,
//    store it as bf16/fp16 in the K-major layout (one 64 x 64 block), and
//    after a second barrier
//  - O += P V: warpgroup g owns output columns [256g, 256g+256) (128 fp32
//    registers per thread), m64n256k16 over the tile's 64 tokens (4 k-steps),
//    A = P and B = V (the first 512 dims of the same KV stage, MN-major, read
//    with the transpose-B immediate) from shared memory.
// Three barriers per tile (tile landed, maxima, P ready); each wgmma batch is
// waited for before the next phase. A first, simple version: no producer
// warpgroup, no overlap of S(i+1) with P V(i).
#include "gpu/compat.h"

#include <cstdint>

#include "decode_schedule.h"
#include "gpu/wgmma_sm90.cuh"
#include "mla_decode.h"
#include "mla_decode_device.cuh"
#include "mla_decode_sm90.h"

namespace mlacore {
namespace {

namespace wg = wgmma;

constexpr int kThreads = 256;
constexpr int kRows = kDecodeTileRows;
constexpr int kTok = kDecodeTileTokens;
constexpr int kBlocks = kQkDim / 64;               // 64-element column blocks per row
constexpr int kBlockBytes = 64 * 128;              // one column block of 64 rows
constexpr int kTileBytes = kBlocks * kBlockBytes;  // Q, or one KV stage
constexpr int kHalfTok = kTok / 2;                 // S columns per warpgroup
constexpr int kStages = 2;
// shared memory, bytes from a 1024-aligned base (the swizzle pattern of every
// operand must start on a 1024-byte boundary: descriptor base offset 0)
constexpr int kOffQ = 0;
constexpr int kOffKv = kOffQ + kTileBytes;
constexpr int kOffP = kOffKv + kStages * kTileBytes;
constexpr int kOffMax = kOffP + kBlockBytes;  // float[2][kRows]: each warpgroup's row maxima
constexpr int kOffSum = kOffMax + 2 * kRows * 4;  // float[2][kRows]: row sums, at the end
constexpr int kOffValid = kOffSum + 2 * kRows * 4;  // uint8[kStages][kTok]
constexpr int kSmemUsed = kOffValid + kStages * kTok;
// The dynamic shared memory base is only guaranteed 16-byte aligned: 1 KB of
// slack lets the kernel round it up.
constexpr int kSmem = kSmemUsed + 1024;
static_assert(kSmem <= 232448, "over the H100/H200 opt-in shared memory per block (227 KB)");
static_assert(kRows == 64 && kTok == 64, "one m64 wgmma row tile, 64-token tiles (4 k-steps of P V)");
static_assert(kOffKv % 1024 == 0 && kOffP % 1024 == 0 && kTileBytes % 1024 == 0, "swizzle atoms on 1 KB");
static_assert(kKpeDim == 64, "kpe is the ninth column block");
static_assert(kThreads == 8 * kHalfTok, "the loader gives each token row of a half tile to 8 threads");

template <bool kBf16, class Idx>
__global__ void __launch_bounds__(kThreads, 1) mla_decode_wgmma_kernel(const DecodeParams<Idx> p) {
#if defined(MLACORE_WGMMA_ENABLED)
  constexpr int kChunks = kQkDim / 8;  // 16-byte chunks per 576-element row
  constexpr int kOCols = kCkvDim / 2;  // O columns per warpgroup
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  const uint32_t s_base = smem_addr(smem);
  const uint32_t s_q = s_base + kOffQ, s_kv = s_base + kOffKv, s_p = s_base + kOffP;
  float* s_max = reinterpret_cast<float*>(smem + kOffMax);
  float* s_sum = reinterpret_cast<float*>(smem + kOffSum);
  unsigned char* s_valid = smem + kOffValid;

  // Lets the combine kernel launch once every CTA of this grid is resident;
  // it still waits (griddepcontrol.wait) for this grid to finish writing.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  const ItemView item = read_item(p, blockIdx.x);
  if (!item.ok) return;
  const int H = p.num_heads;
  const int64_t rows = item.qo_len * H;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kRows;
  if (row0 >= rows) return;
  const int64_t rows_cap = decode_partial_rows(p.max_qo_len, H);

  const int tid = threadIdx.x, g = tid >> 7, wtid = tid & 127, lane = tid & 31;

  const auto* qn = static_cast<const uint16_t*>(p.q_nope);
  const auto* qp = static_cast<const uint16_t*>(p.q_pe);
  const auto* ckv = static_cast<const uint16_t*>(p.ckv);
  const auto* kpe = static_cast<const uint16_t*>(p.kpe);

  // Query tile -> shared (zero rows past the request), once per CTA; it
  // joins tile 0's commit group.
  for (int i = tid; i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    const int64_t grow = row0 + r;
    const bool valid = grow < rows;
    const int64_t t = valid ? grow / H : 0, h = valid ? grow % H : 0;
    const uint16_t* src = c < kCkvDim / 8
        ? qn + (item.qo_begin + t) * p.q_nope_stride_t + h * p.q_nope_stride_h + c * 8
        : qp + (item.qo_begin + t) * p.q_pe_stride_t + h * p.q_pe_stride_h + (c - kCkvDim / 8) * 8;
    cp_async16(s_q + wg::sw128_tile(r, c, kRows), valid ? src : qn, valid);
  }

  int64_t page_begin = 0, page_end = 0;
  if (!p.pages.pages_of(item.b, page_begin, page_end)) page_end = page_begin;  // every token masked
  const int64_t num_req_pages = page_end - page_begin;
  // As in the mma.sync kernel: positions are < item.end <= INT32_MAX, so
  // 32-bit division (a shift for power-of-two pages) suffices.
  const uint32_t page_size =
      p.pages.page_size > 0x7fffffff ? 0x80000000u : static_cast<uint32_t>(p.pages.page_size);
  const bool pow2_pages = (page_size & (page_size - 1)) == 0;
  const int page_shift = __ffs(static_cast<int>(page_size)) - 1;

  const int64_t n_tiles = item.end > item.begin ? (item.end - item.begin + kTok - 1) / kTok : 0;

  // 8 threads per token row (each 8-lane group reads 128 contiguous bytes per
  // instruction); thread `tid` loads tokens ld_tok and ld_tok + 32 of a tile,
  // chunk ld_sub of every column block: a fixed swizzled offset per row plus
  // kBlockBytes per block.
  const int ld_tok = tid >> 3, ld_sub = tid & 7;
  auto fetch = [&](int64_t tile, int half) {
    PageRef r{-1, 0};
    const int64_t pos = item.begin + tile * kTok + half * kHalfTok + ld_tok;
    if (pos < item.end) {
      const uint32_t u = static_cast<uint32_t>(pos);
      const uint32_t in_req = pow2_pages ? u >> page_shift : u / page_size;
      r.off = static_cast<int32_t>(u - in_req * page_size);
      if (in_req < num_req_pages) {
        const int64_t raw = static_cast<int64_t>(p.pages.indices[(page_begin + in_req) * p.pages.indices_stride]);
        r.page = raw > 0x7fffffff ? -1 : static_cast<int32_t>(raw);
      }
    }
    return r;
  };
  // Tile `tile` into stage `stage` (rows past the item zero-filled, so no
  // stale shared memory meets a zero probability), then its commit group;
  // tiles past the item commit an empty group.
  auto issue = [&](int64_t tile, int stage, const PageRef (&ref)[2]) {
    if (tile < n_tiles) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const PageRef& r = ref[half];
        const int tok = half * kHalfTok + ld_tok;
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
    }
    cp_async_commit();
  };

  // The two rows (of the 64) this thread holds in every accumulator, S and
  // O alike, and the first KV position each may not see.
  const int r_lo = wg::acc_row(wtid, 0);
  int64_t limit[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t grow = row0 + r_lo + 8 * i;
    const int64_t t = grow / H;
    int64_t lim = p.causal ? item.kv_len - item.qo_len + t + 1 : item.kv_len;
    lim = lim < item.end ? lim : item.end;
    limit[i] = grow < rows ? lim : 0;
  }

  float o[kOCols / 2];
#pragma unroll
  for (int e = 0; e < kOCols / 2; ++e) o[e] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

  PageRef next[2];
  {
    const PageRef first[2] = {fetch(0, 0), fetch(0, 1)};
    issue(0, 0, first);
    next[0] = fetch(1, 0);
    next[1] = fetch(1, 1);
  }

  // Descriptors move by adding encoded byte offsets (offset >> 4) to a base:
  // every address stays below 256 KB, so the 14-bit field never carries.
  const uint64_t desc_q = wg::desc_k_sw128(s_q);
  const uint64_t desc_p = wg::desc_k_sw128(s_p);

  for (int64_t it = 0; it < n_tiles; ++it) {
    const int stage = static_cast<int>(it & 1);
    cp_async_wait_all();
    wg::fence_proxy_async();  // this thread's cp.async data, next read by wgmma
    // Tile `it` (and Q) visible to both warpgroups; both are done with tile
    // it-1 (its stage, P, the maxima), so tile it+1 may overwrite that stage.
    __syncthreads();
    issue(it + 1, stage ^ 1, next);
    next[0] = fetch(it + 2, 0);
    next[1] = fetch(it + 2, 1);

    const uint32_t kv = s_kv + stage * kTileBytes;
    const int64_t tile_start = item.begin + it * kTok;

    // S = Q K^T over 576 dims for this warpgroup's 32 tokens: rows
    // 32g..32g+31 of every column block of the stage.
    float s[kHalfTok / 2];
#pragma unroll
    for (int e = 0; e < kHalfTok / 2; ++e) s[e] = 0.f;
    const uint64_t desc_k = wg::desc_k_sw128(kv + g * kHalfTok * 128);
    wg::fence_regs(s);
    wg::fence();
#pragma unroll
    for (int kk = 0; kk < kQkDim / 16; ++kk) {
      const uint32_t off = wg::k_major_step(kk, kRows);  // Q and the stage both have 64 rows
      wg::mma_m64n32k16_ss<kBf16>(s, desc_q + (off >> 4), desc_k + (off >> 4));
    }
    wg::commit();
    wg::wait<0>();
    wg::fence_regs(s);

    // Mask, scale, and this warpgroup's row maxima (including the running one).
    const unsigned char* valid = s_valid + stage * kTok + g * kHalfTok;
    float mx[2] = {m_run[0], m_run[1]};
#pragma unroll
    for (int e = 0; e < kHalfTok / 2; ++e) {
      const int col = wg::acc_col(wtid, e);
      const int i = (e >> 1) & 1;
      const bool ok = tile_start + g * kHalfTok + col < limit[i] && valid[col];
      s[e] = ok ? s[e] * p.scale_log2 : -INFINITY;
      mx[i] = fmaxf(mx[i], s[e]);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
    }
    if ((lane & 3) == 0) {
      s_max[g * kRows + r_lo] = mx[0];
      s_max[g * kRows + r_lo + 8] = mx[1];
    }
    __syncthreads();

    // Both warpgroups compute the same maximum per row (fmaxf is exact, and
    // both fold in the same running maximum). A row that has seen nothing
    // valid keeps m = -inf; exponentiate it against 0 so no inf - inf.
    float m_use[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float m_new = fmaxf(mx[i], s_max[(g ^ 1) * kRows + r_lo + 8 * i]);
      m_use[i] = m_new == -INFINITY ? 0.f : m_new;
      const float alpha = fast_exp2(m_run[i] - m_use[i]);
      l_run[i] *= alpha;
      m_run[i] = m_new;
#pragma unroll
      for (int j = 0; j < kOCols / 8; ++j) {
        o[4 * j + 2 * i] *= alpha;
        o[4 * j + 2 * i + 1] *= alpha;
      }
    }
    // P (this warpgroup's 32 tokens) -> shared, one 64 x 64 K-major block.
#pragma unroll
    for (int j = 0; j < kHalfTok / 8; ++j) {
      const float p0 = fast_exp2(s[4 * j] - m_use[0]), p1 = fast_exp2(s[4 * j + 1] - m_use[0]);
      const float p2 = fast_exp2(s[4 * j + 2] - m_use[1]), p3 = fast_exp2(s[4 * j + 3] - m_use[1]);
      l_run[0] += p0 + p1;
      l_run[1] += p2 + p3;
      const int tok = g * kHalfTok + wg::acc_col(wtid, 4 * j);
      wg::st_pair(s_p, r_lo, tok, pack2<kBf16>(p0, p1));
      wg::st_pair(s_p, r_lo + 8, tok, pack2<kBf16>(p2, p3));
    }
    wg::fence_proxy_async();  // P, written by st.shared, is read by wgmma
    __syncthreads();

    // O += P V: V = dims [256g, 256g+256) of the stage, i.e. column blocks
    // 4g..4g+3 (LBO = one block), 16 tokens = 2048 bytes per k-step.
    const uint64_t desc_v = wg::desc_mn_sw128(kv + g * (kOCols / 64) * kBlockBytes, kBlockBytes);
    wg::fence_regs(o);
    wg::fence();
#pragma unroll
    for (int kt = 0; kt < kTok / 16; ++kt)
      wg::mma_m64n256k16_ss_tb<kBf16>(o, desc_p + (wg::k_major_step(kt, kRows) >> 4),
                                      desc_v + (wg::mn_major_step(kt) >> 4));
    wg::commit();
    wg::wait<0>();
    wg::fence_regs(o);
  }

  cp_async_wait_all();  // the query copy is still in flight when the item has no KV tile

  // Row sums: over the quad, then over the two warpgroups' token halves.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 1);
    l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 2);
  }
  if ((lane & 3) == 0) {
    s_sum[g * kRows + r_lo] = l_run[0];
    s_sum[g * kRows + r_lo + 8] = l_run[1];
  }
  __syncthreads();

  const bool to_partial = item.partial >= 0;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = r_lo + 8 * i;
    const float l = s_sum[r] + s_sum[kRows + r];
    const int64_t grow = row0 + r;
    if (grow >= rows || (to_partial && grow >= rows_cap)) continue;
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const float lse = l > 0.f ? m_run[i] + log2f(l) : -INFINITY;
    const int64_t t = grow / H, h = grow % H;
    const int col0 = g * kOCols + 2 * (lane & 3);
    if (to_partial) {
      float* dst = p.partial_o + (item.partial * rows_cap + grow) * kCkvDim + col0;
#pragma unroll
      for (int j = 0; j < kOCols / 8; ++j)
        *reinterpret_cast<float2*>(dst + j * 8) = make_float2(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
      if (g == 0 && (lane & 3) == 0) p.partial_lse[item.partial * rows_cap + grow] = lse;
    } else {
      uint16_t* dst =
          static_cast<uint16_t*>(p.out) + (item.qo_begin + t) * p.out_stride_t + h * p.out_stride_h + col0;
#pragma unroll
      for (int j = 0; j < kOCols / 8; ++j)
        *reinterpret_cast<uint32_t*>(dst + j * 8) = pack2<kBf16>(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
      if (p.lse && g == 0 && (lane & 3) == 0) p.lse[(item.qo_begin + t) * p.lse_stride_t + h * p.lse_stride_h] = lse;
    }
  }
#else
  // Compiled for a target without wgmma: the launcher refuses to launch it
  // (binary check below), so reaching this is a dispatch bug.
  (void)p;
#if defined(__CUDA_ARCH__)
  __trap();
#endif
#endif  // MLACORE_WGMMA_ENABLED
}

// Whether the library holds sm_90a code for this kernel: meson defines
// MLACORE_HAVE_SM90A when sm_targets lists 90a and not plain 90 (with both,
// which of the two cubins the driver loads is not ours to know, and the sm_90
// one is the trapping body).
constexpr bool kBuiltForSm90a =
#if defined(MLACORE_HAVE_SM90A)
    true;
#else
    false;
#endif

template <bool kBf16, class Idx>
bool launch_typed_sm90(const DecodeParams<Idx>& p, gpuStream_t stream) {
  if (!kBuiltForSm90a) return false;
  auto kernel = mla_decode_wgmma_kernel<kBf16, Idx>;
  int major = 0, minor = 0, smem_optin = 0;
  gpu::check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, p.device), "cudaDeviceGetAttribute");
  gpu::check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, p.device), "cudaDeviceGetAttribute");
  gpu::check(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, p.device),
             "cudaDeviceGetAttribute");
  // sm_90a code runs on compute capability 9.0 only.
  if (major != 9 || minor != 0 || smem_optin < kSmem) return false;
  // The cubin the runtime picked for this device must be the sm_90 one
  // (binaryVersion 90); no image at all reports an error, cleared here so
  // the next launch check does not see it.
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, kernel) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  if (attr.binaryVersion != 90) return false;
  gpu::check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
             "cudaFuncSetAttribute(mla_decode_wgmma_kernel)");
  const int64_t rows_cap = decode_partial_rows(p.max_qo_len, p.num_heads);
  const dim3 grid(static_cast<unsigned>(p.max_work), static_cast<unsigned>((rows_cap + kRows - 1) / kRows));
  kernel<<<grid, kThreads, kSmem, stream>>>(p);
  gpu::check_launch("mla_decode_wgmma_kernel");
  return true;
}

}  // namespace

template <class Idx>
bool launch_mla_decode_sm90(const DecodeParams<Idx>& p, bool bf16, gpuStream_t stream) {
  return bf16 ? launch_typed_sm90<true>(p, stream) : launch_typed_sm90<false>(p, stream);
}

template bool launch_mla_decode_sm90<int32_t>(const DecodeParams<int32_t>&, bool, gpuStream_t);
template bool launch_mla_decode_sm90<int64_t>(const DecodeParams<int64_t>&, bool, gpuStream_t);

}  // namespace mlacore
