"""MLA decode over a paged KV cache: a drop-in for FlashInfer's
`BatchMLAPagedAttentionWrapper`, running mlacore's native kernels.

plan() builds the split-KV schedule (through `mlacore.MlaPlan`: one
device-to-host round trip, none for host inputs, or a device-only build for
CUDA-graph replans); run() reads ckv and kpe in place through their own
strides, so the two halves of a [P, S, 576] buffer and two separate caches
both run without a copy.
"""

import math

import torch

from . import _mlacore

_HEAD_DIM_CKV = 512
_HEAD_DIM_KPE = 64
_TILE_TOKENS = 64  # kDecodeTileTokens (core/src/decode_schedule.h)
_HDR_SIZE = 8


def _layout(max_batch, max_work):
    """Offsets of ScheduleLayout (core/src/decode_schedule.h): last_page_len, split_indptr, work, total."""
    last_page_len = _HDR_SIZE
    split_indptr = last_page_len + max_batch
    work = (split_indptr + max_batch + 1 + 3) // 4 * 4
    return last_page_len, split_indptr, work, work + 4 * max_work


def _host_schedule(qo_indptr, kv_len, page_size, num_heads, max_batch=None, max_work=None, chunk_tokens=None,
                   num_sms=132):
    """A plain host schedule in the layout of decode_schedule.h, int32 on the CPU.

    Splits every request into chunks of `chunk_tokens` (a multiple of 64;
    default: the total KV spread over `num_sms`). Used by tests to force
    particular splits, and by plan() only when mlacore.MlaPlan is absent.
    Returns (metadata, max_batch, max_work, max_qo_len).
    """
    qo = [int(x) for x in torch.as_tensor(qo_indptr).tolist()]
    lens = [int(x) for x in torch.as_tensor(kv_len).tolist()]
    batch = len(lens)
    tiles = [-(-n // _TILE_TOKENS) for n in lens]
    if chunk_tokens is None:
        chunk = max(1, -(-sum(tiles) // max(num_sms, 1)))
        chunk_tokens = min(chunk, max(tiles + [1])) * _TILE_TOKENS
    if chunk_tokens <= 0 or chunk_tokens % _TILE_TOKENS:
        raise ValueError(f"chunk_tokens: expected a positive multiple of {_TILE_TOKENS}, got {chunk_tokens}")
    splits = [max(1, -(-n // chunk_tokens)) for n in lens]
    max_batch = max(batch, 1) if max_batch is None else max_batch
    max_work = max(sum(splits), 1) if max_work is None else max_work
    if max_batch < batch or max_work < sum(splits):
        raise ValueError(f"capacity too small: batch {batch} > {max_batch} or work {sum(splits)} > {max_work}")
    lpl_off, split_off, work_off, total = _layout(max_batch, max_work)
    md = [0] * total
    items, partials = [], 0
    for b in range(batch):
        md[split_off + b] = partials
        pages = -(-lens[b] // page_size)
        md[lpl_off + b] = lens[b] - (pages - 1) * page_size if lens[b] > 0 else 0
        for i in range(splits[b]):
            begin, end = i * chunk_tokens, min((i + 1) * chunk_tokens, lens[b])
            items.append((b, begin, max(end, begin), partials + i if splits[b] > 1 else -1))
        if splits[b] > 1:
            partials += splits[b]
    for b in range(batch, max_batch + 1):
        md[split_off + b] = partials
    for w in range(max_work):
        md[work_off + 4 * w: work_off + 4 * w + 4] = items[w] if w < len(items) else (-1, 0, 0, -1)
    max_qo = max([qo[b + 1] - qo[b] for b in range(batch)] + [1])
    md[0:8] = [len(items), partials, batch, max_qo, max(lens + [0]), chunk_tokens, qo[batch] if batch else 0, 0]
    return torch.tensor(md, dtype=torch.int32), max_batch, max_work, max_qo


def workspace_bytes(max_batch, max_work, max_qo_len, num_heads):
    """Bytes of float workspace a decode with these capacities needs (fp32 partials + LSE)."""
    return _mlacore.mla_decode_workspace_bytes(max_batch, max_work, max_qo_len, num_heads)


# --- the core call, eager and as a torch custom op -------------------------

def _decode_impl(q_nope, q_pe, ckv, kpe, kv_indices, kv_indptr, qo_indptr, kv_len, metadata, workspace, out, lse,
                 max_batch, max_work, max_qo_len, page_size, sm_scale, causal, portable):
    _mlacore.mla_decode(q_nope, q_pe, ckv, kpe, kv_indices, kv_indptr, qo_indptr, kv_len, metadata, workspace, out,
                        lse, max_batch, max_work, max_qo_len, page_size, sm_scale, causal, portable)


@torch.library.custom_op("mlacore::mla_decode", mutates_args=("out", "lse"))
def _decode_op(q_nope: torch.Tensor, q_pe: torch.Tensor, ckv: torch.Tensor, kpe: torch.Tensor,
               kv_indices: torch.Tensor, kv_indptr: torch.Tensor, qo_indptr: torch.Tensor, kv_len: torch.Tensor,
               metadata: torch.Tensor, workspace: torch.Tensor, out: torch.Tensor, lse: torch.Tensor | None,
               max_batch: int, max_work: int, max_qo_len: int, page_size: int, sm_scale: float, causal: bool,
               portable: bool) -> None:
    _decode_impl(q_nope, q_pe, ckv, kpe, kv_indices, kv_indptr, qo_indptr, kv_len, metadata, workspace, out, lse,
                 max_batch, max_work, max_qo_len, page_size, sm_scale, causal, portable)


@_decode_op.register_fake
def _(q_nope, q_pe, ckv, kpe, kv_indices, kv_indptr, qo_indptr, kv_len, metadata, workspace, out, lse, max_batch,
      max_work, max_qo_len, page_size, sm_scale, causal, portable):
    return None


def _field(obj, name):
    if isinstance(obj, dict):
        return obj[name]
    return getattr(obj, name)


def _num_sms(device):
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132  # CPU runs the schedule a GPU of this size would get, so the split path is exercised


class BatchMLAPagedAttentionWrapper:
    """FlashInfer-compatible MLA decode wrapper over a paged KV cache.

    `float_workspace_buffer` (any dtype, usually uint8) holds the fp32 partial
    outputs of split requests; its size is checked with a message naming the
    bytes needed. With `use_cuda_graph=True` the capacities (batch, work
    items, largest qo_len) are fixed by the first plan() (or by the index
    buffers given here), plan() for graph replays computes the schedule on
    the device without a sync when the inputs are on the device, and run()
    neither allocates (given `out`/`lse`) nor synchronizes.

    backend: "auto" or "native" (the tensor-core kernel on CUDA, the portable
    kernel on HIP, the reference loop on the CPU), or "portable" (force the
    portable SIMT kernel on a GPU; for tests).
    """

    def __init__(self, float_workspace_buffer, use_cuda_graph=False, qo_indptr=None, kv_indptr=None,
                 kv_indices=None, kv_len_arr=None, backend="auto"):
        if not isinstance(float_workspace_buffer, torch.Tensor):
            raise TypeError(f"float_workspace_buffer: expected a torch.Tensor, got {type(float_workspace_buffer).__name__}")
        if backend not in ("auto", "native", "portable"):
            raise ValueError(f"backend: expected 'auto', 'native' or 'portable', got {backend!r} "
                             "(the AITER route is not part of this wrapper yet)")
        self._workspace = float_workspace_buffer
        self._device = float_workspace_buffer.device
        self._use_cuda_graph = bool(use_cuda_graph)
        self._portable = backend == "portable"
        self._buffers = (qo_indptr, kv_indptr, kv_indices, kv_len_arr)
        self._capacity = None  # (max_batch, max_work, max_qo_len) once fixed
        self._plan = None
        self._metadata = None
        self._planned = False
        if use_cuda_graph and qo_indptr is not None:
            self._graph_max_batch = qo_indptr.numel() - 1
        else:
            self._graph_max_batch = None

    # FlashInfer's signature, `use_profiler` accepted and ignored.
    def plan(self, qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv, head_dim_kpe, page_size,
             causal, sm_scale, q_data_type, kv_data_type, use_profiler=False):
        if head_dim_ckv != _HEAD_DIM_CKV or head_dim_kpe != _HEAD_DIM_KPE:
            raise ValueError(f"head dims: expected head_dim_ckv={_HEAD_DIM_CKV} and head_dim_kpe={_HEAD_DIM_KPE}, "
                             f"got {head_dim_ckv} and {head_dim_kpe}")
        if not 1 <= int(num_heads) <= 128:
            raise ValueError(f"num_heads: expected 1 to 128, got {num_heads}")
        if int(page_size) < 1:
            raise ValueError(f"page_size: expected >= 1, got {page_size}")
        for name, dt in (("q_data_type", q_data_type), ("kv_data_type", kv_data_type)):
            if dt not in (torch.bfloat16, torch.float16):
                raise ValueError(f"{name}: expected torch.bfloat16 or torch.float16, got {dt}")
        if q_data_type != kv_data_type:
            raise ValueError(f"q_data_type and kv_data_type must match, got {q_data_type} and {kv_data_type}")
        for name, t in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr), ("kv_indices", kv_indices),
                        ("kv_len_arr", kv_len_arr)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
            if t.dim() != 1 or t.dtype not in (torch.int32, torch.int64):
                raise ValueError(f"{name}: expected a 1-D int32 or int64 tensor, got {t.dtype} of shape {tuple(t.shape)}")
        batch = qo_indptr.numel() - 1
        if batch < 0 or kv_indptr.numel() != batch + 1 or kv_len_arr.numel() != batch:
            raise ValueError(f"kv_indptr/kv_len_arr: expected lengths batch+1={batch + 1} and batch={batch}, got "
                             f"{kv_indptr.numel()} and {kv_len_arr.numel()}")

        # The kernel reads one index width; a mix is normalized once, here.
        idx = (qo_indptr, kv_indptr, kv_indices, kv_len_arr)
        if len({t.dtype for t in idx}) > 1:
            idx = tuple(t.to(torch.int32) for t in idx)
        idx = tuple(t.to(self._device, non_blocking=True) if t.device != self._device else t for t in idx)
        self._qo_indptr, self._kv_indptr, self._kv_indices, self._kv_len = idx
        self._num_heads = int(num_heads)
        self._page_size = int(page_size)
        self._causal = bool(causal)
        self._sm_scale = float(sm_scale)
        self._dtype = q_data_type
        self._build_schedule(qo_indptr, kv_indptr, kv_len_arr, batch)
        need = workspace_bytes(*self._capacity, self._num_heads)
        have = self._workspace.numel() * self._workspace.element_size()
        if have < need:
            raise ValueError(f"float_workspace_buffer: expected at least {need} bytes for max_work="
                             f"{self._capacity[1]} x max_qo_len={self._capacity[2]} x heads={self._num_heads} "
                             f"fp32 partial rows, got {have} bytes")
        self._planned = True

    def _build_schedule(self, qo_indptr, kv_indptr, kv_len_arr, batch):
        import mlacore

        plan_cls = getattr(mlacore, "MlaPlan", None)
        on_device = qo_indptr.device.type != "cpu"
        if self._capacity is not None and self._use_cuda_graph:
            max_batch, max_work, max_qo_cap = self._capacity
            if batch > max_batch:
                raise ValueError(f"qo_indptr: batch {batch} exceeds the CUDA-graph capacity {max_batch} fixed by "
                                 "the first plan()")
        else:
            max_batch = max(batch, self._graph_max_batch or 0, 1)
            max_work, max_qo_cap = None, None

        if plan_cls is not None:
            if self._plan is None or (not self._use_cuda_graph and _field(self._plan, "max_batch") < max_batch):
                self._plan = plan_cls(self._device, max_batch=max_batch)
                self._metadata = None
            plan = self._plan
            if self._use_cuda_graph and self._capacity is not None and on_device:
                plan.build_device(qo_indptr, kv_indptr, kv_len_arr, self._page_size, self._num_heads)
                max_qo = max_qo_cap
            else:
                plan.build(qo_indptr, kv_indptr, kv_len_arr, self._page_size, self._num_heads)
                max_qo = max(int(_field(plan.info, "max_qo_len")), 1)
            metadata = plan.metadata
            max_batch, max_work = int(_field(plan, "max_batch")), int(_field(plan, "max_work"))
        else:
            md, max_batch, max_work, max_qo = _host_schedule(
                qo_indptr.cpu(), kv_len_arr.cpu(), self._page_size, self._num_heads, max_batch=max_batch,
                max_work=max_work if max_work is not None else max_batch + _num_sms(self._device),
                num_sms=_num_sms(self._device))
            if self._metadata is not None and self._metadata.numel() == md.numel():
                self._metadata.copy_(md, non_blocking=True)
            else:
                self._metadata = md.to(self._device)
            metadata = self._metadata

        if self._use_cuda_graph:
            if self._capacity is None:
                self._capacity = (max_batch, max_work, max_qo)
            elif max_qo > self._capacity[2]:
                raise ValueError(f"qo_indptr: a request with {max_qo} query tokens exceeds the CUDA-graph capacity "
                                 f"{self._capacity[2]} fixed by the first plan()")
        else:
            self._capacity = (max_batch, max_work, max_qo)
        self._md = metadata

    def run(self, q_nope, q_pe, ckv_cache, kpe_cache, out=None, lse=None, return_lse=False, profiler_buffer=None,
            kv_len=None, page_table=None):
        if not self._planned:
            raise RuntimeError("run() before plan()")
        if not isinstance(q_nope, torch.Tensor):
            raise TypeError(f"q_nope: expected a torch.Tensor, got {type(q_nope).__name__}")
        if out is None:
            out = torch.empty(q_nope.shape, dtype=q_nope.dtype, device=q_nope.device)
        if return_lse and lse is None:
            lse = torch.empty(q_nope.shape[:2], dtype=torch.float32, device=q_nope.device)
        args = (q_nope, q_pe, ckv_cache, kpe_cache, self._kv_indices, self._kv_indptr, self._qo_indptr, self._kv_len,
                self._md, self._workspace, out, lse, *self._capacity, self._page_size, self._sm_scale, self._causal,
                self._portable)
        if torch.compiler.is_compiling():
            _decode_op(*args)
        else:
            _decode_impl(*args)
        return (out, lse) if return_lse else out


__all__ = ["BatchMLAPagedAttentionWrapper"]
