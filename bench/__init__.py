"""mlacore benchmarks: `python -m mlacore bench [--mode M ...] [--json PATH] [--plot DIR]`.

Every figure is a ratio against a baseline measured in the same run. Modes
live in one module each and use only mlacore's public API.
"""

import argparse
import importlib
import sys

from ._report import Report, Table, load_json

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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlacore bench", description=__doc__.splitlines()[0])
    parser.add_argument("--mode", action="append", choices=sorted(MODES), help="modes to run (default: all)")
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto (default: cuda when available)")
    parser.add_argument("--size", choices=["auto", "small", "full"], default="auto",
                        help="shape set: small on the CPU, full on a GPU by default")
    parser.add_argument("--separate", action="store_true",
                        help="allocate ckv and kpe separately (the non-adjacent layout that forces a copy)")
    parser.add_argument("--repeats", type=int, default=0, help="timed repetitions (0: per mode default)")
    parser.add_argument("--shapes", default="",
                        help="attn rows to run: comma-separated tag sets joined by '+', tags being a group "
                             "(bar, long, large, ragged, multi), h<heads> and p<page>; e.g. bar+h128,ragged")
    parser.add_argument("--json", metavar="PATH", help="write every figure and the machine description here")
    parser.add_argument("--plot", metavar="DIR", help="write one PNG per mode here (needs matplotlib)")
    parser.add_argument("--from-json", metavar="PATH",
                        help="measure nothing: print (and with --plot, plot) the figures of an earlier --json run")
    args = parser.parse_args(argv)

    if args.from_json:
        return _replay(args.from_json, args.plot)

    ctx = Context(args)
    report = Report(ctx, args.json)
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
        report.write_plots(args.plot)
    return 0


def _replay(path, plot_dir):
    """Tables (and plots) of a run made elsewhere, e.g. on a GPU host that brings back only JSON."""
    machine, tables = load_json(path)
    print(f"# from {path}: {machine.get('gpu', machine.get('device', '?'))}, mlacore {machine.get('mlacore')} "
          f"(git {machine.get('git')}), torch {machine.get('torch')}\n")
    report = Report(None)
    for mode, table in tables:
        report.add(mode, table)
    if plot_dir:
        report.write_plots(plot_dir)
    return 0
