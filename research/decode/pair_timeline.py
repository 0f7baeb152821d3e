"""Where a seesaw pair of tiles spends its time, hand-off by hand-off, beside
FlashMLA's pair at the same points.

    python research/decode/pair_timeline.py BATCH KV HEADS [BATCH KV HEADS ...]

Page size 64 (FlashMLA's only one). mlacore: a timeline build (meson
-Ddecode_timeline=true); the script sets MLACORE_DECODE_KERNEL=seesaw, whose
leader threads write clock64 at 20 points of every pair for the launch's first
8 CTAs (core/src/decode/decode_timeline.cuh). FlashMLA, when `flash_mla` is
importable from a build with research/decode/variants/flashmla-pair-marks.patch
(its extension then has `debug_pairs`): the same points in its two warpgroup
subroutines, for its first 4 partitions of both query tiles.

Points (warpgroup 0 | warpgroup 1; FlashMLA's named barriers in brackets):
  0 top of the pair                 | 10 top of the pair
  1 Scale0 arrived (sScale0Ready)   | 11 Scale0 waited for
  2 own P V issued                  | 12 Scale1 arrived (sScale1Ready)
  3 own P V done, Scale1 waited for | 13 own P V issued
  4 P0 arrived (sP0Ready)           | 14 P0 waited for
  5 O1 waited for (rO1sP0sV0RIssued)| 15 other P V issued, O1 arrived
  6 S(b+2) first part issued        | 16 own P V done, refill of b+3's right half
  7 P V with P1 done, refill issued | 17 other P V done, refill of b+2's right half
  8 S(b+2) second part issued       | 18 S(b+3) issued
  9 S(b+2) done (end of the pair)   | 19 S(b+3) done (end of the pair)
Per kernel: the median over the recorded CTAs' steady pairs (the first and the
last two left out) of the cycles from each point to the next of its warpgroup,
and of the pair (point 0 to the next pair's point 0).
"""
import os
import statistics
import sys
import types

os.environ["MLACORE_DECODE_KERNEL"] = "seesaw"

import torch  # noqa: E402

from bench import _mla  # noqa: E402
from bench._timing import L2Flush  # noqa: E402
from timeline import library  # noqa: E402  (research/decode/timeline.py, beside this script)

CTAS, PAIRS, SLOTS = 8, 64, 20
NAMES = ["top", "Scale0 arrive", "own PV issued", "Scale1 waited", "P0 arrive", "O1 waited", "S part 1 issued",
         "PV(P1) done", "S part 2 issued", "S done"]
NAMES1 = ["top", "Scale0 waited", "Scale1 arrive", "own PV issued", "P0 waited", "other PV issued", "own PV done",
          "other PV done", "S issued", "S done"]


def mlacore_reader():
    fn = library("mlacore_debug_decode_pairs")
    return lambda host: fn(host.data_ptr())


def flashmla_reader():
    try:
        import flash_mla_cuda  # the extension flash_mla wraps
    except Exception:  # noqa: BLE001
        return None
    fn = getattr(flash_mla_cuda, "debug_pairs", None)
    return (lambda host: fn(host) or 0) if fn else None


def record(read, run, dev):
    """The pair record of one launch after an L2 flush (the record is cleared by each read)."""
    host = torch.zeros(CTAS * PAIRS * SLOTS, dtype=torch.int64)
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    if read(host) != 0:
        sys.exit("reading the pair record failed")
    L2Flush(dev)()
    run()
    torch.cuda.synchronize()
    if read(host) != 0:
        sys.exit("reading the pair record failed")
    return host.view(CTAS, PAIRS, SLOTS).tolist()


def summarize(name, rec):
    segs = {g: [[] for _ in range(9)] for g in (0, 1)}
    pair_len = []
    for cta in rec:
        pairs = [p for p in range(PAIRS) if cta[p][0] and cta[p][10]]
        steady = pairs[1:-2]
        for p in steady:
            for g in (0, 1):
                pts = cta[p][10 * g: 10 * g + 10]
                for i in range(9):
                    if pts[i] and pts[i + 1] and pts[i + 1] >= pts[i]:
                        segs[g][i].append(pts[i + 1] - pts[i])
            if p + 1 < PAIRS and cta[p + 1][0]:
                pair_len.append(cta[p + 1][0] - cta[p][0])
    if not pair_len:
        print(f"  {name}: no steady pair recorded")
        return
    print(f"  {name}: pair {statistics.median(pair_len):.0f} cycles (median of {len(pair_len)} pairs)")
    for g, names in ((0, NAMES), (1, NAMES1)):
        for i in range(9):
            xs = segs[g][i]
            if xs:
                print(f"    wg{g} {names[i]:>16s} -> {names[i + 1]:<16s} {statistics.median(xs):7.0f}")


def main():
    args = [int(a) for a in sys.argv[1:]]
    if not args or len(args) % 3:
        sys.exit(__doc__)
    dev = torch.device("cuda")
    read_m = mlacore_reader()
    read_f = flashmla_reader()
    for i in range(0, len(args), 3):
        batch, kv, heads = args[i: i + 3]
        ctx = types.SimpleNamespace(device=dev, gpu=True, separate=False)
        case = _mla.DecodeCase(ctx, batch, kv, heads, 64, batch * -(-kv // 64) * 2, torch.bfloat16)
        print(f"\n== batch {batch} kv {kv} heads {heads} page 64 (cycles)")
        summarize("mlacore seesaw", record(read_m, case.run, dev))
        if read_f is None:
            print("  FlashMLA: not importable, or built without the pair marks")
            continue
        run_f, why = _mla.flashmla_runner(ctx, case)
        if run_f is None:
            print(f"  FlashMLA: {why}")
            continue
        summarize("FlashMLA", record(read_f, run_f, dev))


if __name__ == "__main__":
    main()
