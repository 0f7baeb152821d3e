"""Slot mapping and block-table flattening against the chains of torch ops an
engine would otherwise run.

slot_mapping: one kernel vs index_select -> divide -> index_select -> multiply
-> add (no bounds checks in the torch chain). page_indices_from_block_table:
one kernel vs searchsorted -> gather over the block table (the sync-free torch
equivalent; boolean-mask indexing would sync). Device time on a GPU (CUDA
events, medians; CPU wall time on the CPU) and host time per call.
"""

import torch

import mlacore

from ._report import Table
from ._timing import cpu_ms, device_ms, host_us_per_call


def _page_table(nnz, batch, page_size, device, gen):
    # Decode/prefill mix: every request holds enough pages for its tokens.
    per_request = max(nnz // batch, 1)
    pages = (per_request + 64) // page_size + 1
    kv_indptr = torch.arange(0, (batch + 1) * pages, pages, dtype=torch.int32)
    num_pages = batch * pages
    kv_indices = torch.randperm(num_pages, generator=gen).to(torch.int32)
    batch_indices = torch.randint(0, batch, (nnz,), generator=gen, dtype=torch.int32)
    positions = torch.randint(0, pages * page_size, (nnz,), generator=gen, dtype=torch.int32)
    to = lambda t: t.to(device)
    return to(batch_indices), to(positions), to(kv_indices), to(kv_indptr), num_pages


def _torch_slots(batch_indices, positions, kv_indices, kv_indptr, page_size):
    starts = kv_indptr.index_select(0, batch_indices)
    page = kv_indices.index_select(0, starts + torch.div(positions, page_size, rounding_mode="floor"))
    return page.to(torch.int64) * page_size + positions.remainder(page_size)


def _torch_flatten(block_table, cu, total):
    # Sync-free: the output length comes from the host, as engines do it.
    t = torch.arange(total, device=block_table.device, dtype=cu.dtype)
    row = torch.searchsorted(cu[1:], t, right=True)
    return block_table[row, t - cu[row]]


def _times(fn, ctx, calls):
    if ctx.gpu:
        dev = device_ms(fn, repeats=ctx.repeats or 50)
        host = host_us_per_call(fn, calls, drain=torch.cuda.synchronize)
    else:
        dev = cpu_ms(fn, repeats=ctx.repeats or 20)
        host = host_us_per_call(fn, calls, rounds=3)
    return dev, host


def run(ctx):
    dev = ctx.device
    gen = torch.Generator().manual_seed(0)
    page_size = 16
    calls = 2000 if ctx.gpu else 200
    time_col = "device_ms" if ctx.gpu else "cpu_ms"

    sizes = [32, 4096, 262144] if ctx.full else [32, 4096]
    slots = Table(f"slot_mapping on {dev}, page_size {page_size}, int32 indices",
                  ["nnz", f"mlacore_{time_col}", f"torch_{time_col}", "speedup", "mlacore_us/call",
                   "torch_us/call", "host speedup"])
    for nnz in sizes:
        batch = min(nnz, 256)
        bi, pos, idx, ptr, num_pages = _page_table(nnz, batch, page_size, dev, gen)
        ours = lambda: mlacore.slot_mapping(bi, pos, idx, ptr, page_size, num_pages)
        theirs = lambda: _torch_slots(bi, pos, idx, ptr, page_size)
        if not torch.equal(ours(), theirs()):
            raise RuntimeError(f"slots: mlacore and the torch chain disagree at nnz={nnz}")
        m_dev, m_host = _times(ours, ctx, calls)
        t_dev, t_host = _times(theirs, ctx, calls)
        slots.add(nnz, m_dev, t_dev, t_dev / m_dev, m_host, t_host, t_host / m_host)
    slots.notes.append("speedup = torch time / mlacore time (> 1: mlacore faster); mlacore also bounds-checks")
    slots.plot = ("nnz", [f"mlacore_{time_col}", f"torch_{time_col}"], True, True)

    shapes = [(64, 256), (256, 512), (1024, 1024)] if ctx.full else [(8, 64), (64, 128)]
    flat = Table(f"page_indices_from_block_table on {dev}, int32, half-full rows",
                 ["batch", "max_blocks", "entries", f"mlacore_{time_col}", f"torch_{time_col}", "speedup",
                  "mlacore_us/call", "torch_us/call", "host speedup"])
    for batch, max_blocks in shapes:
        table = torch.randint(0, 1 << 20, (batch, max_blocks), generator=gen, dtype=torch.int32).to(dev)
        counts = torch.randint(0, max_blocks + 1, (batch,), generator=gen)
        cu = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)]).to(torch.int32).to(dev)
        total = int(counts.sum())
        out = torch.empty(total, dtype=torch.int32, device=dev)
        ours = lambda: mlacore.page_indices_from_block_table(table, cu, out)
        theirs = lambda: _torch_flatten(table, cu, total)
        if not torch.equal(ours(), theirs()):
            raise RuntimeError(f"slots: block-table flattening disagrees at batch={batch}")
        m_dev, m_host = _times(ours, ctx, calls)
        t_dev, t_host = _times(theirs, ctx, calls)
        flat.add(batch, max_blocks, total, m_dev, t_dev, t_dev / m_dev, m_host, t_host, t_host / m_host)
    flat.notes.append("torch: searchsorted + gather (sync-free); speedup = torch / mlacore")
    return [slots, flat]
