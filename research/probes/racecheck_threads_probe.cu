// Do several host threads launching at once make compute-sanitizer's racecheck
// stall? test_edge_cases.py's two threaded tests (16 threads mapping slots, 18
// threads planning and decoding) pass under memcheck in seconds but made no
// progress under racecheck in 170-300 s, every worker inside an mlacore call
// (docs/RELIABILITY.md). This is the same pattern without mlacore, torch or
// Python: T host threads, each launching a small kernel that uses shared
// memory (so racecheck instruments it) and copying its result back, R times,
// released together by a barrier; on the legacy default stream (what torch's
// current stream is unless set, so what those tests launch on) or on a stream
// per thread.
//
//   nvcc -O3 -arch=sm_90a -std=c++17 research/probes/racecheck_threads_probe.cu -o /tmp/rtp
//   /tmp/rtp default 16 3        # plain: PASS and the time
//   timeout 300 compute-sanitizer --tool racecheck /tmp/rtp default 16 3
//   timeout 300 compute-sanitizer --tool racecheck /tmp/rtp streams 16 3
//   timeout 300 compute-sanitizer --tool racecheck /tmp/rtp default 1 48   # the same launches, one thread
// If the threaded runs stall where the one-thread run finishes, racecheck does
// not cope with concurrent host threads and the tests' hang is not mlacore's.
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

namespace {

constexpr int kThreads = 128, kElems = 4096;

// Reverses a block's slice through shared memory: a __syncthreads-ordered
// write/read pair racecheck must track (and find race-free).
__global__ void reverse_through_shared(const int* in, int* out) {
  __shared__ int tile[kThreads];
  const int base = blockIdx.x * kThreads;
  tile[threadIdx.x] = in[base + threadIdx.x];
  __syncthreads();
  out[base + threadIdx.x] = tile[kThreads - 1 - threadIdx.x];
}

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  return false;
}

// Releases every worker at once, as threading.Barrier does in the tests.
class StartLine {
 public:
  explicit StartLine(int n) : left_(n) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(m_);
    if (--left_ == 0) cv_.notify_all();
    else cv_.wait(lock, [this] { return left_ == 0; });
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int left_;
};

}  // namespace

int main(int argc, char** argv) {
  const bool own_streams = argc > 1 && std::strcmp(argv[1], "streams") == 0;
  const int n_threads = argc > 2 ? std::atoi(argv[2]) : 16;
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 3;
  if (n_threads < 1 || rounds < 1) return 2;

  std::vector<int> host_in(kElems);
  for (int i = 0; i < kElems; ++i) host_in[i] = i * 7 + 3;
  int* d_in = nullptr;
  if (!ok(cudaMalloc(&d_in, kElems * sizeof(int)), "cudaMalloc") ||
      !ok(cudaMemcpy(d_in, host_in.data(), kElems * sizeof(int), cudaMemcpyHostToDevice), "cudaMemcpy"))
    return 2;

  std::atomic<int> wrong{0}, failed{0};
  StartLine start(n_threads);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> workers;
  for (int w = 0; w < n_threads; ++w) {
    workers.emplace_back([&] {
      cudaStream_t stream = nullptr;  // the legacy default stream unless own_streams
      int* d_out = nullptr;
      std::vector<int> host_out(kElems);
      if ((own_streams && !ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream")) ||
          !ok(cudaMalloc(&d_out, kElems * sizeof(int)), "cudaMalloc")) {
        failed.fetch_add(1);
        start.arrive_and_wait();
        return;
      }
      start.arrive_and_wait();
      for (int r = 0; r < rounds; ++r) {
        reverse_through_shared<<<kElems / kThreads, kThreads, 0, stream>>>(d_in, d_out);
        // A blocking copy back, as torch.equal's .item() does in the tests.
        if (!ok(cudaGetLastError(), "launch") ||
            !ok(cudaMemcpyAsync(host_out.data(), d_out, kElems * sizeof(int), cudaMemcpyDeviceToHost, stream),
                "copy") ||
            !ok(cudaStreamSynchronize(stream), "sync")) {
          failed.fetch_add(1);
          break;
        }
        for (int i = 0; i < kElems; ++i) {
          const int b = i / kThreads, t = i % kThreads;
          if (host_out[i] != host_in[b * kThreads + kThreads - 1 - t]) {
            wrong.fetch_add(1);
            break;
          }
        }
      }
      cudaFree(d_out);
      if (own_streams) cudaStreamDestroy(stream);
    });
  }
  for (auto& t : workers) t.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  cudaFree(d_in);
  const bool pass = wrong.load() == 0 && failed.load() == 0;
  std::printf("%s x%d threads x%d rounds: %s (%d wrong, %d failed) in %.2f s\n",
              own_streams ? "streams" : "default", n_threads, rounds, pass ? "PASS" : "FAIL", wrong.load(),
              failed.load(), s);
  return pass ? 0 : 1;
}
