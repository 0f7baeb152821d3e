"""Decode time vs KV pool size: mlacore reads only the pages it is given, so
its time should not grow with the pool; the torch.cat path copies the whole
pool every call. b=8, kv=1024, heads=16, page size 1 (vLLM/SGLang).
"""

import torch

from ._mla import DecodeCase, timer
from ._report import Table

FULL_GB = [0.01, 0.28, 1.12, 4.5]
SMALL_GB = [0.01, 0.04]  # at least the b x kv pages the batch reads (9.4 MB)


def run(ctx):
    dtype = torch.bfloat16
    batch, kv, heads, page_size = 8, 1024, 16, 1
    measure = timer(ctx, ctx.repeats or 30)
    t = Table(f"decode vs pool size on {ctx.device} (b={batch}, kv={kv}, heads={heads}, page {page_size}, "
              f"{'separate' if ctx.separate else 'adjacent'} ckv/kpe)",
              ["pool GB", "pages", "mlacore ms", "cat path ms", "cat / mlacore"], plot=("pool GB", ["mlacore ms", "cat path ms"], True, True))
    times = []
    for gb in FULL_GB if ctx.full else SMALL_GB:
        # The pool holds at least the pages the batch reads: the row says the size it really has.
        num_pages = max(int(gb * 1e9 / (576 * 2 * page_size)), batch * kv)
        case = DecodeCase(ctx, batch, kv, heads, page_size, num_pages, dtype)
        ms = measure(case.run)
        cat_ms = measure(case.cat_path)
        times.append(ms)
        t.add(num_pages * page_size * 576 * 2 / 1e9, num_pages, ms, cat_ms, cat_ms / ms)
        del case
        if ctx.gpu:
            torch.cuda.empty_cache()
    t.notes.append(f"mlacore largest / smallest pool: {times[-1] / times[0]:.3f}x (goal: ~1.0)")
    return [t]
