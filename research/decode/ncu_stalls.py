"""Where a kernel's warps wait, from Nsight Compute's per-instruction stall samples.

Reads the CSV of `ncu -i REPORT --page source --csv --print-source sass` (a report taken
with `--set full`, or with the SourceCounters and WarpStateStats sections) and groups the
kernel's warp stall samples by what the warp waits for, from each instruction's main stall
reason and the instructions before it:
  - barrier stalls: wgmma.wait_group (WARPGROUP.DEPBAR itself), or the named barrier
    (BAR.SYNC id) the warp passed last, ncu putting a held warp's samples on the
    instructions after the barrier;
  - long-scoreboard stalls: an mbarrier wait when the producer is a try-wait
    (SYNCS.PHASECHK: a TMA box or cp.async tile not landed, an mbarrier hand-off not yet
    arrived), else a global or shared load;
  - wgmma issue (HGMMA), and everything else (issue, math, softmax, address arithmetic).
Then the samples by ncu's own stall reason over the whole kernel (no_inst:
instruction fetch and cache misses; long_sb: loads and mbarrier waits; ...), and the
hottest instructions with the few before them, for mapping to source (the report's SASS
matches `nvdisasm -g` of the same build's cubin).

    python3 research/decode/ncu_stalls.py SASS.csv [TOP]
"""

import csv
import sys
from collections import defaultdict

BACK = 96  # how far back to look for a barrier or the producer of a waited-for value


def load(path):
    rows = list(csv.reader(open(path, newline="")))
    start = next(i for i, r in enumerate(rows) if r[:2] == ["Address", "Source"])
    hdr, data = rows[start], [r for r in rows[start + 1:] if len(r) > 2]
    col = hdr.index("Warp Stall Sampling (All Samples)")
    reasons = [(j, h[len("stall_"):]) for j, h in enumerate(hdr) if h.startswith("stall_") and "Not Issued" not in h]
    out, by_reason = [], defaultdict(float)
    for r in data:
        by = [(float(r[j] or 0), name) for j, name in reasons]
        for v, name in by:
            by_reason[name] += v
        out.append((r[1], float(r[col] or 0), max(by)[1] if by and max(by)[0] > 0 else ""))
    return out, by_reason


def site(data, i):
    src, _, reason = data[i]
    if "DEPBAR" in src and "WARPGROUP" in src:
        return "wgmma.wait_group"
    if "HGMMA" in src:
        return "wgmma issue"
    back = [data[j][0] for j in range(i - 1, max(-1, i - BACK), -1)]
    if reason == "barrier":
        bar = next((b for b in back if "BAR.SYNC" in b), None)
        return "named barrier " + bar.split()[-2].rstrip(",") if bar else "barrier (other)"
    if reason == "long_sb":
        for b in [src] + back:
            if "SYNCS.PHASECHK" in b:
                return "mbarrier wait"
            if "LDG" in b or "LDS" in b or "LDSM" in b:
                return "after a load"
        return "long scoreboard (other)"
    return "everything else"


def main(path, top=12):
    data, by_reason = load(path)
    total = sum(s for _, s, _ in data) or 1.0
    groups = defaultdict(float)
    for i, (_, s, _) in enumerate(data):
        if s:
            groups[site(data, i)] += s
    print(f"{path}: {int(total)} warp stall samples")
    for g, s in sorted(groups.items(), key=lambda kv: -kv[1]):
        print(f"  {100 * s / total:5.1f}%  {g}")
    all_reasons = sum(by_reason.values()) or 1.0
    print("by stall reason: " + ", ".join(f"{name} {100 * v / all_reasons:.1f}%" for name, v in
                                          sorted(by_reason.items(), key=lambda kv: -kv[1]) if v > 0.005 * all_reasons))
    print(f"hottest {top} instructions (row of the CSV, share, main stall reason, the instructions before it):")
    for s, i in sorted(((s, i) for i, (_, s, _) in enumerate(data) if s), reverse=True)[:top]:
        print(f"  row {i:5d}  {100 * s / total:4.1f}%  {data[i][2]}: {site(data, i)}")
        for j in range(max(0, i - 3), i + 1):
            print(f"      {data[j][0][:96]}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 12)
