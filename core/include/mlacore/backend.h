/* mlacore: kernel backends and the routing decision between them.
 *
 * Ops that have more than one implementation take a backend request
 * (mlacore_backend). MLACORE_BACKEND_AUTO picks the fastest available one and
 * never fails for a backend's absence; an explicit request runs that backend
 * or fails, naming the gate that refused it (MLACORE_ERROR_VALUE) or why the
 * backend is unavailable in this process (MLACORE_ERROR_RUNTIME).
 */
#ifndef MLACORE_BACKEND_H_
#define MLACORE_BACKEND_H_

#include <mlacore/mlacore.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mlacore_backend {
  MLACORE_BACKEND_AUTO = 0,
  MLACORE_BACKEND_NATIVE = 1, /* mlacore's own kernels (CUDA, HIP) and CPU paths */
  MLACORE_BACKEND_AITER = 2   /* AMD's AITER, loaded at run time on ROCm */
} mlacore_backend;

/* The operation a routing request is for. */
typedef enum mlacore_route_op {
  MLACORE_ROUTE_APPEND_MLA = 1, /* append_paged_mla_kv_cache */
  MLACORE_ROUTE_APPEND_KV = 2,  /* append_paged_kv_cache */
  MLACORE_ROUTE_DECODE_MLA = 3  /* mlacore_mla_decode (BatchMLAPagedAttentionWrapper.run) */
} mlacore_route_op;

typedef enum mlacore_kv_layout {
  MLACORE_LAYOUT_NHD = 0, /* [pages, page_size, heads, head_dim] */
  MLACORE_LAYOUT_HND = 1  /* [pages, heads, page_size, head_dim] */
} mlacore_kv_layout;

/* What routing looks at: the facts of one call, taken from its tensors. An op
 * fills this itself; mlacore_route() exposes the decision for tests and for
 * engines that want to know in advance which backend a call would get. */
typedef struct mlacore_route_request {
  int32_t op;          /* mlacore_route_op */
  int32_t device_type; /* DLDeviceType of the cache */
  DLDataType dtype;    /* cache dtype */
  int32_t layout;      /* mlacore_kv_layout (NHD for MLA) */
  int64_t page_size;
  int64_t head_dim;    /* MLA: the ckv width (512); KV: the head dim */
  int64_t head_dim_pe; /* MLA: the kpe width (64); KV: 0 */
  /* MLA (append, decode): ckv and kpe are the two halves of one
   * per-token-interleaved buffer. KV: each cache has a dense token stride
   * (heads*head_dim) and K and V share their page stride. */
  int32_t adjacent;
  /* KV: 1 when append_key or append_value does not keep a token's heads
   * dense (head stride != head_dim). 0 for MLA, and for dense sources. */
  int32_t sources_strided;
  /* Decode only (MLACORE_ROUTE_DECODE_MLA); 0 for the appends. */
  int64_t num_heads;
  int64_t max_qo_len;      /* query tokens per request the call is planned for (dims.max_qo_len) */
  int32_t causal;          /* MLACORE_DECODE_CAUSAL was given */
  int32_t index_int32;     /* every index tensor is int32 with unit stride */
  int64_t batch;           /* requests: qo_indptr has batch + 1 entries */
  int64_t workspace_bytes; /* bytes of the float workspace the call brings */
  int64_t page_stride;     /* page stride of the cache, in elements */
} mlacore_route_request;

/* Decides which backend runs `request` when `requested` is asked for.
 * On success *chosen is MLACORE_BACKEND_NATIVE or MLACORE_BACKEND_AITER and,
 * when `why` is not NULL, a NUL-terminated reason (truncated to why_size) is
 * written there. Fails like the op itself would: MLACORE_ERROR_VALUE for a
 * gate that refuses an explicit request, MLACORE_ERROR_RUNTIME when the
 * explicitly requested backend is unavailable. */
MLACORE_API mlacore_status mlacore_route(const mlacore_route_request* request, int32_t requested, int32_t* chosen,
                                         char* why, size_t why_size);

/* Availability of the backend named `name` ("native", "aiter"): *available is
 * 1 or 0, *reason a static string saying why not ("" when available). Probing
 * happens once per process and is thread-safe. */
MLACORE_API mlacore_status mlacore_backend_info(const char* name, int32_t* available, const char** reason);

/* What the AITER probe found, for reports (mlacore.backends()): the ABI
 * version the library states (0 when none was read), the path opened or
 * tried ("" when none was given; static), and which entry points it exports
 * (MLACORE_AITER_ENTRY_* bits; 0 unless the library was accepted). */
#define MLACORE_AITER_ENTRY_DECODE 1u        /* mla_decode_stage1_asm_fwd */
#define MLACORE_AITER_ENTRY_CONCAT_MLA 2u    /* aiter_concat_and_cache_mla (a shim's) */
#define MLACORE_AITER_ENTRY_RESHAPE_FLASH 4u /* aiter_reshape_and_cache_flash (a shim's) */
MLACORE_API mlacore_status mlacore_aiter_library_info(int32_t* abi_version, const char** path,
                                                      uint32_t* entry_points);

/* Hands over the path of an installed AITER's MLA library (the Python layer
 * passes aiter/jit/module_mla_asm.so when it finds the aiter package, without
 * importing it). $MLACORE_AITER_LIB, when set and non-empty, still wins. Must
 * come before the AITER probe runs (the first backend_info or routing call):
 * afterwards it fails with MLACORE_ERROR_RUNTIME, as the probe's answer is
 * cached for the process. See docs/AITER.md. */
MLACORE_API mlacore_status mlacore_aiter_set_library(const char* path);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MLACORE_BACKEND_H_ */
