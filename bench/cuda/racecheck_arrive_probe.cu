// Does compute-sanitizer's racecheck model bar.arrive? The wgmma decode kernel
// (core/src/mla_decode_sm90.cu) hands the per-row rescale factors from
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
//   nvcc -O3 -arch=sm_90a -std=c++17 bench/cuda/racecheck_arrive_probe.cu -o /tmp/racecheck_arrive_probe
//   compute-sanitizer --tool racecheck /tmp/racecheck_arrive_probe arrive
//   compute-sanitizer --tool racecheck /tmp/racecheck_arrive_probe sync
// Without the sanitizer it checks its own results and prints PASS or FAIL.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

namespace {

constexpr int kThreads = 256, kRows = 64, kTiles = 8;
constexpr int kBarPFull = 3, kBarPFree = 4;  // the decode kernel's ids

__device__ __forceinline__ void bar_sync(int id) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(kThreads) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(kThreads) : "memory");
}

template <bool kArrive>
__global__ void __launch_bounds__(kThreads) handoff(float* out) {
  __shared__ float x[kRows];  // the rescale factors: rewritten every tile
  __shared__ float y[kRows];  // the row sums: written once, after the loop
  const int g = threadIdx.x / 128, row = (threadIdx.x % 128) / 2;
  float acc = 0.f;
  for (int t = 0; t < kTiles; ++t) {
    if (g == 0) {
      if (t > 0) bar_sync(kBarPFree);
      if (threadIdx.x % 2 == 0) x[row] = static_cast<float>(t * kRows + row);
      bar_sync(kBarPFull);
    } else {
      bar_sync(kBarPFull);
      acc += x[row];
      if (t + 1 < kTiles) {
        if (kArrive) bar_arrive(kBarPFree);
        else bar_sync(kBarPFree);
      }
    }
  }
  if (g == 0 && threadIdx.x % 2 == 0) y[row] = static_cast<float>(row);
  __syncthreads();
  out[blockIdx.x * kThreads + threadIdx.x] = acc + y[row];
}

}  // namespace

int main(int argc, char** argv) {
  const bool arrive = argc < 2 || std::strcmp(argv[1], "sync") != 0;
  constexpr int kBlocks = 4;
  float* d_out = nullptr;
  if (cudaMalloc(&d_out, kBlocks * kThreads * sizeof(float)) != cudaSuccess) return 2;
  if (arrive) handoff<true><<<kBlocks, kThreads>>>(d_out);
  else handoff<false><<<kBlocks, kThreads>>>(d_out);
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
  std::printf("%s: %s (%d wrong of %d)\n", arrive ? "arrive" : "sync", bad ? "FAIL" : "PASS", bad, kBlocks * kThreads);
  cudaFree(d_out);
  return bad ? 1 : 0;
}
