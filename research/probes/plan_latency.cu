// Host latency of the plan build against the round trips it is compared with,
// measured from C++ (no Python in the way), on one GPU:
//   nvcc -O2 -std=c++17 $(python3 -m mlacore --cflags) research/probes/plan_latency.cu \
//        $(python3 -m mlacore --libs | sed 's/-Wl,/-Xlinker /g') -lcuda -o /tmp/plan_latency && /tmp/plan_latency
// Columns (us per call, median of 7 rounds of 2000 calls):
//   bare    cudaMemcpyAsync D2H of the three inputs' bytes into pinned memory + cudaStreamSynchronize
//   launch  an empty kernel launch + cudaStreamSynchronize (the floor of any kernel round trip)
//   build   mlacore_plan_build with device inputs (the exchange)
//   dev     mlacore_plan_build_device + cudaStreamSynchronize (launch + the schedule kernel on the GPU)
//   host    mlacore_plan_build with host inputs and a host metadata buffer (the schedule alone)
// Prototype of a copy-engine exchange (no kernel): D2H copies of the inputs, then stream memory
// operations (write "inputs ready" to mapped memory, wait for "schedule ready"), then an H2D
// copy of the schedule; the host polls, schedules from the pinned inputs, releases:
//   memops3 three cudaMemcpyAsync D2H + cuStreamBatchMemOp(write, wait) + H2D
//   memopsB one cudaMemcpyBatchAsync for the three D2H + memop + H2D
//   api_*   the host cost of single calls (the stream drained every 64 calls)
//   launch paths  the empty kernel's launch call through <<<>>>, cudaLaunchKernelEx and the
//           driver's cuLaunchKernel (its CUfunction fetched once), and its round trip both ways
// Measured on the H200 (2026-11-30): bare 6.5-7.4, launch 8.5-9.8, build 10.0-13.4 (1.4-2.0x bare),
// memops3 19-24, memopsB 16.5-20.7, api d2h 1.7, h2d 2.8, launch 3.6-4.3: a kernel's round trip
// alone costs 1.3-1.4x a copy's here, and stream memory operations are slower still.
// 2026-12-02, 8e6bff1 (research/measurements/2026-12-02-8e6bff1-h200-decode.txt): launch call 2.99-3.97 us through the
// runtime, 2.94-3.11 through cuLaunchKernel; empty round trip 8.0-9.0 against 7.9-8.2, bare
// 6.3-6.5, build 10.9-12.2: the launch path is worth at most 0.1-0.9 us of the build's gap.
// 2026-12-02, e858fb3 (research/measurements/2026-12-02-e858fb3-h200-plan.txt): signal 8.37-8.94 us (1.03-1.15x a bare 7.71-8.33),
// signal+copy 8.74-9.52 (1.07-1.23x), build 12.83-14.31 (1.58-1.82x): the handshake fits the
// 1.3x bar; the build's 3.5-5.4 us beyond signal+copy are its own work.
//   copy3   three cudaMemcpyAsync D2H + sync + host schedule + H2D (no kernel, no memops)
//   copyB   the same with one cudaMemcpyBatchAsync; bare3/bareB: the D2H copies + sync alone
//   handshake  signal: a kernel that stores a flag to mapped memory on entry and spins until the
//           host releases it, timed from the launch to the release (build()'s shape without its
//           work); signal+copy: the same after storing the inputs into mapped memory
// (build with -lcuda for the prototype)
#include <mlacore/mlacore.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include <cuda.h>
#include <cuda_runtime.h>

#include "cuda_check.h"

#define MCHECK(x)                                                                       \
  do {                                                                                  \
    if ((x) != MLACORE_OK) {                                                            \
      std::fprintf(stderr, "%s: %s\n", #x, mlacore_last_error());                       \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

__global__ void empty_kernel() {}

// The exchange's handshake without its work: thread 0 of one block tells the
// host it runs (a store to mapped memory after a system-scope fence) and spins
// until the host releases it. With `copy` it first stores the three inputs
// into mapped memory, as the exchange kernel does, one element a thread.
__global__ void signal_kernel(const int32_t* in, int32_t* staged, int n, volatile unsigned long long* flag,
                              volatile unsigned long long* go, unsigned long long seq, bool copy) {
  if (copy)
    for (int i = threadIdx.x; i < n; i += blockDim.x) staged[i] = in[i];
  __syncthreads();
  if (threadIdx.x != 0) return;
  __threadfence_system();
  *flag = seq;
  while (*go < seq) {
  }
}

template <class F>
double us_per_call(F&& f, int calls = 2000) {
  for (int i = 0; i < 200; ++i) f();
  std::vector<double> rounds;
  for (int r = 0; r < 7; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) f();
    rounds.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / calls);
  }
  std::sort(rounds.begin(), rounds.end());
  return rounds[3];
}

DLTensor vec(void* p, int64_t* shape, bool gpu) {
  DLTensor t{};
  t.data = p;
  t.device = {gpu ? kDLCUDA : kDLCPU, 0};
  t.ndim = 1;
  t.dtype = {kDLInt, 32, 1};
  t.shape = shape;
  return t;
}

int main() {
  CHECK(cudaSetDevice(0));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  constexpr int kMaxBatch = 256;
  mlacore_plan* plan = nullptr;
  mlacore_plan* host_plan = nullptr;
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  MCHECK(mlacore_plan_create(kMaxBatch, 0, sms, &plan));
  MCHECK(mlacore_plan_create(kMaxBatch, 0, sms, &host_plan));
  int64_t mb = 0, mw = 0;
  MCHECK(mlacore_plan_capacity(plan, &mb, &mw, nullptr));
  int64_t total = mlacore_plan_schedule_size(mb, mw);
  int32_t* meta = nullptr;
  CHECK(cudaMalloc(&meta, total * 4));
  std::vector<int32_t> host_meta(total + 4);
  int32_t *d_in = nullptr, *pinned = nullptr;
  CHECK(cudaMalloc(&d_in, 3 * (kMaxBatch + 1) * 4));
  CHECK(cudaHostAlloc(reinterpret_cast<void**>(&pinned), (4096 + 8192) * 4, cudaHostAllocMapped));
  for (int i = 0; i < 4096; ++i) pinned[i] = 0;
  cudaFunction_t empty_rt = nullptr;
  CHECK(cudaGetFuncBySymbol(&empty_rt, reinterpret_cast<const void*>(empty_kernel)));
  const CUfunction empty_fn = reinterpret_cast<CUfunction>(empty_rt);
  std::mt19937 g(0);
  std::printf("%6s %8s %8s %8s %8s %8s %8s\n", "batch", "bare", "launch", "build", "x bare", "dev", "host");
  for (int B : {1, 8, 16, 32, 64, 128, 256}) {
    std::vector<int32_t> qo(B + 1), kv(B + 1), len(B);
    for (int b = 0; b < B; ++b) {
      len[b] = 1 + static_cast<int32_t>(g() % 4096);
      qo[b + 1] = b + 1;
      kv[b + 1] = kv[b] + (len[b] + 63) / 64;
    }
    CHECK(cudaMemcpy(d_in, qo.data(), (B + 1) * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_in + (B + 1), kv.data(), (B + 1) * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_in + 2 * (B + 1), len.data(), B * 4, cudaMemcpyHostToDevice));
    int64_t s1 = B + 1, s0 = B, sm = total;
    DLTensor tq = vec(d_in, &s1, true), tk = vec(d_in + (B + 1), &s1, true), tl = vec(d_in + 2 * (B + 1), &s0, true);
    DLTensor tm = vec(meta, &sm, true);
    DLTensor hq = vec(qo.data(), &s1, false), hk = vec(kv.data(), &s1, false), hl = vec(len.data(), &s0, false);
    DLTensor hm = vec(host_meta.data(), &sm, false);
    const size_t bytes = (3 * B + 2) * 4;
    const double bare = us_per_call([&] {
      CHECK(cudaMemcpyAsync(pinned, d_in, bytes, cudaMemcpyDeviceToHost, stream));
      CHECK(cudaStreamSynchronize(stream));
    });
    const double launch = us_per_call([&] {
      empty_kernel<<<1, 32, 0, stream>>>();
      CHECK(cudaStreamSynchronize(stream));
    });
    const double build = us_per_call([&] { MCHECK(mlacore_plan_build(plan, &tq, &tk, &tl, 64, 16, &tm, stream)); });
    const double dev = us_per_call([&] {
      MCHECK(mlacore_plan_build_device(plan, &tq, &tk, &tl, 64, 16, &tm, stream));
      CHECK(cudaStreamSynchronize(stream));
    });
    const double host =
        us_per_call([&] { MCHECK(mlacore_plan_build(host_plan, &hq, &hk, &hl, 64, 16, &hm, nullptr)); });
    // --- copy-engine exchange prototype ---
    uint64_t* ctl = reinterpret_cast<uint64_t*>(pinned + 1024);  // [0]: inputs ready, [16]: go
    CUdeviceptr ctl_dev = 0;
    CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&ctl_dev), ctl, 0));
    static uint64_t seq = 0;
    int32_t* host_in = pinned + 2048;  // qo | kv | len at their offsets
    void* dsts[3] = {host_in, host_in + (B + 1), host_in + 2 * (B + 1)};
    const void* srcs[3] = {d_in, d_in + (B + 1), d_in + 2 * (B + 1)};
    size_t sizes[3] = {size_t(B + 1) * 4, size_t(B + 1) * 4, size_t(B) * 4};
    int32_t* sched = pinned + 4096;
    DLTensor pq = vec(host_in, &s1, false), pk = vec(host_in + (B + 1), &s1, false),
             pl = vec(host_in + 2 * (B + 1), &s0, false), pm = vec(sched, &sm, false);
    // The three inputs' D2H copies: three cudaMemcpyAsync, or one cudaMemcpyBatchAsync.
    auto inputs_d2h = [&](bool batched) {
      if (!batched) {
        for (int i = 0; i < 3; ++i) CHECK(cudaMemcpyAsync(dsts[i], srcs[i], sizes[i], cudaMemcpyDeviceToHost, stream));
        return;
      }
      cudaMemcpyAttributes attr{};
      attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      size_t idx = 0;
      CHECK(cudaMemcpyBatchAsync(dsts, srcs, sizes, 3, &attr, &idx, 1, stream));
    };
    auto exchange = [&](bool batched) {
      ++seq;
      inputs_d2h(batched);
      CUstreamBatchMemOpParams ops[2] = {};
      ops[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
      ops[0].writeValue.address = ctl_dev;
      ops[0].writeValue.value64 = seq;
      ops[1].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_64;
      ops[1].waitValue.address = ctl_dev + 128;
      ops[1].waitValue.value64 = seq;
      ops[1].waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
      if (cuStreamBatchMemOp(stream, 2, ops, 0) != CUDA_SUCCESS) { std::fprintf(stderr, "memop failed\n"); std::exit(1); }
      CHECK(cudaMemcpyAsync(meta, sched, total * 4, cudaMemcpyHostToDevice, stream));
      while (__atomic_load_n(ctl, __ATOMIC_ACQUIRE) != seq) {}
      MCHECK(mlacore_plan_build(host_plan, &pq, &pk, &pl, 64, 16, &pm, nullptr));
      __atomic_store_n(ctl + 16, seq, __ATOMIC_RELEASE);
    };
    static bool supported = [] {
      int v = 0;
      CUdevice d;
      cuDeviceGet(&d, 0);
      cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, d);
      std::printf("64-bit stream memops: %d\n", v);
      return v != 0;
    }();
    double memops3 = -1, memopsB = -1;
    if (supported) {
      memops3 = us_per_call([&] { exchange(false); });
      memopsB = us_per_call([&] { exchange(true); });
      // correctness: the device metadata equals the host schedule
      exchange(true);
      CHECK(cudaStreamSynchronize(stream));
      std::vector<int32_t> back(total);
      CHECK(cudaMemcpy(back.data(), meta, total * 4, cudaMemcpyDeviceToHost));
      MCHECK(mlacore_plan_build(host_plan, &hq, &hk, &hl, 64, 16, &hm, nullptr));
      if (!std::equal(back.begin(), back.end(), host_meta.begin())) std::printf("MISMATCH at batch %d\n", B);
    }
    // Copy-engine exchange without stream memory operations: the D2H copies, a stream
    // synchronization, the host schedule into pinned memory, one H2D copy (no kernel at all).
    auto copy_exchange = [&](bool batched) {
      inputs_d2h(batched);
      CHECK(cudaStreamSynchronize(stream));
      MCHECK(mlacore_plan_build(host_plan, &pq, &pk, &pl, 64, 16, &pm, nullptr));
      CHECK(cudaMemcpyAsync(meta, sched, total * 4, cudaMemcpyHostToDevice, stream));
    };
    const double copy3 = us_per_call([&] { copy_exchange(false); });
    const double copyB = us_per_call([&] { copy_exchange(true); });
    const double bare3 = us_per_call([&] {
      inputs_d2h(false);
      CHECK(cudaStreamSynchronize(stream));
    });
    const double bareB = us_per_call([&] {
      inputs_d2h(true);
      CHECK(cudaStreamSynchronize(stream));
    });
    auto drained = [&](auto&& f) {
      int n = 0;
      return us_per_call([&] {
        f();
        if (++n % 64 == 0) CHECK(cudaStreamSynchronize(stream));  // counted: one sync per 64 calls
      });
    };
    const double api_d2h = drained([&] { CHECK(cudaMemcpyAsync(pinned, d_in, bytes, cudaMemcpyDeviceToHost, stream)); });
    const double api_h2d = drained([&] { CHECK(cudaMemcpyAsync(meta, sched, total * 4, cudaMemcpyHostToDevice, stream)); });
    const double api_launch = drained([&] { empty_kernel<<<1, 32, 0, stream>>>(); });
    // The same empty kernel through the driver API (its CUfunction fetched once):
    // what the runtime's launch path costs above the driver's.
    const double api_launch_drv = drained([&] {
      if (cuLaunchKernel(empty_fn, 1, 1, 1, 32, 1, 1, 0, stream, nullptr, nullptr) != CUDA_SUCCESS) std::exit(1);
    });
    const double launch_drv = us_per_call([&] {
      if (cuLaunchKernel(empty_fn, 1, 1, 1, 32, 1, 1, 0, stream, nullptr, nullptr) != CUDA_SUCCESS) std::exit(1);
      CHECK(cudaStreamSynchronize(stream));
    });
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(1);
    cfg.blockDim = dim3(32);
    cfg.stream = stream;
    const double api_launch_ex = drained([&] { CHECK(cudaLaunchKernelEx(&cfg, empty_kernel)); });
    std::printf("%6d launch paths: api runtime %5.2f, cudaLaunchKernelEx %5.2f, cuLaunchKernel %5.2f; round trip runtime %5.2f, driver %5.2f\n",
                B, api_launch, api_launch_ex, api_launch_drv, launch, launch_drv);
    // The handshake alone (signal), and with the inputs' copy into mapped memory (signal+copy):
    // launch, wait for the kernel's flag, release it; no synchronization, as build() does.
    unsigned long long* sig = reinterpret_cast<unsigned long long*>(pinned + 1536);  // [0] flag, [16] go
    unsigned long long* sig_dev = nullptr;
    CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&sig_dev), sig, 0));
    int32_t* staged_dev = nullptr;
    CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&staged_dev), host_in, 0));
    static unsigned long long sig_seq = 0;
    auto signal = [&](bool copy) {
      ++sig_seq;
      signal_kernel<<<1, 256, 0, stream>>>(d_in, staged_dev, 3 * B + 2, sig_dev, sig_dev + 16, sig_seq, copy);
      while (__atomic_load_n(sig, __ATOMIC_ACQUIRE) != sig_seq) {
      }
      __atomic_store_n(sig + 16, sig_seq, __ATOMIC_RELEASE);
    };
    const double sig_only = us_per_call([&] { signal(false); });
    const double sig_copy = us_per_call([&] { signal(true); });
    CHECK(cudaStreamSynchronize(stream));
    std::printf("%6d handshake: signal %5.2f (%4.2fx bare), signal+copy %5.2f (%4.2fx); build - signal+copy %5.2f\n", B,
                sig_only, sig_only / bare, sig_copy, sig_copy / bare, build - sig_copy);
    const double api_h2d_small = drained([&] { CHECK(cudaMemcpyAsync(meta, sched, 256, cudaMemcpyHostToDevice, stream)); });
    std::printf("%6d copies: bare3 %5.2f bareB %5.2f | copy3 %6.2f (%4.2fx) copyB %6.2f (%4.2fx) | api h2d 256B %5.2f, %lld B\n",
                B, bare3, bareB, copy3, copy3 / bare, copyB, copyB / bare, api_h2d_small,
                static_cast<long long>(total * 4));
    std::printf("%6d %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f | memops3 %6.2f (%4.2fx) memopsB %6.2f (%4.2fx) | api d2h %5.2f h2d %5.2f launch %5.2f\n",
                B, bare, launch, build, build / bare, dev, host, memops3, memops3 / bare, memopsB, memopsB / bare,
                api_d2h, api_h2d, api_launch);
  }
  CHECK(cudaStreamSynchronize(stream));
  mlacore_plan_destroy(plan);
  mlacore_plan_destroy(host_plan);
  return 0;
}
