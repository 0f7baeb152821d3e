"""MLA decode over a paged KV cache: a drop-in for FlashInfer's
`BatchMLAPagedAttentionWrapper`, running mlacore's native kernels.

plan() builds the split-KV schedule (through `mlacore.MlaPlan`: one
device-to-host round trip, none for host inputs, or a device-only build for
CUDA-graph replans); run() reads ckv and kpe in place through their own
strides, so the two halves of a [P, S, 576] buffer and two separate caches
both run without a copy.

CUDA graphs follow FlashInfer's contract: with `use_cuda_graph=True` the
wrapper owns four index buffers (the constructor's, or its own sized by the
first plan()), every plan() copies its inputs into them on the current
stream, and run() launches with those buffers only, so a graph captured once
replays correctly after later plans that bring newly allocated tensors.

The workspace policy: the float workspace holds `workspace_rows` fp32 rows
(512 values + LSE); the plan caps the schedule's partial outputs to what it
holds (fewer splits, never an error), so any buffer size runs, and
`workspace_bytes()` says how large a buffer never caps a schedule.
"""

import math

import torch

from . import _mlacore

_HEAD_DIM_CKV = 512
_HEAD_DIM_KPE = 64
_LN2 = math.log(2.0)

# FlashInfer's backend names map to mlacore's: its "fa2"/"fa3" kernels are
# what mlacore's native kernel replaces.
_BACKENDS = {"auto": "auto", "native": "native", "aiter": "aiter", "portable": "native", "fa2": "native",
             "fa3": "native"}
_LSE_MODES = (None, "none", "base2", "basee")


def _capacity_bytes(max_batch, max_work, max_qo_len, num_heads, max_partials=None):
    """Bytes of float workspace a decode with these capacities needs: fp32 partial rows + LSE for
    `max_partials` partials (default: max_work, enough for any schedule of that capacity)."""
    return _mlacore.mla_decode_workspace_bytes(max_batch, max_work, max_qo_len,
                                               max_work if max_partials is None else max_partials, num_heads)


def workspace_bytes(num_heads, max_batch, max_qo_len=1, *, num_sms=None, device=None):
    """Bytes of float workspace with which no schedule of up to `max_batch` requests of up to
    `max_qo_len` query tokens at `num_heads` heads is ever capped (every split the balance wants).

    Any smaller buffer also works: plan() then caps the splits to the partial outputs it holds
    (mlacore_mla_decode_workspace_partials in the C ABI), at some cost in balance for long, small
    batches. `num_sms` defaults to the SM count of `device` (the current CUDA device, else the
    CPU count)."""
    from ._plan import _sm_count, default_max_work

    if int(num_heads) < 1 or int(max_batch) < 1 or int(max_qo_len) < 1:
        raise ValueError(f"num_heads, max_batch, max_qo_len: expected >= 1, got {num_heads}, {max_batch}, "
                         f"{max_qo_len}")
    if num_sms is None:
        dev = torch.device(device) if device is not None else (
            torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
        num_sms = _sm_count(dev)
    max_work = default_max_work(int(max_batch), int(num_sms))
    return _capacity_bytes(int(max_batch), max_work, int(max_qo_len), int(num_heads))


# --- the core call, eager and as a torch custom op -------------------------

def _decode_impl(q_nope, q_pe, ckv, kpe, kv_indices, kv_indptr, qo_indptr, kv_len, schedule, workspace, out, lse,
                 max_batch, max_work, max_qo_len, max_partials, page_size, sm_scale, causal, portable, backend="auto"):
    _mlacore.mla_decode(q_nope, q_pe, ckv, kpe, kv_indices, kv_indptr, qo_indptr, kv_len, schedule, workspace, out,
                        lse, max_batch, max_work, max_qo_len, max_partials, page_size, sm_scale, causal, portable,
                        backend)


@torch.library.custom_op("mlacore::mla_decode", mutates_args=("out", "lse"))
def _decode_op(q_nope: torch.Tensor, q_pe: torch.Tensor, ckv: torch.Tensor, kpe: torch.Tensor,
               kv_indices: torch.Tensor, kv_indptr: torch.Tensor, qo_indptr: torch.Tensor, kv_len: torch.Tensor,
               schedule: torch.Tensor, workspace: torch.Tensor, out: torch.Tensor, lse: torch.Tensor | None,
               max_batch: int, max_work: int, max_qo_len: int, max_partials: int, page_size: int, sm_scale: float,
               causal: bool, portable: bool, backend: str) -> None:
    _decode_impl(q_nope, q_pe, ckv, kpe, kv_indices, kv_indptr, qo_indptr, kv_len, schedule, workspace, out, lse,
                 max_batch, max_work, max_qo_len, max_partials, page_size, sm_scale, causal, portable, backend)


@_decode_op.register_fake
def _(q_nope, q_pe, ckv, kpe, kv_indices, kv_indptr, qo_indptr, kv_len, schedule, workspace, out, lse, max_batch,
      max_work, max_qo_len, max_partials, page_size, sm_scale, causal, portable, backend):
    return None


def _check_index(name, t, device=None):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 1 or t.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name}: expected a 1-D int32 or int64 tensor, got {t.dtype} of shape {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected a buffer on {device} (the workspace's device), got {t.device}")


class BatchMLAPagedAttentionWrapper:
    """FlashInfer-compatible MLA decode wrapper over a paged KV cache.

    `float_workspace_buffer` (any dtype; engines give 128 MiB) holds the fp32
    partial outputs of split requests. The plan never needs more than it
    holds: it caps the splits to the partials that fit (see
    `mlacore.workspace_bytes`). Index inputs follow FlashInfer: the batch is
    `qo_indptr.numel() - 1`, kv_indptr and kv_len_arr may be longer than
    batch+1 and batch (the extra entries are ignored), int32 or int64.

    With `use_cuda_graph=True` the wrapper keeps four index buffers: the ones
    given here (`qo_indptr` [max_batch+1], `kv_indptr` [max_batch+1],
    `kv_indices` [capacity], `kv_len_arr` [max_batch], one integer dtype, on
    the workspace's device), or, for those not given, its own sized by the
    first plan(). Every plan() copies its inputs into them on the current
    stream (no host sync), and run() launches only with them, so a graph
    captured once stays valid for later plans with new tensors. The first
    plan() fixes the capacities (batch, kv_indices length, largest qo_len);
    a later plan beyond them raises ValueError. With device inputs a replan
    builds the schedule by a kernel, without a sync; its qo_len is then not
    checked against the capacity on the host (a longer request loses the
    rows of its split partials past the capacity: keep MTP lengths fixed, as
    graph-capturing engines do).

    backend: "native" (the tensor-core kernel on CUDA, the portable kernel on
    HIP, the reference loop on the CPU), "fa2" and "fa3" (FlashInfer's names:
    the native kernel), "aiter" (AITER's MLA decode kernel on a ROCm device;
    ValueError naming the gate a call fails, RuntimeError when AITER is
    unavailable; see docs/AITER.md), "auto" (AITER where its gates pass and it
    is loaded, else native), or "portable" (force the portable SIMT kernel on
    a GPU; for tests). "cutlass" raises ValueError: mlacore has no CUTLASS path.
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
        if backend == "cutlass":
            raise ValueError("backend: mlacore has no CUTLASS path ('cutlass' is FlashInfer's SM100 kernel); pass "
                             "backend='auto', 'fa2' or 'fa3' (all run mlacore's native kernel on NVIDIA) and use "
                             "plan()/run() as with FlashInfer's fa2/fa3 backends")
        if backend not in _BACKENDS:
            raise ValueError(f"backend: expected one of {', '.join(repr(b) for b in _BACKENDS)}, got {backend!r}")
        if not float_workspace_buffer.is_contiguous():
            raise ValueError("float_workspace_buffer: expected a contiguous tensor")
        # FlashInfer's attribute names: engines read them.
        self._float_workspace_buffer = float_workspace_buffer
        self.device = float_workspace_buffer.device
        self._use_cuda_graph = bool(use_cuda_graph)
        self._portable = backend == "portable"
        self._backend = _BACKENDS[backend]
        given = (qo_indptr, kv_indptr, kv_indices, kv_len_arr)
        if self._use_cuda_graph:
            names = ("qo_indptr", "kv_indptr", "kv_indices", "kv_len_arr")
            for name, t in zip(names, given):
                if t is not None:
                    _check_index(name, t, self.device)
            dtypes = {t.dtype for t in given if t is not None}
            if len(dtypes) > 1:
                raise ValueError(f"qo_indptr, kv_indptr, kv_indices, kv_len_arr: the CUDA-graph buffers must share "
                                 f"one dtype, got {sorted(str(d) for d in dtypes)}")
            if qo_indptr is not None:
                if qo_indptr.numel() < 1:
                    raise ValueError("qo_indptr: expected a buffer of max_batch+1 >= 1 entries, got 0")
                mb = qo_indptr.numel() - 1
                if kv_indptr is not None and kv_indptr.numel() < mb + 1:
                    raise ValueError(f"kv_indptr: expected a buffer of at least max_batch+1={mb + 1} entries (the "
                                     f"qo_indptr buffer's length), got {kv_indptr.numel()}")
                if kv_len_arr is not None and kv_len_arr.numel() < mb:
                    raise ValueError(f"kv_len_arr: expected a buffer of at least max_batch={mb} entries, got "
                                     f"{kv_len_arr.numel()}")
        self._qo_indptr_buf, self._kv_indptr_buf, self._kv_indices_buf, self._kv_len_arr_buf = (
            given if self._use_cuda_graph else (None,) * 4)
        self._run_index = None  # the four tensors run() launches with
        self._capacity = None  # (max_batch, max_work, max_qo_len, max_partials) once planned
        self._graph_max_qo = None
        self._plan = None
        self._md = None
        self._planned = False
        self._total_qo = None  # qo_indptr[-1] of an eager plan: run() checks q's rows against it

    def __repr__(self):
        state = "not planned"
        if self._planned:
            max_batch, max_work, max_qo, max_partials = self._capacity
            state = (f"planned: batch={self._batch}, num_heads={self._num_heads}, "
                     f"page_size={self._page_size}, causal={self._causal}, dtype={self._dtype}, "
                     f"capacity=(max_batch={max_batch}, max_work={max_work}, max_qo_len={max_qo}, "
                     f"max_partials={max_partials})")
        workspace = self._workspace_nbytes()
        backend = "portable" if self._portable else self._backend
        return (f"BatchMLAPagedAttentionWrapper(device={self.device}, backend={backend!r}, "
                f"use_cuda_graph={self._use_cuda_graph}, workspace_bytes={workspace}, {state})")

    # --- plan ---------------------------------------------------------------

    def plan(self, qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv, head_dim_kpe, page_size,
             causal, sm_scale, q_data_type, kv_data_type, use_profiler=False, lse_mode=None):
        r"""Plan MLA decode for a batch of requests over a paged KV cache.

        Parameters
        ----------
        qo_indptr : torch.Tensor
            The indptr of the query tokens, shape ``[batch_size + 1]``, int32 or int64; it defines
            the batch.
        kv_indptr : torch.Tensor
            The indptr of the pages of each request in ``kv_indices``, at least ``batch_size + 1``
            entries (extra entries are ignored, as in FlashInfer).
        kv_indices : torch.Tensor
            The page ids of all requests, at least ``kv_indptr[batch_size]`` entries.
        kv_len_arr : torch.Tensor
            The KV length (tokens) of each request, at least ``batch_size`` entries.
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
        lse_mode : Optional[str]
            As in FlashInfer releases that have it: ``"none"`` or ``"base2"`` (log2, the default) or
            ``"basee"`` (natural log) for the LSE :meth:`run` returns.

        Note
        ----
        With host (CPU) index tensors the schedule is computed on the host, no round trip; with
        device tensors one kernel validates them and the call waits for its verdict once. With
        ``use_cuda_graph=True`` the index tensors are copied into the wrapper's stable buffers (the
        constructor's, or its own sized by the first plan) on the current stream, and every plan
        after the first, given device tensors, builds the schedule on the device without a
        synchronization; :meth:`run` reads only those buffers, so a graph captured once stays valid.
        The schedule's split partials are capped to what ``float_workspace_buffer`` holds
        (:func:`mlacore.workspace_bytes` sizes it for no cap). Index tensors of mixed dtypes are
        converted to int32 once here. Raises ValueError (bad value or shape, or a batch past the
        CUDA-graph capacity, naming the argument) or TypeError (not a tensor).
        """
        if head_dim_ckv != _HEAD_DIM_CKV or head_dim_kpe != _HEAD_DIM_KPE:
            raise ValueError(f"head dims: expected head_dim_ckv={_HEAD_DIM_CKV} and head_dim_kpe={_HEAD_DIM_KPE}, "
                             f"got {head_dim_ckv} and {head_dim_kpe}")
        if not 1 <= int(num_heads) <= 128:
            raise ValueError(f"num_heads: expected 1 to 128, got {num_heads}")
        if int(page_size) < 1:
            raise ValueError(f"page_size: expected >= 1, got {page_size}")
        if lse_mode not in _LSE_MODES:
            raise ValueError(f"lse_mode: expected 'none', 'base2' or 'basee', got {lse_mode!r}")
        for name, dt in (("q_data_type", q_data_type), ("kv_data_type", kv_data_type)):
            if dt not in (torch.bfloat16, torch.float16):
                raise ValueError(f"{name}: expected torch.bfloat16 or torch.float16, got {dt}")
        if q_data_type != kv_data_type:
            raise ValueError(f"q_data_type and kv_data_type must match, got {q_data_type} and {kv_data_type}")
        for name, t in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr), ("kv_indices", kv_indices),
                        ("kv_len_arr", kv_len_arr)):
            _check_index(name, t)
        # FlashInfer takes the batch from qo_indptr and reads the first batch+1
        # (batch) entries of kv_indptr (kv_len_arr).
        batch = qo_indptr.numel() - 1
        if batch < 0:
            raise ValueError("qo_indptr: expected batch+1 >= 1 entries, got 0")
        if kv_indptr.numel() < batch + 1:
            raise ValueError(f"kv_indptr: expected at least batch+1={batch + 1} entries (batch from qo_indptr), got "
                             f"{kv_indptr.numel()}")
        if kv_len_arr.numel() < batch:
            raise ValueError(f"kv_len_arr: expected at least batch={batch} entries (batch from qo_indptr), got "
                             f"{kv_len_arr.numel()}")
        if self._planned and self._use_cuda_graph and int(num_heads) != self._num_heads:
            raise ValueError(f"num_heads: the CUDA-graph capacity was planned for {self._num_heads} heads, got "
                             f"{num_heads}")
        kv_indptr = kv_indptr[: batch + 1]
        kv_len_arr = kv_len_arr[:batch]

        self._num_heads = int(num_heads)
        self._page_size = int(page_size)
        self._causal = bool(causal)
        self._sm_scale = float(sm_scale)
        self._dtype = q_data_type
        self._lse_base_e = lse_mode == "basee"
        self._batch = batch
        if self._use_cuda_graph:
            self._plan_graph(qo_indptr, kv_indptr, kv_indices, kv_len_arr, batch)
        else:
            self._plan_eager(qo_indptr, kv_indptr, kv_indices, kv_len_arr, batch)
        max_batch, max_work, max_qo, max_partials = self._capacity
        need = _capacity_bytes(max_batch, max_work, max_qo, self._num_heads, max_partials)
        have = self._workspace_nbytes()
        if have < need:  # the budget keeps the schedule within it; this guards that promise
            raise ValueError(f"float_workspace_buffer: expected at least {need} bytes for {max_partials} partials x "
                             f"max_qo_len={max_qo} x heads={self._num_heads} fp32 rows, got {have} bytes")
        self._planned = True

    def _workspace_nbytes(self):
        return self._float_workspace_buffer.numel() * self._float_workspace_buffer.element_size()

    def _new_plan(self, max_batch):
        from ._plan import MlaPlan

        plan = MlaPlan(self.device, max_batch=max_batch)
        return plan

    def _build(self, plan, qo, kv, length, qo_floor, device_build):
        """Builds the schedule within the workspace's partial budget; returns the max_qo_len it saw
        (None for a device build, whose header is not read)."""
        # A workspace without room for one partial passes 0 rows: nothing splits.
        rows = max(_mlacore.mla_decode_workspace_rows(self._workspace_nbytes()), 0)
        plan.set_partial_budget(rows, qo_floor)
        if device_build:
            plan.build_device(qo, kv, length, self._page_size, self._num_heads)
            return None
        plan.build(qo, kv, length, self._page_size, self._num_heads)
        return plan.info

    def _plan_eager(self, qo_indptr, kv_indptr, kv_indices, kv_len_arr, batch):
        # The kernel reads one index width; a mix is normalized once, here.
        idx = (qo_indptr, kv_indptr, kv_indices, kv_len_arr)
        if len({t.dtype for t in idx}) > 1:
            idx = tuple(t.to(torch.int32) for t in idx)
        if self._plan is None or self._plan.max_batch < max(batch, 1):
            self._plan = self._new_plan(max(batch, 1))
        info = self._build(self._plan, idx[0], idx[1], idx[3], 0, False)
        self._run_index = tuple(t.to(self.device, non_blocking=True) if t.device != self.device else t for t in idx)
        max_qo = max(info.max_qo_len, 1)
        # One schedule: the workspace holds its partials (the budget kept them within it).
        self._capacity = (self._plan.max_batch, self._plan.max_work, max_qo, info.num_partials)
        self._total_qo = info.total_qo
        self._md = self._plan.schedule

    def _plan_graph(self, qo_indptr, kv_indptr, kv_indices, kv_len_arr, batch):
        first = self._capacity is None
        if first:
            self._allocate_graph_buffers(batch, kv_indices)
        max_batch = self._qo_indptr_buf.numel() - 1
        where = ("the buffer given to the constructor" if self._buffers_given[0] else "fixed by the first plan()")
        if batch > max_batch:
            raise ValueError(f"qo_indptr: batch {batch} exceeds the CUDA-graph capacity max_batch={max_batch} "
                             f"({where})")
        n = kv_indices.numel()
        if n > self._kv_indices_buf.numel():
            where = ("the buffer given to the constructor" if self._buffers_given[2] else "fixed by the first plan()")
            raise ValueError(f"kv_indices: {n} page indices exceed the CUDA-graph buffer of "
                             f"{self._kv_indices_buf.numel()} ({where})")
        # FlashInfer's contract: copy into the stable buffers on the current stream.
        self._qo_indptr_buf[: batch + 1].copy_(qo_indptr, non_blocking=True)
        self._kv_indptr_buf[: batch + 1].copy_(kv_indptr, non_blocking=True)
        self._kv_indices_buf[:n].copy_(kv_indices, non_blocking=True)
        self._kv_len_arr_buf[:batch].copy_(kv_len_arr, non_blocking=True)

        qo_b = self._qo_indptr_buf[: batch + 1]
        kv_b = self._kv_indptr_buf[: batch + 1]
        len_b = self._kv_len_arr_buf[:batch]
        if first:
            self._plan = self._new_plan(max(max_batch, 1))
            info = self._build(self._plan, qo_b, kv_b, len_b, 0, False)
            self._graph_max_qo = max(info.max_qo_len, 1)
        else:
            # Host inputs: a host schedule (no round trip, checked). Device inputs: the schedule by a
            # kernel from the buffers just written (no sync, capturable).
            on_device = qo_indptr.device.type != "cpu" and self.device.type != "cpu"
            if on_device:
                self._build(self._plan, qo_b, kv_b, len_b, self._graph_max_qo, True)
            else:
                info = self._build(self._plan, qo_indptr, kv_indptr, kv_len_arr, self._graph_max_qo, False)
                if info.max_qo_len > self._graph_max_qo:
                    raise ValueError(f"qo_indptr: a request with {info.max_qo_len} query tokens exceeds the "
                                     f"CUDA-graph capacity max_qo_len={self._graph_max_qo} fixed by the first plan()")
        plan = self._plan
        # Replays may bring any schedule within the budget: room for all the partials it allows.
        fit = _mlacore.mla_decode_workspace_partials(self._workspace_nbytes(), self._graph_max_qo, self._num_heads)
        self._capacity = (plan.max_batch, plan.max_work, self._graph_max_qo, min(plan.max_work, fit))
        self._md = plan.schedule
        if first:
            self._run_index = (self._qo_indptr_buf[: plan.max_batch + 1], self._kv_indptr_buf[: plan.max_batch + 1],
                               self._kv_indices_buf, self._kv_len_arr_buf[: plan.max_batch])

    def _allocate_graph_buffers(self, batch, kv_indices):
        """Keeps the constructor's buffers and allocates the missing ones for this first plan's sizes."""
        bufs = [self._qo_indptr_buf, self._kv_indptr_buf, self._kv_indices_buf, self._kv_len_arr_buf]
        self._buffers_given = tuple(b is not None for b in bufs)
        dtype = next((b.dtype for b in bufs if b is not None), torch.int32)
        max_batch = bufs[0].numel() - 1 if bufs[0] is not None else batch
        sizes = (max_batch + 1, max_batch + 1, max(kv_indices.numel(), 1), max_batch)
        for i, size in enumerate(sizes):
            if bufs[i] is None:
                bufs[i] = torch.zeros(size, dtype=dtype, device=self.device)
        # The kernel reads batch+1 entries past max_batch's: the indptr tails start as zeros.
        self._qo_indptr_buf, self._kv_indptr_buf, self._kv_indices_buf, self._kv_len_arr_buf = bufs

    # --- run ----------------------------------------------------------------

    def run(self, q_nope, q_pe, ckv_cache, kpe_cache, out=None, lse=None, return_lse=False, profiler_buffer=None,
            kv_len=None, page_table=None, return_lse_base_on_e=False):
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
            The log-sum-exp of the attention scores (base 2 unless ``return_lse_base_on_e`` or
            plan's ``lse_mode="basee"``), shape ``[qo_indptr[-1], num_heads]``, float32; allocated
            when ``None`` and ``return_lse`` is true; written when given, even without ``return_lse``.
        return_lse : bool
            Whether to return the log-sum-exp too.
        return_lse_base_on_e : bool
            Return the natural-log LSE (vLLM passes it).
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
        if q_nope.dim() == 3 and q_nope.shape[1] != self._num_heads:
            raise ValueError(f"q_nope: expected {self._num_heads} heads (plan's num_heads) in dim 1, got shape "
                             f"{tuple(q_nope.shape)}")
        if self._total_qo is not None and q_nope.dim() > 0 and q_nope.shape[0] != self._total_qo:
            # Rows past the plan would come back unwritten, rows short of it unread.
            raise ValueError(f"q_nope: expected {self._total_qo} rows (qo_indptr[-1] of the plan), got "
                             f"{q_nope.shape[0]}")
        if out is None:
            out = torch.empty(q_nope.shape, dtype=q_nope.dtype, device=q_nope.device)
        if return_lse and lse is None:
            lse = torch.empty(q_nope.shape[:2], dtype=torch.float32, device=q_nope.device)
        qo, kv, idx, length = self._run_index
        args = (q_nope, q_pe, ckv_cache, kpe_cache, idx, kv, qo, length, self._md, self._float_workspace_buffer,
                out, lse, *self._capacity, self._page_size, self._sm_scale, self._causal, self._portable,
                self._backend)
        if torch.compiler.is_compiling():
            _decode_op(*args)
        else:
            _decode_impl(*args)
        if lse is not None and (return_lse_base_on_e or self._lse_base_e):
            lse.mul_(_LN2)
        return (out, lse) if return_lse else out


__all__ = ["BatchMLAPagedAttentionWrapper", "workspace_bytes"]
