/* KV layout detection: are ckv and kpe the two halves of one per-token
 * interleaved allocation (the [num_pages, page_size, Dc + Dp] buffer engines
 * carve with torch.split)? Decided from pointers, shapes, strides and dtypes
 * alone, so it works for CPU and GPU tensors and never touches their memory,
 * launches nothing and takes no stream.
 *
 * Both caches must be 3-D [num_pages, page_size, D] with equal num_pages and
 * page_size (else MLACORE_ERROR_VALUE). A pair is adjacent when all hold:
 *   - same device and same dtype (whole bytes per element);
 *   - kpe's first element sits exactly Dc elements after ckv's (data + byte_offset);
 *   - equal page strides and equal token strides, the token stride being Dc + Dp;
 *   - both last dimensions contiguous.
 * Strides of dimensions of size 1 are not compared: they address nothing. */
#ifndef MLACORE_KV_LAYOUT_H_
#define MLACORE_KV_LAYOUT_H_

#include <mlacore/mlacore.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Sets *adjacent to 1 or 0. When 1, view_shape/view_strides (3 elements each,
 * strides in elements) describe the combined [P, S, Dc + Dp] view starting at
 * ckv's first element and keeping ckv's page and token strides, so a slice of
 * a [layers, P, S, Dc + Dp] buffer gives a view into that layer. When 0 they
 * are left untouched. */
MLACORE_API mlacore_status mlacore_combined_kv_view(const DLTensor* ckv_cache, const DLTensor* kpe_cache,
                                                    int64_t* view_shape, int64_t* view_strides,
                                                    int32_t* adjacent);

/* Writes a sentence saying why the pair is or is not adjacent into buf
 * (NUL-terminated, truncated to buf_size - 1 characters; buf may be NULL when
 * buf_size is 0). *length (may be NULL) receives the full length without the
 * NUL, so a caller can size a buffer with a first call. Same errors as
 * mlacore_combined_kv_view. */
MLACORE_API mlacore_status mlacore_explain_kv_layout(const DLTensor* ckv_cache, const DLTensor* kpe_cache,
                                                     char* buf, size_t buf_size, size_t* length);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MLACORE_KV_LAYOUT_H_ */
