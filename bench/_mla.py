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


def make_indices(batch, kv, qo, page_size, num_pages, device, seed=0):
    """Uniform batch, each request's pages drawn without repetition from the pool at random."""
    g = torch.Generator().manual_seed(seed)
    per = -(-kv // page_size)
    need = batch * per
    if need > num_pages:
        raise ValueError(f"pool of {num_pages} pages cannot hold {need}")
    kv_indices = torch.randperm(num_pages, generator=g)[:need].to(torch.int32)
    kv_indptr = torch.arange(batch + 1, dtype=torch.int32) * per
    qo_indptr = torch.arange(batch + 1, dtype=torch.int32) * qo
    kv_len = torch.full((batch,), kv, dtype=torch.int32)
    return [t.to(device) for t in (qo_indptr, kv_indptr, kv_indices, kv_len)]


def make_wrapper(ctx, idx, heads, page_size, dtype, causal=False):
    ws = torch.empty(512 << 20 if ctx.gpu else 64 << 20, dtype=torch.uint8, device=ctx.device)
    w = mlacore.BatchMLAPagedAttentionWrapper(ws)
    w.plan(*idx, heads, 512, 64, page_size, causal, SM_SCALE, dtype, dtype)
    return w


class DecodeCase:
    """One decode shape ready to time: the cache (halves of one buffer, or two
    allocations with --separate), scrambled pages, q, and a planned wrapper."""

    def __init__(self, ctx, batch, kv, heads, page_size, num_pages, dtype):
        self.ckv, self.kpe = make_cache(num_pages, page_size, dtype, ctx.device, ctx.separate)
        self.idx = make_indices(batch, kv, 1, page_size, num_pages, ctx.device)
        self.q_nope = torch.randn(batch, heads, 512, device=ctx.device).to(dtype)
        self.q_pe = torch.randn(batch, heads, 64, device=ctx.device).to(dtype)
        self.wrapper = make_wrapper(ctx, self.idx, heads, page_size, dtype)
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


def floor_ms(ctx, nbytes, dtype, measure):
    """A plain torch reduction reading `nbytes` of contiguous memory once."""
    x = torch.empty(nbytes // 2, dtype=dtype, device=ctx.device).normal_()
    ms = measure(lambda: x.sum(dtype=torch.float32))
    del x
    return ms


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


def flashinfer_runner(ctx, idx, heads, page_size, dtype, q_nope, q_pe, ckv, kpe):
    """A callable running FlashInfer's fa3 MLA on the same inputs, or (None, why not)."""
    if not ctx.gpu:
        return None, "CPU run"
    try:
        import flashinfer  # noqa: F401  (optional: never required)
        from flashinfer.mla import BatchMLAPagedAttentionWrapper as FiWrapper

        ws = torch.empty(512 << 20, dtype=torch.uint8, device=ctx.device)
        w = FiWrapper(ws, backend="fa3")
        w.plan(*idx, heads, 512, 64, page_size, False, SM_SCALE, dtype, dtype)
        out = torch.empty_like(q_nope)
        fn = lambda: w.run(q_nope, q_pe, ckv, kpe, out=out)
        fn()
        return fn, None
    except Exception as e:  # noqa: BLE001  (report any failure, never fail the bench)
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
