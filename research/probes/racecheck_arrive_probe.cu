// Does compute-sanitizer's racecheck model bar.arrive? The wgmma decode kernel
// (core/src/decode/mla_decode_sm90.cu) hands the per-row rescale factors from
// warpgroup 0 to warpgroup 1 through shared memory with two named barriers:
//   warpgroup 0, tile t: [t > 0: bar.sync PFree]  write X  bar.sync PFull
//   warpgroup 1, tile t: bar.sync PFull  read X  [t + 1 < n: bar.arrive PFree]
// and, after the loop, warpgroup 0 writes Y, __syncthreads(), everyone reads Y.
// Racecheck reported hazards on exactly these two pairs (RELIABILITY.md) while
// every result was right. This kernel is that protocol and nothing else, in
// two variants: `arrive` (as the decode kernel) and `sync` (PFree entered
// with bar.sync by both warpgroups, the form racecheck certainly models). The
// PTX ISA orders memory accesses before bar.arrive with those after the
// matching bar.sync, so both variants are race-free: hazards reported for
// `arrive` only mean racecheck does not model bar.arrive.
//
//   nvcc -O3 -arch=sm_90a -std=c++17 research/probes/racecheck_arrive_probe.cu -o /tmp/racecheck_arrive_probe
//   compute-sanitizer --tool racecheck /tmp/racecheck_arrive_probe arrive
//   compute-sanitizer --tool racecheck /tmp/racecheck_arrive_probe sync
// Without the sanitizer it checks its own results and prints PASS or FAIL.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>

namespace {

constexpr int kThreads = 256, kRows = 64, kTiles = 8;
constexpr int kBarKvFull = 1, kBarPFull = 3, kBarPFree = 4;  // the decode kernel's ids

__device__ __forceinline__ void bar_sync(int id) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(kThreads) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(kThreads) : "memory");
}

__device__ __forceinline__ void mbar_init(uint64_t* b, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(b))),
               "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
  asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(
                   static_cast<unsigned>(__cvta_generic_to_shared(b))) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, unsigned parity) {
  asm volatile(
      "{\n .reg .pred p;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra WAIT_%=;\n}\n" ::"r"(
          static_cast<unsigned>(__cvta_generic_to_shared(b))),
      "r"(parity) : "memory");
}

// kMode 0 `arrive`: as the decode kernel (warpgroup 1 bar.arrives PFree, warpgroup 0 bar.syncs it).
// kMode 1 `sync`: both bar.sync PFree. kMode 2 `arrive_kvfull`: as `arrive`, plus the decode
// kernel's KvFull, a bar.sync of both warpgroups between warpgroup 1's read of tile t and warpgroup
// 0's write of tile t+1 (so the read/write pair is also ordered by a barrier racecheck models).
// kMode 3 `mbarrier`: PFree is an mbarrier (warpgroup 1's 128 threads arrive, warpgroup 0 waits on
// the phase's parity) instead of a named barrier.
template <int kMode>
__global__ void __launch_bounds__(kThreads) handoff(float* out) {
  __shared__ float x[kRows];  // the rescale factors: rewritten every tile
  __shared__ float y[kRows];  // the row sums: written once, after the loop
  __shared__ __align__(8) uint64_t pfree;
  if (kMode == 3) {
    if (threadIdx.x == 0) mbar_init(&pfree, 128);
    __syncthreads();
  }
  const int g = threadIdx.x / 128, row = (threadIdx.x % 128) / 2;
  float acc = 0.f;
  for (int t = 0; t < kTiles; ++t) {
    if (g == 0) {
      if (t > 0) {
        if (kMode == 2) bar_sync(kBarKvFull);
        if (kMode == 3)
          mbar_wait(&pfree, static_cast<unsigned>((t - 1) & 1));
        else
          bar_sync(kBarPFree);
      }
      if (threadIdx.x % 2 == 0) x[row] = static_cast<float>(t * kRows + row);
      bar_sync(kBarPFull);
    } else {
      bar_sync(kBarPFull);
      acc += x[row];
      if (t + 1 < kTiles) {
        if (kMode == 2) bar_sync(kBarKvFull);
        if (kMode == 1)
          bar_sync(kBarPFree);
        else if (kMode == 3)
          mbar_arrive(&pfree);
        else
          bar_arrive(kBarPFree);
      }
    }
  }
  if (g == 0 && threadIdx.x % 2 == 0) y[row] = static_cast<float>(row);
  __syncthreads();
  out[blockIdx.x * kThreads + threadIdx.x] = acc + y[row];
}

}  // namespace

int main(int argc, char** argv) {
  const char* modes[] = {"arrive", "sync", "arrive_kvfull", "mbarrier"};
  int mode = 0;
  for (int m = 0; m < 4; ++m)
    if (argc > 1 && std::strcmp(argv[1], modes[m]) == 0) mode = m;
  constexpr int kBlocks = 4;
  float* d_out = nullptr;
  if (cudaMalloc(&d_out, kBlocks * kThreads * sizeof(float)) != cudaSuccess) return 2;
  switch (mode) {
    case 0: handoff<0><<<kBlocks, kThreads>>>(d_out); break;
    case 1: handoff<1><<<kBlocks, kThreads>>>(d_out); break;
    case 2: handoff<2><<<kBlocks, kThreads>>>(d_out); break;
    default: handoff<3><<<kBlocks, kThreads>>>(d_out); break;
  }
  float out[kBlocks * kThreads];
  if (cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost) != cudaSuccess) return 2;
  int bad = 0;
  for (int i = 0; i < kBlocks * kThreads; ++i) {
    const int tid = i % kThreads, row = (tid % 128) / 2;
    float want = static_cast<float>(row);
    if (tid >= 128)
      for (int t = 0; t < kTiles; ++t) want += static_cast<float>(t * kRows + row);
    bad += out[i] != want;
  }
  std::printf("%s: %s (%d wrong of %d)\n", modes[mode], bad ? "FAIL" : "PASS", bad, kBlocks * kThreads);
  cudaFree(d_out);
  return bad ? 1 : 0;
}
