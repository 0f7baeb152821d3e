"""Barrier model of the seesaw decode kernel's protocol (docs/design/2026-12-03-decode-seesaw.md),
before the kernel exists: the pair structure FlashMLA's sm90 decode uses, as mlacore would run it.

Actors: the two warpgroups and, for each of a stage's nine 64-column boxes, the copy engine that
lands that box's TMA loads (boxes land in any order across boxes, in issue order for one box).
KV tiles go in pairs (b, b + 1), tile t in stage t % 2. Warpgroup 0 computes S for tile b and
its softmax first, warpgroup 1 for tile b + 1 after it (the row maximum sM is shared); each
keeps half of O's columns and multiplies its own P from registers by its half of V of its own
tile (O0 = P0 V[b][:, 0:256], O1 = P1 V[b+1][:, 256:512]) and the other's P from shared memory
by its half of the other tile (O0 += sP1 V[b+1] left, O1 += sP0 V[b] right). A box's mbarrier
completes a phase when the waiting warpgroup has arrived with the box's byte count and the box
has landed (two arrivals here); tile t is phase t // 2 of its stage's boxes. Refills: the rope
box (8) of a tile's stage by the warpgroup that computed the tile's S, at the top of the pair
(no product reads it); stage b's boxes 0-3 by warpgroup 0 once its O0 of tile b is complete,
boxes 4-7 by warpgroup 1 once its O1 of tile b is; stage b + 1's boxes 0-3 by warpgroup 0 once
its O0 of tile b + 1 is, boxes 4-7 by warpgroup 1 once its O1 of tile b + 1 is. The next S runs
over the boxes in the order they were refilled: warpgroup 0 over 8, 0-3, then 4-7; warpgroup 1
over 8, 4-7, then 0-3.

Named hand-offs (one side arrives, the other waits): Scale0Ready (0 -> 1: sM and sScale0
written), Scale1Ready (1 -> 0: sM and sScale1 written), P0Ready (0 -> 1: sP0 written), and
O1Issued (1 -> 0: warpgroup 1 has issued its product with sP0, after writing sP1).

numerics() replays the kernel's arithmetic (the shared row maximum, the halves of O and
their row sums, P0 rescaled for warpgroup 1) in float64 against softmax(S) V.
Checked for n_tiles 0..11 and random interleavings: no deadlock; mbarrier phases named
correctly by parity; and, by vector clocks, every shared-memory hand-off:
  - a box is read (S, either product) only after it landed, and refilled only after the S and
    the products that read it are complete;
  - sM, sScale0, sScale1, sP0 and sP1 are read after they are written and rewritten only after
    the last read of the previous pair (the products read sP0 and sP1 until they complete).
    python3 research/decode/seesaw_model.py
"""

import pathlib
import random
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests"))
from _barrier_sim import simulate, unordered  # noqa: E402

BOXES = 9
LEFT = range(0, 4)  # V's columns 0-255: warpgroup 0's half
RIGHT = range(4, 9)  # V's columns 256-511 and the rope block (the prologue's order)
RIGHT_V = range(4, 8)  # V's columns 256-511: warpgroup 1's half
ROPE = [8]
ARRIVALS = {f"K{st}.{i}": 2 for st in range(2) for i in range(BOXES)}


def box(t, i):
    return f"K{t % 2}.{i}", t // 2


def load(t, boxes):
    return [("ev", f"load{i}", t) for i in boxes]


def s_over(t, boxes):
    ops = []
    for i in boxes:  # one thread arrives with the box's byte count, then the warpgroup waits
        ops += [("marrive", *box(t, i)), ("mwait", *box(t, i)), ("ev", f"S{i}", t)]
    return ops


def wg0(n):
    ops = []
    if n > 0:
        ops += load(0, range(BOXES))
        if n > 1:
            ops += load(1, RIGHT) + load(1, LEFT)
        ops += s_over(0, range(BOXES)) + [("ev", "S_done", 0)]
    for k in range((n + 1) // 2):
        b = 2 * k
        if b + 2 < n:
            ops += load(b + 2, ROPE)  # S(b) is complete
        ops += [("ev", "sM_read0", k), ("ev", "sM_write0", k), ("ev", "sScale0_write", k)]
        ops += [("arrive", "Scale0Ready", k)]
        ops += [("ev", "O0_issue", b), ("ev", "O0_done", b)]  # O0 += P0 V0L; wait 0
        ops += [("sync", "Scale1Ready", k)]
        if b + 2 < n:
            ops += load(b + 2, LEFT)
        ops += [("ev", "sScale1_read", k), ("ev", "sP0_write", k), ("arrive", "P0Ready", k)]
        if b + 1 < n:  # O0 *= sScale1 (read again here); O0 += sP1 V1L
            ops += [("sync", "O1Issued", k), ("ev", "sScale1_reread", k), ("ev", "O0_issue", b + 1)]
        if b + 2 < n:
            ops += s_over(b + 2, ROPE + list(LEFT))
        if b + 3 < n:
            ops += [("ev", "O0_done", b + 1)] + load(b + 3, LEFT)  # wait 1: the product, not the S
        if b + 2 < n:
            ops += s_over(b + 2, RIGHT_V)
        if b + 1 < n:
            ops += [("ev", "O0_done", b + 1)]  # wait 0
        if b + 2 < n:
            ops += [("ev", "S_done", b + 2)]
    ops.append(("sync", "end", 0))
    return ops


def wg1(n):
    ops = []
    if n > 1:
        ops += s_over(1, RIGHT) + s_over(1, LEFT) + [("ev", "S_done", 1)]
    for k in range((n + 1) // 2):
        b = 2 * k
        if b + 3 < n:
            ops += load(b + 3, ROPE)  # S(b + 1) is complete
        ops += [("sync", "Scale0Ready", k), ("ev", "sM_read1", k), ("ev", "sScale0_read", k)]
        ops += [("ev", "sM_write1", k), ("ev", "sScale1_write", k), ("arrive", "Scale1Ready", k)]
        if b + 1 < n:
            ops += [("ev", "sP1_write", k), ("ev", "O1_issue", b + 1)]  # O1 += P1 V1R
        ops += [("sync", "P0Ready", k), ("ev", "O1_issue", b)]  # O1 += sP0 V0R
        if b + 1 < n:
            ops += [("arrive", "O1Issued", k)]
        if b + 3 < n:
            ops += [("ev", "O1_done", b + 1)] + load(b + 3, RIGHT_V)  # wait 1
        if b + 2 < n:
            ops += [("ev", "O1_done", b + 1), ("ev", "O1_done", b)] + load(b + 2, RIGHT_V)  # wait 0
        if b + 3 < n:
            ops += s_over(b + 3, ROPE) + s_over(b + 3, RIGHT_V) + s_over(b + 3, LEFT) + [("ev", "S_done", b + 3)]
        if b + 1 < n:
            ops += [("ev", "O1_done", b + 1)]
        ops += [("ev", "O1_done", b)]  # wait 0
    ops.append(("sync", "end", 0))
    return ops


def engine(n, i):
    ops = []
    for t in range(n):
        ops += [("await_only", f"load{i}", t), ("ev", f"landed{i}", t), ("marrive", *box(t, i))]
    return ops


def run(n, rng):
    ev = simulate([wg0(n), wg1(n)] + [engine(n, i) for i in range(BOXES)], ARRIVALS, rng, f"n={n}")
    pairs = []
    for t in range(n):
        for i in range(BOXES):
            assert (f"S{i}", t) in ev, f"n={n}: S over box {i} of tile {t} never issued"
            pairs.append(((f"landed{i}", t), (f"S{i}", t)))
            pairs.append((("S_done", t), (f"load{i}", t + 2)))
        for w, boxes in ((0, range(0, 4)), (1, range(4, 8))):
            assert (f"O{w}_issue", t) in ev and (f"O{w}_done", t) in ev, f"n={n}: O{w} of tile {t} missing"
            for i in boxes:
                pairs.append(((f"landed{i}", t), (f"O{w}_issue", t)))
                pairs.append(((f"O{w}_done", t), (f"load{i}", t + 2)))
    for k in range((n + 1) // 2):
        b = 2 * k
        pairs += [(("sM_read0", k), ("sM_write1", k)), (("sM_write0", k), ("sM_read1", k)),
                  (("sM_read1", k), ("sM_write0", k + 1)), (("sM_write1", k), ("sM_read0", k + 1)),
                  (("sScale0_write", k), ("sScale0_read", k)), (("sScale0_read", k), ("sScale0_write", k + 1)),
                  (("sScale1_write", k), ("sScale1_read", k)), (("sScale1_read", k), ("sScale1_write", k + 1)),
                  (("sP0_write", k), ("O1_issue", b)), (("O1_done", b), ("sP0_write", k + 1)),
                  (("sP1_write", k), ("O0_issue", b + 1)), (("O0_done", b + 1), ("sP1_write", k + 1))]
        if b + 1 < n:  # warpgroup 0 reads sScale1 a second time, after O1Issued, for its O rescale
            pairs += [(("sScale1_write", k), ("sScale1_reread", k)), (("sScale1_reread", k), ("sScale1_write", k + 1))]
    bad = unordered(ev, pairs)
    assert not bad, f"n={n}: ordering not guaranteed: {bad}"


def numerics(rows, n_tok, seed=0, masked_rows=(), bad_tiles=(), broken=None):
    """The kernel's arithmetic in float64, pair by pair as its loops do it (the shared
    row maximum, each warpgroup's half of O and its row sums, P0 rescaled for warpgroup
    1), against softmax(S) V: returns the largest difference. Tokens of `bad_tiles` and
    every token of `masked_rows` are masked, as a bad page id and a row past the request are.
    `broken` drops one step, for the test that the comparison catches it: "p0_rescale"
    (warpgroup 1 takes P0 as warpgroup 0 computed it) or "o1_alpha0" (warpgroup 1 does not
    take O and its row sums to warpgroup 0's new maximum)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    tiles = -(-n_tok // 64)
    s_all = rng.normal(size=(rows, tiles * 64)) * 4
    v = rng.normal(size=(tiles * 64, 512))
    visible = np.zeros_like(s_all, dtype=bool)
    visible[:, :n_tok] = True
    for t in bad_tiles:
        visible[:, 64 * t:64 * t + 64] = False
    for r in masked_rows:
        visible[r] = False
    s_all = np.where(visible, s_all, -np.inf)
    m = np.full(rows, -np.inf)
    o = [np.zeros((rows, 256)), np.zeros((rows, 256))]
    l = [np.zeros(rows), np.zeros(rows)]

    def softmax(t):  # -> P (against the new maximum), alpha; updates m
        nonlocal m
        sc = s_all[:, 64 * t:64 * t + 64]
        m_new = np.maximum(m, sc.max(axis=1))
        m_use = np.where(m_new == -np.inf, 0.0, m_new)
        with np.errstate(invalid="ignore"):  # -inf - -inf where the maximum stays -inf: alpha is 1 there
            alpha = np.where(m == m_new, 1.0, np.exp2(m - m_new))
        m = m_new
        return np.exp2(sc - m_use[:, None]), alpha

    for b in range(0, tiles, 2):
        p0, a0 = softmax(b)  # warpgroup 0
        o[0] = o[0] * a0[:, None] + p0 @ v[64 * b:64 * b + 64, :256]
        l[0] = l[0] * a0 + p0.sum(axis=1)
        if b + 1 < tiles:  # warpgroup 1
            p1, a1 = softmax(b + 1)
        else:
            a1 = np.ones(rows)
        a01 = a1 if broken == "o1_alpha0" else a0 * a1
        o[1] = o[1] * a01[:, None]
        l[1] = l[1] * a01
        if b + 1 < tiles:
            o[1] += p1 @ v[64 * b + 64:64 * b + 128, 256:]
            l[1] += p1.sum(axis=1)
        o[1] += (p0 if broken == "p0_rescale" else p0 * a1[:, None]) @ v[64 * b:64 * b + 64, 256:]
        l[0] = l[0] * a1
        if b + 1 < tiles:
            o[0] = o[0] * a1[:, None] + p1 @ v[64 * b + 64:64 * b + 128, :256]
    total = l[0] + l[1]
    got = np.concatenate(o, axis=1) / np.where(total > 0, total, 1.0)[:, None]
    w = np.where(visible, np.exp2(s_all - np.where(np.isinf(s_all.max(axis=1)), 0, s_all.max(axis=1))[:, None]), 0)
    want = (w @ v) / np.where(w.sum(axis=1) > 0, w.sum(axis=1), 1.0)[:, None]
    return float(np.abs(got - want).max())


def holds(seed=1, rounds=300, tiles=12):
    rng = random.Random(seed)
    for n in range(tiles):
        for _ in range(rounds):
            run(n, rng)


if __name__ == "__main__":
    holds()
    print("seesaw model: n_tiles 0..11, 300 interleavings each: OK")
    worst = max(numerics(8, n, seed=n, masked_rows=(3,), bad_tiles=(1,) if n > 128 else ()) for n in range(1, 700, 37))
    print(f"seesaw arithmetic against softmax(S) V: max |difference| {worst:.2e}")
