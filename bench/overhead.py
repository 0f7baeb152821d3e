"""Host time per call of mlacore's entry points next to one torch.add_ call.

The bar (issue 2): a no-op core entry point taking 9 tensors costs at most
1.5x one torch.add_ on the same device, measured in the same run.
"""

import torch

import mlacore

from ._report import Table
from ._timing import host_us_per_call


def run(ctx):
    dev = ctx.device
    x = torch.ones(16, device=dev)
    y = torch.ones(16, device=dev)
    tensors = [torch.zeros(8, device=dev, dtype=torch.int32) for _ in range(9)]
    calls = ctx.repeats or 5000

    add_us = host_us_per_call(lambda: x.add_(y), calls)
    rows = [("torch.add_ (baseline)", 2, add_us)]
    noop = mlacore._mlacore.noop
    rows.append(("mlacore core no-op, 9 tensors", 9, host_us_per_call(lambda: noop(*tensors), calls)))
    if ctx.gpu:
        torch.cuda.synchronize()

    t = Table(f"host time per call on {dev} (median of 7 rounds x {calls} calls)",
              ["call", "tensors", "us/call", "x torch.add_"])
    for name, n, us in rows:
        t.add(name, n, us, us / add_us)
    t.notes.append("bar: core no-op with 9 tensors <= 1.5x torch.add_")
    return [t]
