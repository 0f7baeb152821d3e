/* mlacore: the C ABI of libmlacore.
 *
 * Every entry point takes DLPack DLTensors (non-owning descriptions of caller
 * memory) and, where it launches work, the caller's stream (a cudaStream_t or
 * hipStream_t cast to void*; NULL is the legacy default stream). Nothing here
 * synchronizes unless its comment says so, and nothing allocates device memory.
 *
 * Errors: every call returns an mlacore_status; on failure the message for the
 * calling thread is in mlacore_last_error() until that thread's next failure.
 * Messages name the argument, what was expected and what came.
 *
 * Device choice: a call runs where its tensors live. All tensors of one call
 * must share one DLDevice: kDLCPU runs the CPU path on the calling thread
 * (synchronously, `stream` ignored), kDLCUDA or kDLROCM launches on that
 * device (by DLDevice.device_id; the caller's current device is left as it
 * was) on `stream`, which must belong to that device. A GPU tensor passed to
 * a library built without that backend fails with MLACORE_ERROR_RUNTIME.
 * The same calls on host DLTensors are the reference for the GPU results.
 *
 * Tensor lifetime: DLTensors are only read during the call; the library keeps
 * no pointer to them or their shape/stride arrays after it returns. The
 * memory they describe belongs to the caller and must stay valid until the
 * work queued on `stream` has finished (for CPU tensors: until the call
 * returns). Plans (mlacore_plan) are the only objects the library owns; see
 * <mlacore/plan.h>.
 *
 * Asynchronous errors: MLACORE_OK from a GPU call means the arguments were
 * valid and the work was queued, not that it finished. A fault inside a
 * kernel surfaces later, as a CUDA/HIP error from the caller's next
 * synchronization (cudaStreamSynchronize) or from a later mlacore call that
 * checks the launch. Out-of-range page ids and positions in device index
 * tensors are masked or skipped as each call's header says, never read.
 *
 * Thread safety: every entry point may be called from several threads at
 * once on distinct output tensors; error messages are per thread. A plan
 * handle is used by one thread at a time. Calls on one stream run in the
 * order they were made; work on different streams that writes the same
 * memory is the caller's to order.
 *
 * Versions: <mlacore/version.h> gives MLACORE_VERSION_MAJOR/MINOR/PATCH of
 * these headers; mlacore_version() gives the loaded library's. The library's
 * SONAME is libmlacore.so.MLACORE_ABI_VERSION.
 *
 * <mlacore/mlacore.hpp> wraps this ABI in C++ that throws mlacore::Error.
 */
#ifndef MLACORE_MLACORE_H_
#define MLACORE_MLACORE_H_

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>
#include <mlacore/version.h>

#if defined(_WIN32)
#define MLACORE_API __declspec(dllexport)
#else
#define MLACORE_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mlacore_status {
  MLACORE_OK = 0,
  MLACORE_ERROR_VALUE = 1,   /* bad value, shape, dtype, stride or device (Python: ValueError) */
  MLACORE_ERROR_TYPE = 2,    /* wrong kind of object, e.g. a NULL tensor (Python: TypeError) */
  MLACORE_ERROR_RUNTIME = 3  /* launch or backend failure, feature not built (Python: RuntimeError) */
} mlacore_status;

/* The package version, e.g. "0.1.0". */
MLACORE_API const char* mlacore_version(void);

/* The message of the calling thread's last failed call ("" if none). */
MLACORE_API const char* mlacore_last_error(void);

/* 1 when libmlacore was built with the named GPU backend ("cuda", "hip"). */
MLACORE_API int mlacore_built_with(const char* feature);

/* Absolute path of the loaded libmlacore shared object ("" if unknown). */
MLACORE_API const char* mlacore_library_path(void);

/* Validates that `count` tensors are well-formed DLTensors and does nothing
 * else: the floor of what any entry point costs, for the overhead benchmark. */
MLACORE_API mlacore_status mlacore_noop(const DLTensor* const* tensors, int32_t count, void* stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

/* Capabilities: one header each, all part of this ABI. */
#include <mlacore/plan.h>
#include <mlacore/backend.h>
#include <mlacore/paged_append.h>
#include <mlacore/kv_layout.h>
#include <mlacore/slot_mapping.h>
#include <mlacore/mla_decode.h>

#endif /* MLACORE_MLACORE_H_ */
