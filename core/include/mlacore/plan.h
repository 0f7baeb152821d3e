/* mlacore plan: the decode schedule (work items over KV chunks,
 * last-page lengths, partial-output indices) that the MLA decode kernels read.
 *
 * A plan is an opaque handle sized for a capacity (max_batch requests,
 * max_work work items) and an SM/CU count. Its schedule goes into an int32
 * schedule tensor the caller allocates with mlacore_plan_schedule_size()
 * elements (1-D, contiguous, 16-byte aligned), on the GPU or the CPU.
 *
 * Inputs, all 1-D int32 or int64 (strides honoured): qo_indptr [batch+1]
 * (query tokens), kv_indptr [batch+1] (pages), kv_len_arr [batch] (tokens).
 *
 *  - mlacore_plan_build: a schedule checked on the host. Host inputs: the
 *    host computes it, no round trip (a device schedule tensor gets one async
 *    H2D copy). Device inputs: one kernel launch and nothing else: the kernel
 *    validates the three arrays and stores its verdict into the plan's mapped
 *    pinned staging buffer, then picks the split chunk, stores the
 *    schedule's counts there too, and writes the schedule into the schedule
 *    tensor (no memcpy, no stream synchronization). The call blocks the host
 *    thread until the stream reaches that kernel and its verdict is there,
 *    as any round trip does; kernels queued after it read the schedule in
 *    stream order. The first mlacore_plan_get_info() after it waits for the
 *    counts (num_work, num_partials, chunk_tokens), which follow the verdict
 *    by the chunk's decision. The kernel never waits for the host, so
 *    blocking launches (CUDA_LAUNCH_BLOCKING=1, tools that serialize
 *    launches) work the same.
 *    Invalid values raise MLACORE_ERROR_VALUE naming the argument and request
 *    (worded from the inputs the kernel staged when it rejected them); the
 *    schedule tensor then keeps its contents (after a runtime error they are
 *    unspecified).
 *    Not allowed while the stream captures a CUDA graph (refused before any
 *    launch; use mlacore_plan_build_device there).
 *  - mlacore_plan_build_device: the same schedule, bit for bit, computed by
 *    one kernel on the stream from device inputs: no synchronization, legal
 *    inside CUDA-graph capture. Values cannot be checked on the host there: an
 *    invalid request gets no work and the header's error word (index 7) gets
 *    MLACORE_PLAN_ERROR_* bits.
 *
 * A plan is not thread-safe: one builder at a time per handle.
 */
#ifndef MLACORE_PLAN_H_
#define MLACORE_PLAN_H_

#include <mlacore/mlacore.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mlacore_plan mlacore_plan;

/* Error bits of the schedule header (device-only builds). */
#define MLACORE_PLAN_ERROR_INDPTR_START 1 /* qo_indptr[0] or kv_indptr[0] != 0: nothing planned */
#define MLACORE_PLAN_ERROR_INDPTR 2       /* an indptr decreases or exceeds int32 at some request */
#define MLACORE_PLAN_ERROR_KV_LEN 4       /* kv_len < 0 or not matching its page count */

typedef struct mlacore_plan_info {
  int32_t batch;
  int32_t num_work;      /* work items in use; the rest of max_work are padding */
  int32_t num_partials;  /* partial outputs the combine merges */
  int32_t max_qo_len;
  int32_t max_kv_len;
  int32_t chunk_tokens;  /* KV tokens per split, a multiple of 64 */
  int32_t total_qo;      /* qo_indptr[batch] */
  int32_t error;         /* MLACORE_PLAN_ERROR_* bits; 0 after a host build */
  int32_t on_host;       /* 0 after a device build: only batch is known, read the header */
  int32_t reserved;
} mlacore_plan_info;

/* Counters for tests and benchmarks: what the builds did. */
typedef struct mlacore_plan_stats {
  int64_t pinned_allocations;
  int64_t device_to_host_copies; /* D2H transfers: exchange kernels storing the inputs into the staging buffer */
  int64_t host_to_device_copies; /* H2D transfers: async copies (host inputs) or exchange kernels reading it */
  int64_t stream_syncs;
  int64_t device_builds;
  const void* staging; /* the pinned buffer (NULL until a GPU build needs it) */
} mlacore_plan_stats;

/* Work items that are enough for any batch of up to max_batch requests. */
MLACORE_API int64_t mlacore_plan_default_max_work(int64_t max_batch, int32_t num_sms);

/* int32 elements of the schedule tensor for a capacity; -1 for invalid values. */
MLACORE_API int64_t mlacore_plan_schedule_size(int64_t max_batch, int64_t max_work);

/* Offsets (int32 elements) of the header, kv_last_page_len, split_indptr and
 * work-item sections, in that order, into `offsets[4]`. */
MLACORE_API mlacore_status mlacore_plan_layout(int64_t max_batch, int64_t max_work, int64_t* offsets);

/* max_work <= 0 picks mlacore_plan_default_max_work(). max_work must be >= max_batch. */
MLACORE_API mlacore_status mlacore_plan_create(int64_t max_batch, int64_t max_work, int32_t num_sms,
                                               mlacore_plan** out);
MLACORE_API void mlacore_plan_destroy(mlacore_plan* plan);

MLACORE_API mlacore_status mlacore_plan_build(mlacore_plan* plan, const DLTensor* qo_indptr,
                                              const DLTensor* kv_indptr, const DLTensor* kv_len_arr,
                                              int32_t page_size, int32_t num_heads, const DLTensor* schedule,
                                              void* stream);
MLACORE_API mlacore_status mlacore_plan_build_device(mlacore_plan* plan, const DLTensor* qo_indptr,
                                                     const DLTensor* kv_indptr, const DLTensor* kv_len_arr,
                                                     int32_t page_size, int32_t num_heads,
                                                     const DLTensor* schedule, void* stream);

/* The workspace cap on partial outputs, applied by every later build (both
 * kinds, bit-identical between them): the decode's workspace holds
 * `partial_rows` fp32 rows (512 values + LSE: see
 * mlacore_mla_decode_workspace_rows), and each partial takes
 * max(partial_qo_len, the batch's max_qo_len) * num_heads of them. Builds
 * choose a chunk that keeps the partials within the budget (fewer splits, or
 * none when fewer than two fit) instead of failing. partial_qo_len is the
 * max_qo_len the decode will be given (the CUDA-graph capacity; 0 for one
 * schedule, whose own max_qo_len counts). partial_rows = 0 fits no
 * partial (nothing splits); MLACORE_PLAN_NO_PARTIAL_BUDGET (the default)
 * removes the budget; a budget of max_work partials or more never binds. */
#define MLACORE_PLAN_NO_PARTIAL_BUDGET (-1)
MLACORE_API mlacore_status mlacore_plan_set_partial_budget(mlacore_plan* plan, int64_t partial_rows,
                                                           int64_t partial_qo_len);

MLACORE_API mlacore_status mlacore_plan_capacity(const mlacore_plan* plan, int64_t* max_batch, int64_t* max_work,
                                                 int32_t* num_sms);
/* The last successful build's summary (after a device-input build, the first
 * call waits for its counts: see mlacore_plan_build). */
MLACORE_API mlacore_status mlacore_plan_get_info(const mlacore_plan* plan, mlacore_plan_info* out);
MLACORE_API mlacore_status mlacore_plan_get_stats(const mlacore_plan* plan, mlacore_plan_stats* out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MLACORE_PLAN_H_ */
