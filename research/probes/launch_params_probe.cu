// Does the size of a kernel's parameters change its device time as CUDA events
// see it? The paged append's rows kernel takes about 340 bytes of parameters,
// FlashInfer's append kernels about 120, and with the L2 flushed before each
// call the events around a decode-step append measure 2.5-3.0 us more than the
// kernel's own duration for mlacore and 2.35-2.55 us for FlashInfer
// (research/measurements/2026-12-03-1fc8fc9-h200-append.txt). This launches one
// small kernel body (one dependent load chain, then a store, as a decode step's
// append) with 16 to 4096 bytes of parameters, 5 blocks of 256 threads, the L2
// flushed (256 MB memset) before each call, and prints the median event time
// per call for each size, in alternating rounds.
//   nvcc -O2 -arch=sm_90a -o /tmp/launch_params_probe research/probes/launch_params_probe.cu && /tmp/launch_params_probe
#include <algorithm>
#include <cstdio>
#include <vector>

#include <cuda_runtime.h>

template <int N>
struct Pad {
  long long w[N / 8];
};

// out[i] = table[index[i]] for the block's tokens: two dependent loads, then a store.
template <int N>
__global__ void body(Pad<N> pad, const int* index, const int* table, int* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const int j = index[i];
  out[i] = table[j] + static_cast<int>(pad.w[(i & 1) * (N / 8 - 1)]);
}

template <int N>
float time_one(cudaStream_t s, void* flush, size_t flush_bytes, const int* index, const int* table, int* out,
               cudaEvent_t a, cudaEvent_t b) {
  Pad<N> pad{};
  cudaMemsetAsync(flush, 0, flush_bytes, s);
  cudaEventRecord(a, s);
  body<N><<<5, 256, 0, s>>>(pad, index, table, out);
  cudaEventRecord(b, s);
  cudaEventSynchronize(b);
  float ms = 0.f;
  cudaEventElapsedTime(&ms, a, b);
  return ms * 1e3f;
}

int main() {
  const size_t flush_bytes = size_t{256} << 20;
  void* flush;
  int *index, *table, *out;
  cudaMalloc(&flush, flush_bytes);
  cudaMalloc(&index, 5 * 256 * 4);
  cudaMalloc(&table, 1 << 24);
  cudaMalloc(&out, 5 * 256 * 4);
  cudaMemset(index, 0, 5 * 256 * 4);
  cudaMemset(table, 0, 1 << 24);
  cudaStream_t s;
  cudaStreamCreate(&s);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  using Fn = float (*)(cudaStream_t, void*, size_t, const int*, const int*, int*, cudaEvent_t, cudaEvent_t);
  const int sizes[] = {16, 128, 256, 512, 1024, 4096};
  const Fn fns[] = {time_one<16>, time_one<128>, time_one<256>, time_one<512>, time_one<1024>, time_one<4096>};
  const int n = 6;
  std::vector<std::vector<float>> us(n);
  for (int round = 0; round < 40; ++round)
    for (int k = 0; k < n; ++k) {
      const int i = (k + round) % n;
      for (int rep = 0; rep < 10; ++rep) {
        const float t = fns[i](s, flush, flush_bytes, index, table, out, a, b);
        if (round > 0) us[i].push_back(t);
      }
    }
  if (cudaDeviceSynchronize() != cudaSuccess) {
    std::printf("CUDA error: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 1;
  }
  std::printf("param bytes   median us   p10 us   p90 us   (390 calls each, L2 flushed before each)\n");
  for (int i = 0; i < n; ++i) {
    std::sort(us[i].begin(), us[i].end());
    const size_t m = us[i].size();
    std::printf("%11d   %9.2f   %6.2f   %6.2f\n", sizes[i], us[i][m / 2], us[i][m / 10], us[i][m * 9 / 10]);
  }
  return 0;
}
