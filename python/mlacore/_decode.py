"""MLA decode over a paged KV cache: a drop-in for FlashInfer's
`BatchMLAPagedAttentionWrapper`, running mlacore's native kernels.

plan() builds the split-KV schedule (through `mlacore.MlaPlan`: one
device-to-host round trip, none for host inputs, or a device-only build for
CUDA-graph replans); run() reads ckv and kpe in place through their own
strides, so the two halves of a [P, S, 576] buffer and two separate caches
both run without a copy.
"""

import torch

from . import _mlacore

_HEAD_DIM_CKV = 512
_HEAD_DIM_KPE = 64


def workspace_bytes(max_batch, max_work, max_qo_len, num_heads, max_partials=None):
    """Bytes of float workspace a decode needs: fp32 partial rows + LSE for
    `max_partials` partials (default: max_work, enough for any schedule of that capacity)."""
    return _mlacore.mla_decode_workspace_bytes(max_batch, max_work, max_qo_len,
                                               max_work if max_partials is None else max_partials, num_heads)


# --- the core call, eager and as a torch custom op -------------------------

def _decode_impl(q_nope, q_pe, ckv, kpe, kv_indices, kv_indptr, qo_indptr, kv_len, metadata, workspace, out, lse,
                 max_batch, max_work, max_qo_len, max_partials, page_size, sm_scale, causal, portable, backend="auto"):
    _mlacore.mla_decode(q_nope, q_pe, ckv, kpe, kv_indices, kv_indptr, qo_indptr, kv_len, metadata, workspace, out,
                        lse, max_batch, max_work, max_qo_len, max_partials, page_size, sm_scale, causal, portable,
                        backend)


@torch.library.custom_op("mlacore::mla_decode", mutates_args=("out", "lse"))
def _decode_op(q_nope: torch.Tensor, q_pe: torch.Tensor, ckv: torch.Tensor, kpe: torch.Tensor,
               kv_indices: torch.Tensor, kv_indptr: torch.Tensor, qo_indptr: torch.Tensor, kv_len: torch.Tensor,
               metadata: torch.Tensor, workspace: torch.Tensor, out: torch.Tensor, lse: torch.Tensor | None,
               max_batch: int, max_work: int, max_qo_len: int, max_partials: int, page_size: int, sm_scale: float,
               causal: bool, portable: bool, backend: str) -> None:
    _decode_impl(q_nope, q_pe, ckv, kpe, kv_indices, kv_indptr, qo_indptr, kv_len, metadata, workspace, out, lse,
                 max_batch, max_work, max_qo_len, max_partials, page_size, sm_scale, causal, portable, backend)


@_decode_op.register_fake
def _(q_nope, q_pe, ckv, kpe, kv_indices, kv_indptr, qo_indptr, kv_len, metadata, workspace, out, lse, max_batch,
      max_work, max_qo_len, max_partials, page_size, sm_scale, causal, portable, backend):
    return None


class BatchMLAPagedAttentionWrapper:
    """FlashInfer-compatible MLA decode wrapper over a paged KV cache.

    `float_workspace_buffer` (any dtype, usually uint8) holds the fp32 partial
    outputs of split requests; its size is checked with a message naming the
    bytes needed. With `use_cuda_graph=True` the capacities (batch, work
    items, largest qo_len) are fixed by the first plan() (or by the index
    buffers given here), plan() for graph replays computes the schedule on
    the device without a sync when the inputs are on the device, and run()
    neither allocates (given `out`/`lse`) nor synchronizes.

    backend: "native" (the tensor-core kernel on CUDA, the portable kernel on
    HIP, the reference loop on the CPU), "aiter" (AITER's MLA decode kernel on
    a ROCm device; ValueError naming the gate a call fails, RuntimeError when
    AITER is unavailable; see docs/AITER.md), "auto" (AITER where its gates
    pass and it is loaded, else native), or "portable" (force the portable
    SIMT kernel on a GPU; for tests).
    """

    def __init__(self, float_workspace_buffer, use_cuda_graph=False, qo_indptr=None, kv_indptr=None,
                 kv_indices=None, kv_len_arr=None, backend="auto"):
        r"""Constructor of :class:`BatchMLAPagedAttentionWrapper`.

        Parameters
        ----------
        float_workspace_buffer : torch.Tensor
            The workspace for the split partial outputs, on the device the decode runs on
            (:meth:`plan` raises ValueError naming the bytes it needs when it is too small).
        use_cuda_graph : bool
            Whether the wrapper is used with CUDA graphs: capacities are fixed by the first plan
            (or by ``qo_indptr``'s length here) and later plans of device tensors do not synchronize.
        qo_indptr, kv_indptr, kv_indices, kv_len_arr : Optional[torch.Tensor]
            FlashInfer's CUDA-graph buffers; only ``qo_indptr``'s length (the batch capacity) is used.
        backend : str
            ``"auto"``, ``"native"``, ``"aiter"`` or ``"portable"`` (see the class docstring).
        """
        if not isinstance(float_workspace_buffer, torch.Tensor):
            raise TypeError(f"float_workspace_buffer: expected a torch.Tensor, got {type(float_workspace_buffer).__name__}")
        if backend not in ("auto", "native", "aiter", "portable"):
            raise ValueError(f"backend: expected 'auto', 'native', 'aiter' or 'portable', got {backend!r}")
        self._workspace = float_workspace_buffer
        self._device = float_workspace_buffer.device
        self._use_cuda_graph = bool(use_cuda_graph)
        self._portable = backend == "portable"
        self._backend = "native" if self._portable else backend
        self._buffers = (qo_indptr, kv_indptr, kv_indices, kv_len_arr)
        self._capacity = None  # (max_batch, max_work, max_qo_len, max_partials) once fixed
        self._plan = None
        self._metadata = None
        self._planned = False
        if use_cuda_graph and qo_indptr is not None:
            self._graph_max_batch = qo_indptr.numel() - 1
        else:
            self._graph_max_batch = None

    def __repr__(self):
        state = "not planned"
        if self._planned:
            max_batch, max_work, max_qo, max_partials = self._capacity
            state = (f"planned: batch={self._qo_indptr.numel() - 1}, num_heads={self._num_heads}, "
                     f"page_size={self._page_size}, causal={self._causal}, dtype={self._dtype}, "
                     f"capacity=(max_batch={max_batch}, max_work={max_work}, max_qo_len={max_qo}, "
                     f"max_partials={max_partials})")
        workspace = self._workspace.numel() * self._workspace.element_size()
        backend = "portable" if self._portable else self._backend
        return (f"BatchMLAPagedAttentionWrapper(device={self._device}, backend={backend!r}, "
                f"use_cuda_graph={self._use_cuda_graph}, workspace_bytes={workspace}, {state})")

    # FlashInfer's signature, `use_profiler` accepted and ignored.
    def plan(self, qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv, head_dim_kpe, page_size,
             causal, sm_scale, q_data_type, kv_data_type, use_profiler=False):
        r"""Plan MLA decode for a batch of requests over a paged KV cache.

        Parameters
        ----------
        qo_indptr : torch.Tensor
            The indptr of the query tokens, shape ``[batch_size + 1]``, int32 or int64.
        kv_indptr : torch.Tensor
            The indptr of the pages of each request in ``kv_indices``, shape ``[batch_size + 1]``.
        kv_indices : torch.Tensor
            The page ids of all requests, shape ``[kv_indptr[-1]]``; kept for :meth:`run`.
        kv_len_arr : torch.Tensor
            The KV length (tokens) of each request, shape ``[batch_size]``.
        num_heads : int
            The number of query heads, 1 to 128.
        head_dim_ckv : int
            The head dimension of the compressed KV cache, must be 512.
        head_dim_kpe : int
            The head dimension of the rotary part of the cache, must be 64.
        page_size : int
            Tokens per page of the cache.
        causal : bool
            Whether query token ``t`` of a request with ``q`` query tokens and ``L`` KV tokens
            sees only positions ``< L - q + t + 1``.
        sm_scale : float
            The scale applied to ``q . k`` before the softmax.
        q_data_type : torch.dtype
            The query dtype, ``torch.bfloat16`` or ``torch.float16``.
        kv_data_type : torch.dtype
            The cache dtype, equal to ``q_data_type``.
        use_profiler : bool
            Accepted for FlashInfer compatibility and ignored.

        Note
        ----
        With host (CPU) index tensors the schedule is computed on the host, no round trip; with
        device tensors one kernel validates them and the call waits for its verdict once. With
        ``use_cuda_graph=True`` every plan after the first, given device tensors, runs on the device
        without a synchronization. Index tensors of mixed dtypes are converted to int32 once here.
        Raises ValueError (bad value or shape, naming the argument) or TypeError (not a tensor), and
        ValueError when ``float_workspace_buffer`` is too small for the planned capacity.
        """
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
        max_batch, max_work, max_qo, max_partials = self._capacity
        need = workspace_bytes(max_batch, max_work, max_qo, self._num_heads, max_partials)
        have = self._workspace.numel() * self._workspace.element_size()
        if have < need:
            raise ValueError(f"float_workspace_buffer: expected at least {need} bytes for {max_partials} partials x "
                             f"max_qo_len={max_qo} x heads={self._num_heads} fp32 rows, got {have} bytes")
        self._planned = True

    def _build_schedule(self, qo_indptr, kv_indptr, kv_len_arr, batch):
        from ._plan import MlaPlan

        on_device = qo_indptr.device.type != "cpu"
        if self._capacity is not None and self._use_cuda_graph:
            max_batch, max_work, max_qo_cap, _ = self._capacity
            if batch > max_batch:
                raise ValueError(f"qo_indptr: batch {batch} exceeds the CUDA-graph capacity {max_batch} fixed by "
                                 "the first plan()")
        else:
            max_batch = max(batch, self._graph_max_batch or 0, 1)
            max_qo_cap = None

        if self._plan is None or (not self._use_cuda_graph and self._plan.max_batch < max_batch):
            self._plan = MlaPlan(self._device, max_batch=max_batch)
        plan = self._plan
        if self._use_cuda_graph and self._capacity is not None and on_device:
            plan.build_device(qo_indptr, kv_indptr, kv_len_arr, self._page_size, self._num_heads)
            max_qo = max_qo_cap
        else:
            plan.build(qo_indptr, kv_indptr, kv_len_arr, self._page_size, self._num_heads)
            info = plan.info  # read once: each read builds the tuple, the first waits for the exchange's counts
            max_qo = max(info.max_qo_len, 1)
        max_batch, max_work = plan.max_batch, plan.max_work

        if self._use_cuda_graph:
            # Replays may bring any schedule of this capacity: room for max_work partials.
            if self._capacity is None:
                self._capacity = (max_batch, max_work, max_qo, max_work)
            elif max_qo > self._capacity[2]:
                raise ValueError(f"qo_indptr: a request with {max_qo} query tokens exceeds the CUDA-graph capacity "
                                 f"{self._capacity[2]} fixed by the first plan()")
        else:
            # One schedule: the workspace needs room for its partials only.
            self._capacity = (max_batch, max_work, max_qo, max(info.num_partials, 1))
        self._md = plan.metadata

    def run(self, q_nope, q_pe, ckv_cache, kpe_cache, out=None, lse=None, return_lse=False, profiler_buffer=None,
            kv_len=None, page_table=None):
        r"""Run MLA decode for the planned batch, reading the cache in place.

        Parameters
        ----------
        q_nope : torch.Tensor
            The query without RoPE, shape ``[qo_indptr[-1], num_heads, 512]``, the planned dtype.
        q_pe : torch.Tensor
            The RoPE part of the query, shape ``[qo_indptr[-1], num_heads, 64]``.
        ckv_cache : torch.Tensor
            The compressed KV cache, shape ``[num_pages, page_size, 512]``; any page and token strides.
        kpe_cache : torch.Tensor
            The rotary key cache, shape ``[num_pages, page_size, 64]``. ``ckv_cache`` and ``kpe_cache``
            may be the two halves of one ``[num_pages, page_size, 576]`` buffer or separate tensors;
            neither is copied.
        out : Optional[torch.Tensor]
            The output tensor, shape ``[qo_indptr[-1], num_heads, 512]``; allocated when ``None``.
        lse : Optional[torch.Tensor]
            The log-sum-exp (base 2) of the attention scores, shape ``[qo_indptr[-1], num_heads]``,
            float32; allocated when ``None`` and ``return_lse`` is true.
        return_lse : bool
            Whether to return the log-sum-exp too.
        profiler_buffer, kv_len, page_table
            Accepted for FlashInfer compatibility and ignored: the planned index tensors are used.

        Returns
        -------
        Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]
            ``out``, or ``(out, lse)`` when ``return_lse``. A request without KV gets zeros and an
            LSE of ``-inf``.

        Note
        ----
        Runs on the current stream without a synchronization; with ``out`` (and ``lse``) given it
        allocates nothing, so it can be captured in a CUDA graph. Under ``torch.compile`` it is the
        custom op ``mlacore::mla_decode``. Raises RuntimeError before :meth:`plan`.
        """
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
                self._portable, self._backend)
        if torch.compiler.is_compiling():
            _decode_op(*args)
        else:
            _decode_impl(*args)
        return (out, lse) if return_lse else out


__all__ = ["BatchMLAPagedAttentionWrapper"]
