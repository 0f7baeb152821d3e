"""Where a decode CTA's time goes, from a timeline build of mlacore
(meson -Ddecode_timeline=true: the wgmma kernel records, per CTA, when it
reaches each phase; core/src/decode/decode_timeline.cuh).

    python research/decode/timeline.py BATCH KV HEADS PAGE [BATCH KV HEADS PAGE ...]

Per shape: one launch after a warm-up, the L2 flushed before it; then, over
the CTAs that ran a work item, the median (p10-p90) time of each phase in
microseconds, and when the CTAs started and ended against the first start.
Phases (slots of the record):
  0 entry -> 1 work item read          read_item: header, work item, request's indices
  1 -> 2 Q and tile 0 landed           page ids, Q, tile 0, barrier set-up
  2 -> 3 first S complete              S(0)
  3 -> 4 warpgroup 0's loop done       the tiles after S(0) (per tile: divided by their count)
  4 -> 6 row sums shared               warpgroup 1's last P V, the sums
  6 -> 7 O stored                      the epilogue's stores issued
"""
import ctypes
import os
import statistics
import sys
import types

import torch

import mlacore
from bench import _mla
from bench._timing import L2Flush

SLOTS, CTAS = 16, 1 << 15
PHASES = (("item", 0, 1), ("Q+tile0", 1, 2), ("S(0)", 2, 3), ("tiles", 3, 4), ("drain+sums", 4, 6),
          ("store", 6, 7), ("total", 0, 7))


def library(name="mlacore_debug_decode_timeline"):
    """A record reader of a timeline build's libmlacore: fn(host pointer) -> 0 on success."""
    lib = ctypes.CDLL(os.path.join(mlacore.get_library_dir(), "libmlacore.so.0"))
    try:
        fn = getattr(lib, name)
    except AttributeError:
        sys.exit("this libmlacore is not a timeline build (meson -Ddecode_timeline=true)")
    fn.argtypes = [ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def shape(read, batch, kv, heads, page):
    dev = torch.device("cuda")
    ctx = types.SimpleNamespace(device=dev, gpu=True, separate=False)
    case = _mla.DecodeCase(ctx, batch, kv, heads, page, batch * -(-kv // page) + 8, torch.bfloat16)
    for _ in range(3):
        case.run()
    # The record before and after the measured launch: a CTA slot whose entry did not
    # change belongs to an earlier launch (a slot is per CTA index, never cleared).
    before = torch.zeros(CTAS * SLOTS * 2, dtype=torch.int64)
    rec = torch.zeros(CTAS * SLOTS * 2, dtype=torch.int64)
    torch.cuda.synchronize()
    if read(before.data_ptr()) != 0:
        sys.exit("reading the timeline failed")
    flush = L2Flush(dev)
    flush()
    case.run()
    torch.cuda.synchronize()
    if read(rec.data_ptr()) != 0:
        sys.exit("reading the timeline failed")
    r = rec.view(CTAS, SLOTS, 2)
    old_entry = before.view(CTAS, SLOTS, 2)[:, 0, 0].tolist()
    info = case.wrapper._plan.info
    print(f"\n== batch {batch} kv {kv} heads {heads} page {page}: {info.num_work} work items, "
          f"chunk {info.chunk_tokens} tokens")
    # CTAs that stored O after entering (padding CTAs return before slot 7).
    gt = r[:, :, 0].tolist()
    clk = r[:, :, 1].tolist()
    ctas = []
    for b in range(CTAS):
        if gt[b][0] == 0 or gt[b][0] == old_entry[b] or gt[b][7] == 0 or gt[b][7] < gt[b][0]:
            continue
        ctas.append(b)
    if not ctas:
        print("no CTA recorded")
        return
    t0 = min(gt[b][0] for b in ctas)
    t_end = max(gt[b][7] for b in ctas)
    print(f"{len(ctas)} CTAs on {len(set(gt[b][SLOTS - 1] for b in ctas))} SMs; first entry to last store "
          f"{(t_end - t0) / 1e3:.1f} us")
    # Each CTA's clock rate from its whole span (cycles / ns), to turn cycle phases into us.
    ghz = {}
    for b in ctas:
        span_ns = gt[b][7] - gt[b][0]
        ghz[b] = (clk[b][7] - clk[b][0]) / span_ns if span_ns > 0 else 1.0
    for name, a, b2 in PHASES:
        timed = [(b, (clk[b][b2] - clk[b][a]) / ghz[b] / 1e3) for b in ctas if clk[b][b2] != 0 and clk[b][a] != 0]
        if not timed:
            continue
        us = [u for _, u in timed]
        extra = ""
        if name == "tiles":  # over the n_tiles - 1 tiles after S(0)
            per = [u / max(clk[b][SLOTS - 1] - 1, 1) for b, u in timed]
            extra = f"   per tile {statistics.median(per):.2f}"
        print(f"  {name:12s} {statistics.median(us):7.2f} us ({pct(us, 0.1):6.2f}-{pct(us, 0.9):6.2f}){extra}")
    starts = sorted((gt[b][0] - t0) / 1e3 for b in ctas)
    ends = sorted((gt[b][7] - t0) / 1e3 for b in ctas)
    print(f"  entries at {starts[0]:.1f} / {pct(starts, 0.5):.1f} / {starts[-1]:.1f} us (first / median / last), "
          f"stores done at {ends[0]:.1f} / {pct(ends, 0.5):.1f} / {ends[-1]:.1f}")
    tiles = [clk[b][SLOTS - 1] for b in ctas]
    print(f"  tiles a CTA: {min(tiles)}..{max(tiles)} (median {statistics.median(tiles)})")


def main():
    args = [int(a) for a in sys.argv[1:]]
    if not args or len(args) % 4:
        sys.exit(__doc__)
    read = library()
    for i in range(0, len(args), 4):
        shape(read, *args[i:i + 4])


if __name__ == "__main__":
    main()
