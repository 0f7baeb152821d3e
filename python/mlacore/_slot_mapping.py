"""Slot mapping and page-index bookkeeping between FlashInfer, vLLM and block tables.

Every op is one kernel on the current stream (a loop for CPU tensors), with
no host sync and no allocation beyond its outputs, so it can be captured in a
CUDA graph. Index tensors may be int32 or int64 and strided 1-D views; every
index read is bounds-checked in the kernel.
"""

from typing import Optional, Tuple

import torch

from . import _mlacore


def _vector_length(t, name: str) -> int:
    # The output length comes from this argument, so check it before
    # allocating; the core validates every other argument.
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a tensor, got {type(t).__name__}")
    if t.dim() != 1:
        raise ValueError(f"{name}: expected 1-D int32 or int64, got {str(t.dtype).replace('torch.', '')} "
                         f"tensor of shape {tuple(t.shape)} on {t.device}")
    return t.shape[0]


def _empty_index(n: int, dtype, device, name: str) -> torch.Tensor:
    # An output of `n` elements, `n` coming from argument `name`: a size torch
    # cannot allocate is a ValueError naming it, not torch's RuntimeError.
    try:
        return torch.empty(n, dtype=dtype, device=device)
    except (RuntimeError, MemoryError) as e:
        raise ValueError(f"{name}: cannot allocate an output of {n} {str(dtype).replace('torch.', '')} elements "
                         f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None


def _check_int(value, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name}: expected >= {minimum}, got {value}")
    return value


# --- slot_mapping -----------------------------------------------------------

def _slot_mapping_impl(batch_indices, positions, kv_indices, kv_indptr, page_size, num_pages):
    nnz = _vector_length(batch_indices, "batch_indices")
    _check_int(page_size, "page_size", 1)
    if num_pages is not None:
        _check_int(num_pages, "num_pages", 0)
    out = _empty_index(nnz, torch.int64, batch_indices.device, "batch_indices")
    _mlacore.slot_mapping(batch_indices, positions, kv_indices, kv_indptr, page_size,
                          -1 if num_pages is None else num_pages, out)
    return out


@torch.library.custom_op("mlacore::slot_mapping", mutates_args=())
def _slot_mapping_op(batch_indices: torch.Tensor, positions: torch.Tensor, kv_indices: torch.Tensor,
                     kv_indptr: torch.Tensor, page_size: int, num_pages: Optional[int]) -> torch.Tensor:
    return _slot_mapping_impl(batch_indices, positions, kv_indices, kv_indptr, page_size, num_pages)


@_slot_mapping_op.register_fake
def _(batch_indices, positions, kv_indices, kv_indptr, page_size, num_pages):
    nnz = _vector_length(batch_indices, "batch_indices")
    return batch_indices.new_empty((nnz,), dtype=torch.int64)


def slot_mapping(batch_indices: torch.Tensor, positions: torch.Tensor, kv_indices: torch.Tensor,
                 kv_indptr: torch.Tensor, page_size: int, num_pages: Optional[int] = None) -> torch.Tensor:
    """vLLM slots (int64 [nnz]) of appended tokens given FlashInfer page tables.

    slot[t] = kv_indices[kv_indptr[b] + pos // page_size] * page_size + pos % page_size
    with b = batch_indices[t], pos = positions[t]. batch_indices and positions
    share a dtype, kv_indices and kv_indptr share a dtype; each pair may be
    int32 or int64. A token whose batch index, position or page id is out of
    range (page ids checked against [0, num_pages) when num_pages is given)
    gets -1, which vLLM's cache writers skip.
    """
    if torch.compiler.is_compiling():
        return _slot_mapping_op(batch_indices, positions, kv_indices, kv_indptr, page_size, num_pages)
    return _slot_mapping_impl(batch_indices, positions, kv_indices, kv_indptr, page_size, num_pages)


# --- page_indices_from_block_table -----------------------------------------

def _block_table_impl(block_table, cu_num_blocks, out):
    _mlacore.page_indices_from_block_table(block_table, cu_num_blocks, out)


@torch.library.custom_op("mlacore::page_indices_from_block_table", mutates_args=("out",))
def _block_table_op(block_table: torch.Tensor, cu_num_blocks: torch.Tensor, out: torch.Tensor) -> None:
    _block_table_impl(block_table, cu_num_blocks, out)


@_block_table_op.register_fake
def _(block_table, cu_num_blocks, out):
    return None


def page_indices_from_block_table(block_table: torch.Tensor, cu_num_blocks: torch.Tensor,
                                  out: torch.Tensor) -> torch.Tensor:
    """Flattens block_table[r, :n_r] into out[cu[r]:cu[r+1]] (n_r = cu[r+1] - cu[r]); returns out.

    block_table is [batch, max_blocks] int32 or int64 with any strides
    (transposed or sliced views are read as they are); out is 1-D of the same
    dtype; cu_num_blocks is [batch + 1] int32 or int64. Clamped, never an
    out-of-range write: a row copies at most max_blocks entries (the rest of
    its range in out keeps its old values), copying stops at the end of out,
    and a row with a negative or reversed range copies nothing.
    """
    if torch.compiler.is_compiling():
        _block_table_op(block_table, cu_num_blocks, out)
    else:
        _block_table_impl(block_table, cu_num_blocks, out)
    return out


# --- get_batch_indices_positions --------------------------------------------

def _batch_positions_impl(append_indptr, seq_lens, nnz):
    if isinstance(append_indptr, torch.Tensor):
        device = append_indptr.device
    else:
        raise TypeError(f"append_indptr: expected a tensor, got {type(append_indptr).__name__}")
    _check_int(nnz, "nnz", 0)
    batch_indices = _empty_index(nnz, torch.int32, device, "nnz")
    positions = _empty_index(nnz, torch.int32, device, "nnz")
    _mlacore.batch_indices_positions(append_indptr, seq_lens, batch_indices, positions)
    return batch_indices, positions


@torch.library.custom_op("mlacore::get_batch_indices_positions", mutates_args=())
def _batch_positions_op(append_indptr: torch.Tensor, seq_lens: torch.Tensor,
                        nnz: int) -> Tuple[torch.Tensor, torch.Tensor]:
    return _batch_positions_impl(append_indptr, seq_lens, nnz)


@_batch_positions_op.register_fake
def _(append_indptr, seq_lens, nnz):
    return (append_indptr.new_empty((nnz,), dtype=torch.int32),
            append_indptr.new_empty((nnz,), dtype=torch.int32))


@torch.library.custom_op("mlacore::get_batch_indices_positions_out", mutates_args=("batch_indices", "positions"))
def _batch_positions_out_op(append_indptr: torch.Tensor, seq_lens: torch.Tensor, batch_indices: torch.Tensor,
                            positions: torch.Tensor) -> None:
    _mlacore.batch_indices_positions(append_indptr, seq_lens, batch_indices, positions)


@_batch_positions_out_op.register_fake
def _(append_indptr, seq_lens, batch_indices, positions):
    return None


def _check_out(t, name, nnz, device):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor or None, got {type(t).__name__}")
    if t.dim() != 1 or t.dtype != torch.int32 or t.numel() < nnz:
        raise ValueError(f"{name}: expected a 1-D int32 tensor of at least nnz={nnz} entries, got {t.dtype} of "
                         f"shape {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name}: expected a tensor on {device} (append_indptr's device), got {t.device}")


def get_batch_indices_positions(append_indptr: torch.Tensor, seq_lens: torch.Tensor, nnz: int,
                                batch_indices: Optional[torch.Tensor] = None,
                                positions: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Request index and absolute position (int32 [nnz] each) of every appended token.

    FlashInfer semantics: seq_lens include the appended tokens, so token j of
    request b has position seq_lens[b] - (append_indptr[b+1] - append_indptr[b]) + j.
    nnz is the caller's (no sync to read append_indptr[-1]); tokens that no
    request covers get -1 in both outputs, and so does the position of a
    request whose seq_len is smaller than its appended count.
    `batch_indices` and `positions`, when given (FlashInfer's output buffers:
    1-D int32, at least nnz entries, on append_indptr's device), receive the
    results in their first nnz entries and are returned; no allocation then,
    so the call can be captured in a CUDA graph.
    """
    if batch_indices is None and positions is None:
        if torch.compiler.is_compiling():
            return _batch_positions_op(append_indptr, seq_lens, nnz)
        return _batch_positions_impl(append_indptr, seq_lens, nnz)
    if not isinstance(append_indptr, torch.Tensor):
        raise TypeError(f"append_indptr: expected a tensor, got {type(append_indptr).__name__}")
    _check_int(nnz, "nnz", 0)
    device = append_indptr.device
    if batch_indices is None:
        batch_indices = torch.empty(nnz, dtype=torch.int32, device=device)
    if positions is None:
        positions = torch.empty(nnz, dtype=torch.int32, device=device)
    _check_out(batch_indices, "batch_indices", nnz, device)
    _check_out(positions, "positions", nnz, device)
    op = _batch_positions_out_op if torch.compiler.is_compiling() else _mlacore.batch_indices_positions
    op(append_indptr, seq_lens, batch_indices[:nnz], positions[:nnz])
    return batch_indices, positions


def get_seq_lens(kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor, page_size: int) -> torch.Tensor:
    """FlashInfer's get_seq_lens: tokens per request of a paged cache,
    max(pages - 1, 0) * page_size + kv_last_page_len (a request without pages
    counts its kv_last_page_len alone). Same dtype and device as the inputs."""
    for name, t in (("kv_indptr", kv_indptr), ("kv_last_page_len", kv_last_page_len)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 1:
            raise ValueError(f"{name}: expected a 1-D tensor, got shape {tuple(t.shape)}")
    if kv_indptr.numel() != kv_last_page_len.numel() + 1:
        raise ValueError(f"kv_indptr: expected batch+1={kv_last_page_len.numel() + 1} entries (kv_last_page_len has "
                         f"batch={kv_last_page_len.numel()}), got {kv_indptr.numel()}")
    _check_int(page_size, "page_size", 1)
    pages = kv_indptr[1:] - kv_indptr[:-1]
    return torch.clamp(pages - 1, min=0) * page_size + kv_last_page_len
