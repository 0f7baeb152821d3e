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


def test_attn_mode_runs_every_group_on_the_cpu(tmp_path):
    # The CPU grid: one or two rows of each group (bar, long, ragged, multi), mlacore timed against the
    # floor; fa3 and FlashMLA are GPU-only columns, NaN here, and the notes say why.
    out = tmp_path / "attn.json"
    res = bench("--mode", "attn", "--device", "cpu", "--repeats", "3", "--json", str(out))
    assert res.returncode == 0, res.stderr
    (table,) = [t for t in json.loads(out.read_text())["tables"] if t["mode"] == "attn"]
    col = {c: i for i, c in enumerate(table["columns"])}
    for name in ("group", "kv_len", "qo", "mlacore ms", "x floor", "x fa3", "x FlashMLA", "FlashMLA ms"):
        assert name in col
    rows = table["rows"]
    assert {r[col["group"]] for r in rows} == {"bar", "long", "ragged", "multi"}
    assert all(r[col["mlacore ms"]] > 0 and r[col["floor ms"]] > 0 for r in rows)
    assert all(r[col["x fa3"]] is None or r[col["x fa3"]] != r[col["x fa3"]] for r in rows)  # NaN: no fa3 on a CPU
    ragged = [r for r in rows if r[col["group"]] == "ragged"]
    assert ragged and all(".." in r[col["kv_len"]] for r in ragged)
    assert {r[col["qo"]] for r in rows if r[col["group"]] == "multi"} >= {2}
    assert any("fa3 not measured: CPU run" in n for n in table["notes"])
    assert any("FlashMLA not measured: CPU run" in n for n in table["notes"])

    picked = tmp_path / "picked.json"
    only = bench("--mode", "attn", "--device", "cpu", "--repeats", "3", "--shapes", "ragged+h16,multi+h16",
                 "--json", str(picked))
    assert only.returncode == 0, only.stderr
    (table,) = json.loads(picked.read_text())["tables"]
    assert sorted((r[col["group"]], r[col["heads"]]) for r in table["rows"]) == [("multi", 16), ("ragged", 16)]


def test_attn_grid_selection_ragged_lengths_and_flops():
    from mlacore.bench import _mla, attn

    full = attn.full_grid()
    groups = {s.group for s in full}
    assert groups == {"bar", "long", "large", "ragged", "multi"}
    # The bar shapes at both head counts and every page size; FlashMLA's page size among them.
    bar = {(s.batch, s.kv, s.heads, s.page) for s in full if s.group == "bar"}
    assert bar == {(b, kv, h, p) for b, kv in ((8, 32768), (32, 8192), (32, 32768)) for h in (16, 128)
                   for p in (1, 16, 64)}
    assert {(s.batch, s.kv) for s in full if s.group == "long"} == {(1, 4096), (1, 65536)}
    assert {(s.batch, s.kv) for s in full if s.group == "large"} == {(128, 1024), (256, 2048)}
    assert {s.qo for s in full if s.group == "multi"} == {2, 4} and all(s.causal for s in full if s.qo > 1)
    for s in full:
        if s.group == "ragged":
            assert len(s.lens) == s.batch and min(s.lens) >= 1 and max(s.lens) <= int(s.kv.split("..")[1])
            assert len(set(s.lens)) > s.batch // 2  # spread, not one length
    # Seeded: the same batch every run.
    assert [s.lens for s in attn.full_grid() if s.group == "ragged"] == [s.lens for s in full if s.group == "ragged"]

    assert attn.select(full, "") == full
    picked = attn.select(full, "bar+h128+p64,ragged+h16")
    assert {(s.group, s.heads) for s in picked} == {("bar", 128), ("ragged", 16)}
    assert all(s.page == 64 for s in picked if s.group == "bar") and len(picked) == 3 + 3 * 2
    with pytest.raises(ValueError, match="unknown tag"):
        attn.select(full, "nonsense")
    # Rows outside the grid, after the grid's, in the order given; causal with several query tokens.
    mixed = attn.select(full, "4x32768x128x64,long+h16,2x8192x128x64x2")
    assert [(s.group, s.batch, s.kv, s.heads, s.page, s.qo) for s in mixed[-2:]] == [
        ("given", 4, 32768, 128, 64, 1), ("given", 2, 8192, 128, 64, 2)]
    assert {s.group for s in mixed[:-2]} == {"long"} and mixed[-1].causal and not mixed[-2].causal
    with pytest.raises(ValueError, match=">= 1"):
        attn.select(full, "0x4096x128x64")

    # Ragged page tables: each request gets ceil(len / page) distinct pages of the pool.
    qo, kv_indptr, kv_indices, kv_len = _mla.make_indices(3, 0, 2, 16, 100, "cpu", lens=[1, 40, 33])
    assert kv_indptr.tolist() == [0, 1, 4, 7] and kv_len.tolist() == [1, 40, 33] and qo.tolist() == [0, 2, 4, 6]
    assert len(set(kv_indices.tolist())) == 7
    # FLOPs: every visible (query, key) pair; causal query t of n keys sees n - qo + t + 1.
    assert _mla.flops_of([10], 1, 1, False) == 2 * 10 * 1088
    assert _mla.flops_of([10, 4], 2, 3, True) == 2 * 2 * 1088 * ((8 + 9 + 10) + (2 + 3 + 4))
    assert _mla.flops_of([100] * 4, 128, 1, False) == _mla.flops(4, 100, 128, 1)


def test_append_mode_runs_on_the_cpu(tmp_path):
    # The bandwidth tables (MLA, MHA, concat_and_cache_mla) and the host table; the CUDA-graph and
    # kernel-duration tables are GPU-only and absent here. Every append checks its own rows first.
    out = tmp_path / "append.json"
    res = bench("--mode", "append", "--device", "cpu", "--size", "small", "--repeats", "2", "--json", str(out))
    assert res.returncode == 0, res.stderr
    tables = [t for t in json.loads(out.read_text())["tables"] if t["mode"] == "append"]
    titles = [t["title"] for t in tables]
    assert any(t.startswith("append_paged_mla_kv_cache") for t in titles)
    assert any(t.startswith("append_paged_kv_cache") for t in titles)
    assert any(t.startswith("host time per call") for t in titles)
    assert not any("CUDA graph" in t or "kernel durations" in t for t in titles)
    mla = next(t for t in tables if t["title"].startswith("append_paged_mla_kv_cache"))
    col = {c: i for i, c in enumerate(mla["columns"])}
    assert {r[col["nnz"]] for r in mla["rows"]} == {32, 512, 4096}
    assert all(r[col["x copy_"]] > 0 for r in mla["rows"])


def test_append_bar_lines_count_the_rows_each_bar_covers():
    from mlacore.bench import append
    from mlacore.bench._report import Table

    cols = ["nnz", "page_size", "page_order", "x copy_", "x ceiling", "x flashinfer"]
    t = Table("t", cols)
    nan = float("nan")
    t.add(32, 1, "scrambled", 0.79, 1.3, 1.05)
    t.add(1024, 16, "allocator", 0.81, 1.2, 0.98)
    t.add(8192, 64, "scrambled", 0.5, 0.5, 0.5)  # covered by no bar
    t.add(65536, 64, "scrambled", 0.9, 0.961, 1.7)
    t.add(262144, 1, "allocator", 0.9, 0.99, nan)
    lines = append.bar_lines(t, append.BARS + append.MLA_BARS)
    assert lines == [
        "bar nnz <= 1024 x flashinfer >= 1.0: 1 of 2 rows meet it (NOT met), min 0.980 at nnz 1024 page 16 allocator",
        "bar nnz <= 1024 x copy_ >= 0.8: 1 of 2 rows meet it (NOT met), min 0.790 at nnz 32 page 1 scrambled",
        "bar nnz >= 65536 x ceiling >= 0.97: 1 of 2 rows meet it (NOT met), min 0.961 at nnz 65536 page 64 scrambled",
        "bar nnz >= 65536 x flashinfer >= 1.6: 1 of 1 rows meet it (met), min 1.700 at nnz 65536 page 64 scrambled,"
        " 1 without the column",
    ]
    # The decode-step tables (no page order column): the small-append bars for both ops.
    step = Table("s", append.STEP_COLUMNS)
    step.add(32, 1, 6.0, 6.1, 4.9, 6.1 / 6.0, 4.9 / 6.0, 6.3, 6.2, 4.9, 6.2 / 6.3, 4.9 / 6.3)
    step.add(1024, 64, 6.3, 6.9, 5.6, 6.9 / 6.3, 5.6 / 6.3, 7.7, 7.9, 7.0, 7.9 / 7.7, 7.0 / 7.7)
    assert append.bar_lines(step, append.STEP_BARS) == [
        "bar nnz <= 1024 mla x flashinfer >= 1.0: 2 of 2 rows meet it (met), min 1.017 at nnz 32 page 1",
        "bar nnz <= 1024 mla x copy_ >= 0.8: 2 of 2 rows meet it (met), min 0.817 at nnz 32 page 1",
        "bar nnz <= 1024 mha x flashinfer >= 1.0: 1 of 2 rows meet it (NOT met), min 0.984 at nnz 32 page 1",
        "bar nnz <= 1024 mha x copy_ >= 0.8: 1 of 2 rows meet it (NOT met), min 0.778 at nnz 32 page 1",
    ]
    t.rows = [r for r in t.rows if r[0] != 65536]
    assert append.bar_lines(t, append.MLA_BARS) == [
        "bar nnz >= 65536 x flashinfer >= 1.6: no measured rows (1 without the column)"]


@pytest.mark.parametrize("wrong", [False, True])
def test_attn_mode_checks_mlacore_against_fa3(monkeypatch, wrong):
    # Where fa3 runs, every row's mlacore output is compared with fa3's and the notes give the largest
    # difference, naming the rows past the tolerance. A stand-in fa3 (mlacore's own CPU decode, or that
    # plus an error) runs the check on the CPU.
    import argparse

    import torch

    from mlacore.bench import Context, _mla, attn

    def stand_in(ctx, idx, heads, page_size, dtype, q_nope, q_pe, ckv, kpe, causal=False):
        w = _mla.make_wrapper(ctx, idx, heads, page_size, dtype, causal)
        out = torch.empty_like(q_nope)

        def fn():
            w.run(q_nope, q_pe, ckv, kpe, out=out)
            if wrong:
                out[0, 0, 0] += 1.0

        fn.out = out
        return fn, None

    monkeypatch.setattr(attn, "flashinfer_runner", stand_in)
    ctx = Context(argparse.Namespace(device="cpu", size="small", separate=False, repeats=1,
                                     shapes="bar+h16,multi+h16"))
    (table,) = attn.run(ctx)
    (line,) = [n for n in table.notes if n.startswith("outputs against fa3")]
    assert "over 2 rows" in line
    if wrong:
        assert "DIFFERS" in line and "bar 2/512/16/1/1" in line and "multi 2/200/16/1/2" in line
    else:
        assert "max |diff| 0 " in line and "DIFFERS" not in line
