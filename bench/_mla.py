"""Shared pieces of the MLA decode benchmarks (attn, pool, cat): paged caches
with scrambled pages, the mlacore wrapper, and the baselines."""

import math

import torch

import mlacore

from ._timing import L2Flush, cpu_ms, device_ms

SM_SCALE = 1.0 / math.sqrt(192)


def timer(ctx, repeats):
    """fn -> milliseconds on ctx.device (device events + L2 flush on a GPU)."""
    if ctx.gpu:
        flush = L2Flush(ctx.device)
        return lambda fn: device_ms(fn, repeats=repeats, flush=flush)
    return lambda fn: cpu_ms(fn, repeats=max(3, repeats // 5))


def make_cache(num_pages, page_size, dtype, device, separate):
    """ckv [P,S,512], kpe [P,S,64]: halves of one [P,S,576] buffer, or two allocations."""
    if separate:
        ckv = torch.randn(num_pages, page_size, 512, device=device).to(dtype)
        kpe = torch.randn(num_pages, page_size, 64, device=device).to(dtype)
        return ckv, kpe
    buf = torch.empty(num_pages, page_size, 576, dtype=dtype, device=device)
    buf.normal_()
    return torch.split(buf, [512, 64], dim=-1)


def make_indices(batch, kv, qo, page_size, num_pages, device, seed=0, lens=None):
    """Each request's pages drawn without repetition from the pool at random.
    Uniform lengths `kv`, or per-request `lens` (a ragged batch)."""
    g = torch.Generator().manual_seed(seed)
    lens = [kv] * batch if lens is None else list(lens)
    pages = [-(-n // page_size) for n in lens]
    need = sum(pages)
    if need > num_pages:
        raise ValueError(f"pool of {num_pages} pages cannot hold {need}")
    kv_indices = torch.randperm(num_pages, generator=g)[:need].to(torch.int32)
    kv_indptr = torch.tensor([0] + pages, dtype=torch.int64).cumsum(0).to(torch.int32)
    qo_indptr = torch.arange(len(lens) + 1, dtype=torch.int32) * qo
    kv_len = torch.tensor(lens, dtype=torch.int32)
    return [t.to(device) for t in (qo_indptr, kv_indptr, kv_indices, kv_len)]


def ragged_lens(batch, lo, hi, seed):
    """`batch` KV lengths drawn uniformly from [lo, hi], seeded (the same batch every run)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi + 1, (batch,), generator=g).tolist()


def make_wrapper(ctx, idx, heads, page_size, dtype, causal=False):
    ws = torch.empty(512 << 20 if ctx.gpu else 64 << 20, dtype=torch.uint8, device=ctx.device)
    w = mlacore.BatchMLAPagedAttentionWrapper(ws)
    w.plan(*idx, heads, 512, 64, page_size, causal, SM_SCALE, dtype, dtype)
    return w


class DecodeCase:
    """One decode shape ready to time: the cache (halves of one buffer, or two
    allocations with --separate), scrambled pages, q, and a planned wrapper.
    `lens` gives a ragged batch (else `batch` requests of `kv` tokens), `qo`
    query tokens per request (causal when `causal`)."""

    def __init__(self, ctx, batch, kv, heads, page_size, num_pages, dtype, lens=None, qo=1, causal=False):
        self.lens = [kv] * batch if lens is None else list(lens)
        self.qo, self.causal, self.heads, self.page_size = qo, causal, heads, page_size
        self.buf = None
        if ctx.separate:
            self.ckv, self.kpe = make_cache(num_pages, page_size, dtype, ctx.device, True)
        else:
            self.buf = torch.empty(num_pages, page_size, 576, dtype=dtype, device=ctx.device)
            self.buf.normal_()
            self.ckv, self.kpe = torch.split(self.buf, [512, 64], dim=-1)
        self.idx = make_indices(len(self.lens), kv, qo, page_size, num_pages, ctx.device, lens=self.lens)
        total_q = len(self.lens) * qo
        self.q_nope = torch.randn(total_q, heads, 512, device=ctx.device).to(dtype)
        self.q_pe = torch.randn(total_q, heads, 64, device=ctx.device).to(dtype)
        self.wrapper = make_wrapper(ctx, self.idx, heads, page_size, dtype, causal)
        self.out = torch.empty_like(self.q_nope)

    def run(self):
        """mlacore: the cache read in place."""
        self.wrapper.run(self.q_nope, self.q_pe, self.ckv, self.kpe, out=self.out)

    def cat_path(self):
        """What the pre-fix glue did: concatenate the whole pool every call, then decode."""
        a, b = torch.split(torch.cat([self.ckv, self.kpe], dim=-1), [512, 64], dim=-1)
        self.wrapper.run(self.q_nope, self.q_pe, a, b, out=self.out)


def kv_bytes(batch, kv, itemsize=2):
    return batch * kv * 576 * itemsize


def flops(batch, kv, heads, qo):
    return 2.0 * batch * heads * qo * kv * (576 + 512)


def flops_of(lens, heads, qo, causal):
    """FLOPs of a (ragged) batch: 2 * heads * (576 + 512) per visible (query, key) pair;
    with `causal`, query token t of a request of n keys sees n - qo + t + 1 of them."""
    pairs = 0
    for n in lens:
        pairs += sum(max(min(n - qo + t + 1, n), 0) for t in range(qo)) if causal else qo * n
    return 2.0 * heads * pairs * (576 + 512)


def floor_ms(ctx, nbytes, dtype, measure):
    """A plain torch reduction reading `nbytes` of contiguous memory once."""
    x = torch.empty(nbytes // 2, dtype=dtype, device=ctx.device).normal_()
    return measure(lambda: x.sum(dtype=torch.float32))


def naive_decode(q_nope, q_pe, ckv, kpe, idx, page_size):
    """Plain torch: gather every request's tokens (uniform lengths), then two batched matmuls."""
    qo_indptr, kv_indptr, kv_indices, kv_len = idx
    batch = kv_len.numel()
    pages = kv_indices.view(batch, -1).long()
    kv = int(kv_len[0]) if kv_len.device.type == "cpu" else kv_len.max().item()
    kc = ckv[pages].reshape(batch, -1, 512)[:, :kv]
    kp = kpe[pages].reshape(batch, -1, 64)[:, :kv]
    qo = q_nope.shape[0] // batch
    H = q_nope.shape[1]
    qn = q_nope.view(batch, qo * H, 512)
    qp = q_pe.view(batch, qo * H, 64)
    s = (torch.bmm(qn, kc.transpose(1, 2)).float() + torch.bmm(qp, kp.transpose(1, 2)).float()) * SM_SCALE
    p = torch.softmax(s, dim=-1).to(q_nope.dtype)
    return torch.bmm(p, kc).view(batch * qo, H, 512)


# Largest |difference| of bf16 outputs two correct decodes of the same inputs may show
# (a peer's column is dropped, and a row of mlacore's flagged, past it).
OUT_TOL = 5e-2


def max_diff(a, b):
    """Largest |a - b| over two outputs of the same shape, as a float (compared against OUT_TOL)."""
    return (a.float() - b.float()).abs().max().item()


def flashinfer_runner(ctx, idx, heads, page_size, dtype, q_nope, q_pe, ckv, kpe, causal=False):
    """A callable running FlashInfer's fa3 MLA on the same inputs, or (None, why not).
    The callable's `out` attribute is the tensor each call writes."""
    if not ctx.gpu:
        return None, "CPU run"
    try:
        import flashinfer  # noqa: F401  (optional: never required)
        from flashinfer.mla import BatchMLAPagedAttentionWrapper as FiWrapper

        ws = torch.empty(512 << 20, dtype=torch.uint8, device=ctx.device)
        w = FiWrapper(ws, backend="fa3")
        w.plan(*idx, heads, 512, 64, page_size, causal, SM_SCALE, dtype, dtype)
        out = torch.empty_like(q_nope)
        fn = lambda: w.run(q_nope, q_pe, ckv, kpe, out=out)
        fn.out = out
        fn()
        return fn, None
    except Exception as e:  # noqa: BLE001  (report any failure, never fail the bench)
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"


def flashmla_runner(ctx, case):
    """A callable running FlashMLA (deepseek-ai/FlashMLA's `flash_mla` package, when
    importable) on the same cache, or (None, why not). FlashMLA reads a [blocks, 64, 1,
    576] cache and a [batch, s_q, heads, 576] query: the cache is the same buffer viewed
    so (page size 64, ckv/kpe adjacent); the query is concatenated once, outside the
    timed call, as an engine calling FlashMLA would hold it. Its scheduler metadata is
    computed once, outside the timed call too (mlacore's plan and fa3's plan are as well)."""
    if not ctx.gpu:
        return None, "FlashMLA not measured: CPU run"
    if case.page_size != 64:
        return None, None  # FlashMLA runs page size 64 only: no column, no note
    if case.buf is None:
        return None, "FlashMLA not measured: --separate caches are not one [blocks, 64, 1, 576] buffer"
    try:
        import flash_mla  # noqa: F401  (optional: never required)
    except Exception as e:  # noqa: BLE001
        return None, f"FlashMLA not measured: import flash_mla failed ({type(e).__name__})"
    try:
        _, kv_indptr, kv_indices, kv_len = case.idx
        batch, qo, heads = len(case.lens), case.qo, case.heads
        per = [int(x) for x in (kv_indptr[1:] - kv_indptr[:-1]).tolist()]
        width = max(per + [1])
        table = torch.zeros(batch, width, dtype=torch.int32, device=ctx.device)
        starts = kv_indptr[:-1].tolist()
        for b in range(batch):
            table[b, : per[b]] = kv_indices[starts[b]: starts[b] + per[b]]
        seqlens = kv_len.to(torch.int32).contiguous()
        q = torch.cat([case.q_nope, case.q_pe], dim=-1).view(batch, qo, heads, 576).contiguous()
        k = case.buf.view(case.buf.shape[0], 64, 1, 576)
        meta, splits = flash_mla.get_mla_metadata(seqlens, qo * heads, 1)
        fn = lambda: flash_mla.flash_mla_with_kvcache(q, k, table, seqlens, 512, meta, splits, SM_SCALE, case.causal)
        out, _ = fn()
        # A wrong column is worse than none: its output must match mlacore's.
        case.run()
        err = max_diff(out.reshape(case.out.shape), case.out)
        if not err < OUT_TOL:
            return None, f"FlashMLA not measured: its output differs from mlacore's by {err:.3g}"
        return fn, None
    except Exception as e:  # noqa: BLE001  (report any failure, never fail the bench)
        return None, f"FlashMLA not measured: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
