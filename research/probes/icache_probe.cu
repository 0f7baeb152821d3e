// What straight-line code costs the first time a launch runs it. The plan's
// exchange kernel runs once per build, and every instruction between its entry
// and the flag it raises is on the host's latency path; if the SM fetches that
// code cold on every launch, the code's size, not its instruction count, sets
// the time.
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a research/probes/icache_probe.cu -o /tmp/icache_probe
// Each kernel runs a body of L 128-byte lines (8 independent IMADs a line, no
// memory access) twice in a loop that is not unrolled: the first pass fetches
// the body, the second runs it from the instruction cache. Per kernel: the
// medians over 400 launches (each followed by a stream sync, as the plan's
// build is) of both passes in SM cycles, the first pass's excess per line, and
// how many distinct SMs the launches landed on.
// Measured on the H200 (2026-12-02, 57acb65, research/measurements/2026-12-02-57acb65-h200-plan.txt): one warp
// runs even a 32 KB body as fast the first time as the second (fetch keeps up
// at 2 cycles an instruction); 256 threads pay 10-16 cycles a line more on the
// first pass (2670 cycles, 1.35 us, for 32 KB). Every launch landed on the
// same SM. So cold code costs the exchange kernel at most ~1 us across its
// ~19 KB before the flag: a part of its time, not the whole of it.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <vector>

#include <cuda_runtime.h>

#include "cuda_check.h"


__device__ __forceinline__ long long clock_now() {
  long long t;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
  return t;
}

// One 128-byte line: eight IMADs on eight independent accumulators.
#define LINE8                                                                                      \
  asm volatile(                                                                                    \
      "mad.lo.u32 %0, %0, %8, %9;\n\tmad.lo.u32 %1, %1, %8, %9;\n\tmad.lo.u32 %2, %2, %8, %9;\n\t"  \
      "mad.lo.u32 %3, %3, %8, %9;\n\tmad.lo.u32 %4, %4, %8, %9;\n\tmad.lo.u32 %5, %5, %8, %9;\n\t"  \
      "mad.lo.u32 %6, %6, %8, %9;\n\tmad.lo.u32 %7, %7, %8, %9;"                                    \
      : "+r"(x[0]), "+r"(x[1]), "+r"(x[2]), "+r"(x[3]), "+r"(x[4]), "+r"(x[5]), "+r"(x[6]), "+r"(x[7]) \
      : "r"(a), "r"(b))

template <int L>
__global__ void straight(unsigned a, unsigned b, unsigned* sink, long long* cycles) {
  unsigned x[8];
  for (int k = 0; k < 8; ++k) x[k] = threadIdx.x + k;
  long long t[3];
  t[0] = clock_now();
#pragma unroll 1
  for (int pass = 0; pass < 2; ++pass) {
#pragma unroll
    for (int i = 0; i < L; ++i) LINE8;
    t[pass + 1] = clock_now();
  }
  unsigned s = 0;
  for (int k = 0; k < 8; ++k) s ^= x[k];
  sink[threadIdx.x] = s;
  if (threadIdx.x == 0) {
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    cycles[0] = t[1] - t[0];
    cycles[1] = t[2] - t[1];
    cycles[2] = smid;
  }
}

long long median(std::vector<long long> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <int L>
void run(int threads, unsigned* sink, long long* cycles, long long* host) {
  constexpr int kLaunches = 400;
  std::vector<long long> first, second;
  std::set<long long> sms;
  for (int i = 0; i < kLaunches + 20; ++i) {
    straight<L><<<1, threads>>>(3u, 7u, sink, cycles);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(host, cycles, 3 * sizeof(long long), cudaMemcpyDeviceToHost));
    if (i < 20) continue;  // the module's first launches
    first.push_back(host[0]);
    second.push_back(host[1]);
    sms.insert(host[2]);
  }
  const long long f = median(first), s = median(second);
  std::printf("%5d lines (%6d bytes) %4d threads: first pass %7lld cycles, second %7lld, excess %6.1f cycles a line, "
              "%zu distinct SMs\n",
              L, L * 128, threads, f, s, double(f - s) / L, sms.size());
}

int main() {
  unsigned* sink = nullptr;
  long long *cycles = nullptr, host[3];
  CHECK(cudaMalloc(&sink, 1024 * sizeof(unsigned)));
  CHECK(cudaMalloc(&cycles, 3 * sizeof(long long)));
  int clock_khz = 0;
  CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  std::printf("SM clock attribute %d MHz; cycles are SM cycles\n", clock_khz / 1000);
  for (int threads : {32, 256}) {
    run<16>(threads, sink, cycles, host);
    run<64>(threads, sink, cycles, host);
    run<256>(threads, sink, cycles, host);
  }
  return 0;
}
