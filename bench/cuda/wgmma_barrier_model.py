"""Model of the barrier protocol of core/src/mla_decode_sm90.cu.

Each warpgroup is one actor that contributes half of a 256-thread named
barrier (bar.sync blocks until both halves are in, bar.arrive counts in and
goes on). PFree is a shared-memory mbarrier instead: warpgroup 1 arrives once
per phase, warpgroup 0 waits for a phase by its parity, which is only sound
while warpgroup 1 is never two phases ahead of the wait (checked).
The two per-tile op lists below mirror the kernel's loops by hand and must be
kept in step with them. For n_tiles 0..9 and many random interleavings this
checks: no deadlock; every barrier phase gets exactly one contribution from
each warpgroup, for the same tile; and, with vector clocks (bar.sync takes
in what both sides did before the barrier), the orderings the shared-memory
hazards rely on:
  - P / alpha of tile t written only after warpgroup 1's P V(t-1) and its
    read of alpha(t-1) (PFree); read only after they were written (PFull);
  - a KV stage is read (S, both P V) only after its load landed (KvFull);
  - tile t+2 is loaded into stage t % 2 only after S(t), P V(t) of both
    warpgroups completed (KvEmpty, and warpgroup 1's own wait).
No GPU involved:  python3 bench/cuda/wgmma_barrier_model.py
"""

import random


def wg0(n):
    ops = [("sync", "KvFull", "prologue")]
    for it in range(n):
        if it > 0:
            ops.append(("sync", "KvFull", it))
        ops.append(("ev", "S_issue", it))
        if it > 0 and it + 1 < n:
            ops.append(("ev", "PV0_done", it - 1))  # wait_group 1
            ops.append(("arrive", "KvEmpty", it - 1))
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
    ops = [
        ("ev", "load", 0),
        ("ev", "load", 1),
        ("ev", "load_landed", 0),
        ("sync", "KvFull", "prologue"),
    ]
    for it in range(n):
        ops.append(("sync", "PFull", it))
        ops.append(("ev", "alpha_read", it))
        ops.append(("ev", "PV1_issue", it))
        if it + 1 < n:
            ops.append(("ev", "load_landed", it + 1))  # cp.async.wait_group 0 + fence
            ops.append(("sync", "KvFull", it + 1))
        ops.append(("ev", "PV1_done", it))  # wgmma wait_group 0
        if it + 1 < n:
            ops.append(("marrive", "PFree", it))
            if it + 2 < n:
                ops.append(("sync", "KvEmpty", it))
                ops.append(("ev", "load", it + 2))
    ops.append(("sync", "end", 0))
    return ops


def run(n, rng):
    seqs = [wg0(n), wg1(n)]
    pc, vc, blocked = [0, 0], [[0, 0], [0, 0]], [False, False]
    phase, ev = {}, {}
    mdone, mclock = {}, {}  # mbarrier: completed phases, warpgroup 1's clock at each arrival

    def waiting(a):  # an mbarrier wait whose phase has not completed yet
        kind, name, tag = seqs[a][pc[a]]
        return kind == "mwait" and mdone.get(name, 0) < tag + 1

    while not all(pc[a] >= len(seqs[a]) for a in (0, 1)):
        cand = [a for a in (0, 1) if pc[a] < len(seqs[a]) and not blocked[a] and not waiting(a)]
        if not cand:
            raise AssertionError(
                f"n={n}: deadlock at {[seqs[a][pc[a]] if pc[a] < len(seqs[a]) else None for a in (0, 1)]}"
            )
        a = rng.choice(cand)
        kind, name, tag = seqs[a][pc[a]]
        vc[a][a] += 1
        if kind == "ev":
            ev.setdefault((name, tag), (a, list(vc[a])))  # first occurrence
            pc[a] += 1
            continue
        if kind == "marrive":
            assert tag == mdone.get(name, 0), f"n={n}: {name} arrival for phase {tag} out of order"
            mclock[(name, tag)] = list(vc[a])
            mdone[name] = tag + 1
            pc[a] += 1
            continue
        if kind == "mwait":
            # try_wait.parity(tag & 1) would also pass (or hang) on phase tag + 2, ...
            assert mdone[name] == tag + 1, f"n={n}: {name} phase {mdone[name] - 1} completed before the wait for {tag}"
            vc[a] = [max(vc[a][i], mclock[(name, tag)][i]) for i in (0, 1)]
            pc[a] += 1
            continue
        ph = phase.setdefault(name, [])
        assert all(x[0] != a for x in ph), (
            f"n={n}: warpgroup {a} enters {name} twice in one phase"
        )
        ph.append((a, tag, kind, list(vc[a])))
        if kind == "arrive":
            pc[a] += 1
        else:
            blocked[a] = True
        if len(ph) == 2:
            assert ph[0][1] == ph[1][1], (
                f"n={n}: {name} phase mixes tiles {ph[0][1]} and {ph[1][1]}"
            )
            m = [max(ph[0][3][i], ph[1][3][i]) for i in (0, 1)]
            for x in ph:
                if x[2] == "sync":
                    vc[x[0]] = [max(vc[x[0]][i], m[i]) for i in (0, 1)]
                    blocked[x[0]] = False
                    pc[x[0]] += 1
            phase[name] = []
    assert all(not v for v in phase.values()), f"n={n}: unbalanced barrier {phase}"

    bad = []

    def need(
        x, y
    ):  # x happens before y (both must have occurred, or neither is checked)
        if x in ev and y in ev:
            (ax, vx), (_, vy) = ev[x], ev[y]
            if not vx[ax] <= vy[ax]:
                bad.append((x, y))

    for t in range(n):
        assert ("load", t) in ev and ("PV0_issue", t) in ev and ("PV1_issue", t) in ev
        need(("PV1_done", t - 1), ("P_write", t))
        need(("alpha_read", t - 1), ("P_write", t))
        need(("P_write", t), ("PV1_issue", t))
        need(("P_write", t), ("alpha_read", t))
        for use in ("S_issue", "PV0_issue", "PV1_issue"):
            need(("load_landed", t), (use, t))
        for done in ("S_done", "PV0_done", "PV1_done"):
            need((done, t), ("load", t + 2))
    assert not bad, f"n={n}: ordering not guaranteed: {bad}"


if __name__ == "__main__":
    rng = random.Random(1)
    for n in range(10):
        for _ in range(1000):
            run(n, rng)
    print("barrier model: n_tiles 0..9, 1000 interleavings each: OK")
