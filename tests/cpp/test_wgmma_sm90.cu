// Checks the wgmma building blocks of the sm_90a MLA decode kernel
// (core/src/gpu/wgmma_sm90.cuh) in isolation, with the kernel's own shapes
// and operand placement, against a CPU fp32/double reference:
//   qk64: S[64 x 64] = Q[64 x 576] K[64 x 576]^T, computed by warpgroup 0
//       alone with m64n64k16 over the whole 64-token tile (A = Q, B = K,
//       both K-major SW128, 36 k-steps), as the kernel's softmax warpgroup
//       does; warpgroup 1 idles.
//   pv: O[64 x 512] = P[64 x 64] V[64 x 512], V the first 512 dims of a
//       64 x 576 tile. P written to shared memory from A-operand-layout
//       registers by warpgroup 0 with store_a_block (stmatrix), as the
//       kernels do, then warpgroup g computes columns [256g, 256g+256) with
//       m64n256k16 (A = P K-major, B = V MN-major via transpose-B).
//   pv_rs: the same O with P as the register A operand (the kernel's
//       warpgroup 0 path): every thread holds P in the m64n64k16
//       accumulator layout (as S after the softmax), packs it with
//       wg::acc_to_a and feeds registers 4kt..4kt+3 to k-step kt of
//       m64n256k16 (B = V MN-major via transpose-B); warpgroup g computes
//       columns [256g, 256g+256), so both halves of V go through that path.
//   qk64_rs: qk64 with Q's last column block (the rope part) as the register
//       A operand: wg::load_a_block reads it from the swizzled tile and
//       m64n64k16_rs consumes it (the seesaw kernel's S).
//   qk64_tma: qk64 with the K tile loaded by TMA (gpu/tma_map.h,
//       gpu/tma_sm90.cuh): nine 64 x 64 boxes of page 1 of a three-page cache
//       whose ckv and kpe are the halves of one [3, 64, 576] buffer, onto one
//       mbarrier; the 128-byte swizzle TMA writes must be the layout the
//       descriptors read. Then with the page coordinate 3, past the pool:
//       every box must arrive as zeros (how the seesaw kernel reads a bad page id).
// Each for bf16 and fp16. A wrong descriptor field, swizzle or fragment map
// shows as a large error; the first mismatch is printed to pin it.
//
// Built by meson on CUDA builds with the sm_90a target; `meson test` runs it
// and it reports a skip (exit 77) where no compute capability 9.0 GPU is present.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#define CHECK(x)                                                                              \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "gpu/tma_map.h"
#include "gpu/tma_sm90.cuh"
#include "gpu/wgmma_sm90.cuh"

namespace wg = mlacore::wgmma;


constexpr int kRows = 64, kTok = 64, kDim = 576, kV = 512;
constexpr int kBlockBytes = 64 * 128;
constexpr int kTileBytes = kDim / 64 * kBlockBytes;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Row-major [64 x 576] 16-bit matrix from global into the SW128 K-major tile
// layout at `dst` (the layout the decode kernel's cp.async loader writes).
__device__ void load_tile(unsigned char* dst, const uint16_t* src) {
  for (int i = threadIdx.x; i < kRows * (kDim / 8); i += blockDim.x) {
    const int r = i / (kDim / 8), c = i % (kDim / 8);
    *reinterpret_cast<uint4*>(dst + wg::sw128_tile(r, c, kRows)) = reinterpret_cast<const uint4*>(src + r * kDim)[c];
  }
}

__device__ unsigned char* aligned_smem(unsigned char* raw) {
  return raw + ((1024u - (smem_u32(raw) & 1023u)) & 1023u);
}

// qk64 over a Q tile and a K tile already in shared memory, Q's rope block
// from registers when `rope_in_regs`; warpgroup 0 writes S to s_out.
template <bool kBf16>
__device__ void qk64_from_smem(unsigned char* s_q, unsigned char* s_k, float* s_out, bool rope_in_regs) {
#if defined(MLACORE_WGMMA_ENABLED)
  const int wtid = threadIdx.x;
  const uint64_t desc_q = wg::desc_k_sw128(smem_u32(s_q));
  const uint64_t desc_k = wg::desc_k_sw128(smem_u32(s_k));
  uint32_t rope[16];
  wg::load_a_block(smem_u32(s_q) + (kDim / 64 - 1) * kBlockBytes, wtid, rope);
  float s[32];
  for (int e = 0; e < 32; ++e) s[e] = 0.f;
  wg::fence_regs(s);
  wg::fence();
#pragma unroll
  for (int kk = 0; kk < kDim / 16; ++kk) {
    const uint32_t off = wg::k_major_step(kk, kRows);
    if (rope_in_regs && kk >= kDim / 16 - 4)
      wg::mma_m64n64k16_rs<kBf16>(s, rope + 4 * (kk - (kDim / 16 - 4)), wg::desc_at(desc_k, off));
    else
      wg::mma_m64n64k16_ss<kBf16>(s, wg::desc_at(desc_q, off), wg::desc_at(desc_k, off));
  }
  wg::commit();
  wg::wait<0>();
  wg::fence_regs(s);
  for (int e = 0; e < 32; ++e) s_out[wg::acc_row(wtid, e) * kTok + wg::acc_col(wtid, e)] = s[e];
#else
  (void)s_q, (void)s_k, (void)s_out, (void)rope_in_regs;
#endif
}

// qk64 (rope_in_regs false) or qk64_rs (true).
template <bool kBf16>
__global__ void __launch_bounds__(256, 1) qk64_probe(const uint16_t* q, const uint16_t* k, float* s_out,
                                                     bool rope_in_regs) {
#if defined(MLACORE_WGMMA_ENABLED)
  extern __shared__ __align__(16) unsigned char raw[];
  unsigned char* smem = aligned_smem(raw);
  load_tile(smem, q);
  load_tile(smem + kTileBytes, k);
  wg::fence_proxy_async();
  __syncthreads();
  if (threadIdx.x >= 128) return;
  qk64_from_smem<kBf16>(smem, smem + kTileBytes, s_out, rope_in_regs);
#else
  (void)q, (void)k, (void)s_out, (void)rope_in_regs;
#endif
}

// K by TMA: the nine boxes of `page` (ckv blocks 0-7 from ckv_map, block 8
// from kpe_map) onto one mbarrier expecting all of their bytes.
template <bool kBf16>
__global__ void __launch_bounds__(256, 1) qk64_tma_probe(const __grid_constant__ CUtensorMap ckv_map,
                                                         const __grid_constant__ CUtensorMap kpe_map,
                                                         const uint16_t* q, int page, float* s_out) {
#if defined(MLACORE_WGMMA_ENABLED)
  extern __shared__ __align__(16) unsigned char raw[];
  unsigned char* smem = aligned_smem(raw);
  __shared__ __align__(8) uint64_t bar;
  const uint32_t s_bar = smem_u32(&bar);
  if (threadIdx.x == 0) {
    wg::mbar_init(s_bar, 1);
    mlacore::tma::fence_barrier_init();
  }
  load_tile(smem, q);
  wg::fence_proxy_async();
  __syncthreads();
  if (threadIdx.x == 0) {
    mlacore::tma::arrive_expect_tx(s_bar, kDim / 64 * kBlockBytes);
    const uint32_t s_k = smem_u32(smem + kTileBytes);
    for (int j = 0; j < kDim / 64 - 1; ++j)
      mlacore::tma::load_3d(s_k + j * kBlockBytes, &ckv_map, 64 * j, 0, page, s_bar);
    mlacore::tma::load_3d(s_k + (kDim / 64 - 1) * kBlockBytes, &kpe_map, 0, 0, page, s_bar);
  }
  wg::mbar_wait(s_bar, 0);
  if (threadIdx.x >= 128) return;
  qk64_from_smem<kBf16>(smem, smem + kTileBytes, s_out, false);
#else
  (void)ckv_map, (void)kpe_map, (void)q, (void)page, (void)s_out;
#endif
}

template <bool kBf16>
__global__ void __launch_bounds__(256, 1) pv_probe(const uint16_t* pm, const uint16_t* v, float* o_out) {
#if defined(MLACORE_WGMMA_ENABLED)
  extern __shared__ __align__(16) unsigned char raw[];
  unsigned char* smem = aligned_smem(raw);
  unsigned char* s_p = smem + kTileBytes;
  load_tile(smem, v);
  const int g = threadIdx.x >> 7, wtid = threadIdx.x & 127;
  // P in the register A operand's layout (PTX ISA "WGMMA .m64nNk16 register
  // fragment layout for matrix A"), stored by warpgroup 0 through
  // store_a_block, as the kernels store P after their softmax.
  if (g == 0) {
    uint32_t a[16];
    const int row = wg::acc_row(wtid, 0), c2 = 2 * (wtid & 3);
    for (int kt = 0; kt < 4; ++kt)
      for (int m = 0; m < 4; ++m) {
        const int r = row + 8 * (m & 1), c = 16 * kt + 8 * (m >> 1) + c2;
        a[4 * kt + m] = pm[r * kTok + c] | (static_cast<uint32_t>(pm[r * kTok + c + 1]) << 16);
      }
    wg::store_a_block(smem_u32(s_p), wtid, a);
  }
  wg::fence_proxy_async();
  __syncthreads();
  const uint64_t desc_p = wg::desc_k_sw128(smem_u32(s_p));
  const uint64_t desc_v = wg::desc_mn_sw128(smem_u32(smem) + g * 4 * kBlockBytes, kBlockBytes);
  float o[128];
  for (int e = 0; e < 128; ++e) o[e] = 0.f;
  wg::fence_regs(o);
  wg::fence();
#pragma unroll
  for (int kt = 0; kt < kTok / 16; ++kt)
    wg::mma_m64n256k16_ss_tb<kBf16>(o, wg::desc_at(desc_p, wg::k_major_step(kt, kRows)), wg::desc_at(desc_v, wg::mn_major_step(kt)));
  wg::commit();
  wg::wait<0>();
  wg::fence_regs(o);
  for (int e = 0; e < 128; ++e) o_out[wg::acc_row(wtid, e) * kV + 256 * g + wg::acc_col(wtid, e)] = o[e];
#else
  (void)pm, (void)v, (void)o_out;
#endif
}

static uint16_t to_half_bits(float f, bool bf16) {
  if (bf16) {
    __nv_bfloat16 h = __float2bfloat16(f);
    uint16_t u;
    std::memcpy(&u, &h, 2);
    return u;
  }
  __half h = __float2half(f);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}
static float from_half_bits(uint16_t u, bool bf16) {
  if (bf16) {
    uint32_t x = static_cast<uint32_t>(u) << 16;
    float f;
    std::memcpy(&f, &x, 4);
    return f;
  }
  __half h;
  std::memcpy(&h, &u, 2);
  return __half2float(h);
}

static uint32_t rng = 12345;
static float urand() {  // [-1, 1)
  rng = rng * 1664525u + 1013904223u;
  return static_cast<float>(rng >> 8) / static_cast<float>(1 << 23) - 1.f;
}

// Max |got - want| relative to max |want|; prints the first bad element.
static bool report(const char* name, const std::vector<float>& got, const std::vector<double>& want, int cols) {
  double max_err = 0, max_ref = 0;
  int first_bad = -1;
  for (size_t i = 0; i < want.size(); ++i) max_ref = std::fmax(max_ref, std::fabs(want[i]));
  const double tol = 2e-3 * (max_ref > 1 ? max_ref : 1);
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= tol) && first_bad < 0) first_bad = static_cast<int>(i);
    if (!(err <= max_err)) max_err = err;  // catches NaN
  }
  const bool ok = first_bad < 0;
  std::printf("%-8s max_abs_err %.3e (max |ref| %.3e, tol %.1e)  %s\n", name, max_err, max_ref, tol, ok ? "PASS" : "FAIL");
  if (!ok) {
    const int r = first_bad / cols, c = first_bad % cols;
    std::printf("         first mismatch at row %d col %d: got %.5f want %.5f\n", r, c, got[first_bad], want[first_bad]);
    // Where does the wanted value appear, if anywhere? Points at a permutation.
    for (size_t i = 0; i < got.size(); ++i)
      if (std::fabs(got[i] - want[first_bad]) <= tol * 0.1) {
        std::printf("         (the wanted value appears at row %zu col %zu)\n", i / cols, i % cols);
        break;
      }
  }
  return ok;
}

template <bool kBf16>
__global__ void __launch_bounds__(256, 1) pv_rs_probe(const uint16_t* pm, const uint16_t* v, float* o_out) {
#if defined(MLACORE_WGMMA_ENABLED)
  extern __shared__ __align__(16) unsigned char raw[];
  unsigned char* smem = aligned_smem(raw);
  load_tile(smem, v);
  wg::fence_proxy_async();
  __syncthreads();
  const int g = threadIdx.x >> 7, wtid = threadIdx.x & 127;
  // P in the m64n64 accumulator layout (fp32, exact in 16 bits), as the
  // kernel's warpgroup 0 holds it after the softmax, then its A fragments.
  float s[kTok / 2];
#pragma unroll
  for (int e = 0; e < kTok / 2; ++e) {
    const uint16_t u = pm[wg::acc_row(wtid, e) * kTok + wg::acc_col(wtid, e)];
    if constexpr (kBf16) {
      s[e] = __uint_as_float(static_cast<uint32_t>(u) << 16);
    } else {
      s[e] = __half2float(__ushort_as_half(u));
    }
  }
  uint32_t pk[kTok / 4];
  wg::acc_to_a<kBf16>(s, pk);
  const uint64_t desc_v = wg::desc_mn_sw128(smem_u32(smem) + g * 4 * kBlockBytes, kBlockBytes);
  float o[128];
  for (int e = 0; e < 128; ++e) o[e] = 0.f;
  wg::fence_regs(o);
  wg::fence_regs(pk);
  wg::fence();
#pragma unroll
  for (int kt = 0; kt < kTok / 16; ++kt)
    wg::mma_m64n256k16_rs_tb<kBf16>(o, pk + 4 * kt, wg::desc_at(desc_v, wg::mn_major_step(kt)));
  wg::commit();
  wg::wait<0>();
  wg::fence_regs(o);
  wg::fence_regs(pk);
  for (int e = 0; e < 128; ++e) o_out[wg::acc_row(wtid, e) * kV + 256 * g + wg::acc_col(wtid, e)] = o[e];
#else
  (void)pm, (void)v, (void)o_out;
#endif
}

template <bool kBf16>
static bool run_case() {
  const bool bf16 = kBf16;
  const char* tag = kBf16 ? "bf16" : "fp16";
  std::vector<uint16_t> q(kRows * kDim), k(kTok * kDim), pm(kRows * kTok);
  std::vector<float> qf(q.size()), kf(k.size()), pf(pm.size());
  for (size_t i = 0; i < q.size(); ++i) qf[i] = from_half_bits(q[i] = to_half_bits(urand(), bf16), bf16);
  for (size_t i = 0; i < k.size(); ++i) kf[i] = from_half_bits(k[i] = to_half_bits(urand(), bf16), bf16);
  for (size_t i = 0; i < pm.size(); ++i) pf[i] = from_half_bits(pm[i] = to_half_bits(0.5f * (urand() + 1.f), bf16), bf16);

  std::vector<double> s_ref(kRows * kTok), o_ref(kRows * kV);
  for (int r = 0; r < kRows; ++r)
    for (int t = 0; t < kTok; ++t) {
      double acc = 0;
      for (int d = 0; d < kDim; ++d) acc += static_cast<double>(qf[r * kDim + d]) * kf[t * kDim + d];
      s_ref[r * kTok + t] = acc;
    }
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kV; ++c) {
      double acc = 0;
      for (int t = 0; t < kTok; ++t) acc += static_cast<double>(pf[r * kTok + t]) * kf[t * kDim + c];
      o_ref[r * kV + c] = acc;
    }

  uint16_t *d_q, *d_k, *d_p, *d_cache;
  float *d_s_m64, *d_o, *d_ors, *d_srs, *d_stma, *d_soob;
  CHECK(cudaMalloc(&d_q, q.size() * 2));
  CHECK(cudaMalloc(&d_k, k.size() * 2));
  CHECK(cudaMalloc(&d_p, pm.size() * 2));
  CHECK(cudaMalloc(&d_o, o_ref.size() * 4));
  CHECK(cudaMalloc(&d_s_m64, s_ref.size() * 4));
  CHECK(cudaMalloc(&d_ors, o_ref.size() * 4));
  CHECK(cudaMalloc(&d_srs, s_ref.size() * 4));
  CHECK(cudaMalloc(&d_stma, s_ref.size() * 4));
  CHECK(cudaMalloc(&d_soob, s_ref.size() * 4));
  // A [3, 64, 576] cache holding the K tile in page 1 (pages 0 and 2: other data).
  std::vector<uint16_t> cache(3 * kTok * kDim);
  for (size_t i = 0; i < cache.size(); ++i) cache[i] = to_half_bits(urand(), bf16);
  std::memcpy(cache.data() + kTok * kDim, k.data(), k.size() * 2);
  CHECK(cudaMalloc(&d_cache, cache.size() * 2));
  CHECK(cudaMemcpy(d_cache, cache.data(), cache.size() * 2, cudaMemcpyHostToDevice));
  CUtensorMap ckv_map, kpe_map;
  const uint64_t row_bytes = kDim * 2, page_bytes = kTok * kDim * 2;
  if (!mlacore::tma::encode_kv_map(&ckv_map, d_cache, bf16, kV, kTok, 3, row_bytes, page_bytes) ||
      !mlacore::tma::encode_kv_map(&kpe_map, d_cache + kV, bf16, kDim - kV, kTok, 3, row_bytes, page_bytes)) {
    std::printf("tma: the driver refused the tensor maps\n");
    return false;
  }
  CHECK(cudaMemcpy(d_q, q.data(), q.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_k, k.data(), k.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_p, pm.data(), pm.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(d_s_m64, 0xff, s_ref.size() * 4));  // NaN: unwritten elements fail
  CHECK(cudaMemset(d_o, 0xff, o_ref.size() * 4));
  CHECK(cudaMemset(d_ors, 0xff, o_ref.size() * 4));
  CHECK(cudaMemset(d_srs, 0xff, s_ref.size() * 4));
  CHECK(cudaMemset(d_stma, 0xff, s_ref.size() * 4));
  CHECK(cudaMemset(d_soob, 0xff, s_ref.size() * 4));

  const int smem_qk = 2 * kTileBytes + 1024, smem_pv = kTileBytes + kBlockBytes + 1024, smem_pv_rs = kTileBytes + 1024;
  CHECK(cudaFuncSetAttribute(pv_rs_probe<kBf16>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_pv_rs));
  CHECK(cudaFuncSetAttribute(pv_probe<kBf16>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_pv));
  CHECK(cudaFuncSetAttribute(qk64_probe<kBf16>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_qk));
  CHECK(cudaFuncSetAttribute(qk64_tma_probe<kBf16>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_qk));
  pv_probe<kBf16><<<1, 256, smem_pv>>>(d_p, d_k, d_o);  // V = the first 512 dims of the K tile
  CHECK(cudaGetLastError());
  qk64_probe<kBf16><<<1, 256, smem_qk>>>(d_q, d_k, d_s_m64, false);
  CHECK(cudaGetLastError());
  pv_rs_probe<kBf16><<<1, 256, smem_pv_rs>>>(d_p, d_k, d_ors);
  CHECK(cudaGetLastError());
  qk64_probe<kBf16><<<1, 256, smem_qk>>>(d_q, d_k, d_srs, true);
  CHECK(cudaGetLastError());
  qk64_tma_probe<kBf16><<<1, 256, smem_qk>>>(ckv_map, kpe_map, d_q, 1, d_stma);
  CHECK(cudaGetLastError());
  qk64_tma_probe<kBf16><<<1, 256, smem_qk>>>(ckv_map, kpe_map, d_q, 3, d_soob);  // past the pool: zeros
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());

  std::vector<float> s_m64(s_ref.size()), o(o_ref.size()), ors(o_ref.size()), srs(s_ref.size()),
      stma(s_ref.size()), soob(s_ref.size());
  CHECK(cudaMemcpy(srs.data(), d_srs, srs.size() * 4, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(stma.data(), d_stma, stma.size() * 4, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(soob.data(), d_soob, soob.size() * 4, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(s_m64.data(), d_s_m64, s_m64.size() * 4, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(o.data(), d_o, o.size() * 4, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(ors.data(), d_ors, ors.size() * 4, cudaMemcpyDeviceToHost));
  char name[32];
  std::snprintf(name, sizeof name, "qk64-%s", tag);
  const bool ok_s_m64 = report(name, s_m64, s_ref, kTok);
  std::snprintf(name, sizeof name, "pv-%s", tag);
  const bool ok_o = report(name, o, o_ref, kV);
  std::snprintf(name, sizeof name, "pv_rs-%s", tag);
  const bool ok_ors = report(name, ors, o_ref, kV);
  std::snprintf(name, sizeof name, "qk64_rs-%s", tag);
  const bool ok_srs = report(name, srs, s_ref, kTok);
  std::snprintf(name, sizeof name, "qk64_tma-%s", tag);
  const bool ok_stma = report(name, stma, s_ref, kTok);
  std::snprintf(name, sizeof name, "qk64_tma_oob-%s", tag);
  const bool ok_soob = report(name, soob, std::vector<double>(s_ref.size(), 0.0), kTok);
  cudaFree(d_q), cudaFree(d_k), cudaFree(d_p), cudaFree(d_s_m64), cudaFree(d_o), cudaFree(d_ors);
  cudaFree(d_srs), cudaFree(d_stma), cudaFree(d_soob), cudaFree(d_cache);
  return ok_s_m64 && ok_o && ok_ors && ok_srs && ok_stma && ok_soob;
}

int main() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s (cc %d.%d)\n", prop.name, prop.major, prop.minor);
  if (prop.major != 9 || prop.minor != 0) {
    std::printf("needs compute capability 9.0 (sm_90a): skipped\n");
    return 77;
  }
  std::printf("desc_k_sw128(0x400)      = 0x%016llx\n", static_cast<unsigned long long>(wg::desc_k_sw128(0x400)));
  std::printf("desc_mn_sw128(0x400, 8K) = 0x%016llx\n",
              static_cast<unsigned long long>(wg::desc_mn_sw128(0x400, kBlockBytes)));
  const bool ok = run_case<true>() & run_case<false>();
  std::printf("%s\n", ok ? "ALL PASS" : "SOME FAIL");
  return ok ? 0 : 1;
}
