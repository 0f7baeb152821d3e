"""The main job, `python -m mlacore bench`, from the installed package: a
quick mode runs, writes JSON with the machine and its figures, and the JSON
replays (and plots, when matplotlib is installed) elsewhere."""

import json
import subprocess
import sys

import pytest


def bench(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "mlacore", "bench", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_bench_runs_a_mode_writes_json_and_replays_it(tmp_path):
    out = tmp_path / "bench.json"
    res = bench("--mode", "overhead", "--device", "cpu", "--repeats", "20", "--json", str(out))
    assert res.returncode == 0, res.stderr
    assert "torch.add_ (baseline)" in res.stdout and "core no-op" in res.stdout
    doc = json.loads(out.read_text())
    assert doc["machine"]["mlacore"] and doc["machine"]["torch"]
    (table,) = [t for t in doc["tables"] if t["mode"] == "overhead"]
    calls = {row[0]: row for row in table["rows"]}
    assert calls["torch.add_ (baseline)"][3] == pytest.approx(1.0)
    assert all(row[2] > 0 for row in table["rows"])

    replay = bench("--from-json", str(out))
    assert replay.returncode == 0, replay.stderr
    assert "core no-op" in replay.stdout


def test_bench_plots_from_json_when_matplotlib_is_there(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "bench.json"
    assert bench("--mode", "overhead", "--device", "cpu", "--repeats", "10", "--json", str(out)).returncode == 0
    res = bench("--from-json", str(out), "--plot", str(tmp_path / "plots"))
    assert res.returncode == 0, res.stderr
    assert list((tmp_path / "plots").glob("overhead-*.png"))


def test_bench_rejects_an_unknown_mode():
    res = bench("--mode", "nonsense")
    assert res.returncode != 0 and "invalid choice" in res.stderr
