"""MLA decode time against the bare-read floor of its KV bytes.

Bars (issue 5): heads=16 decode at <= 1.10x the floor at (batch, kv_len) in
(8, 32768), (32, 8192), (32, 32768), page sizes 1 and 64 (memory-bound);
heads=128 at >= 0.85x FlashInfer fa3's throughput in the same run ("x fa3"),
or >= 55% of 790 TFLOP/s where FlashInfer is absent (compute-bound). Alongside: the torch.cat
path (cat ckv/kpe into one buffer, then decode), a naive torch decode, and
FlashInfer's fa3 MLA when `import flashinfer` works.
"""


import torch

from ._mla import DecodeCase, flashinfer_runner, floor_ms, flops, kv_bytes, naive_decode, timer
from ._report import Table

FULL = [(b, kv, h) for h in (16, 128) for b, kv in ((8, 32768), (32, 8192), (32, 32768))]
SMALL = [(2, 512, 16), (2, 256, 128)]


def run(ctx):
    dtype = torch.bfloat16
    measure = timer(ctx, ctx.repeats or 30)
    shapes = FULL if ctx.full else SMALL
    t = Table(f"MLA decode on {ctx.device} ({'separate' if ctx.separate else 'adjacent'} ckv/kpe, qo_len 1, bf16)",
              ["batch", "kv_len", "heads", "page", "mlacore ms", "floor ms", "x floor", "TFLOP/s", "GB/s",
               "cat path ms", "naive ms", "fa3 ms", "fa3 x floor", "x fa3"],
              plot=("bars", ["batch", "kv_len", "heads", "page"], ["x floor", "fa3 x floor"]))
    notes = set()
    for batch, kv, heads in shapes:
        for page_size in (1, 64):
            num_pages = batch * -(-kv // page_size) + 8
            case = DecodeCase(ctx, batch, kv, heads, page_size, num_pages, dtype)
            ckv, kpe, idx, q_nope, q_pe = case.ckv, case.kpe, case.idx, case.q_nope, case.q_pe
            ms = measure(case.run)
            floor = floor_ms(ctx, kv_bytes(batch, kv), dtype, measure)
            cat_ms = measure(case.cat_path)
            naive_ms = float("nan")
            if kv_bytes(batch, kv) * 2 < (8 << 30 if ctx.gpu else 1 << 28):
                naive_ms = measure(lambda: naive_decode(q_nope, q_pe, ckv, kpe, idx, page_size))
            fi, why = flashinfer_runner(ctx, idx, heads, page_size, dtype, q_nope, q_pe, ckv, kpe)
            fi_ms = measure(fi) if fi else float("nan")
            if why:
                notes.add(f"fa3 not measured: {why}")
            t.add(batch, kv, heads, page_size, ms, floor, ms / floor, flops(batch, kv, heads, 1) / ms / 1e9,
                  kv_bytes(batch, kv) / ms / 1e6, cat_ms, naive_ms, fi_ms, fi_ms / floor, fi_ms / ms)
            del case, ckv, kpe
            if ctx.gpu:
                torch.cuda.empty_cache()
    t.notes.append("floor: torch sum over a contiguous tensor of the same KV byte count (one read, L2 flushed)")
    t.notes.append("TFLOP/s counts 2*heads*kv*(576+512) per request; GB/s counts KV bytes only")
    t.notes.append("x fa3 = fa3 time / mlacore time: mlacore's throughput relative to FlashInfer's fa3 (1.0 = as fast)")
    t.notes.append("bars: heads=16 x floor <= 1.10; heads=128 x fa3 >= 0.85 (without FlashInfer: >= 434 TFLOP/s, 55% of 790)")
    t.notes.extend(sorted(notes))
    return [t]
