"""What an installed mlacore offers a user besides its ops: typing (py.typed
and stubs that a type checker reads), version macros that match the library,
the command line (bench listed, --version, outputs checked before any
measuring) and backends() answering for this machine."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mlacore

PKG = Path(mlacore.__file__).resolve().parent
INSTALLED = (PKG / "include" / "mlacore" / "mlacore.h").is_file()


def run_module(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "mlacore", *args], capture_output=True, text=True, timeout=300,
                          **kwargs)


@pytest.mark.skipif(not INSTALLED, reason="an editable install keeps the stubs in the build tree")
def test_package_ships_py_typed_and_stubs():
    assert (PKG / "py.typed").is_file()
    stub = (PKG / "_mlacore.pyi").read_text()
    assert "def version() -> str" in stub and "class Plan" in stub


def _mypy(tmp_path, source):
    pytest.importorskip("mypy")
    if not INSTALLED:
        pytest.skip("an editable install keeps the stubs in the build tree")
    f = tmp_path / "check.py"
    f.write_text(source)
    # mypy finds mlacore where this interpreter does; torch is followed as Any (pyproject's [tool.mypy]).
    env = dict(os.environ, MYPYPATH="", PYTHONPATH=str(PKG.parent))
    config = Path(__file__).resolve().parent.parent / "pyproject.toml"
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(config), "--no-incremental", str(f)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)


def test_mypy_reads_the_stubs_and_rejects_a_wrong_type(tmp_path):
    good = _mypy(tmp_path, "from mlacore import _mlacore\nv: str = _mlacore.version()\n"
                           "n: int = _mlacore.plan_schedule_size(4, 8)\n")
    assert good.returncode == 0, good.stdout + good.stderr
    bad = _mypy(tmp_path, "from mlacore import _mlacore\nv: int = _mlacore.version()\n")
    assert bad.returncode == 1 and "Incompatible types in assignment" in bad.stdout, bad.stdout + bad.stderr


def test_version_macros_match_the_library():
    header = (Path(mlacore.get_include()) / "mlacore" / "version.h").read_text()
    parts = [re.search(rf"#define MLACORE_VERSION_{p} (\d+)\n", header).group(1) for p in ("MAJOR", "MINOR", "PATCH")]
    assert ".".join(parts) == mlacore.__version__


def test_help_lists_bench_and_version_is_argparse():
    res = run_module("--help")
    assert res.returncode == 0 and "bench" in res.stdout and "--version" in res.stdout
    assert run_module("--version").stdout.strip() == mlacore.__version__
    bench_help = run_module("bench", "--help")
    assert bench_help.returncode == 0 and "--mode" in bench_help.stdout and "--plot" in bench_help.stdout


def test_bench_refuses_a_plot_it_cannot_write_before_measuring(tmp_path):
    # matplotlib made unimportable in the child, whether or not it is installed here.
    code = ("import sys; sys.modules['matplotlib'] = None; from mlacore.__main__ import main; "
            f"sys.exit(main(['bench', '--mode', 'overhead', '--device', 'cpu', '--plot', {str(tmp_path)!r}]))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "--plot needs matplotlib" in res.stderr
    assert "host time per call" not in res.stdout  # nothing was measured
    res = run_module("bench", "--mode", "overhead", "--json", str(tmp_path / "missing-dir" / "out.json"))
    assert res.returncode == 2 and "cannot write" in res.stderr


def test_backends_reports_what_runs_here():
    native = mlacore.backends()["native"]
    assert native["available"] and native["devices"][0] == "cpu"
    built = [d for d in ("cuda", "hip") if mlacore.built_with(d)]
    assert native["built_with"] == built
    gpu_here = torch.cuda.is_available()
    for name in built:
        assert (name in native["devices"]) == (gpu_here and (name == "hip") == bool(torch.version.hip))
    if set(native["devices"]) != {"cpu", *built}:
        assert native["devices_note"]  # says why a compiled backend serves nothing here
    json.dumps(native)  # plain data


def test_bench_header_and_json_schema(tmp_path):
    out = tmp_path / "b.json"
    res = run_module("bench", "--mode", "overhead", "--device", "cpu", "--repeats", "5", "--json", str(out))
    assert res.returncode == 0, res.stderr
    first = res.stdout.splitlines()[0]
    assert first.startswith(f"# mlacore {mlacore.__version__}") and f"torch {torch.__version__}" in first
    assert "cores)" in first
    assert "# CPU run:" in res.stdout
    doc = json.loads(out.read_text())
    assert doc["schema_version"] == 1
    (table,) = doc["tables"]
    assert table["units"]["us/call"] == "us" and table["units"]["x torch.add_"] == "x"
    assert table["better"]["us/call"] == "lower"
    assert "issue" not in res.stdout.lower()
