"""A small simulator of GPU barrier protocols, for the barrier models of the
decode kernels (tests/_wgmma_barrier_model.py; research/decode/seesaw_model.py).

Actors are lists of ops run in a random interleaving, each op one of:
  ("ev", name, tag)          something happens (first occurrence recorded,
                             with the actor's vector clock)
  ("await", name, tag)       wait until event (name, tag) has happened, and
                             take in what its actor did before it
  ("await_only", name, tag)  wait for it without taking anything in
  ("marrive", bar, phase)    arrive on mbarrier `bar` for its phase `phase`
                             (phases complete in order, after ARRIVALS[bar])
  ("mwait", bar, phase)      wait for phase `phase` of `bar` by parity: fails
                             if phase + 1 has also completed (parity would
                             name the wrong phase), takes in the arrivals
  ("sync", bar, tag)         a named barrier of two actors: blocks until the
                             other enters the same phase (which must carry
                             the same tag), and both take in both clocks
  ("arrive", bar, tag)       enters it without blocking or taking anything in
simulate() raises AssertionError on a deadlock or a protocol misuse and
returns the events: {(name, tag): (actor, clock)}.
"""


def simulate(seqs, arrivals, rng, label=""):
    actors = range(len(seqs))
    pc, blocked = [0 for _ in actors], [False for _ in actors]
    vc = [[0 for _ in actors] for _ in actors]
    phase, ev = {}, {}
    mdone, mnow = {}, {}  # mbarrier: completed phases; (arrivals, merged clock) of the open phase
    mclock = {}  # (name, phase) -> merged clock of its arrivals

    def merge(a, clock):
        vc[a] = [max(x, y) for x, y in zip(vc[a], clock)]

    def waiting(a):  # an mbarrier wait whose phase has not completed, or an event not yet happened
        kind, name, tag = seqs[a][pc[a]]
        if kind == "mwait":
            return mdone.get(name, 0) < tag + 1
        return kind in ("await", "await_only") and (name, tag) not in ev

    while not all(pc[a] >= len(seqs[a]) for a in actors):
        cand = [a for a in actors if pc[a] < len(seqs[a]) and not blocked[a] and not waiting(a)]
        if not cand:
            raise AssertionError(
                f"{label}: deadlock at {[seqs[a][pc[a]] if pc[a] < len(seqs[a]) else None for a in actors]}"
            )
        a = rng.choice(cand)
        kind, name, tag = seqs[a][pc[a]]
        vc[a][a] += 1
        if kind == "ev":
            ev.setdefault((name, tag), (a, list(vc[a])))  # first occurrence
            pc[a] += 1
            continue
        if kind in ("await", "await_only"):
            if kind == "await":
                merge(a, ev[(name, tag)][1])
            pc[a] += 1
            continue
        if kind == "marrive":
            assert tag == mdone.get(name, 0), f"{label}: {name} arrival for phase {tag} out of order"
            count, clock = mnow.get(name, (0, [0 for _ in actors]))
            count, clock = count + 1, [max(x, y) for x, y in zip(clock, vc[a])]
            if count == arrivals[name]:
                mclock[(name, tag)] = clock
                mdone[name] = tag + 1
                mnow.pop(name, None)
            else:
                mnow[name] = (count, clock)
            pc[a] += 1
            continue
        if kind == "mwait":
            # try_wait.parity(tag & 1) would also pass (or hang) on phase tag + 2, ...
            assert mdone[name] == tag + 1, f"{label}: {name} phase {mdone[name] - 1} completed before the wait for {tag}"
            merge(a, mclock[(name, tag)])
            pc[a] += 1
            continue
        ph = phase.setdefault(name, [])  # a named barrier
        assert all(x[0] != a for x in ph), f"{label}: actor {a} enters {name} twice in one phase"
        ph.append((a, tag, kind, list(vc[a])))
        if kind == "arrive":
            pc[a] += 1
        else:
            blocked[a] = True
        if len(ph) == 2:
            assert ph[0][1] == ph[1][1], f"{label}: {name} phase mixes tags {ph[0][1]} and {ph[1][1]}"
            m = [max(x, y) for x, y in zip(ph[0][3], ph[1][3])]
            for x in ph:
                if x[2] == "sync":
                    merge(x[0], m)
                    blocked[x[0]] = False
                    pc[x[0]] += 1
            phase[name] = []
    assert all(not v for v in phase.values()), f"{label}: unbalanced barrier {phase}"
    assert not mnow, f"{label}: mbarrier phases left open {mnow}"
    return ev


def unordered(ev, pairs):
    """The (x, y) of `pairs` where both events happened but x does not happen before y."""
    bad = []
    for x, y in pairs:
        if x in ev and y in ev:
            (ax, vx), (_, vy) = ev[x], ev[y]
            if not vx[ax] <= vy[ax]:
                bad.append((x, y))
    return bad
