"""How well the plan's chunk choice balances a decode, by a list-schedule model (no GPU needed).

The decode grid runs one CTA per work item and query tile; the GPU hands CTAs out in grid order to
whichever SM frees first, and the plan puts the longest items first. Modelled as a greedy list
schedule of CTAs costing `tiles + 5` (the plan's fixed cost a CTA, kPlanFixedCostTiles) on 132 SMs,
this script compares the chunk mlacore's plan picks (built on the CPU by the installed mlacore)
with every chunk from 1 to the longest request:

    python research/decode/chunk_model.py            # the bench's attn rows at page 64
    python research/decode/chunk_model.py --families # regret over families of ragged and uniform batches
    python research/decode/chunk_model.py --sweep    # the wave and fill models over the candidates

"model" is the greedy makespan in tiles of the plan's chunk with its CTAs sorted longest first,
"grid" the same with them in the plan's own order (its length classes), "best" the smallest
sorted makespan over all chunks, "x" grid over best (1.000: the plan's schedule is the best the
model knows). At heads=128 a tile is about 2.3 us of the sm_90a kernels; the model ignores the
combine and DRAM sharing, so it ranks chunks, it does not predict times.

--sweep needs no mlacore: it restates the plan's candidate chunks and two models, the wave count
`ceil(CTAs / SMs) * (chunk + 5)` (main) and modelled_time() of
research/decode/variants/plan-fill-model.patch, and prints, per model, the greedy makespan of its
pick over that of the best candidate (docs/design/2026-12-03-balanced-schedule.md, 2026-12-08).
"""
import argparse
import heapq
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench._mla import ragged_lens  # noqa: E402

SMS, FIXED, TILE = 132, 5, 64


def plan_of(lens, heads, qo=1, page=64):
    """The chunk (tiles) and the work items' tile counts, in grid order, of the installed mlacore's plan."""
    import torch
    import mlacore
    B = len(lens)
    pages = [math.ceil(n / page) for n in lens]
    kv_indptr = torch.tensor([0] + torch.tensor(pages).cumsum(0).tolist(), dtype=torch.int32)
    plan = mlacore.MlaPlan("cpu", max_batch=B, num_sms=SMS)
    plan.build(torch.arange(B + 1, dtype=torch.int32) * qo, kv_indptr, torch.tensor(lens, dtype=torch.int32), page, heads)
    items = plan.work_items[: plan.info.num_work].tolist()
    return plan.info.chunk_tokens // TILE, [math.ceil((e - b) / TILE) for _, b, e, _ in items]


def dispatch(costs):
    """The greedy list schedule of CTA costs in the order given, onto the SM free first."""
    free = [0] * SMS
    end = 0
    for c in costs:
        f = heapq.heappop(free) + c
        end = max(end, f)
        heapq.heappush(free, f)
    return end


def makespan(tiles, chunk, q_tiles):
    """Greedy list schedule, longest CTA first, of every request's items for `chunk`."""
    costs = []
    for t in tiles:
        n = 1 if t <= chunk else math.ceil(t / chunk)
        costs += [min(chunk, t - i * chunk) + FIXED for i in range(n)] * q_tiles
    return dispatch(sorted(costs, reverse=True))


def row(lens, heads, qo=1):
    """The plan's chunk, its makespan sorted and in the plan's own grid order, the best chunk's."""
    tiles = [math.ceil(n / TILE) for n in lens]
    q = max(math.ceil(qo * heads / 64), 1)
    chosen, items = plan_of(lens, heads, qo)
    grid = dispatch([t + FIXED for t in items for _ in range(q)])  # CTA x is item x / q
    best = min((makespan(tiles, c, q), -c) for c in range(1, max(tiles) + 1))
    return chosen, makespan(tiles, chosen, q), grid, -best[1], best[0]


def bench_rows():
    rows = []
    for heads in (16, 128):
        for b, kv in ((8, 32768), (32, 8192), (32, 32768), (1, 4096), (1, 65536), (128, 1024), (256, 2048)):
            rows.append((f"h{heads} {b} x {kv}", [kv] * b, heads, 1))
        for b, lo, hi in ((32, 1, 16384), (96, 1, 4096), (256, 1, 2048)):
            rows.append((f"h{heads} ragged {b} {lo}..{hi}", ragged_lens(b, lo, hi, b), heads, 1))
        for qo in (2, 4):
            rows.append((f"h{heads} 16 x 8192 qo {qo}", [8192] * 16, heads, qo))
    return rows


def candidates(tiles, q, balance=False):
    """The plan's candidate chunks (chunk_bounds, candidate_chunks) with the default max_work: five
    equal parts of the longest request, and with `balance` the balance bound where lengths differ
    (plan-fill-model.patch)."""
    cost = sum(q * (t + FIXED) for t in tiles)
    no_split = max(max(tiles), 1)
    cap = min(max(math.ceil(sum(tiles) / SMS), 1), no_split)  # spare = max_work - batch = SMS
    bal = min(max(math.ceil(cost / SMS), cap), no_split)
    if bal >= no_split:
        return [no_split]
    most = math.ceil(no_split / bal)
    cands = {max(math.ceil(no_split / max(n, 1)), cap) for n in (most, most - 1, most * 3 // 4, most // 2, 1)}
    if balance and len(set(tiles)) > 1:
        cands.add(bal)
    return sorted(cands)


def wave_time(c, ctas, full, q_kv, same):
    return math.ceil(ctas / SMS) * (c + FIXED)


def fill_time(c, ctas, full, q_kv, same):
    """modelled_time() of schedule_algorithm.h, in quarter tiles."""
    p, m = c + FIXED, SMS
    if ctas <= m:
        return 4 * p
    waves, r = divmod(full, m)
    top, base, rest = (waves + (r > 0)) * p, waves * p, ctas - full
    if rest == 0:
        return 4 * top
    rest_cost, low = q_kv + FIXED * ctas - full * p, m - r
    if same:
        s = rest_cost // rest
        if r == 0:
            start = base + (rest - 1) // m * s
        else:
            per_low = -(-p // s)
            if rest <= low * per_low:
                start = base + (rest - 1) // low * s
            else:
                k, i = divmod(rest - low * per_low - 1, m)
                start = base + p + k * s + (0 if i < r else per_low * s - p)
        return 4 * max(top, start + s)
    level = base + rest_cost // low if r > 0 and rest_cost <= low * p else (full * p + rest_cost) // m
    return max(4 * top, 4 * level + rest_cost // rest)


def sweep():
    """Each model picks among its candidates (wave: main's five; fill: the patch's, with the balance
    bound); the greedy makespan of its pick over the best of either candidate set."""
    shapes = []
    for B in (1, 2, 4, 8, 16, 32, 64, 96, 128, 256, 512):
        for lo, hi in ((1, 2048), (1, 4096), (1, 16384), (1, 65536), (1024, 8192), (4096, 32768)):
            shapes += [(f"ragged {B} {lo}..{hi} s{s}", ragged_lens(B, lo, hi, 1000 * B + s)) for s in range(3)]
        shapes += [(f"uniform {B} x {kv}", [kv] * B) for kv in (512, 1024, 2048, 4096, 8192, 32768, 65536)]
    models = (("wave", wave_time, False), ("fill, five candidates", fill_time, False), ("fill", fill_time, True))
    logs = {n: [] for n, _, _ in models}
    worst = {n: (1.0, "") for n, _, _ in models}
    uniform_worse = 0
    for q in (1, 2, 4):
        for name, lens in shapes:
            tiles = [math.ceil(n / TILE) for n in lens]
            same, q_kv = len(set(tiles)) == 1, q * sum(tiles)
            greedy = {}
            for c in candidates(tiles, q, balance=True):
                n = [1 if t <= c else math.ceil(t / c) for t in tiles]
                greedy[c] = (makespan(tiles, c, q), q * sum(n), q * sum(t // c for t in tiles))
            best = min(g for g, _, _ in greedy.values())
            picked = {}
            for mname, f, bal in models:
                cs = candidates(tiles, q, balance=bal)
                c = min(cs, key=lambda c: (f(c, greedy[c][1], greedy[c][2], q_kv, same), -c))
                picked[mname] = greedy[c][0] / best
                logs[mname].append(math.log(picked[mname]))
                worst[mname] = max(worst[mname], (picked[mname], f"q_tiles {q}, {name}: chunk {c}"))
            uniform_worse += name.startswith("uniform") and picked["fill"] > picked["wave"]
    for mname, _, _ in models:
        w = worst[mname]
        print(f"{mname}: {len(logs[mname])} batches, greedy makespan of its pick over the best candidate's: "
              f"geomean {math.exp(sum(logs[mname]) / len(logs[mname])):.4f}, worst {w[0]:.3f} ({w[1]})")
    print(f"uniform batches where fill picks worse than wave: {uniform_worse}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", action="store_true", help="regret over ragged and uniform batch families")
    ap.add_argument("--sweep", action="store_true", help="the wave and fill models over the plan's candidates")
    a = ap.parse_args()
    if a.sweep:
        sweep()
        return
    if not a.families:
        print(f"{'row':28} {'chunk':>5} {'model':>6} {'grid':>6} {'best chunk':>10} {'best':>6} {'x':>6}")
        for name, lens, heads, qo in bench_rows():
            c, m, g, bc, bm = row(lens, heads, qo)
            print(f"{name:28} {c:5d} {m:6d} {g:6d} {bc:10d} {bm:6d} {g / bm:6.3f}")
        return
    logs, worst = [], (1.0, "")
    for heads in (16, 128):
        for B in (1, 4, 16, 32, 64, 96, 128, 256):
            fams = [("ragged", lo, hi, s) for lo, hi in ((1, 2048), (1, 16384), (1024, 8192), (4096, 32768))
                    for s in range(2)]
            fams += [("uniform", kv, kv, 0) for kv in (1024, 4096, 32768)]
            for kind, lo, hi, s in fams:
                lens = ragged_lens(B, lo, hi, 1000 * B + s) if kind == "ragged" else [lo] * B
                c, m, g, bc, bm = row(lens, heads)
                logs.append(math.log(g / bm))
                worst = max(worst, (g / bm, f"h{heads} {kind} {B} {lo}..{hi} s{s}: chunk {c} (best {bc})"))
    print(f"{len(logs)} batches: geomean grid / best {math.exp(sum(logs) / len(logs)):.4f}, "
          f"worst {worst[0]:.3f} ({worst[1]})")


if __name__ == "__main__":
    main()
