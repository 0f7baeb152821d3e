"""Where a heads=128 decode's time goes between its two kernels, and how it grows with kv_len.

For each (batch, kv_len, page) the wrapper's run() is profiled (torch.profiler, CUDA
activities) over REPEATS calls with the L2 flushed before each; the mean device time of the
decode kernel and of the combine kernel is printed, and the run() time by CUDA events (as the
benchmarks time it). The combine is a programmatic dependent launch: it starts once the decode's
CTAs are resident and waits, so its device time spans most of the decode's; run() minus the
decode kernel is what it costs. Lengths that double at a fixed batch give the per-tile slope and the fixed
part of a CTA (intercept): the kernel time at 2L minus the time at L is L's tiles.

    PYTHONPATH=<repo root> python research/decode/decode_profile.py [REPEATS [BATCHxKV[xPAGE] ...]]

Shapes on the command line replace the default list (e.g. 1x4096x64 128x1024); a shape
without a page size runs pages 1 and 64. MLACORE_DECODE_KERNEL picks the kernel as in run().
"""

import sys
from collections import defaultdict
from types import SimpleNamespace

import torch

from bench import Context
from bench._mla import DecodeCase, timer
from bench._timing import L2Flush

HEADS = 128
SHAPES = [(8, 8192), (8, 16384), (8, 32768), (8, 65536), (32, 8192), (32, 32768)]


def main():
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    shapes = [tuple(int(v) for v in a.split("x")) for a in sys.argv[2:]] or SHAPES
    ctx = Context(SimpleNamespace(device="cuda", size="full", separate=False, repeats=0, shapes=None))
    measure = timer(ctx, repeats)
    flush = L2Flush(ctx.device)
    for batch, kv, *page in shapes:
        for page_size in page or (1, 64):
            num_pages = batch * -(-kv // page_size) + 8
            case = DecodeCase(ctx, batch, kv, HEADS, page_size, num_pages, torch.bfloat16)
            ms = measure(case.run)  # also the warm-up of the profiled calls
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(repeats):
                    flush()
                    case.run()
                torch.cuda.synchronize()
            us = defaultdict(float)
            for e in prof.events():
                if "mla_decode" in e.name:
                    kind = "combine" if "combine" in e.name else "decode"
                    us[kind] += e.device_time_total / repeats
            print(f"b={batch} kv={kv} page={page_size} tiles/request={kv // 64}: run {ms * 1e3:.1f} us, "
                  f"decode kernel {us['decode']:.1f} us, combine {us['combine']:.1f} us", flush=True)
            del case
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
