"""MLA decode time against FlashInfer's fa3 MLA, FlashMLA and the bare-read floor.

The grid (issue 32): the bar shapes (batch, kv_len) in (8, 32768), (32, 8192),
(32, 32768) at heads 16 and 128 and page sizes 1, 16 and 64; batch 1 at kv 4096
and 65536; batch 128 at kv 1024 and 256 at kv 2048; ragged batches (seeded,
lengths uniform over wide ranges) at heads 16 and 128; 2 and 4 query tokens a
request (causal). Every row times mlacore, FlashInfer's fa3 (when `import
flashinfer` works) and FlashMLA (page size 64, when `import flash_mla` works) in
the same process, in alternating rounds (L2 flushed before every call, CUDA
events, medians). Ratios are the other's time over mlacore's (> 1: mlacore is
faster); the notes give their geometric means.

Bars: x fa3 >= 1.00 at every shape and a geometric mean >= 1.05; heads=128 at
page 64 at least FlashMLA's throughput (x FlashMLA >= 1.00); heads=16 at <= 1.05x
the floor at the bar shapes.

`--shapes` picks rows: a comma-separated list of tag sets joined by '+', a row
kept when every tag of one set is among its tags: its group (bar, long, large,
ragged, multi), h<heads> and p<page>. `--shapes bar+h128,ragged` runs the bar
shapes at heads 128 and every ragged row. A part BATCHxKVxHEADSxPAGE[xQO] adds
a row of its own outside the grid (group "given"; causal when QO > 1), e.g.
`--shapes 4x32768x128x64,2x8192x128x64x2`. On an H200 the whole grid (51 rows,
3 rounds of 20 calls for each contender) ran in about 50 s with fa3 and
FlashMLA both present, set-up, floors and the naive baseline included (plus
FlashInfer's JIT compilation where its cache is cold).
"""

import math
import os
import re
from typing import NamedTuple, Optional

import torch

from ._mla import (OUT_TOL, DecodeCase, flashinfer_runner, flashmla_runner, floor_ms, flops_of, kv_bytes,
                   max_diff, naive_decode, ragged_lens, timer)
from ._report import Table
from ._timing import alternating


class Shape(NamedTuple):
    group: str
    batch: int
    kv: object  # tokens a request, or "lo..hi" for a ragged batch
    heads: int
    page: int
    qo: int = 1
    lens: Optional[tuple] = None  # per-request lengths of a ragged batch

    @property
    def causal(self):
        return self.qo > 1

    def tags(self):
        return {self.group, f"h{self.heads}", f"p{self.page}"}

    def label(self):
        return f"{self.group} {self.batch}/{self.kv}/{self.heads}/{self.page}/{self.qo}"


def _ragged(batch, lo, hi, heads, page, seed):
    return Shape("ragged", batch, f"{lo}..{hi}", heads, page, 1, tuple(ragged_lens(batch, lo, hi, seed)))


def full_grid():
    rows = []
    for heads in (16, 128):
        for batch, kv in ((8, 32768), (32, 8192), (32, 32768)):
            rows += [Shape("bar", batch, kv, heads, page) for page in (1, 16, 64)]
    for heads in (16, 128):
        for batch, kv in ((1, 4096), (1, 65536)):
            rows += [Shape("long", batch, kv, heads, page) for page in (1, 64)]
        for batch, kv in ((128, 1024), (256, 2048)):
            rows += [Shape("large", batch, kv, heads, page) for page in (1, 64)]
        for page in (1, 64):
            rows.append(_ragged(32, 1, 16384, heads, page, seed=32))
            rows.append(_ragged(96, 1, 4096, heads, page, seed=96))
            rows.append(_ragged(256, 1, 2048, heads, page, seed=256))
    for heads in (16, 128):
        rows += [Shape("multi", 16, 8192, heads, 64, qo) for qo in (2, 4)]
    rows.append(Shape("multi", 16, 8192, 128, 1, 2))
    return rows


def small_grid():
    """CPU-sized rows, one or two of each group (the CPU path is a scalar loop)."""
    return [Shape("bar", 2, 512, 16, 1), Shape("bar", 1, 100, 128, 64), Shape("long", 1, 700, 16, 16),
            _ragged(3, 1, 300, 16, 16, seed=3), _ragged(2, 1, 80, 128, 1, seed=4), Shape("multi", 2, 200, 16, 1, 2),
            Shape("multi", 1, 70, 128, 64, 4)]


_EXPLICIT = re.compile(r"^(\d+)x(\d+)x(\d+)x(\d+)(?:x(\d+))?$")


def _explicit(part):
    """A `--shapes` part BATCHxKVxHEADSxPAGE[xQO] as a row of group "given", or None."""
    m = _EXPLICIT.match(part)
    if not m:
        return None
    batch, kv, heads, page = (int(g) for g in m.groups()[:4])
    qo = int(m.group(5) or 1)
    if min(batch, kv, heads, page, qo) < 1:
        raise ValueError(f"--shapes: {part}: every field must be >= 1")
    return Shape("given", batch, kv, heads, page, qo)


def select(rows, spec):
    """The rows `spec` (see the module's doc) keeps; all of them for None or ''. Explicit parts
    (BATCHxKVxHEADSxPAGE[xQO]) add their rows after the grid's, in the order given."""
    if not spec:
        return rows
    given, sets = [], []
    for part in (part for part in spec.split(",") if part):
        row = _explicit(part)
        if row is None:
            sets.append(set(part.split("+")))
        else:
            given.append(row)
    known = set().union(*(r.tags() for r in full_grid() + small_grid()))
    for s in sets:
        if not s <= known:
            raise ValueError(f"--shapes: unknown tag(s) {sorted(s - known)}; known: {sorted(known)} "
                             "(or a row BATCHxKVxHEADSxPAGE[xQO])")
    return [r for r in rows if any(s <= r.tags() for s in sets)] + given


def _geomean(xs):
    xs = [x for x in xs if x == x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def _summary(name, rows, col, t):
    i = t.columns.index(col)
    vals = [(r[i], r) for r in rows if r[i] == r[i]]
    if not vals:
        return None
    worst, wrow = min(vals, key=lambda v: v[0])
    below = sum(1 for v, _ in vals if v < 1.0)
    label = "/".join(str(wrow[t.columns.index(c)]) for c in ("batch", "kv_len", "heads", "page", "qo"))
    return (f"{name}: geomean {_geomean([v for v, _ in vals]):.3f} over {len(vals)} rows, "
            f"min {worst:.3f} at batch/kv/heads/page/qo {label}, {below} below 1.00")


def run(ctx):
    dtype = torch.bfloat16
    measure = timer(ctx, ctx.repeats or 20)
    rounds = 3 if ctx.gpu else 1
    rows = select(full_grid() if ctx.full else small_grid(), getattr(ctx, "shapes", None))
    schedule = os.environ.get("MLACORE_SCHEDULE", "")
    t = Table(f"MLA decode on {ctx.device} ({'separate' if ctx.separate else 'adjacent'} ckv/kpe, bf16"
              f"{', MLACORE_SCHEDULE=' + schedule if schedule else ''})",
              ["group", "batch", "kv_len", "heads", "page", "qo", "mlacore ms", "floor ms", "x floor", "TFLOP/s",
               "GB/s", "fa3 ms", "fa3 TFLOP/s", "fa3 x floor", "x fa3", "FlashMLA ms", "FlashMLA TFLOP/s",
               "x FlashMLA", "cat path ms", "naive ms"],
              plot=("bars", ["batch", "kv_len", "heads", "page", "qo"], ["x fa3", "x FlashMLA"]))
    notes = set()
    errs = []  # (row, max |mlacore - fa3|) of every row fa3 ran
    floors = {}
    for s in rows:
        lens = list(s.lens) if s.lens else [s.kv] * s.batch
        num_pages = sum(-(-n // s.page) for n in lens) + 8
        case = DecodeCase(ctx, s.batch, s.kv if isinstance(s.kv, int) else 0, s.heads, s.page, num_pages, dtype,
                          lens=lens, qo=s.qo, causal=s.causal)
        nbytes = kv_bytes(1, sum(lens))
        if nbytes not in floors:
            floors[nbytes] = floor_ms(ctx, nbytes, dtype, measure)
        floor = floors[nbytes]
        fi, why = flashinfer_runner(ctx, case.idx, s.heads, s.page, dtype, case.q_nope, case.q_pe, case.ckv, case.kpe,
                                    causal=s.causal)
        if why:
            notes.add(f"fa3 not measured: {why}")
        fm, why = flashmla_runner(ctx, case)
        if why:
            notes.add(why)
        if fi is not None:
            # A time is only worth reporting for a right answer: mlacore's output against fa3's.
            case.run()
            fi()
            errs.append((s.label(), max_diff(case.out, fi.out)))
        ms, fi_ms, fm_ms = alternating(measure, [case.run, fi, fm], rounds)
        cat_ms = naive_ms = float("nan")
        if s.group == "bar" and s.page in (1, 64):
            cat_ms = measure(case.cat_path)
            if kv_bytes(s.batch, s.kv) * 2 < (8 << 30 if ctx.gpu else 1 << 28):
                naive_ms = measure(lambda: naive_decode(case.q_nope, case.q_pe, case.ckv, case.kpe, case.idx, s.page))
        fl = flops_of(lens, s.heads, s.qo, s.causal)
        tflops = (lambda x: fl / x / 1e9) if s.heads >= 64 else (lambda x: float("nan"))
        t.add(s.group, s.batch, s.kv, s.heads, s.page, s.qo, ms, floor, ms / floor, tflops(ms), nbytes / ms / 1e6,
              fi_ms, tflops(fi_ms), fi_ms / floor, fi_ms / ms, fm_ms, tflops(fm_ms), fm_ms / ms, cat_ms, naive_ms)
        case = fi = fm = None  # this row's tensors go before the next row allocates its own
        if ctx.gpu:
            torch.cuda.empty_cache()
    t.notes.append("floor: torch sum over a contiguous tensor of the same KV byte count (one read, L2 flushed)")
    t.notes.append("TFLOP/s (heads=128 rows) counts 2*heads*(576+512) per visible (query, key) pair; "
                   "GB/s counts KV bytes only")
    t.notes.append("x fa3 = fa3 time / mlacore time, x FlashMLA = FlashMLA time / mlacore time (> 1: mlacore faster); "
                   f"medians of {rounds} alternating round(s)")
    t.notes.append("ragged rows: kv_len lo..hi, lengths uniform in it (seeded); qo > 1 rows are causal")
    for name, col in (("x fa3", "x fa3"), ("x FlashMLA", "x FlashMLA")):
        line = _summary(name, t.rows, col, t)
        if line:
            t.notes.append(line)
    line = _summary("x FlashMLA at heads=128", [r for r in t.rows if r[3] == 128], "x FlashMLA", t)
    if line:
        t.notes.append(line)
    if errs:
        bad = [f"{row} ({e:.3g})" for row, e in errs if not e < OUT_TOL]
        t.notes.append(f"outputs against fa3: max |diff| {max(e for _, e in errs):.3g} over {len(errs)} rows"
                       + (f"; DIFFERS (>= {OUT_TOL}) at {', '.join(bad)}" if bad else f" (tolerance {OUT_TOL})"))
    t.notes.append("bars: x fa3 >= 1.00 at every row and geomean >= 1.05; x FlashMLA >= 1.00 at heads=128; "
                   "heads=16 bar rows x floor <= 1.05")
    t.notes.extend(sorted(notes))
    return [t]
