// A C++ server's decode loop on libmlacore, with no torch and no Python:
// allocate a paged MLA cache (the [pages, page_size, 576] bf16 buffer whose
// first 512 channels are ckv and last 64 kpe) and the step's inputs with the
// CUDA runtime, append the prompt's tokens, then for several steps append one
// token per request, plan and run decode on the program's own stream.
//
// Every step runs twice through the same library: on the GPU, and on host
// DLTensors (mlacore's CPU path, the reference). The outputs, the LSEs and
// finally the whole cache must agree.
//
//   cpp_decode [--host] [num_heads (16)] [steps (4)]
// Exit status: 0 when everything matches, 1 on a mismatch or an error, 77 when
// there is no CUDA device or libmlacore was built without CUDA. --host runs
// the "GPU" side on host memory too: the same program flow and checks on a
// machine without a GPU (CI), with no CUDA call at all.
#include <mlacore/mlacore.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <vector>

#if MLACORE_VERSION_NUMBER < 100
#error "this example needs mlacore >= 0.1.0"
#endif

namespace {

constexpr int64_t kCkv = 512, kKpe = 64, kRow = kCkv + kKpe;  // MLA head dims
constexpr int64_t kPageSize = 64;

void cuda_check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "cpp_decode: %s: %s\n", what, cudaGetErrorString(err));
    std::exit(1);
  }
}

// bf16 <-> float on the host (round to nearest even).
uint16_t to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}
float from_bf16(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// A DLTensor with its own shape and stride arrays. It only describes memory
// owned elsewhere; mlacore reads it during a call and keeps nothing.
class View {
 public:
  View(void* data, DLDevice device, DLDataType dtype, std::initializer_list<int64_t> shape,
       std::initializer_list<int64_t> strides = {}, uint64_t byte_offset = 0) {
    std::copy(shape.begin(), shape.end(), shape_);
    std::copy(strides.begin(), strides.end(), strides_);
    t_.data = data;
    t_.device = device;
    t_.ndim = static_cast<int32_t>(shape.size());
    t_.dtype = dtype;
    t_.shape = shape_;
    t_.strides = strides.size() ? strides_ : nullptr;  // NULL: contiguous
    t_.byte_offset = byte_offset;
  }
  View(const View&) = delete;
  View& operator=(const View&) = delete;
  const DLTensor* get() const { return &t_; }

 private:
  int64_t shape_[4] = {};
  int64_t strides_[4] = {};
  DLTensor t_{};
};

const DLDataType kI32{kDLInt, 32, 1}, kF32{kDLFloat, 32, 1}, kBf16{kDLBfloat, 16, 1}, kU8{kDLUInt, 8, 1};

// The host side of one step: what a server's scheduler holds.
struct StepInputs {
  std::vector<int32_t> append_indptr, seq_lens;  // tokens appended per request, lengths after the append
  std::vector<int32_t> kv_indptr, kv_indices, kv_len, kv_last_page_len, qo_indptr;
  std::vector<uint16_t> new_ckv, new_kpe;  // [nnz, 512], [nnz, 64]
  std::vector<uint16_t> q_nope, q_pe;      // [batch, heads, 512], [batch, heads, 64]
};

// Everything one device (the GPU, or the host for the reference) holds. The
// buffers are sized once for the largest step, as a server sizes them for its
// capacity, so no call allocates.
class Side {
 public:
  Side(bool gpu, int device, cudaStream_t stream, int64_t pages, int64_t max_tokens, int64_t batch, int64_t heads,
       int32_t num_sms)
      : gpu_(gpu), stream_(stream), dev_{gpu ? kDLCUDA : kDLCPU, gpu ? device : 0},
        pages_(pages), batch_(batch), heads_(heads), plan_(batch, num_sms) {
    cache = alloc(pages * kPageSize * kRow * 2);
    fill_zero(cache, pages * kPageSize * kRow * 2);
    kv_indices = alloc(pages * 4);
    for (void** p : {&kv_indptr, &qo_indptr, &append_indptr}) *p = alloc((batch + 1) * 4);
    for (void** p : {&kv_len, &seq_lens, &kv_last_page_len}) *p = alloc(batch * 4);
    batch_indices = alloc(max_tokens * 4);
    positions = alloc(max_tokens * 4);
    new_ckv = alloc(max_tokens * kCkv * 2);
    new_kpe = alloc(max_tokens * kKpe * 2);
    q_nope = alloc(batch * heads * kCkv * 2);
    q_pe = alloc(batch * heads * kKpe * 2);
    out = alloc(batch * heads * kCkv * 2);
    lse = alloc(batch * heads * 4);
    schedule_elems_ = plan_.schedule_size();
    schedule = alloc(schedule_elems_ * 4);
    // Workspace for any schedule this plan's capacity allows (max_partials =
    // max_work), so it is sized once and never changes between steps.
    dims_ = mlacore_decode_dims{plan_.max_batch(), plan_.max_work(), /*max_qo_len=*/1, plan_.max_work()};
    workspace_bytes_ = mlacore::mla_decode_workspace_bytes(dims_, heads);
    workspace = alloc(workspace_bytes_);
  }
  ~Side() {
    for (void* p : owned_) gpu_ ? (void)cudaFree(p) : std::free(p);
  }
  Side(const Side&) = delete;
  Side& operator=(const Side&) = delete;

  // Appends the step's new tokens into the paged cache.
  void append(const StepInputs& in) {
    const int64_t nnz = static_cast<int64_t>(in.new_kpe.size()) / kKpe;
    upload(append_indptr, in.append_indptr);
    upload(seq_lens, in.seq_lens);
    upload(kv_indices, in.kv_indices);
    upload(kv_indptr, in.kv_indptr);
    upload(kv_last_page_len, in.kv_last_page_len);
    upload(new_ckv, in.new_ckv);
    upload(new_kpe, in.new_kpe);
    View ai(append_indptr, dev_, kI32, {batch_ + 1}), sl(seq_lens, dev_, kI32, {batch_});
    View bi(batch_indices, dev_, kI32, {nnz}), pos(positions, dev_, kI32, {nnz});
    mlacore::batch_indices_positions(ai.get(), sl.get(), bi.get(), pos.get(), stream_);
    View ckv_new(new_ckv, dev_, kBf16, {nnz, kCkv}), kpe_new(new_kpe, dev_, kBf16, {nnz, kKpe});
    View idx(kv_indices, dev_, kI32, {static_cast<int64_t>(in.kv_indices.size())});
    View indptr(kv_indptr, dev_, kI32, {batch_ + 1}), last(kv_last_page_len, dev_, kI32, {batch_});
    View ckv(cache, dev_, kBf16, {pages_, kPageSize, kCkv}, {kPageSize * kRow, kRow, 1});
    View kpe(cache, dev_, kBf16, {pages_, kPageSize, kKpe}, {kPageSize * kRow, kRow, 1}, kCkv * 2);
    mlacore::append_paged_mla_kv_cache(ckv_new.get(), kpe_new.get(), bi.get(), pos.get(), ckv.get(), kpe.get(),
                                       idx.get(), indptr.get(), last.get(), MLACORE_BACKEND_AUTO, false, stream_);
  }

  // Plans from the host's index arrays (no round trip) and decodes one query
  // token per request, reading the cache in place.
  void decode(const StepInputs& in, float sm_scale) {
    const int64_t num_indices = static_cast<int64_t>(in.kv_indices.size());
    const DLDevice host{kDLCPU, 0};
    View qo_h(const_cast<int32_t*>(in.qo_indptr.data()), host, kI32, {batch_ + 1});
    View kvp_h(const_cast<int32_t*>(in.kv_indptr.data()), host, kI32, {batch_ + 1});
    View len_h(const_cast<int32_t*>(in.kv_len.data()), host, kI32, {batch_});
    View md(schedule, dev_, kI32, {schedule_elems_});
    plan_.build(qo_h.get(), kvp_h.get(), len_h.get(), static_cast<int32_t>(kPageSize), static_cast<int32_t>(heads_),
                md.get(), stream_);

    upload(qo_indptr, in.qo_indptr);
    upload(kv_len, in.kv_len);
    upload(q_nope, in.q_nope);
    upload(q_pe, in.q_pe);
    View qn(q_nope, dev_, kBf16, {batch_, heads_, kCkv}), qp(q_pe, dev_, kBf16, {batch_, heads_, kKpe});
    View ckv(cache, dev_, kBf16, {pages_, kPageSize, kCkv}, {kPageSize * kRow, kRow, 1});
    View kpe(cache, dev_, kBf16, {pages_, kPageSize, kKpe}, {kPageSize * kRow, kRow, 1}, kCkv * 2);
    View idx(kv_indices, dev_, kI32, {num_indices}), indptr(kv_indptr, dev_, kI32, {batch_ + 1});
    View qo(qo_indptr, dev_, kI32, {batch_ + 1}), len(kv_len, dev_, kI32, {batch_});
    View ws(workspace, dev_, kU8, {workspace_bytes_});
    View o(out, dev_, kBf16, {batch_, heads_, kCkv}), l(lse, dev_, kF32, {batch_, heads_});
    mlacore::mla_decode(qn.get(), qp.get(), ckv.get(), kpe.get(), idx.get(), indptr.get(), qo.get(), len.get(),
                        md.get(), ws.get(), o.get(), l.get(), dims_, kPageSize, sm_scale, /*flags=*/0u, stream_);
  }

  // Copies device memory back (waiting for the stream), or reads host memory.
  template <class T>
  std::vector<T> download(const void* src, size_t count) const {
    std::vector<T> v(count);
    if (gpu_) {
      cuda_check(cudaMemcpyAsync(v.data(), src, count * sizeof(T), cudaMemcpyDeviceToHost, stream_), "download");
      // Errors of the kernels queued before surface here, at the first sync.
      cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize after decode");
    } else {
      std::memcpy(v.data(), src, count * sizeof(T));
    }
    return v;
  }

  int64_t workspace_bytes() const { return workspace_bytes_; }
  const mlacore::Plan& plan() const { return plan_; }

  void *cache, *kv_indices, *kv_indptr, *qo_indptr, *append_indptr, *kv_len, *seq_lens, *kv_last_page_len;
  void *batch_indices, *positions, *new_ckv, *new_kpe, *q_nope, *q_pe, *out, *lse, *schedule, *workspace;

 private:
  void* alloc(int64_t bytes) {
    void* p = nullptr;
    if (gpu_) {
      cuda_check(cudaMalloc(&p, static_cast<size_t>(bytes)), "cudaMalloc");
    } else {
      p = std::aligned_alloc(256, static_cast<size_t>((bytes + 255) / 256 * 256));
      if (!p) { std::fprintf(stderr, "cpp_decode: out of host memory\n"); std::exit(1); }
    }
    owned_.push_back(p);
    return p;
  }
  void fill_zero(void* p, int64_t bytes) {
    if (gpu_) cuda_check(cudaMemsetAsync(p, 0, static_cast<size_t>(bytes), stream_), "cudaMemsetAsync");
    else std::memset(p, 0, static_cast<size_t>(bytes));
  }
  // The source must stay untouched until the copy is done: cudaMemcpyAsync
  // from pageable memory returns once it has staged the data.
  template <class T>
  void upload(void* dst, const std::vector<T>& src) {
    const size_t bytes = src.size() * sizeof(T);
    if (gpu_) cuda_check(cudaMemcpyAsync(dst, src.data(), bytes, cudaMemcpyHostToDevice, stream_), "upload");
    else std::memcpy(dst, src.data(), bytes);
  }

  bool gpu_;
  cudaStream_t stream_;
  DLDevice dev_;
  int64_t pages_, batch_, heads_;
  mlacore::Plan plan_;
  int64_t schedule_elems_ = 0, workspace_bytes_ = 0;
  mlacore_decode_dims dims_{};
  std::vector<void*> owned_;
};

// Deterministic values in [-1, 1).
struct Lcg {
  uint64_t s;
  float next() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>((s >> 40) & 0xFFFFFF) / 8388608.0f - 1.0f;
  }
  void fill(std::vector<uint16_t>& v, size_t n) {
    v.resize(n);
    for (auto& x : v) x = to_bf16(next());
  }
};

// Compares two outputs elementwise; prints the worst element.
bool matches(const char* what, const std::vector<float>& gpu, const std::vector<float>& cpu, float atol, float rtol) {
  double worst = 0;
  size_t at = 0;
  bool ok = true;
  for (size_t i = 0; i < gpu.size(); ++i) {
    const double err = std::fabs(static_cast<double>(gpu[i]) - cpu[i]);
    if (!(err <= atol + rtol * std::fabs(cpu[i]))) ok = false;  // NaN fails too
    if (!(err <= worst)) { worst = err; at = i; }
  }
  std::printf("  %-4s max difference %.3g at element %zu (%.5f vs %.5f): %s\n", what, worst, at,
              gpu.empty() ? 0.0 : gpu[at], cpu.empty() ? 0.0 : cpu[at], ok ? "ok" : "MISMATCH");
  return ok;
}

// out[b, h] computed directly from the host cache, for head h of every
// request: checks that the library's CPU path (the reference) is attention.
std::vector<float> direct_attention(const uint16_t* cache, const StepInputs& in, int64_t heads, int64_t h,
                                    float sm_scale) {
  const int64_t batch = static_cast<int64_t>(in.kv_len.size());
  std::vector<float> out(static_cast<size_t>(batch * kCkv), 0.0f);
  for (int64_t b = 0; b < batch; ++b) {
    const uint16_t* qn = in.q_nope.data() + (b * heads + h) * kCkv;
    const uint16_t* qp = in.q_pe.data() + (b * heads + h) * kKpe;
    std::vector<double> score(static_cast<size_t>(in.kv_len[b]));
    std::vector<const uint16_t*> row(score.size());
    double top = -INFINITY;
    for (int32_t t = 0; t < in.kv_len[b]; ++t) {
      const int32_t page = in.kv_indices[in.kv_indptr[b] + t / kPageSize];
      row[t] = cache + (page * kPageSize + t % kPageSize) * kRow;
      double dot = 0;
      for (int64_t c = 0; c < kCkv; ++c) dot += double(from_bf16(qn[c])) * from_bf16(row[t][c]);
      for (int64_t c = 0; c < kKpe; ++c) dot += double(from_bf16(qp[c])) * from_bf16(row[t][kCkv + c]);
      score[t] = dot * sm_scale;
      top = std::max(top, score[t]);
    }
    double sum = 0;
    for (double& x : score) sum += (x = std::exp(x - top));
    for (size_t t = 0; t < score.size(); ++t)
      for (int64_t c = 0; c < kCkv; ++c) out[b * kCkv + c] += static_cast<float>(score[t] / sum * from_bf16(row[t][c]));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<const char*> args(argv + 1, argv + argc);
  const bool host_only = !args.empty() && std::strcmp(args[0], "--host") == 0;
  if (host_only) args.erase(args.begin());
  const int64_t heads = args.size() > 0 ? std::atoll(args[0]) : 16;
  const int steps = args.size() > 1 ? std::atoi(args[1]) : 4;
  if (heads < 1 || heads > 128 || steps < 1) {
    std::fprintf(stderr, "usage: cpp_decode [--host] [num_heads 1..128] [steps >= 1]\n");
    return 1;
  }
  std::printf("mlacore %s (headers %d.%d.%d) from %s\n", mlacore::version().c_str(), MLACORE_VERSION_MAJOR,
              MLACORE_VERSION_MINOR, MLACORE_VERSION_PATCH, mlacore_library_path());
  const int device = 0;
  cudaDeviceProp prop{};
  cudaStream_t stream = nullptr;
  if (host_only) {
    std::snprintf(prop.name, sizeof(prop.name), "host (--host: both sides on the CPU)");
    prop.multiProcessorCount = 132;  // plan as for an H100/H200
  } else {
    int devices = 0;
    if (!mlacore::built_with("cuda") || cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
      std::printf("cpp_decode: skipped: %s\n", mlacore::built_with("cuda") ? "no CUDA device"
                                                                            : "libmlacore was built without CUDA");
      return 77;
    }
    cuda_check(cudaSetDevice(device), "cudaSetDevice");
    cuda_check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  }

  // Four requests with prompts of different lengths (one shorter than a page,
  // one crossing several), each growing by one token per step.
  const std::vector<int32_t> prompt = {37, 300, 1, 129};
  const int64_t batch = static_cast<int64_t>(prompt.size());
  std::vector<int32_t> pages_of(batch);
  int64_t pages = 0, prompt_tokens = 0;
  for (int64_t b = 0; b < batch; ++b) {
    pages_of[b] = static_cast<int32_t>((prompt[b] + steps + kPageSize - 1) / kPageSize);
    pages += pages_of[b];
    prompt_tokens += prompt[b];
  }
  const int64_t max_tokens = std::max(prompt_tokens, batch);  // the most tokens one append brings
  pages += 3;  // pages no request owns, which must stay zero

  // Page ids scattered over the pool, as a server's allocator leaves them.
  std::vector<int32_t> kv_indptr(batch + 1, 0), kv_indices;
  for (int64_t b = 0; b < batch; ++b) kv_indptr[b + 1] = kv_indptr[b] + pages_of[b];
  for (int32_t i = 0; i < kv_indptr[batch]; ++i) kv_indices.push_back(static_cast<int32_t>((i * 7 + 2) % pages));

  std::printf("device %s (%d SMs), %lld requests, %lld heads, page size %lld, %lld pages, %d steps\n", prop.name,
              prop.multiProcessorCount, static_cast<long long>(batch), static_cast<long long>(heads),
              static_cast<long long>(kPageSize), static_cast<long long>(pages), steps);
  int result = 0;
  try {
    Side gpu(!host_only, device, stream, pages, max_tokens, batch, heads, prop.multiProcessorCount);
    Side cpu(false, 0, nullptr, pages, max_tokens, batch, heads, prop.multiProcessorCount);
    std::printf("plan capacity: %lld requests, %lld work items; workspace %lld bytes\n",
                static_cast<long long>(gpu.plan().max_batch()), static_cast<long long>(gpu.plan().max_work()),
                static_cast<long long>(gpu.workspace_bytes()));
    const float sm_scale = 1.0f / std::sqrt(static_cast<float>(128 + 64));  // DeepSeek's qk head dim
    Lcg rng{2024};
    StepInputs in;
    in.kv_indptr = kv_indptr;
    in.kv_indices = kv_indices;
    in.qo_indptr.resize(batch + 1);
    for (int64_t b = 0; b <= batch; ++b) in.qo_indptr[b] = static_cast<int32_t>(b);
    std::vector<int32_t> length(batch, 0);

    for (int step = 0; step <= steps; ++step) {
      // Step 0 appends the prompts; every later step one token per request and a decode.
      in.append_indptr.assign(1, 0);
      for (int64_t b = 0; b < batch; ++b) {
        const int32_t add = step == 0 ? prompt[b] : 1;
        length[b] += add;
        in.append_indptr.push_back(in.append_indptr.back() + add);
      }
      in.seq_lens = length;
      in.kv_len = length;
      in.kv_last_page_len.resize(batch);
      for (int64_t b = 0; b < batch; ++b) in.kv_last_page_len[b] = (length[b] - 1) % kPageSize + 1;
      const size_t nnz = static_cast<size_t>(in.append_indptr.back());
      rng.fill(in.new_ckv, nnz * kCkv);
      rng.fill(in.new_kpe, nnz * kKpe);
      gpu.append(in);
      cpu.append(in);
      if (step == 0) continue;

      rng.fill(in.q_nope, static_cast<size_t>(batch * heads * kCkv));
      rng.fill(in.q_pe, static_cast<size_t>(batch * heads * kKpe));
      gpu.decode(in, sm_scale);
      cpu.decode(in, sm_scale);
      const size_t n_out = static_cast<size_t>(batch * heads * kCkv), n_lse = static_cast<size_t>(batch * heads);
      std::vector<float> out_gpu, out_cpu;
      for (uint16_t h : gpu.download<uint16_t>(gpu.out, n_out)) out_gpu.push_back(from_bf16(h));
      for (uint16_t h : cpu.download<uint16_t>(cpu.out, n_out)) out_cpu.push_back(from_bf16(h));
      const mlacore_plan_info info = gpu.plan().info();
      std::printf("step %d: kv lengths %d %d %d %d, %d work items, %d partials\n", step, length[0], length[1],
                  length[2], length[3], info.num_work, info.num_partials);
      bool ok = matches("out", out_gpu, out_cpu, 1e-2f, 2e-2f);
      ok = matches("lse", gpu.download<float>(gpu.lse, n_lse), cpu.download<float>(cpu.lse, n_lse), 1e-2f, 1e-3f)
           && ok;
      // Head 0 of every request, attention written out here, against the CPU path.
      std::vector<float> head_cpu;
      for (int64_t b = 0; b < batch; ++b)
        head_cpu.insert(head_cpu.end(), out_cpu.begin() + b * heads * kCkv, out_cpu.begin() + (b * heads + 1) * kCkv);
      const auto host_cache = cpu.download<uint16_t>(cpu.cache, static_cast<size_t>(pages * kPageSize * kRow));
      ok = matches("ref", head_cpu, direct_attention(host_cache.data(), in, heads, 0, sm_scale), 1e-2f, 2e-2f) && ok;
      if (!ok) result = 1;
    }
    // The appends wrote the same bytes into both caches, and nothing else.
    const size_t cache_elems = static_cast<size_t>(pages * kPageSize * kRow);
    const bool same = gpu.download<uint16_t>(gpu.cache, cache_elems) == cpu.download<uint16_t>(cpu.cache, cache_elems);
    std::printf("cache after %d steps: %s\n", steps, same ? "identical" : "DIFFERENT");
    if (!same) result = 1;
  } catch (const mlacore::Error& e) {
    std::fprintf(stderr, "cpp_decode: mlacore error %d: %s\n", static_cast<int>(e.status()), e.what());
    result = 1;
  }
  if (stream) cuda_check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  std::printf("cpp_decode: %s\n", result != 0 ? "FAILED"
                                   : host_only ? "ok (--host: both sides ran on the CPU)"
                                               : "ok, the GPU matches the CPU reference");
  return result;
}
