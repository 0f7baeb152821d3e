/* mlacore: MLA decode over a paged KV cache (part of the C ABI, see mlacore.h).
 *
 * One call runs a planned decode schedule (the int32 `schedule` written by the
 * plan builder, see <mlacore/plan.h>; its sections by mlacore_plan_layout()): every work item attends
 * the query rows of one request to a KV token range, split requests leave fp32
 * partials in `workspace`, and a combine pass merges them by LSE.
 */
#ifndef MLACORE_DECODE_H_
#define MLACORE_DECODE_H_

#include <mlacore/mlacore.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Capacities the schedule was planned for. They size the launch grid and the
 * workspace, so under CUDA graphs they stay fixed while the schedule changes. */
typedef struct mlacore_decode_dims {
  int64_t max_batch;  /* the plan's max_batch (mlacore_plan_capacity), which sized `schedule` */
  int64_t max_work;   /* the plan's max_work */
  int64_t max_qo_len; /* largest qo_len of any request this schedule may hold */
  /* Partial outputs the workspace holds, 0..max_work: the plan's partial count
   * for one schedule, or what the workspace holds when the schedule may change
   * under a CUDA graph (mlacore_mla_decode_workspace_partials). A work item
   * whose partial index is past it writes nothing. */
  int64_t max_partials;
} mlacore_decode_dims;

/* flags */
#define MLACORE_DECODE_CAUSAL 1u   /* query token t of a request with qo_len q, kv_len L sees positions < L - q + t + 1 */
#define MLACORE_DECODE_PORTABLE 2u /* GPU: use the portable SIMT kernel (the HIP kernel) instead of the tensor-core one */

/* Bytes of `workspace` a decode with these capacities and head count needs;
 * -1 when a dim or num_heads is negative or the byte count overflows int64. */
MLACORE_API int64_t mlacore_mla_decode_workspace_bytes(mlacore_decode_dims dims, int64_t num_heads);

/* The workspace sizing policy, shared by every caller. A workspace of
 * `workspace_bytes` holds mlacore_mla_decode_workspace_rows() fp32 partial
 * rows (512 values + LSE each): give that to mlacore_plan_set_partial_budget
 * and schedules never need more. A decode with max_qo_len and num_heads then
 * holds mlacore_mla_decode_workspace_partials() partials (dims.max_partials,
 * clamped to max_work). -1 for negative arguments. */
MLACORE_API int64_t mlacore_mla_decode_workspace_rows(int64_t workspace_bytes);
MLACORE_API int64_t mlacore_mla_decode_workspace_partials(int64_t workspace_bytes, int64_t max_qo_len,
                                                          int64_t num_heads);

/* out[i, h, :] = softmax(sm_scale * q[i, h] . k) v over the request's KV, where
 * k = [ckv | kpe] (576) and v = ckv (512) of each token.
 *   q_nope [total_q, H, 512], q_pe [total_q, H, 64]: bf16 or fp16, last dim contiguous
 *   ckv [P, S, 512], kpe [P, S, 64]: same dtype; any page/token strides, last dim
 *     contiguous; they may be the halves of one [P, S, 576] buffer or separate.
 *   kv_indices, kv_indptr [B+1], qo_indptr [B+1], kv_len [B]: int32 or int64
 *   schedule: int32, mlacore_plan_schedule_size(dims.max_batch, dims.max_work) elements
 *   workspace: uint8, >= mlacore_mla_decode_workspace_bytes(dims, H) bytes
 *   out [total_q, H, 512] same dtype as q; lse [total_q, H] float32 or NULL
 *     (log2 of the sum of exp2(sm_scale * log2(e) * score); -inf for a request
 *     without KV, whose output is zeros).
 * A page id outside [0, P) or a token past the request's pages is masked: it
 * takes no part in the softmax and nothing is read from it. All tensors on one
 * device (schedule and the index tensors too); nothing synchronizes.
 * Runs with backend MLACORE_BACKEND_AUTO (see mlacore_mla_decode_backend). */
MLACORE_API mlacore_status mlacore_mla_decode(
    const DLTensor* q_nope, const DLTensor* q_pe, const DLTensor* ckv, const DLTensor* kpe,
    const DLTensor* kv_indices, const DLTensor* kv_indptr, const DLTensor* qo_indptr, const DLTensor* kv_len,
    const DLTensor* schedule, const DLTensor* workspace, const DLTensor* out, const DLTensor* lse,
    mlacore_decode_dims dims, int64_t page_size, float sm_scale, uint32_t flags, void* stream);

/* mlacore_mla_decode with a backend request (an mlacore_backend, see
 * <mlacore/backend.h>). AUTO and AITER consult the routing gates
 * (MLACORE_ROUTE_DECODE_MLA): on a ROCm device with AITER loaded, bf16, 16 or
 * 128 heads, 1 to 4 query tokens per request (causal when more than 1),
 * int32 unit-stride index tensors, power-of-two page size, ckv and kpe the
 * halves of one [P, S, 576] buffer, and a workspace large enough for
 * AITER's query rows and split partials, the call runs AITER's MLA decode
 * kernel and mlacore's merge of its partials; otherwise AUTO runs the
 * native kernel and AITER fails naming the gate (MLACORE_ERROR_VALUE) or
 * why AITER is unavailable (MLACORE_ERROR_RUNTIME). Outputs, LSE base and
 * the no-sync, no-allocation guarantees are the same on both routes.
 * MLACORE_DECODE_PORTABLE asks for a native kernel: with AITER it is an
 * error, with AUTO it means NATIVE. See docs/AITER.md. */
MLACORE_API mlacore_status mlacore_mla_decode_backend(
    const DLTensor* q_nope, const DLTensor* q_pe, const DLTensor* ckv, const DLTensor* kpe,
    const DLTensor* kv_indices, const DLTensor* kv_indptr, const DLTensor* qo_indptr, const DLTensor* kv_len,
    const DLTensor* schedule, const DLTensor* workspace, const DLTensor* out, const DLTensor* lse,
    mlacore_decode_dims dims, int64_t page_size, float sm_scale, uint32_t flags, int32_t backend, void* stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MLACORE_DECODE_H_ */
