"""The plan for MLA decode: `MlaPlan` builds the schedule the decode kernels read."""

import os
from typing import NamedTuple, Optional

import torch

from . import _mlacore

# The schedule layout's constants, exported by the binding from the core
# (core/src/plan/schedule.h): the header slots in order and the tile sizes.
HEADER_FIELDS = _mlacore.SCHEDULE_HEADER_FIELDS
DECODE_TILE_TOKENS = _mlacore.DECODE_TILE_TOKENS
DECODE_TILE_ROWS = _mlacore.DECODE_TILE_ROWS

# Header error bits (device-only builds; host builds raise ValueError instead).
PLAN_ERROR_INDPTR_START = _mlacore.PLAN_ERROR_INDPTR_START
PLAN_ERROR_INDPTR = _mlacore.PLAN_ERROR_INDPTR
PLAN_ERROR_KV_LEN = _mlacore.PLAN_ERROR_KV_LEN


class PlanInfo(NamedTuple):
    """Summary of a built schedule (its header)."""

    batch: int
    num_work: int  # work items in use; the other max_work - num_work are padding (request -1)
    num_partials: int  # fp32 partial outputs the combine merges
    max_qo_len: int
    max_kv_len: int
    chunk_tokens: int  # KV tokens per split, a multiple of 64
    total_qo: int  # qo_indptr[batch]
    error: int  # PLAN_ERROR_* bits, 0 unless build_device met invalid inputs


def plan_schedule_size(max_batch: int, max_work: int) -> int:
    """int32 elements of the schedule tensor for a capacity of max_batch requests and max_work items."""
    return _mlacore.plan_schedule_size(max_batch, max_work)


def default_max_work(max_batch: int, num_sms: int) -> int:
    """Work items that suffice for any batch of up to max_batch requests on num_sms SMs/CUs."""
    return _mlacore.plan_default_max_work(max_batch, num_sms)


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return os.cpu_count() or 1


class MlaPlan:
    """The decode schedule for one device and a fixed capacity.

    `MlaPlan(device, max_batch, max_work=None, num_sms=None)` allocates
    `.schedule`, an int32 tensor on `device` laid out as in
    core/src/plan/schedule.h (header, kv_last_page_len, split_indptr, work
    items), once. Each build rewrites it in place, so its address is stable
    (CUDA graphs can capture kernels that read it).

    - `build(qo_indptr, kv_indptr, kv_len_arr, page_size, num_heads)`: a
      schedule checked on the host. CPU inputs: the host computes it, no round
      trip. GPU inputs cost one kernel launch: it validates them and hands
      its verdict (errors, maxima) to the host through a mapped pinned buffer
      owned by the plan, then picks the split chunk, sends its counts the same
      way, and writes the schedule into `.schedule` (no memcpy, no stream
      sync). The call blocks until the current stream reaches that kernel and
      its verdict arrives; the chunk's choice and the placement run on after
      it, ahead of any kernel queued later. The first `.info` after such a
      build waits for the counts (a microsecond or two more).
      Invalid inputs raise ValueError naming the argument and the request, and
      leave `.schedule` unchanged. Not allowed during CUDA-graph capture.
    - `build_device(...)`: the same schedule, bit for bit, computed by one kernel
      on the current stream: no synchronization, capturable in a CUDA graph.
      Values are not checked on the host: an invalid request gets no work, and
      `info.error` (read from the device) carries PLAN_ERROR_* bits.

    Inputs are 1-D int32 or int64 tensors: qo_indptr [B+1] (query tokens),
    kv_indptr [B+1] (pages), kv_len_arr [B] (tokens), B <= max_batch, all on one
    device. num_sms (default: the device's SM/CU count, os.cpu_count() on the
    CPU) shapes the split; max_work defaults to a count no batch can exceed.
    The decode grid is (max_work, ceil(max_qo_len * num_heads / 64)).
    """

    def __init__(self, device, max_batch: int, max_work: Optional[int] = None, num_sms: Optional[int] = None):
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.num_sms = int(num_sms) if num_sms is not None else _sm_count(self.device)
        if max_work is None:
            max_work = default_max_work(max_batch, self.num_sms)
        self._plan = _mlacore.Plan(max_batch, max_work, self.num_sms)
        self.max_batch, self.max_work, _ = self._plan.capacity()
        self._offsets = _mlacore.plan_layout(self.max_batch, self.max_work)
        self.schedule = torch.zeros(plan_schedule_size(self.max_batch, self.max_work), dtype=torch.int32,
                                    device=self.device)

    def build(self, qo_indptr, kv_indptr, kv_len_arr, page_size: int, num_heads: int) -> torch.Tensor:
        """Plans a batch on the host; returns `.schedule`."""
        self._plan.build(qo_indptr, kv_indptr, kv_len_arr, page_size, num_heads, self.schedule)
        return self.schedule

    def build_device(self, qo_indptr, kv_indptr, kv_len_arr, page_size: int, num_heads: int) -> torch.Tensor:
        """Plans a batch with a kernel on the current stream (no sync, CUDA-graph safe); returns `.schedule`."""
        self._plan.build_device(qo_indptr, kv_indptr, kv_len_arr, page_size, num_heads, self.schedule)
        return self.schedule

    def set_partial_budget(self, partial_rows: Optional[int], partial_qo_len: int = 0) -> None:
        """Caps later builds' partial outputs to a workspace of `partial_rows` fp32 rows (512 values +
        LSE; `_mlacore.mla_decode_workspace_rows(bytes)`), each partial taking max(partial_qo_len,
        the batch's max_qo_len) * num_heads rows: fewer splits, or none when fewer than two fit
        (0 rows: nothing splits). None removes the budget (the default). Host and device builds stay
        bit-identical."""
        if partial_rows is not None and int(partial_rows) < 0:
            raise ValueError(f"partial_rows: expected >= 0, or None for no budget, got {partial_rows}")
        rows = _mlacore.PLAN_NO_PARTIAL_BUDGET if partial_rows is None else int(partial_rows)
        self._plan.set_partial_budget(rows, int(partial_qo_len))

    @property
    def info(self) -> PlanInfo:
        """The last build's summary. After build_device it is read from the device header (a sync)."""
        i = self._plan.info()
        if not i["on_host"]:
            header = self.schedule[: len(HEADER_FIELDS)].tolist()
            i = dict(zip(HEADER_FIELDS, header))
        return PlanInfo(**{k: i[k] for k in PlanInfo._fields})

    @property
    def stats(self) -> dict:
        """Counters of what the builds did: pinned allocations, D2H/H2D transfers, syncs, staging address."""
        return self._plan.stats()

    @property
    def kv_last_page_len(self) -> torch.Tensor:
        """View of kv_last_page_len [max_batch]; entries past the batch are 0."""
        start = self._offsets[1]
        return self.schedule[start : start + self.max_batch]

    @property
    def split_indptr(self) -> torch.Tensor:
        """View of split_indptr [max_batch + 1]: request b's partials are [split_indptr[b], split_indptr[b+1])."""
        start = self._offsets[2]
        return self.schedule[start : start + self.max_batch + 1]

    @property
    def work_items(self) -> torch.Tensor:
        """View of the work items [max_work, 4]: (request, kv_begin, kv_end, partial); request -1 is padding."""
        start = self._offsets[3]
        return self.schedule[start : start + 4 * self.max_work].view(self.max_work, 4)

    def __repr__(self):
        return (f"MlaPlan(device={self.device}, max_batch={self.max_batch}, max_work={self.max_work}, "
                f"num_sms={self.num_sms})")
