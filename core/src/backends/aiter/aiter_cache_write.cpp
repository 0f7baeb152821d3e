// The AITER cache-write route, host side: the buffers the route keeps
// (slots per stream, a unit scale per device), and the shim call.
#include "backends/aiter/aiter_cache_write.h"

#include <mlacore/backend.h>

#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "backends/aiter/aiter_loader.h"
#include "common/error.h"

namespace mlacore {
namespace {

// Slot buffers grow by doubling from this many entries.
constexpr int64_t kMinSlots = 4096;

// Buffers are kept per (device, stream) because work on one stream is
// ordered: a call may overwrite the slots an earlier call on the same
// stream computed, never ones another stream's pending kernel still reads.
// A buffer that is outgrown is kept, not freed: kernels queued before the
// growth (or captured into a graph) may still read it, and freeing device
// memory would synchronize. The waste is bounded by the geometric growth.
struct SlotBuffer {
  int64_t* slots = nullptr;
  int64_t capacity = 0;
};

struct Registry {
  std::mutex mutex;
  std::map<std::pair<int, void*>, SlotBuffer> slots;  // (device, stream); device -1 is the CPU
  std::map<int, float*> scales;                       // device -> one float 1.0
  std::vector<std::unique_ptr<int64_t[]>> host_blocks;  // the CPU buffers (contract test)
};

// Never destroyed: a thread may append while the process exits, and the
// device memory it points to outlives static destructors anyway.
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

int64_t* slot_buffer(const AiterCacheWrite& w, int64_t n, void* stream) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  SlotBuffer& b = r.slots[{w.on_cpu ? -1 : w.device, stream}];
  if (b.capacity >= n) return b.slots;
  int64_t capacity = b.capacity > 0 ? b.capacity : kMinSlots;
  while (capacity < n) capacity *= 2;
  if (w.on_cpu) {
    r.host_blocks.emplace_back(new int64_t[static_cast<size_t>(capacity)]);
    b.slots = r.host_blocks.back().get();
  } else {
#if defined(MLACORE_WITH_HIP)
    b.slots = static_cast<int64_t*>(aiter_device_alloc(capacity * static_cast<int64_t>(sizeof(int64_t)), w.device));
#else
    runtime_error("AITER cache write on a GPU tensor in a build without HIP");  // where_to_run() prevents this
#endif
  }
  b.capacity = capacity;
  return b.slots;
}

// AITER's cache writes always dereference their scales, also for
// kv_cache_dtype "auto" (REFERENCES.md), so they get a real one: a device
// float 1.0, allocated and uploaded once per device at its first use (the
// one blocking copy of this route; warm up before capturing a graph).
float* unit_scale(const AiterCacheWrite& w) {
  static float host_one = 1.0f;
  if (w.on_cpu) return &host_one;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  float*& scale = r.scales[w.device];
  if (scale == nullptr) {
#if defined(MLACORE_WITH_HIP)
    auto* p = static_cast<float*>(aiter_device_alloc(sizeof(float), w.device));
    aiter_device_upload(p, &host_one, sizeof(float), w.device);
    scale = p;
#else
    runtime_error("AITER cache write on a GPU tensor in a build without HIP");  // where_to_run() prevents this
#endif
  }
  return scale;
}

}  // namespace

void run_aiter_cache_write(const char* op, const AiterCacheWrite& w, const append::Job& job, void* stream) {
  const AiterLibrary& lib = aiter_library();
  if (job.nnz == 0) return;

  int64_t* slots = slot_buffer(w, job.nnz, stream);
  if (w.on_cpu) {
    for (int64_t i = 0; i < job.nnz; ++i) slots[i] = append_slot(job, i);
  } else {
#if defined(MLACORE_WITH_HIP)
    launch_append_slots(job, slots, w.device, stream);
#endif
  }
  const int device_id = w.on_cpu ? 0 : w.device;
  aiter_tensor_t slot_mapping = aiter_view(slots, AITER_DTYPE_i64, device_id, {job.nnz});
  aiter_tensor_t scale = aiter_view(unit_scale(w), AITER_DTYPE_fp32, device_id, {1});
  aiter_tensor_t src0 = w.src[0], src1 = w.src[1], cache0 = w.cache[0], cache1 = w.cache[1];
  const auto s = static_cast<aiter_stream_t>(stream);
  int status = 0;
  const char* entry = nullptr;
  // kv_cache_dtype "auto": the cache holds the sources' dtype (fp8 caches are
  // not routed), so the scales multiply by 1.0 and nothing is quantized.
  if (w.op == MLACORE_ROUTE_APPEND_MLA) {
    entry = MLACORE_AITER_CONCAT_MLA_SYMBOL;
    if (lib.concat_and_cache_mla == nullptr) runtime_error(op, ": routed to AITER, which lacks ", entry);
    status = lib.concat_and_cache_mla(&src0, &src1, &cache0, &slot_mapping, "auto", &scale, s);
  } else {
    entry = MLACORE_AITER_RESHAPE_FLASH_SYMBOL;
    if (lib.reshape_and_cache_flash == nullptr) runtime_error(op, ": routed to AITER, which lacks ", entry);
    status = lib.reshape_and_cache_flash(&src0, &src1, &cache0, &cache1, &slot_mapping, "auto", &scale, &scale, s);
  }
  if (status != 0) runtime_error(op, ": AITER's ", entry, " failed (status ", status, ")");
}

}  // namespace mlacore
