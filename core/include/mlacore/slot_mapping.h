/* Slot mapping and page-index bookkeeping: the per-step index translations
 * between FlashInfer's paged layout (kv_indptr / kv_indices), vLLM's slots
 * (page * page_size + offset, int64, negative = skip) and block tables.
 *
 * Each entry point is one kernel on the caller's stream (a plain loop for CPU
 * tensors), never synchronizes and allocates nothing, so all of them can be
 * captured in a CUDA graph. All tensors must be on one device. 1-D index
 * tensors may be strided views. Index values are read from device memory and
 * never trusted: every read is bounds-checked, and an entry that would need an
 * out-of-range read produces -1 (or, for the block table, no write). */
#ifndef MLACORE_SLOT_MAPPING_H_
#define MLACORE_SLOT_MAPPING_H_

#include <mlacore/mlacore.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out[t] = kv_indices[kv_indptr[b] + pos / page_size] * page_size + pos % page_size
 * with b = batch_indices[t], pos = positions[t].
 *
 * batch_indices, positions: 1-D, same length nnz, same dtype (int32 or int64).
 * kv_indices, kv_indptr [batch + 1]: 1-D, same dtype (int32 or int64); the
 * two pairs may differ (4 combinations). out: 1-D int64 of length nnz.
 * page_size >= 1. num_pages < 0 leaves page ids unchecked except that the
 * slot must fit in int64; num_pages >= 0 requires page ids in [0, num_pages).
 * out[t] = -1 when b is not in [0, batch), kv_indptr[b..b+1] is not a range
 * inside kv_indices, pos < 0, pos lies past the request's pages, or the page
 * id is invalid. */
MLACORE_API mlacore_status mlacore_slot_mapping(const DLTensor* batch_indices, const DLTensor* positions,
                                                const DLTensor* kv_indices, const DLTensor* kv_indptr,
                                                int64_t page_size, int64_t num_pages, const DLTensor* out,
                                                void* stream);

/* out[cu[r] + j] = block_table[r, j] for j < cu[r+1] - cu[r]: the rows of a
 * [batch, max_blocks] block table (any strides: transposed and sliced views
 * are fine) flattened into a kv_indices vector.
 *
 * block_table: 2-D int32 or int64; out: 1-D, same dtype as block_table.
 * cu_num_blocks [batch + 1]: 1-D int32 or int64 (it need not start at 0).
 * Clamping, so nothing is ever written out of range: a row copies at most
 * max_blocks entries (the rest of its range in out is left untouched), writes
 * stop at the end of out, and a row whose range is negative or reversed
 * writes nothing. Rows whose ranges overlap (a cu_num_blocks that is not
 * non-decreasing) write the shared entries in an unspecified order on a GPU. */
MLACORE_API mlacore_status mlacore_page_indices_from_block_table(const DLTensor* block_table,
                                                                 const DLTensor* cu_num_blocks,
                                                                 const DLTensor* out, void* stream);

/* FlashInfer's get_batch_indices_positions: for token t of request b
 * (append_indptr[b] <= t < append_indptr[b+1]) batch_indices[t] = b and
 * positions[t] = seq_lens[b] - (append_indptr[b+1] - append_indptr[b]) + (t - append_indptr[b]),
 * an absolute position, since seq_lens count the appended tokens.
 *
 * append_indptr [batch + 1], seq_lens [batch]: 1-D, same dtype (int32 or int64).
 * batch_indices, positions: 1-D, same length nnz (chosen by the caller, so no
 * sync is needed), same dtype (int32 or int64). A token no request covers
 * (t < append_indptr[0] or t >= append_indptr[batch]) gets -1 in both; a
 * position that would be negative (seq_lens[b] smaller than the request's
 * appended count) or does not fit the output dtype gets position -1. */
MLACORE_API mlacore_status mlacore_batch_indices_positions(const DLTensor* append_indptr, const DLTensor* seq_lens,
                                                           const DLTensor* batch_indices, const DLTensor* positions,
                                                           void* stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MLACORE_SLOT_MAPPING_H_ */
