"""The wgmma decode kernel's barrier protocol, as tests/_wgmma_barrier_model.py
transcribes it (no GPU): the protocol holds for every tile count, and the model
still rejects the mistakes it exists to catch, so a change to either that
weakens it fails here."""

import importlib.util
import pathlib
import random

import pytest

MODEL = pathlib.Path(__file__).resolve().parent / "_wgmma_barrier_model.py"


@pytest.fixture()
def model():
    spec = importlib.util.spec_from_file_location("wgmma_barrier_model", MODEL)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


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
