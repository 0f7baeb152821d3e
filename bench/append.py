"""Paged append bandwidth against torch copy_ of the same bytes, and host time
per call next to torch.add_.

MLA: append_ckv [nnz, 512] and append_kpe [nnz, 64] (the two halves of one
[nnz, 576] source) into the halves of one [P, S, 576] cache (--separate:
two separate caches). MHA: K and V [nnz, 8, 128] into a (K, V) NHD cache.
Both bf16. Pages are a random permutation of the pool, so page size 1 means
every token lands somewhere else. Bandwidth counts the bytes read plus the
bytes written; the baseline copies the same number of bytes contiguously.
Bars (H200, nnz 65536 and 262144): MLA >= 0.90x, MHA >= 0.92x of copy_;
host time at nnz=32 <= 1.3x torch.add_.
"""

import torch

import mlacore

from ._report import Table
from ._timing import L2Flush, cpu_ms, device_ms, host_us_per_call

HEADS, HEAD_DIM = 8, 128


def _flashinfer():
    try:
        import flashinfer

        return flashinfer
    except Exception:  # absent, or present but broken: the bench goes on without it
        return None


class Problem:
    """Page table and tensors for one (nnz, page_size) point."""

    def __init__(self, nnz, page_size, device, separate, gen):
        batch = max(min(nnz // 16, 64), 1)
        per = [nnz // batch + (1 if b < nnz % batch else 0) for b in range(batch)]
        need = [(n + page_size - 1) // page_size for n in per]
        self.pages = sum(need)
        indptr = torch.zeros(batch + 1, dtype=torch.int32)
        indptr[1:] = torch.tensor(need).cumsum(0)
        self.kv_indptr = indptr.to(device)
        self.kv_indices = torch.randperm(self.pages, generator=gen).to(torch.int32).to(device)
        self.kv_last_page_len = torch.tensor([(n - 1) % page_size + 1 for n in per], dtype=torch.int32).to(device)
        self.batch_indices = torch.repeat_interleave(torch.arange(batch, dtype=torch.int32),
                                                     torch.tensor(per)).to(device)
        self.positions = torch.cat([torch.arange(n, dtype=torch.int32) for n in per]).to(device)
        self.page_size = page_size
        self.nnz = nnz
        self.device = device
        self.separate = separate
        self.gen = gen

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
        d = self.device
        src = torch.randn(self.nnz, 576, generator=self.gen).to(torch.bfloat16).to(d)
        if self.separate:
            ckv = torch.zeros(self.pages, self.page_size, 512, dtype=torch.bfloat16, device=d)
            kpe = torch.zeros(self.pages, self.page_size, 64, dtype=torch.bfloat16, device=d)
        else:
            buf = torch.zeros(self.pages, self.page_size, 576, dtype=torch.bfloat16, device=d)
            ckv, kpe = torch.split(buf, [512, 64], -1)
        return src[:, :512], src[:, 512:], ckv, kpe

    def mha(self):
        d = self.device
        shape = (self.pages, self.page_size, HEADS, HEAD_DIM)
        key = torch.randn(self.nnz, HEADS, HEAD_DIM, generator=self.gen).to(torch.bfloat16).to(d)
        value = torch.randn(self.nnz, HEADS, HEAD_DIM, generator=self.gen).to(torch.bfloat16).to(d)
        cache = (torch.zeros(shape, dtype=torch.bfloat16, device=d), torch.zeros(shape, dtype=torch.bfloat16, device=d))
        return key, value, cache


def _timer(ctx):
    if ctx.gpu:
        flush = L2Flush(ctx.device)
        return lambda fn: device_ms(fn, repeats=ctx.repeats or 30, flush=flush)
    return lambda fn: cpu_ms(fn, repeats=ctx.repeats or 10)


def _optional_ms(timer, fn):
    try:
        fn()
    except Exception:  # an installed FlashInfer that refuses this case
        return float("nan")
    return timer(fn)


def _bandwidth_tables(ctx, timer, fi):
    dev = ctx.device
    gen = torch.Generator().manual_seed(0)
    sizes = [32, 1024, 8192, 65536, 262144] if ctx.full else [32, 512, 4096]
    unit = "device_ms" if ctx.gpu else "cpu_ms"
    layout = "separate caches" if ctx.separate else "halves of one [P, S, 576] buffer"
    cols = ["nnz", "page_size", "MB", f"mlacore_{unit}", f"copy_{unit}", "mlacore_GB/s", "copy_GB/s", "x copy_"]
    if fi is not None:
        cols += [f"flashinfer_{unit}", "flashinfer x copy_"]
    mla = Table(f"append_paged_mla_kv_cache on {dev}, bf16, {layout}", list(cols))
    mha = Table(f"append_paged_kv_cache on {dev}, bf16, NHD (K, V), H={HEADS} D={HEAD_DIM}", list(cols))
    for nnz in sizes:
        for page_size in (1, 16, 64):
            p = Problem(nnz, page_size, dev, ctx.separate, gen)
            page, off = p.slots()

            a_ckv, a_kpe, ckv, kpe = p.mla()
            run = lambda: mlacore.append_paged_mla_kv_cache(a_ckv, a_kpe, *p.index_args(), ckv, kpe,
                                                            *p.table_args())
            run()
            if not (torch.equal(ckv[page, off], a_ckv) and torch.equal(kpe[page, off], a_kpe)):
                raise RuntimeError(f"append: MLA rows misplaced at nnz={nnz}, page_size={page_size}")
            nbytes = 2 * nnz * 576 * 2
            flat_src = torch.empty(nnz * 576, dtype=torch.bfloat16, device=dev)
            flat_dst = torch.empty_like(flat_src)
            row = _row(nnz, page_size, nbytes, timer(run), timer(lambda: flat_dst.copy_(flat_src)))
            if fi is not None:
                fi_ms = _optional_ms(timer, lambda: fi.page.append_paged_mla_kv_cache(
                    a_ckv, a_kpe, *p.index_args(), ckv, kpe, *p.table_args()))
                row += [fi_ms, row[4] / fi_ms]
            mla.add(*row)
            del a_ckv, a_kpe, ckv, kpe, flat_src, flat_dst

            key, value, cache = p.mha()
            run = lambda: mlacore.append_paged_kv_cache(key, value, *p.index_args(), cache, *p.table_args())
            run()
            if not (torch.equal(cache[0][page, off], key) and torch.equal(cache[1][page, off], value)):
                raise RuntimeError(f"append: K/V rows misplaced at nnz={nnz}, page_size={page_size}")
            nbytes = 2 * 2 * nnz * HEADS * HEAD_DIM * 2
            flat_src = torch.empty(2 * nnz * HEADS * HEAD_DIM, dtype=torch.bfloat16, device=dev)
            flat_dst = torch.empty_like(flat_src)
            row = _row(nnz, page_size, nbytes, timer(run), timer(lambda: flat_dst.copy_(flat_src)))
            if fi is not None:
                fi_ms = _optional_ms(timer, lambda: fi.page.append_paged_kv_cache(
                    key, value, *p.index_args(), cache, *p.table_args(), kv_layout="NHD"))
                row += [fi_ms, row[4] / fi_ms]
            mha.add(*row)
            del key, value, cache, flat_src, flat_dst
    for t, bar in ((mla, "0.90"), (mha, "0.92")):
        t.notes.append(f"MB = bytes read + written; x copy_ = copy_ time / append time; bar at nnz >= 65536: >= {bar}")
        if ctx.gpu:
            t.notes.append("device time per call, CUDA events, L2 flushed before every call")
        t.plot = ("nnz", ["mlacore_GB/s", "copy_GB/s"], True, False)
    return [mla, mha]


def _row(nnz, page_size, nbytes, ms, copy_ms):
    return [nnz, page_size, nbytes / 1e6, ms, copy_ms, nbytes / ms / 1e6, nbytes / copy_ms / 1e6, copy_ms / ms]


def _host_table(ctx, fi):
    dev = ctx.device
    gen = torch.Generator().manual_seed(1)
    calls = ctx.repeats or (5000 if ctx.gpu else 2000)
    p = Problem(32, 16, dev, ctx.separate, gen)
    a_ckv, a_kpe, ckv, kpe = p.mla()
    key, value, cache = p.mha()
    x = torch.ones(16, device=dev)
    y = torch.ones(16, device=dev)
    idx, tab = p.index_args(), p.table_args()

    drain = torch.cuda.synchronize if ctx.gpu else None

    def host_us(fn):
        return host_us_per_call(fn, calls, drain=drain)

    add_us = host_us(lambda: x.add_(y))
    rows = [("torch.add_ (baseline)", add_us)]
    rows.append(("mlacore append_paged_mla_kv_cache",
                 host_us(lambda: mlacore.append_paged_mla_kv_cache(a_ckv, a_kpe, *idx, ckv, kpe, *tab))))
    rows.append(("mlacore append_paged_kv_cache",
                 host_us(lambda: mlacore.append_paged_kv_cache(key, value, *idx, cache, *tab))))
    if fi is not None:
        for name, fn in (("flashinfer append_paged_mla_kv_cache",
                          lambda: fi.page.append_paged_mla_kv_cache(a_ckv, a_kpe, *idx, ckv, kpe, *tab)),
                         ("flashinfer append_paged_kv_cache",
                          lambda: fi.page.append_paged_kv_cache(key, value, *idx, cache, *tab))):
            try:
                fn()
                rows.append((name, host_us(fn)))
            except Exception as e:  # keep the mlacore figures whatever FlashInfer does
                rows.append((f"{name} (failed: {type(e).__name__})", float("nan")))
    if ctx.gpu:
        torch.cuda.synchronize()
    t = Table(f"host time per call on {dev}, nnz=32, page_size 16 (median of 7 rounds x {calls} calls)",
              ["call", "us/call", "x torch.add_"])
    for name, us in rows:
        t.add(name, us, us / add_us)
    t.notes.append("bar: each mlacore append <= 1.3x torch.add_")
    return t


def run(ctx):
    fi = _flashinfer() if ctx.gpu else None
    timer = _timer(ctx)
    tables = _bandwidth_tables(ctx, timer, fi)
    tables.append(_host_table(ctx, fi))
    if fi is None and ctx.gpu:
        tables[-1].notes.append("flashinfer not importable: no side-by-side figures")
    return tables
