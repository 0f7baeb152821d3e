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
    # Unit of each column where its name does not say it (column_unit reads the name otherwise).
    units: dict = field(default_factory=dict)

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


SCHEMA_VERSION = 1  # of the --json document: bump when a field changes meaning


def column_unit(table, column) -> str:
    """The unit of a column: "ms", "us", "GB/s", "TFLOP/s", "GB", "MB", "x" (a ratio) or "" (a count or a label)."""
    if column in table.units:
        return table.units[column]
    name = str(column)
    for unit in ("GB/s", "TFLOP/s"):
        if unit in name:
            return unit
    words = name.replace("_", " ").replace("/", " ").split()
    if "ms" in words:
        return "ms"
    if "us" in words:
        return "us"
    if "speedup" in words or "x" in words or "ratio" in words or " / " in name:
        return "x"
    for unit in ("GB", "MB"):
        if unit in words:
            return unit
    return ""


def better(table, column) -> str:
    """"lower" or "higher" (is better) for a measured column, "" for labels and counts."""
    unit = column_unit(table, column)
    if unit in ("ms", "us"):
        return "lower"
    if unit in ("GB/s", "TFLOP/s"):
        return "higher"
    if unit == "x":
        name = str(column)
        # "speedup", "a / mlacore" and "x fa3" put mlacore's time in the denominator.
        if "speedup" in name or name.endswith("/ mlacore") or name.startswith("x fa3"):
            return "higher"
        return "lower"  # "x floor", "x torch.add_", "ratio": mlacore's time over a baseline's
    return ""


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(ctx) -> dict:
    import torch

    import mlacore

    info = {
        "mlacore": mlacore.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": _cpu_model(),
        "cpu_cores": os.cpu_count(),
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

    def machine(self) -> dict:
        """The machine description (measured once per run)."""
        if self._machine is None:
            self._machine = machine(self.ctx)
        return self._machine

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
        doc = {
            "schema_version": SCHEMA_VERSION,
            "machine": self.machine(),
            "skipped": self.skipped,
            "tables": [{"mode": m, "title": t.title, "columns": t.columns,
                        "units": {c: column_unit(t, c) for c in t.columns},
                        "better": {c: better(t, c) for c in t.columns if better(t, c)},
                        "rows": t.rows, "notes": t.notes, "plot": t.plot} for m, t in self.tables],
        }
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)

    def write_plots(self, directory) -> list:
        """One PNG per plottable table, named by mode and table title; returns the paths written."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        os.makedirs(directory, exist_ok=True)
        written, used = [], set()
        for mode, t in self.tables:
            if not t.plot or not t.rows:
                continue
            if t.plot[0] == "bars":
                fig, ax = plt.subplots(figsize=(8, 0.32 * len(t.rows) * max(1, len(t.plot[2])) + 1.8))
                direction = _bars(ax, t)
            else:
                fig, ax = plt.subplots(figsize=(7, 4.5))
                direction = _lines(ax, t)
            title = t.title if len(t.title) <= 90 else t.title[:87] + "..."
            ax.set_title(f"{title}\n({direction} is better)" if direction else title, fontsize=9)
            ax.legend(fontsize=7, loc="best")
            ax.grid(True, which="both", alpha=0.3)
            fig.tight_layout()
            name = _file_name(mode, t.title, used)
            path = os.path.join(directory, name)
            fig.savefig(path, dpi=100)
            plt.close(fig)
            written.append(path)
        return written


def _file_name(mode, title, used) -> str:
    """mode-title-words.png: lowercase, the title's words up to its first parenthesis, unique in this run."""
    head = title.split("(")[0]
    words = "".join(ch if ch.isalnum() else "-" for ch in head.lower()).strip("-")
    while "--" in words:
        words = words.replace("--", "-")
    base = f"{mode}-{words[:60].strip('-')}" if words else mode
    name, k = base, 2
    while name in used:
        name, k = f"{base}-{k}", k + 1
    used.add(name)
    return name + ".png"


def _axis_label(t, columns) -> str:
    units = {column_unit(t, c) for c in columns}
    unit = units.pop() if len(units) == 1 else ""
    names = {"ms": "time (ms)", "us": "host time per call (us)", "x": "ratio (x)", "GB/s": "bandwidth (GB/s)",
             "TFLOP/s": "throughput (TFLOP/s)", "GB": "GB", "MB": "MB"}
    if len(columns) == 1:
        if unit == "x":
            return f"{columns[0]} (ratio, x)"
        return f"{columns[0]} ({unit})" if unit and unit not in str(columns[0]) else str(columns[0])
    return names.get(unit, ", ".join(map(str, columns)))


def _log_scale_fits(values) -> bool:
    """A log axis where every value is positive and they span more than a decade."""
    vals = [v for v in values if isinstance(v, (int, float)) and v == v]
    return bool(vals) and min(vals) > 0 and max(vals) / min(vals) > 10


def _directions(t, columns) -> str:
    ds = {better(t, c) for c in columns} - {""}
    return ds.pop() if len(ds) == 1 else ""


def _lines(ax, t) -> str:
    """One line per (y column, series): rows that differ in a label column x does not determine
    (a page size swept at every x) form separate series, each sorted by x."""
    x, ys = t.plot[0], t.plot[1]
    xi = t.columns.index(x)
    yis = [t.columns.index(y) for y in ys]
    keys = []
    for ci, c in enumerate(t.columns):
        if ci == xi or ci in yis or any(isinstance(r[ci], float) for r in t.rows):
            continue
        by_x = {}
        for r in t.rows:
            by_x.setdefault(r[xi], set()).add(r[ci])
        if any(len(v) > 1 for v in by_x.values()):
            keys.append(ci)
    series = {}
    for r in t.rows:
        series.setdefault(tuple(r[k] for k in keys), []).append(r)
    for y, yi in zip(ys, yis):
        for key, rows in series.items():
            rows = sorted(rows, key=lambda r: r[xi])
            label = y if not keys else f"{y}, " + ", ".join(f"{t.columns[k]}={v}" for k, v in zip(keys, key))
            ax.plot([r[xi] for r in rows], [r[yi] for r in rows], marker="o", label=label)
    ax.set_xscale("log" if _log_scale_fits([r[xi] for r in t.rows]) else "linear")
    ax.set_yscale("log" if _log_scale_fits([r[yi] for r in t.rows for yi in yis]) else "linear")
    unit = column_unit(t, x)
    ax.set_xlabel(f"{x} ({unit})" if unit and unit not in str(x) else str(x))
    ax.set_ylabel(_axis_label(t, ys))
    return _directions(t, ys)


def _bars(ax, t) -> str:
    _, labels, values = t.plot
    li = [t.columns.index(c) for c in labels]
    names = [", ".join(f"{c}={r[i]}" if len(labels) > 1 else str(r[i]) for c, i in zip(labels, li)) for r in t.rows]
    height = 0.8 / len(values)
    all_values = []
    for k, v in enumerate(values):
        vi = t.columns.index(v)
        vals = [r[vi] for r in t.rows]
        all_values += vals
        ax.barh([j + k * height for j in range(len(t.rows))], vals, height=height, label=v)
    ax.set_yticks([j + height * (len(values) - 1) / 2 for j in range(len(t.rows))])
    ax.set_yticklabels(names, fontsize=7)
    ax.invert_yaxis()
    ax.set_ylabel(", ".join(labels) if len(labels) > 1 else labels[0], fontsize=8)
    if _log_scale_fits(all_values):
        ax.set_xscale("log")
    ax.set_xlabel(_axis_label(t, values))
    if {column_unit(t, v) for v in values} == {"x"}:
        ax.axvline(1.0, color="gray", linewidth=0.8)
    return _directions(t, values)


def load_json(path):
    """The machine description and [(mode, Table)] of a JSON written by --json."""
    with open(path) as f:
        doc = json.load(f)
    if doc.get("schema_version", 1) > SCHEMA_VERSION:
        raise ValueError(f"{path}: schema_version {doc['schema_version']} is newer than this mlacore reads "
                         f"({SCHEMA_VERSION})")
    tables = [(t["mode"], Table(t["title"], t["columns"], t["rows"], t["notes"],
                                tuple(t["plot"]) if t.get("plot") else None, dict(t.get("units", {}))))
              for t in doc["tables"]]
    return doc.get("machine", {}), tables
