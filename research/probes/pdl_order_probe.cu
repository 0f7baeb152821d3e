// Does a programmatic dependent (PDL) kernel that exits without griddepcontrol.wait
// let later work on its stream (a kernel, an event) run before the primary has
// finished? mlacore's combine is such a dependent of the decode kernel, and its
// blocks for requests the decode wrote directly return before the wait: the
// output is only safe to read downstream if the answer is no.
//   nvcc -O2 -arch=sm_90a -o /tmp/pdl_order_probe research/probes/pdl_order_probe.cu && /tmp/pdl_order_probe
// H200, driver 580.159.04, CUDA 13.0 (2026-12-02): 0/20 and 0/20, the stream
// waits for the primary (research/measurements/2026-12-02-8e6bff1-h200-decode.txt).
#include <cstdio>
#include <cuda_runtime.h>
__global__ void primary(volatile int* flag, long long ns) {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < (unsigned long long)ns);
  __threadfence_system();
  *flag = 1;
}
__global__ void secondary(int* dummy) { if (threadIdx.x == 12345) *dummy = 1; }
__global__ void third(volatile int* flag, int* seen) { *seen = *flag; }
int main() {
  int *flag, *seen, *dummy, *hflag;
  cudaHostAlloc(&hflag, 4, cudaHostAllocMapped);
  cudaHostGetDevicePointer(&flag, hflag, 0);
  cudaMalloc(&seen, 4); cudaMalloc(&dummy, 4);
  cudaStream_t s; cudaStreamCreate(&s);
  cudaEvent_t ev; cudaEventCreate(&ev);
  int early_event = 0, early_kernel = 0;
  for (int it = 0; it < 20; ++it) {
    *hflag = 0;
    primary<<<1, 32, 0, s>>>(flag, 2000000);
    cudaLaunchConfig_t cfg{}; cfg.gridDim = dim3(64); cfg.blockDim = dim3(128); cfg.stream = s;
    cudaLaunchAttribute a[1]; a[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    a[0].val.programmaticStreamSerializationAllowed = 1; cfg.attrs = a; cfg.numAttrs = 1;
    cudaLaunchKernelEx(&cfg, secondary, dummy);
    cudaEventRecord(ev, s);
    third<<<1, 1, 0, s>>>(flag, seen);
    cudaEventSynchronize(ev);
    if (*(volatile int*)hflag == 0) ++early_event;
    cudaStreamSynchronize(s);
    int v = 0; cudaMemcpy(&v, seen, 4, cudaMemcpyDeviceToHost);
    if (v == 0) ++early_kernel;
  }
  printf("pdl probe: event before primary done %d/20, next kernel before primary done %d/20, err=%s\n",
         early_event, early_kernel, cudaGetErrorString(cudaGetLastError()));
  return 0;
}
