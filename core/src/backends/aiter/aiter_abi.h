// AITER's C ABI, declared here from its published facts (csrc/include/
// aiter_tensor.h and the extern "C" entry points of AITER >= 0.1.12) so that
// libmlacore builds without AITER's headers and loads AITER only at run time.
// Plain C declarations: the fake AITER of the contract test includes this
// file too, so both sides of the call agree by construction, and the
// static_asserts below catch a drift from the layout AITER compiles.
#ifndef MLACORE_AITER_ABI_H_
#define MLACORE_AITER_ABI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Order matters: AITER passes the enum by value, so each name's position is
// its number. Values spelled out so a reordering here is a visible edit.
typedef enum {
  AITER_DTYPE_fp8 = 0,
  AITER_DTYPE_fp8_e8m0 = 1,
  AITER_DTYPE_fp16 = 2,
  AITER_DTYPE_bf16 = 3,
  AITER_DTYPE_fp32 = 4,
  AITER_DTYPE_i4x2 = 5,
  AITER_DTYPE_fp4x2 = 6,
  AITER_DTYPE_u32 = 7,
  AITER_DTYPE_i32 = 8,
  AITER_DTYPE_i16 = 9,
  AITER_DTYPE_i8 = 10,
  AITER_DTYPE_u8 = 11,
  AITER_DTYPE_i64 = 12,
  AITER_DTYPE_u64 = 13
} AiterDtype;

#define MLACORE_AITER_MAX_DIMS 8

// One tensor as AITER's C entry points take it: a device pointer with up to
// eight dimensions; shape and strides are in elements (not bytes).
typedef struct aiter_tensor_t {
  void* ptr;
  size_t numel_;
  int ndim;
  int64_t shape[MLACORE_AITER_MAX_DIMS];
  int64_t strides[MLACORE_AITER_MAX_DIMS];
  AiterDtype dtype_;
  int device_id;
} aiter_tensor_t;

// hipStream_t is `struct ihipStream_t*` in HIP's headers; naming the same
// incomplete struct keeps this header free of HIP while a HIP build can pass
// its hipStream_t unchanged.
struct ihipStream_t;
typedef struct ihipStream_t* aiter_stream_t;

// The stage-1 MLA decode entry point, exactly as AITER >= 0.1.12 exports it.
typedef void (*mla_decode_stage1_asm_fwd_fn)(
    aiter_tensor_t* Q, aiter_tensor_t* KV, aiter_tensor_t* qo_indptr, aiter_tensor_t* kv_indptr,
    aiter_tensor_t* kv_page_indices, aiter_tensor_t* kv_last_page_lens, aiter_tensor_t* num_kv_splits_indptr,
    aiter_tensor_t* work_meta_data, aiter_tensor_t* work_indptr, aiter_tensor_t* work_info_set, int max_seqlen_q,
    int page_size, int nhead_kv, float softmax_scale, aiter_tensor_t* splitData, aiter_tensor_t* splitLse,
    aiter_tensor_t* output, aiter_tensor_t* lse, aiter_tensor_t* q_scale, aiter_tensor_t* kv_scale,
    aiter_stream_t stream);

// The cache writes. AITER exports these only as torch ops
// (concat_and_cache_mla, reshape_and_cache_flash); these C entry points are
// mlacore's ABI v1 for a shim built against a pinned AITER (docs/AITER.md),
// taking the torch ops' arguments in the same order. Optional: a library
// without them still serves decode, and the appends stay native.
// kv_cache_dtype is "auto" (mlacore passes nothing else: fp8 caches are not
// routed). Scales are device float tensors of one element, which AITER always
// dereferences. Slots < 0 are skipped. Return 0 on success; anything else is
// a failure the shim could not report otherwise (it must catch every C++
// exception: none may cross an extern "C" boundary).
typedef int (*aiter_concat_and_cache_mla_fn)(aiter_tensor_t* kv_c, aiter_tensor_t* k_pe, aiter_tensor_t* kv_cache,
                                             aiter_tensor_t* slot_mapping, const char* kv_cache_dtype,
                                             aiter_tensor_t* scale, aiter_stream_t stream);
typedef int (*aiter_reshape_and_cache_flash_fn)(aiter_tensor_t* key, aiter_tensor_t* value, aiter_tensor_t* key_cache,
                                                aiter_tensor_t* value_cache, aiter_tensor_t* slot_mapping,
                                                const char* kv_cache_dtype, aiter_tensor_t* k_scale,
                                                aiter_tensor_t* v_scale, aiter_stream_t stream);

// mlacore's version-symbol convention (docs/AITER.md): a library that wants to
// be called exports `int aiter_c_abi_version(void)`; mlacore calls only the
// versions it knows. Released AITER builds do not export it yet.
typedef int (*aiter_c_abi_version_fn)(void);

#define MLACORE_AITER_ENTRY_SYMBOL "mla_decode_stage1_asm_fwd"
#define MLACORE_AITER_VERSION_SYMBOL "aiter_c_abi_version"
#define MLACORE_AITER_CONCAT_MLA_SYMBOL "aiter_concat_and_cache_mla"
#define MLACORE_AITER_RESHAPE_FLASH_SYMBOL "aiter_reshape_and_cache_flash"

#ifdef __cplusplus
}  // extern "C"

// The x86-64/LP64 layout AITER is compiled with: pointer, size_t, int plus
// padding, two int64 arrays, two ints.
static_assert(sizeof(AiterDtype) == 4, "AiterDtype must be an int-sized enum");
static_assert(offsetof(aiter_tensor_t, numel_) == 8, "aiter_tensor_t layout drifted");
static_assert(offsetof(aiter_tensor_t, ndim) == 16, "aiter_tensor_t layout drifted");
static_assert(offsetof(aiter_tensor_t, shape) == 24, "aiter_tensor_t layout drifted");
static_assert(offsetof(aiter_tensor_t, strides) == 88, "aiter_tensor_t layout drifted");
static_assert(offsetof(aiter_tensor_t, dtype_) == 152, "aiter_tensor_t layout drifted");
static_assert(offsetof(aiter_tensor_t, device_id) == 156, "aiter_tensor_t layout drifted");
static_assert(sizeof(aiter_tensor_t) == 160, "aiter_tensor_t layout drifted");
#endif

#endif  // MLACORE_AITER_ABI_H_
