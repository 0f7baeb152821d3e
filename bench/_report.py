"""Tables on stdout, JSON and plots for the benchmark modes."""

import json
import os
import platform
import subprocess
from dataclasses import dataclass, field


@dataclass
class Table:
    title: str
    columns: list
    rows: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    # Optional plot: (x column, [y columns], log-x, log-y) for lines, or
    # ("bars", [label columns], [value columns]) for one bar group per row.
    plot: tuple = None

    # Where each measured row ticks a progress dot (set by the bench runner;
    # None when replaying JSON), so a long sweep shows it is moving.
    progress = None

    def add(self, *row):
        self.rows.append(list(row))
        if Table.progress is not None:
            Table.progress.write(".")
            Table.progress.flush()

    def render(self) -> str:
        cells = [[_fmt(c) for c in r] for r in self.rows]
        widths = [max([len(str(h))] + [len(r[i]) for r in cells]) for i, h in enumerate(self.columns)]
        line = "  ".join(str(h).rjust(w) for h, w in zip(self.columns, widths))
        out = [f"== {self.title}", line, "-" * len(line)]
        out += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
        out += [f"   {n}" for n in self.notes]
        return "\n".join(out)


def _fmt(v) -> str:
    if isinstance(v, float):
        if v != v:
            return "-"
        if abs(v) >= 100:
            return f"{v:.1f}"
        if abs(v) >= 1:
            return f"{v:.3f}"
        return f"{v:.4f}"
    return str(v)


def machine(ctx) -> dict:
    import torch

    import mlacore

    info = {
        "mlacore": mlacore.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "device": str(ctx.device),
        "built_with_cuda": mlacore.built_with("cuda"),
        "built_with_hip": mlacore.built_with("hip"),
    }
    if ctx.gpu:
        props = torch.cuda.get_device_properties(ctx.device)
        info.update(gpu=props.name, sms=props.multi_processor_count, cuda=torch.version.cuda)
        try:
            info["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            info["driver"] = "unknown"
    # The revision of the checkout the bench runs from (an installed package
    # has none of its own); "unknown" outside a checkout.
    info["git"] = os.environ.get("MLACORE_GIT_REV", "unknown")  # set when run from an exported snapshot
    for where in (os.getcwd(), os.path.dirname(__file__)):
        try:
            rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                 timeout=10, cwd=where).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            rev = ""
        if rev:
            info["git"] = rev
            break
    return info


class Report:
    def __init__(self, ctx, json_path=None):
        self.ctx = ctx
        self.tables = []  # (mode, Table)
        self.skipped = {}
        # Rewritten after every table, so a sweep cut short keeps what it measured.
        self.json_path = json_path
        self._machine = None

    def add(self, mode, table):
        self.tables.append((mode, table))
        print(table.render(), flush=True)
        print(flush=True)
        if self.json_path:
            self.write_json(self.json_path)

    def skip(self, mode, why):
        self.skipped[mode] = why
        print(f"== {mode}: skipped ({why})\n", flush=True)

    def write_json(self, path):
        if self._machine is None:
            self._machine = machine(self.ctx)
        doc = {
            "machine": self._machine,
            "skipped": self.skipped,
            "tables": [{"mode": m, "title": t.title, "columns": t.columns, "rows": t.rows, "notes": t.notes,
                        "plot": t.plot} for m, t in self.tables],
        }
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)

    def write_plots(self, directory):
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("--plot: matplotlib is not installed; no plots written")
            return
        os.makedirs(directory, exist_ok=True)
        for i, (mode, t) in enumerate(self.tables):
            if not t.plot:
                continue
            if t.plot[0] == "bars":
                fig, ax = plt.subplots(figsize=(7, 0.35 * len(t.rows) + 1.5))
                _bars(ax, t)
            else:
                fig, ax = plt.subplots(figsize=(6, 4))
                _lines(ax, t)
            ax.set_title(t.title, fontsize=9)
            ax.legend(fontsize=8)
            ax.grid(True, alpha=0.3)
            fig.tight_layout()
            fig.savefig(os.path.join(directory, f"{mode}-{i}.png"), dpi=90)
            plt.close(fig)


def _lines(ax, t):
    x, ys, logx, logy = t.plot
    xi = t.columns.index(x)
    for y in ys:
        yi = t.columns.index(y)
        ax.plot([r[xi] for r in t.rows], [r[yi] for r in t.rows], marker="o", label=y)
    ax.set_xscale("log" if logx else "linear")
    ax.set_yscale("log" if logy else "linear")
    ax.set_xlabel(x)


def _bars(ax, t):
    _, labels, values = t.plot
    li = [t.columns.index(c) for c in labels]
    names = ["/".join(str(r[i]) for i in li) for r in t.rows]
    height = 0.8 / len(values)
    for k, v in enumerate(values):
        vi = t.columns.index(v)
        ax.barh([j + k * height for j in range(len(t.rows))], [r[vi] for r in t.rows], height=height, label=v)
    ax.set_yticks([j + height * (len(values) - 1) / 2 for j in range(len(t.rows))])
    ax.set_yticklabels(names, fontsize=7)
    ax.invert_yaxis()
    ax.set_ylabel("/".join(labels), fontsize=8)
    ax.axvline(1.0, color="gray", linewidth=0.8)


def load_json(path):
    """The machine description and [(mode, Table)] of a JSON written by --json."""
    with open(path) as f:
        doc = json.load(f)
    tables = [(t["mode"], Table(t["title"], t["columns"], t["rows"], t["notes"],
                                tuple(t["plot"]) if t.get("plot") else None)) for t in doc["tables"]]
    return doc.get("machine", {}), tables
