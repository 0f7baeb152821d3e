"""Host time per call of mlacore's entry points next to one torch.add_ call.

What an engine pays in Python per decode step, per layer, before any kernel
runs. Bars: the core no-op taking 9 tensors <= 1.5x torch.add_;
each append at nnz=32 <= 1.3x torch.add_. The other ops are
reported against the same baseline.
"""

import torch

import mlacore

from ._report import Table
from ._timing import host_us_per_call

BATCH, PAGE, HEADS = 4, 16, 16


def _ops(dev):
    """(name, tensors crossing the binding, fn) for every public per-step op at small shapes."""
    i32 = dict(dtype=torch.int32, device=dev)
    kv_len = torch.tensor([40, 17, 64, 5], **i32)
    pages = (kv_len + PAGE - 1) // PAGE
    kv_indptr = torch.cat([torch.zeros(1, **i32), torch.cumsum(pages, 0).to(torch.int32)])
    num_pages = int(pages.sum())
    kv_indices = torch.randperm(num_pages, device=dev).to(torch.int32)
    last = (kv_len - (pages - 1) * PAGE).to(torch.int32)
    append_indptr = torch.arange(BATCH + 1, **i32) * 8
    nnz = 32
    batch_indices, positions = mlacore.get_batch_indices_positions(append_indptr, kv_len, nnz)
    buf = torch.randn(num_pages, PAGE, 576, device=dev).to(torch.bfloat16)
    ckv, kpe = torch.split(buf, [512, 64], -1)
    src = torch.randn(nnz, 576, device=dev).to(torch.bfloat16)
    # Sliced once here: slicing inside the timed lambda would add torch's own
    # view creation (~2 us each) to the op's figure.
    src_ckv, src_kpe = src[:, :512], src[:, 512:]
    k_cache = torch.zeros(num_pages, PAGE, 8, 128, device=dev, dtype=torch.bfloat16)
    v_cache = torch.zeros_like(k_cache)
    key = torch.randn(nnz, 8, 128, device=dev).to(torch.bfloat16)
    block_table = torch.zeros(BATCH, 8, **i32)
    block_table[:, :4] = torch.arange(BATCH * 4, **i32).view(BATCH, 4)
    cu = torch.arange(BATCH + 1, **i32) * 4
    flat = torch.empty(BATCH * 4, **i32)

    qo_indptr = torch.arange(BATCH + 1, **i32)
    workspace = torch.empty(64 << 20, dtype=torch.uint8, device=dev)
    wrapper = mlacore.BatchMLAPagedAttentionWrapper(workspace)
    wrapper.plan(qo_indptr, kv_indptr, kv_indices, kv_len, HEADS, 512, 64, PAGE, False, 0.07, torch.bfloat16,
                 torch.bfloat16)
    q_nope = torch.randn(BATCH, HEADS, 512, device=dev).to(torch.bfloat16)
    q_pe = torch.randn(BATCH, HEADS, 64, device=dev).to(torch.bfloat16)
    out = torch.empty_like(q_nope)

    return [
        ("combined_kv_view", 2, lambda: mlacore.combined_kv_view(ckv, kpe)),
        ("slot_mapping (allocates out)", 4,
         lambda: mlacore.slot_mapping(batch_indices, positions, kv_indices, kv_indptr, PAGE)),
        ("page_indices_from_block_table", 3, lambda: mlacore.page_indices_from_block_table(block_table, cu, flat)),
        ("get_batch_indices_positions (allocates 2)", 2,
         lambda: mlacore.get_batch_indices_positions(append_indptr, kv_len, nnz)),
        ("append_paged_mla_kv_cache, nnz=32", 9,
         lambda: mlacore.append_paged_mla_kv_cache(src_ckv, src_kpe, batch_indices, positions, ckv, kpe,
                                                   kv_indices, kv_indptr, last)),
        ("append_paged_kv_cache, nnz=32", 9,
         lambda: mlacore.append_paged_kv_cache(key, key, batch_indices, positions, (k_cache, v_cache), kv_indices,
                                               kv_indptr, last)),
        ("BatchMLAPagedAttentionWrapper.run(out=)", 12, lambda: wrapper.run(q_nope, q_pe, ckv, kpe, out=out)),
    ]


def run(ctx):
    dev = ctx.device
    x = torch.ones(16, device=dev)
    y = torch.ones(16, device=dev)
    tensors = [torch.zeros(8, device=dev, dtype=torch.int32) for _ in range(9)]
    calls = ctx.repeats or 5000
    sync = torch.cuda.synchronize if ctx.gpu else (lambda: None)

    def measure(fn, n=calls):
        # Bursts with the queue drained between them (untimed): the host cost of
        # a call, not the device time of a kernel slower than its launch.
        return host_us_per_call(fn, n, drain=sync if ctx.gpu else None)

    add_us = measure(lambda: x.add_(y))
    noop = mlacore._mlacore.noop
    rows = [("torch.add_ (baseline)", 2, add_us), ("core no-op", 9, measure(lambda: noop(*tensors)))]
    for name, n, fn in _ops(dev):
        rows.append((name, n, measure(fn, max(calls // 5, 20))))
    add_again = measure(lambda: x.add_(y))

    t = Table(f"host time per call on {dev} (median of 7 rounds)", ["call", "tensors", "us/call", "x torch.add_"],
              plot=("bars", ["call"], ["x torch.add_"]))
    for name, n, us in rows:
        t.add(name, n, us, us / add_us)
    t.notes.append(f"torch.add_ measured again after the ops: {add_again:.2f} us (drift check)")
    if ctx.gpu:
        t.notes.append("calls timed in bursts of 64 with the GPU drained between bursts (untimed)")
    t.notes.append("bars: core no-op <= 1.5x torch.add_; each append <= 1.3x")
    return [t]
