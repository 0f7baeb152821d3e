"""Paged append time against torch copy_ of the same bytes, FlashInfer, and the
scatter ceiling; host time per call next to torch.add_.

MLA: append_ckv [nnz, 512] and append_kpe [nnz, 64] (the two halves of one
[nnz, 576] source) into the halves of one [P, S, 576] cache (--separate:
two separate caches). MHA: K and V [nnz, 8, 128] into a (K, V) NHD cache.
concat_and_cache_mla: the same MLA rows into one [P, S, 576] cache through a
slot mapping. All bf16. Appends of up to 1024 tokens are decode steps (one
new token a request after 0-255 cached ones: batch = nnz), larger ones chunks
of up to 64 requests. Two page orders: "scrambled" (a random permutation of
the pool, so page size 1 puts every token somewhere else) and "allocator"
(pages in the order an allocator hands them out: consecutive, with one in
eight taken from elsewhere in the pool, as reused pages are).

Columns: x copy_ = copy_ time / append time (copy_ moves the same bytes
contiguously); x ceiling = scatter-ceiling time / append time, where the
ceiling writes the same rows to host-precomputed slots with torch ops (no
page-table lookup; index_copy_ and index_put_ on 16-byte elements, the faster
of the two); x flashinfer = FlashInfer time / append time.
Bars (H200): nnz <= 1024: x flashinfer >= 1 and x copy_ >= 0.8 (append <=
1.25x copy_), MLA and MHA, pages 1/16/64; nnz >= 65536: x ceiling >= 0.97,
MLA and MHA, and MLA x flashinfer >= 1.6; host time at nnz=32 <= 1.3x
torch.add_.
On a GPU two more tables give the decode-step appends (scrambled pages)
beside FlashInfer's and copy_'s: each call captured in a CUDA graph and timed
by events around the graph's replay (how an engine that replays its decode
steps runs them), and the durations of the kernels they launch
(torch.profiler): the device's own time, which the events of the tables above
see under about 3 us of overhead a call and its jitter.
"""

import torch

import mlacore

from ._report import Table
from ._timing import L2Flush, alternating, cpu_ms, device_ms, host_us_paired, kernel_us, settle

HEADS, HEAD_DIM = 8, 128
ORDERS = ("scrambled", "allocator")
STEP_MAX_NNZ = 1024  # appends up to this size are decode steps (one token a request)
# The bars of the bandwidth tables, by row: (the rows' label, which rows, column, floor);
# MLA_BARS apply to the MLA append alone.
_SMALL = (f"nnz <= {STEP_MAX_NNZ}", lambda nnz: nnz <= STEP_MAX_NNZ)
_LARGE = ("nnz >= 65536", lambda nnz: nnz >= 65536)
BARS = [(*_SMALL, "x flashinfer", 1.0), (*_SMALL, "x copy_", 0.8), (*_LARGE, "x ceiling", 0.97)]
MLA_BARS = [(*_LARGE, "x flashinfer", 1.6)]
# The small-append bars on the decode-step tables (every row is a decode step).
STEP_BARS = [(*_SMALL, f"{op} x {peer}", floor)
             for op in ("mla", "mha") for peer, floor in (("flashinfer", 1.0), ("copy_", 0.8))]


def _flashinfer():
    try:
        import flashinfer

        return flashinfer
    except Exception:  # absent, or present but broken: the bench goes on without it
        return None


def _page_order(pages, order, gen):
    if order == "scrambled":
        return torch.randperm(pages, generator=gen)
    ids = torch.arange(pages)
    moved = torch.nonzero(torch.rand(pages, generator=gen) < 0.125).flatten()
    ids[moved] = ids[moved[torch.randperm(moved.numel(), generator=gen)]]
    return ids


class Problem:
    """Page table, slots and tensors for one (nnz, page_size, page order) point."""

    def __init__(self, nnz, page_size, device, separate, gen, order="scrambled", step=False):
        # step: a decode step, one new token per request (batch = nnz) after a history of 0-255
        # tokens already in the cache; else chunks of new tokens, up to 64 requests from position 0.
        if step:
            batch = nnz
            history = torch.randint(0, 256, (batch,), generator=gen).tolist()
            per = [1] * batch
        else:
            batch = max(min(nnz // 16, 64), 1)
            per = [nnz // batch + (1 if b < nnz % batch else 0) for b in range(batch)]
            history = [0] * batch
        total = [h + n for h, n in zip(history, per)]
        need = [(n + page_size - 1) // page_size for n in total]
        self.batch = batch
        self.pages = sum(need)
        indptr = torch.zeros(batch + 1, dtype=torch.int32)
        indptr[1:] = torch.tensor(need).cumsum(0)
        self.kv_indptr = indptr.to(device)
        self.kv_indices = _page_order(self.pages, order, gen).to(torch.int32).to(device)
        self.kv_last_page_len = torch.tensor([(n - 1) % page_size + 1 for n in total], dtype=torch.int32).to(device)
        self.batch_indices = torch.repeat_interleave(torch.arange(batch, dtype=torch.int32),
                                                     torch.tensor(per)).to(device)
        self.positions = torch.cat([torch.arange(h, h + n, dtype=torch.int32) for h, n in zip(history, per)]).to(device)
        self.page_size = page_size
        self.nnz = nnz
        self.order = order
        self.device = device
        self.separate = separate
        self.gen = gen
        page, off = self.slots()
        self.slot_mapping = (page * page_size + off).to(torch.int64)  # precomputed on the host side of the bench

    def index_args(self):
        return (self.batch_indices, self.positions)

    def table_args(self):
        return (self.kv_indices, self.kv_indptr, self.kv_last_page_len)

    def slots(self):
        """(page, offset) of every token, for the correctness check."""
        start = self.kv_indptr.long()[self.batch_indices.long()]
        page = self.kv_indices.long()[start + self.positions.long() // self.page_size]
        return page, self.positions.long() % self.page_size

    def mla(self):
        """(source [nnz, 576], ckv, kpe, whole cache or None when separate)."""
        d = self.device
        src = torch.randn(self.nnz, 576, generator=self.gen).to(torch.bfloat16).to(d)
        if self.separate:
            ckv = torch.zeros(self.pages, self.page_size, 512, dtype=torch.bfloat16, device=d)
            kpe = torch.zeros(self.pages, self.page_size, 64, dtype=torch.bfloat16, device=d)
            return src, ckv, kpe, None
        buf = torch.zeros(self.pages, self.page_size, 576, dtype=torch.bfloat16, device=d)
        ckv, kpe = torch.split(buf, [512, 64], -1)
        return src, ckv, kpe, buf

    def mha(self):
        d = self.device
        shape = (self.pages, self.page_size, HEADS, HEAD_DIM)
        key = torch.randn(self.nnz, HEADS, HEAD_DIM, generator=self.gen).to(torch.bfloat16).to(d)
        value = torch.randn(self.nnz, HEADS, HEAD_DIM, generator=self.gen).to(torch.bfloat16).to(d)
        cache = (torch.zeros(shape, dtype=torch.bfloat16, device=d), torch.zeros(shape, dtype=torch.bfloat16, device=d))
        return key, value, cache


def _rows16(t, width):
    """t as [rows, width] viewed in 16-byte elements (complex128), the widest torch moves whole;
    t itself as [rows, width] when the bytes do not split that way."""
    flat = t.reshape(-1, width)
    try:
        return flat.view(torch.complex128)
    except RuntimeError:
        return flat


def _scatter_ceilings(pairs, slots):
    """The scatter ceiling's two forms, each writing every (rows [nnz, w], cache [P, S, ...w])
    pair's rows to `slots` of the cache with torch ops (index_copy_, index_put_); checks what
    each wrote. The ceiling is the faster of the two."""
    views = [(_rows16(rows, rows.shape[-1]), _rows16(cache, rows.shape[-1])) for rows, cache in pairs]

    def by_index_copy():
        for src, dst in views:
            dst.index_copy_(0, slots, src)

    def by_index_put():
        for src, dst in views:
            dst[slots] = src

    for fn in (by_index_copy, by_index_put):
        for _, cache in pairs:
            cache.zero_()
        fn()
        for rows, cache in pairs:
            if not torch.equal(cache.reshape(-1, rows.shape[-1])[slots], rows):
                raise RuntimeError(f"append: the scatter ceiling ({fn.__name__}) wrote the wrong rows")
    return [by_index_copy, by_index_put]


def _timer(ctx, repeats, flush):
    """fn -> its time; on a GPU the median of `repeats` calls (ctx.repeats when given),
    three calls of warm-up (the row settles once, _alternating)."""
    if ctx.gpu:
        return lambda fn: device_ms(fn, repeats=ctx.repeats or repeats, warmup=3, flush=flush, settle_s=0.0)
    return lambda fn: cpu_ms(fn, repeats=ctx.repeats or 10)


def _alternating(ctx, timer, fns, rounds, flush):
    """The contenders of one row in alternating rounds, after one settling warm-up of all of them."""
    if ctx.gpu:
        settle([fn for fn in fns if fn is not None], flush)
    return alternating(timer, fns, rounds)


def _if_it_runs(fn):
    """fn, or None when a first call raises (an installed FlashInfer that refuses this case)."""
    try:
        fn()
    except Exception:
        return None
    return fn


def _row(nnz, batch, page_size, order, nbytes, ms, copy_ms, ceiling_ms, fi_ms):
    return [nnz, batch, page_size, order, nbytes / 1e6, ms, copy_ms, ceiling_ms, fi_ms, nbytes / ms / 1e6,
            copy_ms / ms, ceiling_ms / ms, fi_ms / ms]


def _mla_bytes(nnz):
    """Bytes an MLA append of nnz tokens reads and writes (576 bf16 values a token, each way)."""
    return 2 * nnz * 576 * 2


def _mha_bytes(nnz):
    """Bytes an MHA append of nnz tokens reads and writes (K and V, HEADS x HEAD_DIM bf16 each, each way)."""
    return 2 * 2 * nnz * HEADS * HEAD_DIM * 2


def _copy_fn(nbytes, dev):
    """copy_ of nbytes / 2 bytes (what the append reads, as much again written)."""
    flat_src = torch.empty(nbytes // 4, dtype=torch.bfloat16, device=dev)
    flat_dst = torch.empty_like(flat_src)
    return lambda: flat_dst.copy_(flat_src)


def _mla_rows(p, fi, dev, time_row):
    """One MLA row (mlacore, copy_, FlashInfer, the ceiling) and, for halves of one buffer,
    its concat_and_cache_mla row (None otherwise), after checking where each put the rows.
    The row's tensors end with the call."""
    page, off = p.slots()
    slots = p.slot_mapping
    src, ckv, kpe, buf = p.mla()
    a_ckv, a_kpe = src[:, :512], src[:, 512:]
    run = lambda: mlacore.append_paged_mla_kv_cache(a_ckv, a_kpe, *p.index_args(), ckv, kpe,
                                                    *p.table_args())
    run()
    if not (torch.equal(ckv[page, off], a_ckv) and torch.equal(kpe[page, off], a_kpe)):
        raise RuntimeError(f"append: MLA rows misplaced at nnz={p.nnz}, page_size={p.page_size}")
    nbytes = _mla_bytes(p.nnz)
    cat_run = None
    if buf is not None:
        buf.zero_()
        cat_run = lambda: mlacore.concat_and_cache_mla(a_ckv, a_kpe, buf, slots, "auto", None)
        cat_run()
        if not torch.equal(buf.view(-1, 576)[slots], src):
            raise RuntimeError(f"concat_and_cache_mla: rows misplaced at nnz={p.nnz}, page_size={p.page_size}")
    fi_run = None if fi is None else _if_it_runs(lambda: fi.page.append_paged_mla_kv_cache(
        a_ckv, a_kpe, *p.index_args(), ckv, kpe, *p.table_args()))
    pairs = [(src, buf)] if buf is not None else [(a_ckv.contiguous(), ckv), (a_kpe.contiguous(), kpe)]
    ms, copy_ms, fi_ms, cat_ms, *ceilings = time_row(
        [run, _copy_fn(nbytes, dev), fi_run, cat_run, *_scatter_ceilings(pairs, slots)])
    ceiling_ms = min(ceilings)
    where = (p.nnz, p.batch, p.page_size, p.order, nbytes)
    cat_row = None if cat_run is None else _row(*where, cat_ms, copy_ms, ceiling_ms, float("nan"))
    return _row(*where, ms, copy_ms, ceiling_ms, fi_ms), cat_row


def _mha_row(p, fi, dev, time_row):
    """One MHA (K, V) row, after checking where the append put the rows; its tensors end with the call."""
    page, off = p.slots()
    key, value, cache = p.mha()
    run = lambda: mlacore.append_paged_kv_cache(key, value, *p.index_args(), cache, *p.table_args())
    run()
    if not (torch.equal(cache[0][page, off], key) and torch.equal(cache[1][page, off], value)):
        raise RuntimeError(f"append: K/V rows misplaced at nnz={p.nnz}, page_size={p.page_size}")
    nbytes = _mha_bytes(p.nnz)
    fi_run = None if fi is None else _if_it_runs(lambda: fi.page.append_paged_kv_cache(
        key, value, *p.index_args(), cache, *p.table_args(), kv_layout="NHD"))
    row = HEADS * HEAD_DIM
    pairs = [(key.reshape(p.nnz, row), cache[0]), (value.reshape(p.nnz, row), cache[1])]
    ms, copy_ms, fi_ms, *ceilings = time_row(
        [run, _copy_fn(nbytes, dev), fi_run, *_scatter_ceilings(pairs, p.slot_mapping)])
    return _row(p.nnz, p.batch, p.page_size, p.order, nbytes, ms, copy_ms, min(ceilings), fi_ms)


def _bandwidth_tables(ctx, fi):
    dev = ctx.device
    gen = torch.Generator().manual_seed(0)
    sizes = [32, 128, 512, 1024, 8192, 65536, 262144] if ctx.full else [32, 512, 4096]
    unit = "device_ms" if ctx.gpu else "cpu_ms"
    layout = "separate caches" if ctx.separate else "halves of one [P, S, 576] buffer"
    cols = ["nnz", "batch", "page_size", "page_order", "MB", f"mlacore_{unit}", f"copy_{unit}", f"ceiling_{unit}",
            f"flashinfer_{unit}", "mlacore_GB/s", "x copy_", "x ceiling", "x flashinfer"]
    mla = Table(f"append_paged_mla_kv_cache on {dev}, bf16, {layout}", list(cols))
    mha = Table(f"append_paged_kv_cache on {dev}, bf16, NHD (K, V), H={HEADS} D={HEAD_DIM}", list(cols))
    cat = Table(f"concat_and_cache_mla on {dev}, bf16, one [P, S, 576] cache, int64 slot_mapping", list(cols))
    # Every contender of a row (mlacore, copy_, the scatter ceiling's two forms, FlashInfer,
    # concat_and_cache_mla) is timed in alternating rounds, so drift hits all alike; a decode
    # step's append is a few microseconds within about 0.3 us of event jitter, so its rows take
    # 5 rounds of 40 calls, the others 3 of 10.
    rounds = {True: 5, False: 3} if ctx.gpu else {True: 1, False: 1}
    flush = L2Flush(dev) if ctx.gpu else None
    timers = {True: _timer(ctx, 40, flush), False: _timer(ctx, 10, flush)}
    for nnz in sizes:
        for page_size in (1, 16, 64):
            for order in ORDERS:
                step = nnz <= STEP_MAX_NNZ
                p = Problem(nnz, page_size, dev, ctx.separate, gen, order, step=step)
                time_row = lambda fns: _alternating(ctx, timers[step], fns, rounds[step], flush)
                mla_row, cat_row = _mla_rows(p, fi, dev, time_row)
                mla.add(*mla_row)
                if cat_row is not None:
                    cat.add(*cat_row)
                mha.add(*_mha_row(p, fi, dev, time_row))
    for t in (mla, mha, cat):
        t.notes.append("MB = bytes read + written; x copy_ / x ceiling / x flashinfer = their time / this op's "
                       "(> 1: this op is faster)")
        if ctx.gpu:
            t.notes.append("device time per call, CUDA events, L2 flushed before every call; a row's contenders "
                           "in alternating rounds, medians of 5 rounds x 40 calls up to "
                           f"{STEP_MAX_NNZ} tokens, 3 x 10 above")
        t.plot = ("nnz", ["mlacore_GB/s"], True, False)
    for t, bars in ((mla, BARS + MLA_BARS), (mha, BARS)):
        t.notes.extend(bar_lines(t, bars) if ctx.gpu else
                       ["bars (GPU runs): " + "; ".join(f"{sizes} {col} >= {floor}" for sizes, _, col, floor in bars)])
    tables = [mla, mha]
    if cat.rows:
        cat.notes.append("same sources and slots as the MLA table; no FlashInfer counterpart")
        tables.append(cat)
    return tables


def bar_lines(t, bars):
    """One note a bar: how many of the rows it covers meet it in this run, and the worst of
    them (rows where the column is empty, e.g. no FlashInfer, are left out and counted)."""
    c = {name: i for i, name in enumerate(t.columns)}
    lines = []
    for sizes, covers, col, floor in bars:
        rows = [r for r in t.rows if covers(r[c["nnz"]])]
        vals = [(r[c[col]], r) for r in rows if r[c[col]] == r[c[col]]]
        head = f"bar {sizes} {col} >= {floor}: "
        if not vals:
            lines.append(head + f"no measured rows ({len(rows)} without the column)")
            continue
        worst, w = min(vals, key=lambda v: v[0])
        met = sum(1 for v, _ in vals if v >= floor)
        where = f"nnz {w[c['nnz']]} page {w[c['page_size']]}" + (f" {w[c['page_order']]}" if "page_order" in c else "")
        empty = f", {len(rows) - len(vals)} without the column" if len(vals) < len(rows) else ""
        lines.append(head + f"{met} of {len(vals)} rows meet it{' (met)' if met == len(vals) else ' (NOT met)'}, "
                     f"min {worst:.3f} at {where}{empty}")
    return lines


STEP_COLUMNS = ["nnz", "page_size", "mla_us", "fi_mla_us", "copy_mla_us", "mla x flashinfer", "mla x copy_",
                "mha_us", "fi_mha_us", "copy_mha_us", "mha x flashinfer", "mha x copy_"]


def _step_contenders(dev, fi, nnz, page_size, gen, separate):
    """A decode step's contenders, scrambled pages: [MLA append, FlashInfer's, copy_ of its bytes,
    MHA append, FlashInfer's, copy_ of its bytes, concat_and_cache_mla] (None where one does not
    run), and a check that the MLA and MHA appends' rows sit where they belong."""
    p = Problem(nnz, page_size, dev, separate, gen, "scrambled", step=True)
    src, ckv, kpe, buf = p.mla()
    a_ckv, a_kpe = src[:, :512], src[:, 512:]
    key, value, cache = p.mha()
    idx, tab, slots = p.index_args(), p.table_args(), p.slot_mapping
    fi_mla = fi_mha = None
    if fi is not None:
        fi_mla = _if_it_runs(lambda: fi.page.append_paged_mla_kv_cache(a_ckv, a_kpe, *idx, ckv, kpe, *tab))
        fi_mha = _if_it_runs(lambda: fi.page.append_paged_kv_cache(key, value, *idx, cache, *tab, kv_layout="NHD"))
    cat = None if buf is None else (lambda: mlacore.concat_and_cache_mla(a_ckv, a_kpe, buf, slots, "auto", None))
    fns = [lambda: mlacore.append_paged_mla_kv_cache(a_ckv, a_kpe, *idx, ckv, kpe, *tab), fi_mla,
           _copy_fn(_mla_bytes(nnz), dev),
           lambda: mlacore.append_paged_kv_cache(key, value, *idx, cache, *tab), fi_mha,
           _copy_fn(_mha_bytes(nnz), dev), cat]
    page, off = p.slots()

    def placed(mla, mha):
        """Empties both caches, runs the two appends (callables), and says whether their rows landed."""
        ckv.zero_()
        cache[0].zero_()
        mla()
        mha()
        return torch.equal(ckv[page, off], a_ckv) and torch.equal(cache[0][page, off], key)

    return fns, placed


def _step_row(t, nnz, page_size, us, *extra):
    def x(a, b):
        return a / b if b > 0 else float("nan")

    t.add(nnz, page_size, us[0], us[1], us[2], x(us[1], us[0]), x(us[2], us[0]),
          us[3], us[4], us[5], x(us[4], us[3]), x(us[5], us[3]), *extra)


def _kernel_table(ctx, fi):
    """Decode-step appends by the durations of their kernels (torch.profiler), beside
    FlashInfer's and copy_'s of the same bytes: the device's own time, which CUDA events
    (the tables above) see under about 3 us of their own overhead and its jitter."""
    gen = torch.Generator().manual_seed(2)
    flush = L2Flush(ctx.device)
    t = Table(f"decode-step appends on {ctx.device}: kernel durations (torch.profiler), us per call, scrambled pages",
              list(STEP_COLUMNS))
    for nnz in (32, 128, 512, 1024):
        for page_size in (1, 16, 64):
            fns, _ = _step_contenders(ctx.device, fi, nnz, page_size, gen, ctx.separate)
            _step_row(t, nnz, page_size, kernel_us(fns[:6], flush))
    t.notes.append("x flashinfer / x copy_ = their kernel time / this op's (> 1: this op is faster); "
                   "L2 flushed before every call; medians of 3 alternating rounds of 50 calls")
    return t


def _graphed(fn, peer=False):
    """fn captured in a CUDA graph of its own (one call) -> a call that replays it; None stays
    None. The graph holds only the addresses of fn's tensors: the returned call keeps fn, and
    with it those tensors, alive as long as the graph. A peer's call (FlashInfer) that cannot
    be captured gives None (its columns stay empty); mlacore's and torch's must be."""
    if fn is None:
        return None
    fn()  # any lazy set-up (FlashInfer's JIT module, a first-call allocation) outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except Exception:
        if not peer:
            raise
        torch.cuda.synchronize()
        return None

    def replay(graph=graph, inputs=fn):
        graph.replay()

    return replay


def _graph_table(ctx, fi):
    """Decode-step appends as an engine replays them: each contender's call captured in a
    CUDA graph of its own, device time by CUDA events around the replay, L2 flushed before
    every replay (outside the graph), contenders in alternating rounds."""
    gen = torch.Generator().manual_seed(3)
    flush = L2Flush(ctx.device)
    timer = _timer(ctx, 40, flush)
    t = Table(f"decode-step appends on {ctx.device}, each call replayed from a CUDA graph: device us per call, "
              "scrambled pages", STEP_COLUMNS + ["concat_us"])
    for nnz in (32, 128, 512, 1024):
        for page_size in (1, 16, 64):
            fns, placed = _step_contenders(ctx.device, fi, nnz, page_size, gen, ctx.separate)
            fns = [_graphed(fn, peer=i in (1, 4)) for i, fn in enumerate(fns)]  # 1, 4: FlashInfer's
            if not placed(fns[0], fns[3]):  # a replay on emptied caches puts the rows where the call did
                raise RuntimeError(f"append: a replayed graph misplaced rows at nnz={nnz}, page_size={page_size}")
            us = [ms * 1e3 for ms in _alternating(ctx, timer, fns, 5, flush)]
            if not placed(fns[0], fns[3]):  # and still after 200 replays
                raise RuntimeError(f"append: a replayed graph misplaced rows after timing at nnz={nnz}, "
                                   f"page_size={page_size}")
            _step_row(t, nnz, page_size, us, us[6])
    t.notes.append("x flashinfer / x copy_ = their time / this op's (> 1: this op is faster); events around "
                   "each replay, L2 flushed before every replay; medians of 5 alternating rounds of 40 calls")
    t.notes.extend(bar_lines(t, STEP_BARS))
    return t


def _host_table(ctx, fi):
    dev = ctx.device
    gen = torch.Generator().manual_seed(1)
    calls = ctx.repeats or (5000 if ctx.gpu else 2000)
    p = Problem(32, 16, dev, False, gen)
    src, ckv, kpe, buf = p.mla()
    a_ckv, a_kpe = src[:, :512], src[:, 512:]
    key, value, cache = p.mha()
    x = torch.ones(16, device=dev)
    y = torch.ones(16, device=dev)
    idx, tab = p.index_args(), p.table_args()
    slots = p.slot_mapping

    drain = torch.cuda.synchronize if ctx.gpu else None

    contenders = [
        ("torch.add_ (baseline)", lambda: x.add_(y)),
        ("mlacore append_paged_mla_kv_cache",
         lambda: mlacore.append_paged_mla_kv_cache(a_ckv, a_kpe, *idx, ckv, kpe, *tab)),
        ("mlacore append_paged_kv_cache", lambda: mlacore.append_paged_kv_cache(key, value, *idx, cache, *tab)),
        ("mlacore concat_and_cache_mla", lambda: mlacore.concat_and_cache_mla(a_ckv, a_kpe, buf, slots, "auto", None)),
    ]
    failed = []
    if fi is not None:
        for name, fn in (("flashinfer append_paged_mla_kv_cache",
                          lambda: fi.page.append_paged_mla_kv_cache(a_ckv, a_kpe, *idx, ckv, kpe, *tab)),
                         ("flashinfer append_paged_kv_cache",
                          lambda: fi.page.append_paged_kv_cache(key, value, *idx, cache, *tab))):
            try:
                fn()
                contenders.append((name, fn))
            except Exception as e:  # keep the mlacore figures whatever FlashInfer does
                failed.append((f"{name} (failed: {type(e).__name__})", float("nan")))
    # Every call timed in the same rounds, in rotating order: the host's drift between
    # rounds (it moved these ratios by 0.2-0.3 between runs timed one call after another)
    # hits all of them alike.
    timed = host_us_paired([fn for _, fn in contenders], calls, drain=drain)
    add_us = timed[0]
    rows = [(name, us) for (name, _), us in zip(contenders, timed)] + failed
    if ctx.gpu:
        torch.cuda.synchronize()
    t = Table(f"host time per call on {dev}, nnz=32, page_size 16 (median of 7 alternating rounds x {calls} calls)",
              ["call", "us/call", "x torch.add_"])
    for name, us in rows:
        t.add(name, us, us / add_us)
    t.notes.append("bar: each mlacore append <= 1.3x torch.add_")
    return t


def run(ctx):
    fi = _flashinfer() if ctx.gpu else None
    tables = _bandwidth_tables(ctx, fi)
    host = _host_table(ctx, fi)  # before the profiler's table: no profiler session ahead of the host timing
    if ctx.gpu:
        tables.append(_graph_table(ctx, fi))
        tables.append(_kernel_table(ctx, fi))
    tables.append(host)
    if fi is None and ctx.gpu:
        tables[-1].notes.append("flashinfer not importable: no side-by-side figures")
    return tables
