"""What the torch.cat path would pay: concatenating ckv and kpe into one
[P, S, 576] buffer, by pool size (the copy alone, no attention)."""

import torch

from ._mla import make_cache, timer
from ._report import Table

FULL_GB = [0.01, 0.28, 1.12, 4.5]
SMALL_GB = [0.002, 0.01, 0.04]


def run(ctx):
    dtype = torch.bfloat16
    measure = timer(ctx, ctx.repeats or 20)
    t = Table(f"torch.cat([ckv, kpe], -1) on {ctx.device} ({'separate' if ctx.separate else 'adjacent'} ckv/kpe)",
              ["pool GB", "pages", "cat ms", "GB/s (read+write)"], plot=("pool GB", ["cat ms"], True, True))
    for gb in FULL_GB if ctx.full else SMALL_GB:
        num_pages = max(int(gb * 1e9 / (576 * 2)), 1)
        ckv, kpe = make_cache(num_pages, 1, dtype, ctx.device, ctx.separate)
        ms = measure(lambda: torch.cat([ckv, kpe], dim=-1))
        t.add(gb, num_pages, ms, 2 * num_pages * 576 * 2 / ms / 1e6)
        ckv = kpe = None  # this pool goes before the next size allocates its own
        if ctx.gpu:
            torch.cuda.empty_cache()
    return [t]
