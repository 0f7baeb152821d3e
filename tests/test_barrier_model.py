"""The wgmma decode kernel's barrier protocol, as tests/_wgmma_barrier_model.py
transcribes it, and the protocol designed for the seesaw kernel
(research/decode/seesaw_model.py), both simulated by tests/_barrier_sim.py (no
GPU): each holds for every tile count, and each model still rejects the
mistakes it exists to catch, so a change to either that weakens it fails here."""

import importlib.util
import pathlib
import random

import pytest

MODEL = pathlib.Path(__file__).resolve().parent / "_wgmma_barrier_model.py"


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


@pytest.fixture()
def model():
    return _load(MODEL, "wgmma_barrier_model")


def _holds(m, seed, rounds=200):
    rng = random.Random(seed)
    for n in range(10):
        for _ in range(rounds):
            m.run(n, rng)


def test_protocol_holds_for_every_tile_count(model):
    _holds(model, seed=7)


def _arrive_before_own_wait(seqs):
    out = []
    for op in seqs:
        if op[:2] == ("marrive", "PFree"):  # PFree arrival moved before this warpgroup's P V(t) completes
            out.insert(max(i for i, x in enumerate(out) if x == ("ev", "PV1_done", op[2])), op)
        else:
            out.append(op)
    return out


def _free_without_wait(ops):
    # warpgroup 0 arrives on KvEmpty without first waiting for its P V of that tile
    return [op for i, op in enumerate(ops) if not (op[1] == "PV0_done" and ops[i + 1][1] == "KvEmpty")]


@pytest.mark.parametrize(
    "broken", ["arrive_early", "wait_wrong_phase", "no_wait", "no_kvempty", "free_without_wait"]
)
def test_model_rejects_broken_protocols(model, broken, monkeypatch):
    wg0, wg1 = model.wg0, model.wg1
    if broken == "arrive_early":
        monkeypatch.setattr(model, "wg1", lambda n: _arrive_before_own_wait(wg1(n)))
    elif broken == "wait_wrong_phase":
        monkeypatch.setattr(
            model, "wg0", lambda n, early=frozenset(): [(k, b, t - 1 if k == "mwait" else t) for k, b, t in wg0(n, early)]
        )
    elif broken == "no_wait":
        monkeypatch.setattr(model, "wg0", lambda n, early=frozenset(): [op for op in wg0(n, early) if op[0] != "mwait"])
    elif broken == "no_kvempty":  # warpgroup 1 refills a stage without waiting for warpgroup 0's S and P V of it
        monkeypatch.setattr(model, "wg0", lambda n, early=frozenset(): [op for op in wg0(n, early) if op[1] != "KvEmpty"])
        monkeypatch.setattr(model, "wg1", lambda n: [op for op in wg1(n) if op[1] != "KvEmpty"])
    else:
        monkeypatch.setattr(model, "wg0", lambda n, early=frozenset(): _free_without_wait(wg0(n, frozenset(range(n)))))
    with pytest.raises((AssertionError, KeyError)):
        _holds(model, seed=3, rounds=100)


# The seesaw kernel's protocol (core/src/decode/mla_decode_seesaw.cu), as
# research/decode/seesaw_model.py transcribes it.
SEESAW = pathlib.Path(__file__).resolve().parents[1] / "research" / "decode" / "seesaw_model.py"


@pytest.fixture()
def seesaw():
    return _load(SEESAW, "seesaw_model")


def test_seesaw_protocol_holds_for_every_tile_count(seesaw):
    seesaw.holds(seed=5, rounds=60)


def _drop(ops, pred):
    return [op for op in ops if not pred(op)]


def _refill_k0_right_early(ops):
    # warpgroup 1 refills stage b's right half without first waiting for its products to complete
    # (the two completions just before the refill dropped; they still happen at its last wait)
    return [op for i, op in enumerate(ops)
            if not (op[:2] == ("ev", "O1_done") and any(o[1].startswith("load") for o in ops[i + 1:i + 3]))]


@pytest.mark.parametrize("broken", ["no_o1_issued", "first_box_only", "refill_before_done", "read_sm_early",
                                    "rope_refill_early", "wrong_phase"])
def test_seesaw_model_rejects_broken_protocols(seesaw, broken, monkeypatch):
    wg0, wg1 = seesaw.wg0, seesaw.wg1
    if broken == "no_o1_issued":  # warpgroup 0 reads sP1 without waiting for warpgroup 1 to have written it
        monkeypatch.setattr(seesaw, "wg0", lambda n: _drop(wg0(n), lambda op: op[1] == "O1Issued"))
        monkeypatch.setattr(seesaw, "wg1", lambda n: _drop(wg1(n), lambda op: op[1] == "O1Issued"))
    elif broken == "first_box_only":  # S over a tile once its first box has landed
        monkeypatch.setattr(seesaw, "wg0", lambda n: _drop(
            wg0(n), lambda op: op[0] == "mwait" and not op[1].endswith(".0")))
    elif broken == "refill_before_done":
        monkeypatch.setattr(seesaw, "wg1", lambda n: _refill_k0_right_early(wg1(n)))
    elif broken == "read_sm_early":  # warpgroup 1 reads the row maximum before warpgroup 0 has written it
        def early(n):
            ops = wg1(n)
            for i, op in enumerate(ops):
                if op[:2] == ("ev", "sM_read1"):
                    j = max(j for j in range(i) if ops[j][:2] == ("sync", "Scale0Ready"))
                    ops.insert(j, ops.pop(i))
            return ops
        monkeypatch.setattr(seesaw, "wg1", early)
    elif broken == "rope_refill_early":  # tile b + 3's rope box refilled at the top of the pair by
        # warpgroup 0, which does not know that warpgroup 1's S(b + 1) over it is complete
        def refill(n, own):
            ops = own(n)
            for k in range(n // 2):
                b = 2 * k
                if b + 3 < n:
                    if own is wg0:
                        ops.insert(ops.index(("ev", "sM_read0", k)), ("ev", "load8", b + 3))
                    else:
                        ops.remove(("ev", "load8", b + 3))
            return ops
        monkeypatch.setattr(seesaw, "wg0", lambda n: refill(n, wg0))
        monkeypatch.setattr(seesaw, "wg1", lambda n: refill(n, wg1))
    else:  # waits for a box one phase late
        monkeypatch.setattr(seesaw, "wg1", lambda n: [
            (k, b, t + 1) if k == "mwait" else (k, b, t) for k, b, t in wg1(n)])
    with pytest.raises((AssertionError, KeyError)):
        seesaw.holds(seed=3, rounds=40)


@pytest.mark.parametrize("n_tok", [1, 63, 64, 65, 128, 129, 191, 320, 700])
def test_seesaw_arithmetic_is_softmax_attention(seesaw, n_tok):
    # The kernel's pairwise online softmax, in float64: equal to softmax(S) V up to rounding,
    # with a row past the request and (past two tiles) a tile of a bad page id masked.
    bad = (1,) if n_tok > 128 else ()
    assert seesaw.numerics(8, n_tok, seed=n_tok, masked_rows=(3,), bad_tiles=bad) < 1e-9


@pytest.mark.parametrize("broken", ["p0_rescale", "o1_alpha0"])
def test_seesaw_arithmetic_check_catches_a_missing_rescale(seesaw, broken):
    assert seesaw.numerics(8, 700, seed=7, broken=broken) > 1e-3
