/* mlacore: appending new tokens' KV rows into a paged cache (FlashInfer's
 * append_paged_mla_kv_cache / append_paged_kv_cache).
 *
 * Token i goes to request batch_indices[i] at absolute position positions[i]:
 * page kv_indices[kv_indptr[b] + pos / page_size], offset pos % page_size.
 * Caches are written through their strides (halves of one [P, S, 576] buffer,
 * layer slices, HND and NHD). A token whose batch index, position or page id
 * is out of range is skipped and writes nothing; with `strict` (or the
 * environment variable MLACORE_STRICT=1) the call instead synchronizes,
 * checks every token first and fails with MLACORE_ERROR_VALUE naming the
 * first bad one, writing nothing. Without strict nothing synchronizes and
 * nothing is allocated, so the call can be captured in a CUDA graph.
 *
 * Index tensors are 1-D int32 or int64 (kv_indices and kv_indptr of one
 * dtype), may be strided, and live on the cache's device. kv_last_page_len
 * [batch] is checked by shape only. Sources are [nnz, ...] with a contiguous
 * last dimension and any row stride; dtypes float16, bfloat16, float32, equal
 * to the cache's.
 *
 * `backend` (an mlacore_backend): AUTO and AITER route a write to AITER's
 * cache writes (a shim's aiter_concat_and_cache_mla for a combined MLA cache,
 * aiter_reshape_and_cache_flash for dense NHD K/V caches) when its gates pass
 * on a ROCm device; the cache ends up the same either way. See
 * docs/AITER.md for the gates and what AITER receives.
 */
#ifndef MLACORE_PAGED_APPEND_H_
#define MLACORE_PAGED_APPEND_H_

#include <mlacore/mlacore.h>

#ifdef __cplusplus
extern "C" {
#endif

/* append_ckv [nnz, Dc] -> ckv_cache [P, S, Dc]; append_kpe [nnz, Dp] -> kpe_cache [P, S, Dp].
 * `backend` is an mlacore_backend (see <mlacore/backend.h>). */
MLACORE_API mlacore_status mlacore_append_paged_mla_kv_cache(
    const DLTensor* append_ckv, const DLTensor* append_kpe, const DLTensor* batch_indices,
    const DLTensor* positions, const DLTensor* ckv_cache, const DLTensor* kpe_cache, const DLTensor* kv_indices,
    const DLTensor* kv_indptr, const DLTensor* kv_last_page_len, int32_t backend, int32_t strict, void* stream);

/* append_key, append_value [nnz, H, D] -> the paged K and V caches.
 * `layout` is an mlacore_kv_layout. Either k_cache and v_cache are 4-D
 * ([P, S, H, D] NHD or [P, H, S, D] HND), or v_cache is NULL and k_cache is
 * one 5-D tensor ([P, 2, S, H, D] NHD or [P, 2, H, S, D] HND, K at index 0). */
MLACORE_API mlacore_status mlacore_append_paged_kv_cache(
    const DLTensor* append_key, const DLTensor* append_value, const DLTensor* batch_indices,
    const DLTensor* positions, const DLTensor* k_cache, const DLTensor* v_cache, const DLTensor* kv_indices,
    const DLTensor* kv_indptr, const DLTensor* kv_last_page_len, int32_t layout, int32_t backend, int32_t strict,
    void* stream);

/* vLLM's concat_and_cache_mla (kv_cache_dtype "auto"): token i's kv_c [T, Dc]
 * and k_pe [T, Dp] rows, side by side, into slot slot_mapping[i] (= block *
 * block_size + offset) of kv_cache [num_blocks, block_size, Dc + Dp].
 * kv_cache may be a strided view (one layer of [layers, blocks, block_size,
 * 576]) with a contiguous last dim; kv_c and k_pe any token stride, contiguous
 * last dim, the cache's dtype (float16, bfloat16, float32). slot_mapping is
 * 1-D int64 (or int32) [T] on the cache's device. A negative slot skips the
 * token, as in vLLM; so does a slot at or past num_blocks * block_size,
 * silently, unless `strict` (or MLACORE_STRICT=1): then the call synchronizes,
 * checks every slot first and fails with MLACORE_ERROR_VALUE naming the first
 * such token, writing nothing (negative slots stay skips). Never allocates;
 * without strict never synchronizes. */
MLACORE_API mlacore_status mlacore_concat_and_cache_mla(const DLTensor* kv_c, const DLTensor* k_pe,
                                                       const DLTensor* kv_cache, const DLTensor* slot_mapping,
                                                       int32_t strict, void* stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MLACORE_PAGED_APPEND_H_ */
