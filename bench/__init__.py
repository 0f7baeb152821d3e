"""mlacore benchmarks: `python -m mlacore bench [--mode M ...] [--json PATH] [--plot DIR]`.

Every figure is a ratio against a baseline measured in the same run. Modes
live in one module each and use only mlacore's public API. On a GPU the modes
run the full shapes; on the CPU they run small shapes that check the modes
work, and say nothing about GPU speed.
"""

import argparse
import importlib
import os
import sys

from ._report import Report, Table, load_json

SUMMARY = "every figure a ratio against a baseline measured in the same run"

# mode name -> module; a module exposes `run(ctx) -> list[Table]` and may
# expose `supported(ctx) -> str | None` (None when it can run, else why not).
MODES = {
    "overhead": "overhead",
    "append": "append",
    "attn": "attn",
    "pool": "pool",
    "cat": "cat",
    "slots": "slots",
    "plan": "plan",
}


class Context:
    """What every mode gets: the device, sizes to use, and shared options."""

    def __init__(self, args):
        import torch

        if args.device == "auto":
            args.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(args.device)
        self.gpu = self.device.type == "cuda"
        # Small shapes on the CPU, the full ones on a GPU, unless asked.
        self.full = self.gpu if args.size == "auto" else args.size == "full"
        self.separate = args.separate
        self.repeats = args.repeats
        self.shapes = args.shapes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The bench's options, on `parser` (the `bench` subcommand of python -m mlacore)."""
    parser.add_argument("--mode", action="append", choices=sorted(MODES), help="modes to run (default: all)")
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto (default: cuda when available)")
    parser.add_argument("--size", choices=["auto", "small", "full"], default="auto",
                        help="shape set: small on the CPU, full on a GPU by default")
    parser.add_argument("--separate", action="store_true",
                        help="allocate ckv and kpe separately (the non-adjacent layout that forces a copy)")
    parser.add_argument("--repeats", type=int, default=0, help="timed repetitions (0: per mode default)")
    parser.add_argument("--shapes", default="",
                        help="attn rows to run: comma-separated tag sets joined by '+', tags being a group "
                             "(bar, long, large, ragged, multi), h<heads> and p<page>, or rows outside the grid "
                             "as BATCHxKVxHEADSxPAGE[xQO]; e.g. bar+h128,ragged,4x32768x128x64")
    parser.add_argument("--json", metavar="PATH", help="write every figure and the machine description here")
    parser.add_argument("--plot", metavar="DIR", help="write one PNG per table here (needs matplotlib)")
    parser.add_argument("--from-json", metavar="PATH",
                        help="measure nothing: print (and with --plot, plot) the figures of an earlier --json run")


def main(argv=None) -> int:
    """`python -m mlacore bench` with its own argument list."""
    parser = argparse.ArgumentParser(prog="python -m mlacore bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


def _outputs_problem(args) -> str | None:
    """Why a requested output (--plot, --json) cannot be produced, checked before measuring anything."""
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return "--plot needs matplotlib, which is not installed (pip install matplotlib, or mlacore[bench])"
        if os.path.exists(args.plot) and not os.path.isdir(args.plot):
            return f"--plot {args.plot}: exists and is not a directory"
    if args.json:
        parent = os.path.dirname(os.path.abspath(args.json))
        if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
            return f"--json {args.json}: cannot write into {parent}"
    if args.from_json and not os.path.isfile(args.from_json):
        return f"--from-json {args.from_json}: no such file"
    return None


def run(args) -> int:
    """Runs the parsed bench arguments; 0 on success, 2 when a requested output cannot be produced."""
    problem = _outputs_problem(args)
    if problem:
        print(f"python -m mlacore bench: error: {problem}", file=sys.stderr)
        return 2
    if args.from_json:
        return _replay(args.from_json, args.plot)

    ctx = Context(args)
    report = Report(ctx, args.json)
    print(header(report.machine()), flush=True)
    if not ctx.gpu:
        print("# CPU run: small shapes that check every mode runs here. The figures say nothing about GPU speed;\n"
              "# run on a GPU (or see docs/PERFORMANCE.md) for those.", flush=True)
    print(flush=True)
    for name in args.mode or list(MODES):
        module = importlib.import_module(f"{__name__}.{MODES[name]}")
        why_not = module.supported(ctx) if hasattr(module, "supported") else None
        if why_not:
            report.skip(name, why_not)
            continue
        print(f"[{name}] running on {ctx.device} ", end="", file=sys.stderr, flush=True)
        Table.progress = sys.stderr
        try:
            tables = module.run(ctx)
        finally:
            Table.progress = None
            print(file=sys.stderr, flush=True)
        for table in tables:
            report.add(name, table)
    if args.json:
        report.write_json(args.json)  # also when every mode was skipped
    if args.plot:
        for path in report.write_plots(args.plot):
            print(f"plot: {path}")
    return 0


def header(m: dict) -> str:
    """One line saying what ran where: versions, device, CPU."""
    device = m.get("gpu") or m.get("device", "?")
    extra = f", CUDA {m['cuda']}, driver {m.get('driver', '?')}" if m.get("gpu") else ""
    return (f"# mlacore {m.get('mlacore')} (git {m.get('git', 'unknown')}), torch {m.get('torch')}, "
            f"python {m.get('python')}; device: {device}{extra}; CPU: {m.get('cpu')} ({m.get('cpu_cores', '?')} cores)")


def _replay(path, plot_dir):
    """Tables (and plots) of a run made elsewhere, e.g. on a GPU host that brings back only JSON."""
    machine_info, tables = load_json(path)
    print(f"# from {path}")
    print(header(machine_info) + "\n")
    report = Report(None)
    for mode, table in tables:
        report.add(mode, table)
    if plot_dir:
        for out in report.write_plots(plot_dir):
            print(f"plot: {out}")
    return 0
