"""Model of the barrier protocol of core/src/decode/mla_decode_sm90.cu.

Three actors: the two warpgroups and the copy engine that lands warpgroup 1's
cp.async tiles. Each warpgroup contributes half of a 256-thread named barrier
(bar.sync blocks until both halves are in, bar.arrive counts in and goes on:
warpgroup 0 on KvEmpty; racecheck builds make KvEmpty an mbarrier with the
same arrive/wait roles, which orders the same accesses). The shared-memory
mbarriers complete a phase after a fixed number of arrivals and are waited
for by parity, which is only sound while no phase two ahead of a wait
completes before it (checked): PFree (warpgroup 1 arrives, warpgroup 0
waits), and KvFull of each stage (tile t >= 1 on stage t % 2, phase
(t - 1) // 2: warpgroup 1's arrival, which releases the tile's valid flags,
and the copy engine's once the tile has landed, which does not carry what
warpgroup 1 did; the flags are also ordered by PFull(t-1), which warpgroup 1
enters after issuing tile t, so the model holds without the first).
Warpgroup 0 frees a stage early (before its wait for the next tile) at any
set of tiles: the kernel does when that tile has not landed, and the
protocol must hold either way.
The per-tile op lists below mirror the kernel's loops by hand and must be
kept in step with them. For n_tiles 0..9 and many random interleavings (and
random early-free sets) this checks: no deadlock; every named-barrier phase
gets exactly one contribution from each warpgroup, for the same tile; and,
with vector clocks (a bar.sync or an mbarrier wait takes in what the
arrivers did before arriving), the orderings the shared-memory hazards rely
on:
  - P / alpha of tile t written only after warpgroup 1's P V(t-1) and its
    read of alpha(t-1) (PFree); read only after they were written (PFull);
  - a KV stage is read (S, both P V) only after its load landed, and its
    valid flags only after warpgroup 1 stored them (KvFull);
  - tile t+2 is loaded into stage t % 2 only after S(t), P V(t) of both
    warpgroups completed (KvEmpty, and warpgroup 1's own wait).
The interleavings and clocks are tests/_barrier_sim.py's.
No GPU involved:  python3 tests/_wgmma_barrier_model.py
"""

import random

from _barrier_sim import simulate, unordered

# Arrivals that complete a phase of each mbarrier.
ARRIVALS = {"PFree": 1, "Full0": 2, "Full1": 2}


def full(t):  # the KvFull mbarrier and phase of tile t >= 1
    return f"Full{t % 2}", (t - 1) // 2


def wg0(n, early=frozenset()):
    ops = [("sync", "Start", "prologue")]
    for it in range(n):
        free = [("ev", "PV0_done", it - 1), ("arrive", "KvEmpty", it - 1)]  # wait_group 0 or 1
        if it > 0:
            if it in early and it + 1 < n:
                ops += free
            ops.append(("mwait", *full(it)))
        ops.append(("ev", "S_issue", it))
        if it > 0 and it + 1 < n and it not in early:
            ops += free
        ops.append(("ev", "S_done", it))  # wait_group 0
        if it > 0:
            ops.append(("ev", "PV0_done", it - 1))
            ops.append(("mwait", "PFree", it - 1))
        ops.append(("ev", "P_write", it))
        ops.append(("sync", "PFull", it))
        ops.append(("ev", "PV0_issue", it))
    if n > 0:
        ops.append(("ev", "PV0_done", n - 1))
    ops.append(("sync", "end", 0))  # __syncthreads before the epilogue
    return ops


def wg1(n):
    ops = []
    if n > 0:
        ops += [("ev", "load", 0), ("await", "load_landed", 0)]  # cp.async.wait_group 0 + fence
    ops.append(("sync", "Start", "prologue"))
    if n > 1:
        ops += [("ev", "load", 1), ("marrive", *full(1))]
    for it in range(n):
        ops.append(("sync", "PFull", it))
        ops.append(("ev", "alpha_read", it))
        if it > 0:
            ops.append(("mwait", *full(it)))
        ops.append(("ev", "PV1_issue", it))
        ops.append(("ev", "PV1_done", it))  # wgmma wait_group 0
        if it + 1 < n:
            ops.append(("marrive", "PFree", it))
            if it + 2 < n:
                ops.append(("sync", "KvEmpty", it))
                ops += [("ev", "load", it + 2), ("marrive", *full(it + 2))]
    ops.append(("sync", "end", 0))
    return ops


def copies(n):
    # A tile lands some time after its cp.async were issued; that arrival
    # orders the landed data only, not what warpgroup 1 did before issuing.
    ops = []
    for t in range(n):
        ops += [("await_only", "load", t), ("ev", "load_landed", t)]
        if t > 0:
            ops.append(("marrive", *full(t)))
    return ops


def run(n, rng):
    early = frozenset(t for t in range(n) if rng.random() < 0.5)
    ev = simulate([wg0(n, early), wg1(n), copies(n)], ARRIVALS, rng, f"n={n}")
    pairs = []

    def need(x, y):  # x happens before y (both must have occurred, or neither is checked)
        pairs.append((x, y))

    for t in range(n):
        assert ("load", t) in ev and ("PV0_issue", t) in ev and ("PV1_issue", t) in ev
        need(("PV1_done", t - 1), ("P_write", t))
        need(("alpha_read", t - 1), ("P_write", t))
        need(("P_write", t), ("PV1_issue", t))
        need(("P_write", t), ("alpha_read", t))
        for use in ("S_issue", "PV0_issue", "PV1_issue"):
            need(("load_landed", t), (use, t))
        need(("load", t), ("S_done", t))  # the valid flags, stored when the tile is issued
        for done in ("S_done", "PV0_done", "PV1_done"):
            need((done, t), ("load", t + 2))
    bad = unordered(ev, pairs)
    assert not bad, f"n={n}: ordering not guaranteed: {bad}"


if __name__ == "__main__":
    rng = random.Random(1)
    for n in range(10):
        for _ in range(1000):
            run(n, rng)
    print("barrier model: n_tiles 0..9, 1000 interleavings each: OK")
