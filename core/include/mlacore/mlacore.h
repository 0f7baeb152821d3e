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
 * <mlacore/mlacore.hpp> wraps this ABI in C++ that throws mlacore::Error.
 */
#ifndef MLACORE_MLACORE_H_
#define MLACORE_MLACORE_H_

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

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
